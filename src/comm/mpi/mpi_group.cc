// comm::Group over an MPI communicator (strata/comm/mpi_group.h).

#include "strata/comm/mpi_group.h"

#include <climits>
#include <string>

#include "strata/common/error.h"

namespace strata::comm {
namespace {

class MpiGroup final : public Group {
 public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    STRATA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    STRATA_CHECK_MPI(MPI_Comm_size(comm_, &size_));
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

RuntimeGroups groups_of(const Runtime& runtime) {
  auto maybe = [](MPI_Comm c) { return c == MPI_COMM_NULL ? nullptr : make_mpi_group(c); };
  const Communicators& c = runtime.comms();
  RuntimeGroups g{maybe(c.runtime()), maybe(c.role()), maybe(c.ps()), maybe(c.workers()), {}, {}};
  g.ps_ranks = translate_all(c.ps(), c.runtime());
  g.worker_ranks = translate_all(c.workers(), c.runtime());
  return g;
}

}  // namespace strata::comm
