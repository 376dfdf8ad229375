// Unit tests of the canned estimators (strata/nn/estimator.h) and the JSON model file
// (strata/nn/model_spec.h).
//
// Every estimator is built from a small CSV table through the feature columns and takes a step
// whose gradients match the variables' shapes; the column rules (bare categorical in a DNN, DLRM
// dimensions, the linear bias) hold; each estimator trained in-process on data with a planted
// answer learns it (AUC / MSE asserted well past chance). Model-spec parsing: every member's
// errors name the file and the member path; the csv member builds the right CsvOptions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "strata/common/error.h"
#include "strata/data/csv.h"
#include "strata/data/feature_column.h"
#include "strata/model/model.h"
#include "strata/nn/estimator.h"
#include "strata/nn/graph_model.h"
#include "strata/nn/model_spec.h"
#include "strata/train/metrics.h"

namespace strata::nn {
namespace {

using strata::testing::Contains;

std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "strata_est_" + info->test_suite_name() + "_" + info->name() + "_" + name;
}

// Planted data: label = [x1 - 0.5 x2 + w(c1) + 0.3 noise > 0] with w(a, b, c) = +1 and
// w(d, e, f) = -1; cls (3 classes) = label + [x2 > 0.3]; y = 2 x1 - x2 + w(c1) + 0.1 noise.
// c2 is a nuisance id (hashed). The Bayes AUC is about 0.97; chance is 0.5.
std::string write_planted_csv(const std::string& name, int rows, std::uint64_t seed) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << "label,cls,x1,x2,c1,c2,y\n";
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::normal_distribution<double> noise(0.0, 1.0);
  const char* cats[] = {"a", "b", "c", "d", "e", "f"};
  for (int r = 0; r < rows; ++r) {
    const double x1 = u(gen), x2 = u(gen);
    const int c = static_cast<int>(gen() % 6);
    const int c2 = static_cast<int>(gen() % 50);
    const double w = c < 3 ? 1.0 : -1.0;
    const int label = x1 - 0.5 * x2 + w + 0.3 * noise(gen) > 0 ? 1 : 0;
    const int cls = label + (x2 > 0.3 ? 1 : 0);
    const double y = 2 * x1 - x2 + w + 0.1 * noise(gen);
    out << label << "," << cls << "," << x1 << "," << x2 << "," << cats[c] << ",k" << c2 << "," << y << "\n";
  }
  return path;
}

data::FeatureColumn x1() { return data::numeric_column("x1"); }
data::FeatureColumn x2() { return data::numeric_column("x2"); }
data::FeatureColumn c1() {
  return data::categorical_column_with_vocabulary_list("c1", {"a", "b", "c", "d", "e", "f"});
}
data::FeatureColumn c2() { return data::categorical_column_with_hash_bucket("c2", 64); }

// One estimator over one CSV: the transform planned on the training file, both sets applied.
struct Fixture {
  EstimatorConfig config;
  data::LabelSpec label;
  std::unique_ptr<data::FeatureTransform> transform;
  data::Dataset train, eval;
  std::unique_ptr<GraphModel> model;

  Fixture(EstimatorConfig cfg, data::LabelSpec lab, const std::string& train_csv, const std::string& eval_csv)
      : config(std::move(cfg)), label(std::move(lab)) {
    data::CsvOptions opt;
    opt.header = data::CsvHeader::kPresent;
    opt.columns = data::csv_columns_for(input_columns(config), label);
    const data::CsvTable table = data::read_csv({train_csv}, opt);
    transform = std::make_unique<data::FeatureTransform>(input_columns(config), label, table);
    train = transform->apply(table);
    eval = transform->apply(data::read_csv({eval_csv}, opt));
    model = make_estimator(config, transform->layout());
  }
};

train::Inputs slice(const data::Dataset& d, std::int64_t first, int n) {
  train::Inputs in;
  in.size = n;
  in.dense = d.dense_dim > 0 ? d.features.data() + first * d.dense_dim : nullptr;
  in.dense_dim = d.dense_dim;
  in.sparse_ids = d.num_fields > 0 ? d.sparse_ids.data() + first * d.num_fields : nullptr;
  in.num_fields = d.num_fields;
  in.labels = d.labels.empty() ? nullptr : d.labels.data() + first;
  in.targets = d.targets.empty() ? nullptr : d.targets.data() + first;
  in.first_example = first;
  return in;
}

std::int64_t elements(const ps::Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// One step's gradients: one per trainable variable, dense ones of the variable's size, sparse ones
// [rows, width] over exactly rows_needed, every value finite.
void expect_gradient_shapes(const GraphModel& m, const train::Params& p, const train::Inputs& in) {
  train::Grads g;
  const train::StepResult r = m.step(p, in, &g);
  EXPECT_TRUE(std::isfinite(r.loss));
  const auto sparse = m.sparse_variables();
  const std::set<std::string> sparse_set(sparse.begin(), sparse.end());
  std::size_t n_dense = 0;
  for (const auto& v : m.variables()) {
    if (sparse_set.count(v.name)) {
      ASSERT_TRUE(g.sparse.count(v.name)) << v.name;
      const model::SparseParam& s = g.sparse.at(v.name);
      ASSERT_EQ(v.shape.size(), 2u) << v.name;
      EXPECT_EQ(s.width, v.shape[1]) << v.name;
      EXPECT_EQ(s.values.size(), s.rows.size() * static_cast<std::size_t>(s.width)) << v.name;
      std::vector<std::int64_t> want = m.rows_needed(v.name, in), got = s.rows;
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, want) << v.name;
      for (float x : s.values) ASSERT_TRUE(std::isfinite(x)) << v.name;
    } else {
      ++n_dense;
      ASSERT_TRUE(g.dense.count(v.name)) << v.name;
      EXPECT_EQ(static_cast<std::int64_t>(g.dense.at(v.name).value.size()), elements(v.shape)) << v.name;
      for (float x : g.dense.at(v.name).value) ASSERT_TRUE(std::isfinite(x)) << v.name;
    }
  }
  EXPECT_EQ(g.dense.size(), n_dense);
  EXPECT_EQ(g.sparse.size(), sparse.size());
}

bool has_variable(const GraphModel& m, const std::string& name, const ps::Shape& shape) {
  for (const auto& v : m.variables())
    if (v.name == name) return v.shape == shape;
  return false;
}

EstimatorConfig config_of(EstimatorKind kind) {
  EstimatorConfig c;
  c.kind = kind;
  c.scope = "est";
  c.seed = 5;
  switch (kind) {
    case EstimatorKind::kLinearClassifier:
    case EstimatorKind::kLinearRegressor:
      c.linear_feature_columns = {x1(), x2(), c1(), data::indicator_column(c2())};
      break;
    case EstimatorKind::kDNNClassifier:
    case EstimatorKind::kDNNRegressor:
      c.dnn_feature_columns = {x1(), x2(), data::embedding_column(c1(), 4), data::indicator_column(c2())};
      c.hidden_units = {16, 8};
      break;
    case EstimatorKind::kDNNLinearCombinedClassifier:
    case EstimatorKind::kDNNLinearCombinedRegressor:
      c.linear_feature_columns = {c1(), data::crossed_column({"c1", "c2"}, 256)};
      c.dnn_feature_columns = {x1(), x2(), data::embedding_column(c1(), 4, data::Combiner::kSum)};
      c.hidden_units = {16};
      break;
    case EstimatorKind::kDLRM:
      c.dnn_feature_columns = {x1(), x2(), data::embedding_column(c1(), 4), data::embedding_column(c2(), 4)};
      c.bottom_units = {8, 4};
      c.hidden_units = {16};
      break;
  }
  return c;
}

data::LabelSpec label_of(EstimatorKind kind) {
  data::LabelSpec l;
  if (is_regressor(kind)) {
    l.key = "y";
    l.regression = true;
    l.num_classes = 0;
  }
  return l;
}

const EstimatorKind kAllKinds[] = {
    EstimatorKind::kLinearClassifier,           EstimatorKind::kLinearRegressor,
    EstimatorKind::kDNNClassifier,              EstimatorKind::kDNNRegressor,
    EstimatorKind::kDNNLinearCombinedClassifier, EstimatorKind::kDNNLinearCombinedRegressor,
    EstimatorKind::kDLRM,
};

// ---- building ------------------------------------------------------------------------------------

TEST(Estimator, EveryKindBuildsAndStepsWithGradientsOfTheVariablesShapes) {
  const std::string csv = write_planted_csv("t.csv", 200, 1);
  for (EstimatorKind kind : kAllKinds) {
    SCOPED_TRACE(to_string(kind));
    Fixture f(config_of(kind), label_of(kind), csv, csv);
    EXPECT_EQ(f.model->name(), to_string(kind));
    EXPECT_EQ(f.model->loss(), is_regressor(kind) ? Loss::kMeanSquaredError : Loss::kSigmoidCrossEntropy);
    EXPECT_EQ(f.model->prediction_width(), 1);
    for (const auto& v : f.model->variables()) EXPECT_EQ(v.name.rfind("est/", 0), 0u) << v.name;
    const train::Params p = init_local_params(*f.model);
    expect_gradient_shapes(*f.model, p, slice(f.train, 0, 32));
    // The estimator's documented defaults.
    const bool linear = kind == EstimatorKind::kLinearClassifier || kind == EstimatorKind::kLinearRegressor;
    EXPECT_EQ(f.model->default_optimizer(), linear ? "ftrl" : "adagrad");
    EXPECT_EQ(f.model->default_epochs(), 10);
    if (linear) {
      EXPECT_DOUBLE_EQ(f.model->default_learning_rate(), 0.2);  // min(0.2, 1/sqrt(4))
    }
    EXPECT_EQ(parse_estimator_kind(to_string(kind), "what"), kind);
  }
}

TEST(Estimator, MultiClassHeadIsASoftmaxOverNClasses) {
  const std::string csv = write_planted_csv("t.csv", 100, 2);
  EstimatorConfig c = config_of(EstimatorKind::kDNNClassifier);
  c.n_classes = 3;
  data::LabelSpec l;
  l.key = "cls";
  l.num_classes = 3;
  Fixture f(c, l, csv, csv);
  EXPECT_EQ(f.model->loss(), Loss::kSoftmaxCrossEntropy);
  EXPECT_EQ(f.model->prediction_width(), 3);
  EXPECT_TRUE(has_variable(*f.model, "est/dnn/logits/kernel", {8, 3}));
  expect_gradient_shapes(*f.model, init_local_params(*f.model), slice(f.train, 0, 20));
}

TEST(Estimator, LinearBiasIsItsOwnVariableOnlyWithoutDenseTerms) {
  const std::string csv = write_planted_csv("t.csv", 50, 3);
  EstimatorConfig c;
  c.kind = EstimatorKind::kLinearClassifier;
  c.scope = "lin";
  c.linear_feature_columns = {c1(), c2()};
  Fixture only_ids(c, {}, csv, csv);
  EXPECT_TRUE(has_variable(*only_ids.model, "lin/linear/bias/bias", {1}));
  // The per-id weights are PS-held tables [vocabulary, 1] starting at zero (TF's linear model).
  const auto sparse = only_ids.model->sparse_variables();
  EXPECT_EQ(sparse.size(), 2u);
  EXPECT_TRUE(has_variable(*only_ids.model, "lin/linear/c1/embeddings", {6, 1}));
  EXPECT_TRUE(has_variable(*only_ids.model, "lin/linear/c2/embeddings", {64, 1}));
  const train::Params p = init_local_params(*only_ids.model);
  for (float v : p.sparse.at("lin/linear/c1/embeddings").values) EXPECT_EQ(v, 0.0f);
  expect_gradient_shapes(*only_ids.model, p, slice(only_ids.train, 0, 16));

  c.linear_feature_columns = {x1(), c1()};
  Fixture with_numeric(c, {}, csv, csv);
  for (const auto& v : with_numeric.model->variables()) EXPECT_EQ(v.name.find("linear/bias/"), std::string::npos) << v.name;
  EXPECT_TRUE(has_variable(*with_numeric.model, "lin/linear/dense/bias", {1}));
  EXPECT_TRUE(has_variable(*with_numeric.model, "lin/linear/dense/kernel", {1, 1}));
}

TEST(Estimator, ColumnRulesAreConfigErrorsNamingTheColumn) {
  const std::string csv = write_planted_csv("t.csv", 50, 4);
  auto build_error = [&](EstimatorConfig c, data::LabelSpec l = {}) -> std::string {
    try {
      Fixture f(std::move(c), std::move(l), csv, csv);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  // A bare categorical column cannot feed a DNN (TF requires embedding or indicator around it).
  EstimatorConfig dnn = config_of(EstimatorKind::kDNNClassifier);
  dnn.dnn_feature_columns.push_back(c2());
  std::string e = build_error(dnn);
  EXPECT_TRUE(Contains(e, "DNNClassifier"));
  EXPECT_TRUE(Contains(e, "'c2'"));
  EXPECT_TRUE(Contains(e, "embedding or indicator"));
  // ... nor the DNN part of a combined model.
  EstimatorConfig wd = config_of(EstimatorKind::kDNNLinearCombinedClassifier);
  wd.dnn_feature_columns.push_back(c2());
  EXPECT_TRUE(Contains(build_error(wd), "'c2'"));

  // DLRM: the bottom MLP's last width must equal the embedding dimension ...
  EstimatorConfig dlrm = config_of(EstimatorKind::kDLRM);
  dlrm.bottom_units = {8, 3};
  e = build_error(dlrm);
  EXPECT_TRUE(Contains(e, "DLRM"));
  EXPECT_TRUE(Contains(e, "bottom MLP's last width (3)"));
  EXPECT_TRUE(Contains(e, "embedding dimension (4)"));
  // ... every embedding has one dimension ...
  dlrm = config_of(EstimatorKind::kDLRM);
  dlrm.dnn_feature_columns[3] = data::embedding_column(c2(), 6);
  EXPECT_TRUE(Contains(build_error(dlrm), "got 4 and 6"));
  // ... indicator columns do not enter, and numeric and embedding columns are both needed.
  dlrm = config_of(EstimatorKind::kDLRM);
  dlrm.dnn_feature_columns.push_back(data::indicator_column(c1()));
  EXPECT_TRUE(Contains(build_error(dlrm), "cannot feed a DLRM"));
  dlrm = config_of(EstimatorKind::kDLRM);
  dlrm.dnn_feature_columns = {data::embedding_column(c1(), 4)};
  EXPECT_TRUE(Contains(build_error(dlrm), "at least one numeric column"));
  dlrm = config_of(EstimatorKind::kDLRM);
  dlrm.dnn_feature_columns = {x1()};
  EXPECT_TRUE(Contains(build_error(dlrm), "at least one embedding column"));
  dlrm = config_of(EstimatorKind::kDLRM);
  dlrm.bottom_units.clear();
  EXPECT_TRUE(Contains(build_error(dlrm), "bottom_units is empty"));

  // Sizes and empty parts.
  EstimatorConfig bad = config_of(EstimatorKind::kDNNClassifier);
  bad.hidden_units = {16, 0};
  EXPECT_TRUE(Contains(build_error(bad), "hidden_units must be positive, got 0"));
  bad = config_of(EstimatorKind::kDNNClassifier);
  bad.dropout = 1.0;
  EXPECT_TRUE(Contains(build_error(bad), "dropout must be in [0, 1)"));
  bad = config_of(EstimatorKind::kDNNClassifier);
  bad.n_classes = 1;
  EXPECT_TRUE(Contains(build_error(bad), "n_classes must be >= 2, got 1"));
  bad = config_of(EstimatorKind::kDNNLinearCombinedClassifier);
  bad.linear_feature_columns.clear();
  EXPECT_TRUE(Contains(build_error(bad), "no linear feature columns"));

  // A column the layout does not have (the transform was planned without it).
  EstimatorConfig planned = config_of(EstimatorKind::kDNNClassifier);
  data::CsvOptions opt;
  opt.header = data::CsvHeader::kPresent;
  opt.columns = data::csv_columns_for(input_columns(planned), {});
  const data::CsvTable table = data::read_csv({csv}, opt);
  const data::FeatureTransform t(input_columns(planned), {}, table);
  planned.dnn_feature_columns.push_back(data::numeric_column("y"));
  try {
    (void)make_estimator(planned, t.layout());
    ADD_FAILURE() << "a column outside the layout was accepted";
  } catch (const ConfigError& err) {
    EXPECT_TRUE(Contains(err.what(), "column 'y' is not in the data's layout"));
  }
}

TEST(Estimator, ScopesKeepTwoEstimatorsApartAndInputColumnsAreDeduplicated) {
  const std::string csv = write_planted_csv("t.csv", 50, 5);
  EstimatorConfig a = config_of(EstimatorKind::kDNNLinearCombinedClassifier);
  // x1 in both parts of the combined model: it is transformed once (by name; c1 and
  // c1_embedding are two columns).
  a.linear_feature_columns.push_back(x1());
  EstimatorConfig b = a;
  b.scope = "other";
  std::vector<std::string> names;
  for (const auto& c : input_columns(a)) names.push_back(c.name());
  EXPECT_EQ(names, (std::vector<std::string>{"c1", "c1_X_c2", "x1", "x2", "c1_embedding"}));
  Fixture fa(a, {}, csv, csv), fb(b, {}, csv, csv);
  EXPECT_NO_THROW(check_disjoint_variables(*fa.model, *fb.model));
  EXPECT_THROW(check_disjoint_variables(*fa.model, *fa.model), ConfigError);
  try {
    (void)parse_estimator_kind("DNNClasifier", "spec.json: estimator");
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), "spec.json: estimator: 'DNNClasifier' is not one of LinearClassifier"));
  }
}

// ---- learning ------------------------------------------------------------------------------------

struct Learned {
  double auc = 0;
  double mse = 0;
  double target_variance = 0;
};

// Plain SGD over the training set for `epochs`, then the held-out set through predict().
Learned train_and_measure(Fixture& f, int epochs, float lr) {
  train::Params p = init_local_params(*f.model);
  train::Grads g;
  const int batch = 32;
  for (int e = 0; e < epochs; ++e)
    for (std::int64_t first = 0; first + batch <= f.train.size; first += batch) {
      train::Inputs in = slice(f.train, first, batch);
      in.step = e * 1000 + first / batch;
      f.model->step(p, in, &g);
      model::sgd_apply_local(p, g, lr);
    }
  std::vector<float> scores(static_cast<std::size_t>(f.eval.size));
  EXPECT_TRUE(f.model->predict(p, slice(f.eval, 0, static_cast<int>(f.eval.size)), scores.data()));
  Learned out;
  if (!f.eval.labels.empty() && !is_regressor(f.config.kind)) {
    std::vector<double> s(scores.begin(), scores.end());
    std::vector<std::uint8_t> l(f.eval.labels.begin(), f.eval.labels.end());
    out.auc = train::exact_auc(s.data(), l.data(), s.size());
  } else {
    double mean = 0;
    for (float t : f.eval.targets) mean += t;
    mean /= static_cast<double>(f.eval.size);
    for (std::size_t i = 0; i < scores.size(); ++i) {
      const double d = scores[i] - f.eval.targets[i];
      out.mse += d * d;
      out.target_variance += (f.eval.targets[i] - mean) * (f.eval.targets[i] - mean);
    }
    out.mse /= static_cast<double>(f.eval.size);
    out.target_variance /= static_cast<double>(f.eval.size);
  }
  return out;
}

TEST(EstimatorLearning, ClassifiersReachAPlantedAucFarAboveChance) {
  const std::string train_csv = write_planted_csv("train.csv", 3000, 11);
  const std::string eval_csv = write_planted_csv("eval.csv", 1000, 12);
  for (EstimatorKind kind : {EstimatorKind::kLinearClassifier, EstimatorKind::kDNNClassifier,
                             EstimatorKind::kDNNLinearCombinedClassifier, EstimatorKind::kDLRM}) {
    SCOPED_TRACE(to_string(kind));
    EstimatorConfig c = config_of(kind);
    if (kind == EstimatorKind::kDNNLinearCombinedClassifier)
      c.linear_feature_columns = {x1(), x2(), c1(), data::crossed_column({"c1", "c2"}, 256)};
    Fixture f(c, {}, train_csv, eval_csv);
    const Learned r = train_and_measure(f, 4, 0.1f);
    // Chance is 0.5 and the planted model's Bayes AUC about 0.97.
    EXPECT_GT(r.auc, 0.9);
    std::printf("%s: held-out AUC %.4f\n", to_string(kind), r.auc);
  }
}

TEST(EstimatorLearning, RegressorsFitAPlantedTarget) {
  const std::string train_csv = write_planted_csv("train.csv", 3000, 13);
  const std::string eval_csv = write_planted_csv("eval.csv", 1000, 14);
  for (EstimatorKind kind : {EstimatorKind::kLinearRegressor, EstimatorKind::kDNNRegressor,
                             EstimatorKind::kDNNLinearCombinedRegressor}) {
    SCOPED_TRACE(to_string(kind));
    EstimatorConfig c = config_of(kind);
    if (kind == EstimatorKind::kDNNLinearCombinedRegressor) c.linear_feature_columns = {x1(), x2(), c1()};
    Fixture f(c, label_of(kind), train_csv, eval_csv);
    const Learned r = train_and_measure(f, 4, 0.05f);
    // Predicting the mean scores the target's variance (about 2.7); the noise floor is 0.01.
    EXPECT_GT(r.target_variance, 2.0);
    EXPECT_LT(r.mse, 0.1 * r.target_variance);
    std::printf("%s: held-out MSE %.4f (target variance %.4f)\n", to_string(kind), r.mse, r.target_variance);
  }
}

// ---- model spec ----------------------------------------------------------------------------------

const char* kWideDeep = R"({
  "estimator": "DNNLinearCombinedClassifier",
  "label": "label",
  "scope": "ctr",
  "csv": {"delimiter": ",", "header": true},
  "linear_feature_columns": [{"type": "hash_bucket", "key": "c2", "hash_bucket_size": 64},
                             {"type": "crossed", "keys": ["c1", "c2"], "hash_bucket_size": 256}],
  "dnn_feature_columns": [{"type": "numeric", "key": "x1"},
                          {"type": "embedding", "dimension": 4,
                           "categorical": {"type": "vocabulary_list", "key": "c1",
                                           "vocabulary": ["a", "b", "c", "d", "e", "f"]}}],
  "dnn_hidden_units": [16, 8],
  "dnn_dropout": 0.1,
  "dnn_activation": "tanh",
  "optimizer": "adagrad", "learning_rate": 0.1, "epochs": 3, "batch_size": 64, "seed": 9
})";

TEST(ModelSpec, ParsesAWideAndDeepFileIntoItsEstimator) {
  const ModelSpec s = parse_model_spec(kWideDeep, "spec.json");
  EXPECT_EQ(s.estimator.kind, EstimatorKind::kDNNLinearCombinedClassifier);
  EXPECT_EQ(s.estimator.scope, "ctr");
  EXPECT_EQ(s.estimator.linear_feature_columns.size(), 2u);
  EXPECT_EQ(s.estimator.dnn_feature_columns.size(), 2u);
  EXPECT_EQ(s.estimator.dnn_feature_columns[1].kind, data::ColumnKind::kEmbedding);
  EXPECT_EQ(s.estimator.hidden_units, (std::vector<int>{16, 8}));
  EXPECT_DOUBLE_EQ(s.estimator.dropout, 0.1);
  EXPECT_EQ(s.estimator.activation, Activation::kTanh);
  EXPECT_EQ(s.estimator.n_classes, 2);
  EXPECT_EQ(s.estimator.seed, 9u);
  EXPECT_EQ(s.label.key, "label");
  EXPECT_FALSE(s.label.regression);
  EXPECT_EQ(s.optimizer, "adagrad");
  EXPECT_DOUBLE_EQ(s.learning_rate, 0.1);
  EXPECT_EQ(s.epochs, 3);
  EXPECT_EQ(s.batch_size, 64);
  EXPECT_EQ(s.csv.delimiter, ',');
  EXPECT_EQ(s.csv.header, data::CsvHeader::kPresent);
  // The columns read: the label (int64), then each key in first-use order with its type.
  std::vector<std::string> names;
  for (const auto& c : s.csv.columns) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"label", "c2", "c1", "x1"}));
  EXPECT_EQ(s.csv.columns[0].type, data::CsvType::kInt64);
  EXPECT_EQ(s.csv.columns[3].type, data::CsvType::kFloat);

  // The spec trains as it is on a CSV with those columns.
  const std::string csv = write_planted_csv("t.csv", 100, 6);
  const data::CsvTable table = data::read_csv({csv}, s.csv);
  const data::FeatureTransform t(input_columns(s.estimator), s.label, table);
  const auto m = make_estimator(s.estimator, t.layout());
  const data::Dataset d = t.apply(table);
  expect_gradient_shapes(*m, init_local_params(*m), slice(d, 0, 32));
}

// The shipped example specs: their "for_keys" elements stand for one column per Criteo field.
TEST(ModelSpec, ShippedExampleSpecsParse) {
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/examples/specs/";
  const ModelSpec wd = load_model_spec(dir + "criteo_wide_deep.json");
  EXPECT_EQ(wd.estimator.kind, EstimatorKind::kDNNLinearCombinedClassifier);
  ASSERT_EQ(wd.estimator.linear_feature_columns.size(), 13u + 26u);
  ASSERT_EQ(wd.estimator.dnn_feature_columns.size(), 13u + 26u);
  EXPECT_EQ(wd.estimator.linear_feature_columns[12].name(), "I13_bucketized");
  EXPECT_EQ(wd.estimator.linear_feature_columns[13].name(), "C1");
  EXPECT_EQ(wd.estimator.linear_feature_columns[13].num_buckets, 100000);
  EXPECT_EQ(wd.estimator.dnn_feature_columns[0].name(), "I1_bucketized_embedding");
  EXPECT_EQ(wd.estimator.dnn_feature_columns[38].name(), "C26_embedding");
  EXPECT_EQ(wd.estimator.dnn_feature_columns[38].dimension, 8);
  // The same wide-and-deep with the wide part crossing the six field pairs synth-ctr plants.
  const ModelSpec wdx = load_model_spec(dir + "criteo_wide_deep_crossed.json");
  EXPECT_EQ(wdx.estimator.kind, EstimatorKind::kDNNLinearCombinedClassifier);
  ASSERT_EQ(wdx.estimator.linear_feature_columns.size(), 13u + 26u + 6u);
  EXPECT_EQ(wdx.estimator.linear_feature_columns[39].name(), "C1_X_C2");
  EXPECT_EQ(wdx.estimator.linear_feature_columns[44].name(), "C13_X_C14");
  EXPECT_EQ(wdx.estimator.linear_feature_columns[44].num_buckets, 10000);
  EXPECT_EQ(wdx.estimator.dnn_feature_columns.size(), 13u + 26u);
  const ModelSpec dlrm = load_model_spec(dir + "criteo_dlrm.json");
  EXPECT_EQ(dlrm.estimator.kind, EstimatorKind::kDLRM);
  EXPECT_EQ(dlrm.estimator.dnn_feature_columns.size(), 13u + 13u + 26u);
  // The same DLRM with its categorical columns dynamic (no buckets; the table's options).
  const ModelSpec dyn = load_model_spec(dir + "criteo_dlrm_dynamic.json");
  EXPECT_EQ(dyn.estimator.kind, EstimatorKind::kDLRM);
  ASSERT_EQ(dyn.estimator.dnn_feature_columns.size(), 13u + 13u + 26u);
  const data::FeatureColumn& c26 = dyn.estimator.dnn_feature_columns[51];
  EXPECT_EQ(c26.name(), "C26_embedding");
  ASSERT_TRUE(c26.categorical && c26.categorical->dynamic);
  EXPECT_EQ(c26.categorical->dynamic_options.capacity, 1048576);
  EXPECT_EQ(c26.vocabulary_size(), data::kDynamicVocabulary);
  EXPECT_FALSE(dyn.estimator.dnn_feature_columns[25].categorical->dynamic);  // I13's buckets
  const ModelSpec fm = load_model_spec(dir + "fashion_mnist_dnn.json");
  EXPECT_EQ(fm.estimator.kind, EstimatorKind::kDNNClassifier);
  ASSERT_EQ(fm.estimator.dnn_feature_columns.size(), 1u);
  EXPECT_EQ(fm.estimator.dnn_feature_columns[0].shape, 784);
  EXPECT_EQ(fm.estimator.n_classes, 10);
}

TEST(ModelSpec, EveryEstimatorsMembers) {
  const std::string cols = R"([{"type": "numeric", "key": "x1"},
      {"type": "embedding", "dimension": 4, "categorical": {"type": "hash_bucket", "key": "c2", "hash_bucket_size": 64}}])";
  ModelSpec s = parse_model_spec(R"({"estimator": "DLRM", "feature_columns": )" + cols +
                                     R"(, "bottom_units": [8, 4], "top_units": [16], "activation": "relu"})",
                                 "d.json");
  EXPECT_EQ(s.estimator.kind, EstimatorKind::kDLRM);
  EXPECT_EQ(s.estimator.bottom_units, (std::vector<int>{8, 4}));
  EXPECT_EQ(s.estimator.hidden_units, (std::vector<int>{16}));
  EXPECT_EQ(s.estimator.dnn_feature_columns.size(), 2u);

  s = parse_model_spec(R"({"estimator": "LinearRegressor", "label": "y", "feature_columns": )" + cols + "}", "l.json");
  EXPECT_EQ(s.estimator.linear_feature_columns.size(), 2u);
  EXPECT_TRUE(s.label.regression);
  EXPECT_EQ(s.label.key, "y");
  EXPECT_EQ(s.csv.columns[0].type, data::CsvType::kFloat);  // a regressor's label is a float

  s = parse_model_spec(R"({"estimator": "DNNClassifier", "n_classes": 5, "feature_columns": )" + cols +
                           R"(, "hidden_units": [3], "dropout": 0.5, "activation": "linear"})",
                       "c.json");
  EXPECT_EQ(s.estimator.n_classes, 5);
  EXPECT_EQ(s.label.num_classes, 5);
  EXPECT_EQ(s.estimator.activation, Activation::kNone);
  EXPECT_DOUBLE_EQ(s.estimator.dropout, 0.5);
}

TEST(ModelSpec, CsvMemberBuildsTheReadersOptions) {
  const std::string head = R"({"estimator": "LinearClassifier", "feature_columns": [{"type": "numeric", "key": "x1"},
      {"type": "hash_bucket", "key": "tags", "hash_bucket_size": 8}], "csv": )";
  // Criteo's layout: TSV, label + I1..I13 + C1..C26.
  ModelSpec s = parse_model_spec(head + R"({"layout": "criteo"}})", "s.json");
  EXPECT_EQ(s.csv.delimiter, '\t');
  ASSERT_EQ(s.csv.columns.size(), 40u);
  EXPECT_EQ(s.csv.columns[0].name, "label");
  EXPECT_EQ(s.csv.columns[1].name, "I1");
  EXPECT_EQ(s.csv.columns[39].name, "C26");
  // Tab, spelled either way; another single character.
  EXPECT_EQ(parse_model_spec(head + R"({"delimiter": "tab"}})", "s.json").csv.delimiter, '\t');
  EXPECT_EQ(parse_model_spec(head + R"({"delimiter": "\t"}})", "s.json").csv.delimiter, '\t');
  EXPECT_EQ(parse_model_spec(head + R"({"delimiter": ";"}})", "s.json").csv.delimiter, ';');
  // No header: "columns" lists the file's columns in order; unread ones are strings.
  s = parse_model_spec(head + R"({"header": false, "columns": ["x1", "skip", "label", "tags"],
                                  "separators": {"tags": "|"}}})",
                       "s.json");
  EXPECT_EQ(s.csv.header, data::CsvHeader::kAbsent);
  ASSERT_EQ(s.csv.columns.size(), 4u);
  EXPECT_EQ(s.csv.columns[0].name, "x1");
  EXPECT_EQ(s.csv.columns[0].type, data::CsvType::kFloat);
  EXPECT_EQ(s.csv.columns[1].name, "skip");
  EXPECT_EQ(s.csv.columns[1].type, data::CsvType::kString);
  EXPECT_EQ(s.csv.columns[2].type, data::CsvType::kInt64);
  EXPECT_EQ(s.csv.columns[3].separator, '|');

  // Such a file reads and trains: multi-valued tags split on '|'.
  const std::string path = temp_path("nohead.csv");
  {
    std::ofstream out(path);
    for (int i = 0; i < 40; ++i) out << (i % 3) * 0.5 << ",z," << (i % 2) << ",t" << i % 4 << "|u" << i % 5 << "\n";
  }
  const data::CsvTable table = data::read_csv({path}, s.csv);
  EXPECT_EQ(table.num_rows(), 40);
  EXPECT_EQ(table.max_values(table.column_index("tags")), 2);
  const data::FeatureTransform t(input_columns(s.estimator), s.label, table);
  const auto m = make_estimator(s.estimator, t.layout());
  const data::Dataset d = t.apply(table);
  expect_gradient_shapes(*m, init_local_params(*m), slice(d, 0, 40));
}

// ---- model spec: hostile files -------------------------------------------------------------------

std::string spec_error(const std::string& text, const std::string& origin = "spec.json") {
  try {
    (void)parse_model_spec(text, origin);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// kWideDeep with `member` replaced (or added, or removed when value is empty).
std::string wide_deep_with(const std::string& member, const std::string& value) {
  auto doc = std::string(kWideDeep);
  const std::string key = "\"" + member + "\":";
  const auto at = doc.find(key);
  if (at == std::string::npos) {
    doc.insert(1, key + " " + value + ",");
    return doc;
  }
  // The member's value ends at the next top-level ',' or the closing '}'.
  std::size_t end = at + key.size();
  int depth = 0;
  bool in_string = false;
  for (; end < doc.size(); ++end) {
    const char c = doc[end];
    if (in_string) {
      if (c == '\\') ++end;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') ++depth;
    else if (c == ']' || (c == '}' && depth > 0)) --depth;
    else if ((c == ',' || c == '}') && depth == 0) break;
  }
  if (value.empty()) {
    if (doc[end] == ',') ++end;
    doc.erase(at, end - at);
    return doc;
  }
  doc.replace(at, end - at, key + " " + value);
  return doc;
}

TEST(ModelSpecSecurity, EveryMembersErrorsNameTheFileAndTheMemberPath) {
  ASSERT_EQ(spec_error(kWideDeep), "(no error)");
  struct Case {
    std::string member, value, want;
  };
  const std::vector<Case> cases = {
      // unknown members and members of another estimator
      {"dnn_hiden_units", "[4]", "spec.json: dnn_hiden_units: unknown member for DNNLinearCombinedClassifier"},
      {"bottom_units", "[4]", "spec.json: bottom_units: unknown member for DNNLinearCombinedClassifier"},
      {"hidden_units", "[4]", "spec.json: hidden_units: unknown member"},
      {"feature_columns", "[]", "spec.json: feature_columns: unknown member"},
      // wrong types
      {"estimator", "7", "spec.json: estimator: expected a string, got 7"},
      {"estimator", "\"DNNClasifier\"", "spec.json: estimator: 'DNNClasifier' is not one of"},
      {"scope", "[]", "spec.json: scope: expected a string"},
      {"scope", "\"a b/c\"", "spec.json: scope: scope 'a b/c' is not a name segment"},
      {"label", "1", "spec.json: label: expected a string"},
      {"label", "\"\"", "spec.json: label: expected a column name"},
      {"dnn_hidden_units", "\"256\"", "spec.json: dnn_hidden_units: expected an array"},
      {"dnn_hidden_units", "[16, \"8\"]", "spec.json: dnn_hidden_units[1]: expected an integer"},
      {"dnn_hidden_units", "[16, 2.5]", "spec.json: dnn_hidden_units[1]: expected an integer"},
      {"dnn_dropout", "\"0.1\"", "spec.json: dnn_dropout: expected a number"},
      {"dnn_activation", "\"gelu\"", "spec.json: dnn_activation: 'gelu' is not relu"},
      {"optimizer", "1", "spec.json: optimizer: expected a string"},
      {"optimizer", "\"bogus\"", "spec.json: optimizer: 'bogus' is not one of sgd, momentum"},
      {"optimizer", "\"adam:beta9=1\"", "spec.json: optimizer: 'adam:beta9=1': unknown key 'beta9'"},
      {"epochs", "true", "spec.json: epochs: expected an integer"},
      {"seed", "-1", "spec.json: seed: expected an integer in [0,"},
      {"linear_feature_columns", "{}", "spec.json: linear_feature_columns: expected a non-empty array"},
      {"dnn_feature_columns", "[]", "spec.json: dnn_feature_columns: expected a non-empty array"},
      {"csv", "\"criteo\"", "spec.json: csv: expected an object"},
      // out of range
      {"dnn_hidden_units", "[16, 0]", "spec.json: dnn_hidden_units[1]: expected an integer in [1, 65536], got 0"},
      {"dnn_hidden_units", "[70000]", "spec.json: dnn_hidden_units[0]: expected an integer in [1, 65536]"},
      {"dnn_hidden_units", "[]", "spec.json: dnn_hidden_units: missing or empty"},
      {"dnn_hidden_units", "[18446744073709551615]", "spec.json: dnn_hidden_units[0]: expected an integer in"},
      {"dnn_dropout", "1", "spec.json: dnn_dropout: expected a number in [0, 1), got 1"},
      {"dnn_dropout", "-0.5", "spec.json: dnn_dropout: expected a number in [0, 1)"},
      {"n_classes", "1", "spec.json: n_classes: expected an integer in [2,"},
      {"learning_rate", "0", "spec.json: learning_rate: must be positive"},
      {"learning_rate", "1e300", "spec.json: learning_rate: expected a number in"},
      {"epochs", "0", "spec.json: epochs: expected an integer in [1,"},
      {"batch_size", "1e30", "spec.json: batch_size: expected an integer"},
      // missing required members
      {"estimator", "", "spec.json: estimator: missing"},
      {"linear_feature_columns", "", "spec.json: linear_feature_columns: missing"},
      {"dnn_feature_columns", "", "spec.json: dnn_feature_columns: missing"},
      {"dnn_hidden_units", "", "spec.json: dnn_hidden_units: missing or empty"},
      // inside the feature columns: the path goes through the member
      {"dnn_feature_columns", R"([{"type": "numeric", "key": "x1", "shape": 0}])",
       "spec.json: dnn_feature_columns[0].shape: expected an integer in [1, 65536], got 0"},
      {"linear_feature_columns", R"([{"type": "numeric", "key": "x1"}, {"type": "embedding", "dimension": 4,
          "categorical": {"type": "hash_bucket", "key": "c2", "hash_bucket_size": -5}}])",
       "spec.json: linear_feature_columns[1].categorical.hash_bucket_size: expected an integer in [1,"},
      {"linear_feature_columns", R"([{"type": "hash_bucket", "key": "c2", "hash_bucket_size": 5, "extra": 1}])",
       "spec.json: linear_feature_columns[0].extra"},
      {"dnn_feature_columns", R"([{"type": "numerik", "key": "x1"}])", "spec.json: dnn_feature_columns[0].type"},
      // inside csv
      {"csv", R"({"layout": "tsv"})", "spec.json: csv.layout: 'tsv' is not criteo"},
      {"csv", R"({"layout": "criteo", "delimiter": ","})", "spec.json: csv.delimiter: does not go with layout criteo"},
      {"csv", R"({"delimiter": "ab"})", "spec.json: csv.delimiter: expected one character"},
      {"csv", R"({"delimiter": "\""})", "spec.json: csv.delimiter: expected one character"},
      {"csv", R"({"header": "yes"})", "spec.json: csv.header: expected true or false"},
      {"csv", R"({"header": false})", "spec.json: csv.header: false needs \"columns\""},
      {"csv", R"({"columns": []})", "spec.json: csv.columns: expected a non-empty array"},
      {"csv", R"({"columns": ["label", 3]})", "spec.json: csv.columns[1]: expected a column name, got 3"},
      {"csv", R"({"columns": ["label", "label"]})", "spec.json: csv.columns[1]: column 'label' is listed twice"},
      {"csv", R"({"columns": ["label", "c1", "c2"]})", "spec.json: csv.columns: does not list column 'x1'"},
      {"csv", R"({"separators": {"c1": "||"}})", "spec.json: csv.separators.c1: expected one character"},
      {"csv", R"({"separators": {"c1": ","}})", "spec.json: csv.separators.c1: the separator must differ"},
      {"csv", R"({"separators": {"nope": "|"}})", "spec.json: csv.separators.nope: no column 'nope' is read"},
      {"csv", R"({"separators": ["|"]})", "spec.json: csv.separators: expected an object"},
      {"csv", R"({"quote": "'"})", "spec.json: csv.quote: unknown member"},
  };
  for (const Case& c : cases) {
    const std::string text = wide_deep_with(c.member, c.value);
    const std::string e = spec_error(text);
    EXPECT_TRUE(Contains(e, c.want)) << c.member << " = " << c.value;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // A regressor has no n_classes; the other estimators' lists are theirs alone.
  EXPECT_TRUE(Contains(spec_error(R"({"estimator": "DNNRegressor", "n_classes": 2})"),
                       "spec.json: n_classes: unknown member for DNNRegressor"));
  EXPECT_TRUE(Contains(spec_error(R"({"estimator": "LinearClassifier", "hidden_units": [2]})"),
                       "spec.json: hidden_units: unknown member for LinearClassifier"));
  EXPECT_TRUE(Contains(spec_error(R"({"estimator": "DLRM", "hidden_units": [2]})"),
                       "spec.json: hidden_units: unknown member for DLRM"));
  EXPECT_TRUE(Contains(spec_error(R"({"estimator": "DLRM", "feature_columns": [{"type": "numeric", "key": "x"}]})"),
                       "spec.json: bottom_units: missing or empty"));
  EXPECT_TRUE(Contains(spec_error(R"({"estimator": "DNNClassifier"})"), "spec.json: feature_columns: missing"));
}

TEST(ModelSpecSecurity, MalformedDocumentsAreOneLineErrors) {
  EXPECT_TRUE(Contains(spec_error("{\"estimator\": "), "spec.json is not valid JSON"));
  EXPECT_TRUE(Contains(spec_error("[1, 2]"), "spec.json: expected a JSON object (the model spec)"));
  EXPECT_TRUE(Contains(spec_error(""), "spec.json"));
  EXPECT_TRUE(Contains(spec_error(std::string(100000, '[') + std::string(100000, ']')), "spec.json"));
  EXPECT_TRUE(Contains(spec_error(R"({"estimator": "DNNClassifier", "n_classes": NaN})"), "not valid JSON"));
  // Duplicate members: the last one wins in nlohmann; a bad value in either is still caught.
  EXPECT_TRUE(Contains(spec_error(std::string(kMaxModelSpecBytes + 1, ' ')), "larger than"));
  for (const std::string& e : {spec_error("{\"estimator\": \"\\u0000\"}"), spec_error("\x01\x02")})
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // load_model_spec: missing files and directories are named.
  EXPECT_TRUE(Contains([] {
    try {
      (void)load_model_spec("/nonexistent/spec.json");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  }(), "--model-spec: '/nonexistent/spec.json' is not a readable file"));
  // A file's errors carry its path; relative vocabulary files resolve next to it.
  const std::string vocab = temp_path("vocab.txt");
  { std::ofstream(vocab) << "a\nb\nc\n"; }
  const std::string path = temp_path("spec.json");
  {
    std::ofstream out(path);
    const std::string base = vocab.substr(vocab.find_last_of('/') + 1);
    out << R"({"estimator": "LinearClassifier", "feature_columns": [{"type": "vocabulary_file", "key": "c1",
           "vocabulary_file": ")" << base << R"("}]})";
  }
  const ModelSpec s = load_model_spec(path);
  EXPECT_EQ(s.estimator.linear_feature_columns[0].vocabulary, (std::vector<std::string>{"a", "b", "c"}));
  {
    std::ofstream out(path);
    out << R"({"estimator": "LinearClassifier", "feature_columns": [{"type": "numeric", "key": "x"}], "epochs": -3})";
  }
  try {
    (void)load_model_spec(path);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), path + ": epochs: expected an integer in [1,"));
  }
}

// ---- per-part optimizers (DNNLinearCombined*'s linear_optimizer / dnn_optimizer) ------------------

// The optimizer each variable of `m` carries ("" = the job's), by name.
std::map<std::string, std::string> optimizers_of(const GraphModel& m) {
  std::map<std::string, std::string> out;
  for (const auto& v : m.variables()) out[v.name] = v.optimizer ? ps::to_string(*v.optimizer) : "";
  return out;
}

TEST(PartOptimizers, WideAndDeepDefaultsToFtrlForLinearAndAdagradForDnn) {
  const std::string csv = write_planted_csv("t.csv", 100, 1);
  Fixture f(config_of(EstimatorKind::kDNNLinearCombinedClassifier), label_of(EstimatorKind::kDNNLinearCombinedClassifier),
            csv, csv);
  // TensorFlow's defaults: FTRL at min(0.2, 1/sqrt(2 linear columns)) = 0.2, Adagrad at 0.05.
  ps::OptimizerConfig ftrl = ps::OptimizerConfig::defaults(ps::OptimizerKind::kFtrl);
  ftrl.learning_rate = 0.2;
  ps::OptimizerConfig adagrad = ps::OptimizerConfig::defaults(ps::OptimizerKind::kAdagrad);
  adagrad.learning_rate = 0.05;
  int linear = 0, dnn = 0;
  for (const auto& [name, opt] : optimizers_of(*f.model)) {
    if (name.rfind("est/linear/", 0) == 0) {
      EXPECT_EQ(opt, ps::to_string(ftrl)) << name;
      ++linear;
    } else {
      EXPECT_EQ(name.rfind("est/dnn/", 0), 0u) << name;
      EXPECT_EQ(opt, ps::to_string(adagrad)) << name;
      ++dnn;
    }
  }
  EXPECT_GT(linear, 0);
  EXPECT_GT(dnn, 0);
  // Other estimators' variables follow the job's optimizer.
  for (EstimatorKind kind : {EstimatorKind::kLinearClassifier, EstimatorKind::kDNNClassifier, EstimatorKind::kDLRM}) {
    Fixture g(config_of(kind), label_of(kind), csv, csv);
    for (const auto& [name, opt] : optimizers_of(*g.model)) EXPECT_EQ(opt, "") << name;
  }
}

TEST(PartOptimizers, NamedPartsJobWideChoiceAndLearningRates) {
  const std::string csv = write_planted_csv("t.csv", 100, 1);
  EstimatorConfig c = config_of(EstimatorKind::kDNNLinearCombinedRegressor);
  // A job-wide optimizer and no part named: nothing per variable (the job's optimizer trains all).
  c.part_optimizer_defaults = false;
  EXPECT_TRUE(part_optimizers(c).empty());
  // One part named: only it has its own; its lr from the member, else from the spec's lr= key.
  c.linear_optimizer = "ftrl:l1=0.01,l2=0.001";
  c.linear_learning_rate = 0.03;
  auto parts = part_optimizers(c);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].first, "est/linear/");
  EXPECT_EQ(parts[0].second.learning_rate, 0.03);
  EXPECT_EQ(parts[0].second.l1, 0.01);
  c.linear_learning_rate = 0;
  c.dnn_optimizer = "adam:lr=0.002";
  parts = part_optimizers(c);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].second.learning_rate, 0.2);  // TF's min(0.2, 1/sqrt(2))
  EXPECT_EQ(parts[1].first, "est/dnn/");
  EXPECT_EQ(parts[1].second.kind, ps::OptimizerKind::kAdam);
  EXPECT_EQ(parts[1].second.learning_rate, 0.002);
  Fixture f(c, label_of(c.kind), csv, csv);
  for (const auto& [name, opt] : optimizers_of(*f.model))
    EXPECT_EQ(opt.substr(0, 5), name.rfind("est/linear/", 0) == 0 ? "ftrl:" : "adam:") << name;
  // Errors name the member.
  c.dnn_learning_rate = 0.1;  // and lr= in dnn_optimizer
  try {
    (void)part_optimizers(c);
    FAIL() << "a learning rate given twice was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.message().rfind("dnn_learning_rate: ", 0), 0u) << e.message();
  }
  c.dnn_learning_rate = 0;
  c.dnn_optimizer = "adagrad:beta1=0.5";
  try {
    (void)part_optimizers(c);
    FAIL() << "a key Adagrad does not take was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.message().rfind("dnn_optimizer: ", 0), 0u) << e.message();
  }
  EstimatorConfig d = config_of(EstimatorKind::kDNNClassifier);
  d.dnn_optimizer = "adagrad";
  EXPECT_THROW((void)part_optimizers(d), ConfigError);
}

TEST(PartOptimizers, SpecMembersAndTheirErrors) {
  // kWideDeep names "optimizer": "adagrad" job-wide and no part: no per-part optimizer.
  EXPECT_FALSE(parse_model_spec(kWideDeep, "spec.json").estimator.part_optimizer_defaults);
  EXPECT_TRUE(part_optimizers(parse_model_spec(kWideDeep, "spec.json").estimator).empty());
  // Without it, TensorFlow's defaults.
  ModelSpec s = parse_model_spec(wide_deep_with("optimizer", ""), "spec.json");
  EXPECT_TRUE(s.estimator.part_optimizer_defaults);
  auto parts = part_optimizers(s.estimator);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].first, "ctr/linear/");
  EXPECT_EQ(parts[0].second.kind, ps::OptimizerKind::kFtrl);
  EXPECT_EQ(parts[1].second.kind, ps::OptimizerKind::kAdagrad);
  // A part named next to a job-wide optimizer: that part has its own.
  s = parse_model_spec(wide_deep_with("linear_optimizer", "\"ftrl:l1=0.5\""), "spec.json");
  EXPECT_EQ(s.estimator.linear_optimizer, "ftrl:l1=0.5");
  parts = part_optimizers(s.estimator);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].second.l1, 0.5);
  s = parse_model_spec(wide_deep_with("dnn_learning_rate", "0.01").insert(1, R"("dnn_optimizer": "adam",)"), "spec.json");
  EXPECT_EQ(part_optimizers(s.estimator).at(0).second.learning_rate, 0.01);

  const std::vector<std::pair<std::string, std::string>> cases = {
      {wide_deep_with("linear_optimizer", "\"ftrll\""), "spec.json: linear_optimizer: "},
      {wide_deep_with("linear_optimizer", "\"\""), "spec.json: linear_optimizer: expected an optimizer"},
      {wide_deep_with("dnn_optimizer", "3"), "spec.json: dnn_optimizer: expected a string"},
      {wide_deep_with("dnn_optimizer", "\"adagrad:rho=0.5\""), "spec.json: dnn_optimizer: "},
      {wide_deep_with("linear_learning_rate", "-1"), "spec.json: linear_learning_rate: "},
      {wide_deep_with("dnn_learning_rate", "0"), "spec.json: dnn_learning_rate: must be positive"},
      {wide_deep_with("linear_learning_rate", "0.1"), "spec.json: linear_learning_rate: needs linear_optimizer"},
      {wide_deep_with("linear_learning_rate", "0.1").insert(1, R"("linear_optimizer": "ftrl:lr=0.2",)"),
       "spec.json: linear_learning_rate: the learning rate is also set"},
  };
  for (const auto& [text, want] : cases) {
    const std::string got = spec_error(text);
    EXPECT_EQ(got.rfind(want, 0), 0u) << "got: " << got << "\nwant: " << want;
    EXPECT_EQ(got.find('\n'), std::string::npos) << got;
  }
  // Members of DNNLinearCombined* only.
  const std::string cols = R"([{"type": "numeric", "key": "x1"}])";
  EXPECT_NE(spec_error(R"({"estimator": "LinearClassifier", "linear_optimizer": "ftrl", "feature_columns": )" + cols + "}")
                .find("linear_optimizer: unknown member for LinearClassifier"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::nn
