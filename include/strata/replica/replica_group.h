// The replicas of one worker: one per local device (GPU), or K CPU threads. A ReplicaGroup reduces
// and broadcasts buffers across them; gradients are all-reduced here and then pushed once per
// worker (synchronous inside a worker, asynchronous between workers).
//
// Collective contract: every replica of the group calls each collective with the same n and op, in
// the same order, each from its own thread. A replica that does not arrive within the group's
// timeout makes the others throw TimeoutError naming the missing replica ids.
// Results are deterministic: sums are taken in replica order 0..K-1, so a run is reproducible
// bit for bit whatever thread finishes first.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace strata::replica {

enum class ReduceOp { kSum, kMean };
const char* to_string(ReduceOp op);

enum class MemoryKind { kHost, kCuda };

class ReplicaGroup {
 public:
  virtual ~ReplicaGroup() = default;
  virtual int size() const = 0;
  virtual MemoryKind memory_kind() const = 0;
  virtual const char* name() const = 0;
  // In place: every replica's `data` ends up holding the reduction of all replicas' buffers.
  virtual void all_reduce(int replica, float* data, std::size_t n, ReduceOp op) = 0;
  // Every replica's `data` ends up holding replica `root`'s buffer.
  virtual void broadcast(int replica, float* data, std::size_t n, int root) = 0;
  // Synchronises the replicas (also a collective).
  virtual void barrier(int replica) = 0;
  // Not a collective: copies n floats of `replica`'s memory (memory_kind(): device memory on the
  // replica's GPU for kCuda, ordered after the work queued on its stream) to host memory, and
  // returns once they are there. How gradients reduced on a device are staged for the push.
  virtual void copy_to_host(int replica, float* host, const float* data, std::size_t n) = 0;
};

// K CPU replicas (threads of one process), always built.
std::unique_ptr<ReplicaGroup> make_host_replica_group(int replicas, double timeout_s);

}  // namespace strata::replica
