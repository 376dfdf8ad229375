// dlopen() of libcublas for the GPU MLP (cublas_api.h).
#include "cublas_api.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "strata/common/error.h"

#ifndef STRATA_CUBLAS_SONAME
#error "STRATA_CUBLAS_SONAME (e.g. libcublas.so.13) is set by src/CMakeLists.txt"
#endif
#ifndef STRATA_CUBLAS_DIR
#error "STRATA_CUBLAS_DIR (the CUDA toolkit's library directory) is set by src/CMakeLists.txt"
#endif

namespace strata::detail {
namespace {

std::mutex g_mutex;
CublasApi g_api;
std::atomic<const CublasApi*> g_loaded{nullptr};

template <typename Fn>
void resolve(void* lib, const char* name, Fn& out) {
  dlerror();
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    const char* why = dlerror();
    throw CudaError(std::string(STRATA_CUBLAS_SONAME) + " has no " + name + (why != nullptr ? std::string(": ") + why : ""));
  }
  out = reinterpret_cast<Fn>(sym);
}

}  // namespace

const CublasApi& cublas() {
  if (const CublasApi* api = g_loaded.load(std::memory_order_acquire)) return *api;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const CublasApi* api = g_loaded.load(std::memory_order_relaxed)) return *api;
  // RTLD_LOCAL: cuBLAS's symbols stay out of the global namespace (nothing else binds to them).
  void* lib = dlopen(STRATA_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  std::string first_error;
  if (lib == nullptr) {
    const char* why = dlerror();
    first_error = why != nullptr ? why : "unknown error";
    lib = dlopen(STRATA_CUBLAS_DIR "/" STRATA_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  }
  if (lib == nullptr) {
    const char* why = dlerror();
    throw CudaError("cannot open cuBLAS (" STRATA_CUBLAS_SONAME ", needed for GPU replicas): " + first_error +
                    "; " STRATA_CUBLAS_DIR "/" STRATA_CUBLAS_SONAME ": " + (why != nullptr ? why : "unknown error"));
  }
  CublasApi api;
  try {
    resolve(lib, "cublasCreate_v2", api.create);
    resolve(lib, "cublasDestroy_v2", api.destroy);
    resolve(lib, "cublasSetStream_v2", api.set_stream);
    resolve(lib, "cublasSetMathMode", api.set_math_mode);
    resolve(lib, "cublasSgemm_v2", api.sgemm);
    resolve(lib, "cublasGetStatusName", api.status_name);
    resolve(lib, "cublasGetStatusString", api.status_string);
  } catch (...) {
    dlclose(lib);
    throw;
  }
  g_api = api;
  g_loaded.store(&g_api, std::memory_order_release);
  return g_api;
}

const CublasApi* cublas_if_loaded() noexcept { return g_loaded.load(std::memory_order_acquire); }

}  // namespace strata::detail
