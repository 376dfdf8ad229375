#include "strata/common/signals.h"

#include <atomic>
#include <csignal>

namespace strata {
namespace {

// Lock-free, so storing from a signal handler is async-signal-safe.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal flag must be lock-free");

extern "C" void strata_on_preemption_signal(int signo) {
  int expected = 0;
  // Keep the first signal: a SIGUSR1 warning followed by SIGTERM is still reported as SIGUSR1.
  g_signal.compare_exchange_strong(expected, signo);
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction sa {};
  sa.sa_handler = strata_on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART: blocking calls in MPI, HDF5 and the C library resume instead of failing with EINTR.
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int preemption_signal() { return g_signal.load(std::memory_order_relaxed); }

void raise_preemption(int signo) { strata_on_preemption_signal(signo); }

}  // namespace strata
