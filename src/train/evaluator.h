// The evaluator task (TF's sidecar evaluation), private to the training layer.
//
// Protocol with the chief, on the job's runtime communicator, tag kEvaluatorTag: once training is
// over and the final checkpoint is committed (or the job stopped), the chief sends each evaluator
// one JSON message {"status": exit status of the job, "final": the final checkpoint or ""}. The
// evaluator polls for it between looks at model_dir; nothing else of the workers involves it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/cluster/runtime.h"
#include "strata/comm/group.h"
#include "strata/data/dataset.h"
#include "strata/train/model.h"
#include "strata/train/run_config.h"
#include "train/eval_data.h"

namespace strata::train {

inline constexpr int kEvaluatorTag = 0x5e7a;

struct EvaluatorOptions {
  std::string model_dir;
  EvalSpec eval_spec;
  comm::Group* group = nullptr;   // where the chief's message arrives (the runtime's group)
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
// final one always. A model with dynamic tables is evaluated with each table's state at the
// checkpoint's step, read from its dynamic-<step>.h5 chain in model_dir (a row the table lacks reads
// as zeros, as the in-job evaluation's inference lookups read it); a checkpoint whose tables have
// no intact state at its step is skipped with one line, like a damaged dense file. Writes
// <model_dir>/eval.jsonl and <model_dir>/best/ (the best checkpoint's file, and its tables' chain
// when the model has dynamic tables). A streamed `eval` is read twice per evaluation: once for the
// ids its dynamic tables need (their rows are then read from the chain once), once to evaluate.
// Not collective.
EvaluatorOutcome run_evaluator(const Model& model, const EvalData& eval, const EvaluatorOptions& opts);

// The ids of each dynamic table `vars[d]` that evaluating `ds` reads (its first max_batches batches
// of 1000, every batch when max_batches <= 0, as evaluate_metrics reads it), sorted and unique. The
// in-job evaluation looks them up on the PS; the evaluator task reads them from the checkpoint's
// tables, so both evaluate the same rows.
std::vector<std::vector<std::int64_t>> eval_rows_needed(const Model& model, const std::vector<std::string>& vars,
                                                        const data::Dataset& ds, std::int64_t max_batches);
// The same over every chunk of `eval` (a stream is read once for it), merged.
std::vector<std::vector<std::int64_t>> eval_rows_needed(const Model& model, const std::vector<std::string>& vars,
                                                        const EvalData& eval, std::int64_t max_batches);

// Chief: tells every evaluator rank that training is over. Waits (at most timeout_s, then a
// TimeoutError naming the evaluator ranks) until each message is delivered.
void notify_evaluators(const Runtime& runtime, comm::Group& group, const std::string& final_checkpoint, int status,
                       double timeout_s);

}  // namespace strata::train
