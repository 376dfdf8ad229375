// gemm(): the models' OpenBLAS path when it is on (src/model/gemm.h), else Eigen's blocked GEMM
// kernel, single-threaded (parallelism comes from replicas).
//
// Eigen's `c.noalias() = a * b` allocates its packing buffers (blockA, blockB) on the heap on
// every call once they pass EIGEN_STACK_ALLOCATION_LIMIT (128 KiB: the first layer of the MLP at
// batch 128 does), which would break the layer graph's "no heap allocation in steady state"
// contract. So gemm() calls the same kernel, general_matrix_matrix_product, with a blocking whose
// buffers live in a per-thread scratch vector that only grows. Block sizes come from the same
// computeProductBlockingSizes call Eigen's own product makes, so the arithmetic (the order of
// every sum) is exactly what `noalias()` would compute. Eigen 3.4 internal API; this file is the
// only user.
#include "kernels.h"

// Every strata translation unit that includes Eigen must agree on EIGEN_FAST_MATH (ODR), like
// src/model/gemm.cc and src/ps/optimizer.cc.
#ifndef EIGEN_FAST_MATH
#define EIGEN_FAST_MATH 0
#endif
#if EIGEN_FAST_MATH
#error "strata's layer graph must be built with EIGEN_FAST_MATH=0, like src/ps/optimizer.cc"
#endif

#include <Eigen/Core>

#include <vector>

#include "model/gemm.h"

namespace strata::nn::detail {
namespace {

using Eigen::Index;

// Packing buffers at caller-provided addresses.
class ScratchBlocking : public Eigen::internal::level3_blocking<float, float> {
 public:
  ScratchBlocking(Index mc, Index nc, Index kc, float* block_a, float* block_b) {
    this->m_mc = mc;
    this->m_nc = nc;
    this->m_kc = kc;
    this->m_blockA = block_a;
    this->m_blockB = block_b;
  }
};

template <int LhsOrder, int RhsOrder>
void run(Index m, Index n, Index k, const float* a, Index lda, const float* b, Index ldb, float* c, Index ldc) {
  // A row-major result is computed as the column-major C^T = B^T A^T: the blocking is sized for
  // that problem (rows n, columns m), as gemm_blocking_space<RowMajor, ...> sizes it.
  Index kc = k, mc = n, nc = m;
  Eigen::internal::computeProductBlockingSizes<float, float, 1>(kc, mc, nc, Index{1});
  const std::size_t size_a = static_cast<std::size_t>(mc * kc), size_b = static_cast<std::size_t>(kc * nc);
  // Grows to the largest product this thread ran, then never allocates again.
  thread_local std::vector<float, Eigen::aligned_allocator<float>> scratch;
  // Each block starts on a 64-byte boundary (any packet size).
  const std::size_t padded_a = (size_a + 15) & ~std::size_t{15};
  if (scratch.size() < padded_a + size_b) scratch.resize(padded_a + size_b);
  ScratchBlocking blocking(mc, nc, kc, scratch.data(), scratch.data() + padded_a);
  Eigen::internal::general_matrix_matrix_product<Index, float, LhsOrder, false, float, RhsOrder, false, Eigen::RowMajor,
                                                 1>::run(m, n, k, a, lda, b, ldb, c, 1, ldc, 1.0f, blocking, nullptr);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
          bool accumulate, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  // The models' products go to the checked kernel library of src/model/gemm.h (BLIS by default,
  // OpenBLAS on request) when one is in use and has passed its per-shape checks (no heap
  // allocation once a shape is checked); otherwise the Eigen kernel below, which never allocates
  // after the first product of a size. Products with a dimension of 1 stay on Eigen: OpenBLAS
  // 0.3.21 hands them to its GEMV/GER paths, which malloc a buffer on every call (n = 1, a
  // width-1 logit, is one), and they are cheap either way.
  namespace md = strata::model::detail;
  const md::GemmBackend backend = md::current_gemm_backend();
  // The double-precision reference (tests, `strata bench --op step`) takes every product.
  if (backend == md::GemmBackend::kReference ||
      (m >= 2 && n >= 2 && k >= 2 && (backend == md::GemmBackend::kBlis || backend == md::GemmBackend::kOpenBlas))) {
    md::sgemm(trans_a ? md::Transpose::kYes : md::Transpose::kNo, trans_b ? md::Transpose::kYes : md::Transpose::kNo,
              m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
    return;
  }
  if (!accumulate)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c[static_cast<std::size_t>(i) * static_cast<std::size_t>(ldc) + static_cast<std::size_t>(j)] = 0.0f;
  if (k <= 0) return;
  // op(A) is [m, k]: A itself is row-major; A^T of a row-major [k, m] is column-major with the
  // same leading dimension. Likewise B.
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (!trans_a && !trans_b) run<R, R>(m, n, k, a, lda, b, ldb, c, ldc);
  else if (!trans_a) run<R, C>(m, n, k, a, lda, b, ldb, c, ldc);
  else if (!trans_b) run<C, R>(m, n, k, a, lda, b, ldb, c, ldc);
  else run<C, C>(m, n, k, a, lda, b, ldb, c, ldc);
}

}  // namespace strata::nn::detail
