// The built-in models wired from layers (strata/nn/builtin.h).
#include "strata/nn/builtin.h"

#include <utility>

#include "strata/nn/graph.h"

namespace strata::nn {
namespace {

// Dense ReLU layers named dense_<i> then a linear "logits" layer, under the graph's current name
// scope: the names the built-in models' checkpoints carry.
Tensor dense_stack(Graph& g, Tensor x, const std::vector<int>& hidden, int classes) {
  for (std::size_t i = 0; i < hidden.size(); ++i)
    x = g.dense(x, hidden[i], Activation::kRelu, "dense_" + std::to_string(i));
  return g.dense(x, classes, Activation::kNone, "logits");
}

}  // namespace

std::unique_ptr<GraphModel> make_builtin_model(const model::ModelConfig& config) {
  const model::ModelConfig c = model::resolve_model_config(config);
  Graph g("", c.seed);
  if (c.name != "wide_deep") {
    const Tensor logits = dense_stack(g, g.dense_input(0, c.input_dim), c.hidden, c.num_classes);
    return std::make_unique<GraphModel>(g, logits, Loss::kSoftmaxCrossEntropy, c.name,
                                        TrainingDefaults{"adam", 0, 20});
  }
  const Table wide_table = g.embedding_table(c.vocab, c.num_classes, "wide", ps::Initializer::zeros(), "weights");
  const Tensor wide = g.embedding(g.ids_input(0, c.num_fields), wide_table, Combiner::kSum);
  const Table deep_table = g.embedding_table(c.vocab, c.embed_dim, "deep", std::nullopt, "embedding");
  std::vector<Tensor> parts;
  parts.reserve(static_cast<std::size_t>(c.num_fields) + 1);
  for (int f = 0; f < c.num_fields; ++f) parts.push_back(g.embedding(g.ids_input(f, 1), deep_table, Combiner::kSum));
  if (c.input_dim > 0) parts.push_back(g.dense_input(0, c.input_dim));
  Tensor deep_logits;
  {
    const Graph::NameScope deep = g.name_scope("deep");
    deep_logits = dense_stack(g, g.concatenate(parts), c.hidden, c.num_classes);
  }
  const Tensor logits = g.add({wide, deep_logits});
  return std::make_unique<GraphModel>(g, logits, Loss::kSoftmaxCrossEntropy, c.name,
                                      TrainingDefaults{"adagrad", 0.2, 3});
}

std::unique_ptr<GraphModel> make_builtin_model(const std::string& name, const std::vector<int>& hidden,
                                               std::uint64_t seed, const data::Dataset& train) {
  model::ModelConfig m;
  m.name = name;
  m.input_dim = train.dense_dim;
  m.num_classes = train.num_classes;
  m.hidden = hidden;
  m.num_fields = train.num_fields;
  m.vocab = train.sparse_vocab;
  m.seed = seed;
  return make_builtin_model(m);
}

}  // namespace strata::nn
