// Unit tests of the built-in models (strata/nn/builtin.h: layer graphs built from a
// strata/model/model.h ModelConfig).
//
// The oracle for the math is an independent, naive double-precision implementation of each model
// written here from the definitions (loops, no Eigen). It checks the models' losses directly and
// their gradients by central differences, element by element, including which rows a sparse
// gradient lists. On top of that: a loss computed by hand, the variables a model declares, the
// contracts around rows, errors and reentrancy, local SGD on separable toy problems, and a short
// real run on Fashion-MNIST when Debian's dataset package is installed (read here with zlib, not
// through the data layer, so these tests depend on nothing but the model).
#include "strata/model/model.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "strata/common/error.h"
#include "strata/nn/builtin.h"

namespace strata::model {
namespace {

// A built-in model as these tests drive it: the graph nn::make_builtin_model builds, beside the
// configuration it was built from (defaults filled).
class Model {
 public:
  explicit Model(const ModelConfig& config)
      : config_(resolve_model_config(config)), net_(nn::make_builtin_model(config_)) {}
  const ModelConfig& config() const { return config_; }
  const nn::GraphModel& net() const { return *net_; }
  std::vector<ps::VariableSpec> variables() const { return net_->variables(); }
  std::vector<std::string> sparse_variables() const { return net_->sparse_variables(); }
  std::vector<std::int64_t> rows_needed(const std::string& var, const Inputs& in) const {
    return net_->rows_needed(var, in);
  }
  std::string describe() const { return net_->describe(); }
  std::int64_t num_parameters() const { return net_->num_parameters(); }
  // The mean loss; *correct (when non-null) the examples predicted right.
  double train_step(const Params& p, const Inputs& in, Grads* g, std::int64_t* correct) const {
    const train::StepResult r = net_->step(p, in, g);
    if (correct != nullptr) *correct = r.correct;
    return r.loss;
  }

 private:
  ModelConfig config_;
  std::unique_ptr<nn::GraphModel> net_;
};

std::unique_ptr<Model> make_model(const ModelConfig& c) { return std::make_unique<Model>(c); }
Params init_local_params(const Model& m) { return nn::init_local_params(m.net()); }

::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not found in: " << haystack;
}

// ---- a batch that owns its buffers ----------------------------------------------------------

struct Batch {
  int size = 0;
  int dense_dim = 0;
  int num_fields = 0;
  std::vector<float> dense;
  std::vector<std::int64_t> ids;
  std::vector<std::int32_t> labels;

  Inputs view() const {
    return Inputs{size, dense.empty() ? nullptr : dense.data(), dense_dim, ids.empty() ? nullptr : ids.data(),
                  num_fields, labels.data()};
  }
};

Batch random_batch(const ModelConfig& c, int size, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Batch b;
  b.size = size;
  b.dense_dim = c.input_dim;
  b.dense.resize(static_cast<std::size_t>(size) * c.input_dim);
  for (float& v : b.dense) v = u(rng);
  if (c.name == "wide_deep") {
    b.num_fields = c.num_fields;
    b.ids.resize(static_cast<std::size_t>(size) * c.num_fields);
    // Small vocab so ids repeat within and across examples; every 5th field is padding.
    for (std::size_t i = 0; i < b.ids.size(); ++i)
      b.ids[i] = i % 5 == 3 ? -1 : static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(c.vocab));
  }
  b.labels.resize(static_cast<std::size_t>(size));
  for (auto& y : b.labels) y = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(c.num_classes));
  return b;
}

// ---- the double-precision reference --------------------------------------------------------

// Every variable as a full double array (sparse tables at full [vocab, width] size).
using RefParams = std::map<std::string, std::vector<double>>;

struct RefLayer {
  std::string kernel, bias;
  int in, out;
};

std::vector<RefLayer> ref_layers(const ModelConfig& c, const std::string& prefix, int input_dim) {
  std::vector<RefLayer> layers;
  int in = input_dim;
  const std::vector<int> hidden = c.name == "softmax" ? std::vector<int>{} : c.hidden;
  for (std::size_t i = 0; i < hidden.size(); ++i) {
    const std::string scope = prefix + "dense_" + std::to_string(i);
    layers.push_back({scope + "/kernel", scope + "/bias", in, hidden[i]});
    in = hidden[i];
  }
  layers.push_back({prefix + "logits/kernel", prefix + "logits/bias", in, c.num_classes});
  return layers;
}

// Mean softmax cross-entropy of the batch, straight from the definitions.
double ref_loss(const ModelConfig& c, const RefParams& p, const Batch& b) {
  const bool wd = c.name == "wide_deep";
  const int embed_cols = wd ? c.num_fields * c.embed_dim : 0;
  const auto layers = ref_layers(c, wd ? "deep/" : "", embed_cols + c.input_dim);
  double total = 0.0;
  for (int e = 0; e < b.size; ++e) {
    std::vector<double> x;
    for (int f = 0; f < (wd ? c.num_fields : 0); ++f) {
      const std::int64_t id = b.ids[static_cast<std::size_t>(e) * c.num_fields + f];
      for (int j = 0; j < c.embed_dim; ++j)
        x.push_back(id < 0 ? 0.0 : p.at("deep/embedding")[static_cast<std::size_t>(id * c.embed_dim + j)]);
    }
    for (int j = 0; j < c.input_dim; ++j) x.push_back(b.dense[static_cast<std::size_t>(e) * c.input_dim + j]);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const RefLayer& L = layers[l];
      std::vector<double> y(static_cast<std::size_t>(L.out));
      for (int o = 0; o < L.out; ++o) {
        double s = p.at(L.bias)[static_cast<std::size_t>(o)];
        for (int i = 0; i < L.in; ++i) s += x[static_cast<std::size_t>(i)] * p.at(L.kernel)[static_cast<std::size_t>(i * L.out + o)];
        y[static_cast<std::size_t>(o)] = l + 1 < layers.size() ? std::max(0.0, s) : s;
      }
      x = y;
    }
    for (int f = 0; f < (wd ? c.num_fields : 0); ++f) {
      const std::int64_t id = b.ids[static_cast<std::size_t>(e) * c.num_fields + f];
      if (id < 0) continue;
      for (int k = 0; k < c.num_classes; ++k)
        x[static_cast<std::size_t>(k)] += p.at("wide/weights")[static_cast<std::size_t>(id * c.num_classes + k)];
    }
    double m = x[0], s = 0.0;
    for (double v : x) m = std::max(m, v);
    for (double v : x) s += std::exp(v - m);
    total += m + std::log(s) - x[static_cast<std::size_t>(b.labels[static_cast<std::size_t>(e)])];
  }
  return total / b.size;
}

// Random parameters in [-0.5, 0.5) (biases and wide weights included, so no gradient is
// trivially zero), as model Params (sparse tables as a shuffled subset of rows: the ones the batch
// needs plus one extra) and as the reference's doubles (rows the batch does not use are zero).
void random_params(const Model& model, const Batch& batch, std::uint32_t seed, Params* params, RefParams* ref) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  const auto sparse = model.sparse_variables();
  for (const ps::VariableSpec& spec : model.variables()) {
    const auto n = static_cast<std::size_t>(ps::num_elements(spec.shape));
    std::vector<double>& full = (*ref)[spec.name];
    full.assign(n, 0.0);
    if (std::find(sparse.begin(), sparse.end(), spec.name) == sparse.end()) {
      DenseParam d{std::vector<float>(n), spec.shape};
      for (std::size_t i = 0; i < n; ++i) full[i] = d.value[i] = u(rng);
      params->dense[spec.name] = d;
      continue;
    }
    SparseParam sp;
    sp.width = static_cast<int>(spec.shape[1]);
    sp.rows = model.rows_needed(spec.name, batch.view());
    if (static_cast<std::int64_t>(sp.rows.size()) < spec.shape[0]) {
      for (std::int64_t r = 0; r < spec.shape[0]; ++r)  // one row the batch does not need
        if (!std::binary_search(sp.rows.begin(), sp.rows.end(), r)) {
          sp.rows.push_back(r);
          break;
        }
    }
    std::shuffle(sp.rows.begin(), sp.rows.end(), rng);  // "any order"
    for (std::int64_t r : sp.rows)
      for (int j = 0; j < sp.width; ++j) {
        const float v = u(rng);
        sp.values.push_back(v);
        full[static_cast<std::size_t>(r * sp.width + j)] = v;
      }
    params->sparse[spec.name] = sp;
  }
}

// Relative error with a floor, so gradients that are ~0 in both are compared absolutely.
double rel_error(double a, double b) { return std::fabs(a - b) / std::max({std::fabs(a), std::fabs(b), 1e-3}); }

ModelConfig tiny(const std::string& name) {
  ModelConfig c;
  c.name = name;
  c.seed = 42;
  if (name == "softmax") {
    c.input_dim = 5;
    c.num_classes = 3;
  } else if (name == "mlp") {
    c.input_dim = 4;
    c.hidden = {6, 5};
    c.num_classes = 3;
  } else {
    c.input_dim = 3;
    c.num_fields = 3;
    c.vocab = 7;
    c.embed_dim = 2;
    c.hidden = {5, 4};
    c.num_classes = 2;
  }
  return c;
}

// ---- gradients against central differences --------------------------------------------------

class GradientCheck : public ::testing::TestWithParam<std::string> {};

TEST_P(GradientCheck, MatchesCentralDifferencesOfTheReference) {
  const ModelConfig c = tiny(GetParam());
  const auto model = make_model(c);
  const Batch batch = random_batch(model->config(), 6, 7);
  Params params;
  RefParams ref;
  random_params(*model, batch, 11, &params, &ref);

  Grads grads;
  std::int64_t correct = -1;
  const double loss = model->train_step(params, batch.view(), &grads, &correct);
  EXPECT_NEAR(loss, ref_loss(model->config(), ref, batch), 1e-5 * std::max(1.0, loss));
  EXPECT_GE(correct, 0);
  EXPECT_LE(correct, batch.size);

  const auto sparse = model->sparse_variables();
  // Central differences of the double reference: truncation error O(h^2) ~ 1e-10 and rounding
  // ~1e-16 / h ~ 1e-11, far below the float model's own rounding, so any disagreement above the
  // 1e-2 bar is the model's. A ReLU kink within h of a pre-activation is the only way this could
  // misfire, and with random parameters that has probability ~1e-5 per unit.
  const double h = 1e-5;
  double worst = 0.0;
  std::string worst_at;
  int checked = 0;
  for (const ps::VariableSpec& spec : model->variables()) {
    const bool is_sparse = std::find(sparse.begin(), sparse.end(), spec.name) != sparse.end();
    std::vector<double>& v = ref[spec.name];
    // The model's gradient as a full array; rows a sparse gradient omits must have fd == 0.
    std::vector<double> g(v.size(), 0.0);
    std::vector<bool> listed(v.size(), !is_sparse);
    if (is_sparse) {
      ASSERT_EQ(grads.sparse.count(spec.name), 1u) << spec.name;
      const SparseParam& sg = grads.sparse.at(spec.name);
      ASSERT_EQ(sg.width, spec.shape[1]);
      ASSERT_EQ(sg.values.size(), sg.rows.size() * static_cast<std::size_t>(sg.width));
      EXPECT_TRUE(std::is_sorted(sg.rows.begin(), sg.rows.end()));
      EXPECT_EQ(std::adjacent_find(sg.rows.begin(), sg.rows.end()), sg.rows.end()) << "duplicate rows";
      EXPECT_EQ(sg.rows, model->rows_needed(spec.name, batch.view()));
      for (std::size_t k = 0; k < sg.rows.size(); ++k)
        for (int j = 0; j < sg.width; ++j) {
          const auto at = static_cast<std::size_t>(sg.rows[k] * sg.width + j);
          g[at] = sg.values[k * static_cast<std::size_t>(sg.width) + static_cast<std::size_t>(j)];
          listed[at] = true;
        }
    } else {
      ASSERT_EQ(grads.dense.count(spec.name), 1u) << spec.name;
      ASSERT_EQ(grads.dense.at(spec.name).shape, spec.shape);
      ASSERT_EQ(grads.dense.at(spec.name).value.size(), v.size());
      for (std::size_t i = 0; i < v.size(); ++i) g[i] = grads.dense.at(spec.name).value[i];
    }
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double saved = v[i];
      v[i] = saved + h;
      const double up = ref_loss(model->config(), ref, batch);
      v[i] = saved - h;
      const double down = ref_loss(model->config(), ref, batch);
      v[i] = saved;
      const double fd = (up - down) / (2 * h);
      if (!listed[i]) {
        EXPECT_NEAR(fd, 0.0, 1e-9) << spec.name << "[" << i << "] has a gradient but its row is not listed";
        continue;
      }
      const double err = rel_error(g[i], fd);
      if (err > worst) {
        worst = err;
        worst_at = spec.name + "[" + std::to_string(i) + "] model " + std::to_string(g[i]) + " fd " +
                   std::to_string(fd);
      }
      ++checked;
    }
  }
  EXPECT_LT(worst, 1e-2) << "worst element: " << worst_at;
  std::printf("[ gradcheck] %s: %d elements, worst relative error %.2e\n", GetParam().c_str(), checked, worst);
  EXPECT_GE(checked, 18);  // softmax: 5 x 3 kernel + 3 biases
  // The gradient map holds exactly the model's variables.
  EXPECT_EQ(grads.dense.size() + grads.sparse.size(), model->variables().size());
}

INSTANTIATE_TEST_SUITE_P(AllModels, GradientCheck, ::testing::Values("softmax", "mlp", "wide_deep"),
                         [](const auto& info) { return info.param; });

// ---- a loss computed by hand ----------------------------------------------------------------

TEST(ModelLoss, SoftmaxMatchesHandComputedValues) {
  ModelConfig c;
  c.name = "softmax";
  c.input_dim = 2;
  c.num_classes = 3;
  const auto model = make_model(c);
  Params p;
  p.dense["logits/kernel"] = {{1, 0, 0, 0, 1, 0}, {2, 3}};
  p.dense["logits/bias"] = {{0, 0, 0}, {3}};
  // Example 0: logits (1, 2, 0), label 1. Example 1: logits (0, 0, 0), label 0 (a tie: the first
  // maximum is the prediction, so both are correct).
  Batch b;
  b.size = 2;
  b.dense_dim = 2;
  b.dense = {1, 2, 0, 0};
  b.labels = {1, 0};
  Grads g;
  std::int64_t correct = 0;
  const double loss = model->train_step(p, b.view(), &g, &correct);
  const double e = std::exp(1.0);
  const double loss0 = std::log(e + e * e + 1.0) - 2.0;  // = log(1 + e^-1 + e^-2) = 0.4076059...
  const double loss1 = std::log(3.0);
  EXPECT_NEAR(loss0, 0.40760596, 1e-8);
  EXPECT_NEAR(loss, (loss0 + loss1) / 2, 1e-6);
  EXPECT_EQ(correct, 2);
  // d(mean loss)/d(bias) = mean over examples of softmax - onehot.
  const double z = e + e * e + 1.0;
  const double db[3] = {(e / z + 1.0 / 3 - 1.0) / 2, (e * e / z - 1.0 + 1.0 / 3) / 2, (1.0 / z + 1.0 / 3) / 2};
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(g.dense["logits/bias"].value[static_cast<std::size_t>(k)], db[k], 1e-6);
  // d/dW[i][k] = mean of x_i * (softmax - onehot)_k; example 1 has x = 0.
  EXPECT_NEAR(g.dense["logits/kernel"].value[1], (e * e / z - 1.0) / 2, 1e-6);  // x_0 = 1, class 1
  EXPECT_NEAR(g.dense["logits/kernel"].value[3], 2 * (e / z) / 2, 1e-6);        // x_1 = 2, class 0
}

TEST(ModelLoss, LargeLogitsStayFinite) {
  // exp(1000) overflows float and double; the max-subtracted form does not.
  ModelConfig c;
  c.name = "softmax";
  c.input_dim = 1;
  c.num_classes = 3;
  const auto model = make_model(c);
  Params p;
  p.dense["logits/kernel"] = {{1000, 2000, 0}, {1, 3}};
  p.dense["logits/bias"] = {{0, 0, 0}, {3}};
  Batch b;
  b.size = 2;
  b.dense_dim = 1;
  b.dense = {1, 1};
  b.labels = {1, 0};
  Grads g;
  const double loss = model->train_step(p, b.view(), &g, nullptr);
  ASSERT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, (0.0 + 1000.0) / 2, 1e-3);
  for (float v : g.dense["logits/kernel"].value) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(g.dense["logits/bias"].value[0], -0.5, 1e-6);
  EXPECT_NEAR(g.dense["logits/bias"].value[1], 0.5, 1e-6);  // softmax (0, 1, 0) for both examples
}

// ---- declared variables ---------------------------------------------------------------------

TEST(ModelVariables, MlpDefaultsNamesShapesAndInitializers) {
  ModelConfig c;  // mlp, 784 inputs, 10 classes, default hidden
  c.seed = 3;
  const auto model = make_model(c);
  EXPECT_EQ(model->config().hidden, (std::vector<int>{256, 128}));
  const auto vars = model->variables();
  const std::vector<std::pair<std::string, ps::Shape>> want{
      {"dense_0/kernel", {784, 256}}, {"dense_0/bias", {256}}, {"dense_1/kernel", {256, 128}},
      {"dense_1/bias", {128}},        {"logits/kernel", {128, 10}}, {"logits/bias", {10}}};
  ASSERT_EQ(vars.size(), want.size());
  std::set<std::uint64_t> seeds;
  for (std::size_t i = 0; i < vars.size(); ++i) {
    EXPECT_EQ(vars[i].name, want[i].first);
    EXPECT_EQ(vars[i].shape, want[i].second);
    EXPECT_EQ(vars[i].dtype, ps::DType::kF32);
    EXPECT_TRUE(vars[i].trainable);
    EXPECT_TRUE(vars[i].partitioner.is_none());
    EXPECT_NO_THROW(vars[i].validate());
    if (vars[i].shape.size() == 2) {
      EXPECT_EQ(vars[i].init.kind, ps::Initializer::Kind::kGlorotUniform) << vars[i].name;
      EXPECT_EQ(vars[i].init.seed, derive_seed(3, vars[i].name));
      seeds.insert(vars[i].init.seed);
    } else {
      EXPECT_EQ(vars[i].init.kind, ps::Initializer::Kind::kZeros) << vars[i].name;
    }
  }
  EXPECT_EQ(seeds.size(), 3u) << "kernels must not share a seed";
  EXPECT_EQ(model->num_parameters(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(model->describe(), "mlp: 784 -> 256-128-10 (235146 parameters)");

  // Values land inside Glorot's limit and differ between kernels and between model seeds.
  const Params p = init_local_params(*model);
  const auto& k0 = p.dense.at("dense_0/kernel").value;
  const double limit = ps::glorot_limit({784, 256});
  EXPECT_TRUE(std::all_of(k0.begin(), k0.end(), [&](float v) { return std::fabs(v) <= limit; }));
  EXPECT_NE(k0[0], p.dense.at("dense_1/kernel").value[0]);
  ModelConfig other = c;
  other.seed = 4;
  EXPECT_NE(init_local_params(*make_model(other)).dense.at("dense_0/kernel").value[0], k0[0]);
  EXPECT_TRUE(std::all_of(p.dense.at("dense_0/bias").value.begin(), p.dense.at("dense_0/bias").value.end(),
                          [](float v) { return v == 0.0f; }));
}

TEST(ModelVariables, SoftmaxAndWideDeep) {
  ModelConfig s;
  s.name = "softmax";
  s.hidden = {99};  // ignored by softmax
  const auto softmax = make_model(s);
  const auto sv = softmax->variables();
  ASSERT_EQ(sv.size(), 2u);
  EXPECT_EQ(sv[0].name, "logits/kernel");
  EXPECT_EQ(sv[0].shape, (ps::Shape{784, 10}));
  EXPECT_EQ(sv[1].name, "logits/bias");
  EXPECT_TRUE(softmax->sparse_variables().empty());
  EXPECT_EQ(softmax->describe(), "softmax: 784 -> 10 (7850 parameters)");

  ModelConfig w;
  w.name = "wide_deep";
  w.input_dim = 13;
  w.num_fields = 26;
  w.vocab = 1000;
  w.num_classes = 2;
  const auto wd = make_model(w);
  EXPECT_EQ(wd->config().embed_dim, 8);
  EXPECT_EQ(wd->config().hidden, (std::vector<int>{64, 32}));
  const auto vars = wd->variables();
  std::vector<std::string> names;
  for (const auto& v : vars) {
    names.push_back(v.name);
    EXPECT_NO_THROW(v.validate());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"wide/weights", "deep/embedding", "deep/dense_0/kernel",
                                             "deep/dense_0/bias", "deep/dense_1/kernel", "deep/dense_1/bias",
                                             "deep/logits/kernel", "deep/logits/bias"}));
  EXPECT_EQ(vars[0].shape, (ps::Shape{1000, 2}));
  EXPECT_EQ(vars[0].init.kind, ps::Initializer::Kind::kZeros);
  EXPECT_EQ(vars[1].shape, (ps::Shape{1000, 8}));
  EXPECT_EQ(vars[1].init.kind, ps::Initializer::Kind::kUniform);
  EXPECT_EQ(vars[2].shape, (ps::Shape{26 * 8 + 13, 64}));
  EXPECT_EQ(vars[6].shape, (ps::Shape{32, 2}));
  EXPECT_EQ(wd->sparse_variables(), (std::vector<std::string>{"wide/weights", "deep/embedding"}));
  EXPECT_TRUE(Contains(wd->describe(), "wide_deep"));

  const Params p = init_local_params(*wd);
  ASSERT_EQ(p.sparse.count("deep/embedding"), 1u);
  EXPECT_EQ(p.sparse.at("deep/embedding").rows.size(), 1000u);
  EXPECT_EQ(p.sparse.at("deep/embedding").width, 8);
  EXPECT_EQ(p.dense.count("deep/embedding"), 0u);
  EXPECT_EQ(p.dense.size(), 6u);
}

TEST(ModelVariables, DeriveSeedIsStableAndPerName) {
  // FNV-1a 64 of "" is its offset basis; pinning it keeps seeds (and so initial values and
  // checkpoints) stable across builds.
  EXPECT_EQ(derive_seed(0, ""), 0xcbf29ce484222325ull);
  EXPECT_EQ(derive_seed(0, "a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(derive_seed(5, "a"), 0xaf63dc4c8601ec8cull ^ 5u);
  EXPECT_NE(derive_seed(1, "dense_0/kernel"), derive_seed(1, "dense_1/kernel"));
}

// ---- configuration errors -------------------------------------------------------------------

TEST(ModelConfigErrors, UnknownNameListsTheModels) {
  ModelConfig c;
  c.name = "resnet";
  try {
    make_model(c);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.message(), "resnet"));
    EXPECT_TRUE(Contains(e.message(), "softmax, mlp, wide_deep"));
  }
}

TEST(ModelConfigErrors, BadSizes) {
  auto expect_config_error = [](ModelConfig c, const std::string& needle) {
    try {
      make_model(c);
      ADD_FAILURE() << "no ConfigError for " << needle;
    } catch (const ConfigError& e) {
      EXPECT_TRUE(Contains(e.message(), needle));
    }
  };
  ModelConfig c;
  c.num_classes = 1;
  expect_config_error(c, "num_classes");
  c = ModelConfig{};
  c.hidden = {32, 0};
  expect_config_error(c, "hidden");
  c = ModelConfig{};
  c.input_dim = 0;
  expect_config_error(c, "input_dim");
  c = tiny("wide_deep");
  c.vocab = 0;
  expect_config_error(c, "vocab");
  c = tiny("wide_deep");
  c.num_fields = 0;
  expect_config_error(c, "num_fields");
  c = tiny("wide_deep");
  c.input_dim = 0;  // wide_deep without dense features is fine
  EXPECT_NO_THROW(make_model(c));
}

// ---- rows, inputs and runtime errors --------------------------------------------------------

TEST(ModelRows, RowsNeededAreUniqueSortedAndSkipPadding) {
  const auto model = make_model(tiny("wide_deep"));  // 3 fields, vocab 7
  Batch b;
  b.size = 3;
  b.num_fields = 3;
  b.dense_dim = 3;
  b.dense.assign(9, 0.5f);
  b.ids = {5, -1, 2, 2, 5, 0, -1, -1, 6};
  b.labels = {0, 1, 0};
  const std::vector<std::int64_t> want{0, 2, 5, 6};
  EXPECT_EQ(model->rows_needed("wide/weights", b.view()), want);
  EXPECT_EQ(model->rows_needed("deep/embedding", b.view()), want);
  EXPECT_THROW(model->rows_needed("deep/dense_0/kernel", b.view()), Error);
  b.ids[4] = 7;  // == vocab
  try {
    model->rows_needed("deep/embedding", b.view());
    FAIL() << "no Error";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.message(), "id 7 (example 1, field 1) is outside [0, 7) of 'deep/embedding'"));
  }
  EXPECT_THROW(make_model(tiny("mlp"))->rows_needed("x", b.view()), Error);
}

TEST(ModelRows, SparseGradientsSumRepeatedIds) {
  // With one example whose fields all carry the same id, that row's gradient is the sum of the
  // per-field contributions: equal to the reference's central difference (checked above) and
  // listed once.
  const ModelConfig c = tiny("wide_deep");
  const auto model = make_model(c);
  Batch b = random_batch(model->config(), 1, 3);
  b.ids = {4, 4, 4};
  Params p;
  RefParams ref;
  random_params(*model, b, 5, &p, &ref);
  Grads g;
  model->train_step(p, b.view(), &g, nullptr);
  EXPECT_EQ(g.sparse.at("wide/weights").rows, std::vector<std::int64_t>{4});
  // d/d wide[4][k] = 3 * (softmax - onehot)_k, so the two classes' entries cancel: sum = 0.
  const auto& wv = g.sparse.at("wide/weights").values;
  EXPECT_NEAR(wv[0] + wv[1], 0.0, 1e-6);
  EXPECT_GT(std::fabs(wv[0]), 0.0f);
}

TEST(ModelErrors, BadInputsAndParamsNameTheProblem) {
  const auto model = make_model(tiny("mlp"));
  Batch b = random_batch(model->config(), 4, 1);
  Params p = init_local_params(*model);
  auto message = [&](const Params& params, const Batch& batch) -> std::string {
    try {
      model->train_step(params, batch.view(), nullptr, nullptr);
    } catch (const Error& e) {
      return e.message();
    }
    return "(no error)";
  };
  Batch bad = b;
  bad.labels[2] = 3;
  EXPECT_TRUE(Contains(message(p, bad), "label 3 of example 2"));
  bad = b;
  bad.dense_dim = 3;  // fewer columns than the model reads
  EXPECT_TRUE(Contains(message(p, bad), "reads 4 dense feature columns, the inputs have 3"));
  Params missing = p;
  missing.dense.erase("dense_1/bias");
  EXPECT_TRUE(Contains(message(missing, b), "'dense_1/bias' was not provided"));
  Params wrong = p;
  wrong.dense["logits/kernel"].value.pop_back();
  EXPECT_TRUE(Contains(message(wrong, b), "'logits/kernel' has 14 elements, expected 15"));

  const auto wd = make_model(tiny("wide_deep"));
  Batch wb = random_batch(wd->config(), 4, 2);
  Params wp;
  RefParams ref;
  random_params(*wd, wb, 3, &wp, &ref);
  // Drop a row the batch needs from the pulled subset.
  SparseParam& emb = wp.sparse["deep/embedding"];
  const std::int64_t needed = wd->rows_needed("deep/embedding", wb.view()).front();
  const auto at = static_cast<std::size_t>(std::find(emb.rows.begin(), emb.rows.end(), needed) - emb.rows.begin());
  emb.rows.erase(emb.rows.begin() + static_cast<std::ptrdiff_t>(at));
  emb.values.erase(emb.values.begin() + static_cast<std::ptrdiff_t>(at * 2),
                   emb.values.begin() + static_cast<std::ptrdiff_t>(at * 2 + 2));
  try {
    wd->train_step(wp, wb.view(), nullptr, nullptr);
    FAIL() << "no Error";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.message(), "row " + std::to_string(needed) + " was not pulled"));
  }
}

// A worker's last shard of an epoch may be empty; it must yield zero gradients, not NaN (0/0).
TEST(ModelStep, EmptyBatchAndEvaluationWithoutGradients) {
  for (const char* name : {"softmax", "mlp", "wide_deep"}) {
    const auto model = make_model(tiny(name));
    const Params p = init_local_params(*model);
    Batch empty = random_batch(model->config(), 0, 1);
    Grads g;
    std::int64_t correct = 7;
    EXPECT_EQ(model->train_step(p, empty.view(), &g, &correct), 0.0) << name;
    EXPECT_EQ(correct, 0);
    for (const auto& [n, d] : g.dense)
      EXPECT_TRUE(std::all_of(d.value.begin(), d.value.end(), [](float v) { return v == 0.0f; })) << n;
    for (const auto& [n, s] : g.sparse) EXPECT_TRUE(s.rows.empty()) << n;

    // grads == nullptr evaluates: same loss and count as a training call.
    const Batch b = random_batch(model->config(), 9, 2);
    std::int64_t c1 = -1, c2 = -1;
    const double with = model->train_step(p, b.view(), &g, &c1);
    const double without = model->train_step(p, b.view(), nullptr, &c2);
    EXPECT_EQ(with, without) << name;
    EXPECT_EQ(c1, c2) << name;
  }
}

// The header promises reentrancy (CPU replicas share one Model and one Params); results must be
// bit-identical because Eigen's single-threaded GEMM has a fixed summation order.
TEST(ModelStep, ReusesGradientBuffersAndIsReentrant) {
  const auto model = make_model(tiny("wide_deep"));
  const Params p = init_local_params(*model);
  const Batch b = random_batch(model->config(), 16, 4);
  Grads g;
  const double loss = model->train_step(p, b.view(), &g, nullptr);
  const float* kernel = g.dense.at("deep/dense_0/kernel").value.data();
  model->train_step(p, b.view(), &g, nullptr);
  EXPECT_EQ(g.dense.at("deep/dense_0/kernel").value.data(), kernel) << "dense gradients were reallocated";

  // Four threads on one model and one Params: every result equals the serial one exactly.
  std::vector<double> losses(4);
  std::vector<Grads> grads(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) losses[static_cast<std::size_t>(t)] = model->train_step(p, b.view(), &grads[static_cast<std::size_t>(t)], nullptr);
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(losses[static_cast<std::size_t>(t)], loss);
    EXPECT_EQ(grads[static_cast<std::size_t>(t)].dense.at("deep/dense_0/kernel").value, g.dense.at("deep/dense_0/kernel").value);
    EXPECT_EQ(grads[static_cast<std::size_t>(t)].sparse.at("deep/embedding").values, g.sparse.at("deep/embedding").values);
  }
}

// Sync training is bit-reproducible only if a step's gradients do not depend on where its buffers
// happen to lie: with AVX-512 (STRATA_ARCH=native) a reduction whose order followed the output's
// alignment made the bias gradients differ with the heap layout. malloc aligns to 16 bytes, so
// the gradient buffers are placed at each 16-byte offset within a 64-byte line.
TEST(ModelStep, GradientsDoNotDependOnBufferAlignment) {
  for (const std::string name : {"softmax", "mlp", "wide_deep"}) {
    ModelConfig c = tiny(name);
    if (name != "softmax") c.hidden = {37, 19};  // widths that are not multiples of a packet
    const auto model = make_model(c);
    const Params p = init_local_params(*model);
    const Batch b = random_batch(model->config(), 33, 5);
    Grads first;
    model->train_step(p, b.view(), &first, nullptr);
    std::set<std::uintptr_t> offsets;
    for (std::uintptr_t want = 0; want < 64; want += 16) {
      Grads g;
      std::vector<std::vector<float>> held;  // keeps rejected buffers so malloc moves on
      for (const auto& [var, d] : first.dense) {
        // resize() in the model keeps a buffer of adequate capacity, so the gradient lands here.
        std::vector<float>& v = g.dense[var].value;
        for (std::size_t extra = 0; extra < 256; ++extra) {
          std::vector<float> candidate;
          candidate.reserve(d.value.size() + extra);
          if (reinterpret_cast<std::uintptr_t>(candidate.data()) % 64 == want) {
            v.swap(candidate);
            break;
          }
          held.push_back(std::move(candidate));
        }
        offsets.insert(reinterpret_cast<std::uintptr_t>(v.data()) % 64);
      }
      model->train_step(p, b.view(), &g, nullptr);
      for (const auto& [var, d] : first.dense)
        EXPECT_EQ(0, std::memcmp(d.value.data(), g.dense.at(var).value.data(), d.value.size() * sizeof(float)))
            << name << " " << var << " with its gradient buffers at offset " << want << " of a 64-byte line";
    }
    EXPECT_GE(offsets.size(), 3u) << name << ": the test did not manage to vary the buffers' alignment";
  }
}

// ---- local SGD ------------------------------------------------------------------------------

// sgd_apply_local on a pulled subset in arbitrary row order (the distributed shape of Params).
TEST(LocalSgd, AppliesDenseAndSparseUpdates) {
  Params p;
  p.dense["w"] = {{1, 2, 3}, {3}};
  p.sparse["t"] = {{9, 4}, {1, 1, 2, 2}, 2};  // rows 9 and 4, a pulled subset
  Grads g;
  g.dense["w"] = {{10, 0, -10}, {3}};
  g.sparse["t"] = {{4}, {1, -1}, 2};
  sgd_apply_local(p, g, 0.1f);
  EXPECT_EQ(p.dense["w"].value, (std::vector<float>{0, 2, 4}));
  EXPECT_FLOAT_EQ(p.sparse["t"].values[2], 1.9f);
  EXPECT_FLOAT_EQ(p.sparse["t"].values[3], 2.1f);
  EXPECT_EQ(p.sparse["t"].values[0], 1.0f);
  g.sparse["t"].rows = {5};
  EXPECT_THROW(sgd_apply_local(p, g, 0.1f), Error);
  g.sparse.clear();
  g.dense["nope"] = {{1}, {1}};
  EXPECT_THROW(sgd_apply_local(p, g, 0.1f), Error);
}

// A separable toy problem per model: classes are well-separated clusters of dense features
// (softmax, mlp) or are fixed by the id of field 0 (wide_deep). A few hundred SGD steps must fit it.
class LocalTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(LocalTraining, SeparableProblemReachesFullAccuracy) {
  ModelConfig c = tiny(GetParam());
  const auto model = make_model(c);
  c = model->config();
  std::mt19937 rng(99);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<std::vector<float>> centers(static_cast<std::size_t>(c.num_classes), std::vector<float>(static_cast<std::size_t>(c.input_dim)));
  for (auto& center : centers)
    for (float& v : center) v = u(rng);
  Batch data;
  data.size = 64;
  data.dense_dim = c.input_dim;
  data.num_fields = c.name == "wide_deep" ? c.num_fields : 0;
  for (int i = 0; i < data.size; ++i) {
    const int y = i % c.num_classes;
    data.labels.push_back(y);
    if (c.name == "wide_deep") {
      // Field 0 decides the class (ids < 3 are class 0, others class 1); the rest is noise.
      data.ids.push_back(y == 0 ? static_cast<std::int64_t>(rng() % 3) : 3 + static_cast<std::int64_t>(rng() % 4));
      for (int f = 1; f < c.num_fields; ++f) data.ids.push_back(static_cast<std::int64_t>(rng() % 8) - 1);
      for (int j = 0; j < c.input_dim; ++j) data.dense.push_back(u(rng));
    } else {
      for (int j = 0; j < c.input_dim; ++j) data.dense.push_back(centers[static_cast<std::size_t>(y)][static_cast<std::size_t>(j)] + noise(rng));
    }
  }
  // Starts from the real initializers (zero wide weights and biases), as a training run does.
  Params p = init_local_params(*model);
  Grads g;
  const double first = model->train_step(p, data.view(), nullptr, nullptr);
  for (int step = 0; step < 300; ++step) {
    model->train_step(p, data.view(), &g, nullptr);
    sgd_apply_local(p, g, 0.5f);
  }
  std::int64_t correct = 0;
  const double last = model->train_step(p, data.view(), nullptr, &correct);
  EXPECT_LT(last, 0.1 * first) << "loss " << first << " -> " << last;
  EXPECT_EQ(correct, data.size);
}

INSTANTIATE_TEST_SUITE_P(AllModels, LocalTraining, ::testing::Values("softmax", "mlp", "wide_deep"),
                         [](const auto& info) { return info.param; });

// ---- Fashion-MNIST smoke run ----------------------------------------------------------------

// Reads an IDX file (gzip); returns false when it cannot be opened.
bool read_idx_gz(const std::string& path, std::vector<unsigned char>* out) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  unsigned char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out->insert(out->end(), buf, buf + n);
  const bool ok = n == 0;
  gzclose(f);
  return ok;
}

struct Images {
  int count = 0;
  std::vector<float> pixels;  // [count, 784], scaled to [0, 1]
  std::vector<std::int32_t> labels;
};

// IDX: big-endian magic 0x00000803 (images: count, rows, cols) / 0x00000801 (labels: count).
bool load_fashion(const std::string& images, const std::string& labels, int limit, Images* out, std::string* why) {
  std::vector<unsigned char> img, lab;
  if (!read_idx_gz(images, &img) || !read_idx_gz(labels, &lab)) {
    *why = "cannot read " + images + " / " + labels;
    return false;
  }
  auto be32 = [](const std::vector<unsigned char>& v, std::size_t at) {
    return (std::uint32_t{v[at]} << 24) | (std::uint32_t{v[at + 1]} << 16) | (std::uint32_t{v[at + 2]} << 8) | v[at + 3];
  };
  if (img.size() < 16 || lab.size() < 8 || be32(img, 0) != 0x803 || be32(lab, 0) != 0x801 ||
      be32(img, 8) * be32(img, 12) != 784) {
    *why = "not Fashion-MNIST IDX files: " + images;
    return false;
  }
  const int n = std::min<int>(limit, static_cast<int>(std::min(be32(img, 4), be32(lab, 4))));
  if (img.size() < 16 + static_cast<std::size_t>(n) * 784 || lab.size() < 8 + static_cast<std::size_t>(n)) {
    *why = "truncated IDX file " + images;
    return false;
  }
  out->count = n;
  out->pixels.resize(static_cast<std::size_t>(n) * 784);
  for (std::size_t i = 0; i < out->pixels.size(); ++i) out->pixels[i] = img[16 + i] / 255.0f;
  out->labels.assign(lab.begin() + 8, lab.begin() + 8 + n);
  return true;
}

TEST(FashionMnistSmoke, MlpLearnsInTwoShortEpochs) {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  if (!std::ifstream(dir + "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << dir << " not installed (Debian package dataset-fashion-mnist)";
  Images train, test;
  std::string why;
  ASSERT_TRUE(load_fashion(dir + "train-images-idx3-ubyte.gz", dir + "train-labels-idx1-ubyte.gz", 10000, &train, &why)) << why;
  ASSERT_TRUE(load_fashion(dir + "t10k-images-idx3-ubyte.gz", dir + "t10k-labels-idx1-ubyte.gz", 2000, &test, &why)) << why;

  ModelConfig c;  // the default mlp
  c.seed = 1;
  const auto model = make_model(c);
  Params p = init_local_params(*model);
  Grads g;
  const int batch = 32;
  const auto start = std::chrono::steady_clock::now();
  // The training file is not ordered by class, so passes in file order are fine epochs. Two
  // passes, not one: after one, test accuracy over model seeds 1-8 spanned 0.767-0.787 (too close
  // to the bar); after two, 0.794-0.819. It costs under a second at ~25k examples/s.
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int at = 0; at + batch <= train.count; at += batch) {
      const Inputs in{batch, train.pixels.data() + static_cast<std::size_t>(at) * 784, 784, nullptr, 0,
                      train.labels.data() + at};
      model->train_step(p, in, &g, nullptr);
      sgd_apply_local(p, g, 0.1f);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::int64_t correct = 0;
  const Inputs eval{test.count, test.pixels.data(), 784, nullptr, 0, test.labels.data()};
  const double loss = model->train_step(p, eval, nullptr, &correct);
  const double accuracy = static_cast<double>(correct) / test.count;
  std::printf("[ smoke    ] %s: 2 epochs of %d examples (SGD lr 0.1, batch 32) in %.2f s, test accuracy %.4f,"
              " loss %.4f on %d examples\n",
              model->describe().c_str(), train.count, seconds, accuracy, loss, test.count);
  EXPECT_GT(accuracy, 0.75);
}

}  // namespace
}  // namespace strata::model
