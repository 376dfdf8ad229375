// sgemm backends and the checks of the kernel libraries (see gemm.h for the contract).
#include "gemm.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>

// Every strata translation unit that includes Eigen must agree on EIGEN_FAST_MATH, or Eigen's
// inline packet functions would differ between objects (ODR); src/ps/optimizer.cc needs 0.
#ifndef EIGEN_FAST_MATH
#define EIGEN_FAST_MATH 0
#endif
#if EIGEN_FAST_MATH
#error "strata's GEMM must be built with EIGEN_FAST_MATH=0, like src/ps/optimizer.cc"
#endif

#include <Eigen/Core>

#include "gemm_blis.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"

#if STRATA_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace strata::model::detail {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using ConstStridedMap = Eigen::Map<const RowMatrix, 0, Stride>;
using StridedMap = Eigen::Map<RowMatrix, 0, Stride>;

thread_local GemmBackend tl_backend = GemmBackend::kDefault;
thread_local GemmRecorder* tl_recorder = nullptr;

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2"); }

// set_multiplying_threads's value (0: never said, treated as several).
std::atomic<int>& multiplying_threads() {
  static std::atomic<int> threads{0};
  return threads;
}

// STRATA_GEMM, read once per process.
GemmBackend process_default() {
  static const GemmBackend resolved = [] {
    const std::string text = Env::from_process().get_string("STRATA_GEMM", "auto");
    GemmBackend b = parse_gemm_backend(text, "STRATA_GEMM");
    if (b == GemmBackend::kOpenBlas && !gemm_backend_built(b))
      throw ConfigError("STRATA_GEMM=openblas: this build of strata has no OpenBLAS (install libopenblas-serial-dev "
                        "and rebuild), use auto or eigen");
    if (b == GemmBackend::kBlis && !gemm_backend_built(b))
      throw ConfigError("STRATA_GEMM=blis: this build of strata has no BLIS (install libblis-serial-dev and "
                        "rebuild), use auto or eigen");
    if (b == GemmBackend::kBlis && !blis_unusable_reason().empty())
      throw ConfigError("STRATA_GEMM=blis: " + blis_unusable_reason());
    if (b == GemmBackend::kDefault && blis_built() && !blis_unusable_reason().empty()) {
      STRATA_LOG(WARN) << "the models' products use Eigen, not BLIS: " << blis_unusable_reason();
    }
    if (b == GemmBackend::kDefault) b = auto_gemm_backend();
#if STRATA_HAVE_OPENBLAS
    if (b == GemmBackend::kOpenBlas) {
      const std::string core = openblas_get_corename();
      if (!openblas_core_is_fast(core, cpu_has_avx2())) {
        STRATA_LOG(WARN) << "STRATA_GEMM=openblas: openblas chose its '" << core << "' kernels on a CPU with AVX2 (it "
                         << "does not know this processor); Eigen is faster here";
      }
    }
#endif
    if (b == GemmBackend::kBlis && text == "blis" && !blis_arch_is_fast(blis_arch(), cpu_has_avx2(), eigen_uses_avx512())) {
      STRATA_LOG(WARN) << "STRATA_GEMM=blis: BLIS chose its '" << blis_arch() << "' kernels on this CPU, a slow "
                       << "fallback; Eigen is faster here (auto uses Eigen)";
    }
    return b;
  }();
  return resolved;
}

double element(const float* p, int ld, Transpose t, int row, int col) {
  return t == Transpose::kYes ? p[static_cast<std::size_t>(col) * ld + row] : p[static_cast<std::size_t>(row) * ld + col];
}

// C[i, j] in double with its |terms| sum (for the error bound).
void reference_element(const GemmCall& g, const float* a, const float* b, const float* c0, int i, int j, double* value,
                       double* abs_sum) {
  double s = 0.0, s_abs = 0.0;
  for (int p = 0; p < g.k; ++p) {
    const double t = element(a, g.lda, g.ta, i, p) * element(b, g.ldb, g.tb, p, j);
    s += t;
    s_abs += std::fabs(t);
  }
  double v = static_cast<double>(g.alpha) * s;
  double v_abs = std::fabs(static_cast<double>(g.alpha)) * s_abs;
  if (g.beta != 0.0f) {
    const double cij = c0[static_cast<std::size_t>(i) * g.ldc + j];
    v += static_cast<double>(g.beta) * cij;
    v_abs += std::fabs(static_cast<double>(g.beta) * cij);
  }
  *value = v;
  *abs_sum = v_abs;
}

void run_reference(const GemmCall& g, const float* a, const float* b, float* c) {
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double v = 0, unused = 0;
      reference_element(g, a, b, c, i, j, &v, &unused);
      c[static_cast<std::size_t>(i) * g.ldc + j] = static_cast<float>(v);
    }
}

template <typename A, typename B>
void eigen_product(const A& a, const B& b, float alpha, float beta, StridedMap& c) {
  if (beta == 0.0f) {
    c.noalias() = alpha * a * b;
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += alpha * a * b;
  }
}

void run_eigen(const GemmCall& g, const float* a, const float* b, float* c) {
  const ConstStridedMap A(a, g.ta == Transpose::kYes ? g.k : g.m, g.ta == Transpose::kYes ? g.m : g.k, Stride(g.lda));
  const ConstStridedMap B(b, g.tb == Transpose::kYes ? g.n : g.k, g.tb == Transpose::kYes ? g.k : g.n, Stride(g.ldb));
  StridedMap C(c, g.m, g.n, Stride(g.ldc));
  const bool ta = g.ta == Transpose::kYes, tb = g.tb == Transpose::kYes;
  if (!ta && !tb) eigen_product(A, B, g.alpha, g.beta, C);
  else if (ta && !tb) eigen_product(A.transpose(), B, g.alpha, g.beta, C);
  else if (!ta && tb) eigen_product(A, B.transpose(), g.alpha, g.beta, C);
  else eigen_product(A.transpose(), B.transpose(), g.alpha, g.beta, C);
}

#if STRATA_HAVE_OPENBLAS
// Debian's serial OpenBLAS is built with USE_THREAD=0 and so without USE_LOCKING: its internal
// buffer table is not locked, and two threads of one process inside it at once can share a buffer
// and compute wrong results (OpenBLAS issues #2126, #2711; the sanitizer tier's concurrent-threads
// test caught different bits). Every OpenBLAS product of the process takes this mutex; with one
// replica per process it is never contended.
std::mutex g_openblas_mutex;

void run_openblas(const GemmCall& g, const float* a, const float* b, float* c) {
  std::lock_guard<std::mutex> lock(g_openblas_mutex);
  cblas_sgemm(CblasRowMajor, g.ta == Transpose::kYes ? CblasTrans : CblasNoTrans,
              g.tb == Transpose::kYes ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, g.alpha, a, g.lda, b, g.ldb, g.beta,
              c, g.ldc);
}
#endif

std::size_t stored_elements(int rows, int cols, int ld) {
  return rows == 0 || cols == 0 ? 0 : static_cast<std::size_t>(rows - 1) * ld + static_cast<std::size_t>(cols);
}

struct ShapeKey {
  GemmCall g;
  bool operator==(const ShapeKey& o) const {
    return g.ta == o.g.ta && g.tb == o.g.tb && g.m == o.g.m && g.n == o.g.n && g.k == o.g.k && g.lda == o.g.lda &&
           g.ldb == o.g.ldb && g.ldc == o.g.ldc && std::memcmp(&g.alpha, &o.g.alpha, sizeof(float)) == 0 &&
           (g.beta == 0.0f) == (o.g.beta == 0.0f) && (g.beta == 0.0f || std::memcmp(&g.beta, &o.g.beta, sizeof(float)) == 0);
  }
};

std::string describe(const GemmCall& g) {
  std::ostringstream os;
  os << "sgemm(" << (g.ta == Transpose::kYes ? 'T' : 'N') << (g.tb == Transpose::kYes ? 'T' : 'N') << ", m=" << g.m
     << ", n=" << g.n << ", k=" << g.k << ", lda=" << g.lda << ", ldb=" << g.ldb << ", ldc=" << g.ldc
     << ", alpha=" << g.alpha << ", beta=" << g.beta << ")";
  return os.str();
}

#if STRATA_HAVE_OPENBLAS
// Both BLIS and OpenBLAS export cblas_sgemm; the build links OpenBLAS first so that it provides
// the symbol. Where that did not hold (another link order, an LD_PRELOAD), the "OpenBLAS" products
// would silently be another library's: empty when cblas_sgemm is OpenBLAS's, else where it is from
// (fails safe: where the address is a non-PIE executable's PLT stub, dladdr names the executable
// and OpenBLAS is turned off).
std::string cblas_sgemm_owner_mismatch() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cblas_sgemm), &info) == 0 || info.dli_fname == nullptr)
    return "cannot tell which library provides cblas_sgemm";
  const std::string file = info.dli_fname;
  if (file.find("openblas") != std::string::npos) return {};
  return "cblas_sgemm resolves to " + file + ", not OpenBLAS";
}
#endif

// A kernel library behind the per-shape check (gemm.h).
struct CheckedLibrary {
  using RunFn = void (*)(const GemmCall&, const float*, const float*, float*);
  CheckedLibrary(GemmBackend id, RunFn fn) : backend(id), run(fn) {}
  const GemmBackend backend;
  const RunFn run;
  std::atomic<bool> disabled{false};
  std::mutex mutex;
  std::vector<ShapeKey> checked;  // shapes the library passed (guarded by mutex)
};

void run_blis(const GemmCall& g, const float* a, const float* b, float* c) { blis_sgemm(g, a, b, c); }

#if STRATA_HAVE_OPENBLAS
CheckedLibrary g_openblas{GemmBackend::kOpenBlas, &run_openblas};
#endif
CheckedLibrary g_blis{GemmBackend::kBlis, &run_blis};

// The library behind `backend`, or null when it is not a checked library built into strata.
CheckedLibrary* checked_library(GemmBackend backend) {
#if STRATA_HAVE_OPENBLAS
  if (backend == GemmBackend::kOpenBlas) return &g_openblas;
#endif
  if (backend == GemmBackend::kBlis && blis_built() && blis_unusable_reason().empty()) return &g_blis;
  return nullptr;
}

// The check itself (gemm.h): empty string when the library passed, else what was wrong.
std::string library_check(const CheckedLibrary& lib, const GemmCall& g) {
#if STRATA_HAVE_OPENBLAS
  if (lib.backend == GemmBackend::kOpenBlas) {
    const std::string mismatch = cblas_sgemm_owner_mismatch();
    if (!mismatch.empty()) return mismatch;
  }
#endif
  const int a_rows = g.ta == Transpose::kYes ? g.k : g.m, a_cols = g.ta == Transpose::kYes ? g.m : g.k;
  const int b_rows = g.tb == Transpose::kYes ? g.n : g.k, b_cols = g.tb == Transpose::kYes ? g.k : g.n;
  std::mt19937 gen(0x5eed0000u ^ (static_cast<unsigned>(g.m) * 131u + static_cast<unsigned>(g.n) * 31u +
                                  static_cast<unsigned>(g.k)));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random_buffer = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(gen);
    return v;
  };
  const std::vector<float> a = random_buffer(stored_elements(a_rows, a_cols, g.lda));
  const std::vector<float> b = random_buffer(stored_elements(b_rows, b_cols, g.ldb));
  const std::vector<float> c0 = random_buffer(stored_elements(g.m, g.n, g.ldc));
  std::vector<float> c1 = c0, c2 = c0;
  lib.run(g, a.data(), b.data(), c1.data());
  lib.run(g, a.data(), b.data(), c2.data());
  if (std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) != 0)
    return "two runs on the same operands gave different bits";
  // Every row when affordable, else the first and last 32 rows and an even sample between them.
  const double macs_per_row = static_cast<double>(g.n) * g.k;
  const double budget = static_cast<double>(1 << 26);
  std::vector<int> rows;
  if (macs_per_row * g.m <= budget) {
    for (int i = 0; i < g.m; ++i) rows.push_back(i);
  } else {
    const int edge = std::min(32, g.m);
    for (int i = 0; i < edge; ++i) rows.push_back(i);
    for (int i = std::max(edge, g.m - 32); i < g.m; ++i) rows.push_back(i);
    const int middle = std::max(1, static_cast<int>(budget / std::max(1.0, macs_per_row)) - 64);
    const int stride = std::max(1, (g.m - 64) / middle);
    for (int i = edge + stride / 2; i < g.m - 32; i += stride) rows.push_back(i);
  }
  for (int i : rows)
    for (int j = 0; j < g.n; ++j) {
      double want = 0, abs_sum = 0;
      reference_element(g, a.data(), b.data(), c0.data(), i, j, &want, &abs_sum);
      const double got = c1[static_cast<std::size_t>(i) * g.ldc + j];
      if (!(std::fabs(got - want) <= gemm_error_bound(g.k, abs_sum))) {
        std::ostringstream os;
        os << "C[" << i << "][" << j << "] = " << got << ", the double-precision reference gives " << want;
        return os.str();
      }
    }
  return {};
}

// This thread's copy of the shapes it has looked up, one per library (no lock needed to read them).
thread_local std::vector<ShapeKey> tl_checked_openblas, tl_checked_blis;

// True when `lib` may compute `g`: checked before (here or on another thread) or checked now.
bool library_ok_for(CheckedLibrary& lib, const GemmCall& g) {
  if (lib.disabled.load(std::memory_order_acquire)) return false;
  std::vector<ShapeKey>& mine = lib.backend == GemmBackend::kBlis ? tl_checked_blis : tl_checked_openblas;
  const ShapeKey key{g};
  if (std::find(mine.begin(), mine.end(), key) != mine.end()) return true;
  std::lock_guard<std::mutex> lock(lib.mutex);
  if (lib.disabled.load(std::memory_order_relaxed)) return false;
  if (std::find(lib.checked.begin(), lib.checked.end(), key) == lib.checked.end()) {
    const std::string failure = library_check(lib, g);
    if (!failure.empty()) {
      lib.disabled.store(true, std::memory_order_release);
      STRATA_LOG(WARN) << gemm_backend_name(lib.backend) << " failed its check on " << describe(g) << ": " << failure
                       << "; every product this process would give it uses Eigen instead";
      return false;
    }
    lib.checked.push_back(key);
  }
  mine.push_back(key);
  return true;
}

void check_shape(const GemmCall& g) {
  const int a_cols = g.ta == Transpose::kYes ? g.m : g.k;
  const int b_cols = g.tb == Transpose::kYes ? g.k : g.n;
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.lda < std::max(1, a_cols) || g.ldb < std::max(1, b_cols) ||
      g.ldc < std::max(1, g.n))
    throw Error("sgemm: bad arguments " + describe(g));
}

void check_pointers(const GemmCall& g, const float* a, const float* b, const float* c) {
  if ((g.m > 0 && g.n > 0 && c == nullptr) || (g.m > 0 && g.k > 0 && a == nullptr) ||
      (g.k > 0 && g.n > 0 && b == nullptr))
    throw Error("sgemm: a null operand in " + describe(g));
}

}  // namespace

bool openblas_core_is_fast(const std::string& core, bool cpu_has_avx2) {
  if (!cpu_has_avx2) return true;  // no faster Eigen path to prefer: the SSE kernels are the best there
  std::string c = core;
  for (char& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* fast : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"})
    if (c == fast) return true;
  return false;
}

bool eigen_uses_avx512() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

bool blis_arch_is_fast(const std::string& arch, bool cpu_has_avx2, bool eigen_avx512) {
  std::string a = arch;
  for (char& ch : a) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (!cpu_has_avx2) return !a.empty() && a != "generic";
  if (a == "haswell") return !eigen_avx512;
  if (a == "skx" || a == "knl") return true;
  return a.rfind("zen", 0) == 0;  // zen, zen2, zen3, zen4, ...: AVX2 or AVX-512 kernels
}

double gemm_error_bound(int k, double abs_sum) {
  return 8.0 * std::max(1, k) * std::ldexp(1.0, -24) * abs_sum + std::numeric_limits<float>::min();
}

void sgemm(Transpose ta, Transpose tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc) {
  const GemmCall g{ta, tb, m, n, k, lda, ldb, ldc, alpha, beta};
  check_shape(g);
  check_pointers(g, a, b, c);
  if (tl_recorder != nullptr) tl_recorder->calls_.push_back(g);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    // No product: C = beta * C (C unread when beta == 0).
    for (int i = 0; i < m; ++i) {
      float* row = c + static_cast<std::size_t>(i) * ldc;
      if (beta == 0.0f) std::fill(row, row + n, 0.0f);
      else if (beta != 1.0f) for (int j = 0; j < n; ++j) row[j] *= beta;
    }
    return;
  }
  const GemmBackend backend = current_gemm_backend();
  switch (backend) {
    case GemmBackend::kOpenBlas:
    case GemmBackend::kBlis:
      if (CheckedLibrary* lib = checked_library(backend); lib != nullptr && library_ok_for(*lib, g)) {
        lib->run(g, a, b, c);
        return;
      }
      run_eigen(g, a, b, c);
      return;
    case GemmBackend::kReference:
      run_reference(g, a, b, c);
      return;
    case GemmBackend::kEigen:
    case GemmBackend::kDefault:
      run_eigen(g, a, b, c);
      return;
  }
}

GemmBackend current_gemm_backend() {
  GemmBackend b = tl_backend == GemmBackend::kDefault ? process_default() : tl_backend;
  if ((b == GemmBackend::kOpenBlas || b == GemmBackend::kBlis) && (!gemm_backend_built(b) || gemm_backend_disabled(b)))
    b = GemmBackend::kEigen;
  return b;
}

GemmBackend auto_gemm_backend() {
  static const GemmBackend resolved = [] {
    if (blis_built() && blis_unusable_reason().empty() && blis_arch_is_fast(blis_arch(), cpu_has_avx2(), eigen_uses_avx512()))
      return GemmBackend::kBlis;
#if STRATA_HAVE_OPENBLAS
    if (multiplying_threads().load(std::memory_order_acquire) == 1 && __builtin_cpu_supports("avx512f") &&
        openblas_core_is_avx512(openblas_get_corename()))
      return GemmBackend::kOpenBlas;
#endif
    return GemmBackend::kEigen;
  }();
  return resolved;
}

bool openblas_core_is_avx512(const std::string& core) {
  std::string c = core;
  for (char& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* family : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == family) return true;
  return false;
}

bool gemm_backend_built(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::kOpenBlas: return STRATA_HAVE_OPENBLAS != 0;
    case GemmBackend::kBlis: return blis_built();
    case GemmBackend::kEigen:
    case GemmBackend::kReference: return true;
    case GemmBackend::kDefault: break;
  }
  return gemm_backend_built(current_gemm_backend());
}

bool gemm_backend_disabled(GemmBackend backend) {
  if (backend == GemmBackend::kBlis && blis_built() && !blis_unusable_reason().empty()) return true;
  const CheckedLibrary* lib = checked_library(backend);
  return lib != nullptr && lib->disabled.load(std::memory_order_acquire);
}

bool check_gemm_shape(GemmBackend backend, const GemmCall& call) {
  CheckedLibrary* lib = checked_library(backend);
  if (lib == nullptr) return false;
  check_shape(call);
  return library_ok_for(*lib, call);
}

std::string gemm_backend_name(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::kOpenBlas: {
#if STRATA_HAVE_OPENBLAS
      // openblas_get_config(): "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... SINGLE_THREADED".
      std::istringstream config(openblas_get_config());
      std::string name, version;
      config >> name >> version;
      return "openblas " + version + " (" + openblas_get_corename() + ")";
#else
      return "openblas (not built)";
#endif
    }
    case GemmBackend::kBlis:
      if (!blis_built()) return "blis (not built)";
      if (!blis_unusable_reason().empty()) return "blis (off: BLIS_ARCH_TYPE is set)";
      return "blis " + blis_version() + " (" + blis_arch() + ")";
    case GemmBackend::kEigen:
      return "eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
             std::to_string(EIGEN_MINOR_VERSION);
    case GemmBackend::kReference:
      return "reference (double)";
    case GemmBackend::kDefault:
      break;
  }
  return gemm_backend_name(current_gemm_backend());
}

const char* gemm_backend_id(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::kOpenBlas: return "openblas";
    case GemmBackend::kBlis: return "blis";
    case GemmBackend::kEigen: return "eigen";
    case GemmBackend::kReference: return "reference";
    case GemmBackend::kDefault: break;
  }
  return "auto";
}

GemmBackend parse_gemm_backend(const std::string& text, const std::string& what) {
  if (text == "auto" || text.empty()) return GemmBackend::kDefault;
  if (text == "openblas") return GemmBackend::kOpenBlas;
  if (text == "blis") return GemmBackend::kBlis;
  if (text == "eigen") return GemmBackend::kEigen;
  if (text == "reference") return GemmBackend::kReference;
  throw ConfigError(what + ": '" + text + "' is not one of auto, blis, openblas, eigen, reference");
}

ScopedGemmBackend::ScopedGemmBackend(GemmBackend backend) : previous_(tl_backend) { tl_backend = backend; }
ScopedGemmBackend::~ScopedGemmBackend() { tl_backend = previous_; }

GemmRecorder::GemmRecorder() {
  if (tl_recorder != nullptr) throw Error("GemmRecorder: one is already recording on this thread");
  tl_recorder = this;
}
GemmRecorder::~GemmRecorder() { tl_recorder = nullptr; }

}  // namespace strata::model::detail

namespace strata::model {

void set_multiplying_threads(int threads) {
  detail::multiplying_threads().store(threads, std::memory_order_release);
}

}  // namespace strata::model
