// BLIS through its native typed API (see gemm_blis.h).
#include "gemm_blis.h"

#include <cstdlib>

#include "strata/common/error.h"

#if STRATA_HAVE_BLIS
#include <blis.h>
#endif

namespace strata::model::detail {

bool blis_built() { return STRATA_HAVE_BLIS != 0; }

const std::string& blis_unusable_reason() {
  static const std::string reason = []() -> std::string {
    const char* arch_type = std::getenv("BLIS_ARCH_TYPE");
    if (arch_type == nullptr || std::string(arch_type) == "-1") return {};
    return std::string("BLIS_ARCH_TYPE is set ('") + arch_type +
           "'), and BLIS 0.9.0 aborts the process on its first call with it set: unset it";
  }();
  return reason;
}

#if STRATA_HAVE_BLIS

std::string blis_version() { return bli_info_get_version_str(); }

std::string blis_arch() { return bli_arch_string(bli_arch_query_id()); }

void blis_sgemm(const GemmCall& g, const float* a, const float* b, float* c) {
  // Row-major storage: row stride = leading dimension, column stride 1; BLIS applies the
  // transposes itself. Its typed API takes non-const pointers but only writes C (and, with
  // beta == 0, overwrites it without reading).
  float alpha = g.alpha, beta = g.beta;
  bli_sgemm(g.ta == Transpose::kYes ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
            g.tb == Transpose::kYes ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g.m, g.n, g.k, &alpha,
            const_cast<float*>(a), g.lda, 1, const_cast<float*>(b), g.ldb, 1, &beta, c, g.ldc, 1);
}

#else

std::string blis_version() { return {}; }
std::string blis_arch() { return {}; }
void blis_sgemm(const GemmCall&, const float*, const float*, float*) {
  throw Error("sgemm: this build of strata has no BLIS");
}

#endif

}  // namespace strata::model::detail
