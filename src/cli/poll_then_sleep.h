// How a bench rank waits for its peers without taking a core from the network.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace strata::cli {

// Poll for at most 50 us, then sleep in growing steps (50 us up to 1 ms) between polls.
//
// Why: on a machine with few cores, a rank that spins (even calling sched_yield, as Open MPI's
// mpi_yield_when_idle does) keeps a core from the kernel work that moves the packets (the
// figures are in docs/PERFORMANCE.md). The PS main thread of a bench waits in a barrier while
// the workers measure, so a spinning wait there would measure the spinner, not the data plane
// (the PS service loop of a real job sleeps when idle). 50 us of polling first keeps a barrier
// that is about to complete prompt; no strata wait loop spins longer than about 50 us without
// yielding its core.
class PollThenSleep {
 public:
  void pause() {
    const auto now = std::chrono::steady_clock::now();
    if (!sleeping_) {
      if (!started_) {
        started_ = true;
        since_ = now;
      }
      if (now - since_ < std::chrono::microseconds(50)) return;
      sleeping_ = true;
    }
    std::this_thread::sleep_for(step_);
    step_ = std::min(step_ * 2, std::chrono::microseconds(1000));
  }

 private:
  bool started_ = false, sleeping_ = false;
  std::chrono::steady_clock::time_point since_;
  std::chrono::microseconds step_{50};
};

}  // namespace strata::cli
