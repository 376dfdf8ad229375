// nn::Graph: building the definition, with every check a user mistake can trip (widths, names,
// foreign tensors) done here, once, as a ConfigError naming the layer.
#include "strata/nn/graph.h"

#include <cmath>
#include <utility>

#include "graph_def.h"
#include "strata/common/error.h"
#include "strata/model/model.h"

namespace strata::nn {
namespace {

using detail::GraphDef;
using detail::Node;
using detail::Op;
using detail::Var;

// One path segment: a variable name built from segments can only equal another if every
// segment does, which is what makes different scopes disjoint.
void check_segment(const std::string& what, const std::string& name) {
  bool ok = !name.empty() && name != "." && name != "..";
  for (const char c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                         c == '-' || c == '.';
    ok = ok && allowed;
  }
  if (!ok)
    throw ConfigError("nn: " + what + " '" + name + "' is not a name segment ([A-Za-z0-9_.-]+, no '/')");
}

const char* type_name(Op op) {
  switch (op) {
    case Op::kDense: return "dense";
    case Op::kEmbedding: return "embedding";
    case Op::kCross: return "cross";
    case Op::kBias: return "bias";
    default: return "layer";
  }
}

// "<scope>/<name scopes>/<layer>" for a layer of type `op` called `name` ("" = automatic).
std::string layer_path(GraphDef& def, Op op, const std::string& name) {
  std::string layer = name;
  if (layer.empty()) {
    int& k = def.unnamed_counts[static_cast<std::size_t>(op)];
    layer = std::string(type_name(op)) + "_" + std::to_string(k++);
  } else {
    check_segment("layer name", layer);
  }
  std::string path = def.scope;
  for (const std::string& s : def.name_scopes) path += (path.empty() ? "" : "/") + s;
  return path + (path.empty() ? "" : "/") + layer;
}

int add_var(GraphDef& def, std::string name, ps::Shape shape, ps::Initializer init, bool sparse) {
  for (const Var& v : def.vars)
    if (v.name == name) throw ConfigError("nn: variable name '" + name + "' is used twice in one graph");
  Var v;
  v.name = std::move(name);
  v.shape = std::move(shape);
  v.init = init;
  v.sparse = sparse;
  def.vars.push_back(std::move(v));
  return static_cast<int>(def.vars.size()) - 1;
}

void check_positive(const char* what, std::int64_t value) {
  if (value < 1) throw ConfigError(std::string("nn: ") + what + " must be >= 1, got " + std::to_string(value));
}

}  // namespace

Graph::Graph(const std::string& scope, std::uint64_t seed) : def_(std::make_unique<GraphDef>()) {
  if (!scope.empty()) check_segment("scope", scope);
  def_->scope = scope;
  def_->seed = seed;
}
Graph::Graph(const Graph& other) : def_(std::make_unique<GraphDef>(*other.def_)) {}
Graph& Graph::operator=(const Graph& other) {
  if (this != &other) def_ = std::make_unique<GraphDef>(*other.def_);
  return *this;
}
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
Graph::~Graph() = default;

const std::string& Graph::scope() const { return def_->scope; }
std::uint64_t Graph::seed() const { return def_->seed; }

namespace {

// The node of `t`, which must belong to this graph (a tensor of another graph usually points
// past the end or at a node of another width).
const Node& node_of(const GraphDef& def, Tensor t, const char* layer) {
  if (t.node < 0 || static_cast<std::size_t>(t.node) >= def.nodes.size() ||
      def.nodes[static_cast<std::size_t>(t.node)].width != t.width)
    throw ConfigError(std::string("nn: ") + layer + ": input tensor is not a tensor of this graph");
  return def.nodes[static_cast<std::size_t>(t.node)];
}

Tensor push(GraphDef& def, Node n) {
  def.nodes.push_back(std::move(n));
  return Tensor{static_cast<int>(def.nodes.size()) - 1, def.nodes.back().width};
}

void check_ids(Ids ids, const char* layer) {
  if (ids.first_field < 0 || ids.count < 1)
    throw ConfigError(std::string("nn: ") + layer + ": id slots [" + std::to_string(ids.first_field) + ", +" +
                      std::to_string(ids.count) + ") are not a valid range");
}

}  // namespace

Tensor Graph::dense_input(int first_column, int width) {
  if (first_column < 0) throw ConfigError("nn: dense_input: first column must be >= 0, got " + std::to_string(first_column));
  check_positive("dense_input width", width);
  Node n;
  n.op = Op::kDenseInput;
  n.first_column = first_column;
  n.width = width;
  return push(*def_, std::move(n));
}

Ids Graph::ids_input(int first_field, int count) {
  const Ids ids{first_field, count};
  check_ids(ids, "ids_input");
  return ids;
}

Graph::NameScope Graph::name_scope(const std::string& name) {
  check_segment("name scope", name);
  def_->name_scopes.push_back(name);
  return NameScope(def_.get());
}
Graph::NameScope::NameScope(NameScope&& other) noexcept : def_(other.def_) { other.def_ = nullptr; }
Graph::NameScope::~NameScope() {
  if (def_ != nullptr && !def_->name_scopes.empty()) def_->name_scopes.pop_back();
}

Tensor Graph::dense(Tensor x, int units, Activation activation, const std::string& name) {
  node_of(*def_, x, "dense");
  check_positive("dense units", units);
  const std::string path = layer_path(*def_, Op::kDense, name);
  Node n;
  n.op = Op::kDense;
  n.inputs = {x.node};
  n.width = units;
  n.activation = activation;
  n.kernel = add_var(*def_, path + "/kernel", {x.width, units},
                     ps::Initializer::glorot_uniform(model::derive_seed(def_->seed, path + "/kernel")), false);
  n.bias = add_var(*def_, path + "/bias", {units}, ps::Initializer::zeros(), false);
  return push(*def_, std::move(n));
}

Table Graph::embedding_table(std::int64_t vocab, int dim, const std::string& name,
                             std::optional<ps::Initializer> init, const std::string& variable) {
  check_positive("embedding vocab", vocab);
  check_positive("embedding dim", dim);
  check_segment("table variable name", variable);
  const std::string var = layer_path(*def_, Op::kEmbedding, name) + "/" + variable;
  ps::Initializer i = init ? *init : ps::Initializer::uniform(-0.05, 0.05, 0);
  if (i.seed == 0) i.seed = model::derive_seed(def_->seed, var);
  i.validate(ps::DType::kF32);
  return Table{add_var(*def_, var, {vocab, dim}, i, true), vocab, dim};
}

Table Graph::dynamic_embedding_table(int dim, const std::string& name, std::optional<ps::Initializer> init,
                                     const DynamicTableOptions& options) {
  check_positive("embedding dim", dim);
  const std::string var = layer_path(*def_, Op::kEmbedding, name) + "/embeddings";
  ps::Initializer i = init ? *init : ps::Initializer::uniform(-0.05, 0.05, 0);
  if (i.seed == 0) i.seed = model::derive_seed(def_->seed, var);
  ps::DynamicVariableSpec spec;
  spec.name = var;
  spec.dim = dim;
  spec.init = i;
  spec.admit_after = options.admit_after;
  spec.capacity = options.capacity;
  spec.ttl = options.ttl;
  spec.max_ids = options.max_ids;
  spec.validate();
  const int v = add_var(*def_, var, {0, dim}, i, true);
  def_->vars[static_cast<std::size_t>(v)].dynamic = true;
  def_->vars[static_cast<std::size_t>(v)].dynamic_spec = std::move(spec);
  return Table{v, 0, dim, true};
}

Tensor Graph::embedding(Ids ids, const Table& table, Combiner combiner) {
  check_ids(ids, "embedding");
  if (table.var < 0 || static_cast<std::size_t>(table.var) >= def_->vars.size() ||
      !def_->vars[static_cast<std::size_t>(table.var)].sparse ||
      def_->vars[static_cast<std::size_t>(table.var)].dynamic != table.dynamic ||
      def_->vars[static_cast<std::size_t>(table.var)].shape != ps::Shape{table.vocab, table.dim})
    throw ConfigError("nn: embedding: the table is not a table of this graph");
  Node n;
  n.op = Op::kEmbedding;
  n.ids = ids;
  n.table = table.var;
  n.vocab = table.vocab;
  n.width = table.dim;
  n.combiner = combiner;
  return push(*def_, std::move(n));
}

Tensor Graph::embedding(Ids ids, std::int64_t vocab, int dim, Combiner combiner, const std::string& name) {
  check_ids(ids, "embedding");
  return embedding(ids, embedding_table(vocab, dim, name), combiner);
}

Tensor Graph::indicator(Ids ids, std::int64_t vocab) {
  check_ids(ids, "indicator");
  check_positive("indicator vocab", vocab);
  if (vocab > (std::int64_t{1} << 24))
    throw ConfigError("nn: indicator: vocab " + std::to_string(vocab) +
                      " is too large for a dense multi-hot tensor (use an embedding)");
  Node n;
  n.op = Op::kIndicator;
  n.ids = ids;
  n.vocab = vocab;
  n.width = static_cast<int>(vocab);
  return push(*def_, std::move(n));
}

Tensor Graph::concatenate(const std::vector<Tensor>& xs) {
  if (xs.empty()) throw ConfigError("nn: concatenate needs at least one tensor");
  Node n;
  n.op = Op::kConcatenate;
  std::int64_t width = 0;
  for (const Tensor& t : xs) {
    node_of(*def_, t, "concatenate");
    n.inputs.push_back(t.node);
    width += t.width;
  }
  if (width > (std::int64_t{1} << 30)) throw ConfigError("nn: concatenate: output too wide");
  n.width = static_cast<int>(width);
  return push(*def_, std::move(n));
}

namespace {
Tensor elementwise(GraphDef& def, Op op, const char* layer, const std::vector<Tensor>& xs) {
  if (xs.size() < 2) throw ConfigError(std::string("nn: ") + layer + " needs at least two tensors");
  Node n;
  n.op = op;
  n.width = xs.front().width;
  for (const Tensor& t : xs) {
    node_of(def, t, layer);
    if (t.width != n.width)
      throw ConfigError(std::string("nn: ") + layer + ": widths differ (" + std::to_string(n.width) + " and " +
                        std::to_string(t.width) + ")");
    n.inputs.push_back(t.node);
  }
  return push(def, std::move(n));
}
}  // namespace

Tensor Graph::add(const std::vector<Tensor>& xs) { return elementwise(*def_, Op::kAdd, "add", xs); }
Tensor Graph::multiply(const std::vector<Tensor>& xs) { return elementwise(*def_, Op::kMultiply, "multiply", xs); }

Tensor Graph::dot_interaction(const std::vector<Tensor>& xs, bool concat_first) {
  if (xs.size() < 2) throw ConfigError("nn: dot_interaction needs at least two tensors");
  Node n;
  n.op = Op::kDotInteraction;
  n.concat_first = concat_first;
  for (const Tensor& t : xs) {
    node_of(*def_, t, "dot_interaction");
    if (t.width != xs.front().width)
      throw ConfigError("nn: dot_interaction: widths differ (" + std::to_string(xs.front().width) + " and " +
                        std::to_string(t.width) + ")");
    n.inputs.push_back(t.node);
  }
  const std::int64_t k = static_cast<std::int64_t>(xs.size());
  const std::int64_t width = k * (k - 1) / 2 + (concat_first ? xs.front().width : 0);
  if (width > (std::int64_t{1} << 30)) throw ConfigError("nn: dot_interaction: too many tensors");
  n.width = static_cast<int>(width);
  return push(*def_, std::move(n));
}

Tensor Graph::bias(Tensor x, const std::string& name) {
  node_of(*def_, x, "bias");
  const std::string path = layer_path(*def_, Op::kBias, name);
  Node n;
  n.op = Op::kBias;
  n.inputs = {x.node};
  n.width = x.width;
  n.bias = add_var(*def_, path + "/bias", {x.width}, ps::Initializer::zeros(), false);
  return push(*def_, std::move(n));
}

Tensor Graph::cross(Tensor x0, Tensor x, const std::string& name) {
  node_of(*def_, x0, "cross");
  node_of(*def_, x, "cross");
  if (x0.width != x.width)
    throw ConfigError("nn: cross: x0 has width " + std::to_string(x0.width) + ", x " + std::to_string(x.width));
  const std::string path = layer_path(*def_, Op::kCross, name);
  Node n;
  n.op = Op::kCross;
  n.inputs = {x0.node, x.node};
  n.width = x.width;
  n.kernel = add_var(*def_, path + "/kernel", {x.width, x.width},
                     ps::Initializer::glorot_uniform(model::derive_seed(def_->seed, path + "/kernel")), false);
  n.bias = add_var(*def_, path + "/bias", {x.width}, ps::Initializer::zeros(), false);
  return push(*def_, std::move(n));
}

Tensor Graph::dropout(Tensor x, double rate, std::uint64_t seed) {
  node_of(*def_, x, "dropout");
  if (!(rate >= 0.0 && rate < 1.0))
    throw ConfigError("nn: dropout rate must be in [0, 1), got " + std::to_string(rate));
  Node n;
  n.op = Op::kDropout;
  n.inputs = {x.node};
  n.width = x.width;
  n.rate = rate;
  n.seed = seed;
  return push(*def_, std::move(n));
}

}  // namespace strata::nn
