// train_and_evaluate: TensorFlow's tf.estimator.train_and_evaluate for strata.
//
//   strata::MpiSession mpi(&argc, &argv);
//   strata::train::RunConfig config = strata::train::RunConfig::from_environment(env);
//   config.model_dir = "/scratch/run1";
//   auto result = strata::train::train_and_evaluate(model, config, train_spec, eval_spec);
//   return result.status;
//
// Every rank of the job calls it with the same arguments; what a rank does follows its task
// (TF_CONFIG, Slurm, or plain MPI; strata/cluster/resolve.h):
//   ps         serves the variables until the workers are done (and takes part in checkpoints);
//   chief/worker  trains: its shard of TrainSpec::input_fn, its replicas splitting each batch,
//              checkpoints at RunConfig's schedule, hooks (hooks.h) around every step; the chief
//              evaluates the final model on EvalSpec::input_fn and prints the summary line;
//   evaluator  joins no worker group and no worker collective: it watches model_dir for newly
//              committed checkpoints, reads each one (never one being written: only files named
//              in checkpoint.json, verified first), evaluates it, appends a line to
//              <model_dir>/eval.jsonl and prints an `eval` line, keeps a copy of the best one in
//              <model_dir>/best/, and stops after evaluating the final checkpoint, whose name the
//              chief sends it when training ends. When it falls behind it evaluates the newest
//              and says how many it skipped.
// Collective over the whole job: setup (bootstrap, configuration verdict, materialisation) and
// teardown involve every rank; every wait there has a deadline (RunConfig::timeout_s) naming the
// missing ranks, and liveness heartbeats end the job within stall_timeout_s when a rank stops.
// The evaluator's wait for the end of training is bounded by the training itself (liveness).
// MPI must be initialised (a strata::MpiSession) before the call.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "strata/data/dataset.h"
#include "strata/train/hooks.h"
#include "strata/train/model.h"
#include "strata/train/run_config.h"

namespace strata::train {

struct TrainResult {
  int status = kStatusOk;        // what the process should exit with
  Role role = Role::kWorker;
  // A configuration error every rank agreed on (status 2): the message, and whether this rank
  // is the one that should print it (one line for the whole job).
  std::string error;
  bool report_error = false;
  std::int64_t global_step = 0;  // workers: the job's global step at the end
  std::string final_checkpoint;  // workers/evaluator: the final checkpoint ("" when none)
  int checkpoints_evaluated = 0; // evaluator
};

// Builds the model once the training set is known (input width, classes); called on workers and
// on the evaluator, after TrainSpec::input_fn. A ConfigError it throws is agreed and reported.
using ModelFn = std::function<std::unique_ptr<Model>(const data::Dataset& train)>;

// Collective over the job (see above). Throws strata::Error subclasses for runtime failures
// (the caller ends the job: abort_job), never for agreed configuration errors.
TrainResult train_and_evaluate(const ModelFn& make_model, const RunConfig& config, const TrainSpec& train_spec,
                               const EvalSpec& eval_spec);
// The same with a model the caller built (it must not depend on the data's shape); the caller
// keeps ownership.
TrainResult train_and_evaluate(Model& model, const RunConfig& config, const TrainSpec& train_spec,
                               const EvalSpec& eval_spec);

// Evaluates `model` with `params` on `dataset` in batches of 1000 (at most max_batches; 0: all),
// single-threaded on the calling thread: accuracy, and the mean loss in *loss.
double evaluate_params(const Model& model, const Params& params, const data::Dataset& dataset, double* loss,
                       std::int64_t max_batches = 0);

// evaluate_params with every metric (the same batches, one pass: step() for loss and accuracy,
// predict() for the rest).
EvalMetrics evaluate_metrics(const Model& model, const Params& params, const data::Dataset& dataset,
                             std::int64_t max_batches = 0);

}  // namespace strata::train
