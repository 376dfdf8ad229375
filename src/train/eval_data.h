// The evaluation set as the training layer reads it, and the pass that evaluates it; private to
// the training layer.
//
// An EvalData is either a dataset in memory (EvalSpec::input_fn) or a stream (EvalSpec::stream)
// that every evaluation reads again, a chunk at a time. Both are evaluated in batches of
// kEvalBatch rows in order, so a stream in whole-batch chunks gives the batches, and therefore the
// metrics, of the same rows in memory bit for bit. Not thread-safe: one evaluating thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "strata/data/dataset.h"
#include "strata/train/hooks.h"
#include "strata/train/metrics.h"
#include "strata/train/model.h"
#include "strata/train/run_config.h"

namespace strata::train {

class EvalData {
 public:
  EvalData() = default;
  explicit EvalData(data::Dataset set) : set_(std::move(set)) {}
  explicit EvalData(EvalStreamFn stream) : stream_(std::move(stream)) {}

  bool streamed() const { return static_cast<bool>(stream_); }
  // The set in memory (empty when streamed).
  const data::Dataset& set() const { return set_; }

  // Calls fn(chunk, batches_left) for each chunk in order (the set in memory is one chunk), until
  // max_batches batches of kEvalBatch were covered (max_batches <= 0: every row); batches_left is
  // what remains of max_batches when that chunk starts (<= 0: unbounded). A stream whose chunk
  // before the last is not whole batches is an Error naming the chunk (its batches would differ
  // from the set's).
  void for_each_chunk(std::int64_t max_batches,
                      const std::function<void(const data::Dataset& chunk, std::int64_t batches_left)>& fn) const;

 private:
  data::Dataset set_;
  EvalStreamFn stream_;
};

// Loss, accuracy and (with predictions) the metrics a model's predictions allow, summed over the
// chunks of one evaluation in order.
class MetricsPass {
 public:
  MetricsPass(const Model& model, bool predictions);
  // Evaluates the first max_batches batches of kEvalBatch of `ds` (all when max_batches <= 0) with
  // `params`; returns how many batches that was.
  std::int64_t add(const Params& params, const data::Dataset& ds, std::int64_t max_batches);
  EvalMetrics result() const;

 private:
  const Model& model_;
  bool predictions_;
  EvalMetrics m_;
  std::int64_t correct_ = 0;
  double loss_ = 0;
  BinaryClassificationMetrics bin_;
  RegressionMetrics reg_;
  bool binary_seen_ = false, regression_seen_ = false;
  std::vector<float> scores_, labels_;
};

// Every metric of `model` on `eval` (the first max_batches batches; 0: all), with the parameters
// params_for(chunk, batches_left) gives for each chunk (the same object may be returned each time,
// updated: it is read before the next call).
EvalMetrics evaluate_chunks(const Model& model, const EvalData& eval, std::int64_t max_batches, bool predictions,
                            const std::function<const Params&(const data::Dataset& chunk, std::int64_t batches_left)>& params_for);

}  // namespace strata::train
