// Dense layers and softmax cross-entropy for the built-in models (see layers.h).
//
// Cost model (batch B, layer in -> out): forward is one GEMM B x in x out; backward is one GEMM
// for dW = x^T dY and one for dX = dY W^T (skipped for the first layer of pixel models). Bias,
// ReLU and the softmax are O(B * out) and negligible. Eigen's GEMM is cache-blocked and
// vectorised; everything else here only has to avoid copying the parameters. The products go
// through gemm.h (OpenBLAS where it is built in and passes its checks, else Eigen).
#include "layers.h"

#include <algorithm>
#include <cmath>

#include "gemm.h"
#include "strata/common/error.h"

namespace strata::model::detail {

const float* dense_param(const Params& params, const std::string& name, std::int64_t elements) {
  const auto it = params.dense.find(name);
  if (it == params.dense.end()) throw Error("model parameter '" + name + "' was not provided");
  const auto have = static_cast<std::int64_t>(it->second.value.size());
  if (have != elements)
    throw Error("model parameter '" + name + "' has " + std::to_string(have) + " elements, expected " +
                std::to_string(elements));
  return it->second.value.data();
}

// resize() keeps the storage of a Grads the caller reuses across steps, so steady-state training
// does not allocate gradient buffers; the GEMMs overwrite every element (noalias assignment).
float* dense_grad(Grads* grads, const std::string& name, const ps::Shape& shape) {
  DenseParam& g = grads->dense[name];
  if (g.shape != shape) g.shape = shape;
  g.value.resize(static_cast<std::size_t>(ps::num_elements(shape)));
  return g.value.data();
}

RowIndex::RowIndex(const Params& params, const std::string& name, int width) : name_(name) {
  const auto it = params.sparse.find(name);
  if (it == params.sparse.end()) throw Error("model parameter '" + name + "' (sparse) was not provided");
  param_ = &it->second;
  if (param_->width != width)
    throw Error("model parameter '" + name + "' has width " + std::to_string(param_->width) + ", expected " +
                std::to_string(width));
  if (param_->values.size() != param_->rows.size() * static_cast<std::size_t>(width))
    throw Error("model parameter '" + name + "' holds " + std::to_string(param_->values.size()) + " values for " +
                std::to_string(param_->rows.size()) + " rows of width " + std::to_string(width));
  // Local training passes the whole table (rows 0..n-1): index it directly instead of sorting
  // a vocabulary-sized list every step.
  const auto& rows = param_->rows;
  identity_ = true;
  for (std::size_t i = 0; i < rows.size() && identity_; ++i) identity_ = rows[i] == static_cast<std::int64_t>(i);
  if (identity_) return;
  sorted_.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) sorted_.emplace_back(rows[i], static_cast<std::int32_t>(i));
  std::sort(sorted_.begin(), sorted_.end());
  for (std::size_t i = 1; i < sorted_.size(); ++i)
    if (sorted_[i].first == sorted_[i - 1].first)
      throw Error("model parameter '" + name + "' lists row " + std::to_string(sorted_[i].first) + " twice");
}

const float* RowIndex::row(std::int64_t id) const {
  const std::size_t width = static_cast<std::size_t>(param_->width);
  if (identity_) {
    if (id >= 0 && static_cast<std::size_t>(id) < param_->rows.size()) return param_->values.data() + id * width;
  } else {
    const auto it = std::lower_bound(sorted_.begin(), sorted_.end(), std::make_pair(id, std::int32_t{-1}));
    if (it != sorted_.end() && it->first == id) return param_->values.data() + it->second * width;
  }
  throw Error("model parameter '" + name_ + "': row " + std::to_string(id) + " was not pulled");
}

// Sorted, so the pull, the push and index_of agree on one canonical row order.
std::vector<std::int64_t> unique_ids(const Inputs& inputs, std::int64_t vocab, const std::string& var) {
  const std::size_t n = static_cast<std::size_t>(inputs.size) * static_cast<std::size_t>(inputs.num_fields);
  std::vector<std::int64_t> ids;
  ids.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t id = inputs.sparse_ids[i];
    if (id == -1) continue;  // padding
    if (id < 0 || id >= vocab)
      throw Error("sparse id " + std::to_string(id) + " (example " + std::to_string(i / inputs.num_fields) +
                  ", field " + std::to_string(i % inputs.num_fields) + ") is outside [0, " +
                  std::to_string(vocab) + ") of '" + var + "'");
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void check_labels(const Inputs& inputs, int num_classes) {
  if (inputs.size > 0 && inputs.labels == nullptr) throw Error("model inputs: labels are missing");
  for (int i = 0; i < inputs.size; ++i) {
    const std::int32_t y = inputs.labels[i];
    if (y < 0 || y >= num_classes)
      throw Error("label " + std::to_string(y) + " of example " + std::to_string(i) + " is outside [0, " +
                  std::to_string(num_classes) + ")");
  }
}

double softmax_cross_entropy(RowMatrix& logits, const std::int32_t* labels, bool want_grad,
                             std::int64_t* correct) {
  const Eigen::Index batch = logits.rows(), classes = logits.cols();
  if (correct != nullptr) *correct = 0;
  if (batch == 0) return 0.0;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double total = 0.0;
  std::int64_t right = 0;
  for (Eigen::Index i = 0; i < batch; ++i) {
    float* z = logits.data() + i * classes;
    // Stable log-softmax: log sum exp(z) = m + log sum exp(z - m) with m = max z, so no exp
    // overflows and the largest term is exactly 1.
    Eigen::Index best = 0;
    for (Eigen::Index j = 1; j < classes; ++j)
      if (z[j] > z[best]) best = j;  // strict: the first maximum wins ties
    const float m = z[best];
    double sum = 0.0;
    for (Eigen::Index j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(z[j] - m));
    const double log_sum = std::log(sum);
    const std::int32_t y = labels[i];
    total += log_sum - static_cast<double>(z[y] - m);
    right += best == y;
    if (want_grad) {
      // d/dz of the MEAN loss: (softmax(z) - onehot(y)) / batch.
      const double inv_sum = 1.0 / sum;
      for (Eigen::Index j = 0; j < classes; ++j)
        z[j] = static_cast<float>(std::exp(static_cast<double>(z[j] - m)) * inv_sum) * inv_batch;
      z[y] -= inv_batch;
    }
  }
  if (correct != nullptr) *correct = right;
  return total / static_cast<double>(batch);
}

DenseStack::DenseStack(std::string prefix, int input_dim, const std::vector<int>& hidden, int num_classes) {
  int in = input_dim;
  for (std::size_t i = 0; i < hidden.size(); ++i) {
    const std::string scope = prefix + "dense_" + std::to_string(i);
    layers_.push_back(Layer{scope + "/kernel", scope + "/bias", in, hidden[i]});
    in = hidden[i];
  }
  layers_.push_back(Layer{prefix + "logits/kernel", prefix + "logits/bias", in, num_classes});
}

void DenseStack::append_variables(std::uint64_t seed, std::vector<ps::VariableSpec>* out) const {
  for (const Layer& layer : layers_) {
    ps::VariableSpec kernel;
    kernel.name = layer.kernel;
    kernel.shape = {layer.in, layer.out};
    kernel.init = ps::Initializer::glorot_uniform(derive_seed(seed, layer.kernel));
    out->push_back(std::move(kernel));
    ps::VariableSpec bias;
    bias.name = layer.bias;
    bias.shape = {layer.out};
    bias.init = ps::Initializer::zeros();
    out->push_back(std::move(bias));
  }
}

std::int64_t DenseStack::num_parameters() const {
  std::int64_t n = 0;
  for (const Layer& layer : layers_) n += static_cast<std::int64_t>(layer.in + 1) * layer.out;
  return n;
}

std::string DenseStack::dims_string() const {
  std::string s = std::to_string(layers_.front().in);
  for (const Layer& layer : layers_) s += "-" + std::to_string(layer.out);
  return s;
}

void DenseStack::forward(const Params& params, const ConstMatrixRef& x, Activations* acts) const {
  STRATA_ENFORCE_EQ(x.cols(), static_cast<Eigen::Index>(layers_.front().in), "model input width");
  const int batch = static_cast<int>(x.rows());
  acts->hidden.resize(layers_.size() - 1);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const float* w = dense_param(params, layer.kernel, std::int64_t{layer.in} * layer.out);
    const ConstRowVectorMap b(dense_param(params, layer.bias, layer.out), layer.out);
    const bool is_logits = l + 1 == layers_.size();
    RowMatrix& y = is_logits ? acts->logits : acts->hidden[l];
    y.resize(batch, layer.out);
    const float* in = l == 0 ? x.data() : acts->hidden[l - 1].data();
    const int ld_in = l == 0 ? static_cast<int>(x.outerStride()) : layer.in;
    // y = b (each row), then y += x W in the same product.
    y.rowwise() = b;
    sgemm(Transpose::kNo, Transpose::kNo, batch, layer.out, layer.in, 1.0f, in, ld_in, w, layer.out, 1.0f, y.data(),
          layer.out);
    if (!is_logits) y = y.cwiseMax(0.0f);  // ReLU in place: the pre-activation is not kept, since
                                           // relu(z) > 0 exactly where z > 0 (all backward needs)
  }
}

void DenseStack::backward(const Params& params, const ConstMatrixRef& x, Activations* acts, Grads* grads,
                          RowMatrix* dx) const {
  const int batch = static_cast<int>(x.rows());
  // dy walks down the stack: the logits' gradient first, then each hidden layer's, stored over
  // that layer's activations once they are no longer needed.
  const RowMatrix* dy = &acts->logits;
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const Layer& layer = layers_[l];
    const float* w = dense_param(params, layer.kernel, std::int64_t{layer.in} * layer.out);
    float* dw = dense_grad(grads, layer.kernel, {layer.in, layer.out});
    RowVectorMap db(dense_grad(grads, layer.bias, {layer.out}), layer.out);
    // dW = x^T dY, db = sum over the batch of dY.
    const float* in = l == 0 ? x.data() : acts->hidden[l - 1].data();
    const int ld_in = l == 0 ? static_cast<int>(x.outerStride()) : layer.in;
    sgemm(Transpose::kYes, Transpose::kNo, layer.in, layer.out, batch, 1.0f, in, ld_in, dy->data(), layer.out, 0.0f,
          dw, layer.out);
    // db row by row in batch order, so every element is ((0 + dy_0) + dy_1) + ... wherever db
    // lives. Not dy->colwise().sum(): Eigen adds whole packets of rows in a pairwise tree but the
    // columns it peels to reach db's alignment one by one, and which columns it peels depends on
    // db's address. With 16-byte SSE packets malloc's alignment always sufficed; with AVX-512's
    // 64-byte packets it did not, and the bias gradients (so sync training) changed from run to
    // run with the heap layout.
    db.setZero();
    for (Eigen::Index i = 0; i < batch; ++i) db += dy->row(i);
    if (l > 0) {
      // dX = dY W^T, then through the ReLU: its output is > 0 exactly where its input was.
      RowMatrix& scratch = acts->scratch;
      scratch.resize(batch, layer.in);
      sgemm(Transpose::kNo, Transpose::kYes, batch, layer.in, layer.out, 1.0f, dy->data(), layer.out, w, layer.out,
            0.0f, scratch.data(), layer.in);
      RowMatrix& h = acts->hidden[l - 1];
      h.array() = (h.array() > 0.0f).select(scratch.array(), 0.0f);
      dy = &h;
    } else if (dx != nullptr) {
      dx->resize(batch, layer.in);
      sgemm(Transpose::kNo, Transpose::kYes, batch, layer.in, layer.out, 1.0f, dy->data(), layer.out, w, layer.out,
            0.0f, dx->data(), layer.in);
    }
  }
}

}  // namespace strata::model::detail
