// Unit tests of the streamed evaluation set (src/train/eval_data.h, EvalSpec::stream): a CSV
// evaluation set read in chunks of whole batches, with each chunk's dynamic-table rows only, gives
// the metrics of the same rows held in memory bit for bit (also when --eval-steps ends it inside a
// chunk); the rows the evaluator reads for a stream are those of the set; a chunk that is not
// whole batches before the last is refused, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "strata/common/error.h"
#include "strata/data/csv.h"
#include "strata/data/feature_column.h"
#include "strata/nn/estimator.h"
#include "strata/nn/graph_model.h"
#include "strata/train/train_and_evaluate.h"
#include "train/eval_data.h"
#include "train/evaluator.h"

namespace strata::train {
namespace {

using strata::testing::Contains;

// label = [x1 - 0.5 x2 + w(c) + noise > 0], c one of 40 ids with a weight of +-1 each.
std::string write_csv(int rows, std::uint64_t seed) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string path = ::testing::TempDir() + "strata_evalstream_" + info->name() + ".csv";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << "label,x1,x2,c\n";
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::normal_distribution<double> noise(0.0, 0.5);
  for (int r = 0; r < rows; ++r) {
    const double x1 = u(gen), x2 = u(gen);
    const int c = static_cast<int>(gen() % 40);
    const double w = c % 2 ? 1.0 : -1.0;
    out << (x1 - 0.5 * x2 + w + noise(gen) > 0 ? 1 : 0) << "," << x1 << "," << x2 << ",id" << c << "\n";
  }
  return path;
}

// A DNN classifier over x1, x2 and a dynamic embedding of c, its data planned on `path`.
struct EvalCase {
  std::string path;
  data::CsvOptions csv;
  std::unique_ptr<data::FeatureTransform> transform;
  data::Dataset set;
  std::unique_ptr<nn::GraphModel> model;
  std::vector<std::string> dynamic;  // the model's dynamic tables

  explicit EvalCase(int rows) : path(write_csv(rows, 17)) {
    nn::EstimatorConfig config;
    config.kind = nn::EstimatorKind::kDNNClassifier;
    config.scope = "s";
    config.seed = 3;
    config.dnn_feature_columns = {data::numeric_column("x1"), data::numeric_column("x2"),
                                  data::embedding_column(data::categorical_column_with_dynamic_hash("c"), 4)};
    config.hidden_units = {8};
    data::LabelSpec label;
    csv.header = data::CsvHeader::kPresent;
    csv.columns = data::csv_columns_for(nn::input_columns(config), label);
    const data::CsvTable table = data::read_csv({path}, csv);
    transform = std::make_unique<data::FeatureTransform>(nn::input_columns(config), label, table);
    set = transform->apply(table);
    model = nn::make_estimator(config, transform->layout());
    for (const auto& d : model->dynamic_variables()) dynamic.push_back(d.name);
  }

  // The file in chunks of `rows` rows through the plan.
  EvalStreamFn stream(std::int64_t rows) const {
    return [this, rows]() -> ChunkReader {
      auto s = std::make_shared<data::CsvStream>(std::vector<std::string>{path}, csv);
      return [this, s, rows](data::Dataset& chunk) {
        data::CsvTable t;
        if (!s->next(t, rows)) return false;
        chunk = transform->apply(t);
        return true;
      };
    };
  }

  // The dense variables, and the rows `ids` of each dynamic table, each a function of its id (as a
  // table that holds every id would give them).
  Params params(const std::vector<std::vector<std::int64_t>>& ids) const {
    Params p = nn::init_local_params(*model);
    for (std::size_t d = 0; d < dynamic.size(); ++d) {
      model::SparseParam& sp = p.sparse[dynamic[d]];
      sp.width = 4;
      sp.rows = ids[d];
      sp.values.clear();
      for (std::int64_t id : sp.rows)
        for (int j = 0; j < 4; ++j)
          sp.values.push_back(static_cast<float>(static_cast<std::uint64_t>(id) % 1009 + j) / 1009.0f - 0.5f);
    }
    return p;
  }
};

void expect_same(const EvalMetrics& a, const EvalMetrics& b) {
  EXPECT_EQ(a.examples, b.examples);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.accuracy, b.accuracy);
  EXPECT_EQ(a.auc, b.auc);
  EXPECT_EQ(a.log_loss, b.log_loss);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.recall, b.recall);
}

TEST(EvalStream, ChunksWithTheirOwnRowsGiveTheMetricsOfTheSetBitForBit) {
  const EvalCase s(5500);  // 5 whole batches and one of 500
  ASSERT_EQ(s.dynamic.size(), 1u);
  for (std::int64_t steps : {0, 3, 6, 9}) {
    SCOPED_TRACE("steps " + std::to_string(steps));
    const Params whole = s.params(eval_rows_needed(*s.model, s.dynamic, s.set, steps));
    const EvalMetrics in_memory = evaluate_metrics(*s.model, whole, s.set, steps);
    EXPECT_EQ(in_memory.examples, steps == 0 || steps == 6 || steps == 9 ? 5500 : 3000);
    EXPECT_GT(in_memory.auc, 0.5);
    for (std::int64_t chunk_rows : {1000, 2000, 64000}) {
      SCOPED_TRACE("chunks of " + std::to_string(chunk_rows));
      const EvalData streamed(s.stream(chunk_rows));
      int chunks = 0;
      Params p = s.params({{}});
      const EvalMetrics m = evaluate_chunks(*s.model, streamed, steps, true,
                                            [&](const data::Dataset& chunk, std::int64_t left) -> const Params& {
                                              ++chunks;
                                              p = s.params(eval_rows_needed(*s.model, s.dynamic, chunk, left));
                                              return p;
                                            });
      expect_same(m, in_memory);
      const std::int64_t batches = steps == 0 ? 6 : std::min<std::int64_t>(steps, 6);
      EXPECT_EQ(chunks, (batches * 1000 + chunk_rows - 1) / chunk_rows);
      // The evaluator's way: the ids of every chunk first, then the same parameters throughout.
      const std::vector<std::vector<std::int64_t>> ids = eval_rows_needed(*s.model, s.dynamic, streamed, steps);
      EXPECT_EQ(ids, eval_rows_needed(*s.model, s.dynamic, s.set, steps));
      const Params all = s.params(ids);
      expect_same(evaluate_chunks(*s.model, streamed, steps, true,
                                  [&](const data::Dataset&, std::int64_t) -> const Params& { return all; }),
                  in_memory);
    }
  }
  // Without predictions: the loss and accuracy of evaluate_params.
  const Params whole = s.params(eval_rows_needed(*s.model, s.dynamic, s.set, 0));
  double loss = 0;
  const double accuracy = evaluate_params(*s.model, whole, s.set, &loss, 0);
  const EvalMetrics m = evaluate_chunks(*s.model, EvalData(s.stream(2000)), 0, false,
                                        [&](const data::Dataset&, std::int64_t) -> const Params& { return whole; });
  EXPECT_EQ(m.accuracy, accuracy);
  EXPECT_EQ(m.loss, loss);
  EXPECT_TRUE(std::isnan(m.auc));
}

TEST(EvalStream, AChunkThatIsNotWholeBatchesBeforeTheLastIsRefused) {
  const EvalCase s(3000);
  const Params p = s.params(eval_rows_needed(*s.model, s.dynamic, s.set, 0));
  auto same = [&p](const data::Dataset&, std::int64_t) -> const Params& { return p; };
  // 1500 + 1500: the first chunk ends inside a batch.
  try {
    evaluate_chunks(*s.model, EvalData(s.stream(1500)), 0, true, same);
    ADD_FAILURE() << "a ragged chunk before the last was taken";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.message(), "evaluation stream: chunk 0 (1500 rows from row 0) is not whole batches of 1000 "
                                      "rows and is not the last"));
  }
  // A ragged last chunk is the set's own last batch: taken.
  const EvalCase t(2500);
  const Params q = t.params(eval_rows_needed(*t.model, t.dynamic, t.set, 0));
  expect_same(evaluate_chunks(*t.model, EvalData(t.stream(2000)), 0, true,
                              [&q](const data::Dataset&, std::int64_t) -> const Params& { return q; }),
              evaluate_metrics(*t.model, q, t.set, 0));
}

}  // namespace
}  // namespace strata::train
