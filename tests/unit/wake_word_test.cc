// The wake-word handshake (src/ps/wake_word.h) between two processes sharing a mapping, as a PS
// and a co-located worker do: a ring ends a sleep long before its timeout, a ring before the
// sleep (after the announce) makes the sleep return at once, a ring with nobody announced leaves
// the word alone, and a sleep nobody rings ends at its timeout. The timeouts are 20 s, so a ring
// that did not work fails the test by its verdict, not by a timing bound.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ps/wake_word.h"

namespace strata::ps {
namespace {

using std::chrono::microseconds;
constexpr microseconds kLong{20'000'000};

struct Shared {
  std::uint32_t word;
  std::uint32_t ready;  // the child announced and is about to sleep
};

Shared* map_shared() {
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<Shared*>(p);
}

TEST(WakeWord, RingFromAnotherProcessEndsTheSleep) {
  Shared* sh = map_shared();
  ASSERT_NE(sh, nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    wake::announce(&sh->word);
    __atomic_store_n(&sh->ready, 1u, __ATOMIC_SEQ_CST);
    const auto t0 = std::chrono::steady_clock::now();
    const bool rung = wake::sleep(&sh->word, kLong);
    const bool early = std::chrono::steady_clock::now() - t0 < kLong / 2;
    _exit(rung && early && __atomic_load_n(&sh->word, __ATOMIC_SEQ_CST) == 0 ? 0 : 1);
  }
  while (__atomic_load_n(&sh->ready, __ATOMIC_SEQ_CST) == 0) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // most likely asleep by now; either way it must end
  wake::ring(&sh->word);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child's sleep was not ended by the ring";
  munmap(sh, 4096);
}

TEST(WakeWord, RingBetweenAnnounceAndSleepIsNotLost) {
  std::uint32_t word = 0;
  wake::announce(&word);
  wake::ring(&word);  // the waker's event happened after the sleeper's announce
  EXPECT_EQ(word, 0u);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(wake::sleep(&word, kLong));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, kLong / 2);
}

TEST(WakeWord, RingWithNobodyAnnouncedLeavesTheWord) {
  std::uint32_t word = 0;
  wake::ring(&word);
  EXPECT_EQ(word, 0u);
  wake::announce(&word);
  wake::withdraw(&word);  // the sleeper found its condition met without sleeping
  EXPECT_EQ(word, 0u);
}

TEST(WakeWord, UnrungSleepEndsAtItsTimeout) {
  std::uint32_t word = 0;
  wake::announce(&word);
  EXPECT_FALSE(wake::sleep(&word, microseconds(2000)));
  EXPECT_EQ(word, 0u);
}

}  // namespace
}  // namespace strata::ps
