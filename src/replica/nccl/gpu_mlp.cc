// GpuMlp (see gpu_mlp.h). Cost per step, batch B, layer in -> out: forward one GEMM B x in x out;
// backward one GEMM for dW and, above the first layer, one for dX (the first layer's dX, the
// largest GEMM of pixel models, is skipped as on the CPU: nothing consumes it).
#include "gpu_mlp.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "cublas_api.h"
#include "cuda_check.h"
#include "kernels.h"
#include "strata/common/error.h"

namespace strata::replica::gpu {

using ::strata::detail::cublas;

namespace {

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

// Row-major C[rows, cols] = A[rows, inner] * B[inner, cols]: column-major C^T = B^T A^T, where the
// row-major buffers of B and A are already B^T (ld cols) and A^T (ld inner) in column-major terms.
void gemm_ab(cublasHandle_t h, int rows, int inner, int cols, const float* a, const float* b, float* c) {
  STRATA_CHECK_CUBLAS(cublas().sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, inner, &kOne, b, cols, a, inner, &kZero, c, cols));
}

// Row-major C[inner_rows, cols] = A[k, inner_rows]^T * B[k, cols] (dW = X^T dY): column-major
// C^T = B^T A, where B's buffer is B^T (ld cols, no op) and A's buffer is A^T (ld inner_rows),
// transposed back by CUBLAS_OP_T.
void gemm_atb(cublasHandle_t h, int k, int inner_rows, int cols, const float* a, const float* b, float* c) {
  STRATA_CHECK_CUBLAS(
      cublas().sgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, cols, inner_rows, k, &kOne, b, cols, a, inner_rows, &kZero, c, cols));
}

// Row-major C[rows, cols] = A[rows, k] * B[cols, k]^T (dX = dY W^T): column-major C^T = B A^T,
// where B's buffer is B^T (ld k), transposed back by CUBLAS_OP_T, and A's buffer is A^T (ld k).
void gemm_abt(cublasHandle_t h, int rows, int k, int cols, const float* a, const float* b, float* c) {
  STRATA_CHECK_CUBLAS(cublas().sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, cols, rows, k, &kOne, b, k, a, k, &kZero, c, cols));
}

}  // namespace

std::vector<MlpVariable> mlp_variables(const MlpShape& shape) {
  if (shape.input_dim < 1)
    throw ConfigError("GPU mlp: input_dim must be >= 1, got " + std::to_string(shape.input_dim));
  if (shape.num_classes < 2)
    throw ConfigError("GPU mlp: num_classes must be >= 2, got " + std::to_string(shape.num_classes));
  // Names and order exactly as the built-in mlp/softmax graphs create them (src/nn/builtin.cc).
  std::vector<MlpVariable> variables;
  std::size_t offset = 0;
  int in = shape.input_dim;
  auto add_layer = [&](const std::string& scope, int out) {
    if (out < 1) throw ConfigError("GPU mlp: layer " + scope + " must have width >= 1, got " + std::to_string(out));
    const std::size_t kernel_size = static_cast<std::size_t>(in) * static_cast<std::size_t>(out);
    variables.push_back(MlpVariable{scope + "/kernel", {in, out}, offset, kernel_size});
    offset += kernel_size;
    variables.push_back(MlpVariable{scope + "/bias", {out}, offset, static_cast<std::size_t>(out)});
    offset += static_cast<std::size_t>(out);
    in = out;
  };
  for (std::size_t i = 0; i < shape.hidden.size(); ++i) add_layer("dense_" + std::to_string(i), shape.hidden[i]);
  add_layer("logits", shape.num_classes);
  return variables;
}

void GpuMlp::CudaFree::operator()(void* p) const noexcept {
  // cudaFree takes a pointer of any device (unified addressing); ~GpuMlp still makes the model's
  // device current first, so the implicit synchronisation is the right device's.
  if (p != nullptr) (void)cudaFree(p);
}

template <typename T>
GpuMlp::DevicePtr<T> GpuMlp::allocate(std::size_t n) {
  void* p = nullptr;
  if (n > 0) STRATA_CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  return DevicePtr<T>(static_cast<T*>(p));
}

GpuMlp::GpuMlp(int device, MlpShape shape, cudaStream_t stream, Staging staging)
    : device_(device), stream_(stream), shape_(std::move(shape)), variables_(mlp_variables(shape_)) {
  for (std::size_t v = 0; v + 1 < variables_.size(); v += 2) {
    const MlpVariable& kernel = variables_[v];
    const MlpVariable& bias = variables_[v + 1];
    layers_.push_back(Layer{static_cast<int>(kernel.shape[0]), static_cast<int>(kernel.shape[1]), kernel.offset,
                            bias.offset});
  }
  num_parameters_ = variables_.back().offset + variables_.back().size;

  ScopedDevice on(device_);
  STRATA_CHECK_CUDA(preload_kernels());
  params_ = allocate<float>(num_parameters_);
  grads_ = allocate<float>(num_parameters_);
  totals_ = allocate<StepTotals>(1);
  totals_host_ = &totals_fallback_;
  if (staging.pinned) {
    const std::size_t bytes = std::min(num_parameters_ * sizeof(float), std::max(staging.max_bytes, sizeof(float)));
    if (staging_.reserve(bytes) && totals_pinned_.reserve(sizeof(StepTotals)))
      totals_host_ = static_cast<StepTotals*>(totals_pinned_.data());
  }
  STRATA_CHECK_CUDA(cudaMemsetAsync(params_.get(), 0, num_parameters_ * sizeof(float), stream_));
  STRATA_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, num_parameters_ * sizeof(float), stream_));
  STRATA_CHECK_CUBLAS(cublas().create(&cublas_));
  try {
    STRATA_CHECK_CUBLAS(cublas().set_stream(cublas_, stream_));
    // FP32 GEMMs in FP32 (CUBLAS_DEFAULT_MATH never uses TF32 for cublasSgemm; the tensor-op
    // shortcut would need CUBLAS_TF32_TENSOR_OP_MATH), so the results stay within float rounding
    // of the CPU model's.
    STRATA_CHECK_CUBLAS(cublas().set_math_mode(cublas_, CUBLAS_DEFAULT_MATH));
    STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
  } catch (...) {
    (void)cublas().destroy(cublas_);
    cublas_ = nullptr;
    throw;
  }
}

// Everything is released with the model's device current: cublasDestroy must run there, and
// cudaFree synchronises the current device. No work may be in flight (every call synchronises
// before it returns).
GpuMlp::~GpuMlp() {
  int previous = -1;
  const bool switched =
      cudaGetDevice(&previous) == cudaSuccess && previous != device_ && cudaSetDevice(device_) == cudaSuccess;
  if (cublas_ != nullptr) (void)cublas().destroy(cublas_);  // never throws; a failure leaks the handle at worst
  x_.reset();
  labels_.reset();
  hidden_.clear();
  logits_.reset();
  scratch_.reset();
  row_loss_.reset();
  row_correct_.reset();
  retired_.clear();
  totals_.reset();
  params_.reset();
  grads_.reset();
  staging_.reset();
  totals_pinned_.reset();
  if (switched) (void)cudaSetDevice(previous);
}

const MlpVariable& GpuMlp::variable(const std::string& name) const {
  for (const MlpVariable& v : variables_)
    if (v.name == name) return v;
  throw Error("GPU mlp has no variable '" + name + "'");
}

// Synchronous on purpose: the host may reuse (upload) or read (download) its buffer on return.
// The pinned path is one memcpy into the staging buffer and one DMA per chunk; a chunk's staging
// memory is reused only after cudaStreamSynchronize has seen its copy complete.
void GpuMlp::to_device(float* device, const float* host, std::size_t n) {
  if (n == 0) return;
  ScopedDevice on(device_);
  const std::size_t chunk = staging_.capacity() / sizeof(float);
  if (chunk == 0) {
    // Pageable: cudaMemcpyAsync returns once the driver has taken a copy of the host buffer.
    STRATA_CHECK_CUDA(cudaMemcpyAsync(device, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
    return;
  }
  auto* pinned = static_cast<float*>(staging_.data());
  for (std::size_t done = 0; done < n;) {
    const std::size_t count = std::min(chunk, n - done);
    std::memcpy(pinned, host + done, count * sizeof(float));
    STRATA_CHECK_CUDA(
        cudaMemcpyAsync(device + done, pinned, count * sizeof(float), cudaMemcpyHostToDevice, stream_));
    STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));  // before the next chunk overwrites `pinned`
    done += count;
  }
}

void GpuMlp::to_host(float* host, const float* device, std::size_t n) {
  if (n == 0) return;
  ScopedDevice on(device_);
  const std::size_t chunk = staging_.capacity() / sizeof(float);
  if (chunk == 0) {
    STRATA_CHECK_CUDA(cudaMemcpyAsync(host, device, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
    return;
  }
  auto* pinned = static_cast<float*>(staging_.data());
  for (std::size_t done = 0; done < n;) {
    const std::size_t count = std::min(chunk, n - done);
    STRATA_CHECK_CUDA(
        cudaMemcpyAsync(pinned, device + done, count * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));  // the host reads `pinned` next
    std::memcpy(host + done, pinned, count * sizeof(float));
    done += count;
  }
}

const MlpVariable& GpuMlp::checked_variable(const std::string& name, std::size_t n, const char* what) const {
  const MlpVariable& v = variable(name);
  if (n != v.size)
    throw Error(std::string("GPU mlp ") + what + " of '" + name + "': got " + std::to_string(n) +
                " floats, the variable has " + std::to_string(v.size));
  return v;
}

void GpuMlp::upload_param(const std::string& name, const float* host, std::size_t n) {
  const MlpVariable& v = checked_variable(name, n, "upload");
  if (n > 0 && host == nullptr) throw Error("GPU mlp upload of '" + name + "': null host buffer");
  to_device(params_.get() + v.offset, host, n);
}

void GpuMlp::download_param(const std::string& name, float* host, std::size_t n) {
  const MlpVariable& v = checked_variable(name, n, "download");
  if (n > 0 && host == nullptr) throw Error("GPU mlp download of '" + name + "': null host buffer");
  to_host(host, params_.get() + v.offset, n);
}

void GpuMlp::download_grad(const std::string& name, float* host, std::size_t n) {
  const MlpVariable& v = checked_variable(name, n, "gradient download");
  if (n > 0 && host == nullptr) throw Error("GPU mlp gradient download of '" + name + "': null host buffer");
  to_host(host, grads_.get() + v.offset, n);
}

void GpuMlp::check_all(const void* host, std::size_t n, const char* what) const {
  if (n != num_parameters_)
    throw Error(std::string("GPU mlp ") + what + ": got " + std::to_string(n) + " floats, the model has " +
                std::to_string(num_parameters_) + " parameters");
  if (n > 0 && host == nullptr) throw Error(std::string("GPU mlp ") + what + ": null host buffer");
}

void GpuMlp::upload_params(const float* host, std::size_t n) {
  check_all(host, n, "parameter upload");
  to_device(params_.get(), host, n);
}

void GpuMlp::download_grads(float* host, std::size_t n) {
  check_all(host, n, "gradient download");
  to_host(host, grads_.get(), n);
}

// Grows the per-batch buffers; the old contents are not kept (nothing survives a step). The
// first batch is allocated exactly; later growth at least doubles, and outgrown buffers are
// retired, not freed (see gpu_mlp.h).
void GpuMlp::reserve(int batch) {
  if (batch <= capacity_) return;
  const int grown = capacity_ == 0 ? batch : static_cast<int>(std::min<long long>(
                                                 std::max<long long>(batch, 2LL * capacity_), INT_MAX));
  const std::size_t b = static_cast<std::size_t>(grown);
  int widest_input = 0;  // dX is only computed for layers above the first
  for (std::size_t l = 1; l < layers_.size(); ++l) widest_input = std::max(widest_input, layers_[l].in);
  auto retire = [&](auto& p) {
    if (p) retired_.emplace_back(p.release());
  };
  retire(x_);
  retire(labels_);
  for (auto& h : hidden_) retire(h);
  retire(logits_);
  retire(scratch_);
  retire(row_loss_);
  retire(row_correct_);
  capacity_ = 0;  // until every new buffer is in place (an allocation may throw)
  x_ = allocate<float>(b * static_cast<std::size_t>(shape_.input_dim));
  labels_ = allocate<std::int32_t>(b);
  hidden_.clear();
  for (std::size_t l = 0; l + 1 < layers_.size(); ++l)
    hidden_.push_back(allocate<float>(b * static_cast<std::size_t>(layers_[l].out)));
  logits_ = allocate<float>(b * static_cast<std::size_t>(shape_.num_classes));
  scratch_ = allocate<float>(b * static_cast<std::size_t>(widest_input));
  row_loss_ = allocate<double>(b);
  row_correct_ = allocate<std::int32_t>(b);
  capacity_ = grown;
}

MlpStepResult GpuMlp::train_step(const float* x, const std::int32_t* labels, int batch, bool backward) {
  if (batch < 0) throw Error("GPU mlp: negative batch size " + std::to_string(batch));
  if (batch > 0 && (x == nullptr || labels == nullptr)) throw Error("GPU mlp: the batch has no features or labels");
  // Labels are checked on the host, with the CPU model's message, before anything is queued.
  for (int i = 0; i < batch; ++i)
    if (labels[i] < 0 || labels[i] >= shape_.num_classes)
      throw Error("label " + std::to_string(labels[i]) + " of example " + std::to_string(i) + " is outside [0, " +
                  std::to_string(shape_.num_classes) + ")");
  ScopedDevice on(device_);
  MlpStepResult result;
  if (batch == 0) {
    // d(mean loss) of an empty batch is defined as zero, as on the CPU (whose GEMMs over zero rows
    // produce zeros).
    if (backward) STRATA_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, num_parameters_ * sizeof(float), stream_));
    STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
    return result;
  }
  reserve(batch);
  const std::size_t b = static_cast<std::size_t>(batch);
  STRATA_CHECK_CUDA(cudaMemcpyAsync(x_.get(), x, b * static_cast<std::size_t>(shape_.input_dim) * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
  STRATA_CHECK_CUDA(cudaMemcpyAsync(labels_.get(), labels, b * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));

  // Forward: y_l = act(y_{l-1} W_l + b_l); ReLU is applied in place, so each hidden buffer holds the
  // activation (its sign is all the backward pass needs).
  const float* input = x_.get();
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const bool is_logits = l + 1 == layers_.size();
    float* y = is_logits ? logits_.get() : hidden_[l].get();
    gemm_ab(cublas_, batch, layer.in, layer.out, input, params_.get() + layer.kernel, y);
    launch_bias_activation(y, params_.get() + layer.bias, batch, layer.out, !is_logits, stream_);
    STRATA_CHECK_LAUNCH("bias/activation kernel", stream_);
    input = y;
  }
  launch_softmax_xent(logits_.get(), labels_.get(), batch, shape_.num_classes, backward, row_loss_.get(),
                      row_correct_.get(), stream_);
  STRATA_CHECK_LAUNCH("softmax cross-entropy kernel", stream_);

  if (backward) {
    // dy walks down the stack: the logits' gradient first, then each hidden layer's, written over
    // that layer's activation once the dW GEMM that reads it has been queued.
    const float* dy = logits_.get();
    for (std::size_t l = layers_.size(); l-- > 0;) {
      const Layer& layer = layers_[l];
      const float* layer_input = l == 0 ? x_.get() : hidden_[l - 1].get();
      gemm_atb(cublas_, batch, layer.in, layer.out, layer_input, dy, grads_.get() + layer.kernel);  // dW = x^T dY
      launch_bias_grad(dy, batch, layer.out, grads_.get() + layer.bias, stream_);                // db = sum dY
      STRATA_CHECK_LAUNCH("bias gradient kernel", stream_);
      if (l == 0) break;
      gemm_abt(cublas_, batch, layer.out, layer.in, dy, params_.get() + layer.kernel, scratch_.get());  // dX = dY W^T
      float* h = hidden_[l - 1].get();
      launch_relu_backward(h, scratch_.get(), b * static_cast<std::size_t>(layer.in), stream_);
      STRATA_CHECK_LAUNCH("ReLU backward kernel", stream_);
      dy = h;
    }
  }

  // The totals are summed on the device and come back in one small copy; the host reads them only
  // after the stream has drained (which also completes the backward pass).
  launch_step_totals(row_loss_.get(), row_correct_.get(), batch, totals_.get(), stream_);
  STRATA_CHECK_LAUNCH("step totals kernel", stream_);
  STRATA_CHECK_CUDA(
      cudaMemcpyAsync(totals_host_, totals_.get(), sizeof(StepTotals), cudaMemcpyDeviceToHost, stream_));
  STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
  result.loss = totals_host_->loss / static_cast<double>(batch);
  result.correct = static_cast<std::int64_t>(totals_host_->correct);
  return result;
}

}  // namespace strata::replica::gpu
