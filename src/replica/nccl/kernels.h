// Host-side launchers of the CUDA kernels in kernels.cu (GPU replicas). Each queues one kernel on
// `stream` on the current device and returns; none synchronises. Launch errors surface through
// cudaGetLastError (callers use STRATA_CHECK_LAUNCH). All matrices are row-major, as in the CPU
// model: element (i, j) of a [rows, cols] matrix is at i * cols + j. Sizes of zero launch nothing
// (never a grid of 0 blocks, which is a launch error). Element indices are 64-bit; row and column
// counts are int, like cuBLAS's.
#pragma once

#include "strata/config.h"

#if !STRATA_HAVE_CUDA
#error "built without CUDA"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace strata::replica::gpu {

// Loads every kernel of kernels.cu into the current device's context now (cudaFuncGetAttributes
// forces the load). With CUDA's lazy module loading (the default since CUDA 12.2) a kernel is
// otherwise loaded at its first launch, and loading may wait for the whole context to go idle:
// the MEAN fallback's divide kernel is first launched right after an NCCL all-reduce on the same
// device, whose kernel cannot finish before the other replicas launch theirs. Call once per device
// at setup. Returns the first error.
cudaError_t preload_kernels();

// Loss and correct count of a batch, summed over its rows on the device (one 16-byte copy back).
struct StepTotals {
  double loss;         // sum over rows of row_loss
  long long correct;   // sum over rows of row_correct
};

// data[i] /= divisor for i < n: MEAN as SUM then divide, the host group's arithmetic.
void launch_divide(float* data, std::size_t n, float divisor, cudaStream_t stream);

// y[i, j] += bias[j], then y = max(y, 0) when `relu` (hidden layers; not the logits).
void launch_bias_activation(float* y, const float* bias, int rows, int cols, bool relu, cudaStream_t stream);

// Backward through a ReLU whose OUTPUT `h` was kept: h[i] = h[i] > 0 ? dh[i] : 0, in place over h
// (relu(z) > 0 exactly where z > 0, so the output is all the backward pass needs).
void launch_relu_backward(float* h, const float* dh, std::size_t n, cudaStream_t stream);

// db[j] = sum over i of dy[i, j] (the bias gradient), summed in a fixed order: deterministic.
void launch_bias_grad(const float* dy, int rows, int cols, float* db, cudaStream_t stream);

// Softmax cross-entropy of every row of `logits` [rows, classes] against labels[i] (which must be
// in [0, classes)): row_loss[i] = log sum_j exp(z_ij) - z_i,label (in double, max-shifted, as
// the CPU model); row_correct[i] = 1 when the first maximal logit is the label. When want_grad,
// logits is overwritten with d(mean loss)/d(logits) = (softmax - onehot) / rows.
// out->loss = sum of row_loss[0..rows), out->correct = sum of row_correct[0..rows), in a fixed
// order (deterministic). rows == 0 writes zeros.
void launch_step_totals(const double* row_loss, const std::int32_t* row_correct, int rows, StepTotals* out,
                        cudaStream_t stream);

void launch_softmax_xent(float* logits, const std::int32_t* labels, int rows, int classes, bool want_grad,
                         double* row_loss, std::int32_t* row_correct, cudaStream_t stream);

}  // namespace strata::replica::gpu
