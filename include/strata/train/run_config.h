// The training layer's configuration, in the shape of TensorFlow's Estimator API:
//
//   RunConfig  (tf.estimator.RunConfig)  where and how the job runs: model_dir and the checkpoint
//              schedule, logging, the strategy's options (optimizer, consistency, transport,
//              placement, replicas), timeouts. The cluster itself comes from TF_CONFIG, Slurm or
//              plain MPI at bootstrap (strata/cluster/resolve.h); RunConfig only carries the hints those
//              resolvers take (jobs, num_ps).
//   TrainSpec  (tf.estimator.TrainSpec)  the training input and when to stop, plus user hooks.
//   EvalSpec   (tf.estimator.EvalSpec)   the evaluation input, and how the evaluator task paces
//              itself (start_delay_secs, throttle_secs) and which checkpoint it keeps as best.
//
// RunConfig::from_environment() gives the defaults `strata train` uses, read from the environment
// table (common/env.h): STRATA_TRANSPORT, STRATA_CPU_REPLICAS, STRATA_PS_THREADS,
// STRATA_PS_MAX_ARENA_BYTES, STRATA_STALL_TIMEOUT_S, STRATA_PROGRESS_TIMEOUT_S,
// STRATA_ON_SAVE_ERROR, STRATA_EVALUATOR_NICE, STRATA_NUM_PS / STRATA_JOBS. The command line then overrides single fields.
// STRATA_MPIIO_HINTS is only validated here (ConfigError); the checkpoint writers read it themselves.
// Plain value types: copyable, no thread-safety concerns.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/group.h"
#include "strata/common/env.h"
#include "strata/cluster/resolve.h"
#include "strata/data/dataset.h"
#include "strata/strategy/parameter_server_strategy.h"

namespace strata {
class Env;
}

namespace strata::train {

class SessionRunHook;

// Process exit statuses (docs/RELIABILITY.md, "What the launchers do"; the same as kExitPreempted in
// common/signals.h).
inline constexpr int kStatusOk = 0;
inline constexpr int kStatusFailure = 1;  // a runtime failure (a failed save under stop)
inline constexpr int kStatusUsage = 2;    // a configuration error, agreed by every rank
inline constexpr int kStatusPreempted = 75;

struct RunConfig {
  // ---- model_dir and checkpoints (TF: model_dir, save_checkpoints_*, keep_checkpoint_*) ----
  std::string model_dir;                     // "" = no checkpoints (--checkpoint-dir)
  std::int64_t save_checkpoints_steps = 0;   // also save every N global steps (0: off)
  double save_checkpoints_secs = 0;          // and/or every T seconds (0: off)
  int keep_checkpoint_max = 5;               // 0: keep all
  double keep_checkpoint_every_n_hours = 0;  // 0: off
  bool stop_on_save_error = true;            // --on-save-error stop|continue
  std::string restore;                       // "" none, "latest" (model_dir's newest valid), or a path
  bool expect_partial = false;
  bool allow_unverified_restore = false;     // --allow-unverified: format 1 files may be restored

  // ---- logging (TF: log_step_count_steps) ----
  int log_step_count_steps = 100;    // progress line every N steps of the chief (0: off)
  double log_step_count_secs = 10;   // and/or every T seconds (0: off)
  std::string metrics_path;          // chief: progress records as JSONL ("" = none)
  std::string trace_path;            // Chrome trace, one file per rank ("" = none)
  bool profile = false;              // compute/communication split and PS utilisation

  // ---- cluster hints (the cluster itself is resolved at bootstrap) ----
  int num_ps = -1;                   // MPI/Slurm resolvers: first N ranks are PS (-1: STRATA_NUM_PS)
  cluster::JobsSpec jobs;            // ordered roles, e.g. ps=1,worker=2,evaluator=1 (empty: num_ps)

  // ---- strategy ----
  std::string optimizer;             // "" = the model's default (Model::default_optimizer)
  double learning_rate = 0;          // 0 = the optimizer's (or the model's) default
  std::string consistency = "async";
  std::string transport = "auto";
  std::string placement = "round_robin";
  std::string shard = "auto";        // input auto-shard policy
  int global_batch = 128;            // examples per worker step, split over its replicas
  int cpu_replicas = 1;
  int ps_threads = 1;
  std::int64_t dynamic_full_every = 8;  // dynamic tables: every Kth save full, deltas between
  std::uint64_t max_arena_bytes = 0; // 0: no cap
  DevicePolicy devices = DevicePolicy::kAuto;
  std::uint64_t seed = 1;            // initializers, shuffles, synthetic data

  // The communicator the job runs on (MPI_COMM_NULL: MPI_COMM_WORLD); it is dup'ed, never used.
  MPI_Comm world = MPI_COMM_NULL;
  // Or the process group of ranks that are not an MPI job (strata/comm/group.h: the in-process
  // group of the inproc test tier): the runtime is bootstrapped over it (comm::bootstrap_over),
  // `world` is ignored, and there is no liveness monitor (its heartbeats are MPI messages) and no
  // checkpoint directory (checkpoints are parallel HDF5).
  std::shared_ptr<comm::Group> group;

  // ---- timeouts ----
  double timeout_s = kDefaultTimeoutS;  // each wait for another rank (--timeout / STRATA_TIMEOUT_S)
  double stall_timeout_s = 10;       // liveness: no heartbeat this long = stopped
  double progress_timeout_s = 120;   // liveness: a training worker frozen while others move (0: off)
  std::int64_t restarts = 0;         // STRATA_RESTART_COUNT: relaunches by the launcher ("restarts" in the summary)

  // ---- the evaluator task ----
  // Nice increment of the evaluator's evaluating thread (STRATA_EVALUATOR_NICE; 0: unchanged). The
  // evaluator is a sidecar: where it shares a node's cores with trainers (one workstation, or a
  // task packed beside workers), its evaluations take only the CPU the training leaves idle.
  int evaluator_nice = 10;

  // The defaults `strata train` starts from: the fields above, with the environment variables
  // listed at the top of this file applied. ConfigError naming the variable on a bad value.
  static RunConfig from_environment(const Env& env);

  // The strategy's checkpoint options for this configuration.
  CheckpointOptions checkpoint_options() const;
};

// A dataset built on demand, on the ranks that need it (workers for training; the chief and the
// evaluator for evaluation). A ConfigError it throws (missing file, bad format) is agreed between
// the ranks and reported in one line (TrainResult::error).
using InputFn = std::function<data::Dataset()>;

struct TrainSpec {
  InputFn input_fn;                 // the training set; every worker reads its shard of it
  // Set to read the training data as a stream instead (files larger than memory): its batches
  // train, and input_fn then gives only a sample of the data, which the model is built from
  // (shapes) and which stands in for the evaluation data when EvalSpec has none.
  StreamingInput stream;
  std::string data_name;            // what the data is called, for the summary line
  std::int64_t max_steps = -1;      // >= 0: stop each worker after this many of its own steps
  int epochs = 0;                   // passes over each worker's shard; 0: the model's default
  // User hooks, run after the built-in ones (hooks.h), on the training workers.
  std::vector<std::shared_ptr<SessionRunHook>> hooks;
};

// An evaluation set read a chunk at a time (evaluation files larger than a rank should hold):
// each call of the EvalStreamFn starts a pass over the whole set, and each call of the ChunkReader
// it returns replaces `chunk` with the next rows, returning false after the last. Every pass must
// give the same rows in the same order, in chunks that are whole batches of kEvalBatch rows (all
// but the last), so that a streamed evaluation reads exactly the batches of the whole set. Called
// on the evaluating rank's thread only. An Error or ConfigError it throws ends that evaluation
// (the chief's: the job, naming it; the evaluator's: that checkpoint's evaluation, reported).
inline constexpr std::int64_t kEvalBatch = 1000;
using ChunkReader = std::function<bool(data::Dataset& chunk)>;
using EvalStreamFn = std::function<ChunkReader()>;

struct EvalSpec {
  InputFn input_fn;                 // the evaluation set (chief's final evaluation, evaluator task)
  // Set: the evaluation set is streamed instead (input_fn is then unused): every evaluation reads
  // it again, so its memory is a chunk's, plus a binary classifier's score and label of every row
  // for its AUC (9 bytes a row, twice that while the AUC is computed) and the rows of dynamic
  // tables one chunk (the evaluator: the whole set) reads.
  EvalStreamFn stream;
  std::int64_t steps = 0;           // evaluate at most this many batches of 1000 (0: all of it)
  double start_delay_secs = 0;      // evaluator: wait this long before the first evaluation
  double throttle_secs = 0;         // evaluator: at least this long between evaluations (the
                                    // final checkpoint is always evaluated at once)
  // accuracy (higher is better) | loss (lower is better) | auc (higher; binary classifiers only)
  std::string best_metric = "accuracy";
};

}  // namespace strata::train
