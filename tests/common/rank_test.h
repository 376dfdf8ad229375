// Multi-rank test cases written once for two tiers: under mpirun (the mpi tier,
// tests/mpi/mpi_test.h) and as thread ranks of one process (the inproc tier,
// tests/inproc/rank_test.h; its binary defines STRATA_TEST_TIER_INPROC). Both give a case:
//   TestComm comm;                 its ranks (comm.rank(), comm.size(), comm.group(): a comm::Group)
//   bootstrap_runtime(comm, ...)   a Runtime over them (Runtime::bootstrap / comm::bootstrap_over)
//   STRATA_EXPECT_ALL(comm.get(), cond)   a collective assertion
//   STRATA_RANK_TEST / STRATA_RANK_TEST_P / STRATA_RANK_SUITE   the case registrations
//   tier_transports(), node_of_every_rank(comm)
// Collectives in a body go through comm.group(), which both tiers have.
#pragma once

#if defined(STRATA_TEST_TIER_INPROC)
#include "inproc/rank_test.h"
#else
#include "mpi/mpi_test.h"
#endif

#include <vector>

#include "strata/comm/group.h"

namespace strata::testing {

// A barrier among `members` (ranks of `group`, ascending) only, over point-to-point messages: the
// other ranks take no part (PS ranks serving while the workers line up). Throws TimeoutError
// naming the members that did not arrive.
void barrier_among(comm::Group& group, const std::vector<int>& members, double timeout_s);

// The element-wise sum of every member's `values` (same length everywhere), on every member; the
// other ranks take no part. Throws TimeoutError naming the members that did not arrive.
std::vector<double> sum_among(comm::Group& group, const std::vector<int>& members, const std::vector<double>& values,
                              double timeout_s);

// The ranks of `runtime` that are the chief or workers, ascending.
std::vector<int> worker_ranks(const Runtime& runtime);

}  // namespace strata::testing
