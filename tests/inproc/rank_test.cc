// The inproc tier's side of the multi-rank test seam (rank_test.h).
#include "inproc/rank_test.h"

#include <exception>
#include <mutex>

#include "strata/comm/group_runtime.h"
#include "strata/common/error.h"
#include "strata/common/rank_context.h"

namespace strata::testing {
namespace {

thread_local comm::Group* t_group = nullptr;

}  // namespace

TestComm::TestComm() : group_(t_group) {
  if (!group_) throw Error("TestComm: not inside a body that run_ranks runs");
}

std::vector<std::string> tier_transports() { return {"inproc"}; }

std::unique_ptr<Runtime> bootstrap_runtime(TestComm& comm, const Env& env, const BootstrapOptions& options) {
  // The group belongs to run_ranks; the runtime borrows it.
  return comm::bootstrap_over(std::shared_ptr<comm::Group>(comm.get(), [](comm::Group*) {}), env, options);
}

std::vector<int> node_of_every_rank(TestComm& comm) { return std::vector<int>(static_cast<std::size_t>(comm.size()), 0); }

std::vector<int> failing_ranks(comm::Group* group, bool ok) {
  const int n = group->size();
  const char mine = ok ? 1 : 0;
  std::vector<char> all(static_cast<std::size_t>(n));
  group->allgather(&mine, 1, all.data(), comm::Deadline{60, "collective assertion"});
  std::vector<int> failed;
  for (int r = 0; r < n; ++r)
    if (!all[static_cast<std::size_t>(r)]) failed.push_back(r);
  return failed;
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

void run_ranks(int ranks, const std::function<void()>& body) {
  std::mutex mu;
  std::vector<std::string> errors;
  try {
    comm::InprocWorld::run(ranks, [&](int rank, comm::Group& group) {
      ScopedRankContext context(RankContext{rank, ranks, "", "inproc"});
      t_group = &group;
      try {
        body();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("rank " + std::to_string(rank) + " threw: " + e.what());
      }
      t_group = nullptr;
    });
  } catch (const std::exception& e) {
    errors.push_back(e.what());
  }
  for (const auto& e : errors) ADD_FAILURE() << e;
}

}  // namespace strata::testing
