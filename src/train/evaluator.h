// The evaluator task (TF's sidecar evaluation), private to the training layer.
//
// Protocol with the chief, on the job's runtime communicator, tag kEvaluatorTag: once training is
// over and the final checkpoint is committed (or the job stopped), the chief sends each evaluator
// one JSON message {"status": exit status of the job, "final": the final checkpoint or ""}. The
// evaluator polls for it between looks at model_dir; nothing else of the workers involves it.
#pragma once

#include <mpi.h>

#include <string>

#include "strata/cluster/runtime.h"
#include "strata/data/dataset.h"
#include "strata/train/model.h"
#include "strata/train/run_config.h"

namespace strata::train {

inline constexpr int kEvaluatorTag = 0x5e7a;

struct EvaluatorOptions {
  std::string model_dir;
  EvalSpec eval_spec;
  MPI_Comm comm = MPI_COMM_NULL;  // where the chief's message arrives
  int chief_rank = 0;
  double poll_s = 0.2;            // how often model_dir is looked at
};

struct EvaluatorOutcome {
  int status = 0;                 // the job's status, as the chief sent it
  std::string final_checkpoint;   // the last checkpoint evaluated ("" when none)
  int evaluated = 0;
};

// Evaluator rank: watches opts.model_dir until the chief's message, evaluating each newly
// committed checkpoint (the newest when several are new, saying how many it skipped), and the
// final one always. Writes <model_dir>/eval.jsonl and <model_dir>/best/. Not collective.
EvaluatorOutcome run_evaluator(const Model& model, const data::Dataset& eval, const EvaluatorOptions& opts);

// Chief: tells every evaluator rank that training is over. Waits (at most timeout_s, then a
// TimeoutError naming the evaluator ranks) until each message is delivered.
void notify_evaluators(const Runtime& runtime, MPI_Comm comm, const std::string& final_checkpoint, int status,
                       double timeout_s);

}  // namespace strata::train
