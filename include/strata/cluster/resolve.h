// Cluster resolution: which job and task this process is, and what the whole cluster looks like.
//
// Sources, the first that applies wins (as README.md, "Checkpoints", lists them for users):
//   1. explicit: --cluster FILE|JSON or STRATA_CLUSTER
//   2. TF_CONFIG (TensorFlow's TFConfigClusterResolver semantics)
//   3. the Slurm step environment (TensorFlow's SlurmClusterResolver semantics, except that
//      hostlists expand exactly as Slurm expands them, Slurm's node order is kept, and tasks are
//      placed where Slurm really runs them: from Slurm's PMIx task map (srun --mpi=pmix), else by
//      SLURM_DISTRIBUTION (block, cyclic, plane, arbitrary); TF assumes block order. Each task
//      checks its placement against SLURMD_NODENAME / SLURM_LOCALID: a task the layout would put
//      on another node is a ConfigError naming it, never a silently wrong address)
//   4. plain MPI: the first --num-ps world ranks are PS, the rest workers
// Every resolver is a pure function of an Env snapshot, the options and ProcessInfo (facts about the
// process that need MPI or the devices), so all of them are unit-tested without MPI.
// Errors are ConfigError with one line naming the bad input.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/cluster/cluster_spec.h"
#include "strata/common/env.h"

namespace strata::cluster {

enum class ResolverKind { kAuto, kExplicit, kTfConfig, kSlurm, kMpi };
const char* to_string(ResolverKind kind);
ResolverKind parse_resolver_kind(std::string_view text);  // auto|explicit|tfconfig|slurm|mpi

// A jobs spec: ordered (job, count) pairs, e.g. "ps=1,worker=3". Ranks are assigned to jobs in the
// order written (TensorFlow sorts job names; with the usual names the result is the same).
using JobsSpec = std::vector<std::pair<std::string, int>>;
JobsSpec parse_jobs_spec(std::string_view text);  // throws ConfigError
std::string format_jobs_spec(const JobsSpec& jobs);

struct ResolveOptions {
  ResolverKind resolver = ResolverKind::kAuto;
  std::string cluster;                     // --cluster FILE|JSON (STRATA_CLUSTER when empty)
  JobsSpec jobs;                           // --jobs; empty: every task is a worker
  int port_base = 8888;                    // --port-base
  std::optional<int> gpus_per_node;        // --gpus-per-node (default: detected)
  std::optional<int> gpus_per_task;        // --gpus-per-task (default: gpus_per_node / max tasks per node)
  std::optional<int> tasks_per_node;       // --tasks-per-node (default: from Slurm)
  bool auto_set_gpu = true;                // --no-auto-set-gpu turns it off
  std::optional<std::string> rpc_layer;    // --rpc-layer
  std::optional<std::string> task_type;    // --task-type (overrides the resolved task)
  std::optional<int> task_id;              // --task-id
  std::optional<int> num_ps;               // --num-ps (MPI resolver; default STRATA_NUM_PS, else 0)
};

// Facts the resolvers cannot read from the environment.
struct ProcessInfo {
  int rank = -1;                        // world rank when known (MPI, or the launcher's variables)
  int size = -1;                        // world size when known
  std::vector<std::string> rank_hosts;  // host of every world rank (MPI resolver); may be empty
  std::string hostname;                 // this process's short host name
  int physical_gpus = 0;                // GPUs present on this node (device files)
};

struct ResolvedCluster {
  ResolverKind resolver = ResolverKind::kAuto;  // the resolver that produced it
  ClusterSpec cluster;
  TaskId task;                                   // invalid when no task could be determined
  std::string rpc_layer;                         // "" when none
  std::string environment;                       // TF_CONFIG "environment"
  std::string session_master;                    // TF_CONFIG "session_master"
  int num_gpus = 0;                              // num_accelerators()["GPU"]
  std::optional<std::string> cuda_visible_devices;  // what this task should use; nullopt: untouched

  // TensorFlow's master(): "<rpc_layer>://<address of the task>", else session_master, else "".
  std::string master() const;
  // The `strata cluster` JSON object (command-line contract: scripts parse it; keys are only added).
  std::string to_json() const;
};

// Rank hint from the launcher's environment before MPI is initialised: OMPI_COMM_WORLD_RANK,
// PMIX_RANK, PMI_RANK, SLURM_PROCID; -1 when none is set.
int launcher_rank_hint(const Env& env);
int launcher_size_hint(const Env& env);

// `source` names where file_or_json came from in messages: "--cluster" or "STRATA_CLUSTER".
ResolvedCluster resolve_explicit(const std::string& file_or_json, const Env& env, const ResolveOptions& options,
                                 const ProcessInfo& process, const std::string& source = "--cluster");
ResolvedCluster resolve_tf_config(const std::string& tf_config, const Env& env,
                                  const ResolveOptions& options, const ProcessInfo& process);
ResolvedCluster resolve_slurm(const Env& env, const ResolveOptions& options, const ProcessInfo& process);
ResolvedCluster resolve_mpi(const Env& env, const ResolveOptions& options, const ProcessInfo& process);

// Which resolver `resolve` will use (kAuto is decided here).
ResolverKind choose_resolver(const Env& env, const ResolveOptions& options);
// Runs the chosen resolver and applies --task-type/--task-id, then validates the task against the
// cluster (type present, index in range).
ResolvedCluster resolve(const Env& env, const ResolveOptions& options, const ProcessInfo& process);

// Number of GPUs the process can see: the physical count, narrowed by CUDA_VISIBLE_DEVICES.
int visible_gpus(const Env& env, int physical_gpus);
// Counts /dev/nvidia<N> device files (no driver call, so it is safe without a GPU).
int count_physical_gpus();

}  // namespace strata::cluster
