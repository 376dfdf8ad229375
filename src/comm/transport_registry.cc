// The one file that knows which transports are compiled in: adding a backend
// is one line here, no static self-registration (a static library would drop it at link time).
// It also holds `--transport auto`'s choice (see strata/comm/registry.h).
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/inproc/inproc_transport.h"
#include "comm/mpi/mpi_rma_transport.h"
#include "comm/tcp/tcp_transport.h"
#include "strata/comm/mpi_group.h"
#include "strata/comm/registry.h"
#include "strata/common/error.h"
#include "strata/config.h"
#if STRATA_HAVE_UCX
#include "comm/ucx/ucx_transport.h"
#endif

namespace strata::comm {
namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

struct OneSidedProbe {
  bool window = false;     // MPI_Win_allocate over the whole communicator worked
  bool one_sided = false;  // and an atomic completed while its target was outside MPI
  std::string detail;
};

// Collective. Why a sleeping target: over TCP, Open MPI (osc ucx, pt2pt) and UCX complete
// atomics only when the target enters the library (docs/PERFORMANCE.md, "Data-plane design"), so
// such a "window" would stall every push behind the PS's compute; true RDMA completes it in
// microseconds.
OneSidedProbe probe_mpi_one_sided(MPI_Comm parent) {
  OneSidedProbe out;
  MPI_Comm comm;
  STRATA_CHECK_MPI(MPI_Comm_dup(parent, &comm));
  STRATA_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  void* base = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  const int rc = MPI_Win_allocate(8, 1, MPI_INFO_NULL, comm, &base, &win);
  int ok = rc == MPI_SUCCESS ? 1 : 0;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm));
  if (!ok) {
    // Failed somewhere: a window that exists on some ranks cannot be freed collectively, so it is
    // left to the job's end. Every rank reports the first failing rank's reason.
    std::string mine = rc == MPI_SUCCESS ? "" : mpi_error_string(rc);
    int first = rc == MPI_SUCCESS ? size : rank;
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
    char text[MPI_MAX_ERROR_STRING] = {};
    if (rank == first) mine.copy(text, sizeof text - 1);
    STRATA_CHECK_MPI(MPI_Bcast(text, sizeof text, MPI_CHAR, first, comm));
    out.detail = std::string("MPI_Win_allocate across nodes failed (") + text + ")";
    MPI_Comm_free(&comm);
    return out;
  }
  out.window = true;
  std::memset(base, 0, 8);
  // Target: rank 0. Origin: the first rank on another node.
  MPI_Comm node;
  STRATA_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int leader = rank;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node));
  MPI_Comm_free(&node);
  int origin = leader != 0 ? rank : size;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &origin, 1, MPI_INT, MPI_MIN, comm));
  double elapsed = 0;
  STRATA_CHECK_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win));
  STRATA_CHECK_MPI(MPI_Barrier(comm));
  constexpr double kSleepS = 0.05;
  if (rank == 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kSleepS));  // outside MPI on purpose
  } else if (rank == origin) {
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t one = 1, old = 0;
    STRATA_CHECK_MPI(MPI_Fetch_and_op(&one, &old, MPI_INT64_T, 0, 0, MPI_SUM, win));
    STRATA_CHECK_MPI(MPI_Win_flush(0, win));
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  STRATA_CHECK_MPI(MPI_Barrier(comm));
  if (origin < size) STRATA_CHECK_MPI(MPI_Bcast(&elapsed, 1, MPI_DOUBLE, origin, comm));
  STRATA_CHECK_MPI(MPI_Win_unlock_all(win));
  STRATA_CHECK_MPI(MPI_Win_free(&win));
  MPI_Comm_free(&comm);
  out.one_sided = elapsed < kSleepS / 2;
  out.detail = out.one_sided ? "MPI one-sided atomics completed in " + std::to_string(elapsed * 1e6).substr(0, 6) +
                                   " us while the target was outside MPI"
                             : "MPI windows span the nodes, but an atomic waited " +
                                   std::to_string(elapsed * 1e3).substr(0, 5) +
                                   " ms for its target to enter MPI (emulated over the network, not one-sided)";
  return out;
}

}  // namespace

std::vector<std::string> compiled_transports() {
  std::vector<std::string> names = {"mpi", "tcp"};
#if STRATA_HAVE_UCX
  names.push_back("ucx");
#endif
  return names;
}

int count_nodes(MPI_Comm comm) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  MPI_Comm node;
  STRATA_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int node_rank = 0;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_free(&node);
  int leaders = node_rank == 0 ? 1 : 0;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &leaders, 1, MPI_INT, MPI_SUM, comm));
  return leaders;
}

std::unique_ptr<Transport> create_transport(const std::string& name, MPI_Comm comm) {
  if (name == "auto") {
    const int nodes = count_nodes(comm);
    if (nodes == 1) {
      auto t = std::make_unique<mpi::MpiRmaTransport>(comm);
      t->set_why("auto: every rank on one node");
      return t;
    }
    const OneSidedProbe probe = probe_mpi_one_sided(comm);
    if (probe.one_sided) {
      auto t = std::make_unique<mpi::MpiRmaTransport>(comm);
      t->set_why("auto: " + std::to_string(nodes) + " nodes; " + probe.detail);
      return t;
    }
    auto t = std::make_unique<tcp::TcpTransport>(comm);
    t->set_why("auto: " + std::to_string(nodes) + " nodes; " + probe.detail);
    return t;
  }
  if (name == "mpi") {
    const int nodes = count_nodes(comm);
    if (nodes > 1) {
      const OneSidedProbe probe = probe_mpi_one_sided(comm);
      if (!probe.window)
        throw ConfigError("--transport mpi: " + probe.detail + " between the job's " + std::to_string(nodes) +
                          " nodes: this MPI library offers no one-sided communication on that network (Debian's "
                          "Open MPI excludes osc ucx and pt2pt in /etc/openmpi/openmpi-mca-params.conf); use "
                          "--transport auto or tcp (STRATA_TRANSPORT), or enable an RMA component "
                          "(OMPI_MCA_osc=ucx)");
    }
    return std::make_unique<mpi::MpiRmaTransport>(comm);
  }
  if (name == "tcp") return std::make_unique<tcp::TcpTransport>(comm);
#if STRATA_HAVE_UCX
  if (name == "ucx") return std::make_unique<ucx::UcxTransport>(comm);
#endif
  std::string known;
  for (const auto& n : compiled_transports()) known += n + ", ";
  known += "and auto";
  throw ConfigError("unknown transport '" + name + "' (this build has: " + known + ")");
}

std::unique_ptr<Transport> create_transport(const std::string& name, Group& group) {
  if (const MPI_Comm comm = mpi_comm(group); comm != MPI_COMM_NULL) return create_transport(name, comm);
  if (std::string(group.kind()) != "inproc")
    throw Error(std::string("create_transport: a group of kind '") + group.kind() + "' has no transport");
  if (name != "auto" && name != "inproc")
    throw ConfigError("transport '" + name + "' needs an MPI job; ranks that are threads of one process use the "
                      "in-process transport (auto or inproc)");
  auto t = inproc::make_inproc_transport(group);
  if (name == "auto") t->set_why("auto: ranks are threads of one process");
  return t;
}

}  // namespace strata::comm
