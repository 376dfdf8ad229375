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
// Loss scaling, as on the CPU: train_step's gradients are those of the MEAN loss over THIS
// replica's batch (softmax gradient divided by the local batch size); the replicas' gradients are
// then averaged with all_reduce(MEAN). With equal shards (strata train splits a global batch that
// divides by the replica count) that is the gradient of the mean over the global batch. A replica
// with an empty batch contributes zeros to that mean, exactly like a CPU replica.
//
// Host staging: every host <-> device copy of parameters and gradients goes through one pinned
// buffer allocated by the constructor (gpu::PinnedBuffer; at most Staging::max_bytes, larger
// copies are chunked), so cudaMemcpyAsync is a real DMA and the host waits with one
// cudaStreamSynchronize. The step's loss and correct count come back through a 16-byte pinned
// buffer. When pinned memory cannot be had, copies go straight from/to the caller's pageable
// memory. The batch itself (x, labels: batch-sized) is uploaded from the caller's pageable memory.
//
// Allocation: the constructor allocates the parameters, gradients and pinned buffers, so
// construct every replica's GpuMlp before the group's first collective (strata train does, on the
// main thread). train_step allocates the batch scratch (cudaMalloc) when a batch is larger than
// any before, i.e. in the first step, and at least doubles it when it grows later; outgrown
// scratch is kept, not freed, until the destructor, because cudaFree may wait for every device
// that maps the memory, which must not happen while another replica's NCCL kernel waits for this
// one (see nccl_replica_group.h).
//
// Thread-safety: one thread at a time per GpuMlp (a replica's thread); distinct GpuMlp objects
// are independent. Every call makes the model's device current for its duration and restores the
// caller's. The stream must outlive the GpuMlp.
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
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "kernels.h"

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

// The variables of the model of `shape` in the CPU model's order, with their offsets into the
// flat buffers (the variables concatenated, no padding). Pure (no CUDA call). ConfigError for
// input_dim < 1, num_classes < 2 or a layer narrower than 1.
std::vector<MlpVariable> mlp_variables(const MlpShape& shape);

struct MlpStepResult {
  double loss = 0.0;         // mean softmax cross-entropy over the batch (0 for an empty batch)
  std::int64_t correct = 0;  // examples whose first maximal logit is the label
};

class GpuMlp {
 public:
  // Host staging (see the file comment). The defaults are what training uses; tests turn pinned
  // staging off and shrink the buffer to exercise the fallback and the chunking.
  struct Staging {
    bool pinned = true;
    std::size_t max_bytes = kDefaultMaxStagingBytes;
  };

  // Allocates parameters (zeros), gradients, the pinned staging buffers and a cuBLAS handle on
  // `device`, and loads the kernels. Work is queued on `stream` (not owned, must outlive this
  // object; nullptr = the legacy default stream); use the replica group's stream(r) so that the
  // gradient all-reduce is ordered after the backward pass for free. ConfigError for a bad shape
  // (checked before any CUDA call).
  GpuMlp(int device, MlpShape shape, cudaStream_t stream) : GpuMlp(device, std::move(shape), stream, Staging{}) {}
  GpuMlp(int device, MlpShape shape, cudaStream_t stream, Staging staging);
  ~GpuMlp();
  GpuMlp(const GpuMlp&) = delete;
  GpuMlp& operator=(const GpuMlp&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  const std::vector<MlpVariable>& variables() const { return variables_; }
  // Error naming the variable when the model has no such variable.
  const MlpVariable& variable(const std::string& name) const;
  std::size_t num_parameters() const { return num_parameters_; }
  // True when host copies are staged through pinned memory (false: the pageable fallback).
  bool pinned_staging() const { return staging_.capacity() > 0; }

  // Device pointers to the flat buffers (num_parameters() floats each).
  float* params() { return params_.get(); }
  float* grads() { return grads_.get(); }

  // Host <-> device copies of one variable; `n` must equal its size. Synchronous (they return once
  // the copy is done, so the host buffer may be reused or read at once), ordered after the work
  // already queued on the stream.
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
  // Synchronous host -> device / device -> host copies of n floats on the stream, staged through
  // the pinned buffer when there is one.
  void to_device(float* device, const float* host, std::size_t n);
  void to_host(float* host, const float* device, std::size_t n);
  const MlpVariable& checked_variable(const std::string& name, std::size_t n, const char* what) const;
  void check_all(const void* host, std::size_t n, const char* what) const;

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
  // Scratch outgrown by a larger batch: kept, not freed, until the destructor (see the file
  // comment); growth doubles, so this holds less than the live scratch.
  std::vector<DevicePtr<void>> retired_;
  // The step's totals: summed on the device, copied back into totals_host_ (pinned when possible).
  DevicePtr<StepTotals> totals_;
  PinnedBuffer totals_pinned_;
  StepTotals totals_fallback_{};
  StepTotals* totals_host_ = nullptr;
  // Host staging for parameters and gradients (empty: the pageable fallback).
  PinnedBuffer staging_;
};

}  // namespace strata::replica::gpu
