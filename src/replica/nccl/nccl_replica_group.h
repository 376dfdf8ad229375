// NcclReplicaGroup: the replicas of one worker process, one per GPU, reduced with NCCL
// (single process, several devices). Private to target strata_replica_nccl; callers use
// make_nccl_replica_group in strata/replica/gpu.h.
//
// Threading design: one thread per replica, each driving its own communicator.
//   - The constructor creates one communicator per device (ranks 0..K-1 in device-list order) and
//     one CUDA stream per device, all from the constructing thread.
//   - all_reduce / broadcast / barrier are called by each replica's own thread (the ReplicaGroup
//     contract). That thread makes the replica's device current, issues ONE NCCL call on its own
//     communicator and stream, and waits for it. NCCL documents this "one communicator per thread"
//     mode next to "one thread, all devices, inside ncclGroupStart/End": what NCCL needs is that the
//     calls for all devices are issued concurrently, and K threads do exactly that, so no group
//     call is needed and no thread ever touches another replica's communicator (NCCL forbids two
//     threads operating one communicator at once).
//   - The alternative, a leader thread issuing all K calls inside one ncclGroupStart/End, was not
//     taken: it needs a host rendezvous before every collective, serialises K launches on one
//     thread and makes that thread switch devices; the per-thread design keeps each thread on its
//     own GPU and lets a replica that finished its backward pass start reducing at once.
//   - Rules this implies: every replica issues the same collectives in the same order (contract);
//     a replica thread must not wait on another device's work while a collective is in flight.
//   - NCCL's "concurrency between NCCL and CUDA calls" rule: once one replica has launched a
//     collective, its NCCL kernel spins until every other replica has launched its own. A CUDA
//     call that waits for a device to go idle, or holds a driver lock while it waits (cudaFree,
//     cudaFreeHost; depending on the driver and peer mappings cudaMalloc and cudaHostAlloc; the
//     first launch of a lazily loaded kernel; a device-to-host copy into pageable memory;
//     cudaDeviceSynchronize), made by any replica thread in that window can deadlock the group.
//     So: allocate models and buffers before the first collective (or behind a barrier), free
//     them after the last one; kernels are loaded eagerly (gpu::preload_kernels) when the group
//     is created. Between its launch and the result a replica thread here only polls
//     (cudaStreamQuery, ncclCommGetAsyncError), which never waits for a device.
//
// Bounded waits: with NCCL >= 2.14 the communicators are non-blocking (ncclConfig_t blocking = 0),
// so no NCCL call can block the host, not even the lazy connection setup of a first collective
// whose peers never arrive. Each collective waits by polling cudaStreamQuery and
// ncclCommGetAsyncError in the calling replica thread (never a separate polling thread) until the
// result is complete, an error is reported, another replica has failed, or timeout_s has passed.
// On any failure the thread aborts its OWN communicator (ncclCommAbort), records the failure for
// the group and throws (TimeoutError naming the replicas that never entered the collective,
// NcclError, CudaError); the other replicas see the recorded failure in their own waits, abort
// their communicators and throw too, so one failed replica ends the step instead of hanging it.
// The group is unusable afterwards. With older NCCL the communicators come from ncclCommInitAll
// (blocking): a missing peer can then block inside the NCCL call itself, before the wait starts.
//
// Stream semantics: a collective runs on the replica's stream (stream(r), created blocking with
// respect to the legacy default stream), after all work already queued there or on the default
// stream. Work on other streams that produces the buffer must be complete or event-ordered before
// the call. On return the result is in the buffer and the stream is idle.
//
// Host staging: copy_to_host copies through a pinned buffer per replica (allocated by the first
// copy_to_host of that replica, grown only by a larger copy, at most Options::max_staging_bytes;
// larger copies are chunked), so the copy is a real asynchronous DMA that the thread polls
// against the timeout. Without pinned memory it falls back to a copy straight into the caller's
// pageable buffer, which cudaMemcpyAsync completes before it returns.
#pragma once

#include "strata/config.h"

#if !STRATA_HAVE_NCCL
#error "built without NCCL"
#endif

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "nccl_compat.h"
#include "strata/replica/replica_group.h"

namespace strata::replica {

class NcclReplicaGroup final : public ReplicaGroup {
 public:
  struct Options {
    double timeout_s = 300.0;
    // MEAN with ncclAvg where NCCL has it. false forces the portable path (ncclSum, then a kernel
    // divides by K, the same arithmetic as the host group); the tests run both.
    bool native_mean = STRATA_NCCL_HAS_AVG;
    // copy_to_host staging (see above); tests turn pinned staging off and shrink the buffer to
    // exercise the fallback and the chunking.
    bool pinned_staging = true;
    std::size_t max_staging_bytes = gpu::kDefaultMaxStagingBytes;
  };

  // `devices`: distinct indices of visible CUDA devices; replica r runs on devices[r]. ConfigError
  // for an empty list, a duplicate or an invisible device, or timeout_s <= 0.
  NcclReplicaGroup(std::vector<int> devices, Options options);
  // Finalises and destroys the communicators (aborts them after a failure); never throws. No
  // collective may be in progress.
  ~NcclReplicaGroup() override;
  NcclReplicaGroup(const NcclReplicaGroup&) = delete;
  NcclReplicaGroup& operator=(const NcclReplicaGroup&) = delete;

  int size() const override { return static_cast<int>(replicas_.size()); }
  MemoryKind memory_kind() const override { return MemoryKind::kCuda; }
  const char* name() const override { return "nccl"; }

  // `data` is device memory on device(replica) (or managed memory). In place, like the host group.
  void all_reduce(int replica, float* data, std::size_t n, ReduceOp op) override;
  void broadcast(int replica, float* data, std::size_t n, int root) override;
  // Drains the replica's stream, then waits on the host for every replica: on return all work
  // queued by any replica before its barrier() is complete.
  void barrier(int replica) override;
  // Device-to-host copy on the replica's stream (after the work queued there), polled against the
  // group's timeout like the collectives; CudaError / TimeoutError naming the replica otherwise.
  // Not a collective: it neither counts as one nor marks the group failed. Called by the replica's
  // own thread (it uses the replica's staging buffer). The first call of a replica (and a later,
  // larger one) allocates its pinned buffer, so make it when no collective of the group is
  // half-launched (e.g. right after a collective of this replica returned, as
  // ReplicaContext::apply_gradients_flat does).
  void copy_to_host(int replica, float* host, const float* data, std::size_t n) override;

  int device(int replica) const;
  // The stream collectives of `replica` run on; models of that replica should queue their work
  // here so that ordering needs no extra synchronisation.
  cudaStream_t stream(int replica) const;
  bool uses_native_mean() const { return native_mean_; }
  // Bytes of pinned staging replica `replica` holds (0 before its first copy_to_host, or when it
  // fell back to pageable copies).
  std::size_t staging_bytes(int replica) const {
    return replicas_.at(static_cast<std::size_t>(replica)).staging.capacity();
  }

 private:
  using Clock = std::chrono::steady_clock;
  enum class Wait { kEnqueued, kComplete };

  struct Replica {
    int device = -1;
    ncclComm_t comm = nullptr;  // null once aborted or destroyed
    cudaStream_t stream = nullptr;
    gpu::PinnedBuffer staging;  // copy_to_host's, touched only by the replica's thread
    bool staging_failed = false;  // pinned allocation failed once: pageable copies from then on
  };

  void init_communicators();
  // Validates the call and the group state, then counts the replica in; returns its sequence number.
  std::int64_t enter(int replica, const char* what);
  // Accepts ncclSuccess; waits out ncclInProgress (non-blocking communicators); fails otherwise.
  void check_issue(int replica, std::int64_t seq, Clock::time_point deadline, ncclResult_t rc, const char* what);
  void wait(int replica, std::int64_t seq, Clock::time_point deadline, Wait what_for, const char* what);
  void host_barrier(int replica, Clock::time_point deadline);

  // Failure path: records the first failure for the group, aborts this replica's communicator
  // (from the thread that owns it) and throws.
  [[noreturn]] void fail_timeout(int replica, const char* what, std::vector<int> missing);
  [[noreturn]] void fail_nccl(int replica, ncclResult_t rc, const char* what);
  [[noreturn]] void fail_cuda(int replica, cudaError_t rc, const char* what);
  [[noreturn]] void fail_peer(int replica, const char* what);
  [[noreturn]] void fail_usage(int replica, const std::string& message);
  void record_failure(const std::string& message);
  // Replicas that have not yet entered the collective with sequence number `seq`.
  std::vector<int> not_entered(std::int64_t seq) const;
  void abort_communicator(int replica) noexcept;
  std::string who(int replica) const;
  std::string failure() const;
  Clock::time_point deadline() const;

  // Tears everything down; `graceful` finalises communicators, otherwise they are aborted.
  void release(bool graceful) noexcept;

  std::vector<Replica> replicas_;
  double timeout_s_;
  bool native_mean_;
  bool pinned_staging_;
  std::size_t max_staging_bytes_;
  // entered_[r]: collectives replica r has entered; a replica whose count is below a waiting
  // replica's sequence number is one that has not arrived.
  std::unique_ptr<std::atomic<std::int64_t>[]> entered_;

  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mutex_;
  std::string failure_;  // the first failure, guarded by failure_mutex_

  std::mutex barrier_mutex_;
  std::condition_variable barrier_cv_;
  std::vector<int> arrived_;  // guarded by barrier_mutex_
  std::int64_t generation_ = 0;
};

}  // namespace strata::replica
