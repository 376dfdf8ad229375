// Private: the BLIS backend of src/model/gemm.h, kept in its own translation unit so that blis.h
// (thousands of macros) is seen by gemm_blis.cc alone.
//
// Thread-safety: BLIS is reentrant (its packing-buffer pools and initialisation are locked), and
// the serial flavour strata links starts no threads, so any number of threads may call
// blis_sgemm at once; each product runs entirely on the calling thread.
#pragma once

#include <string>

#include "gemm.h"

namespace strata::model::detail {

// True when this build links BLIS.
bool blis_built();
// Empty when BLIS may be called in this process, else why not: BLIS 0.9.0 aborts the whole process
// on its first call whenever BLIS_ARCH_TYPE is set to anything but -1 (its kernel registry is not
// ready when it reads the variable), so with it set strata never calls BLIS. Read once.
const std::string& blis_unusable_reason();
// The functions below call BLIS: only where blis_built() and blis_unusable_reason() is empty.
// "0.9.0"; "" without BLIS.
std::string blis_version();
// The kernel configuration BLIS chose for this CPU at run time ("zen3", "skx", "haswell",
// "generic", ...; BLIS_ARCH_TYPE overrides); "" without BLIS.
std::string blis_arch();
// C = alpha * op(A) op(B) + beta * C for a call that passed gemm.cc's argument checks, m, n, k > 0.
// C is not read when beta == 0. Throws Error without BLIS.
void blis_sgemm(const GemmCall& g, const float* a, const float* b, float* c);

}  // namespace strata::model::detail
