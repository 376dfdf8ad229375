// cuBLAS, opened on first use. libcublas's static initialisers (through libcublasLt) cost CPU time
// at the start of every process that links it, GPU or not (docs/PERFORMANCE.md, "On a real GPU"
// has the figure), so strata links only the CUDA runtime and NCCL and dlopen()s cuBLAS when the
// first GPU model is built: CPU-only runs, the tools and the tests start without it.
//
// Thread-safe: the library is opened once, under a mutex; later calls read one atomic pointer
// (an acquire load per call, nothing more on the GEMM path). The table is never unloaded. Private to the GPU replica target.
#pragma once

#include "strata/config.h"

#if !STRATA_HAVE_NCCL
#error "built without NCCL"
#endif

#include <cublas_v2.h>

namespace strata::detail {

// The cuBLAS entry points strata calls, with the types cublas_v2.h declares for them (the _v2
// names are what its macros map cublasCreate etc. to).
struct CublasApi {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasSgemm_v2) sgemm = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
};

// Opens libcublas (its soname through the loader's search path, then the toolkit directory this
// build was configured with) and resolves every entry point. Throws strata::CudaError naming the
// library and dlerror()'s text when it cannot; the next call tries again.
const CublasApi& cublas();

// The table if cuBLAS is already open, else null (for error paths that must not open it).
const CublasApi* cublas_if_loaded() noexcept;

}  // namespace strata::detail
