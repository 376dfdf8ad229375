// gtest main for tests run under mpirun (the mpi tier of tests/CMakeLists.txt):
//  - MPI_Init_thread through strata's MpiSession (checks MPI_THREAD_MULTIPLE);
//  - only rank 0 keeps gtest's default printer, other ranks print nothing unless they fail, so
//    the log is one report, not N interleaved ones;
//  - a hang watchdog per test: if a test does not finish within STRATA_TEST_TIMEOUT_S (default
//    120 s), the rank prints the test's name and calls MPI_Abort, so a stuck collective ends the job
//    with a message instead of waiting for CTest's timeout;
//  - the exit status is agreed by all ranks (a failure on any rank fails the job everywhere).
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "mpi/mpi_test.h"
#include "strata/cluster/runtime.h"
#include "strata/comm/mpi_group.h"
#include "strata/comm/registry.h"
#include "strata/common/env.h"
#include "strata/common/watchdog.h"

namespace strata::testing {

TestComm::TestComm() {
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

TestComm::~TestComm() {
  group_.reset();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

comm::Group& TestComm::group() {
  if (!group_) group_ = comm::make_mpi_group(comm_);
  return *group_;
}

std::vector<std::string> tier_transports() { return comm::compiled_transports(); }

std::unique_ptr<Runtime> bootstrap_runtime(TestComm& comm, const Env& env, const BootstrapOptions& options) {
  return Runtime::bootstrap(comm.get(), env, options);
}

std::vector<int> node_of_every_rank(TestComm& comm) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm.get(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &node);
  int leader = comm.rank();
  MPI_Bcast(&leader, 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  std::vector<int> all(static_cast<std::size_t>(comm.size()));
  MPI_Allgather(&leader, 1, MPI_INT, all.data(), 1, MPI_INT, comm.get());
  return all;
}

std::vector<int> failing_ranks(MPI_Comm comm, bool ok) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  int mine = ok ? 1 : 0;
  std::vector<int> all(size);
  MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, comm);
  std::vector<int> failed;
  for (int r = 0; r < size; ++r)
    if (!all[r]) failed.push_back(r);
  return failed;
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

std::string shared_test_dir(MPI_Comm comm, const std::string& prefix, const std::string& tag) {
  namespace fs = std::filesystem;
  // Rank 0's name for every rank: the parent's pid (orted's, one per node) differs between nodes.
  // STRATA_TEST_SHARED_DIR: a directory every node sees, for ranks on several hosts (the temp
  // directory may be node-local, as on the emulated nodes).
  const char* shared = std::getenv("STRATA_TEST_SHARED_DIR");
  const fs::path base = shared && *shared ? fs::path(shared) : fs::temp_directory_path();
  std::string dir = (base / (prefix + "_" + tag + "_" + std::to_string(getppid()))).string();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  int length = static_cast<int>(dir.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm);
  dir.resize(static_cast<std::size_t>(length));
  MPI_Bcast(dir.data(), length, MPI_CHAR, 0, comm);
  if (rank == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(comm);
  return dir;
}

void remove_shared_test_dir(MPI_Comm comm, const std::string& dir) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Barrier(comm);
  if (rank == 0 && std::getenv("STRATA_KEEP_TEST_FILES") == nullptr) std::filesystem::remove_all(dir);
  MPI_Barrier(comm);
}

namespace {

class HangWatchdogListener : public ::testing::EmptyTestEventListener {
 public:
  explicit HangWatchdogListener(double timeout_s) : timeout_s_(timeout_s) {}
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::string name = std::string(info.test_suite_name()) + "." + info.name();
    double timeout = timeout_s_;
    watchdog_ = std::make_unique<Watchdog>(std::chrono::duration<double>(timeout), [name, timeout] {
      int rank = -1;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::fprintf(stderr, "[rank %d] test %s hung for %.0f s (STRATA_TEST_TIMEOUT_S); aborting\n", rank,
                   name.c_str(), timeout);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
    });
  }
  void OnTestEnd(const ::testing::TestInfo&) override { watchdog_.reset(); }

 private:
  double timeout_s_;
  std::unique_ptr<Watchdog> watchdog_;
};

// Non-zero ranks report only failures, prefixed with their rank.
class FailureOnlyPrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailureOnlyPrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace strata::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int status = 1;
  {
    strata::MpiSession mpi(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new strata::testing::FailureOnlyPrinter(rank));
    }
    double timeout = strata::Env::from_process().get_double("STRATA_TEST_TIMEOUT_S", 120.0);
    listeners.Append(new strata::testing::HangWatchdogListener(timeout));

    int local = RUN_ALL_TESTS();
    MPI_Allreduce(&local, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  return status;
}
