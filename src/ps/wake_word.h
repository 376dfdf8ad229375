// Sleeping until a co-located rank's write instead of polling on a timer: a futex on a 4-byte word
// that both ranks map (Transport::shared_word). Private to the ps layer.
//
// Why: a rank that waits for a peer (a worker for its sync round, the PS for the next push) polls
// briefly and then sleeps in short timed steps (Backoff). A timed sleep wakes when its timer says,
// not when the peer wrote: on a loaded or virtualised node a short sleep returns late and every
// timed wake-up costs CPU (docs/PERFORMANCE.md, "wake words"), so a waiter either notices late
// or wakes many times for nothing. With a wake word the sleeper sleeps
// until the peer rings, once.
//
// Protocol (the word is the sleeper's "I may be asleep" flag, 0 or 1):
//   sleeper: announce(w); then check its condition; if still not met, sleep(w, timeout), which
//            returns when rung, on timeout, or at once when the word is no longer 1; then the
//            caller checks again. announce() before the check is what makes a ring impossible to
//            miss: both sides use sequentially consistent operations, so either the sleeper's
//            check sees the waker's event or the waker sees the flag and wakes it (Dekker).
//   waker:   makes its event visible first (a store, an atomic, a put that completed), then
//            ring(w): a fence and a load, and only when the flag is set an exchange and a
//            FUTEX_WAKE, so a waker whose peer is awake makes no system call.
// A sleep always has a timeout: a ring that never comes (a writer on another node, a word not
// mapped) costs latency, never a hang. A spurious wake-up is harmless; callers re-check.
// The futex is not FUTEX_PRIVATE: the word lives in memory shared between processes.
// Thread-safety: any thread may ring; several threads may sleep on one word (ring wakes them all).
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace strata::ps::wake {

inline void announce(std::uint32_t* word) { __atomic_store_n(word, 1u, __ATOMIC_SEQ_CST); }

// Clears the flag after the sleeper found its condition met without sleeping.
inline void withdraw(std::uint32_t* word) { __atomic_store_n(word, 0u, __ATOMIC_RELAXED); }

// Blocks while *word == 1, at most `timeout`; then clears the flag. True when the sleep ended
// before its timeout (a ring, or the flag already cleared), false on the timeout.
inline bool sleep(std::uint32_t* word, std::chrono::microseconds timeout) {
  const long us = std::max<long>(0, static_cast<long>(timeout.count()));
  timespec ts{us / 1000000, (us % 1000000) * 1000};
  const long rc = syscall(SYS_futex, word, FUTEX_WAIT, 1u, &ts, nullptr, 0);
  const bool timed_out = rc != 0 && errno == ETIMEDOUT;
  __atomic_store_n(word, 0u, __ATOMIC_RELAXED);
  return !timed_out;
}

// Wakes whoever announced a sleep on `word`. Call after the event the sleeper waits for is visible.
inline void ring(std::uint32_t* word) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);  // the event's stores before the flag's load (x86 reorders them otherwise)
  if (__atomic_load_n(word, __ATOMIC_RELAXED) == 0) return;
  if (__atomic_exchange_n(word, 0u, __ATOMIC_SEQ_CST) == 1u)
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace strata::ps::wake
