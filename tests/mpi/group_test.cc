// comm::Group's contract over MpiGroup at the launched size (the cases of tests/common/group_cases.h,
// which the inproc tier runs on thread ranks). Linked into the bootstrap binary: it runs at np 1-5.

#include <gtest/gtest.h>

#include "common/group_cases.h"
#include "mpi/mpi_test.h"
#include "strata/comm/mpi_group.h"

namespace strata::comm {
namespace {

void run_case(void (*body)(Group&)) {
  testing::TestComm comm;
  auto g = make_mpi_group(comm.get());
  body(*g);
  // The collective verdict of mpi_test.h: a failure on any rank fails the test on every rank.
  STRATA_EXPECT_ALL(comm.get(), !::testing::Test::HasFailure());
}

TEST(MpiGroup, Barrier) { run_case(test::group_barrier_case); }
TEST(MpiGroup, AllreduceInRankOrder) { run_case(test::group_allreduce_case); }
TEST(MpiGroup, ReduceAtEveryRoot) { run_case(test::group_reduce_case); }
TEST(MpiGroup, GatherAndBroadcast) { run_case(test::group_gather_broadcast_case); }
TEST(MpiGroup, PointToPointInOrder) { run_case(test::group_point_to_point_case); }
TEST(MpiGroup, MixedSequenceKeepsCollectivesApart) { run_case(test::group_mixed_sequence_case); }
TEST(MpiGroup, TagsAndLargeMessages) { run_case(test::group_tags_and_sizes_case); }
TEST(MpiGroup, SplitByColourAndKey) { run_case(test::group_split_case); }
// Last: a case that leaves ranks behind in a failed exchange.
TEST(MpiGroup, LateRankIsNamed) { run_case(test::group_late_rank_case); }

}  // namespace
}  // namespace strata::comm
