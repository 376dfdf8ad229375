// comm::Group over an MPI communicator (strata/comm/mpi_group.h).

#include "strata/comm/mpi_group.h"

#include <algorithm>
#include <climits>
#include <string>

#include "strata/common/error.h"

namespace strata::comm {
namespace {

class MpiGroup final : public Group {
 public:
  // `owned`: the group frees the communicator (one it split off), else it borrows it.
  explicit MpiGroup(MPI_Comm comm, bool owned = false) : comm_(comm), owned_(owned) {
    STRATA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    STRATA_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  }
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }

  std::unique_ptr<Group> split(int color, int key, const Deadline& deadline) override {
    barrier(deadline);  // everyone is here: MPI_Comm_split below does not wait for a missing rank
    MPI_Comm out = MPI_COMM_NULL;
    STRATA_CHECK_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out));
    if (out == MPI_COMM_NULL) return nullptr;
    STRATA_CHECK_MPI(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
    return std::make_unique<MpiGroup>(out, true);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

  void send(int peer, int tag, const void* data, std::size_t bytes, const Deadline& deadline) override {
    if (bytes > static_cast<std::size_t>(INT_MAX))
      throw Error(deadline.what + ": a message of " + std::to_string(bytes) + " bytes is larger than MPI can count");
    MPI_Request request = MPI_REQUEST_NULL;
    STRATA_CHECK_MPI(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &request));
    // Past the deadline the send stays posted: the job ends on the TimeoutError, and MPI_Abort
    // reclaims it (a cancelled send is not supported by every MPI, and freeing it would let MPI
    // read `data` later).
    wait_until(
        [&] {
          int done = 0;
          STRATA_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
          return done != 0;
        },
        deadline, [peer] { return std::vector<int>{peer}; });
  }

  std::optional<std::vector<std::byte>> try_recv(int peer, int tag) override {
    int flag = 0;
    MPI_Status status;
    STRATA_CHECK_MPI(MPI_Iprobe(peer, tag, comm_, &flag, &status));
    if (!flag) return std::nullopt;
    int n = 0;
    STRATA_CHECK_MPI(MPI_Get_count(&status, MPI_BYTE, &n));
    std::vector<std::byte> out(static_cast<std::size_t>(n));
    STRATA_CHECK_MPI(MPI_Recv(out.data(), n, MPI_BYTE, peer, tag, comm_, MPI_STATUS_IGNORE));
    return out;
  }

 private:
  MPI_Comm comm_;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Group> make_mpi_group(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) throw Error("comm::make_mpi_group: MPI_COMM_NULL");
  return std::make_unique<MpiGroup>(comm);
}

MPI_Comm mpi_comm(const Group& group) {
  const auto* g = dynamic_cast<const MpiGroup*>(&group);
  return g ? g->comm() : MPI_COMM_NULL;
}

namespace {

// The rank in `to` of every rank of `from` (both communicators of this process).
std::vector<int> translate_all(MPI_Comm from, MPI_Comm to) {
  if (from == MPI_COMM_NULL) return {};
  int n = 0;
  STRATA_CHECK_MPI(MPI_Comm_size(from, &n));
  std::vector<int> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n), MPI_UNDEFINED);
  for (int r = 0; r < n; ++r) in[static_cast<std::size_t>(r)] = r;
  MPI_Group gf, gt;
  STRATA_CHECK_MPI(MPI_Comm_group(from, &gf));
  STRATA_CHECK_MPI(MPI_Comm_group(to, &gt));
  const int rc = MPI_Group_translate_ranks(gf, n, in.data(), gt, out.data());
  MPI_Group_free(&gf);
  MPI_Group_free(&gt);
  STRATA_CHECK_MPI(rc);
  for (int& r : out)
    if (r == MPI_UNDEFINED) r = -1;
  return out;
}

}  // namespace

namespace {

// The runtime ranks of role `which` in the order of its group's ranks: the key of the role split
// (bootstrap_over, Runtime::bootstrap) is the task index, the chief first among the workers.
std::vector<int> ranks_by_key(const Runtime& runtime, bool ps) {
  std::vector<std::pair<int, int>> keyed;
  for (const auto& info : runtime.ranks()) {
    const Role role = role_of_job(info.task.type);
    if (ps ? role != Role::kPs : role != Role::kChief && role != Role::kWorker) continue;
    keyed.emplace_back(role == Role::kChief ? 0 : info.task.index + 1, info.rank);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> out;
  for (const auto& k : keyed) out.push_back(k.second);
  return out;
}

}  // namespace

RuntimeGroups groups_of(const Runtime& runtime) {
  if (runtime.group()) {
    RuntimeGroups g{runtime.group(), runtime.role_group(), runtime.ps_group(), runtime.workers_group(), {}, {}};
    if (g.ps) g.ps_ranks = ranks_by_key(runtime, true);
    if (g.workers) g.worker_ranks = ranks_by_key(runtime, false);
    return g;
  }
  auto maybe = [](MPI_Comm c) { return c == MPI_COMM_NULL ? nullptr : std::shared_ptr<Group>(make_mpi_group(c)); };
  const Communicators& c = runtime.comms();
  RuntimeGroups g{maybe(c.runtime()), maybe(c.role()), maybe(c.ps()), maybe(c.workers()), {}, {}};
  g.ps_ranks = translate_all(c.ps(), c.runtime());
  g.worker_ranks = translate_all(c.workers(), c.runtime());
  return g;
}

std::shared_ptr<Group> runtime_group(const Runtime& runtime) {
  if (runtime.group()) return runtime.group();
  return make_mpi_group(runtime.comms().runtime());
}

std::shared_ptr<Group> workers_group(const Runtime& runtime) {
  if (runtime.group()) return runtime.workers_group();
  if (runtime.comms().workers() == MPI_COMM_NULL) return nullptr;
  return make_mpi_group(runtime.comms().workers());
}

}  // namespace strata::comm
