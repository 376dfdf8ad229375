// Unit tests of the layer graph (strata/nn/graph.h, strata/nn/graph_model.h).
//
// Gradients: every layer and loss is checked against central differences of the model's own
// loss, element by element over every variable (tables included, untouched rows too), and the
// checker is shown to reject a gradient that is off by 2% in one element. Embedding bags are
// also checked against sums written out by hand (repeated ids, padding, every combiner). The
// graph that mirrors the built-in mlp must reproduce its loss and gradients on the same
// parameters; training is bit-identical run to run and across threads; scopes keep names apart;
// a small in-process training run learns the synthetic click data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/common/error.h"
#include "strata/data/dataset.h"
#include "strata/model/model.h"
#include "strata/nn/graph.h"
#include "strata/nn/builtin.h"
#include "strata/nn/graph_model.h"

namespace strata::nn {
namespace {

::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not found in: " << haystack;
}

// A batch that owns its buffers.
struct Batch {
  int size = 0;
  int dense_dim = 0;
  int num_fields = 0;
  std::vector<float> dense;
  std::vector<std::int64_t> ids;
  std::vector<std::int32_t> labels;
  std::vector<float> targets;
  std::int64_t step = 0;
  std::int64_t first_example = 0;

  train::Inputs view() const {
    train::Inputs in;
    in.size = size;
    in.dense = dense.empty() ? nullptr : dense.data();
    in.dense_dim = dense_dim;
    in.sparse_ids = ids.empty() ? nullptr : ids.data();
    in.num_fields = num_fields;
    in.labels = labels.empty() ? nullptr : labels.data();
    in.targets = targets.empty() ? nullptr : targets.data();
    in.step = step;
    in.first_example = first_example;
    return in;
  }
};

// Dense features in [-1, 1], ids in [0, vocab) with about a quarter padding (kNoId) and repeats,
// labels in [0, classes), targets in [-1, 1].
Batch random_batch(int size, int dense_dim, int num_fields, std::int64_t vocab, int classes, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Batch b;
  b.size = size;
  b.dense_dim = dense_dim;
  b.num_fields = num_fields;
  for (int i = 0; i < size * dense_dim; ++i) b.dense.push_back(u(rng));
  for (int i = 0; i < size * num_fields; ++i)
    b.ids.push_back(rng() % 4 == 0 ? kNoId : static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(vocab)));
  for (int i = 0; i < size; ++i) {
    b.labels.push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(classes)));
    b.targets.push_back(u(rng));
  }
  return b;
}

// Parameters with every element random in [-scale, scale] (so biases and tables are not zero and
// every path carries gradient).
train::Params random_params(const train::Model& m, std::uint32_t seed, float scale = 0.5f) {
  train::Params p = init_local_params(m);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (auto& [name, d] : p.dense)
    for (float& v : d.value) v = u(rng);
  for (auto& [name, s] : p.sparse)
    for (float& v : s.values) v = u(rng);
  return p;
}

// Every parameter element as a float&, with the matching analytic gradient (0 for table rows the
// gradient does not list).
struct Element {
  std::string what;
  float* value;
  double grad;
};

std::vector<Element> elements(train::Params& p, const train::Grads& g) {
  std::vector<Element> out;
  for (auto& [name, d] : p.dense) {
    const auto it = g.dense.find(name);
    EXPECT_NE(it, g.dense.end()) << "no gradient for " << name;
    for (std::size_t i = 0; i < d.value.size(); ++i)
      out.push_back({name + "[" + std::to_string(i) + "]", &d.value[i], it == g.dense.end() ? 0.0 : it->second.value[i]});
  }
  for (auto& [name, s] : p.sparse) {
    const auto it = g.sparse.find(name);
    EXPECT_NE(it, g.sparse.end()) << "no gradient for " << name;
    for (std::size_t r = 0; r < s.rows.size(); ++r)
      for (int j = 0; j < s.width; ++j) {
        double grad = 0;
        if (it != g.sparse.end()) {
          const auto& rows = it->second.rows;
          const auto at = std::find(rows.begin(), rows.end(), s.rows[r]);
          if (at != rows.end()) grad = it->second.values[static_cast<std::size_t>(at - rows.begin()) * s.width + j];
        }
        out.push_back({name + "[row " + std::to_string(s.rows[r]) + "][" + std::to_string(j) + "]",
                       &s.values[r * s.width + j], grad});
      }
  }
  return out;
}

// Largest |analytic - central difference| / (atol + rtol * |central difference|) over every
// element: <= 1 passes. `corrupt` may change the analytic gradients first (to show a wrong one
// fails). The loss is the training-mode loss (dropout on, same mask every evaluation).
double gradient_error(const GraphModel& m, train::Params p, const train::Inputs& in, double eps,
                      const std::function<void(train::Grads&)>& corrupt = {}, std::string* worst = nullptr) {
  train::Grads g;
  m.step(p, in, &g);
  if (corrupt) corrupt(g);
  train::Grads scratch;
  double err = 0;
  for (Element& e : elements(p, g)) {
    const float saved = *e.value;
    *e.value = saved + static_cast<float>(eps);
    const double up = m.step(p, in, &scratch).loss;
    *e.value = saved - static_cast<float>(eps);
    const double down = m.step(p, in, &scratch).loss;
    *e.value = saved;
    // The step actually taken in float, not eps: saved +- eps rounds.
    const double h = static_cast<double>(saved + static_cast<float>(eps)) - static_cast<double>(saved - static_cast<float>(eps));
    const double fd = (up - down) / h;
    const double r = std::fabs(e.grad - fd) / (1e-4 + 1e-3 * std::fabs(fd));
    if (r > err) {
      err = r;
      if (worst) *worst = e.what + ": analytic " + std::to_string(e.grad) + ", numeric " + std::to_string(fd);
    }
  }
  return err;
}

// Multiplies the gradient element of largest magnitude by 1.02.
void corrupt_largest(train::Grads& g) {
  float* best = nullptr;
  for (auto& [name, d] : g.dense)
    for (float& v : d.value)
      if (best == nullptr || std::fabs(v) > std::fabs(*best)) best = &v;
  for (auto& [name, s] : g.sparse)
    for (float& v : s.values)
      if (best == nullptr || std::fabs(v) > std::fabs(*best)) best = &v;
  ASSERT_NE(best, nullptr);
  *best *= 1.02f;
}

struct Case {
  std::string name;
  std::function<Tensor(Graph&)> build;  // returns the output
  Loss loss;
  double eps = 1e-2;
};

void check_case(const Case& c) {
  SCOPED_TRACE(c.name);
  Graph g("t", 11);
  const Tensor out = c.build(g);
  GraphModel m(g, out, c.loss);
  const Batch b = random_batch(6, 5, 6, 9, out.width >= 2 ? out.width : 2, 3);
  Batch bin = b;
  if (c.loss == Loss::kSigmoidCrossEntropy)
    for (auto& y : bin.labels) y = y % 2;
  const train::Params p = random_params(m, 5);
  std::string worst;
  const double err = gradient_error(m, p, bin.view(), c.eps, {}, &worst);
  EXPECT_LE(err, 1.0) << worst;
  // The same check rejects a gradient that is 2% off in one element.
  const double wrong = gradient_error(m, p, bin.view(), c.eps, corrupt_largest);
  EXPECT_GT(wrong, 1.0) << "a corrupted gradient passed the check";
}

TEST(NnGradient, EveryLayerAndLossMatchesCentralDifferences) {
  const std::vector<Case> cases = {
      {"dense linear + softmax ce", [](Graph& g) { return g.dense(g.dense_input(0, 5), 3); },
       Loss::kSoftmaxCrossEntropy},
      {"dense tanh -> dense + sigmoid ce",
       [](Graph& g) { return g.dense(g.dense(g.dense_input(1, 4), 4, Activation::kTanh), 1); },
       Loss::kSigmoidCrossEntropy},
      {"dense sigmoid -> dense + mse",
       [](Graph& g) { return g.dense(g.dense(g.dense_input(0, 5), 3, Activation::kSigmoid), 1); },
       Loss::kMeanSquaredError},
      {"dense relu -> dense relu -> dense + mse",
       [](Graph& g) {
         return g.dense(g.dense(g.dense(g.dense_input(0, 5), 4, Activation::kRelu), 3, Activation::kRelu), 1);
       },
       Loss::kMeanSquaredError, 1e-3},
      {"embedding sum/mean/sqrtn + concatenate",
       [](Graph& g) {
         const Tensor a = g.embedding(g.ids_input(0, 3), 9, 2, Combiner::kSum);
         const Tensor b = g.embedding(g.ids_input(3, 2), 9, 3, Combiner::kMean);
         const Tensor c = g.embedding(g.ids_input(5, 1), 9, 2, Combiner::kSqrtn);
         return g.dense(g.concatenate({a, g.dense_input(0, 2), b, c}), 3, Activation::kTanh);
       },
       Loss::kSoftmaxCrossEntropy},
      {"shared table read twice + add + multiply",
       [](Graph& g) {
         const Table t = g.embedding_table(9, 3, "shared");
         const Tensor a = g.embedding(g.ids_input(0, 3), t, Combiner::kSqrtn);
         const Tensor b = g.embedding(g.ids_input(2, 4), t, Combiner::kSum);
         const Tensor d = g.dense(g.dense_input(0, 5), 3, Activation::kTanh);
         return g.dense(g.add({g.multiply({a, b, d}), a, d}), 1);
       },
       Loss::kSigmoidCrossEntropy},
      {"embedding sums -> add -> bias (a linear model without a Dense)",
       [](Graph& g) {
         const Tensor a = g.embedding(g.ids_input(0, 3), 9, 1, Combiner::kSum);
         const Tensor b = g.embedding(g.ids_input(3, 2), 9, 1, Combiner::kSum);
         return g.bias(g.add({a, b}));
       },
       Loss::kSigmoidCrossEntropy},
      {"dense -> bias -> dense + mse (bias between layers)",
       [](Graph& g) { return g.dense(g.bias(g.dense(g.dense_input(0, 5), 3, Activation::kTanh)), 1); },
       Loss::kMeanSquaredError},
      {"indicator -> dense",
       [](Graph& g) { return g.dense(g.indicator(g.ids_input(0, 4), 9), 2); }, Loss::kSoftmaxCrossEntropy},
      {"dot interaction with the first input",
       [](Graph& g) {
         const Tensor d = g.dense(g.dense_input(0, 5), 3, Activation::kTanh);
         const Tensor a = g.embedding(g.ids_input(0, 2), 9, 3, Combiner::kMean);
         const Tensor b = g.embedding(g.ids_input(2, 2), 9, 3, Combiner::kSum);
         return g.dense(g.dot_interaction({d, a, b}, true), 1);
       },
       Loss::kMeanSquaredError},
      {"dot interaction without the first input, a tensor twice",
       [](Graph& g) {
         const Tensor a = g.embedding(g.ids_input(0, 3), 9, 2, Combiner::kSum);
         const Tensor b = g.dense(g.dense_input(0, 5), 2);
         return g.dense(g.dot_interaction({a, b, a, b}, false), 2);
       },
       Loss::kSoftmaxCrossEntropy},
      {"cross network (x0, x0) then (x0, x1)",
       [](Graph& g) {
         const Tensor x0 = g.concatenate({g.dense_input(0, 3), g.embedding(g.ids_input(0, 2), 9, 2, Combiner::kMean)});
         const Tensor x1 = g.cross(x0, x0);
         return g.dense(g.cross(x0, x1), 1);
       },
       Loss::kSigmoidCrossEntropy},
      {"dropout between dense layers",
       [](Graph& g) {
         const Tensor h = g.dense(g.dense_input(0, 5), 6, Activation::kTanh);
         return g.dense(g.dropout(h, 0.4, 99), 3);
       },
       Loss::kSoftmaxCrossEntropy},
  };
  for (const Case& c : cases) check_case(c);
}

// ---- embedding bags written out by hand -------------------------------------------------------

TEST(NnEmbedding, BagsSumRepeatedIdsSkipPaddingAndCombine) {
  // One table of width 1, output = the bag's value; MSE, so d loss / d pred = 2 (pred - t) / B.
  const std::vector<std::vector<std::int64_t>> bags = {{3, 3, 5, kNoId}, {5, kNoId, kNoId, kNoId},
                                                       {kNoId, kNoId, kNoId, kNoId}, {7, 3, 3, 3}};
  for (Combiner comb : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    Graph g("bag", 1);
    GraphModel m(g, g.embedding(g.ids_input(1, 4), 10, 1, comb, "emb"), Loss::kMeanSquaredError);
    Batch b;
    b.size = 4;
    b.num_fields = 5;  // field 0 is not read
    for (const auto& bag : bags) {
      b.ids.push_back(9);
      b.ids.insert(b.ids.end(), bag.begin(), bag.end());
    }
    b.targets = {0.5f, -0.25f, 1.0f, 0.0f};
    train::Params p = init_local_params(m);
    auto& table = p.sparse.at("bag/emb/embeddings").values;
    for (int r = 0; r < 10; ++r) table[static_cast<std::size_t>(r)] = 0.1f * static_cast<float>(r + 1);
    std::vector<double> grad(10, 0.0);
    double loss = 0;
    for (std::size_t e = 0; e < bags.size(); ++e) {
      double sum = 0;
      int n = 0;
      for (std::int64_t id : bags[e])
        if (id != kNoId) sum += table[static_cast<std::size_t>(id)], ++n;
      const double scale = n == 0 ? 1.0 : comb == Combiner::kSum ? 1.0 : comb == Combiner::kMean ? 1.0 / n : 1.0 / std::sqrt(n);
      const double pred = sum * scale, err = pred - b.targets[e];
      loss += err * err / 4;
      for (std::int64_t id : bags[e])
        if (id != kNoId) grad[static_cast<std::size_t>(id)] += 2 * err / 4 * scale;
    }
    train::Grads gr;
    const train::StepResult r = m.step(p, b.view(), &gr);
    EXPECT_NEAR(r.loss, loss, 1e-6);
    const model::SparseParam& sg = gr.sparse.at("bag/emb/embeddings");
    EXPECT_EQ(sg.rows, (std::vector<std::int64_t>{3, 5, 7}));  // unique, ascending; field 0's 9 unread
    EXPECT_EQ(sg.width, 1);
    for (std::size_t k = 0; k < sg.rows.size(); ++k)
      EXPECT_NEAR(sg.values[k], grad[static_cast<std::size_t>(sg.rows[k])], 1e-6) << "row " << sg.rows[k];
    EXPECT_EQ(m.rows_needed("bag/emb/embeddings", b.view()), sg.rows);
    // A pulled subset (rows_needed, ascending) gives the same result as the whole table.
    train::Params pulled = p;
    model::SparseParam& sp = pulled.sparse.at("bag/emb/embeddings");
    sp.rows = sg.rows;
    sp.values = {table[3], table[5], table[7]};
    train::Grads g2;
    EXPECT_EQ(m.step(pulled, b.view(), &g2).loss, r.loss);
    EXPECT_EQ(g2.sparse.at("bag/emb/embeddings").values, sg.values);
    // ... and so does one in another order.
    sp.rows = {7, 3, 5};
    sp.values = {table[7], table[3], table[5]};
    train::Grads g3;
    EXPECT_EQ(m.step(pulled, b.view(), &g3).loss, r.loss);
    EXPECT_EQ(g3.sparse.at("bag/emb/embeddings").values, sg.values);
    // A row that was not pulled is named.
    sp.rows = {7, 3};
    sp.values = {table[7], table[3]};
    try {
      m.step(pulled, b.view(), &g3);
      ADD_FAILURE() << "a missing row was not reported";
    } catch (const Error& e) {
      EXPECT_TRUE(Contains(e.what(), "row 5 was not pulled"));
    }
  }
}

TEST(NnEmbedding, IdsOutsideTheTableAndIndicatorCounts) {
  Graph g("ind", 1);
  const Tensor ind = g.indicator(g.ids_input(0, 3), 4);
  GraphModel m(g, g.dense(ind, 1, Activation::kNone, "lin"), Loss::kMeanSquaredError);
  Batch b;
  b.size = 1;
  b.num_fields = 3;
  b.ids = {2, 2, kNoId};
  b.targets = {0};
  train::Params p = init_local_params(m);
  p.dense.at("ind/lin/kernel").value = {1, 10, 100, 1000};
  float pred = 0;
  ASSERT_TRUE(m.predict(p, b.view(), &pred));
  EXPECT_EQ(pred, 200.0f);  // id 2 twice: multi-hot count 2
  b.ids = {4, kNoId, kNoId};
  EXPECT_THROW(m.predict(p, b.view(), &pred), Error);

  Graph e("emb", 1);
  GraphModel me(e, e.embedding(e.ids_input(0, 1), 5, 1, Combiner::kSum, "t"), Loss::kMeanSquaredError);
  b.ids = {5, kNoId, kNoId};
  try {
    me.rows_needed("emb/t/embeddings", b.view());
    ADD_FAILURE() << "id 5 of a 5-row table was accepted";
  } catch (const Error& err) {
    EXPECT_TRUE(Contains(err.what(), "outside [0, 5) of 'emb/t/embeddings'"));
  }
  train::Grads gr;
  EXPECT_THROW(me.step(init_local_params(me), b.view(), &gr), Error);
}

// ---- dropout ------------------------------------------------------------------------------------

TEST(NnDropout, MaskIsAPureFunctionOfSeedStepAndExample) {
  Graph g("drop", 4);
  const Tensor x = g.dense_input(0, 64);
  GraphModel m(g, g.dense(g.dropout(x, 0.25, 7), 1, Activation::kNone, "lin"), Loss::kMeanSquaredError);
  Batch b = random_batch(8, 64, 0, 1, 2, 9);
  train::Params p = random_params(m, 2);
  train::Grads g1, g2;
  const double l1 = m.step(p, b.view(), &g1).loss;
  EXPECT_EQ(m.step(p, b.view(), &g2).loss, l1);
  EXPECT_EQ(g1.dense.at("drop/lin/kernel").value, g2.dense.at("drop/lin/kernel").value);
  // Examples 4..7 as their own slice starting at example 4: the same masks (replica split).
  double split = 0;
  for (int half = 0; half < 2; ++half) {
    Batch s = b;
    s.size = 4;
    s.dense.assign(b.dense.begin() + half * 4 * 64, b.dense.begin() + (half + 1) * 4 * 64);
    s.targets.assign(b.targets.begin() + half * 4, b.targets.begin() + (half + 1) * 4);
    s.first_example = half * 4;
    train::Grads gs;
    split += m.step(p, s.view(), &gs).loss / 2;
  }
  EXPECT_NEAR(split, l1, 1e-6);
  // Another step: another mask.
  b.step = 1;
  EXPECT_NE(m.step(p, b.view(), &g2).loss, l1);
  // For one example the kernel's gradient is dL/dpred * x * mask: some entries are dropped.
  b.step = 0;
  Batch one = b;
  one.size = 1;
  train::Grads g1one;
  m.step(p, one.view(), &g1one);
  int dropped = 0;
  for (int i = 0; i < 64; ++i) dropped += g1one.dense.at("drop/lin/kernel").value[static_cast<std::size_t>(i)] == 0.0f;
  EXPECT_GT(dropped, 4);
  EXPECT_LT(dropped, 32);
  // Not training (no gradients, predict): identity.
  std::vector<float> pred(8);
  ASSERT_TRUE(m.predict(p, b.view(), pred.data()));
  const std::vector<float>& w = p.dense.at("drop/lin/kernel").value;
  for (int e = 0; e < 8; ++e) {
    float want = 0;
    for (int j = 0; j < 64; ++j) want += b.dense[static_cast<std::size_t>(e * 64 + j)] * w[static_cast<std::size_t>(j)];
    EXPECT_NEAR(pred[static_cast<std::size_t>(e)], want + p.dense.at("drop/lin/bias").value[0], 1e-5);
  }
}

TEST(NnDropout, DropsAboutRateOfTheElements) {
  Graph g("drop", 4);
  GraphModel m(g, g.dense(g.dropout(g.dense_input(0, 100), 0.3, 1), 1), Loss::kMeanSquaredError);
  Batch b = random_batch(100, 100, 0, 1, 2, 1);
  for (float& v : b.dense) v = 1.0f;
  train::Params p = random_params(m, 1);
  train::Grads gr;
  m.step(p, b.view(), &gr);
  // d kernel[j] = sum over examples of dpred_e * mask_ej: with dpred != 0 everywhere, count the
  // kept elements through a one-example batch per example instead.
  int kept = 0;
  for (int e = 0; e < 100; ++e) {
    Batch one = b;
    one.size = 1;
    one.dense.assign(100, 1.0f);
    one.targets = {1e6f};  // dpred != 0
    one.first_example = e;
    m.step(p, one.view(), &gr);
    for (float v : gr.dense.at("drop/dense_0/kernel").value) kept += v != 0.0f;
  }
  EXPECT_NEAR(kept / 10000.0, 0.7, 0.03);
}

// ---- the built-in mlp as a graph ---------------------------------------------------------------

TEST(NnGraphModel, ReproducesTheBuiltinMlp) {
  model::ModelConfig c;
  c.name = "mlp";
  c.input_dim = 20;
  c.hidden = {16, 8};
  c.num_classes = 5;
  c.seed = 42;
  const auto mlp = make_builtin_model(c);
  Graph g("", 42);
  Tensor h = g.dense(g.dense_input(0, 20), 16, Activation::kRelu);
  h = g.dense(h, 8, Activation::kRelu);
  const Tensor logits = g.dense(h, 5, Activation::kNone, "logits");
  GraphModel m(g, logits, Loss::kSoftmaxCrossEntropy, "mlp");
  const auto want = mlp->variables(), got = m.variables();
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].shape, want[i].shape);
    EXPECT_EQ(got[i].init.to_string(), want[i].init.to_string());
  }
  EXPECT_EQ(m.num_parameters(), mlp->num_parameters());
  const train::Params p = init_local_params(*mlp);
  const Batch b = random_batch(32, 20, 0, 1, 5, 8);
  model::Grads gw, gg;
  const train::StepResult builtin = mlp->step(p, b.view(), &gw);
  const train::StepResult r = m.step(p, b.view(), &gg);
  EXPECT_EQ(r.loss, builtin.loss);
  EXPECT_EQ(r.correct, builtin.correct);
  for (const auto& [name, d] : gw.dense) EXPECT_EQ(gg.dense.at(name).value, d.value) << name;
  // Both are dense stacks a GPU replica can run; a graph with any other layer is not.
  train::DenseStackShape shape;
  ASSERT_TRUE(mlp->dense_stack_shape(&shape));
  EXPECT_EQ(shape.input_dim, 20);
  EXPECT_EQ(shape.hidden, (std::vector<int>{16, 8}));
  EXPECT_EQ(shape.num_classes, 5);
  EXPECT_TRUE(m.dense_stack_shape(nullptr));
  Graph d("", 42);
  const Tensor dl = d.dense(d.dropout(d.dense(d.dense_input(0, 20), 16, Activation::kRelu), 0.1, 3), 5);
  EXPECT_FALSE(GraphModel(d, dl, Loss::kSoftmaxCrossEntropy).dense_stack_shape(nullptr));
  Graph t("", 42);
  const Tensor tl = t.dense(t.dense(t.dense_input(0, 20), 16, Activation::kTanh), 5);
  EXPECT_FALSE(GraphModel(t, tl, Loss::kSoftmaxCrossEntropy).dense_stack_shape(nullptr));
  Graph o("", 42);
  const Tensor ol = o.dense(o.dense_input(2, 18), 5);
  EXPECT_FALSE(GraphModel(o, ol, Loss::kSoftmaxCrossEntropy).dense_stack_shape(nullptr));
  c.name = "wide_deep";
  c.num_fields = 3;
  c.vocab = 10;
  EXPECT_FALSE(make_builtin_model(c)->dense_stack_shape(nullptr));
  EXPECT_EQ(m.describe(), "mlp: 20 -> 16-8-5 (517 parameters)");
  EXPECT_EQ(m.default_optimizer(), "adam");
  GraphModel tuned(g, logits, Loss::kSoftmaxCrossEntropy, "mlp",
                   TrainingDefaults{"sgd", 0.5, 3});
  EXPECT_EQ(tuned.default_optimizer(), "sgd");
  EXPECT_EQ(tuned.default_learning_rate(), 0.5);
  EXPECT_EQ(tuned.default_epochs(), 3);
}

// ---- reproducibility and threads ---------------------------------------------------------------

std::vector<float> train_flat(const GraphModel& m, const std::vector<Batch>& batches, int steps) {
  train::Params p = init_local_params(m);
  train::Grads g;
  for (int s = 0; s < steps; ++s) {
    Batch b = batches[static_cast<std::size_t>(s) % batches.size()];
    b.step = s;
    m.step(p, b.view(), &g);
    model::sgd_apply_local(p, g, 0.05f);
  }
  std::vector<float> flat;
  for (const auto& [n, d] : p.dense) flat.insert(flat.end(), d.value.begin(), d.value.end());
  for (const auto& [n, s] : p.sparse) flat.insert(flat.end(), s.values.begin(), s.values.end());
  return flat;
}

TEST(NnGraphModel, BitIdenticalRunToRunAndAcrossThreads) {
  Graph g("ctr", 5);
  Tensor out;
  {
    std::vector<Tensor> embs;
    embs.push_back(g.dense(g.dense_input(0, 4), 8, Activation::kRelu));
    for (int f = 0; f < 4; ++f) embs.push_back(g.embedding(g.ids_input(f, 1), 50, 8, Combiner::kSum));
    const Tensor x = g.dot_interaction(embs, true);
    Tensor h = g.dropout(g.dense(g.cross(x, x), 16, Activation::kRelu), 0.1, 3);
    out = g.add({g.dense(h, 1), g.embedding(g.ids_input(0, 4), 50, 1, Combiner::kSum, "wide")});
  }
  GraphModel a(g, out, Loss::kSigmoidCrossEntropy), b(g, out, Loss::kSigmoidCrossEntropy);
  std::vector<Batch> batches;
  for (int i = 0; i < 4; ++i) {
    Batch x = random_batch(32, 4, 4, 50, 2, static_cast<std::uint32_t>(i));
    batches.push_back(x);
  }
  const std::vector<float> first = train_flat(a, batches, 12);
  const std::vector<float> second = train_flat(b, batches, 12);
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0);
  // Four threads training on one model at once (one workspace each) reproduce it too.
  std::vector<std::vector<float>> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { results[static_cast<std::size_t>(t)] = train_flat(a, batches, 12); });
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_TRUE(r == first);
}

// ---- names and scopes --------------------------------------------------------------------------

TEST(NnGraph, ScopesNamesAndClashes) {
  auto build = [](const std::string& scope) {
    Graph g(scope, 1);
    Tensor h = g.dense(g.dense_input(0, 3), 4, Activation::kRelu);
    {
      auto tower = g.name_scope("tower");
      h = g.dense(h, 2);
    }
    h = g.dense(g.concatenate({h, g.embedding(g.ids_input(0, 2), 10, 2)}), 1, Activation::kNone, "out");
    return std::make_unique<GraphModel>(g, h, Loss::kSigmoidCrossEntropy);
  };
  const auto a = build("a"), b = build("b"), a2 = build("a");
  std::vector<std::string> names;
  for (const auto& v : a->variables()) names.push_back(v.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a/dense_0/kernel", "a/dense_0/bias", "a/tower/dense_1/kernel",
                                             "a/tower/dense_1/bias", "a/embedding_0/embeddings", "a/out/kernel",
                                             "a/out/bias"}));
  EXPECT_EQ(a->sparse_variables(), std::vector<std::string>{"a/embedding_0/embeddings"});
  EXPECT_NO_THROW(check_disjoint_variables(*a, *b));
  try {
    check_disjoint_variables(*a, *a2);
    ADD_FAILURE() << "two graphs in one scope were not reported";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), "'a/dense_0/kernel'"));
  }
  // Different scopes also seed differently.
  EXPECT_NE(a->variables()[0].init.seed, b->variables()[0].init.seed);
  // A name twice in one graph, and names that are not one segment.
  Graph g("s");
  g.dense(g.dense_input(0, 2), 2, Activation::kNone, "fc");
  try {
    g.dense(g.dense_input(0, 2), 2, Activation::kNone, "fc");
    ADD_FAILURE() << "a duplicate layer name was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), "'s/fc/kernel' is used twice"));
  }
  EXPECT_THROW(Graph("a/b"), ConfigError);
  EXPECT_THROW(g.name_scope("x/y"), ConfigError);
}

TEST(NnGraph, RejectsMalformedGraphsAndInputs) {
  Graph g("m");
  const Tensor x = g.dense_input(2, 3);
  EXPECT_THROW(g.add({x, g.dense_input(0, 2)}), ConfigError);
  EXPECT_THROW(g.cross(x, g.dense_input(0, 2)), ConfigError);
  EXPECT_THROW(g.dense(Tensor{99, 3}, 2), ConfigError);
  EXPECT_THROW(g.dropout(x, 1.0, 1), ConfigError);
  EXPECT_THROW(g.ids_input(0, 0), ConfigError);
  EXPECT_THROW(GraphModel(g, g.dense(x, 2), Loss::kSigmoidCrossEntropy), ConfigError);
  const Tensor logits = g.dense(x, 3);
  GraphModel m(g, logits, Loss::kSoftmaxCrossEntropy);
  Batch b = random_batch(4, 4, 0, 1, 3, 1);
  train::Grads gr;
  const train::Params p = init_local_params(m);
  try {
    m.step(p, b.view(), &gr);
    ADD_FAILURE() << "4 dense columns accepted for a graph reading 5";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "reads 5 dense feature columns, the inputs have 4"));
  }
  b = random_batch(4, 5, 0, 1, 3, 1);
  b.labels[2] = 3;
  EXPECT_THROW(m.step(p, b.view(), &gr), Error);
  b.labels[2] = 0;
  train::Params missing = p;
  missing.dense.erase(missing.dense.begin());
  EXPECT_THROW(m.step(missing, b.view(), &gr), Error);
  EXPECT_NO_THROW(m.step(p, b.view(), &gr));
  // An empty slice: loss 0 and zero gradients (not the previous step's).
  b.size = 0;
  EXPECT_EQ(m.step(p, b.view(), &gr).loss, 0.0);
  for (const auto& [name, d] : gr.dense)
    for (float v : d.value) EXPECT_EQ(v, 0.0f) << name;
}

// ---- predictions --------------------------------------------------------------------------------

TEST(NnGraphModel, PredictionsPerHead) {
  const Batch b = random_batch(5, 4, 0, 1, 3, 2);
  float z[15];
  {
    Graph g("p");
    const Tensor logits = g.dense(g.dense_input(0, 4), 3);
    GraphModel m(g, logits, Loss::kSoftmaxCrossEntropy);
    EXPECT_EQ(m.prediction_kind(), train::PredictionKind::kClassProbabilities);
    EXPECT_EQ(m.prediction_width(), 3);
    const train::Params p = random_params(m, 3);
    ASSERT_TRUE(m.predict(p, b.view(), z));
    for (int e = 0; e < 5; ++e) EXPECT_NEAR(z[3 * e] + z[3 * e + 1] + z[3 * e + 2], 1.0f, 1e-6f);
    // argmax of the probabilities is what step() counts as correct.
    std::int64_t correct = 0;
    for (int e = 0; e < 5; ++e)
      correct += std::max_element(z + 3 * e, z + 3 * e + 3) - (z + 3 * e) == b.labels[static_cast<std::size_t>(e)];
    EXPECT_EQ(m.step(p, b.view(), nullptr).correct, correct);
  }
  {
    Graph g("p");
    GraphModel m(g, g.dense(g.dense_input(0, 4), 1), Loss::kSigmoidCrossEntropy);
    EXPECT_EQ(m.prediction_kind(), train::PredictionKind::kBinaryProbability);
    const train::Params p = random_params(m, 3);
    Batch bin = b;
    for (auto& y : bin.labels) y %= 2;
    ASSERT_TRUE(m.predict(p, bin.view(), z));
    std::int64_t correct = 0;
    double loss = 0;
    for (int e = 0; e < 5; ++e) {
      correct += (z[e] >= 0.5f) == (bin.labels[static_cast<std::size_t>(e)] == 1);
      loss -= std::log(bin.labels[static_cast<std::size_t>(e)] == 1 ? z[e] : 1 - z[e]) / 5;
    }
    const train::StepResult r = m.step(p, bin.view(), nullptr);
    EXPECT_EQ(r.correct, correct);
    EXPECT_NEAR(r.loss, loss, 1e-5);
  }
  {
    Graph g("p");
    GraphModel m(g, g.dense(g.dense_input(0, 4), 1), Loss::kMeanSquaredError);
    EXPECT_EQ(m.prediction_kind(), train::PredictionKind::kRegression);
    const train::Params p = random_params(m, 3);
    ASSERT_TRUE(m.predict(p, b.view(), z));
    double loss = 0;
    for (int e = 0; e < 5; ++e) loss += std::pow(z[e] - b.targets[static_cast<std::size_t>(e)], 2) / 5;
    EXPECT_NEAR(m.step(p, b.view(), nullptr).loss, loss, 1e-6);
    Batch no_targets = b;
    no_targets.targets.clear();
    EXPECT_THROW(m.step(p, no_targets.view(), nullptr), Error);
  }
}

// ---- learning ------------------------------------------------------------------------------------

TEST(NnGraphModel, WideAndDeepLearnsSyntheticClicks) {
  const int fields = 8;
  const std::int64_t vocab = 2000;
  const data::Dataset all = data::make_synthetic_sparse(12000, fields, vocab, 1.0, 17, 4);
  Graph g("ctr", 3);
  const Ids ids = g.ids_input(0, fields);
  std::vector<Tensor> deep_in{g.dense_input(0, 4)};
  for (int f = 0; f < fields; ++f) deep_in.push_back(g.embedding(g.ids_input(f, 1), vocab, 4, Combiner::kSum));
  Tensor h = g.dense(g.concatenate(deep_in), 32, Activation::kRelu);
  h = g.dense(h, 1);
  const Tensor wide = g.embedding(ids, vocab, 1, Combiner::kSum, "wide");
  GraphModel m(g, g.add({h, wide}), Loss::kSigmoidCrossEntropy, "wide_deep");
  EXPECT_EQ(m.describe(), "wide_deep ctr: 4+8x4+1x1 -> 32-1 (" + std::to_string(m.num_parameters()) + " parameters)");
  train::Params p = init_local_params(m);
  train::Grads grads;
  const int train_n = 10000, batch = 64;
  auto slice = [&](std::int64_t first, int n) {
    train::Inputs in;
    in.size = n;
    in.dense = all.features.data() + first * all.dense_dim;
    in.dense_dim = all.dense_dim;
    in.sparse_ids = all.sparse_ids.data() + first * all.num_fields;
    in.num_fields = all.num_fields;
    in.labels = all.labels.data() + first;
    return in;
  };
  for (int epoch = 0; epoch < 4; ++epoch)
    for (int first = 0; first + batch <= train_n; first += batch) {
      m.step(p, slice(first, batch), &grads);
      model::sgd_apply_local(p, grads, 0.5f);
    }
  const train::StepResult r = m.step(p, slice(train_n, 2000), nullptr);
  const double accuracy = static_cast<double>(r.correct) / 2000;
  EXPECT_GT(accuracy, 0.75) << "chance is 0.5, the oracle about 0.92";
}


// ---- dynamic tables ----------------------------------------------------------------------------

// An arbitrary int64 id for small id k (never kNoId): large, negative and beyond any vocabulary.
std::int64_t far_id(std::int64_t k) {
  if (k == kNoId) return kNoId;
  return (k % 2 == 0) ? (k + 1) * 0x10000000001LL : -(k + 2) * 0x7000000000003LL;
}

// The batch with every id mapped by far_id.
Batch far_batch(Batch b) {
  for (auto& id : b.ids) id = far_id(id);
  return b;
}

// Parameters of a model with dynamic tables: its dense variables and fixed tables from
// random_params, and for every dynamic table the rows of the ids `in` reads (random too).
train::Params dynamic_params(const GraphModel& m, const train::Inputs& in, std::uint32_t seed) {
  train::Params p = random_params(m, seed);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (const ps::DynamicVariableSpec& d : m.dynamic_variables()) {
    model::SparseParam& sp = p.sparse[d.name];
    sp.rows = m.rows_needed(d.name, in);
    sp.width = static_cast<int>(d.dim);
    sp.values.resize(sp.rows.size() * static_cast<std::size_t>(d.dim));
    for (float& v : sp.values) v = u(rng);
  }
  return p;
}

TEST(NnDynamicEmbedding, GradientsMatchCentralDifferencesForEveryCombiner) {
  Graph g("dyn", 3);
  const Table t = g.dynamic_embedding_table(3, "shared");
  const Tensor a = g.embedding(g.ids_input(0, 3), t, Combiner::kSum);
  const Tensor b = g.embedding(g.ids_input(2, 3), t, Combiner::kMean);
  const Tensor c = g.embedding(g.ids_input(5, 1), g.dynamic_embedding_table(2), Combiner::kSqrtn);
  const Tensor fixed = g.embedding(g.ids_input(1, 2), 9, 2, Combiner::kSqrtn);
  const Tensor x = g.concatenate({g.dense_input(0, 3), a, b, c, fixed});
  const Tensor out = g.dense(g.dense(x, 4, Activation::kTanh), 1);
  GraphModel m(g, out, Loss::kSigmoidCrossEntropy);
  Batch bin = far_batch(random_batch(6, 5, 6, 9, 2, 3));
  // The fixed table reads fields 1..2: keep its ids in range.
  const Batch plain = random_batch(6, 5, 6, 9, 2, 3);
  for (int e = 0; e < bin.size; ++e)
    for (int f = 1; f <= 2; ++f) {
      const auto k = static_cast<std::size_t>(e * 6 + f);
      bin.ids[k] = plain.ids[k];
    }
  // Fields 1..2 are read by the shared dynamic table too (fields 0..4): their ids are kept small
  // there, which a dynamic table takes like any other.
  const train::Params p = dynamic_params(m, bin.view(), 5);
  ASSERT_EQ(m.dynamic_variables().size(), 2u);
  std::string worst;
  EXPECT_LE(gradient_error(m, p, bin.view(), 1e-2, {}, &worst), 1.0) << worst;
  EXPECT_GT(gradient_error(m, p, bin.view(), 1e-2, corrupt_largest), 1.0) << "a corrupted gradient passed the check";
}

TEST(NnDynamicEmbedding, EqualsTheFixedTableOnTheSameRowsBitForBit) {
  // The same graph with a fixed [10, 3] table and with a dynamic one whose id far_id(k) holds row
  // k: losses, predictions and gradients are equal bit for bit, for every combiner.
  for (Combiner comb : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    Graph gf("m", 9), gd("m", 9);
    const Tensor ef = gf.embedding(gf.ids_input(0, 4), 10, 3, comb, "emb");
    const Tensor ed = gd.embedding(gd.ids_input(0, 4), gd.dynamic_embedding_table(3, "emb"), comb);
    GraphModel mf(gf, gf.dense(gf.concatenate({gf.dense_input(0, 2), ef}), 1), Loss::kSigmoidCrossEntropy);
    GraphModel md(gd, gd.dense(gd.concatenate({gd.dense_input(0, 2), ed}), 1), Loss::kSigmoidCrossEntropy);
    Batch b = random_batch(16, 2, 4, 10, 2, 21);
    const Batch bd = far_batch(b);
    train::Params pf = random_params(mf, 8);
    train::Params pd = pf;
    model::SparseParam& table = pd.sparse.at("m/emb/embeddings");
    std::vector<std::pair<std::int64_t, int>> order;
    for (int k = 0; k < 10; ++k) order.emplace_back(far_id(k), k);
    std::sort(order.begin(), order.end());
    std::vector<std::int64_t> rows;
    std::vector<float> values;
    for (const auto& [id, k] : order) {
      rows.push_back(id);
      const std::vector<float>& fixed_rows = pf.sparse.at("m/emb/embeddings").values;
      for (int j = 0; j < 3; ++j) values.push_back(fixed_rows[static_cast<std::size_t>(k * 3 + j)]);
    }
    table.rows = rows;
    table.values = values;
    train::Grads gf_, gd_;
    const train::StepResult rf = mf.step(pf, b.view(), &gf_);
    const train::StepResult rd = md.step(pd, bd.view(), &gd_);
    EXPECT_EQ(rf.loss, rd.loss);
    EXPECT_EQ(rf.correct, rd.correct);
    for (const auto& [name, d] : gf_.dense) EXPECT_EQ(d.value, gd_.dense.at(name).value) << name;
    const model::SparseParam& sf = gf_.sparse.at("m/emb/embeddings");
    const model::SparseParam& sd = gd_.sparse.at("m/emb/embeddings");
    ASSERT_EQ(sf.rows.size(), sd.rows.size());
    for (std::size_t r = 0; r < sd.rows.size(); ++r) {
      const auto small = std::find_if(order.begin(), order.end(), [&](const auto& o) { return o.first == sd.rows[r]; });
      ASSERT_NE(small, order.end());
      const auto it = std::find(sf.rows.begin(), sf.rows.end(), small->second);
      ASSERT_NE(it, sf.rows.end());
      const std::size_t k = static_cast<std::size_t>(it - sf.rows.begin());
      for (int j = 0; j < 3; ++j) EXPECT_EQ(sd.values[r * 3 + j], sf.values[k * 3 + j]) << "id " << sd.rows[r];
    }
    EXPECT_TRUE(std::is_sorted(sd.rows.begin(), sd.rows.end()));
    std::vector<float> pred_f(16), pred_d(16);
    ASSERT_TRUE(mf.predict(pf, b.view(), pred_f.data()));
    ASSERT_TRUE(md.predict(pd, bd.view(), pred_d.data()));
    EXPECT_EQ(pred_f, pred_d);
  }
}

TEST(NnDynamicEmbedding, DeclarationsIdsAndErrors) {
  Graph g("s", 4);
  DynamicTableOptions o;
  o.admit_after = 3;
  o.capacity = 1000;
  o.ttl = 20;
  const Table t = g.dynamic_embedding_table(4, "users", std::nullopt, o);
  EXPECT_TRUE(t.dynamic);
  EXPECT_EQ(t.vocab, 0);
  const Tensor e = g.embedding(g.ids_input(0, 2), t, Combiner::kSum);
  GraphModel m(g, g.dense(e, 1), Loss::kMeanSquaredError);
  // Not a dense variable; a sparse one and a dynamic one, with the options and a seeded init.
  for (const ps::VariableSpec& v : m.variables()) EXPECT_NE(v.name, "s/users/embeddings");
  EXPECT_EQ(m.sparse_variables(), std::vector<std::string>{"s/users/embeddings"});
  ASSERT_EQ(m.dynamic_variables().size(), 1u);
  const ps::DynamicVariableSpec d = m.dynamic_variables()[0];
  EXPECT_EQ(d.name, "s/users/embeddings");
  EXPECT_EQ(d.dim, 4);
  EXPECT_EQ(d.admit_after, 3);
  EXPECT_EQ(d.capacity, 1000);
  EXPECT_EQ(d.ttl, 20);
  EXPECT_EQ(d.init.seed, model::derive_seed(4, "s/users/embeddings"));
  EXPECT_EQ(init_local_params(m).sparse.count("s/users/embeddings"), 0u);
  // Any id but kNoId: unique, ascending.
  Batch b;
  b.size = 3;
  b.num_fields = 2;
  b.ids = {std::numeric_limits<std::int64_t>::max(), -5, kNoId, 7, -5, std::numeric_limits<std::int64_t>::min()};
  b.targets = {0, 0, 0};
  EXPECT_EQ(m.rows_needed("s/users/embeddings", b.view()),
            (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), -5, 7,
                                       std::numeric_limits<std::int64_t>::max()}));
  // A row that was not looked up is named.
  train::Params p = random_params(m, 1);
  model::SparseParam& sp = p.sparse["s/users/embeddings"];
  sp.width = 4;
  sp.rows = {-5, 7};
  sp.values.assign(8, 0.25f);
  train::Grads gr;
  try {
    m.step(p, b.view(), &gr);
    ADD_FAILURE() << "a missing row was not reported";
  } catch (const Error& err) {
    EXPECT_TRUE(Contains(err.what(), "was not pulled"));
  }
  // Bad declarations: ConfigErrors naming the table and the field.
  Graph h("s", 4);
  DynamicTableOptions bad;
  bad.ttl = -1;
  EXPECT_THROW(h.dynamic_embedding_table(4, "a", std::nullopt, bad), ConfigError);
  bad = {};
  bad.max_ids = 0;
  EXPECT_THROW(h.dynamic_embedding_table(4, "b", std::nullopt, bad), ConfigError);
  EXPECT_THROW(h.dynamic_embedding_table(0, "c"), ConfigError);
  EXPECT_THROW(h.dynamic_embedding_table(4, "d", ps::Initializer::glorot_uniform(1)), ConfigError);
  // A dynamic Table handed over as a fixed one (or the reverse) is not a table of this graph.
  Table forged = h.dynamic_embedding_table(2, "e");
  forged.dynamic = false;
  EXPECT_THROW(h.embedding(h.ids_input(0, 1), forged), ConfigError);
}

}  // namespace
}  // namespace strata::nn
