// A process group: what the layers above the transport (ps, strategy, train) need of the ranks
// they run with, without MPI in sight. Two implementations sit behind it: MpiGroup (an MPI
// communicator of a real job) and the in-process group (ranks as threads of one process,
// comm::InprocWorld), so the PS protocol, the strategy and the training loop run the same code
// under mpirun and as thread ranks of one test process.
//
// Contract of every wait (point to point and collective): it has a deadline, and when it passes
// the call throws TimeoutError whose message says what was waited for and names the ranks that had
// not answered ("...: ranks 2, 4 did not arrive within 5 s"); missing_ranks() holds them. A
// collective is an exchange with its root (rank 0): the root names every rank it has nothing from,
// the others name the root. Collectives are called by every rank of the group in the same order;
// point-to-point messages between a pair of ranks with one tag arrive in the order they were sent.
//
// Threading: one thread of a rank uses a given Group at a time. Tag kCollectiveTag is the group's
// own (its collectives); callers use tags in [0, kCollectiveTag).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/comm/transport.h"

namespace strata::comm {

enum class ReduceOp { kSum, kMin, kMax };
const char* to_string(ReduceOp op);

// How long a wait may take, and what it is for (the start of its TimeoutError's message).
struct Deadline {
  double timeout_s = 60;
  std::string what;
  // Called between polls while the wait goes on (e.g. a transport's progress(), for a rank whose
  // peers need it to serve them while it waits). Optional.
  std::function<void()> while_waiting = {};
};

// The one waiting loop of the layers above comm/: polls `done` (first for about 50 us, then with
// sleeps growing from 50 us to 1 ms, so a waiter never spins on a core it shares with the rank it
// waits for) until it returns true, or the deadline passes, or `progress` (when given, looked at
// about twice a second) reports that the job moved, which starts the deadline again. Past the
// deadline it throws TimeoutError("<what>: <late(...)> did not answer within T s", late ranks),
// where `late` (when given) says who is still missing at that moment.
void wait_until(const std::function<bool()>& done, const Deadline& deadline,
                const std::function<std::vector<int>()>& late = {},
                const std::function<bool()>& progress = {});

// Throws wait_until's TimeoutError for `deadline` with `late` missing (for a wait of its own).
[[noreturn]] void throw_timeout(const Deadline& deadline, std::vector<int> late);

// "rank 3", "ranks 2, 4": for messages.
std::string describe_ranks(const std::vector<int>& ranks);

class Group {
 public:
  // The tag of the group's collectives (below MPI's guaranteed MPI_TAG_UB of 32767).
  static constexpr int kCollectiveTag = 32000;

  virtual ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Which implementation: "mpi" or "inproc".
  virtual const char* kind() const = 0;

  // ---- point to point: tagged byte messages -------------------------------------------------------
  // Sends `bytes` to `peer`; returns once the bytes may be reused and the message is on its way
  // (delivered, for the in-process group), or throws TimeoutError past the deadline. A large
  // message over MPI may wait until the peer receives it, so two ranks that each send one to the
  // other before receiving wait for each other until the deadline.
  virtual void send(int peer, int tag, const void* data, std::size_t bytes, const Deadline& deadline) = 0;
  // The next message from `peer` with `tag`, waiting until the deadline.
  virtual std::vector<std::byte> recv(int peer, int tag, const Deadline& deadline);
  // The next message from `peer` with `tag` if one has arrived, else nullopt. Never blocks.
  virtual std::optional<std::vector<std::byte>> try_recv(int peer, int tag) = 0;

  // ---- collectives (every rank, same order), over messages with the root ---------------------------
  void barrier(const Deadline& deadline);
  // Element-wise reduction of `count` elements of `type` in `data`, the result on every rank.
  void allreduce(void* data, std::size_t count, ElemType type, ReduceOp op, const Deadline& deadline);
  // As allreduce, the result only on `root` (others' `data` unchanged).
  void reduce(void* data, std::size_t count, ElemType type, ReduceOp op, int root, const Deadline& deadline);
  // Every rank's `bytes` bytes, in rank order, into `all` (size() * bytes).
  void allgather(const void* mine, std::size_t bytes, void* all, const Deadline& deadline);
  // Every rank's byte string (any length), in rank order.
  std::vector<std::string> allgather_strings(const std::string& mine, const Deadline& deadline);
  // `root`'s bytes into every rank's `data`.
  void broadcast(void* data, std::size_t bytes, int root, const Deadline& deadline);

  // Typed conveniences.
  std::int64_t allreduce(std::int64_t value, ReduceOp op, const Deadline& deadline);
  double allreduce(double value, ReduceOp op, const Deadline& deadline);

  // Collective, as MPI_Comm_split: the ranks that pass the same `color` (>= 0) form a new group,
  // ranked by (`key`, rank here); a negative color joins none and gets nullptr. Every rank first
  // meets the others within the deadline (a late rank is named), so the split itself never waits
  // for a missing one. The new group is independent of this one (its own messages and
  // collectives) and may outlive it.
  virtual std::unique_ptr<Group> split(int color, int key, const Deadline& deadline) = 0;

 protected:
  Group() = default;
  // Waits until `done`, against the deadline, naming `late()` when it passes. The default is
  // wait_until; the in-process group sleeps until a message for this rank arrives instead.
  virtual void wait(const std::function<bool()>& done, const Deadline& deadline,
                    const std::function<std::vector<int>()>& late);

 private:
  // Gathers every rank's message on the root; other ranks send theirs. Returns them in rank order
  // on the root (its own at its index), nothing elsewhere.
  std::vector<std::vector<std::byte>> gather_at(int root, int tag, const void* mine, std::size_t bytes,
                                                const Deadline& deadline);
  // The root's part of every collective after the gather: the same bytes to every other rank.
  void scatter_same(int root, const void* data, std::size_t bytes, const Deadline& deadline);
};

// The in-process group: `size` ranks that are threads of this process. make_group(r) is rank r's
// Group (call it once per rank, from any thread); the world outlives them. Messages are queued per
// (sender, receiver, tag) under one lock; a wait sleeps on a condition variable until a message
// arrives or its deadline passes.
class InprocWorld {
 public:
  explicit InprocWorld(int size);
  ~InprocWorld();
  InprocWorld(const InprocWorld&) = delete;
  InprocWorld& operator=(const InprocWorld&) = delete;
  int size() const;
  std::unique_ptr<Group> make_group(int rank);
  // Runs fn(rank, group) on `size` threads, one per rank, and rethrows the first exception any
  // rank threw (after every thread has ended).
  static void run(int size, const std::function<void(int rank, Group& group)>& fn);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace strata::comm
