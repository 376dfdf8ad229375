// The cold paths of the CUDA / cuBLAS / NCCL check macros, PinnedBuffer, and the NCCL version
// helpers.
#include "cuda_check.h"

#include <atomic>
#include <utility>

#include "cublas_api.h"
#include "nccl_compat.h"
#include "strata/common/logging.h"

namespace strata {
namespace detail {
namespace {

std::string where(SourceLocation loc) { return "(" + short_path(loc.file) + ":" + std::to_string(loc.line) + ")"; }

}  // namespace

std::string cuda_error_text(cudaError_t rc) {
  const char* name = cudaGetErrorName(rc);
  const char* text = cudaGetErrorString(rc);
  return std::string(name != nullptr ? name : "cudaError " + std::to_string(static_cast<int>(rc))) + ": " +
         (text != nullptr ? text : "unknown error");
}

std::string nccl_error_text(ncclResult_t rc, ncclComm_t comm) {
  const char* text = ncclGetErrorString(rc);
  std::string out = text != nullptr ? text : "ncclResult " + std::to_string(static_cast<int>(rc));
  // The last error is process-wide state and may describe an earlier failure, so it is labelled
  // as such rather than presented as this call's cause.
  const std::string last = replica::nccl_compat::last_error(comm);
  if (!last.empty()) out += "; last NCCL error: " + last;
  return out;
}

void fail_cuda(cudaError_t rc, const char* expr, SourceLocation loc) {
  throw CudaError(std::string(expr) + " failed: " + cuda_error_text(rc) + " " + where(loc));
}

void fail_cublas(cublasStatus_t rc, const char* expr, SourceLocation loc) {
  // A cuBLAS status exists only once the library is open (cublas_api.h).
  const CublasApi* api = cublas_if_loaded();
  const char* name = api != nullptr ? api->status_name(rc) : nullptr;
  const char* text = api != nullptr ? api->status_string(rc) : nullptr;
  throw CudaError(std::string(expr) + " failed: " + (name != nullptr ? name : "cublasStatus") + ": " +
                  (text != nullptr ? text : std::to_string(static_cast<int>(rc))) + " " + where(loc));
}

void fail_nccl(ncclResult_t rc, ncclComm_t comm, const char* expr, SourceLocation loc) {
  throw NcclError(std::string(expr) + " failed: " + nccl_error_text(rc, comm) + " " + where(loc));
}

}  // namespace detail

namespace replica::gpu {

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

bool PinnedBuffer::reserve(std::size_t bytes) noexcept {
  if (bytes <= capacity_) return true;
  reset();
  void* p = nullptr;
  // Portable: pinned for every device's context, not only the current one (one buffer may serve
  // copies from or to any of the process's GPUs).
  const cudaError_t rc = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (rc == cudaSuccess && p != nullptr) {
    data_ = p;
    capacity_ = bytes;
    return true;
  }
  (void)cudaGetLastError();  // a failed allocation is not sticky; clear it for later launch checks
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    try {
      STRATA_LOG(WARN) << "cudaHostAlloc(" << bytes << " bytes) failed: " << detail::cuda_error_text(rc)
                       << "; GPU replicas stage host <-> device copies through pageable memory instead (slower)";
    } catch (...) {
      // Logging is best effort here; the fallback itself is what matters.
    }
  }
  return false;
}

void PinnedBuffer::reset() noexcept {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
  data_ = nullptr;
  capacity_ = 0;
}

void PinnedBuffer::abandon() noexcept {
  data_ = nullptr;
  capacity_ = 0;
}

}  // namespace replica::gpu

namespace replica::nccl_compat {

std::string version_string(int code) {
  // NCCL_VERSION(X, Y, Z) is X*1000 + Y*100 + Z up to 2.8 and X*10000 + Y*100 + Z from 2.9 on.
  const bool old_encoding = code < 10000;
  const int major = old_encoding ? code / 1000 : code / 10000;
  const int minor = old_encoding ? (code % 1000) / 100 : (code % 10000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

void require_runtime_version() {
  int runtime = 0;
  STRATA_CHECK_NCCL(ncclGetVersion(&runtime));
  if (runtime < kRequiredRuntimeVersion)
    throw NcclError("the loaded libnccl is " + version_string(runtime) + " but strata was built against NCCL " +
                    version_string(kHeaderVersion) + " and needs at least " +
                    version_string(kRequiredRuntimeVersion) + " at run time (check LD_LIBRARY_PATH)");
}

}  // namespace replica::nccl_compat
}  // namespace strata
