// The in-process group (strata/comm/group.h, InprocWorld): ranks as threads of one process. One
// mutex guards every queue of the world; each rank has a condition variable that is signalled
// whenever a message for it arrives, so a waiting rank sleeps until then or its deadline.

#include <chrono>
#include <cstdint>
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "strata/comm/group.h"
#include "strata/common/error.h"

namespace strata::comm {

struct InprocWorld::State {
  explicit State(int n) : size(n), arrived(static_cast<std::size_t>(n)), generation(static_cast<std::size_t>(n), 0) {}
  const int size;
  std::mutex mu;
  // (sender, receiver, tag) -> messages in the order sent.
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> queues;
  // One per receiver: notified on every message for it.
  std::vector<std::condition_variable> arrived;
  // One per receiver: messages sent to it so far (a waiter sleeps until this moves).
  std::vector<std::uint64_t> generation;
  // The worlds of the groups split from this one, by (the split's sequence number, colour): the
  // first member to arrive creates it, the others find it.
  std::map<std::pair<std::uint64_t, int>, std::shared_ptr<InprocWorld::State>> splits;
};

namespace {

using Clock = std::chrono::steady_clock;

class InprocGroup final : public Group {
 public:
  InprocGroup(std::shared_ptr<InprocWorld::State> state, int rank) : state_(std::move(state)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  const char* kind() const override { return "inproc"; }

  void send(int peer, int tag, const void* data, std::size_t bytes, const Deadline& deadline) override {
    check_peer(peer, deadline);
    const auto* p = static_cast<const std::byte*>(data);
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->queues[{rank_, peer, tag}].emplace_back(p, p + bytes);
      ++state_->generation[static_cast<std::size_t>(peer)];
    }
    state_->arrived[static_cast<std::size_t>(peer)].notify_all();
  }

  std::optional<std::vector<std::byte>> try_recv(int peer, int tag) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return pop_locked(peer, tag);
  }

  std::unique_ptr<Group> split(int color, int key, const Deadline& deadline) override {
    const std::int32_t mine[2] = {color, key};
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(state_->size));
    allgather(mine, sizeof mine, all.data(), deadline);
    const std::uint64_t seq = splits_++;  // the same on every rank: splits are collective
    if (color < 0) return nullptr;
    std::vector<std::pair<std::int32_t, int>> members;  // (key, rank) of my colour
    for (int r = 0; r < state_->size; ++r)
      if (all[2 * static_cast<std::size_t>(r)] == color) members.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    while (members[static_cast<std::size_t>(new_rank)].second != rank_) ++new_rank;
    std::shared_ptr<InprocWorld::State> sub;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto& slot = state_->splits[{seq, color}];
      if (!slot) slot = std::make_shared<InprocWorld::State>(static_cast<int>(members.size()));
      sub = slot;
    }
    return std::make_unique<InprocGroup>(std::move(sub), new_rank);
  }

 protected:
  // Sleeps on this rank's condition variable between looks at `done` (which takes the world's lock
  // itself, through try_recv), until a message for this rank arrives (its generation moved).
  void wait(const std::function<bool()>& done, const Deadline& deadline,
            const std::function<std::vector<int>()>& late) override {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(deadline.timeout_s));
    const auto me = static_cast<std::size_t>(rank_);
    while (true) {
      std::uint64_t seen = 0;
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        seen = state_->generation[me];
      }
      if (done()) return;
      if (deadline.while_waiting) deadline.while_waiting();
      std::unique_lock<std::mutex> lock(state_->mu);
      // With work to do while waiting, sleep at most 1 ms at a time.
      const auto wake = deadline.while_waiting ? std::min(until, Clock::now() + std::chrono::milliseconds(1)) : until;
      const bool moved = state_->arrived[me].wait_until(lock, wake, [&] { return state_->generation[me] != seen; });
      if (!moved && Clock::now() < until) continue;
      if (!moved) {
        lock.unlock();
        if (done()) return;
        throw_timeout(deadline, late ? late() : std::vector<int>{});
      }
    }
  }

 private:
  void check_peer(int peer, const Deadline& deadline) const {
    if (peer < 0 || peer >= state_->size)
      throw Error(deadline.what + ": rank " + std::to_string(peer) + " is not in the group of " +
                  std::to_string(state_->size));
  }

  std::optional<std::vector<std::byte>> pop_locked(int peer, int tag) {
    auto it = state_->queues.find({peer, rank_, tag});
    if (it == state_->queues.end() || it->second.empty()) return std::nullopt;
    std::vector<std::byte> m = std::move(it->second.front());
    it->second.pop_front();
    return m;
  }

  std::shared_ptr<InprocWorld::State> state_;
  const int rank_;
  std::uint64_t splits_ = 0;  // splits of this group so far
};

}  // namespace

InprocWorld::InprocWorld(int size) {
  if (size < 1) throw Error("comm::InprocWorld: a group needs at least one rank, not " + std::to_string(size));
  state_ = std::make_shared<State>(size);
}

InprocWorld::~InprocWorld() = default;

int InprocWorld::size() const { return state_->size; }

std::unique_ptr<Group> InprocWorld::make_group(int rank) {
  if (rank < 0 || rank >= state_->size)
    throw Error("comm::InprocWorld: rank " + std::to_string(rank) + " is not in a world of " +
                std::to_string(state_->size));
  return std::make_unique<InprocGroup>(state_, rank);
}

void InprocWorld::run(int size, const std::function<void(int rank, Group& group)>& fn) {
  InprocWorld world(size);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group = world.make_group(r);
        fn(r, *group);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace strata::comm
