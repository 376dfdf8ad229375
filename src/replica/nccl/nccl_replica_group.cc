// NcclReplicaGroup (see nccl_replica_group.h for the threading design and the failure protocol).
#include "nccl_replica_group.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "cuda_check.h"
#include "kernels.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/replica/gpu.h"

namespace strata::replica {
namespace {

using Clock = std::chrono::steady_clock;

// Polling back-off for the waits: yield for the first millisecond (a small all-reduce over NVLink
// takes tens of microseconds, so sleeping at once would dominate it), then sleep in growing steps
// up to 1 ms so that a long wait does not burn a core per replica.
class Backoff {
 public:
  void pause() {
    const auto waited = Clock::now() - start_;
    if (waited < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(step_);
      step_ = std::min(step_ * 2, std::chrono::microseconds(1000));
    }
  }

 private:
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds step_{20};
};

std::string join(const std::vector<int>& values) {
  std::string s;
  for (int v : values) s += (s.empty() ? "" : ",") + std::to_string(v);
  return s;
}

std::string seconds(double s) {
  std::string text = std::to_string(s);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text + " s";
}

}  // namespace

NcclReplicaGroup::NcclReplicaGroup(std::vector<int> devices, Options options)
    : timeout_s_(options.timeout_s),
      native_mean_(options.native_mean && STRATA_NCCL_HAS_AVG),
      pinned_staging_(options.pinned_staging),
      max_staging_bytes_(std::max(options.max_staging_bytes, sizeof(float))) {
  if (devices.empty()) throw ConfigError("an NCCL replica group needs at least one GPU; the device list is empty");
  if (!(options.timeout_s > 0.0))
    throw ConfigError("NCCL replica group: the timeout must be > 0 s, got " + std::to_string(options.timeout_s));
  const int visible = visible_gpu_count();
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const int d = devices[i];
    if (d < 0 || d >= visible) {
      std::string why = visible == 0 ? " (" + gpu_unavailable_reason() + ")" : "";
      throw ConfigError("GPU " + std::to_string(d) + " is not visible: this process sees " + std::to_string(visible) +
                        " GPU(s)" + why);
    }
    if (std::find(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(i), d) !=
        devices.begin() + static_cast<std::ptrdiff_t>(i))
      throw ConfigError("GPU " + std::to_string(d) + " is listed twice for the NCCL replica group [" + join(devices) +
                        "]; NCCL allows one rank per device");
  }
  nccl_compat::require_runtime_version();

  replicas_.resize(devices.size());
  entered_ = std::make_unique<std::atomic<std::int64_t>[]>(devices.size());
  for (std::size_t r = 0; r < devices.size(); ++r) {
    replicas_[r].device = devices[r];
    entered_[r].store(0);
  }
  try {
    for (Replica& rep : replicas_) {
      gpu::ScopedDevice on(rep.device);
      // Blocking w.r.t. the legacy default stream: a buffer filled there (cudaMemcpy, or a caller
      // that never chose a stream) is ready before a collective on this stream starts.
      STRATA_CHECK_CUDA(cudaStreamCreate(&rep.stream));
      // The MEAN fallback's divide kernel is first launched right after an NCCL launch on this
      // device: load it now, not lazily then (see the threading notes in the header).
      STRATA_CHECK_CUDA(gpu::preload_kernels());
    }
    init_communicators();
  } catch (...) {
    release(/*graceful=*/false);
    throw;
  }
  STRATA_LOG(DEBUG) << "NCCL replica group over GPUs [" << join(devices) << "], NCCL "
                    << nccl_compat::version_string(nccl_compat::kHeaderVersion) << ", MEAN via "
                    << (native_mean_ ? "ncclAvg" : "ncclSum + divide");
}

// One communicator per device, rank r on devices[r]. Non-blocking communicators where NCCL has
// them (the initialisation itself is then bounded by the timeout too), else ncclCommInitAll.
void NcclReplicaGroup::init_communicators() {
  const int n = size();
#if STRATA_NCCL_HAS_NONBLOCKING
  ncclUniqueId id;
  STRATA_CHECK_NCCL(ncclGetUniqueId(&id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n), nullptr);
  // One thread initialising several devices' communicators must group the calls (NCCL: "Group
  // calls must also be used to create a communicator when one thread manages more than one
  // device"). The group must be closed even when a call inside it fails.
  // Nothing inside the group may throw, so the device switches are checked by hand.
  gpu::ScopedDevice restore(replicas_.front().device);
  ncclResult_t first_error = ncclSuccess;
  cudaError_t device_error = cudaSuccess;
  std::string failed_call;
  STRATA_CHECK_NCCL(ncclGroupStart());
  for (int r = 0; r < n && first_error == ncclSuccess && device_error == cudaSuccess; ++r) {
    failed_call = "ncclCommInitRankConfig(rank " + std::to_string(r) + " on GPU " +
                  std::to_string(replicas_[r].device) + ")";
    device_error = cudaSetDevice(replicas_[r].device);  // NCCL takes the device current at the call
    if (device_error != cudaSuccess) break;
    const ncclResult_t rc = ncclCommInitRankConfig(&comms[r], n, id, r, &config);
    if (rc != ncclSuccess && !nccl_compat::in_progress(rc)) first_error = rc;
  }
  const ncclResult_t end = ncclGroupEnd();
  for (int r = 0; r < n; ++r) replicas_[r].comm = comms[r];  // release() aborts them on failure
  if (device_error != cudaSuccess)
    throw CudaError("cudaSetDevice before " + failed_call + " failed: " + detail::cuda_error_text(device_error));
  if (first_error == ncclSuccess && end != ncclSuccess && !nccl_compat::in_progress(end)) {
    first_error = end;
    failed_call = "ncclGroupEnd() after ncclCommInitRankConfig";
  }
  if (first_error != ncclSuccess)
    throw NcclError(failed_call + " failed: " + detail::nccl_error_text(first_error, nullptr));

  // The communicators connect to each other while initialising, so they are polled together.
  const Clock::time_point until = deadline();
  for (Backoff backoff;; backoff.pause()) {
    std::vector<int> pending;
    for (int r = 0; r < n; ++r) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(replicas_[r].comm, &state);
      if (rc != ncclSuccess) state = rc;
      if (nccl_compat::in_progress(state)) {
        pending.push_back(r);
      } else if (state != ncclSuccess) {
        throw NcclError("initialising the NCCL communicator of " + who(r) +
                        " failed: " + detail::nccl_error_text(state, replicas_[r].comm));
      }
    }
    if (pending.empty()) return;
    if (Clock::now() > until)
      throw TimeoutError("NCCL communicator initialisation over GPUs [" + join([&] {
                           std::vector<int> d;
                           for (const Replica& rep : replicas_) d.push_back(rep.device);
                           return d;
                         }()) + "] did not finish within " + seconds(timeout_s_) + "; replica(s) " +
                             join(pending) + " still initialising",
                         pending);
  }
#else
  std::vector<int> devices;
  for (const Replica& rep : replicas_) devices.push_back(rep.device);
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n), nullptr);
  STRATA_CHECK_NCCL(ncclCommInitAll(comms.data(), n, devices.data()));
  for (int r = 0; r < n; ++r) replicas_[r].comm = comms[r];
#endif
}

NcclReplicaGroup::~NcclReplicaGroup() { release(/*graceful=*/!failed_.load()); }

int NcclReplicaGroup::device(int replica) const { return replicas_.at(static_cast<std::size_t>(replica)).device; }

cudaStream_t NcclReplicaGroup::stream(int replica) const {
  return replicas_.at(static_cast<std::size_t>(replica)).stream;
}

void NcclReplicaGroup::all_reduce(int replica, float* data, std::size_t n, ReduceOp op) {
  const char* what = op == ReduceOp::kSum ? "all_reduce(SUM)" : "all_reduce(MEAN)";
  if (n > 0 && data == nullptr) fail_usage(replica, std::string(what) + ": null buffer for " + std::to_string(n) + " floats");
  const std::int64_t seq = enter(replica, what);
  if (n == 0) return;  // every replica passes the same n, so all of them return here
  Replica& rep = replicas_[static_cast<std::size_t>(replica)];
  gpu::ScopedDevice on(rep.device);
  const Clock::time_point until = deadline();
  ncclRedOp_t red = ncclSum;
#if STRATA_NCCL_HAS_AVG
  if (op == ReduceOp::kMean && native_mean_) red = ncclAvg;
#endif
  check_issue(replica, seq, until, ncclAllReduce(data, data, n, ncclFloat, red, rep.comm, rep.stream),
              "ncclAllReduce(data, data, n, ncclFloat, op, comm, stream)");
  if (op == ReduceOp::kMean && red == ncclSum) {
    // Queued only once NCCL has enqueued its part (after ncclInProgress has cleared): NCCL forbids
    // other work on its stream before that.
    gpu::launch_divide(data, n, static_cast<float>(size()), rep.stream);
    if (const cudaError_t rc = cudaGetLastError(); rc != cudaSuccess) fail_cuda(replica, rc, "divide kernel launch");
  }
  wait(replica, seq, until, Wait::kComplete, what);
}

void NcclReplicaGroup::broadcast(int replica, float* data, std::size_t n, int root) {
  if (root < 0 || root >= size())
    fail_usage(replica, "broadcast: root " + std::to_string(root) + " is outside [0, " + std::to_string(size()) + ")");
  if (n > 0 && data == nullptr) fail_usage(replica, "broadcast: null buffer for " + std::to_string(n) + " floats");
  const std::int64_t seq = enter(replica, "broadcast");
  if (n == 0) return;
  Replica& rep = replicas_[static_cast<std::size_t>(replica)];
  gpu::ScopedDevice on(rep.device);
  const Clock::time_point until = deadline();
  check_issue(replica, seq, until, ncclBroadcast(data, data, n, ncclFloat, root, rep.comm, rep.stream),
              "ncclBroadcast(data, data, n, ncclFloat, root, comm, stream)");
  wait(replica, seq, until, Wait::kComplete, "broadcast");
}

void NcclReplicaGroup::barrier(int replica) {
  const std::int64_t seq = enter(replica, "barrier");
  gpu::ScopedDevice on(replicas_[static_cast<std::size_t>(replica)].device);
  const Clock::time_point until = deadline();
  wait(replica, seq, until, Wait::kComplete, "barrier (draining the replica's stream)");
  host_barrier(replica, until);
}

void NcclReplicaGroup::copy_to_host(int replica, float* host, const float* data, std::size_t n) {
  if (replica < 0 || replica >= size())
    throw Error("NCCL replica group: copy_to_host for replica " + std::to_string(replica) + " of a group of " +
                std::to_string(size()));
  if (n == 0) return;
  if (host == nullptr || data == nullptr)
    throw Error(who(replica) + ": copy_to_host: null buffer for " + std::to_string(n) + " floats");
  Replica& rep = replicas_[static_cast<std::size_t>(replica)];
  gpu::ScopedDevice on(rep.device);
  // Sized by the largest copy so far (up to the cap): allocated by the first call, grown only when
  // a later call is larger. A failed allocation is not retried every step.
  if (pinned_staging_ && !rep.staging_failed && !rep.staging.reserve(std::min(n * sizeof(float), max_staging_bytes_)))
    rep.staging_failed = true;
  const Clock::time_point until = deadline();
  // Queues one device-to-host copy and polls the stream until it is complete (after the work
  // queued before it), the copy fails, or the deadline passes. After a timeout the copy may still
  // be running: the staging buffer is abandoned, never reused or freed (see PinnedBuffer).
  auto copy = [&](float* dst, const float* src, std::size_t count) {
    if (const cudaError_t rc = cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToHost, rep.stream);
        rc != cudaSuccess)
      throw CudaError(who(replica) + ": cudaMemcpyAsync(host, data, n, cudaMemcpyDeviceToHost, stream) failed: " +
                      detail::cuda_error_text(rc));
    for (Backoff backoff;; backoff.pause()) {
      const cudaError_t q = cudaStreamQuery(rep.stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady)
        throw CudaError(who(replica) + ": copying " + std::to_string(n) + " floats to the host failed: " +
                        detail::cuda_error_text(q));
      if (Clock::now() > until) {
        rep.staging.abandon();
        throw TimeoutError(who(replica) + ": copying " + std::to_string(n) +
                               " floats to the host did not finish within " + seconds(timeout_s_),
                           {});
      }
    }
  };
  const std::size_t chunk = rep.staging.capacity() / sizeof(float);
  if (chunk == 0) {
    // Pageable fallback: cudaMemcpyAsync into pageable memory returns only once the copy is done.
    copy(host, data, n);
    return;
  }
  auto* pinned = static_cast<float*>(rep.staging.data());
  for (std::size_t done = 0; done < n;) {
    const std::size_t count = std::min(chunk, n - done);
    copy(pinned, data + done, count);
    std::memcpy(host + done, pinned, count * sizeof(float));  // the copy is complete: safe to read
    done += count;
  }
}

std::int64_t NcclReplicaGroup::enter(int replica, const char* what) {
  if (replica < 0 || replica >= size())
    throw Error(std::string("NCCL replica group: ") + what + " called for replica " + std::to_string(replica) +
                " of a group of " + std::to_string(size()));
  if (failed_.load() || replicas_[static_cast<std::size_t>(replica)].comm == nullptr)
    throw NcclError(who(replica) + ": " + what + ": the NCCL replica group is unusable after an earlier failure: " +
                    failure());
  return entered_[replica].fetch_add(1) + 1;
}

void NcclReplicaGroup::check_issue(int replica, std::int64_t seq, Clock::time_point until, ncclResult_t rc,
                                   const char* what) {
  if (rc == ncclSuccess) return;
  if (nccl_compat::in_progress(rc)) {
    wait(replica, seq, until, Wait::kEnqueued, what);
    return;
  }
  fail_nccl(replica, rc, what);
}

// The only place a replica thread blocks on the device. Polls, in this order: the communicator's
// state (an asynchronous NCCL error, or ncclInProgress on a non-blocking communicator), the stream
// (kComplete only), the other replicas' failures, the deadline.
void NcclReplicaGroup::wait(int replica, std::int64_t seq, Clock::time_point until, Wait what_for, const char* what) {
  Replica& rep = replicas_[static_cast<std::size_t>(replica)];
  for (Backoff backoff;; backoff.pause()) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(rep.comm, &state);
    if (rc != ncclSuccess) state = rc;
    if (state != ncclSuccess && !nccl_compat::in_progress(state)) {
      // An error on this communicator after another replica failed (and aborted its own) is a
      // consequence; the other replica's failure is the cause worth reporting.
      if (failed_.load()) fail_peer(replica, what);
      fail_nccl(replica, state, what);
    }
    if (!nccl_compat::in_progress(state)) {
      if (what_for == Wait::kEnqueued) return;
      const cudaError_t q = cudaStreamQuery(rep.stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) fail_cuda(replica, q, what);
    }
    if (failed_.load()) fail_peer(replica, what);
    if (Clock::now() > until) fail_timeout(replica, what, not_entered(seq));
  }
}

void NcclReplicaGroup::host_barrier(int replica, Clock::time_point until) {
  std::unique_lock<std::mutex> lock(barrier_mutex_);
  const std::int64_t generation = generation_;
  arrived_.push_back(replica);
  if (static_cast<int>(arrived_.size()) == size()) {
    arrived_.clear();
    ++generation_;
    barrier_cv_.notify_all();
    return;
  }
  const bool released =
      barrier_cv_.wait_until(lock, until, [&] { return generation_ != generation || failed_.load(); });
  if (released && generation_ != generation) return;
  // Here "missing" means not at the host barrier yet (a replica may have entered barrier() and
  // still be draining its stream).
  std::vector<int> missing;
  for (int r = 0; r < size(); ++r)
    if (std::find(arrived_.begin(), arrived_.end(), r) == arrived_.end()) missing.push_back(r);
  lock.unlock();
  if (failed_.load()) fail_peer(replica, "barrier");
  fail_timeout(replica, "barrier", std::move(missing));
}

std::string NcclReplicaGroup::who(int replica) const {
  return "replica " + std::to_string(replica) + " (GPU " +
         std::to_string(replicas_[static_cast<std::size_t>(replica)].device) + ")";
}

std::string NcclReplicaGroup::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

NcclReplicaGroup::Clock::time_point NcclReplicaGroup::deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
}

void NcclReplicaGroup::record_failure(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_.empty()) failure_ = message;
  }
  failed_.store(true);
  // Taking the barrier mutex orders the flag before any barrier waiter's predicate check, so a
  // waiter cannot miss the notification.
  { std::lock_guard<std::mutex> lock(barrier_mutex_); }
  barrier_cv_.notify_all();
}

void NcclReplicaGroup::abort_communicator(int replica) noexcept {
  Replica& rep = replicas_[static_cast<std::size_t>(replica)];
  if (rep.comm == nullptr) return;
  const ncclResult_t rc = ncclCommAbort(rep.comm);
  rep.comm = nullptr;
  if (rc != ncclSuccess) {
    STRATA_LOG(WARN) << "ncclCommAbort for " << who(replica) << " failed: " << detail::nccl_error_text(rc, nullptr);
  }
}

std::vector<int> NcclReplicaGroup::not_entered(std::int64_t seq) const {
  std::vector<int> missing;
  for (int r = 0; r < size(); ++r)
    if (entered_[r].load() < seq) missing.push_back(r);
  return missing;
}

void NcclReplicaGroup::fail_timeout(int replica, const char* what, std::vector<int> missing) {
  std::string message = who(replica) + ": " + what + " waited " + seconds(timeout_s_) + "; ";
  message += missing.empty() ? "every replica entered it but NCCL did not complete (a GPU or link may be hung)"
                             : "replica(s) " + join(missing) + " did not arrive";
  record_failure(message);
  abort_communicator(replica);
  throw TimeoutError(message, std::move(missing));
}

void NcclReplicaGroup::fail_nccl(int replica, ncclResult_t rc, const char* what) {
  const std::string message =
      who(replica) + ": " + what + " failed: " + detail::nccl_error_text(rc, replicas_[static_cast<std::size_t>(replica)].comm);
  record_failure(message);
  abort_communicator(replica);
  throw NcclError(message);
}

void NcclReplicaGroup::fail_cuda(int replica, cudaError_t rc, const char* what) {
  const std::string message = who(replica) + ": " + what + " failed: " + detail::cuda_error_text(rc);
  record_failure(message);
  abort_communicator(replica);
  throw CudaError(message);
}

void NcclReplicaGroup::fail_peer(int replica, const char* what) {
  abort_communicator(replica);
  throw NcclError(who(replica) + ": " + what + " abandoned because another replica failed: " + failure());
}

// A bad argument: nothing was issued, but the peers may already be inside the collective, so the
// group fails as a whole instead of leaving them to time out.
void NcclReplicaGroup::fail_usage(int replica, const std::string& message) {
  if (replica < 0 || replica >= size())
    throw Error("NCCL replica group: replica " + std::to_string(replica) + " of a group of " +
                std::to_string(size()) + ": " + message);
  const std::string full = who(replica) + ": " + message;
  record_failure(full);
  abort_communicator(replica);
  throw Error(full);
}

void NcclReplicaGroup::release(bool graceful) noexcept {
  // The teardown switches devices; the caller's current device is restored at the end.
  int caller_device = -1;
  if (cudaGetDevice(&caller_device) != cudaSuccess) caller_device = -1;
  // Drain the streams (bounded), so no collective is cut short by the teardown.
  const Clock::time_point until = deadline();
  for (Replica& rep : replicas_) {
    if (rep.stream == nullptr || rep.comm == nullptr || !graceful) continue;
    if (cudaSetDevice(rep.device) != cudaSuccess) {
      graceful = false;
      break;
    }
    cudaError_t q = cudaErrorNotReady;
    for (Backoff backoff; (q = cudaStreamQuery(rep.stream)) == cudaErrorNotReady && Clock::now() < until;
         backoff.pause()) {
    }
    if (q != cudaSuccess) graceful = false;
  }
#if STRATA_NCCL_HAS_NONBLOCKING
  // Finalise all communicators first and then poll them together: on non-blocking communicators
  // ncclCommFinalize returns at once, and the communicators quiesce jointly.
  if (graceful) {
    for (Replica& rep : replicas_) {
      if (rep.comm == nullptr) continue;
      const ncclResult_t rc = ncclCommFinalize(rep.comm);
      if (rc != ncclSuccess && !nccl_compat::in_progress(rc)) graceful = false;
    }
    for (Backoff backoff; graceful; backoff.pause()) {
      bool pending = false;
      for (Replica& rep : replicas_) {
        if (rep.comm == nullptr) continue;
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(rep.comm, &state) != ncclSuccess) state = ncclInternalError;
        if (nccl_compat::in_progress(state)) pending = true;
        else if (state != ncclSuccess) graceful = false;
      }
      if (!pending) break;
      if (Clock::now() > until) graceful = false;
    }
  }
#endif
  for (std::size_t r = 0; r < replicas_.size(); ++r) {
    Replica& rep = replicas_[r];
    if (rep.comm != nullptr) {
      const ncclResult_t rc = graceful ? ncclCommDestroy(rep.comm) : ncclCommAbort(rep.comm);
      if (rc != ncclSuccess) {
        STRATA_LOG(WARN) << (graceful ? "ncclCommDestroy" : "ncclCommAbort") << " for " << who(static_cast<int>(r))
                         << " failed: " << detail::nccl_error_text(rc, nullptr);
      }
      rep.comm = nullptr;
    }
  }
  if (!graceful && !replicas_.empty()) {
    STRATA_LOG(WARN) << "NCCL replica group torn down by abort"
                     << (failure().empty() ? std::string() : " after: " + failure());
  }
  for (Replica& rep : replicas_) {
    if (rep.stream == nullptr) continue;
    if (cudaSetDevice(rep.device) == cudaSuccess) {
      const cudaError_t rc = cudaStreamDestroy(rep.stream);
      if (rc != cudaSuccess) {
        STRATA_LOG(WARN) << "cudaStreamDestroy on GPU " << rep.device << " failed: " << detail::cuda_error_text(rc);
      }
    }
    rep.stream = nullptr;
  }
  if (caller_device >= 0) (void)cudaSetDevice(caller_device);
}

}  // namespace strata::replica
