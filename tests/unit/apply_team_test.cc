// The PS's apply team (src/ps/apply_team.h): every part runs exactly once per run, errors come
// back to the caller, the split covers every element on cache-line boundaries, and a team-split
// update is bit-identical to the scalar reference (the contract --ps-threads promises).
#include "ps/apply_team.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "strata/ps/optimizer.h"

namespace {

using strata::ps::ApplyTeam;

// Two copies of an optimizer's k slot arrays of n elements, every slot at its initial value: one
// for the team-split update under test, one for the scalar reference. sp and rp point into them
// (hence neither copyable nor movable).
struct SlotPair {
  SlotPair(const strata::ps::OptimizerConfig& opt, int k, std::size_t n)
      : slots(k, std::vector<float>(n)), ref_slots(k, std::vector<float>(n)) {
    for (int s = 0; s < k; ++s) {
      const float init = static_cast<float>(strata::ps::slot_initial_value(opt, s));
      std::fill(slots[s].begin(), slots[s].end(), init);
      std::fill(ref_slots[s].begin(), ref_slots[s].end(), init);
      sp.push_back(slots[s].data());
      rp.push_back(ref_slots[s].data());
    }
  }
  SlotPair(const SlotPair&) = delete;
  SlotPair& operator=(const SlotPair&) = delete;

  std::vector<std::vector<float>> slots, ref_slots;
  std::vector<float*> sp, rp;
};

TEST(ApplyTeam, SplitCoversEveryElementOnceOnLineBoundaries) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                        std::size_t{1000}, std::size_t{262144}, (std::size_t{1} << 20) + 3}) {
    for (int parts = 1; parts <= 5; ++parts) {
      std::size_t expect_begin = 0;
      for (int p = 0; p < parts; ++p) {
        std::size_t b = 0, e = 0;
        strata::ps::split_range(n, parts, p, &b, &e);
        EXPECT_EQ(b, expect_begin) << "n " << n << " parts " << parts << " part " << p;
        EXPECT_LE(b, e);
        if (e != n) {
          EXPECT_EQ(e % 16, 0u) << "n " << n << " parts " << parts << " part " << p;
        }
        expect_begin = e;
      }
      EXPECT_EQ(expect_begin, n) << "n " << n << " parts " << parts;
    }
  }
}

TEST(ApplyTeam, EveryPartRunsExactlyOncePerRun) {
  ApplyTeam team(4);
  ASSERT_EQ(team.size(), 4);
  for (int round = 0; round < 2000; ++round) {
    const int parts = 1 + round % 6;  // 5 and 6 are clamped to the team's 4
    std::vector<std::atomic<int>> calls(8);
    team.run(parts, [&](int p) { calls[static_cast<std::size_t>(p)]++; });
    const int ran = std::min(parts, 4);
    for (int p = 0; p < 8; ++p) ASSERT_EQ(calls[static_cast<std::size_t>(p)].load(), p < ran ? 1 : 0) << "round " << round;
  }
}

TEST(ApplyTeam, PartZeroRunsOnTheCaller) {
  ApplyTeam team(3);
  std::thread::id part0;
  team.run(3, [&](int p) {
    if (p == 0) part0 = std::this_thread::get_id();
  });
  EXPECT_EQ(part0, std::this_thread::get_id());
}

TEST(ApplyTeam, AHelpersExceptionReachesTheCallerAfterEveryPart) {
  ApplyTeam team(3);
  std::atomic<int> finished{0};
  EXPECT_THROW(team.run(3,
                        [&](int p) {
                          if (p == 2) throw std::runtime_error("part 2 failed");
                          finished++;
                        }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 2);
  // The team stays usable.
  std::atomic<int> again{0};
  team.run(3, [&](int) { again++; });
  EXPECT_EQ(again.load(), 3);
}

// A split update against the scalar reference, several steps, odd tail; the caller's hook runs on
// the caller only, between its own chunks.
TEST(ApplyTeam, TeamUpdateIsBitIdenticalToTheReference) {
  for (const char* spec : {"adam:lr=0.01", "rmsprop:lr=0.01", "adagrad:lr=0.1", "momentum:lr=0.1,nesterov=1",
                           "ftrl:lr=0.1,l1=0.001,l2_shrinkage=0.01"}) {
    const auto opt = strata::ps::OptimizerConfig::parse(spec);
    const std::size_t n = (std::size_t{1} << 20) + 5;  // 2 parts of > 2^18: the caller has 2 chunks
    const int k = strata::ps::num_slots(opt.kind);
    for (int threads : {1, 2, 3}) {
      ApplyTeam team(threads);
      std::vector<float> var(n), ref(n), grad(n);
      SlotPair st(opt, k, n);
      for (std::size_t i = 0; i < n; ++i) {
        var[i] = ref[i] = static_cast<float>(i % 977) * 1e-3f - 0.4f;
        grad[i] = static_cast<float>((i * 31) % 1013) * 1e-3f - 0.5f;
      }
      int hooks = 0;
      bool hook_elsewhere = false;
      const auto caller = std::this_thread::get_id();
      for (std::int64_t step = 1; step <= 3; ++step) {
        strata::ps::apply_dense_team<float>(&team, opt, step, var.data(), st.sp.data(), k, grad.data(), n, [&] {
          ++hooks;
          hook_elsewhere |= std::this_thread::get_id() != caller;
        });
        strata::ps::apply_dense_reference(opt, step, ref.data(), st.rp.data(), grad.data(), n);
      }
      EXPECT_EQ(std::memcmp(var.data(), ref.data(), n * 4), 0) << spec << ", " << threads << " thread(s)";
      for (int s = 0; s < k; ++s)
        EXPECT_EQ(std::memcmp(st.slots[s].data(), st.ref_slots[s].data(), n * 4), 0) << spec << " slot " << s;
      EXPECT_FALSE(hook_elsewhere);
      // One thread: 4 chunks, 3 hooks per step. Several: the caller's part has 2 or 3 chunks.
      EXPECT_GT(hooks, 0) << spec << ", " << threads << " thread(s)";
    }
  }
}

// A sync round's fused mean and update (apply_mean_team) against the unfused arithmetic: the mean
// (((0 + g0) + g1) + ...) / workers computed element by element in float, then the scalar
// reference update; any team size, 1-3 workers, sizes off every boundary (1,024-element runs,
// 16-element split lines), several steps.
TEST(ApplyTeam, SyncMeanAndUpdateAreBitIdenticalToMeanThenReference) {
  for (const char* spec : {"adam:lr=0.01", "adagrad:lr=0.1", "sgd:lr=0.5", "ftrl:lr=0.1,l1=0.001"}) {
    const auto opt = strata::ps::OptimizerConfig::parse(spec);
    const int k = strata::ps::num_slots(opt.kind);
    for (std::size_t n : {std::size_t{1}, std::size_t{1023}, std::size_t{70001}, std::size_t{200003}}) {
      for (int workers : {1, 2, 3}) {
        for (int threads : {1, 2, 3}) {
          ApplyTeam team(threads);
          std::vector<float> var(n), ref(n), scratch(n), mean(n);
          std::vector<std::vector<float>> grads(workers, std::vector<float>(n));
          std::vector<const float*> gp;
          for (int w = 0; w < workers; ++w) gp.push_back(grads[w].data());
          SlotPair st(opt, k, n);
          for (std::size_t i = 0; i < n; ++i) var[i] = ref[i] = static_cast<float>(i % 977) * 1e-3f - 0.4f;
          int parts = 0;
          for (std::int64_t step = 1; step <= 3; ++step) {
            for (int w = 0; w < workers; ++w)
              for (std::size_t i = 0; i < n; ++i)
                grads[w][i] = static_cast<float>((i * 31 + static_cast<std::size_t>(w * 7 + step) * 101) % 1013) * 1e-3f - 0.5f;
            parts = strata::ps::apply_mean_team<float>(&team, opt, step, var.data(), st.sp.data(), k, gp.data(),
                                                       workers, scratch.data(), n, {});
            for (std::size_t i = 0; i < n; ++i) {
              float sum = 0.0f;
              for (int w = 0; w < workers; ++w) sum += grads[w][i];
              mean[i] = sum / static_cast<float>(workers);
            }
            strata::ps::apply_dense_reference(opt, step, ref.data(), st.rp.data(), mean.data(), n);
          }
          const std::string what = std::string(spec) + ", n " + std::to_string(n) + ", " + std::to_string(workers) +
                                   " worker(s), " + std::to_string(threads) + " thread(s)";
          EXPECT_EQ(std::memcmp(var.data(), ref.data(), n * 4), 0) << what;
          for (int s = 0; s < k; ++s)
            EXPECT_EQ(std::memcmp(st.slots[s].data(), st.ref_slots[s].data(), n * 4), 0) << what;
          // The split happens where it should: parts of at least kMinElementsPerPartSync.
          const int want = static_cast<int>(std::max<std::size_t>(
              1, std::min<std::size_t>(static_cast<std::size_t>(threads), n / strata::ps::kMinElementsPerPartSync)));
          EXPECT_EQ(parts, want) << what;
        }
      }
    }
  }
}

}  // namespace
