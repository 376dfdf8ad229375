// comm::Group's contract on the in-process group: 1-5 thread ranks (tests/common/group_cases.h;
// the mpi tier runs the same cases over MpiGroup).

#include <gtest/gtest.h>

#include <atomic>

#include "common/group_cases.h"
#include "strata/comm/group.h"

namespace strata::comm {
namespace {

class InprocGroupTest : public ::testing::TestWithParam<int> {};

void run_case(int n, void (*body)(Group&)) {
  InprocWorld::run(n, [&](int, Group& g) { body(g); });
}

TEST_P(InprocGroupTest, Barrier) { run_case(GetParam(), test::group_barrier_case); }
TEST_P(InprocGroupTest, AllreduceInRankOrder) { run_case(GetParam(), test::group_allreduce_case); }
TEST_P(InprocGroupTest, ReduceAtEveryRoot) { run_case(GetParam(), test::group_reduce_case); }
TEST_P(InprocGroupTest, GatherAndBroadcast) { run_case(GetParam(), test::group_gather_broadcast_case); }
TEST_P(InprocGroupTest, PointToPointInOrder) { run_case(GetParam(), test::group_point_to_point_case); }
TEST_P(InprocGroupTest, LateRankIsNamed) { run_case(GetParam(), test::group_late_rank_case); }
TEST_P(InprocGroupTest, MixedSequenceKeepsCollectivesApart) { run_case(GetParam(), test::group_mixed_sequence_case); }
TEST_P(InprocGroupTest, TagsAndLargeMessages) { run_case(GetParam(), test::group_tags_and_sizes_case); }
TEST_P(InprocGroupTest, SizeMismatchIsRefusedNamingTheRank) { run_case(GetParam(), test::group_size_mismatch_case); }
TEST_P(InprocGroupTest, SplitByColourAndKey) { run_case(GetParam(), test::group_split_case); }

INSTANTIATE_TEST_SUITE_P(Ranks, InprocGroupTest, ::testing::Values(1, 2, 3, 4, 5),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

TEST(InprocWorld, RethrowsARanksError) {
  EXPECT_THROW(InprocWorld::run(3,
                                [](int rank, Group& g) {
                                  if (rank == 1) throw ConfigError("rank 1 refuses");
                                  (void)g;
                                }),
               ConfigError);
}

TEST(InprocWorld, RefusesBadRanks) {
  EXPECT_THROW(InprocWorld(0), Error);
  InprocWorld w(2);
  EXPECT_THROW(w.make_group(2), Error);
  auto g = w.make_group(0);
  EXPECT_THROW(g->send(5, 1, nullptr, 0, Deadline{1, "send"}), Error);
}

TEST(WaitUntil, NamesTheLateAndStopsAtTheDeadline) {
  try {
    wait_until([] { return false; }, Deadline{0.05, "waiting for the test"}, [] { return std::vector<int>{2, 4}; });
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(std::string(e.what()), "waiting for the test: ranks 2, 4 did not answer within 0.05 s");
    EXPECT_EQ(e.missing_ranks(), (std::vector<int>{2, 4}));
  }
}

TEST(WaitUntil, ProgressMovesTheDeadline) {
  // done after ~1.2 s against a deadline of 0.7 s: only the progress reported every look keeps
  // the wait alive.
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  EXPECT_NO_THROW(wait_until([&] { return elapsed() > 1.2; }, Deadline{0.7, "progressing"}, {}, [] { return true; }));
  EXPECT_THROW(wait_until([&] { return elapsed() > 10; }, Deadline{0.7, "stuck"}, {}, [] { return false; }),
               TimeoutError);
}

TEST(WaitUntil, ReturnsAtOnceWhenDone) {
  std::atomic<int> calls{0};
  wait_until([&] { return ++calls > 0; }, Deadline{0, "done"});
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace strata::comm
