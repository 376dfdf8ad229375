// CUDA kernels of the GPU replicas: the MEAN fallback of the NCCL group and the element-wise parts
// of the MLP step (bias + ReLU, ReLU backward, bias gradient, softmax cross-entropy). The GEMMs
// are cuBLAS calls in gpu_mlp.cc. The kernels are simple on purpose: next to the GEMMs they are
// O(batch * width) and memory-bound, so the aim is coalesced access and a deterministic order of
// summation, not peak throughput.
#include "kernels.h"

#include <algorithm>
#include <cfloat>
#include <climits>

namespace strata::replica::gpu {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;

// Enough blocks to fill any current GPU; the grid-stride loops cover larger sizes.
int blocks_for(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<std::size_t>(blocks, 65535));
}

__global__ void divide_kernel(float* data, std::size_t n, float divisor) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    data[i] = data[i] / divisor;  // IEEE division (no --use_fast_math), as the host group's x /= k
}

__global__ void bias_activation_kernel(float* y, const float* bias, std::size_t total, int cols, bool relu) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = y[i] + bias[i % static_cast<std::size_t>(cols)];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void relu_backward_kernel(float* h, const float* dh, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    h[i] = h[i] > 0.0f ? dh[i] : 0.0f;
}

// Block = 32 columns x 8 row-lanes. Lane (x, y) sums rows y, y+8, ... of column x (consecutive x
// read consecutive addresses: coalesced), then row-lane 0 adds the 8 partial sums in order.
constexpr int kBiasRows = 8;
__global__ void bias_grad_kernel(const float* dy, int rows, int cols, float* db) {
  __shared__ float partial[kBiasRows][kWarp + 1];  // +1: no bank conflicts on the final read
  const int j = blockIdx.x * kWarp + threadIdx.x;
  float sum = 0.0f;
  if (j < cols)
    for (int i = threadIdx.y; i < rows; i += kBiasRows) sum += dy[static_cast<std::size_t>(i) * cols + j];
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float total = 0.0f;
    for (int k = 0; k < kBiasRows; ++k) total += partial[k][threadIdx.x];
    db[j] = total;
  }
}

// One warp per row. The arithmetic follows the CPU model (src/nn/graph_model.cc) operation by
// operation: float max shift, exp and sums in double, the gradient rounded to float before the
// float multiply by 1/batch. Only the order of the double sum differs (a warp tree, not a loop).
constexpr int kSoftmaxWarps = 4;
__global__ void softmax_xent_kernel(float* logits, const std::int32_t* labels, int rows, int classes,
                                    bool want_grad, double* row_loss, std::int32_t* row_correct) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kSoftmaxWarps + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  float* z = logits + static_cast<std::size_t>(row) * classes;
  const int label = labels[row];

  // Argmax, the first maximum winning ties: each lane scans j = lane, lane+32, ... (increasing, so
  // a strict > keeps the first), then the tree keeps the lower index on equal values.
  float best = -FLT_MAX;
  int best_j = INT_MAX;
  for (int j = lane; j < classes; j += kWarp) {
    if (best_j == INT_MAX || z[j] > best) {
      best = z[j];
      best_j = j;
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other = __shfl_down_sync(kFullMask, best, offset);
    const int other_j = __shfl_down_sync(kFullMask, best_j, offset);
    if (other_j != INT_MAX && (best_j == INT_MAX || other > best || (other == best && other_j < best_j))) {
      best = other;
      best_j = other_j;
    }
  }
  best = __shfl_sync(kFullMask, best, 0);
  best_j = __shfl_sync(kFullMask, best_j, 0);
  const float m = best;
  const float z_label = z[label];  // read by every lane before any lane overwrites z below

  double sum = 0.0;
  for (int j = lane; j < classes; j += kWarp) sum += exp(static_cast<double>(z[j] - m));
  for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_down_sync(kFullMask, sum, offset);
  sum = __shfl_sync(kFullMask, sum, 0);

  if (lane == 0) {
    row_loss[row] = log(sum) - static_cast<double>(z_label - m);
    row_correct[row] = best_j == label ? 1 : 0;
  }
  if (!want_grad) return;
  __syncwarp();  // every lane has read its logits (and z_label) before any is overwritten
  const double inv_sum = 1.0 / sum;
  const float inv_batch = 1.0f / static_cast<float>(rows);
  for (int j = lane; j < classes; j += kWarp) {
    float g = static_cast<float>(exp(static_cast<double>(z[j] - m)) * inv_sum) * inv_batch;
    if (j == label) g -= inv_batch;
    z[j] = g;
  }
}

// One block: thread t sums rows t, t + blockDim.x, ... in order, then thread 0 adds the partial
// sums in thread order. A fixed association, so the same batch always gives the same bits.
constexpr int kTotalsThreads = 256;
__global__ void step_totals_kernel(const double* row_loss, const std::int32_t* row_correct, int rows,
                                   StepTotals* out) {
  __shared__ double loss[kTotalsThreads];
  __shared__ long long correct[kTotalsThreads];
  double l = 0.0;
  long long c = 0;
  for (int i = threadIdx.x; i < rows; i += kTotalsThreads) {
    l += row_loss[i];
    c += row_correct[i];
  }
  loss[threadIdx.x] = l;
  correct[threadIdx.x] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    long long right = 0;
    for (int t = 0; t < kTotalsThreads; ++t) {
      total += loss[t];
      right += correct[t];
    }
    out->loss = total;
    out->correct = right;
  }
}

}  // namespace

cudaError_t preload_kernels() {
  cudaFuncAttributes attributes;
  const void* kernels[] = {reinterpret_cast<const void*>(&divide_kernel),
                           reinterpret_cast<const void*>(&bias_activation_kernel),
                           reinterpret_cast<const void*>(&relu_backward_kernel),
                           reinterpret_cast<const void*>(&bias_grad_kernel),
                           reinterpret_cast<const void*>(&softmax_xent_kernel),
                           reinterpret_cast<const void*>(&step_totals_kernel)};
  for (const void* kernel : kernels)
    if (const cudaError_t rc = cudaFuncGetAttributes(&attributes, kernel); rc != cudaSuccess) return rc;
  return cudaSuccess;
}

void launch_step_totals(const double* row_loss, const std::int32_t* row_correct, int rows, StepTotals* out,
                        cudaStream_t stream) {
  step_totals_kernel<<<1, kTotalsThreads, 0, stream>>>(row_loss, row_correct, rows < 0 ? 0 : rows, out);
}

void launch_divide(float* data, std::size_t n, float divisor, cudaStream_t stream) {
  if (n == 0) return;
  divide_kernel<<<blocks_for(n), kThreads, 0, stream>>>(data, n, divisor);
}

void launch_bias_activation(float* y, const float* bias, int rows, int cols, bool relu, cudaStream_t stream) {
  const std::size_t total = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (total == 0) return;
  bias_activation_kernel<<<blocks_for(total), kThreads, 0, stream>>>(y, bias, total, cols, relu);
}

void launch_relu_backward(float* h, const float* dh, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(h, dh, n);
}

void launch_bias_grad(const float* dy, int rows, int cols, float* db, cudaStream_t stream) {
  if (cols <= 0) return;
  const dim3 block(kWarp, kBiasRows);
  const dim3 grid(static_cast<unsigned>((cols + kWarp - 1) / kWarp));
  bias_grad_kernel<<<grid, block, 0, stream>>>(dy, rows, cols, db);  // rows == 0 writes zeros
}

void launch_softmax_xent(float* logits, const std::int32_t* labels, int rows, int classes, bool want_grad,
                         double* row_loss, std::int32_t* row_correct, cudaStream_t stream) {
  if (rows <= 0 || classes <= 0) return;
  const int blocks = (rows + kSoftmaxWarps - 1) / kSoftmaxWarps;
  softmax_xent_kernel<<<blocks, kSoftmaxWarps * kWarp, 0, stream>>>(logits, labels, rows, classes, want_grad,
                                                                    row_loss, row_correct);
}

}  // namespace strata::replica::gpu
