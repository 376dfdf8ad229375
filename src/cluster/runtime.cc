// Runtime bootstrap; the protocol is narrated in include/strata/cluster/runtime.h.
#include "strata/cluster/runtime.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iomanip>
#include <map>
#include <sstream>
#include <thread>

#include "cluster/bootstrap_check.h"
#include "strata/cluster/liveness.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/parse.h"
#include "strata/common/rank_context.h"
#include "strata/common/watchdog.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kGatherTag = 0x5354;  // "ST"

// Fixed-size wire form of cluster::RankRecord (plain bytes, MPI_BYTE).
struct WireRecord {
  std::uint64_t cluster_hash;
  std::int32_t cluster_tasks;
  std::int32_t task_index;
  char task_type[64];
  char host[64];
  char address[128];
  char gpus[64];
  char summary[192];
  char error[768];
};

template <std::size_t N>
void copy_field(char (&dst)[N], const std::string& src) {
  std::memset(dst, 0, N);
  std::memcpy(dst, src.data(), std::min(src.size(), N - 1));
}

template <std::size_t N>
std::string read_field(const char (&src)[N]) {
  return std::string(src, strnlen(src, N));
}

// Polls `requests` until all complete or the deadline passes. Returns the indices still pending.
// MPI_Testsome keeps the progress engine turning; the short sleep keeps an oversubscribed node
// usable while ranks wait for a late peer.
std::vector<int> wait_until(std::vector<MPI_Request>& requests, Clock::time_point deadline) {
  std::vector<int> done(requests.size());
  auto pause = std::chrono::microseconds(50);
  while (true) {
    int outcount = 0;
    if (!requests.empty())
      STRATA_CHECK_MPI(MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &outcount, done.data(),
                                    MPI_STATUSES_IGNORE));
    bool all_done = std::all_of(requests.begin(), requests.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
    if (all_done) return {};
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  std::vector<int> pending;
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (requests[i] != MPI_REQUEST_NULL) pending.push_back(static_cast<int>(i));
  return pending;
}

void cancel_all(std::vector<MPI_Request>& requests) {
  for (auto& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

// Gathers `bytes` from every rank to every rank with deadlines that name the missing ranks:
// point-to-point to rank 0 (which can tell who is missing), then a non-blocking broadcast.
// Collective over `comm`. Throws TimeoutError on a missed deadline; the communicator is then unusable
// and the caller must abort the job.
std::vector<char> exchange(MPI_Comm comm, const void* mine, int bytes, double timeout_s, const std::string& what) {
  int rank = 0, size = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  std::vector<char> all(static_cast<std::size_t>(bytes) * size);
  auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  auto deadline = Clock::now() + timeout;
  std::ostringstream seconds;
  seconds << timeout_s;

  if (rank == 0) {
    std::memcpy(all.data(), mine, bytes);
    std::vector<MPI_Request> recvs(size - 1, MPI_REQUEST_NULL);
    for (int r = 1; r < size; ++r)
      STRATA_CHECK_MPI(MPI_Irecv(all.data() + static_cast<std::size_t>(bytes) * r, bytes, MPI_BYTE, r, kGatherTag,
                                 comm, &recvs[r - 1]));
    std::vector<int> pending = wait_until(recvs, deadline);
    if (!pending.empty()) {
      cancel_all(recvs);
      std::vector<int> missing;
      for (int i : pending) missing.push_back(i + 1);
      throw TimeoutError(what + ": " + (missing.size() == 1 ? "rank " : "ranks ") +
                             cluster::format_rank_set(missing) + " of " + std::to_string(size) +
                             " did not arrive within " + seconds.str() +
                             " s (--timeout / STRATA_TIMEOUT_S); are they running the same program?",
                         missing);
    }
  }
  // Rank 0 reports missing peers at `deadline`; the others give it time to do so (half the timeout
  // + 2 s more) before blaming rank 0, and say how long they really waited.
  std::ostringstream waited;
  waited << 1.5 * timeout_s + 2 << " s (the timeout of " << timeout_s << " s, plus time for rank 0 to report)";
  if (rank != 0) {
    std::vector<MPI_Request> send(1, MPI_REQUEST_NULL);
    STRATA_CHECK_MPI(MPI_Isend(mine, bytes, MPI_BYTE, 0, kGatherTag, comm, &send[0]));
    if (!wait_until(send, deadline + timeout / 2 + std::chrono::seconds(2)).empty()) {
      cancel_all(send);
      throw TimeoutError(what + ": rank 0 did not collect this rank's record within " + waited.str(), {0});
    }
  }
  std::vector<MPI_Request> bcast(1, MPI_REQUEST_NULL);
  STRATA_CHECK_MPI(MPI_Ibcast(all.data(), bytes * size, MPI_BYTE, 0, comm, &bcast[0]));
  if (!wait_until(bcast, deadline + timeout / 2 + std::chrono::seconds(2)).empty()) {
    // A pending Ibcast cannot be cancelled; the caller aborts the job.
    throw TimeoutError(what + ": the table from rank 0 did not arrive within " + waited.str(), {0});
  }
  return all;
}

[[noreturn]] void abort_on_stall(MPI_Comm world, const std::string& what, double timeout_s) {
  std::ostringstream os;
  os << current_rank_context().prefix() << " bootstrap stalled: " << what << " did not complete within "
     << timeout_s << " s (--timeout / STRATA_TIMEOUT_S); aborting the job\n";
  std::string text = os.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  MPI_Abort(world, 1);
  std::abort();
}

// Runs a blocking MPI call under a watchdog that aborts the job if it stalls.
template <typename Fn>
void guarded(MPI_Comm world, const std::string& what, double timeout_s, Fn&& fn) {
  Watchdog watchdog(std::chrono::duration<double>(timeout_s), [=] { abort_on_stall(world, what, timeout_s); });
  fn();
}

void set_errors_return(MPI_Comm comm) {
  if (comm != MPI_COMM_NULL) STRATA_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
}

void free_comm(MPI_Comm& comm) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // MPI_Comm_free is collective: skip it while an error unwinds (the job is about to be aborted).
  if (comm != MPI_COMM_NULL && !finalized && std::uncaught_exceptions() == 0) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

}  // namespace

void abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

const char* to_string(Role role) {
  switch (role) {
    case Role::kChief: return "chief";
    case Role::kWorker: return "worker";
    case Role::kPs: return "ps";
    case Role::kEvaluator: return "evaluator";
  }
  return "?";
}

Role role_of_job(const std::string& job) {
  if (job == "chief" || job == "master") return Role::kChief;
  if (job == "worker") return Role::kWorker;
  if (job == "ps") return Role::kPs;
  if (job == "evaluator") return Role::kEvaluator;
  throw ConfigError("job '" + job + "' is not a role strata runs (chief, worker, ps, evaluator)");
}

std::vector<std::string> gather_hostnames(MPI_Comm comm, double timeout_s) {
  char mine[64] = {};
  std::string host = short_hostname();
  std::strncpy(mine, host.c_str(), sizeof(mine) - 1);
  std::vector<char> raw = exchange(comm, mine, sizeof(mine), timeout_s, "bootstrap (host names)");
  std::vector<std::string> hosts;
  for (std::size_t off = 0; off < raw.size(); off += sizeof(mine)) hosts.emplace_back(raw.data() + off, strnlen(raw.data() + off, sizeof(mine)));
  return hosts;
}

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine, double timeout_s,
                                           const std::string& what) {
  // Two bounded exchanges: lengths first, then every string padded to the longest.
  std::uint64_t length = mine.size();
  std::vector<char> lengths_raw = exchange(comm, &length, sizeof(length), timeout_s, what + " (sizes)");
  std::vector<std::uint64_t> lengths(lengths_raw.size() / sizeof(std::uint64_t));
  std::memcpy(lengths.data(), lengths_raw.data(), lengths_raw.size());
  std::uint64_t longest = 1;
  for (auto n : lengths) longest = std::max(longest, n);
  if (longest > static_cast<std::uint64_t>(INT32_MAX / std::max<std::size_t>(lengths.size(), 1)))
    throw Error(what + ": strings of " + std::to_string(longest) + " bytes are too large to exchange");
  std::vector<char> padded(longest, 0);
  std::memcpy(padded.data(), mine.data(), mine.size());
  std::vector<char> all = exchange(comm, padded.data(), static_cast<int>(longest), timeout_s, what);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lengths.size(); ++r) out.emplace_back(all.data() + r * longest, lengths[r]);
  return out;
}

MPI_Comm job_world(MPI_Comm world, const std::string& who) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Error(who + ": MPI is not initialised (create a strata::MpiSession first)");
  return world == MPI_COMM_NULL ? MPI_COMM_WORLD : world;
}

int rank_in(MPI_Comm comm) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  return rank;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  // SIGPIPE is ignored: after a preemption save every rank exits with 75, and a rank whose
  // MPI_Finalize (PMIx) or output write meets an end already closed by the step's teardown must
  // not die of SIGPIPE, which would make the job's status 141 instead of 75 (no requeue;
  // docs/RELIABILITY.md, "What the launchers do"). A program's own handler is left alone.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    current.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &current, nullptr);
  }
  int initialized = 0;
  STRATA_CHECK_MPI(MPI_Initialized(&initialized));
  if (!initialized) {
    STRATA_CHECK_MPI(MPI_Init_thread(argc, argv, kRequiredThreadLevel, &provided_));
    owns_ = true;
  } else {
    STRATA_CHECK_MPI(MPI_Query_thread(&provided_));
  }
  if (provided_ < kRequiredThreadLevel) {
    // Checked rather than assumed (Aluminum does the same): replicas and the PS service loop call
    // MPI from several threads.
    throw MpiError(MPI_ERR_OTHER, "MPI provides thread level " + std::to_string(provided_) +
                                      " but strata needs MPI_THREAD_MULTIPLE (" +
                                      std::to_string(kRequiredThreadLevel) + ")");
  }
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  // Unwinding from an error: MPI_Finalize may wait for peers that are themselves waiting for this
  // rank, so leave MPI alone; the handler that catches the error aborts the job (abort_job()).
  if (std::uncaught_exceptions() > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  double limit = 30;
  if (const char* v = std::getenv("STRATA_FINALIZE_TIMEOUT_S"); v && *v) {
    char* end = nullptr;
    const double parsed = std::strtod(v, &end);
    if (end != v && *end == '\0' && parsed > 0) limit = clamp_seconds(parsed);
  }
  const int status = exit_status_;
  // Test hook (documented in the env table): RANK:SECONDS holds that world rank back before its
  // fence, so its peers' fences wait for it.
  // (A destructor: a malformed value is ignored, not thrown.)
  try {
    int me = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (const double delay = test_hook_delay(Env::from_process(), "STRATA_TEST_FINALIZE_DELAY_RANK", me); delay > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  } catch (const ConfigError&) {
  }
  // A peer or the PMIx server that never answers the final fence must not hang the job: the step
  // would stay RUNNING after every rank had printed its result (docs/RELIABILITY.md, "Bounds on
  // every wait").
  Watchdog watchdog(std::chrono::duration<double>(limit), [limit, status] {
    const std::string who = current_rank_context().prefix();
    std::fprintf(stderr, "strata: %s%sMPI_Finalize did not return within %g s (STRATA_FINALIZE_TIMEOUT_S): a peer rank "
                 "or the launcher's PMIx server did not answer its final fence; exiting with status %d without it\n",
                 who.c_str(), who.empty() ? "" : " ", limit, status);
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(status);
  });
  MPI_Finalize();
}

Communicators::~Communicators() {
  // ps_ and workers_ alias role_; free each handle once.
  ps_ = MPI_COMM_NULL;
  workers_ = MPI_COMM_NULL;
  free_comm(role_);
  free_comm(node_);
  free_comm(runtime_);
}

Runtime::~Runtime() = default;

int Runtime::count_role(Role role) const {
  int n = 0;
  for (const auto& r : ranks_) n += role_of_job(r.task.type) == role ? 1 : 0;
  return n;
}

std::unique_ptr<Runtime> Runtime::resolve_and_agree(int rank, int size, const Env& env,
                                                    const BootstrapOptions& options, const Exchange& exchange) {
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->rank_ = rank;
  rt->size_ = size;
  const std::string host = short_hostname();

  // Exchange 1: host names, which the MPI resolver needs for addresses.
  cluster::ProcessInfo process;
  process.rank = rt->rank_;
  process.size = rt->size_;
  process.hostname = host;
  process.physical_gpus = cluster::count_physical_gpus();
  {
    char mine_host[64] = {};
    host.copy(mine_host, sizeof mine_host - 1);
    const std::vector<char> hosts = exchange(mine_host, sizeof mine_host, "bootstrap (host names)");
    for (int r = 0; r < size; ++r) {
      const char* h = hosts.data() + sizeof mine_host * static_cast<std::size_t>(r);
      process.rank_hosts.emplace_back(h, strnlen(h, sizeof mine_host));
    }
  }

  // Each rank resolves on its own; an error travels in the record instead of being thrown now, so
  // that every rank can report who failed.
  WireRecord mine{};
  std::string my_error;
  try {
    rt->resolved_ = cluster::resolve(env, options.resolve, process);
    if (rt->resolved_.task.valid()) role_of_job(rt->resolved_.task.type);
  } catch (const ConfigError& e) {
    my_error = e.message();
  }
  mine.cluster_hash = rt->resolved_.cluster.hash();
  mine.cluster_tasks = rt->resolved_.cluster.total_tasks();
  mine.task_index = rt->resolved_.task.index;
  copy_field(mine.task_type, rt->resolved_.task.type);
  copy_field(mine.host, host);
  copy_field(mine.address, rt->resolved_.task.valid()
                               ? rt->resolved_.cluster.task_address(rt->resolved_.task.type, rt->resolved_.task.index)
                                     .value_or("")
                               : "");
  copy_field(mine.gpus, rt->resolved_.cuda_visible_devices.value_or(""));
  copy_field(mine.summary, rt->resolved_.cluster.summary() + " via " + to_string(rt->resolved_.resolver));
  copy_field(mine.error, my_error);

  // Exchange 2: the records. Every rank then runs the same pure check over the same table.
  std::vector<char> raw = exchange(&mine, sizeof(WireRecord), "bootstrap (cluster records)");
  std::vector<cluster::RankRecord> records(rt->size_);
  for (int r = 0; r < rt->size_; ++r) {
    WireRecord w;
    std::memcpy(&w, raw.data() + sizeof(WireRecord) * r, sizeof(WireRecord));
    auto& rec = records[r];
    rec.rank = r;
    rec.cluster_hash = w.cluster_hash;
    rec.cluster_tasks = w.cluster_tasks;
    rec.cluster_summary = read_field(w.summary);
    rec.task = cluster::TaskId{read_field(w.task_type), w.task_index};
    rec.host = read_field(w.host);
    rec.address = read_field(w.address);
    rec.gpus = read_field(w.gpus);
    rec.error = read_field(w.error);
  }
  std::string verdict = cluster::check_bootstrap_records(records, rt->size_, rt->resolved_.cluster);
  if (!verdict.empty()) throw ConfigError(verdict);

  // The table every rank now shares.
  std::map<std::string, int> node_of_host, count_on_host;
  for (const auto& rec : records) {
    RankInfo info;
    info.rank = rec.rank;
    info.task = rec.task;
    info.host = rec.host;
    info.address = rec.address;
    info.gpus = rec.gpus;
    auto [it, inserted] = node_of_host.emplace(rec.host, static_cast<int>(node_of_host.size()));
    info.node_index = it->second;
    info.local_rank = count_on_host[rec.host]++;
    rt->ranks_.push_back(info);
  }
  rt->num_nodes_ = static_cast<int>(node_of_host.size());
  rt->local_size_ = count_on_host[host];
  rt->role_ = role_of_job(rt->resolved_.task.type);

  rt->chief_rank_ = 0;
  for (const auto& info : rt->ranks_) {
    if (info.task.type == "chief" || info.task.type == "master") {
      rt->chief_rank_ = info.rank;
      break;
    }
    if (info.task.type == "worker" && info.task.index == 0) rt->chief_rank_ = info.rank;
  }
  return rt;
}

std::unique_ptr<Runtime> Runtime::bootstrap(std::shared_ptr<comm::Group> group, int rank, int size, const Env& env,
                                            const BootstrapOptions& options, const Exchange& exchange) {
  std::unique_ptr<Runtime> rt = resolve_and_agree(rank, size, env, options, exchange);
  rt->group_ = std::move(group);
  return rt;
}

std::unique_ptr<Runtime> Runtime::bootstrap(MPI_Comm world, const Env& env, const BootstrapOptions& options) {
  int rank = 0, size = 0;
  const double timeout = options.timeout_s;
  STRATA_CHECK_MPI(MPI_Comm_rank(world, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(world, &size));
  const std::string host = short_hostname();
  set_rank_context(RankContext{rank, size, "", host});

  MPI_Comm comm = MPI_COMM_NULL;
  guarded(world, "MPI_Comm_dup of the world communicator", timeout,
          [&] { STRATA_CHECK_MPI(MPI_Comm_dup(world, &comm)); });
  set_errors_return(comm);

  // The job's first phase (strata/cluster/liveness.h); with STRATA_TEST_PHASE_DIR set it also marks
  // this rank as inside the bootstrap for tests/fault.
  liveness::set_phase(liveness::Phase::kBootstrap);

  // Test hook (documented in the env table): delay chosen ranks so tests can show that a late rank
  // is named instead of hanging the job.
  if (const double delay = test_hook_delay(env, "STRATA_TEST_DELAY_RANK", rank); delay > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));

  std::unique_ptr<Runtime> rt;
  try {
    rt = resolve_and_agree(rank, size, env, options, [&](const void* mine, int bytes, const std::string& what) {
      return exchange(comm, mine, bytes, timeout, what);
    });
  } catch (...) {
    // The dup would have been the runtime's; without one it is freed here.
    free_comm(comm);
    throw;
  }
  rt->comms_.runtime_ = comm;
  set_rank_context(RankContext{rt->rank_, rt->size_, rt->resolved_.task.str(), host});

  // Communicators. Role colours: ps 0, chief+workers 1, evaluator 2. Keys put the chief first and
  // then tasks in index order, so a communicator's rank is the task index (+1 for workers under a
  // chief), whatever the world-rank order was.
  const Role role = rt->role_;
  const int color = role == Role::kPs ? 0 : (role == Role::kEvaluator ? 2 : 1);
  const int key = role == Role::kChief ? 0 : rt->resolved_.task.index + 1;
  guarded(world, "MPI_Comm_split by role", timeout,
          [&] { STRATA_CHECK_MPI(MPI_Comm_split(comm, color, key, &rt->comms_.role_)); });
  set_errors_return(rt->comms_.role_);
  if (role == Role::kPs) rt->comms_.ps_ = rt->comms_.role_;
  if (role == Role::kChief || role == Role::kWorker) rt->comms_.workers_ = rt->comms_.role_;
  guarded(world, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", timeout, [&] {
    STRATA_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rt->rank_, MPI_INFO_NULL, &rt->comms_.node_));
  });
  set_errors_return(rt->comms_.node_);
  int node_rank = 0, node_size = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(rt->comms_.node_, &node_rank));
  STRATA_CHECK_MPI(MPI_Comm_size(rt->comms_.node_, &node_size));
  if (node_rank != rt->local_rank() || node_size != rt->local_size_) {
    // Host names and shared-memory domains disagree (e.g. containers with the same host name).
    // The node communicator is authoritative for shared memory; the table keeps host names.
    STRATA_LOG(WARN) << "node-local rank " << node_rank << "/" << node_size << " from MPI_COMM_TYPE_SHARED differs from "
                     << rt->local_rank() << "/" << rt->local_size_ << " by host name";
  }
  STRATA_LOG(DEBUG) << "bootstrap done: " << rt->resolved_.task.str() << " local " << node_rank << "/" << node_size;
  return rt;
}

std::string Runtime::table() const {
  std::size_t task_w = 4, node_w = 4, addr_w = 7;
  for (const auto& r : ranks_) {
    task_w = std::max(task_w, r.task.str().size());
    node_w = std::max(node_w, r.host.size());
    addr_w = std::max(addr_w, r.address.size());
  }
  std::ostringstream os;
  std::ostringstream hash;
  hash << std::hex << std::setw(16) << std::setfill('0') << resolved_.cluster.hash();
  os << "# strata cluster --verify: " << size_ << " ranks on " << num_nodes_ << " node(s), resolver "
     << cluster::to_string(resolved_.resolver) << ", cluster hash " << hash.str() << "\n";
  os << std::left << std::setw(6) << "rank" << std::setw(task_w + 2) << "task" << std::setw(node_w + 2) << "node"
     << std::setw(7) << "local" << std::setw(addr_w + 2) << "address" << "gpus\n";
  for (const auto& r : ranks_) {
    os << std::right << std::setw(4) << r.rank << "  " << std::left << std::setw(task_w + 2) << r.task.str()
       << std::setw(node_w + 2) << r.host << std::right << std::setw(5) << r.local_rank << "  " << std::left
       << std::setw(addr_w + 2) << r.address << (r.gpus.empty() ? "-" : r.gpus) << "\n";
  }
  std::string jobs;
  for (const auto& name : [&] {
         auto names = resolved_.cluster.job_names();
         std::sort(names.begin(), names.end());
         return names;
       }())
    jobs += (jobs.empty() ? "" : ", ") + name + " " + std::to_string(resolved_.cluster.num_tasks(name));
  os << "# ok: " << size_ << " ranks agree; " << jobs << "; " << num_nodes_ << " node(s)\n";
  return os.str();
}

}  // namespace strata
