// Check macros for CUDA, cuBLAS and NCCL calls (the error model of strata/common/error.h) and two
// small CUDA helpers (ScopedDevice, PinnedBuffer), private to the GPU replica target. Each macro is
// one line that calls a [[noreturn]] cold function, so the hot path is a compare and a branch. The
// thrown strata::CudaError / strata::NcclError carries the library's own
// error name and string, the failing expression and the source location, e.g.
//   ncclAllReduce(data, data, n, ...) failed: ncclUnhandledCudaError: unhandled cuda error (run
//   with NCCL_DEBUG=INFO for details); last NCCL error: Cuda failure 'out of memory'
//   (src/replica/nccl/nccl_replica_group.cc:212)
//
// Build with -DSTRATA_DEBUG_SYNC to synchronise the stream after every kernel launch checked with
// STRATA_CHECK_LAUNCH, so an asynchronous fault is attributed to the launch that caused it
// (Aluminum's AL_FORCE_CHECK_GPU); off by default because it serialises host and device.
#pragma once

#include "strata/config.h"

#if !STRATA_HAVE_NCCL
#error "built without NCCL"
#endif

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>

#include "strata/common/error.h"

namespace strata::detail {

[[noreturn]] void fail_cuda(cudaError_t rc, const char* expr, SourceLocation where);
[[noreturn]] void fail_cublas(cublasStatus_t rc, const char* expr, SourceLocation where);
// `comm` may be null (e.g. ncclGetUniqueId); it only selects the ncclGetLastError text.
[[noreturn]] void fail_nccl(ncclResult_t rc, ncclComm_t comm, const char* expr, SourceLocation where);

// "cudaErrorNoDevice: no CUDA-capable device is detected": name and text of a CUDA error.
std::string cuda_error_text(cudaError_t rc);
// "ncclSystemError: unhandled system error ...; last NCCL error: ..." (the last part when known).
std::string nccl_error_text(ncclResult_t rc, ncclComm_t comm);

}  // namespace strata::detail

#define STRATA_CHECK_CUDA(expr)                                                                     \
  do {                                                                                              \
    if (cudaError_t strata_rc_ = (expr); strata_rc_ != cudaSuccess)                                 \
      ::strata::detail::fail_cuda(strata_rc_, #expr, STRATA_HERE);                                  \
  } while (0)

#define STRATA_CHECK_CUBLAS(expr)                                                                   \
  do {                                                                                              \
    if (cublasStatus_t strata_rc_ = (expr); strata_rc_ != CUBLAS_STATUS_SUCCESS)                    \
      ::strata::detail::fail_cublas(strata_rc_, #expr, STRATA_HERE);                                \
  } while (0)

// For calls on a communicator that must succeed outright. Collectives on non-blocking
// communicators may also return ncclInProgress; NcclReplicaGroup checks those itself.
#define STRATA_CHECK_NCCL(expr)                                                                     \
  do {                                                                                              \
    if (ncclResult_t strata_rc_ = (expr); strata_rc_ != ncclSuccess)                                \
      ::strata::detail::fail_nccl(strata_rc_, nullptr, #expr, STRATA_HERE);                         \
  } while (0)

// After a kernel launch: launch-configuration errors now, asynchronous faults too when built
// with STRATA_DEBUG_SYNC.
#ifdef STRATA_DEBUG_SYNC
#define STRATA_CHECK_LAUNCH(what, stream)                                                           \
  do {                                                                                              \
    STRATA_CHECK_CUDA(cudaGetLastError());                                                          \
    if (cudaError_t strata_rc_ = cudaStreamSynchronize(stream); strata_rc_ != cudaSuccess)          \
      ::strata::detail::fail_cuda(strata_rc_, what, STRATA_HERE);                                   \
  } while (0)
#else
#define STRATA_CHECK_LAUNCH(what, stream)                                                           \
  do {                                                                                              \
    if (cudaError_t strata_rc_ = cudaGetLastError(); strata_rc_ != cudaSuccess)                     \
      ::strata::detail::fail_cuda(strata_rc_, what, STRATA_HERE);                                   \
  } while (0)
#endif

namespace strata::replica::gpu {

// Makes `device` current for the scope and makes the caller's device current again on exit (also
// when code inside the scope switched further), so a helper never leaves a caller's thread on
// another GPU. Both calls are thread-local and cheap when nothing changes. Restoring never throws
// (a failure is ignored: the previous device was valid a moment ago).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    STRATA_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) STRATA_CHECK_CUDA(cudaSetDevice(device));
  }
  ~ScopedDevice() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
};

// Page-locked (pinned) host memory for host <-> device staging, allocated once and reused. Only
// from pinned memory is cudaMemcpyAsync really asynchronous and a DMA at full bandwidth; from
// pageable memory the driver copies through its own bounce buffer, and a device-to-host copy into
// pageable memory blocks the calling thread until the copy is done (so it cannot be polled
// against a timeout).
//
// reserve() is the only call that allocates. When cudaHostAlloc fails (no driver, RLIMIT_MEMLOCK,
// a container's pinned-memory limit, or simply too large a request) it returns false, clears the
// thread's CUDA error state so no later STRATA_CHECK_LAUNCH reports it, logs a warning once per
// process, and leaves the buffer empty: callers then copy straight from/to their pageable memory,
// which is slower but just as correct.
//
// cudaHostAlloc and cudaFreeHost may synchronise devices: call reserve() at setup, never between
// the launches of one NCCL collective on several devices (see nccl_replica_group.h).
// Not thread-safe; one owner thread at a time. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Makes capacity() >= bytes (the contents are not kept on growth). true when that much pinned
  // memory is held (always for bytes == 0); false when the allocation failed (the buffer is then
  // empty). Never throws.
  bool reserve(std::size_t bytes) noexcept;
  void* data() const { return data_; }
  std::size_t capacity() const { return capacity_; }
  // Frees the memory (cudaFreeHost); no copy into or out of it may be in flight. Never throws.
  void reset() noexcept;
  // Gives the memory up WITHOUT freeing it: for a buffer an asynchronous copy that did not finish
  // (a timeout) may still write to. Freeing it would let that copy write into freed memory, or
  // block in cudaFreeHost on the hung stream; leaking it is the safe choice. Never throws.
  void abandon() noexcept;

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// The largest pinned staging buffer a GPU replica allocates by default: larger transfers are
// staged in chunks of this size (one pinned buffer per replica, so the pinned footprint stays
// bounded whatever the model size).
constexpr std::size_t kDefaultMaxStagingBytes = std::size_t{64} << 20;

}  // namespace strata::replica::gpu
