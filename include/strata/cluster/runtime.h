// Runtime bootstrap: MPI initialisation, the cross-checks (docs/ARCHITECTURE.md, "Bootstrap
// protocol") and the communicators every later layer uses.
//
// Protocol of Runtime::bootstrap (collective over the given world communicator):
//   a. every rank resolves its cluster and task (resolve.h); a resolution error is not thrown yet,
//      it travels with the rank's record so that every rank can name the culprit;
//   b. every rank sends a fixed-size record (cluster hash and summary, task, host, error) to rank 0
//      with non-blocking sends; rank 0 polls the receives until a deadline, so a rank that never
//      arrives is named ("ranks 3,4 did not arrive within 60 s");
//   c. rank 0 checks the records (same cluster hash everywhere, cluster size == world size, every
//      task claimed by exactly one rank, tasks inside the cluster, known job names) and broadcasts
//      the records plus a verdict with a non-blocking broadcast, which the other ranks poll against
//      the same deadline;
//   d. on a bad verdict every rank throws the same ConfigError (one line naming the ranks);
//   e. otherwise communicators are split by role and by node, under a watchdog that aborts the job
//      with a message if a split does not complete in time.
// No MPI_COMM_WORLD inside: the runtime dups the communicator it is given and sets
// MPI_ERRORS_RETURN on every communicator it creates, so STRATA_CHECK_MPI reports real errors.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/cluster/resolve.h"
#include "strata/common/env.h"

namespace strata {

namespace comm {
class Group;  // strata/comm/group.h
}

enum class Role { kChief, kWorker, kPs, kEvaluator };
const char* to_string(Role role);
// Maps a job name to its role; ConfigError for job names strata does not run.
Role role_of_job(const std::string& job);

// Owns MPI initialisation for a program (the strata binary, a test main). Requests
// MPI_THREAD_MULTIPLE and throws MpiError if the library provides less. Finalizes in the destructor
// only if it initialised MPI and no exception is propagating (then the handler calls abort_job).
// MPI_Finalize is bounded: Open MPI's ends in a PMIx fence with every rank and the launcher's
// server, which has no timeout of its own; if it has not returned after STRATA_FINALIZE_TIMEOUT_S
// (default 30 s) the process prints one line and exits with its exit status without it (all of its
// own work, and every collective of the job, finished before the fence).
// It also ignores SIGPIPE when the program left it at its default: a write to a peer, a launcher
// daemon or an output pipe that is already gone (a step being torn down after a preemption, say)
// then fails with EPIPE where it is handled, instead of killing the rank with status 141 and
// hiding the status it was about to exit with.
// Not thread-safe; create one per process, on the main thread.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  static constexpr int kRequiredThreadLevel = MPI_THREAD_MULTIPLE;
  int provided() const { return provided_; }
  // The status this process exits with when MPI_Finalize does not return (below); a command that
  // returns non-zero after a clean finalize (a usage verdict, preemption) sets it first.
  void set_exit_status(int status) { exit_status_ = status; }

 private:
  bool owns_ = false;
  int provided_ = 0;
  int exit_status_ = 0;
};

// Ends the whole job from this rank (MPI_Abort on the world) if MPI is initialised and not yet
// finalised; returns otherwise. For error handlers: one failing rank must end the job, not leave
// its peers waiting. Open MPI's mpirun exits with `code`.
void abort_job(int code);

// The communicator a job runs on: `world`, or MPI_COMM_WORLD when it is MPI_COMM_NULL. Throws
// Error("<who>: MPI is not initialised (create a strata::MpiSession first)") before MPI_Init.
MPI_Comm job_world(MPI_Comm world, const std::string& who);
// This process's rank in `comm`.
int rank_in(MPI_Comm comm);

// One rank as seen by everyone after the bootstrap exchange.
struct RankInfo {
  int rank = -1;
  cluster::TaskId task;
  std::string host;
  std::string address;  // the task's address in the cluster spec
  std::string gpus;     // CUDA_VISIBLE_DEVICES assigned to it ("" when unset)
  int local_rank = 0;   // rank within its node (from MPI_Comm_split_type order)
  int node_index = 0;   // index of its node, in order of first appearance by world rank
};

// Communicators derived from the world one. RAII: frees them on destruction (before MPI_Finalize).
class Communicators {
 public:
  Communicators() = default;
  ~Communicators();
  Communicators(const Communicators&) = delete;
  Communicators& operator=(const Communicators&) = delete;

  MPI_Comm runtime() const { return runtime_; }  // dup of world: the runtime's own traffic
  MPI_Comm role() const { return role_; }        // ranks with the same role
  MPI_Comm ps() const { return ps_; }            // PS ranks; MPI_COMM_NULL elsewhere
  MPI_Comm workers() const { return workers_; }  // chief + workers; MPI_COMM_NULL elsewhere
  MPI_Comm node() const { return node_; }        // ranks sharing this node's memory

 private:
  friend class Runtime;
  MPI_Comm runtime_ = MPI_COMM_NULL;
  MPI_Comm role_ = MPI_COMM_NULL;
  MPI_Comm ps_ = MPI_COMM_NULL;
  MPI_Comm workers_ = MPI_COMM_NULL;
  MPI_Comm node_ = MPI_COMM_NULL;
};

// Collective over `comm`: every rank's short host name, in rank order. Throws TimeoutError naming
// the ranks that did not arrive within `timeout_s`.
std::vector<std::string> gather_hostnames(MPI_Comm comm, double timeout_s);

// Collective over `comm`: every rank's string (any length), in rank order, with the same deadline
// semantics (TimeoutError naming the ranks that did not arrive).
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine, double timeout_s,
                                           const std::string& what);

struct BootstrapOptions {
  cluster::ResolveOptions resolve;
  double timeout_s = kDefaultTimeoutS;  // deadline of each bootstrap wait (--timeout / STRATA_TIMEOUT_S)
};

class Runtime {
 public:
  // Collective over `world` (see the protocol above). Throws ConfigError with the same message on
  // every rank when the cluster is inconsistent, TimeoutError naming the missing ranks when some
  // rank does not arrive before the deadline.
  static std::unique_ptr<Runtime> bootstrap(MPI_Comm world, const Env& env, const BootstrapOptions& options);

  // Steps a-d of the protocol over ranks that are not an MPI job (comm::bootstrap_over, for the
  // in-process group): `exchange(mine, bytes, what)` gives every rank's `bytes` bytes in rank order
  // or throws TimeoutError naming the late ranks. The runtime has no communicators (every member
  // of comms() is MPI_COMM_NULL); group() is `group`, the ranks' process group.
  using Exchange = std::function<std::vector<char>(const void* mine, int bytes, const std::string& what)>;
  static std::unique_ptr<Runtime> bootstrap(std::shared_ptr<comm::Group> group, int rank, int size, const Env& env,
                                            const BootstrapOptions& options, const Exchange& exchange);
  ~Runtime();

  // The process group of a runtime bootstrapped over one (above); null for an MPI runtime, whose
  // layers make their groups from comms() (comm::groups_of).
  const std::shared_ptr<comm::Group>& group() const { return group_; }
  // The groups split from it by role, as the communicators of an MPI runtime are (null where this
  // rank is not a member, and in an MPI runtime): set by comm::bootstrap_over.
  const std::shared_ptr<comm::Group>& role_group() const { return role_group_; }
  std::shared_ptr<comm::Group> ps_group() const { return role_ == Role::kPs ? role_group_ : nullptr; }
  std::shared_ptr<comm::Group> workers_group() const {
    return role_ == Role::kChief || role_ == Role::kWorker ? role_group_ : nullptr;
  }
  void set_role_group(std::shared_ptr<comm::Group> group) { role_group_ = std::move(group); }

  const cluster::ResolvedCluster& resolved() const { return resolved_; }
  const cluster::TaskId& task() const { return resolved_.task; }
  Role role() const { return role_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return ranks_[rank_].local_rank; }
  int local_size() const { return local_size_; }
  int num_nodes() const { return num_nodes_; }
  // The chief: the "chief" task if the cluster has one, else worker 0, else rank 0.
  int chief_rank() const { return chief_rank_; }
  bool is_chief() const { return rank_ == chief_rank_; }
  const std::vector<RankInfo>& ranks() const { return ranks_; }
  const Communicators& comms() const { return comms_; }
  int count_role(Role role) const;

  // The rank -> task -> node table printed by `strata cluster --verify`.
  std::string table() const;

 private:
  Runtime() = default;
  // Steps a-d (resolution, the two exchanges, the check, the shared table), common to both bootstraps.
  static std::unique_ptr<Runtime> resolve_and_agree(int rank, int size, const Env& env,
                                                    const BootstrapOptions& options, const Exchange& exchange);
  cluster::ResolvedCluster resolved_;
  Role role_ = Role::kWorker;
  int rank_ = 0;
  int size_ = 0;
  int local_size_ = 1;
  int num_nodes_ = 1;
  int chief_rank_ = 0;
  std::vector<RankInfo> ranks_;
  Communicators comms_;
  std::shared_ptr<comm::Group> group_;
  std::shared_ptr<comm::Group> role_group_;
};

}  // namespace strata
