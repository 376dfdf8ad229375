// GpuMlp: one GPU replica's forward/backward pass of the built-in mlp (and softmax) model, on
// device buffers. Same math and variables as the CPU model (src/model/layers.{h,cc}): dense
// layers y = x W + b with ReLU between them, none on the logits, mean softmax cross-entropy; the
// variables are "dense_<i>/kernel" [in, out], "dense_<i>/bias" [out], ..., "logits/kernel",
// "logits/bias", all row-major as on the parameter servers. Its gradients match the CPU model's
// up to float rounding (tests/gpu/gpu_test.cc compares them).
//
// Layout: all parameters live in ONE contiguous device buffer, in the CPU model's variable order
// (layer by layer, kernel before bias), and all gradients in a second one with the same layout,
// so a replica all-reduces its whole gradient with one collective:
//   group.all_reduce(r, mlp.grads(), mlp.num_parameters(), ReduceOp::kMean).
//
// Row-major data through column-major cuBLAS: a row-major [rows, cols] matrix is, byte for byte, a
// column-major [cols, rows] matrix, i.e. its transpose. So each row-major product C = A B is
// computed as the column-major product C^T = B^T A^T on the same memory, with no copy or explicit
// transpose (gpu_mlp.cc spells out each GEMM). TF32 is off (CUBLAS_DEFAULT_MATH keeps FP32 GEMMs in
// FP32), so results stay within float rounding of the CPU model.
//
// Thread-safety: one thread at a time per GpuMlp (a replica's thread); distinct GpuMlp objects
// are independent. Every call makes the model's device current for its duration.
#pragma once

#include "strata/config.h"

#if !STRATA_HAVE_CUDA
#error "built without CUDA"
#endif

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata::replica::gpu {

// Layer widths, as in model::ModelConfig: input_dim -> hidden... -> num_classes (no hidden layer:
// the softmax model).
struct MlpShape {
  int input_dim = 0;
  std::vector<int> hidden;
  int num_classes = 0;
};

// One variable inside the flat parameter / gradient buffers.
struct MlpVariable {
  std::string name;
  std::vector<std::int64_t> shape;  // {in, out} for a kernel, {out} for a bias
  std::size_t offset = 0;           // in floats, into params() and grads()
  std::size_t size = 0;             // elements
};

struct MlpStepResult {
  double loss = 0.0;         // mean softmax cross-entropy over the batch (0 for an empty batch)
  std::int64_t correct = 0;  // examples whose first maximal logit is the label
};

class GpuMlp {
 public:
  // Allocates parameters (zeros), gradients and a cuBLAS handle on `device`. Work is queued on
  // `stream` (not owned; nullptr = the legacy default stream); use the replica group's stream(r)
  // so that the gradient all-reduce is ordered after the backward pass for free. ConfigError for
  // a bad shape.
  GpuMlp(int device, MlpShape shape, cudaStream_t stream);
  ~GpuMlp();
  GpuMlp(const GpuMlp&) = delete;
  GpuMlp& operator=(const GpuMlp&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  const std::vector<MlpVariable>& variables() const { return variables_; }
  // Error naming the variable when the model has no such variable.
  const MlpVariable& variable(const std::string& name) const;
  std::size_t num_parameters() const { return num_parameters_; }

  // Device pointers to the flat buffers (num_parameters() floats each).
  float* params() { return params_.get(); }
  float* grads() { return grads_.get(); }

  // Host <-> device copies of one variable; `n` must equal its size. Synchronous (they return once
  // the copy is done), ordered after the work already queued on the stream.
  void upload_param(const std::string& name, const float* host, std::size_t n);
  void download_param(const std::string& name, float* host, std::size_t n);
  void download_grad(const std::string& name, float* host, std::size_t n);
  // The same for all variables at once, in the flat layout (n must equal num_parameters()): how a
  // training step loads the pulled weights with one copy.
  void upload_params(const float* host, std::size_t n);
  void download_grads(float* host, std::size_t n);

  // One step on a host batch: x [batch, input_dim] row-major, labels [batch] each in
  // [0, num_classes) (Error naming the first bad one). Uploads the batch, runs the forward pass
  // and, when `backward`, writes d(mean loss)/d(variable) for every variable into grads() (zeros
  // for an empty batch). Returns once loss and correct count are back on the host; the gradients
  // are then complete on the device too.
  MlpStepResult train_step(const float* x, const std::int32_t* labels, int batch, bool backward = true);

 private:
  struct Layer {
    int in = 0, out = 0;
    std::size_t kernel = 0, bias = 0;  // offsets into params_ / grads_
  };
  struct CudaFree {
    void operator()(void* p) const noexcept;
  };
  template <typename T>
  using DevicePtr = std::unique_ptr<T, CudaFree>;
  template <typename T>
  static DevicePtr<T> allocate(std::size_t n);

  void reserve(int batch);
  void copy_variable(const std::string& name, void* dst, const void* src, std::size_t n, cudaMemcpyKind kind,
                     const char* what);
  void copy_all(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, const char* what);

  int device_;
  cudaStream_t stream_;
  MlpShape shape_;
  std::vector<Layer> layers_;
  std::vector<MlpVariable> variables_;
  std::size_t num_parameters_ = 0;
  cublasHandle_t cublas_ = nullptr;

  DevicePtr<float> params_, grads_;
  // Per-batch scratch, grown to the largest batch seen: the input, one activation per hidden
  // layer (reused for its gradient in the backward pass), the logits (then their gradient), dX of
  // the layer being processed, and the per-row loss / correct flags of the softmax kernel.
  int capacity_ = 0;
  DevicePtr<float> x_;
  DevicePtr<std::int32_t> labels_;
  std::vector<DevicePtr<float>> hidden_;
  DevicePtr<float> logits_, scratch_;
  DevicePtr<double> row_loss_;
  DevicePtr<std::int32_t> row_correct_;
  std::vector<double> host_loss_;
  std::vector<std::int32_t> host_correct_;
};

}  // namespace strata::replica::gpu
