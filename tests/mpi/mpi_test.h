// Helpers for the multi-rank test tier (gtest under mpirun).
//
// Assertions are collective: STRATA_EXPECT_ALL(comm, cond) allreduces a flag over `comm` and, on
// failure, fails the test on every rank with the list of ranks where `cond` was false. A plain
// per-rank ASSERT that returns early would leave the other ranks blocked in the next collective.
// Every collective helper here must be called by all ranks of `comm`, in the same order.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "strata/cluster/runtime.h"
#include "strata/comm/group.h"

namespace strata::testing {

// A communicator dup'ed from MPI_COMM_WORLD for one test, freed at scope exit.
class TestComm {
 public:
  TestComm();
  ~TestComm();
  TestComm(const TestComm&) = delete;
  TestComm& operator=(const TestComm&) = delete;
  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The same ranks as a comm::Group (made on first use).
  comm::Group& group();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<comm::Group> group_;
};

// ---- the seam the cases shared with the inproc tier use (tests/common/rank_test.h) -------------
// The tier's name and the transports its cases run over (every compiled one here).
inline const char* tier_name() { return "mpi"; }
std::vector<std::string> tier_transports();
// Collective: Runtime::bootstrap over the test's communicator.
std::unique_ptr<Runtime> bootstrap_runtime(TestComm& comm, const Env& env, const BootstrapOptions& options);
// Collective: for every rank, the lowest rank on its node (MPI_COMM_TYPE_SHARED).
std::vector<int> node_of_every_rank(TestComm& comm);

// Collective: returns the ranks of `comm` where `ok` is false (same result on every rank).
std::vector<int> failing_ranks(MPI_Comm comm, bool ok);
std::string format_ranks(const std::vector<int>& ranks);

// Collective: a fresh, empty directory <temp>/<prefix>_<tag>_<rank 0's parent pid> that every rank of
// `comm` shares (rank 0 empties and creates it; the others wait for it). <temp> is
// STRATA_TEST_SHARED_DIR when set (ranks on several nodes), else the temp directory.
std::string shared_test_dir(MPI_Comm comm, const std::string& prefix, const std::string& tag);
// Collective: removes it once every rank is done with it (kept with STRATA_KEEP_TEST_FILES set).
void remove_shared_test_dir(MPI_Comm comm, const std::string& dir);

}  // namespace strata::testing

#define STRATA_EXPECT_ALL(comm, cond)                                                             \
  do {                                                                                            \
    auto strata_failed_ = ::strata::testing::failing_ranks((comm), static_cast<bool>(cond));      \
    EXPECT_TRUE(strata_failed_.empty())                                                           \
        << #cond << " is false on rank(s) " << ::strata::testing::format_ranks(strata_failed_);   \
  } while (0)

// A test case of the multi-rank tiers: under mpirun it is a plain gtest case that every rank runs;
// the inproc tier runs the same body on thread ranks (tests/inproc/rank_test.h).
#define STRATA_RANK_TEST(suite, name) TEST(suite, name)
#define STRATA_RANK_TEST_P(suite, name) TEST_P(suite, name)
#define STRATA_RANK_SUITE(prefix, suite, values, namer) INSTANTIATE_TEST_SUITE_P(prefix, suite, values, namer)
