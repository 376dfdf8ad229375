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
