// Private building blocks of the built-in models: Eigen maps over the caller's buffers, a stack of
// dense layers (forward and backward), softmax cross-entropy, and parameter lookups that name the
// variable on failure. Not installed; Eigen stays out of the public header.
//
// Everything is row-major so that Maps over Params / Inputs / Grads need no copies: a batch is
// [batch, features], a kernel [in, out] (Keras), and y = x W + b is one GEMM per layer.
#pragma once

// Every strata translation unit that includes Eigen must agree on EIGEN_FAST_MATH, or Eigen's
// inline packet functions would differ between objects (ODR); src/ps/optimizer.cc needs 0.
#ifndef EIGEN_FAST_MATH
#define EIGEN_FAST_MATH 0
#endif
#if EIGEN_FAST_MATH
#error "strata models must be built with EIGEN_FAST_MATH=0, like src/ps/optimizer.cc"
#endif

#include <Eigen/Core>

#include <cstdint>
#include <string>
#include <vector>

#include "strata/model/model.h"

namespace strata::model::detail {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;
// A read-only row-major block: binds to Maps over caller memory and to owned matrices alike.
using ConstMatrixRef = Eigen::Ref<const RowMatrix>;

// Looks up a dense parameter and checks its element count; Error naming the variable otherwise.
const float* dense_param(const Params& params, const std::string& name, std::int64_t elements);

// Returns the gradient buffer of `name` sized to `shape` (reusing its storage when it fits).
float* dense_grad(Grads* grads, const std::string& name, const ps::Shape& shape);

// Row lookup into a pulled SparseParam: the index of every table row in `param.rows`.
class RowIndex {
 public:
  // Error naming `name` when the param is missing, malformed (width, size) or has duplicate rows.
  RowIndex(const Params& params, const std::string& name, int width);
  // Pointer to the `width` floats of table row `id`; Error when the row was not pulled.
  const float* row(std::int64_t id) const;

 private:
  const SparseParam* param_ = nullptr;
  std::string name_;
  bool identity_ = false;  // rows[i] == i for all i (a whole table): no hash map needed
  std::vector<std::pair<std::int64_t, std::int32_t>> sorted_;  // (row, index) otherwise
};

// Unique ids of a batch's sparse features (ascending, padding dropped), range-checked.
std::vector<std::int64_t> unique_ids(const Inputs& inputs, std::int64_t vocab, const std::string& var);

// Checks the labels of a batch against num_classes; Error naming the first bad one.
void check_labels(const Inputs& inputs, int num_classes);

// Mean softmax cross-entropy over the rows of `logits` [batch, classes]. On return `logits` holds
// d(mean loss)/d(logits) = (softmax - onehot) / batch when want_grad, and is unchanged otherwise.
// Adds the number of correct argmax predictions to *correct. Stable: exp(z - max z).
double softmax_cross_entropy(RowMatrix& logits, const std::int32_t* labels, bool want_grad,
                             std::int64_t* correct);

// A stack of dense layers in -> hidden... -> classes with ReLU between them and none on the output,
// named "<prefix>dense_<i>/{kernel,bias}" and "<prefix>logits/{kernel,bias}".
class DenseStack {
 public:
  DenseStack(std::string prefix, int input_dim, const std::vector<int>& hidden, int num_classes);

  // Appends the layers' VariableSpecs (Glorot-uniform kernels, zero biases) to `out`.
  void append_variables(std::uint64_t seed, std::vector<ps::VariableSpec>* out) const;
  std::int64_t num_parameters() const;
  // "784-256-128-10"
  std::string dims_string() const;

  // Per-call activations: hidden[l] is the ReLU output of hidden layer l, logits the output
  // layer (before softmax); scratch is backward's. The input itself is the caller's (no copy).
  // Reused across calls (a thread_local in the models), they stop allocating after the first step
  // of a given batch size: a 128 x 256 float buffer is just over glibc's mmap threshold, so a fresh
  // one each step cost an mmap, page faults and a munmap.
  struct Activations {
    std::vector<RowMatrix> hidden;
    RowMatrix logits;
    RowMatrix scratch;
  };

  // Forward pass over x [batch, input_dim]. Each layer is one sgemm (gemm.h) with the bias fused
  // (C starts as the broadcast bias, beta = 1), then the ReLU in place.
  void forward(const Params& params, const ConstMatrixRef& x, Activations* acts) const;

  // Backward pass given d(loss)/d(logits) in acts->logits (read only). acts->hidden is reused as
  // scratch for the hidden layers' gradients. Writes every kernel and bias gradient into *grads
  // and d(loss)/d(x) into *dx when dx is non-null (skipped otherwise: it is the costliest GEMM
  // of the first layer and nobody needs it for pixel inputs).
  void backward(const Params& params, const ConstMatrixRef& x, Activations* acts, Grads* grads,
                RowMatrix* dx) const;

 private:
  struct Layer {
    std::string kernel, bias;
    int in, out;
  };
  std::vector<Layer> layers_;
};

// Position of `id` in `sorted_ids` (ascending; must contain it).
inline std::int32_t index_of(const std::vector<std::int64_t>& sorted_ids, std::int64_t id) {
  // Binary search: a batch has at most a few thousand unique ids, a hash map costs more to build.
  std::size_t lo = 0, hi = sorted_ids.size();
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (sorted_ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return static_cast<std::int32_t>(lo);
}

}  // namespace strata::model::detail
