// Private single-precision matrix product for the models (the layer graph, src/nn/kernels.cc):
// C = alpha * op(A) op(B) + beta * C on row-major buffers, BLAS-style.
//
// Backends:
//   blis       BLIS, serial flavour (libblis-serial-dev), when the build found it: the default.
//              Reentrant by design and starts no threads, so any number of threads may multiply
//              at once. Called through its native bli_sgemm (gemm_blis.h).
//   openblas   Debian's OpenBLAS, serial flavour (libopenblas-serial-dev), when the build found it;
//              opt-in, for processes whose products all run on one thread (below).
//   eigen      Eigen 3's GEMM; always available, and the fallback of both libraries.
//   reference  every element summed in double in index order and rounded once: the slow oracle
//              of the checks, tests and `strata bench --op step`'s #wrong column.
// BLIS and OpenBLAS pick their kernels by cpuid at run time (OPENBLAS_CORETYPE overrides), so
// this library never trusts them blindly: the first product of each distinct call shape in a
// process is checked first (see below), and one wrong result turns that library off for the whole
// process (logged once), its products then going to Eigen.
// The process default is STRATA_GEMM (auto | blis | openblas | eigen | reference). auto is BLIS
// when it is built in and the kernel family it chose suits this CPU and build (blis_arch_is_fast),
// else OpenBLAS under the narrow conditions of auto_gemm_backend (below), else Eigen. While
// BLIS_ARCH_TYPE is set, BLIS is never called (BLIS 0.9.0 aborts the process on its first call
// then): auto warns and uses Eigen, STRATA_GEMM=blis is a ConfigError. auto never gives OpenBLAS to
// a process that multiplies on several threads: Debian's serial build is not thread-safe (no
// USE_LOCKING), and with several short-lived threads it is unsafe even with its calls serialised
// (docs/PERFORMANCE.md, "The model step").
// ScopedGemmBackend overrides the default on one thread.
//
// The check, per library and distinct (transposes, m, n, k, leading dimensions, alpha, beta == 0):
// the product is computed twice by the library on seeded random operands of that exact shape, and
// must be bit for bit the same both times (sync training's reproducibility rests on it) and within
// the standard floating-point error bound of the double reference (k * 2^-24 * sum |terms|, times
// 8) on every checked element (every row, or for shapes over 2^26 multiply-adds a sample of rows
// that includes the first and last 32). Shapes already checked are answered from a small table
// under a mutex (a per-thread copy first).
//
// Contracts: m, n, k >= 0; row-major storage, lda/ldb/ldc >= the stored row length (and >= 1);
// C is not read when beta == 0 (garbage and NaN in it are fine); A, B and C must not overlap.
// Results are deterministic for a given backend, kernel and shape (same inputs -> same bits),
// independent of the buffers' addresses and of the calling thread. Thread-safe: any number of
// threads may call at once; each product runs entirely on the calling thread (no BLAS threads:
// replicas give the parallelism). The serial OpenBLAS is not safe to enter from two threads at
// once (built without locking), so its products take turns on a process-wide mutex.
// Errors: ConfigError for a bad STRATA_GEMM (or one naming a library this build lacks); Error for
// arguments that break the contract above.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::model::detail {

enum class Transpose : bool { kNo = false, kYes = true };

enum class GemmBackend { kDefault, kOpenBlas, kEigen, kReference, kBlis };

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, on this thread's backend.
void sgemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc);

// The backend the next sgemm on this thread uses: never kDefault; kBlis / kOpenBlas only while
// that library is built in and has failed no check in this process (a shape not checked yet may
// still turn it off on first use).
GemmBackend current_gemm_backend();

// What STRATA_GEMM=auto resolves to in this process, once: kBlis where BLIS's kernels suit the CPU
// (blis_arch_is_fast); else kOpenBlas where OpenBLAS chose AVX-512 kernels on a CPU that has
// AVX-512 (openblas_core_is_avx512) and the process multiplies on one thread
// (set_multiplying_threads(1) before the first product); else kEigen. A choice by identity, never
// by timing, so every run on one machine and environment gets the same bits.
GemmBackend auto_gemm_backend();
// True for OpenBLAS's AVX-512 SGEMM kernel families (skylakex, cooperlake, sapphirerapids; any
// case): they outrun Eigen's AVX-512 code, where OpenBLAS's AVX2 families do not (the figures:
// docs/PERFORMANCE.md, "Issue 21 on an AMD EPYC VM").
bool openblas_core_is_avx512(const std::string& core);

// True when this build links the backend's library (always for eigen and reference).
bool gemm_backend_built(GemmBackend backend);
// True once the backend's library failed a check in this process (it is then never used again),
// and for BLIS while BLIS_ARCH_TYPE is set (BLIS 0.9.0 aborts the process on its first call then);
// false for eigen and reference.
bool gemm_backend_disabled(GemmBackend backend);

// "blis 0.9.0 (zen3)", "openblas 0.3.21 (Cooperlake)", "eigen 3.4.0", "reference (double)".
std::string gemm_backend_name(GemmBackend backend);
// "blis", "openblas", "eigen", "reference"; parse_gemm_backend is the inverse (plus "auto" ->
// kDefault), ConfigError naming `what` otherwise.
const char* gemm_backend_id(GemmBackend backend);
GemmBackend parse_gemm_backend(const std::string& text, const std::string& what);

// Makes sgemm on the constructing thread use `backend` until destruction (kDefault: the process
// default). Nests; restores the previous choice.
class ScopedGemmBackend {
 public:
  explicit ScopedGemmBackend(GemmBackend backend);
  ~ScopedGemmBackend();
  ScopedGemmBackend(const ScopedGemmBackend&) = delete;
  ScopedGemmBackend& operator=(const ScopedGemmBackend&) = delete;

 private:
  GemmBackend previous_;
};

// One sgemm call's shape, as recorded by GemmRecorder.
struct GemmCall {
  Transpose ta = Transpose::kNo, tb = Transpose::kNo;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  double flops() const { return 2.0 * m * n * static_cast<double>(k); }
};

// Records the shape of every sgemm made on the constructing thread while it lives (benchmarks:
// the exact list of products one model step makes). Not nestable.
class GemmRecorder {
 public:
  GemmRecorder();
  ~GemmRecorder();
  GemmRecorder(const GemmRecorder&) = delete;
  GemmRecorder& operator=(const GemmRecorder&) = delete;
  const std::vector<GemmCall>& calls() const { return calls_; }

 private:
  friend void sgemm(Transpose, Transpose, int, int, int, float, const float*, int, const float*, int, float, float*,
                    int);
  std::vector<GemmCall> calls_;
};

// Whether OpenBLAS's kernel family suits this CPU (a warning when STRATA_GEMM=openblas and not),
// given the family it chose (openblas_get_corename()) and
// whether this CPU runs AVX2: on an AVX2 processor only the families with AVX2/AVX-512 SGEMM
// kernels (haswell, zen, skylakex, cooperlake, sapphirerapids; any case) qualify. OpenBLAS 0.3.21
// falls back to its SSE3 "Prescott" kernels on x86-64 processors it does not know (a virtualised
// AVX-512 Xeon among them; docs/PERFORMANCE.md), which are correct but slow, so there Eigen is
// faster.
bool openblas_core_is_fast(const std::string& core, bool cpu_has_avx2);

// The same for BLIS's kernel configuration (blis_arch()): auto picks BLIS only where this is true.
// On an AVX2 processor: haswell, skx, knl and the zen family (any case), except haswell when Eigen
// runs AVX-512 code here (eigen_avx512: this build compiled for AVX-512, e.g. -march=native on such
// a CPU): BLIS 0.9.0 serves some AVX-512 Xeons with its AVX2 haswell kernels, which Eigen's AVX-512
// code outruns there (docs/PERFORMANCE.md). Elsewhere anything but "generic" (BLIS's portable C
// kernels), since Eigen has no faster path there.
bool blis_arch_is_fast(const std::string& arch, bool cpu_has_avx2, bool eigen_avx512);
// Whether this build's Eigen code uses AVX-512 (compiled with __AVX512F__).
bool eigen_uses_avx512();

// Runs `backend`'s check for `call` now (as the first product of that shape would), returning
// whether the library is still enabled afterwards. Tests and the bench use it; false for a backend
// that is not built or not a checked library (eigen, reference).
bool check_gemm_shape(GemmBackend backend, const GemmCall& call);

// Largest |got - want| allowed for one element of a product by the check: 8 * k * 2^-24 *
// (|alpha| * sum_p |a_ip b_pj| + |beta c_ij|) + the smallest normal float. `abs_sum` is the
// bracket. Shared with the tests so they hold kernels to the same bound.
double gemm_error_bound(int k, double abs_sum);

}  // namespace strata::model::detail
