// Host replica group: K threads of one process reduce through shared buffers.
//
// Protocol of a collective (generation-counted so consecutive collectives cannot mix):
//   1. each replica publishes its buffer pointer in its slot and arrives at the barrier;
//   2. after the barrier every replica computes the reduction of all slots IN REPLICA ORDER into a
//      private buffer (K times the arithmetic, but no writer/reader race and a deterministic
//      result), arrives at a second barrier so no slot is overwritten while still being read,
//      and then copies its private result over its own buffer.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "strata/common/error.h"
#include "strata/replica/replica_group.h"

namespace strata::replica {
namespace {

class HostReplicaGroup final : public ReplicaGroup {
 public:
  HostReplicaGroup(int replicas, double timeout_s) : size_(replicas), timeout_s_(timeout_s), slots_(replicas) {
    if (replicas < 1) throw ConfigError("--cpu-replicas must be at least 1, got " + std::to_string(replicas));
  }
  int size() const override { return size_; }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  const char* name() const override { return "host"; }

  void all_reduce(int replica, float* data, std::size_t n, ReduceOp op) override {
    if (size_ == 1) {
      return;  // the reduction of one buffer is itself, for SUM and MEAN alike
    }
    slots_[replica] = data;
    arrive(replica, "all_reduce");
    std::vector<float> result(slots_[0], slots_[0] + n);
    for (int r = 1; r < size_; ++r) {
      const float* other = slots_[r];
      for (std::size_t i = 0; i < n; ++i) result[i] += other[i];
    }
    if (op == ReduceOp::kMean) {
      const float k = static_cast<float>(size_);
      for (auto& x : result) x /= k;
    }
    arrive(replica, "all_reduce (read done)");
    std::memcpy(data, result.data(), n * sizeof(float));
  }

  void broadcast(int replica, float* data, std::size_t n, int root) override {
    if (size_ == 1) return;
    slots_[replica] = data;
    arrive(replica, "broadcast");
    if (replica != root) std::memcpy(data, slots_[root], n * sizeof(float));
    arrive(replica, "broadcast (read done)");
  }

  void barrier(int replica) override { arrive(replica, "barrier"); }

  void copy_to_host(int, float* host, const float* data, std::size_t n) override {
    if (n > 0 && host != data) std::memcpy(host, data, n * sizeof(float));
  }

 private:
  // Reusable barrier with a deadline; names the replicas that did not arrive.
  void arrive(int replica, const char* what) {
    std::unique_lock<std::mutex> lock(mutex_);
    const long generation = generation_;
    arrived_.push_back(replica);
    if (static_cast<int>(arrived_.size()) == size_) {
      arrived_.clear();
      ++generation_;
      cv_.notify_all();
      return;
    }
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(timeout_s_));
    if (!cv_.wait_until(lock, deadline, [&] { return generation_ != generation; })) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r)
        if (std::find(arrived_.begin(), arrived_.end(), r) == arrived_.end()) missing.push_back(r);
      std::string names;
      for (int r : missing) names += (names.empty() ? "" : ",") + std::to_string(r);
      throw TimeoutError(std::string("replica ") + std::to_string(replica) + ": " + what + " waited " +
                             std::to_string(static_cast<int>(timeout_s_)) + " s for replica(s) " + names,
                         missing);
    }
  }

  int size_;
  double timeout_s_;
  std::vector<float*> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int> arrived_;
  long generation_ = 0;
};

}  // namespace

const char* to_string(ReduceOp op) { return op == ReduceOp::kSum ? "SUM" : "MEAN"; }

std::unique_ptr<ReplicaGroup> make_host_replica_group(int replicas, double timeout_s) {
  return std::make_unique<HostReplicaGroup>(replicas, timeout_s);
}

}  // namespace strata::replica
