// The evaluation set and its pass: see eval_data.h.
#include "train/eval_data.h"

#include <string>

#include "strata/common/error.h"

namespace strata::train {

void EvalData::for_each_chunk(std::int64_t max_batches,
                              const std::function<void(const data::Dataset&, std::int64_t)>& fn) const {
  if (!stream_) {
    fn(set_, max_batches);
    return;
  }
  ChunkReader next = stream_();
  data::Dataset chunk;
  std::int64_t batches = 0, rows = 0, index = 0, start = 0;
  bool ragged = false;  // the previous chunk ended inside a batch: it must have been the last
  while ((max_batches <= 0 || batches < max_batches) && next(chunk)) {
    if (ragged)
      throw Error("evaluation stream: chunk " + std::to_string(index - 1) + " (" + std::to_string(rows - start) +
                  " rows from row " + std::to_string(start) + ") is not whole batches of " + std::to_string(kEvalBatch) +
                  " rows and is not the last");
    if (chunk.size <= 0) continue;
    fn(chunk, max_batches <= 0 ? 0 : max_batches - batches);
    start = rows;
    batches += (chunk.size + kEvalBatch - 1) / kEvalBatch;
    rows += chunk.size;
    ragged = chunk.size % kEvalBatch != 0;
    ++index;
  }
}

MetricsPass::MetricsPass(const Model& model, bool predictions) : model_(model), predictions_(predictions) {
  m_.kind = model.prediction_kind();
}

std::int64_t MetricsPass::add(const Params& params, const data::Dataset& ds, std::int64_t max_batches) {
  const int width = model_.prediction_width();
  const bool binary =
      predictions_ && m_.kind == PredictionKind::kBinaryProbability && width == 1 && !ds.labels.empty();
  const bool regression = predictions_ && m_.kind == PredictionKind::kRegression && width == 1 && !ds.targets.empty();
  binary_seen_ = binary_seen_ || binary;
  regression_seen_ = regression_seen_ || regression;
  std::vector<std::int64_t> all(static_cast<std::size_t>(ds.size));
  for (std::int64_t i = 0; i < ds.size; ++i) all[static_cast<std::size_t>(i)] = i;
  data::BatchIterator it(ds, all, static_cast<int>(kEvalBatch), false, 2);
  data::Batch batch;
  std::int64_t batches = 0;
  while ((max_batches <= 0 || batches < max_batches) && it.next(batch)) {
    const Inputs in = inputs_of(batch);
    const StepResult r = model_.step(params, in, nullptr);
    loss_ += r.loss * batch.size;
    correct_ += r.correct;
    m_.examples += batch.size;
    ++batches;
    if ((binary || regression) && batch.size > 0) {
      scores_.resize(static_cast<std::size_t>(batch.size));
      if (!model_.predict(params, in, scores_.data())) continue;
      if (binary) {
        labels_.assign(batch.labels.begin(), batch.labels.end());
        bin_.add(scores_.data(), labels_.data(), scores_.size());
      } else {
        reg_.add(scores_.data(), batch.targets.data(), scores_.size());
      }
    }
  }
  return batches;
}

EvalMetrics MetricsPass::result() const {
  EvalMetrics m = m_;
  m.loss = m.examples ? loss_ / static_cast<double>(m.examples) : 0;
  m.accuracy = m.examples ? static_cast<double>(correct_) / static_cast<double>(m.examples) : 0;
  if (binary_seen_ && bin_.size() > 0) {
    const BinaryClassificationResult r = bin_.result();
    m.auc = r.auc;
    m.log_loss = r.log_loss;
    m.precision = r.precision;
    m.recall = r.recall;
  }
  if (regression_seen_ && m.examples > 0) {
    const RegressionResult r = reg_.result();
    m.mae = r.mean_absolute_error;
    m.mse = r.mean_squared_error;
  }
  return m;
}

EvalMetrics evaluate_chunks(const Model& model, const EvalData& eval, std::int64_t max_batches, bool predictions,
                            const std::function<const Params&(const data::Dataset&, std::int64_t)>& params_for) {
  MetricsPass pass(model, predictions);
  eval.for_each_chunk(max_batches, [&](const data::Dataset& chunk, std::int64_t batches_left) {
    pass.add(params_for(chunk, batches_left), chunk, batches_left);
  });
  return pass.result();
}

}  // namespace strata::train
