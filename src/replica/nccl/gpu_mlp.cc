// GpuMlp (see gpu_mlp.h). Cost per step, batch B, layer in -> out: forward one GEMM B x in x out;
// backward one GEMM for dW and, above the first layer, one for dX (the first layer's dX, the
// largest GEMM of pixel models, is skipped as on the CPU: nothing consumes it).
#include "gpu_mlp.h"

#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"
#include "strata/common/error.h"

namespace strata::replica::gpu {
namespace {

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

// Row-major C[rows, cols] = A[rows, inner] * B[inner, cols]: column-major C^T = B^T A^T, where the
// row-major buffers of B and A are already B^T (ld cols) and A^T (ld inner) in column-major terms.
void gemm_ab(cublasHandle_t h, int rows, int inner, int cols, const float* a, const float* b, float* c) {
  STRATA_CHECK_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, inner, &kOne, b, cols, a, inner, &kZero, c, cols));
}

// Row-major C[inner_rows, cols] = A[k, inner_rows]^T * B[k, cols] (dW = X^T dY): column-major
// C^T = B^T A, where B's buffer is B^T (ld cols, no op) and A's buffer is A^T (ld inner_rows),
// transposed back by CUBLAS_OP_T.
void gemm_atb(cublasHandle_t h, int k, int inner_rows, int cols, const float* a, const float* b, float* c) {
  STRATA_CHECK_CUBLAS(
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, cols, inner_rows, k, &kOne, b, cols, a, inner_rows, &kZero, c, cols));
}

// Row-major C[rows, cols] = A[rows, k] * B[cols, k]^T (dX = dY W^T): column-major C^T = B A^T,
// where B's buffer is B^T (ld k), transposed back by CUBLAS_OP_T, and A's buffer is A^T (ld k).
void gemm_abt(cublasHandle_t h, int rows, int k, int cols, const float* a, const float* b, float* c) {
  STRATA_CHECK_CUBLAS(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, cols, rows, k, &kOne, b, k, a, k, &kZero, c, cols));
}

}  // namespace

void GpuMlp::CudaFree::operator()(void* p) const noexcept {
  // With unified addressing cudaFree releases memory of any device whatever the current one.
  if (p != nullptr) (void)cudaFree(p);
}

template <typename T>
GpuMlp::DevicePtr<T> GpuMlp::allocate(std::size_t n) {
  void* p = nullptr;
  if (n > 0) STRATA_CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  return DevicePtr<T>(static_cast<T*>(p));
}

GpuMlp::GpuMlp(int device, MlpShape shape, cudaStream_t stream)
    : device_(device), stream_(stream), shape_(std::move(shape)) {
  if (shape_.input_dim < 1)
    throw ConfigError("GPU mlp: input_dim must be >= 1, got " + std::to_string(shape_.input_dim));
  if (shape_.num_classes < 2)
    throw ConfigError("GPU mlp: num_classes must be >= 2, got " + std::to_string(shape_.num_classes));
  // Variable names and order exactly as model::detail::DenseStack builds them.
  int in = shape_.input_dim;
  auto add_layer = [&](const std::string& scope, int out) {
    if (out < 1) throw ConfigError("GPU mlp: layer " + scope + " must have width >= 1, got " + std::to_string(out));
    Layer layer{in, out, num_parameters_, 0};
    const std::size_t kernel_size = static_cast<std::size_t>(in) * static_cast<std::size_t>(out);
    variables_.push_back(MlpVariable{scope + "/kernel", {in, out}, num_parameters_, kernel_size});
    num_parameters_ += kernel_size;
    layer.bias = num_parameters_;
    variables_.push_back(MlpVariable{scope + "/bias", {out}, num_parameters_, static_cast<std::size_t>(out)});
    num_parameters_ += static_cast<std::size_t>(out);
    layers_.push_back(layer);
    in = out;
  };
  for (std::size_t i = 0; i < shape_.hidden.size(); ++i) add_layer("dense_" + std::to_string(i), shape_.hidden[i]);
  add_layer("logits", shape_.num_classes);

  ScopedDevice on(device_);
  params_ = allocate<float>(num_parameters_);
  grads_ = allocate<float>(num_parameters_);
  STRATA_CHECK_CUDA(cudaMemsetAsync(params_.get(), 0, num_parameters_ * sizeof(float), stream_));
  STRATA_CHECK_CUDA(cudaMemsetAsync(grads_.get(), 0, num_parameters_ * sizeof(float), stream_));
  STRATA_CHECK_CUBLAS(cublasCreate(&cublas_));
  try {
    STRATA_CHECK_CUBLAS(cublasSetStream(cublas_, stream_));
    STRATA_CHECK_CUBLAS(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
  } catch (...) {
    (void)cublasDestroy(cublas_);
    throw;
  }
}

GpuMlp::~GpuMlp() {
  if (cublas_ != nullptr) {
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    (void)cublasDestroy(cublas_);  // never throws; a failure here leaks the handle at worst
    if (switched) (void)cudaSetDevice(previous);
  }
}

const MlpVariable& GpuMlp::variable(const std::string& name) const {
  for (const MlpVariable& v : variables_)
    if (v.name == name) return v;
  throw Error("GPU mlp has no variable '" + name + "'");
}

void GpuMlp::copy_variable(const std::string& name, void* dst, const void* src, std::size_t n, cudaMemcpyKind kind,
                           const char* what) {
  const MlpVariable& v = variable(name);
  if (n != v.size)
    throw Error(std::string("GPU mlp ") + what + " of '" + name + "': got " + std::to_string(n) + " floats, the variable has " +
                std::to_string(v.size));
  ScopedDevice on(device_);
  STRATA_CHECK_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), kind, stream_));
  STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

void GpuMlp::upload_param(const std::string& name, const float* host, std::size_t n) {
  copy_variable(name, params_.get() + variable(name).offset, host, n, cudaMemcpyHostToDevice, "upload");
}

void GpuMlp::download_param(const std::string& name, float* host, std::size_t n) {
  copy_variable(name, host, params_.get() + variable(name).offset, n, cudaMemcpyDeviceToHost, "download");
}

void GpuMlp::download_grad(const std::string& name, float* host, std::size_t n) {
  copy_variable(name, host, grads_.get() + variable(name).offset, n, cudaMemcpyDeviceToHost, "gradient download");
}

void GpuMlp::copy_all(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, const char* what) {
  if (n != num_parameters_)
    throw Error(std::string("GPU mlp ") + what + ": got " + std::to_string(n) + " floats, the model has " +
                std::to_string(num_parameters_) + " parameters");
  if (n > 0 && (dst == nullptr || src == nullptr)) throw Error(std::string("GPU mlp ") + what + ": null host buffer");
  ScopedDevice on(device_);
  STRATA_CHECK_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), kind, stream_));
  STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

void GpuMlp::upload_params(const float* host, std::size_t n) {
  copy_all(params_.get(), host, n, cudaMemcpyHostToDevice, "parameter upload");
}

void GpuMlp::download_grads(float* host, std::size_t n) {
  copy_all(host, grads_.get(), n, cudaMemcpyDeviceToHost, "gradient download");
}

// Grows the per-batch buffers; the old contents are not kept (nothing survives a step).
void GpuMlp::reserve(int batch) {
  if (batch <= capacity_) return;
  const std::size_t b = static_cast<std::size_t>(batch);
  int widest_input = 0;  // dX is only computed for layers above the first
  for (std::size_t l = 1; l < layers_.size(); ++l) widest_input = std::max(widest_input, layers_[l].in);
  x_ = allocate<float>(b * static_cast<std::size_t>(shape_.input_dim));
  labels_ = allocate<std::int32_t>(b);
  hidden_.clear();
  for (std::size_t l = 0; l + 1 < layers_.size(); ++l)
    hidden_.push_back(allocate<float>(b * static_cast<std::size_t>(layers_[l].out)));
  logits_ = allocate<float>(b * static_cast<std::size_t>(shape_.num_classes));
  scratch_ = allocate<float>(b * static_cast<std::size_t>(widest_input));
  row_loss_ = allocate<double>(b);
  row_correct_ = allocate<std::int32_t>(b);
  host_loss_.resize(b);
  host_correct_.resize(b);
  capacity_ = batch;
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

  STRATA_CHECK_CUDA(cudaMemcpyAsync(host_loss_.data(), row_loss_.get(), b * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  STRATA_CHECK_CUDA(
      cudaMemcpyAsync(host_correct_.data(), row_correct_.get(), b * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_));
  STRATA_CHECK_CUDA(cudaStreamSynchronize(stream_));
  // Summed on the host in row order, as the CPU model sums its per-row losses.
  double total = 0.0;
  for (std::size_t i = 0; i < b; ++i) {
    total += host_loss_[i];
    result.correct += host_correct_[i];
  }
  result.loss = total / static_cast<double>(batch);
  return result;
}

}  // namespace strata::replica::gpu
