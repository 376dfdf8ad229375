// Canned estimators: see strata/nn/estimator.h.
#include "strata/nn/estimator.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "strata/common/error.h"

namespace strata::nn {
namespace {

struct KindName {
  EstimatorKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {EstimatorKind::kLinearClassifier, "LinearClassifier"},
    {EstimatorKind::kLinearRegressor, "LinearRegressor"},
    {EstimatorKind::kDNNClassifier, "DNNClassifier"},
    {EstimatorKind::kDNNRegressor, "DNNRegressor"},
    {EstimatorKind::kDNNLinearCombinedClassifier, "DNNLinearCombinedClassifier"},
    {EstimatorKind::kDNNLinearCombinedRegressor, "DNNLinearCombinedRegressor"},
    {EstimatorKind::kDLRM, "DLRM"},
};

bool has_linear(EstimatorKind k) {
  return k == EstimatorKind::kLinearClassifier || k == EstimatorKind::kLinearRegressor ||
         k == EstimatorKind::kDNNLinearCombinedClassifier || k == EstimatorKind::kDNNLinearCombinedRegressor;
}
bool has_dnn(EstimatorKind k) {
  return k == EstimatorKind::kDNNClassifier || k == EstimatorKind::kDNNRegressor ||
         k == EstimatorKind::kDNNLinearCombinedClassifier || k == EstimatorKind::kDNNLinearCombinedRegressor;
}

bool is_categorical_kind(data::ColumnKind k) {
  switch (k) {
    case data::ColumnKind::kBucketized:
    case data::ColumnKind::kIdentity:
    case data::ColumnKind::kHashBucket:
    case data::ColumnKind::kVocabulary:
    case data::ColumnKind::kCrossed:
      return true;
    default:
      return false;
  }
}

Combiner combiner_of(data::Combiner c) {
  switch (c) {
    case data::Combiner::kSum: return Combiner::kSum;
    case data::Combiner::kSqrtn: return Combiner::kSqrtn;
    case data::Combiner::kMean: break;
  }
  return Combiner::kMean;
}

// A layer name from a column name: one path segment of [A-Za-z0-9_.-] (graph.h), other bytes
// replaced by '_' (a CSV header may name a column "click rate").
std::string segment(const std::string& column) {
  std::string s = column.empty() ? "column" : column;
  for (char& c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-';
    if (!ok) c = '_';
  }
  if (s == "." || s == "..") s = "_" + s;
  return s;
}

// True when an optimizer spec ("NAME:KEY=VALUE,...") sets the learning rate itself.
bool names_learning_rate(const std::string& spec) {
  const auto colon = spec.find(':');
  if (colon == std::string::npos) return false;
  std::size_t begin = colon + 1;
  while (begin <= spec.size()) {
    const std::size_t end = std::min(spec.find(',', begin), spec.size());
    const std::string key = spec.substr(begin, spec.find('=', begin) < end ? spec.find('=', begin) - begin : end - begin);
    if (key == "lr" || key == "learning_rate") return true;
    begin = end + 1;
  }
  return false;
}

// One part's optimizer: `spec` (or `fallback` when none is named), its learning rate from the spec's
// lr= key, else `lr` (> 0), else `default_lr`.
ps::OptimizerConfig part_optimizer(const std::string& member, const std::string& spec, const std::string& fallback,
                                   const std::string& lr_member, double lr, double default_lr) {
  if (lr < 0 || !std::isfinite(lr))
    throw ConfigError(lr_member + ": must be a positive number, got " + std::to_string(lr));
  const std::string& text = spec.empty() ? fallback : spec;
  if (lr > 0 && names_learning_rate(text))
    throw ConfigError(lr_member + ": the learning rate is also set in " + member + " '" + text + "' (give it once)");
  ps::OptimizerConfig c;
  try {
    c = ps::OptimizerConfig::parse(text);
  } catch (const ConfigError& e) {
    throw ConfigError(member + ": " + e.message());
  }
  if (!names_learning_rate(text)) {
    c.learning_rate = lr > 0 ? lr : default_lr;
    c.validate();
  }
  return c;
}

// A GraphModel whose variables carry their part's optimizer (part_optimizers): the parameter
// servers lay out and apply each variable's own.
class EstimatorModel final : public GraphModel {
 public:
  EstimatorModel(const Graph& graph, Tensor output, Loss loss, std::string name, TrainingDefaults defaults,
                 std::vector<std::pair<std::string, ps::OptimizerConfig>> parts)
      : GraphModel(graph, output, loss, std::move(name), std::move(defaults)), parts_(std::move(parts)) {}

  std::vector<ps::VariableSpec> variables() const override {
    std::vector<ps::VariableSpec> specs = GraphModel::variables();
    for (ps::VariableSpec& v : specs)
      for (const auto& [prefix, optimizer] : parts_)
        if (v.name.compare(0, prefix.size(), prefix) == 0) v.optimizer = optimizer;
    return specs;
  }

 private:
  std::vector<std::pair<std::string, ps::OptimizerConfig>> parts_;
};

class Builder {
 public:
  Builder(const EstimatorConfig& config, const data::FeatureLayout& layout)
      : config_(config), layout_(layout), graph_(config.scope, config.seed), what_(to_string(config.kind)) {
    if (is_regressor(config.kind)) {
      outputs_ = 1;
      loss_ = Loss::kMeanSquaredError;
    } else {
      if (config.n_classes < 2) throw ConfigError(what_ + ": n_classes must be >= 2, got " + std::to_string(config.n_classes));
      outputs_ = config.n_classes == 2 ? 1 : config.n_classes;
      loss_ = config.n_classes == 2 ? Loss::kSigmoidCrossEntropy : Loss::kSoftmaxCrossEntropy;
    }
    if (config.dropout < 0 || config.dropout >= 1 || !std::isfinite(config.dropout))
      throw ConfigError(what_ + ": dropout must be in [0, 1), got " + std::to_string(config.dropout));
    for (int u : config.hidden_units)
      if (u < 1) throw ConfigError(what_ + ": hidden_units must be positive, got " + std::to_string(u));
    for (int u : config.bottom_units)
      if (u < 1) throw ConfigError(what_ + ": bottom_units must be positive, got " + std::to_string(u));
  }

  std::unique_ptr<GraphModel> build() {
    const EstimatorKind k = config_.kind;
    Tensor logits;
    if (k == EstimatorKind::kDLRM) {
      logits = dlrm();
    } else {
      std::vector<Tensor> parts;
      if (has_linear(k)) {
        if (config_.linear_feature_columns.empty()) throw ConfigError(what_ + ": no linear feature columns");
        parts.push_back(linear());
      }
      if (has_dnn(k)) {
        if (config_.dnn_feature_columns.empty()) throw ConfigError(what_ + ": no dnn feature columns");
        parts.push_back(dnn());
      }
      logits = parts.size() == 1 ? parts[0] : graph_.add(parts);
    }
    std::string optimizer = "adagrad";
    double lr = 0.05;
    if (k == EstimatorKind::kLinearClassifier || k == EstimatorKind::kLinearRegressor) {
      optimizer = "ftrl";
      lr = std::min(0.2, 1.0 / std::sqrt(static_cast<double>(config_.linear_feature_columns.size())));
    }
    auto parts = part_optimizers(config_);
    if (parts.empty()) return std::make_unique<GraphModel>(graph_, logits, loss_, what_, TrainingDefaults{optimizer, lr, 10});
    return std::make_unique<EstimatorModel>(graph_, logits, loss_, what_, TrainingDefaults{optimizer, lr, 10},
                                            std::move(parts));
  }

 private:
  const data::ColumnLayout& column(const data::FeatureColumn& c) {
    const std::string name = c.name();
    for (const auto& l : layout_.columns)
      if (l.name == name) return l;
    throw ConfigError(what_ + ": column '" + name + "' is not in the data's layout (not given to the transform)");
  }
  Ids ids_of(const data::ColumnLayout& l) { return graph_.ids_input(l.first_slot, l.num_slots); }
  // The table of a categorical column's embedding: a dynamic table over a dynamic hash column
  // (ids without a vocabulary), else a [vocabulary_size, dim] one.
  Table table_of(const data::ColumnLayout& l, int dim, std::optional<ps::Initializer> init = std::nullopt) {
    if (!l.dynamic) return graph_.embedding_table(l.vocabulary_size, dim, segment(l.name), init);
    DynamicTableOptions o;
    o.admit_after = l.dynamic_options.admit_after;
    o.capacity = l.dynamic_options.capacity;
    o.ttl = l.dynamic_options.ttl;
    return graph_.dynamic_embedding_table(dim, segment(l.name), init, o);
  }

  Tensor linear() {
    auto scope = graph_.name_scope("linear");
    std::vector<Tensor> dense_terms, sums;
    for (const auto& c : config_.linear_feature_columns) {
      const data::ColumnLayout& l = column(c);
      if (c.kind == data::ColumnKind::kNumeric) {
        dense_terms.push_back(graph_.dense_input(l.dense_offset, l.dense_width));
      } else if (is_categorical_kind(c.kind) || c.kind == data::ColumnKind::kIndicator) {
        const Table t = table_of(l, outputs_, ps::Initializer::zeros());
        sums.push_back(graph_.embedding(ids_of(l), t, Combiner::kSum));
      } else if (c.kind == data::ColumnKind::kEmbedding) {
        dense_terms.push_back(graph_.embedding(ids_of(l), table_of(l, l.dimension), combiner_of(l.combiner)));
      } else {
        throw ConfigError(what_ + ": linear column '" + l.name + "' of kind " + data::to_string(c.kind) +
                          " cannot enter a linear model");
      }
    }
    // The bias lives in the Dense over the dense terms, or on its own when there are none.
    if (!dense_terms.empty()) {
      const Tensor x = dense_terms.size() == 1 ? dense_terms[0] : graph_.concatenate(dense_terms);
      sums.push_back(graph_.dense(x, outputs_, Activation::kNone, "dense"));
      return sums.size() == 1 ? sums[0] : graph_.add(sums);
    }
    const Tensor sum = sums.size() == 1 ? sums[0] : graph_.add(sums);
    return graph_.bias(sum, "bias");
  }

  // The DNN input layer: numeric values, embedding bags and indicator counts, concatenated.
  std::vector<Tensor> dnn_inputs(const std::vector<data::FeatureColumn>& columns, bool dlrm,
                                 std::vector<Tensor>* numeric) {
    std::vector<Tensor> xs;
    for (const auto& c : columns) {
      const data::ColumnLayout& l = column(c);
      if (c.kind == data::ColumnKind::kNumeric) {
        (dlrm ? *numeric : xs).push_back(graph_.dense_input(l.dense_offset, l.dense_width));
      } else if (c.kind == data::ColumnKind::kEmbedding) {
        xs.push_back(graph_.embedding(ids_of(l), table_of(l, l.dimension), combiner_of(l.combiner)));
      } else if (c.kind == data::ColumnKind::kIndicator && !dlrm) {
        xs.push_back(graph_.indicator(ids_of(l), l.vocabulary_size));
      } else {
        throw ConfigError(what_ + ": column '" + l.name + "' (" + data::to_string(c.kind) + ") cannot feed " +
                          (dlrm ? "a DLRM: use numeric and embedding columns"
                                : "a DNN directly: wrap a categorical column in an embedding or indicator column"));
      }
    }
    return xs;
  }

  Tensor mlp(Tensor x, const std::vector<int>& units, double dropout, const std::string& prefix) {
    for (std::size_t i = 0; i < units.size(); ++i) {
      x = graph_.dense(x, units[i], config_.activation, prefix + std::to_string(i));
      if (dropout > 0) x = graph_.dropout(x, dropout, config_.seed + 1 + i);
    }
    return x;
  }

  Tensor dnn() {
    auto scope = graph_.name_scope("dnn");
    const std::vector<Tensor> xs = dnn_inputs(config_.dnn_feature_columns, false, nullptr);
    Tensor x = xs.size() == 1 ? xs[0] : graph_.concatenate(xs);
    x = mlp(x, config_.hidden_units, config_.dropout, "hiddenlayer_");
    return graph_.dense(x, outputs_, Activation::kNone, "logits");
  }

  Tensor dlrm() {
    auto scope = graph_.name_scope("dlrm");
    if (config_.dnn_feature_columns.empty()) throw ConfigError(what_ + ": no feature columns");
    std::vector<Tensor> numeric;
    std::vector<Tensor> embs = dnn_inputs(config_.dnn_feature_columns, true, &numeric);
    if (numeric.empty()) throw ConfigError(what_ + ": DLRM needs at least one numeric column for the bottom MLP");
    if (embs.empty()) throw ConfigError(what_ + ": DLRM needs at least one embedding column");
    if (config_.bottom_units.empty()) throw ConfigError(what_ + ": bottom_units is empty");
    const int dim = embs[0].width;
    for (std::size_t i = 0; i < embs.size(); ++i)
      if (embs[i].width != dim)
        throw ConfigError(what_ + ": every embedding column needs one dimension (the interaction's), got " +
                          std::to_string(dim) + " and " + std::to_string(embs[i].width));
    if (config_.bottom_units.back() != dim)
      throw ConfigError(what_ + ": the bottom MLP's last width (" + std::to_string(config_.bottom_units.back()) +
                        ") must equal the embedding dimension (" + std::to_string(dim) + ")");
    Tensor x = numeric.size() == 1 ? numeric[0] : graph_.concatenate(numeric);
    // DLRM's bottom MLP ends in ReLU too (the reference implementation's arch-mlp-bot).
    const Tensor bottom = mlp(x, config_.bottom_units, 0, "bottom_");
    std::vector<Tensor> feats{bottom};
    feats.insert(feats.end(), embs.begin(), embs.end());
    Tensor top = graph_.dot_interaction(feats, true);
    top = mlp(top, config_.hidden_units, config_.dropout, "top_");
    return graph_.dense(top, outputs_, Activation::kNone, "logits");
  }

  const EstimatorConfig& config_;
  const data::FeatureLayout& layout_;
  Graph graph_;
  std::string what_;
  int outputs_ = 1;
  Loss loss_ = Loss::kSigmoidCrossEntropy;
};

}  // namespace

const char* to_string(EstimatorKind kind) {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

EstimatorKind parse_estimator_kind(const std::string& text, const std::string& what) {
  std::string known;
  for (const auto& k : kKinds) {
    if (text == k.name) return k.kind;
    known += (known.empty() ? "" : ", ") + std::string(k.name);
  }
  throw ConfigError(what + ": '" + text + "' is not one of " + known);
}

bool is_regressor(EstimatorKind kind) {
  return kind == EstimatorKind::kLinearRegressor || kind == EstimatorKind::kDNNRegressor ||
         kind == EstimatorKind::kDNNLinearCombinedRegressor;
}

std::vector<data::FeatureColumn> input_columns(const EstimatorConfig& config) {
  std::vector<data::FeatureColumn> out;
  std::set<std::string> seen;
  for (const auto* list : {&config.linear_feature_columns, &config.dnn_feature_columns})
    for (const auto& c : *list)
      if (seen.insert(c.name()).second) out.push_back(c);
  return out;
}

std::vector<std::pair<std::string, ps::OptimizerConfig>> part_optimizers(const EstimatorConfig& config) {
  const bool combined = config.kind == EstimatorKind::kDNNLinearCombinedClassifier ||
                        config.kind == EstimatorKind::kDNNLinearCombinedRegressor;
  if (!combined) {
    if (!config.linear_optimizer.empty() || !config.dnn_optimizer.empty() || config.linear_learning_rate != 0 ||
        config.dnn_learning_rate != 0)
      throw ConfigError(std::string(to_string(config.kind)) +
                        ": linear_optimizer / dnn_optimizer and their learning rates belong to DNNLinearCombined* "
                        "(use the job's optimizer)");
    return {};
  }
  const std::string prefix = config.scope.empty() ? "" : config.scope + "/";
  std::vector<std::pair<std::string, ps::OptimizerConfig>> out;
  const bool linear = !config.linear_optimizer.empty() || config.part_optimizer_defaults;
  if (linear || config.linear_learning_rate != 0) {
    if (!linear) throw ConfigError("linear_learning_rate: needs linear_optimizer (the job's optimizer trains the linear part)");
    // TensorFlow's _linear_learning_rate: min(0.2, 1/sqrt(number of linear columns)).
    const double n = static_cast<double>(std::max<std::size_t>(1, config.linear_feature_columns.size()));
    out.emplace_back(prefix + "linear/", part_optimizer("linear_optimizer", config.linear_optimizer, "ftrl",
                                                        "linear_learning_rate", config.linear_learning_rate,
                                                        std::min(0.2, 1.0 / std::sqrt(n))));
  }
  const bool dnn = !config.dnn_optimizer.empty() || config.part_optimizer_defaults;
  if (dnn || config.dnn_learning_rate != 0) {
    if (!dnn) throw ConfigError("dnn_learning_rate: needs dnn_optimizer (the job's optimizer trains the DNN part)");
    out.emplace_back(prefix + "dnn/", part_optimizer("dnn_optimizer", config.dnn_optimizer, "adagrad",
                                                     "dnn_learning_rate", config.dnn_learning_rate, 0.05));
  }
  return out;
}

std::unique_ptr<GraphModel> make_estimator(const EstimatorConfig& config, const data::FeatureLayout& layout) {
  return Builder(config, layout).build();
}

}  // namespace strata::nn
