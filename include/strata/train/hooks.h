// Hooks around the training loop, in the shape of TensorFlow's tf.estimator.SessionRunHook.
//
// Order of calls (train_and_evaluate, one process):
//   begin(ctx)                 every rank (PS, workers, evaluator), before variables are created;
//                              ctx.role says which. Hooks that need a per-rank resource for the
//                              whole job (the trace file) make it here.
//   after_create_session(ctx)  training workers: variables materialised (and restored); ctx.step,
//                              ctx.global_step and ctx.position hold where training resumes.
//   before_run(ctx)            training workers, before each step's compute (its input batch is
//                              already fetched; the loop ends without a call when input runs out).
//   after_run(ctx, values)     training workers, after each step (the step's checkpoint boundary
//                              is already passed: values.outcome says whether it saved, failed or
//                              was a preemption save).
//   end(ctx)                   training workers, after the last step, after the final checkpoint
//                              and after every worker's pushes are applied (ctx.summary is filled).
// Hooks run in list order: the built-ins (default_hooks) first, then TrainSpec::hooks.
// A hook stops training with ctx.request_stop(); the loop checks it after every after_run round,
// and once after after_create_session (a resumed job that already reached its last step).
// Collectives: a hook may call collectives over the workers only if every worker runs the same
// hooks (the built-ins do). Threading: every call is on the thread that called train_and_evaluate.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "strata/cluster/runtime.h"
#include "strata/common/trace.h"
#include "strata/strategy/parameter_server_strategy.h"
#include "strata/train/model.h"
#include "strata/train/run_config.h"

namespace strata::train {

// What the job reached, filled before end() (training workers).
struct TrainSummary {
  double train_s = 0;                 // this worker's time in the loop
  double wall_s_at_end = 0;           // seconds since train_and_evaluate started
  std::int64_t examples = 0;          // this worker's examples
  double job_examples_per_sec = 0;    // sum over workers
  double last_loss = 0;               // mean loss of this worker's last step
  bool preempted = false;             // a preemption save stopped training (exit 75)
  bool save_failed = false;           // a failed save stopped training (exit 1)
  // Update staleness over every worker's steps (async / staleness:N only).
  bool staleness_tracked = false;
  std::int64_t staleness_sum = 0, staleness_count = 0, staleness_max = 0;  // this worker
  long long job_staleness_sum = 0, job_staleness_count = 0, job_staleness_max = 0;
  // When the job saves checkpoints: per worker (index = worker index), how long the saves taken
  // during training paused it, in total and the longest one (PsClient::save_pauses).
  std::vector<double> save_pause_s, save_pause_max_s;
  // Filled by the profiler hook when it runs (comm_fraction < 0: not measured).
  double comm_fraction = -1;
  std::vector<double> ps_busy_fraction;
};

// The state of one process's training session, shared with every hook. Fields are written by the
// loop; hooks read them (and may request a stop).
// Everything evaluate_metrics measured: the loss and accuracy of every model, and the metrics its
// predictions allow (Model::prediction_kind): exact AUC, log loss, precision and recall of a
// binary classifier over the whole evaluated set (train/metrics.h), MAE and MSE of a regressor.
// Fields a model does not have stay NaN.
struct EvalMetrics {
  std::int64_t examples = 0;
  double loss = 0;
  double accuracy = 0;
  PredictionKind kind = PredictionKind::kNone;
  double auc = std::numeric_limits<double>::quiet_NaN();
  double log_loss = std::numeric_limits<double>::quiet_NaN();
  double precision = std::numeric_limits<double>::quiet_NaN();
  double recall = std::numeric_limits<double>::quiet_NaN();
  double mae = std::numeric_limits<double>::quiet_NaN();
  double mse = std::numeric_limits<double>::quiet_NaN();
};

struct RunContext {
  const RunConfig* config = nullptr;
  const Runtime* runtime = nullptr;
  ParameterServerStrategy* strategy = nullptr;  // constructed, materialised from after_create_session on
  StrategyOptions strategy_options;             // what the strategy was built with
  const Model* model = nullptr;                 // null on PS ranks
  std::vector<Variable> variables;              // the model's variables (workers), creation order
  std::vector<DynamicVariable> dynamic_variables;  // the model's dynamic tables (workers), creation order
  // With dynamic tables, the summary hook leaves its JSON line here instead of printing it: the
  // training loop adds the PS ranks' table statistics ("dynamic"), which exist only once they
  // stopped serving (after strategy.finish()), and prints the line then.
  std::string deferred_summary;
  Role role = Role::kWorker;
  bool is_chief = false;
  std::string model_label;                      // "mlp", "softmax", "wide_deep" or the user's name
  std::string data_label;                       // what the training data is called (summary)
  int epochs = 0;                               // epochs this job trains for
  std::int64_t max_steps = -1;                  // TrainSpec::max_steps
  // Where training is: this worker's steps, the job's global step (as of this worker's last
  // increment), the current epoch (0-based) and the position saved with checkpoints.
  std::int64_t step = 0;
  std::int64_t global_step = 0;
  int epoch = 0;
  ps::WorkerPosition position;
  ps::WorkerPosition resumed_from;              // zeros when starting fresh
  bool resumed = false;                         // a checkpoint was restored
  // Every worker's replicas ("gpu:0,1" / "cpu:K") in worker order, and their kind ("cpu", "gpu",
  // "mixed"); known from after_create_session on.
  std::vector<std::string> worker_devices;
  std::string devices_kind;
  double start_time = 0;                        // clock_s() at train_and_evaluate's start
  // Set by the trace hook: the replicas' spans go there (null: no trace).
  TraceWriter* trace = nullptr;
  TrainSummary summary;
  // The evaluation the chief runs at the end (summary hook): accuracy, mean loss on the eval set.
  std::function<double(double* loss)> evaluate;
  // The same evaluation with every metric the model's predictions allow (AUC, ...); when set, the
  // summary hook uses it instead of `evaluate`.
  std::function<EvalMetrics()> evaluate_all;

  void request_stop() { stop_requested_ = true; }
  bool stop_requested() const { return stop_requested_; }
  // Seconds since train_and_evaluate started.
  double elapsed() const;
  // The steady clock in seconds: the clock of start_time and elapsed().
  static double clock_s();

 private:
  bool stop_requested_ = false;
};

// One step as the loop saw it (training worker).
struct RunValues {
  std::int64_t step = 0;          // this worker's steps so far (this one included)
  std::int64_t global_step = 0;   // after this step's increment
  int epoch = 0;                  // 0-based
  int batch_size = 0;             // examples in this worker's batch
  double loss = 0;                // mean over the batch
  std::int64_t correct = 0;
  StepOutcome outcome;            // this step's checkpoint boundary
  // Timings of the first replica (seconds): pull, compute, all-reduce + push, input, whole step.
  double pull_s = 0, compute_s = 0, push_s = 0, input_s = 0, step_s = 0;
  // The logging window (RunConfig::log_step_count_steps / _secs): on a log step the loop sets
  // log_step and the window's aggregates, and starts a new window after the hooks ran.
  bool log_step = false;
  double window_loss = 0;               // mean loss over the window
  double window_accuracy = 0;
  double window_examples_per_sec = 0;   // this worker's
};

class SessionRunHook {
 public:
  virtual ~SessionRunHook() = default;
  virtual void begin(RunContext& /*ctx*/) {}
  virtual void after_create_session(RunContext& /*ctx*/) {}
  virtual void before_run(RunContext& /*ctx*/) {}
  virtual void after_run(RunContext& /*ctx*/, const RunValues& /*values*/) {}
  virtual void end(RunContext& /*ctx*/) {}
};

using HookList = std::vector<std::shared_ptr<SessionRunHook>>;

// ---- built-in hooks (what `strata train` prints and writes) ----

// A failed checkpoint save under --on-save-error stop: says so (chief) and stops training.
class CheckpointSaverHook : public SessionRunHook {
 public:
  void after_run(RunContext& ctx, const RunValues& values) override;
};

// Stops each worker after `max_steps` of its own steps (TrainSpec::max_steps; TF's StopAtStepHook
// with num_steps). Also stops at once a resumed worker that is already past it.
class StopAtStepHook : public SessionRunHook {
 public:
  explicit StopAtStepHook(std::int64_t max_steps) : max_steps_(max_steps) {}
  void after_create_session(RunContext& ctx) override;
  void after_run(RunContext& ctx, const RunValues& values) override;

 private:
  std::int64_t max_steps_;
};

// A preemption save (SIGTERM/SIGUSR1 anywhere in the job): says so (chief) and stops training;
// the process then exits with kExitPreempted (75).
class PreemptionHook : public SessionRunHook {
 public:
  void after_run(RunContext& ctx, const RunValues& values) override;
};

// The chief's start-up lines (model, workers, replicas, transport; resume point) and a progress
// line every logging window.
class LoggingHook : public SessionRunHook {
 public:
  void after_create_session(RunContext& ctx) override;
  void after_run(RunContext& ctx, const RunValues& values) override;
};

// The chief's progress records, one JSON line per logging window, to a file it creates.
class MetricsJsonlHook : public SessionRunHook {
 public:
  explicit MetricsJsonlHook(std::string path);
  ~MetricsJsonlHook() override;
  void after_create_session(RunContext& ctx) override;
  void after_run(RunContext& ctx, const RunValues& values) override;

 private:
  struct File;
  std::string path_;
  std::unique_ptr<File> file_;
};

// A Chrome-trace timeline, one file per rank (`path` with ".rank<r>" before ".json" when the job
// has several ranks); the replicas record step/pull/compute/push spans through ctx.trace.
class TraceHook : public SessionRunHook {
 public:
  explicit TraceHook(std::string path) : path_(std::move(path)) {}
  ~TraceHook() override;
  void begin(RunContext& ctx) override;
  void end(RunContext& ctx) override;

 private:
  std::string path_;
  std::unique_ptr<TraceWriter> writer_;
};

// Each worker's split of a step between compute and communication, and (chief) each PS's
// utilisation; fills ctx.summary.comm_fraction and ps_busy_fraction.
class ProfilerHook : public SessionRunHook {
 public:
  void after_run(RunContext& ctx, const RunValues& values) override;
  void end(RunContext& ctx) override;

 private:
  double pull_ = 0, compute_ = 0, push_ = 0, input_ = 0, total_ = 0;
  std::int64_t steps_ = 0;
};

// The chief evaluates the final model on the eval set and prints the job's JSON summary line
// (docs/MODELS.md, "The summary's metrics"): its last line.
class SummaryHook : public SessionRunHook {
 public:
  void end(RunContext& ctx) override;
};

// The built-in hooks a RunConfig asks for, in the order they run: checkpoint saver, preemption,
// stop at step, logging, metrics, trace, profiler, summary.
HookList default_hooks(const RunConfig& config, const TrainSpec& train_spec);

}  // namespace strata::train
