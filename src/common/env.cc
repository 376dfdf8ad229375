#include "strata/common/env.h"

#include <unistd.h>  // environ (declared under _GNU_SOURCE, which g++ defines)

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "strata/common/error.h"
#include "strata/common/parse.h"

namespace strata {

Env Env::from_process() {
  Vars vars;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string kv(*entry);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    vars.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return Env(std::move(vars));
}

std::optional<std::string> Env::get(std::string_view name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

bool Env::has(std::string_view name) const {
  auto it = vars_.find(name);
  return it != vars_.end() && !it->second.empty();
}

Env Env::with(const std::string& name, const std::string& value) const {
  Env copy = *this;
  copy.vars_[name] = value;
  return copy;
}

std::int64_t Env::get_int(std::string_view name, std::int64_t fallback) const {
  auto value = get(name);
  if (!value || value->empty()) return fallback;
  return parse_int64(*value, name);
}

double Env::get_double(std::string_view name, double fallback) const {
  auto value = get(name);
  if (!value || value->empty()) return fallback;
  return parse_double(*value, name);
}

double Env::get_seconds(std::string_view name, double fallback, ZeroSeconds zero) const {
  auto value = get(name);
  if (!value || value->empty()) return fallback;
  return parse_seconds(*value, name, zero);
}

bool Env::get_bool(std::string_view name, bool fallback) const {
  auto value = get(name);
  if (!value || value->empty()) return fallback;
  return parse_bool(*value, name);
}

std::string Env::get_string(std::string_view name, const std::string& fallback) const {
  auto value = get(name);
  return (value && !value->empty()) ? *value : fallback;
}

double timeout_from_env(const Env& env) {
  return env.get_seconds("STRATA_TIMEOUT_S", kDefaultTimeoutS, ZeroSeconds::kRejected);
}

double resolve_timeout(const std::string& flag_value, const Env& env) {
  double t = 0;
  if (flag_value.empty()) {
    t = timeout_from_env(env);
  } else {
    t = parse_seconds(flag_value, "--timeout", ZeroSeconds::kRejected);
  }
  std::ostringstream text;
  text.precision(17);
  text << t;
  ::setenv("STRATA_TIMEOUT_S", text.str().c_str(), 1);
  return t;
}

double test_hook_delay(const Env& env, const char* var, int rank) {
  const auto hook = env.get(var);
  if (!hook || hook->empty()) return 0;
  const auto colon = hook->find(':');
  if (colon == std::string::npos || hook->find(':', colon + 1) != std::string::npos)
    throw ConfigError(std::string(var) + ": expected RANK:SECONDS, got '" + *hook + "'");
  if (parse_int(hook->substr(0, colon), std::string(var) + " rank", 0, 1 << 30) != rank) return 0;
  return parse_seconds(hook->substr(colon + 1), std::string(var) + " seconds");
}

const std::vector<EnvVarDoc>& env_table() {
  static const std::vector<EnvVarDoc> table = {
      // strata's own
      {"STRATA_LOG_LEVEL", "enum", "warn", "log threshold: trace, debug, info, warn, error, off"},
      {"STRATA_LOG_RANKS", "int list", "(all)", "only these world ranks log, e.g. 0,3"},
      {"STRATA_CLUSTER", "file|json", "", "explicit cluster (TF_CONFIG-shaped JSON or a job map); beats TF_CONFIG"},
      {"STRATA_NUM_PS", "int", "0", "mpi/slurm resolvers without --jobs: the first N ranks are PS (strata-mpirun sets it)"},
      {"STRATA_JOBS", "jobs", "", "mpi/slurm resolvers without --jobs/--num-ps: roles in rank order, e.g. ps=1,worker=2,evaluator=1 (strata-mpirun --evaluator sets it)"},
      {"STRATA_TIMEOUT_S", "seconds", "120", "bound on each single wait for another rank, in every command and phase (bootstrap, PS requests, collectives, barriers); past it the wait names who it waited for; --timeout overrides it"},
      {"STRATA_FINALIZE_TIMEOUT_S", "seconds", "30", "bound on MPI_Finalize (its PMIx fence has none): past it a rank prints one line and exits with its status"},
      {"STRATA_EVAL_CHUNK_ROWS", "rows", "64000", "strata train --streaming: rows of --eval-data read at a time by an evaluation (a multiple of 1000, the evaluation batch)"},
      {"STRATA_EVALUATOR_NICE", "0-19", "10", "strata train: the evaluator task evaluates at this lower priority (nice), so on cores it shares with trainers it takes only what they leave idle; 0 keeps its priority"},
      {"STRATA_STALL_TIMEOUT_S", "seconds", "10", "strata train: a rank without a heartbeat this long has stopped; the job ends naming it (--stall-timeout)"},
      {"STRATA_PROGRESS_TIMEOUT_S", "seconds", "120", "strata train: a training worker whose step is frozen this long while the others move ends the job (0: off)"},
      {"STRATA_TRANSPORT", "enum", "auto", "data-plane transport: auto (shared memory in a node; MPI RMA between nodes where probed one-sided, else tcp), mpi, tcp or ucx"},
      {"STRATA_TCP_IF", "list", "", "tcp transport: interfaces or CIDR subnets to serve peers on (default: OMPI_MCA_btl_tcp_if_include, else the host name's address)"},
      {"STRATA_TCP_FORCE_REMOTE", "bool", "0", "tcp transport: serve co-located ranks over TCP too (tests; the network path on one host)"},
      {"STRATA_TCP_DYNAMIC_CHUNKS", "int", "1", "dynamic tables between nodes: chunks a lookup or update is posted in, so a PS works on one while the next is on the wire (1-64; more than 1 pays where PS and worker have cores to spare)"},
      {"STRATA_CPU_REPLICAS", "int", "1", "strata train: CPU replicas per worker (--cpu-replicas)"},
      {"STRATA_PS_THREADS", "int", "1", "strata train: threads each PS rank applies a stateful optimizer and serves large dynamic-table calls with (--ps-threads)"},
      {"STRATA_PS_MAX_ARENA_BYTES", "bytes", "0", "strata train: refuse a PS arena larger than this (0: no cap)"},
      {"STRATA_MPI_SHARED", "bool", "1", "mpi transport: shared-memory windows and direct loads when all ranks share a node"},
      {"STRATA_GEMM", "enum", "auto", "the models' matrix products: auto (BLIS when built in and its kernels suit the CPU; else OpenBLAS when it chose AVX-512 kernels on an AVX-512 CPU and the process multiplies on one thread; else Eigen; a library is left the moment a run-time check fails), blis, openblas (one multiplying thread per process only), eigen or reference (double, slow)"},
      {"STRATA_BENCH_MIN_BW", "GB/s", "0", "strata bench exits 1 when a size's algbw falls below this (CI gating)"},
      {"STRATA_TEST_DELAY_RANK", "RANK:SECONDS", "", "test hook: that rank sleeps before the bootstrap exchange"},
      {"STRATA_PULL_IN_PLACE", "bool", "0", "strata train, sync consistency: 1 reads a variable that a PS on the worker's node holds in one shard in place instead of copying it each step (measured no faster than the copy on the 2-core VMs, so off)"},
      {"STRATA_SHM_FLUSH", "bool", "1", "one node, shared windows: after copying 64 KiB or more out of a peer's segment (a pull), write those lines out of this core's caches (x86 CLFLUSHOPT), so the owner's next writes to them (the PS's apply) find no other copy"},
      {"STRATA_UCX_DIRECT", "bool", "1", "ucx transport: plain loads/stores through ucp_rkey_ptr mappings for co-located ranks"},
      {"STRATA_ON_SAVE_ERROR", "enum", "stop", "strata train: after a failed checkpoint save, stop (exit 1) or continue (--on-save-error)"},
      {"STRATA_MPIIO_HINTS", "key=value,...", "", "parallel checkpoint writes: MPI-IO hints set on the MPI_Info of every checkpoint file the PS ranks create with parallel HDF5, e.g. striping_factor=8,striping_unit=4194304,romio_cb_write=enable (keys as the MPI library and file system document them; striping only at creation)"},
      {"STRATA_MAX_RESTARTS", "int", "0", "strata-mpirun and the sbatch templates: relaunch a failed strata train up to N times with --restore latest (--max-restarts; not after status 0, 2 or 75)"},
      {"STRATA_RESTART_COUNT", "int", "0", "strata train: set by those launchers, the relaunches before this run; reported as \"restarts\" in the summary"},
      {"STRATA_TEST_STEP_DELAY_RANK", "RANK:SECONDS", "", "test hook: that rank sleeps after each of its training steps (a slow worker)"},
      {"STRATA_TEST_FINAL_DELAY_RANK", "RANK:SECONDS", "", "test hook: that rank sleeps before the workers' end-of-training barrier"},
      {"STRATA_TEST_FINALIZE_DELAY_RANK", "RANK:SECONDS", "", "test hook: that rank sleeps before MPI_Finalize, so its peers' final fences wait for it"},
      {"STRATA_TEST_SAVE_DELAY_S", "seconds", "", "test hook: every PS rank holds each checkpoint save open this long before closing it"},
      {"STRATA_TEST_COMMIT_DELAY_S", "seconds", "", "test hook: PS 0 holds each checkpoint commit this long after renaming the file into place, before checkpoint.json names it"},
      {"STRATA_TEST_PHASE_DIR", "dir", "", "test hook: each rank creates DIR/<rank>.<phase> when it enters a liveness phase (bootstrap, restore, train, checkpoint-save, final-barrier, serve)"},
      {"STRATA_TEST_HOLD_PHASE", "PHASE[@RANK]:SECONDS[,...]", "", "test hook: every rank (or world rank RANK only) entering that liveness phase (e.g. final-barrier) sleeps this long first; several entries, comma-separated: the first that matches"},
      {"STRATA_TEST_DYNAMIC_WRITE_FAIL_RANK", "int", "", "test hook: that rank of the PS ranks fails its write of each parallel dynamic-table save after the file was created"},
      {"STRATA_TEST_SKIP_SPACE_CHECK", "bool", "", "test hook: checkpoint saves skip the free-space check, so a full disk fails inside HDF5's writes"},
      {"STRATA_TEST_TIMEOUT_S", "seconds", "120", "mpi test tier: a test running longer aborts the job, naming it"},
      {"STRATA_TEST_SHARED_DIR", "dir", "", "mpi test tier: where tests make the directories all their ranks share (one every node sees, for ranks on several hosts; default the temp directory)"},
      // TensorFlow
      {"TF_CONFIG", "json", "", "TensorFlow cluster/task description (cluster, task, rpc_layer, environment)"},
      // Slurm (read by the slurm resolver; step variables win over job-level fallbacks)
      {"SLURM_PROCID", "int", "", "this task's rank in the step"},
      {"SLURM_STEP_NUM_TASKS", "int", "", "tasks in the step (fallback SLURM_NTASKS, SLURM_NPROCS)"},
      {"SLURM_STEP_NODELIST", "hostlist", "", "nodes of the step (fallback SLURM_JOB_NODELIST, SLURM_NODELIST)"},
      {"SLURM_STEP_TASKS_PER_NODE", "list", "", "tasks per node, e.g. 2(x3),1 (fallback SLURM_TASKS_PER_NODE)"},
      {"SLURM_GPUS_ON_NODE", "int", "", "GPUs on this node, used when --gpus-per-node is not given"},
      // Launchers and devices
      {"OMPI_COMM_WORLD_RANK", "int", "", "set by mpirun; marks an mpirun launch (the slurm resolver is skipped)"},
      {"CUDA_VISIBLE_DEVICES", "list", "", "GPUs this process may use; the slurm resolver assigns it per task"},
  };
  return table;
}

std::string format_env_table() {
  std::size_t name_w = 4, type_w = 4, def_w = 7;
  for (const auto& row : env_table()) {
    name_w = std::max(name_w, std::string(row.name).size());
    type_w = std::max(type_w, std::string(row.type).size());
    def_w = std::max(def_w, std::string(row.default_value).size());
  }
  std::ostringstream os;
  auto pad = [](const std::string& s, std::size_t w) { return s + std::string(w - s.size() + 2, ' '); };
  os << pad("NAME", name_w) << pad("TYPE", type_w) << pad("DEFAULT", def_w) << "DESCRIPTION\n";
  for (const auto& row : env_table()) {
    os << pad(row.name, name_w) << pad(row.type, type_w) << pad(row.default_value, def_w) << row.doc << "\n";
  }
  return os.str();
}

}  // namespace strata
