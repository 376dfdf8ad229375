// The inproc tier's side of the multi-rank test seam (tests/common/rank_test.h): the cases that
// the mpi tier runs under mpirun run here on thread ranks of one process, over the in-process
// group and transport (strata/comm/group.h, src/comm/inproc/).
//
// STRATA_RANK_TEST(suite, name) { body } registers one gtest case per rank count (the file sets
// STRATA_INPROC_RANKS, default 2, 3, 4, 5), named "<suite>/<suite>_<name>.ranks/np<N>", and runs
// `body` on N threads at once, each with its own TestComm (its rank of the group). A body's
// assertions are checked on every thread; STRATA_EXPECT_ALL agrees on them over the group as under
// MPI. STRATA_RANK_TEST_P does the same for a parameterised suite: GetParam() in the body is the
// suite's parameter, and every (rank count, parameter) pair is a case; STRATA_RANK_SUITE gives the
// suite's parameters (before its cases, unlike INSTANTIATE_TEST_SUITE_P).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "strata/cluster/runtime.h"
#include "strata/comm/group.h"

namespace strata::testing {

// One thread rank's view of its test's group. Valid inside a body run by run_ranks only.
class TestComm {
 public:
  TestComm();
  TestComm(const TestComm&) = delete;
  TestComm& operator=(const TestComm&) = delete;
  comm::Group* get() const { return group_; }
  comm::Group& group() { return *group_; }
  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }

 private:
  comm::Group* group_;
};

inline const char* tier_name() { return "inproc"; }
std::vector<std::string> tier_transports();
std::unique_ptr<Runtime> bootstrap_runtime(TestComm& comm, const Env& env, const BootstrapOptions& options);
// Every thread rank is on this process's node: all 0.
std::vector<int> node_of_every_rank(TestComm& comm);

// Collective over the group: the ranks where `ok` is false.
std::vector<int> failing_ranks(comm::Group* group, bool ok);
std::string format_ranks(const std::vector<int>& ranks);

// Runs `body` on `ranks` threads of a fresh in-process world (each thread's TestComm is its rank,
// its rank context "rank r/N"), and fails the test with every exception a rank threw.
void run_ranks(int ranks, const std::function<void()>& body);

// The rank counts of the cases registered below.
::testing::internal::ParamGenerator<int> rank_counts();

}  // namespace strata::testing

#ifndef STRATA_INPROC_RANKS
#define STRATA_INPROC_RANKS 2, 3, 4, 5
#endif

#define STRATA_EXPECT_ALL(comm, cond)                                                             \
  do {                                                                                            \
    auto strata_failed_ = ::strata::testing::failing_ranks((comm), static_cast<bool>(cond));      \
    EXPECT_TRUE(strata_failed_.empty())                                                           \
        << #cond << " is false on rank(s) " << ::strata::testing::format_ranks(strata_failed_);   \
  } while (0)

#define STRATA_RANK_TEST(suite, name)                                                                     \
  class suite##_##name : public ::testing::TestWithParam<int> {                                           \
   public:                                                                                                \
    void Body();                                                                                          \
  };                                                                                                      \
  TEST_P(suite##_##name, ranks) {                                                                         \
    ::strata::testing::run_ranks(GetParam(), [this] { Body(); });                                         \
  }                                                                                                       \
  INSTANTIATE_TEST_SUITE_P(suite, suite##_##name, ::testing::Values(STRATA_INPROC_RANKS),                 \
                           [](const auto& info) { return "np" + std::to_string(info.param); });          \
  void suite##_##name::Body()

#define STRATA_RANK_SUITE(prefix, suite, values, namer)                                                   \
  ::testing::internal::ParamGenerator<suite::ParamType> suite##_values() { return values; }              \
  std::string suite##_name(const ::testing::TestParamInfo<suite::ParamType>& info) { return (namer)(info); } \
  static_assert(true, "")

#define STRATA_RANK_TEST_P(suite, name)                                                                   \
  class suite##_##name : public ::testing::TestWithParam<std::tuple<int, suite::ParamType>> {             \
   public:                                                                                                \
    using Base = ::testing::TestWithParam<std::tuple<int, suite::ParamType>>;                             \
    void Body();                                                                                          \
    static const suite::ParamType& GetParam() { return std::get<1>(Base::GetParam()); }                   \
  };                                                                                                      \
  TEST_P(suite##_##name, ranks) {                                                                         \
    ::strata::testing::run_ranks(std::get<0>(Base::GetParam()), [this] { Body(); });                      \
  }                                                                                                       \
  INSTANTIATE_TEST_SUITE_P(suite, suite##_##name,                                                         \
                           ::testing::Combine(::testing::Values(STRATA_INPROC_RANKS), suite##_values()), \
                           [](const auto& info) {                                                         \
                             return "np" + std::to_string(std::get<0>(info.param)) + "_" +                \
                                    suite##_name(::testing::TestParamInfo<suite::ParamType>(              \
                                        std::get<1>(info.param), info.index));                            \
                           });                                                                            \
  void suite##_##name::Body()
