// Math kernels of the layer graph. Every matrix product of src/nn goes through gemm() so that one
// function decides which library computes it. Private to src/nn.
//
// Determinism: results depend only on the operands' values and shapes, never on addresses or the
// thread, so sync training stays bit-reproducible. That is why reductions and transcendental
// functions elsewhere in src/nn are plain scalar loops: Eigen's vectorised reductions and
// exp/tanh peel a data-dependent number of leading elements to reach alignment, which changes
// the summation order or the approximation used with the heap layout.
#pragma once

namespace strata::nn::detail {

// Row-major C[m, n] (leading dimension ldc) = op(A)[m, k] * op(B)[k, n], plus C's old value
// when `accumulate`. op(A) = A [m, k] (lda) or, when trans_a, A^T with A stored [k, m] (lda);
// likewise B. m, n, k >= 0; a zero k gives C = 0 (or C unchanged when accumulating).
// Thread-safety: reentrant.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
          bool accumulate, float* c, int ldc);

}  // namespace strata::nn::detail
