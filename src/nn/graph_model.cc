// nn::GraphModel: forward in node order, reverse-mode backward in reverse node order.
//
// A step: (1) check the inputs against what the graph reads; (2) per embedding table, the batch's
// unique ids (sorted: the order rows_needed() and the sparse gradient use) and a pointer to each
// id's pulled row, and per embedding node the unique-id index of every slot; (3) forward; (4) the
// loss and d(mean loss)/d(output); (5) backward: every node's output gradient is zeroed, then each
// node adds its inputs' and variables' gradients, so a tensor or variable used several times
// accumulates every use. Nodes that no trainable variable lies under (inputs, indicators, layers
// over them only) have no gradient and are skipped, like the built-in MLP skips d(pixels).
//
// Memory: every buffer lives in a Workspace (std::vector, resized: capacity is kept), taken from
// the model's pool for the duration of one call. Input tensors are read in place (a pointer and
// a row stride into Inputs::dense), never copied.
#include "strata/nn/graph_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>
#include <utility>

#include "graph_def.h"
#include "kernels.h"
#include "strata/common/error.h"

namespace strata::nn {
namespace detail {

struct Program {
  GraphDef def;
  int output = -1;
  std::vector<char> live;        // per node: the output depends on it
  std::vector<char> needs_grad;  // per node: a trainable variable lies at or under it
  std::vector<char> var_live;    // per variable: read by a live node
  std::vector<int> tables;       // live sparse variables, creation order
  int dense_columns = 0;         // Inputs::dense_dim needed (max first_column + width)
  int id_fields = 0;             // Inputs::num_fields needed
};

struct TableScratch {
  std::vector<std::int64_t> ids;                          // unique, ascending
  std::vector<const float*> rows;                         // pulled row of ids[k]
  std::vector<std::pair<std::int64_t, std::int32_t>> index;  // fallback lookup (unsorted pulls)
  float* grad = nullptr;                                  // [ids.size(), dim] in the caller's Grads
  // Deduplication of a batch's ids: an open-addressing set (a power-of-two size, entries live
  // when their stamp is the current epoch, so it is never cleared between batches), the distinct
  // ids in first-seen order, and the slots of the table's nodes back to back.
  std::vector<std::int64_t> set_key;
  std::vector<std::int32_t> set_index;
  std::vector<std::uint32_t> set_stamp;
  std::uint32_t epoch = 0;
  std::vector<std::pair<std::int64_t, std::int32_t>> distinct;  // (id, first-seen index), then sorted
  std::vector<std::int32_t> rank;                               // first-seen index -> ascending index
  std::vector<std::int32_t> flat_slot;
};

// Storage that starts on a 64-byte boundary. Node values and gradients are GEMM outputs: the
// kernel libraries store whole cache lines when C's rows start on one, and glibc's malloc gives
// 16 bytes (a large block, from mmap, sits 16 bytes past a page boundary).
template <class T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAligned() = default;
  template <class U>
  CacheAligned(const CacheAligned<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAligned<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const CacheAligned<U>&) const noexcept { return false; }
};
using FloatBuffer = std::vector<float, CacheAligned<float>>;

struct Workspace {
  std::vector<FloatBuffer> value, grad, aux;  // per node
  std::vector<std::vector<std::int32_t>> slot;       // per embedding node: id index per (row, slot)
  std::vector<TableScratch> table;                   // per variable (tables only)
  std::vector<const float*> var_value;               // per variable (dense only)
  std::vector<float*> var_grad;                      // per variable (dense only)
  std::vector<char> var_written;                     // per variable: its gradient has a value
  std::vector<char> fresh;                           // per node: its gradient is not written yet
};

}  // namespace detail

namespace {

using detail::Node;
using detail::Op;
using detail::Program;
using detail::Var;
using detail::Workspace;

// A node's output as the kernels see it: row r starts at p + r * stride.
struct View {
  const float* p;
  int stride;
};

// splitmix64's finalizer: a bijective 64-bit mix.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The dropout keep-scale of one element: 0 (dropped) or 1 / (1 - rate).
float dropout_scale(std::uint64_t seed, std::int64_t step, std::int64_t example, int column, double rate,
                    float keep_scale) {
  const std::uint64_t h = mix(mix(mix(seed ^ 0x64726f706f7574ull) ^ static_cast<std::uint64_t>(step)) ^
                              static_cast<std::uint64_t>(example)) ^
                          static_cast<std::uint64_t>(column);
  const double u = static_cast<double>(mix(h) >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  return u >= rate ? keep_scale : 0.0f;
}

float activate(Activation a, float z) {
  switch (a) {
    case Activation::kRelu: return z > 0.0f ? z : 0.0f;
    case Activation::kSigmoid: return 1.0f / (1.0f + std::exp(-z));
    case Activation::kTanh: return std::tanh(z);
    case Activation::kNone: break;
  }
  return z;
}

// d act / d z from the activation's output y.
float activation_slope(Activation a, float y) {
  switch (a) {
    case Activation::kRelu: return y > 0.0f ? 1.0f : 0.0f;
    case Activation::kSigmoid: return y * (1.0f - y);
    case Activation::kTanh: return 1.0f - y * y;
    case Activation::kNone: break;
  }
  return 1.0f;
}

void resize(detail::FloatBuffer& v, std::size_t n) { v.resize(n); }

// A DotInteraction node's work is done in blocks of kDotBlock lanes (a fixed trip count, so each
// block is one or two vector operations): its scratch (ws.aux) holds the inputs transposed
// [d, kp], their gradients [d, kp] and the pair gradients as a symmetric [k, kp], where kp is k
// rounded up to a block and the lanes past k stay zero.
constexpr std::size_t kDotBlock = 16;
std::size_t dot_padded(int k) {
  return (static_cast<std::size_t>(k) + kDotBlock - 1) / kDotBlock * kDotBlock;
}
std::size_t dot_scratch_floats(int k, int d) {
  return dot_padded(k) * (2 * static_cast<std::size_t>(d) + static_cast<std::size_t>(k));
}

// y = act(y + bias) over [rows, w], one loop per activation so that each vectorises.
void bias_activation(Activation a, float* y, const float* bias, std::size_t rows, int w) {
  for (std::size_t b = 0; b < rows; ++b) {
    float* row = y + b * static_cast<std::size_t>(w);
    switch (a) {
      case Activation::kNone:
        for (int j = 0; j < w; ++j) row[j] += bias[j];
        break;
      case Activation::kRelu:
        for (int j = 0; j < w; ++j) row[j] = std::max(row[j] + bias[j], 0.0f);
        break;
      default:
        for (int j = 0; j < w; ++j) row[j] = activate(a, row[j] + bias[j]);
        break;
    }
  }
}

// dy *= act'(z) given the activation's output y, n elements.
void times_slope(Activation a, float* dy, const float* y, std::size_t n) {
  switch (a) {
    case Activation::kNone: break;
    case Activation::kRelu:
      for (std::size_t e = 0; e < n; ++e) dy[e] = y[e] > 0.0f ? dy[e] : 0.0f;
      break;
    default:
      for (std::size_t e = 0; e < n; ++e) dy[e] *= activation_slope(a, y[e]);
      break;
  }
}

}  // namespace

GraphModel::GraphModel(const Graph& graph, Tensor output, Loss loss, std::string name, TrainingDefaults defaults)
    : name_(std::move(name)), loss_(loss), defaults_(std::move(defaults)) {
  if (defaults_.epochs < 1 || !(defaults_.learning_rate >= 0))
    throw ConfigError("nn: model " + name_ + ": default epochs must be >= 1 and the learning rate >= 0");
  auto prog = std::make_unique<Program>();
  prog->def = graph.def();
  detail::GraphDef& def = prog->def;
  def.name_scopes.clear();
  const int n = static_cast<int>(def.nodes.size());
  if (output.node < 0 || output.node >= n || def.nodes[static_cast<std::size_t>(output.node)].width != output.width)
    throw ConfigError("nn: model " + name_ + ": the output is not a tensor of the graph");
  prog->output = output.node;
  if (loss == Loss::kSoftmaxCrossEntropy && output.width < 2)
    throw ConfigError("nn: model " + name_ + ": softmax cross-entropy needs an output of width >= 2 (the classes), got " +
                      std::to_string(output.width));
  if (loss != Loss::kSoftmaxCrossEntropy && output.width != 1)
    throw ConfigError("nn: model " + name_ + ": " +
                      (loss == Loss::kSigmoidCrossEntropy ? "sigmoid cross-entropy" : "mean squared error") +
                      " needs an output of width 1, got " + std::to_string(output.width));
  prog->live.assign(static_cast<std::size_t>(n), 0);
  prog->live[static_cast<std::size_t>(output.node)] = 1;
  for (int i = n; i-- > 0;)
    if (prog->live[static_cast<std::size_t>(i)])
      for (int in : def.nodes[static_cast<std::size_t>(i)].inputs) prog->live[static_cast<std::size_t>(in)] = 1;
  prog->needs_grad.assign(static_cast<std::size_t>(n), 0);
  prog->var_live.assign(def.vars.size(), 0);
  for (int i = 0; i < n; ++i) {
    const Node& node = def.nodes[static_cast<std::size_t>(i)];
    bool g = node.kernel >= 0 || node.bias >= 0 || node.table >= 0;
    for (int in : node.inputs) g = g || prog->needs_grad[static_cast<std::size_t>(in)];
    prog->needs_grad[static_cast<std::size_t>(i)] = g;
    if (!prog->live[static_cast<std::size_t>(i)]) continue;
    if (node.kernel >= 0) prog->var_live[static_cast<std::size_t>(node.kernel)] = 1;
    if (node.bias >= 0) prog->var_live[static_cast<std::size_t>(node.bias)] = 1;
    if (node.table >= 0) prog->var_live[static_cast<std::size_t>(node.table)] = 1;
    if (node.op == Op::kDenseInput) prog->dense_columns = std::max(prog->dense_columns, node.first_column + node.width);
    if (node.op == Op::kEmbedding || node.op == Op::kIndicator)
      prog->id_fields = std::max(prog->id_fields, node.ids.first_field + node.ids.count);
  }
  for (std::size_t v = 0; v < def.vars.size(); ++v) {
    if (!prog->var_live[v]) continue;
    for (std::size_t w = 0; w < v; ++w)
      if (prog->var_live[w] && def.vars[w].name == def.vars[v].name)
        throw ConfigError("nn: model " + name_ + ": variable name '" + def.vars[v].name + "' is used twice");
    if (def.vars[v].sparse) prog->tables.push_back(static_cast<int>(v));
  }
  program_ = std::move(prog);
  pool_.reserve(64);
}

GraphModel::~GraphModel() = default;

std::vector<ps::VariableSpec> GraphModel::variables() const {
  std::vector<ps::VariableSpec> specs;
  const auto& vars = program_->def.vars;
  for (std::size_t v = 0; v < vars.size(); ++v) {
    if (!program_->var_live[v] || vars[v].dynamic) continue;
    ps::VariableSpec s;
    s.name = vars[v].name;
    s.shape = vars[v].shape;
    s.init = vars[v].init;
    specs.push_back(std::move(s));
  }
  return specs;
}

std::vector<ps::DynamicVariableSpec> GraphModel::dynamic_variables() const {
  std::vector<ps::DynamicVariableSpec> specs;
  const auto& vars = program_->def.vars;
  for (std::size_t v = 0; v < vars.size(); ++v)
    if (program_->var_live[v] && vars[v].dynamic) specs.push_back(vars[v].dynamic_spec);
  return specs;
}

std::vector<std::string> GraphModel::sparse_variables() const {
  std::vector<std::string> names;
  for (int t : program_->tables) names.push_back(program_->def.vars[static_cast<std::size_t>(t)].name);
  return names;
}

std::int64_t GraphModel::num_parameters() const {
  std::int64_t total = 0;
  for (const ps::VariableSpec& s : variables()) total += ps::num_elements(s.shape);
  return total;
}

std::string GraphModel::describe() const {
  const detail::GraphDef& def = program_->def;
  std::ostringstream in, layers;
  int dense_cols = 0;
  int last_dim = -1, bags = 0;
  std::vector<std::string> parts;
  auto flush_bags = [&] {
    if (bags > 0) parts.push_back(std::to_string(bags) + "x" + std::to_string(last_dim));
    bags = 0;
  };
  bool first_layer = true;
  for (std::size_t i = 0; i < def.nodes.size(); ++i) {
    if (!program_->live[i]) continue;
    const Node& n = def.nodes[i];
    if (n.op == Op::kDenseInput) dense_cols += n.width;
    if (n.op == Op::kEmbedding) {
      if (n.width != last_dim) flush_bags();
      last_dim = n.width;
      ++bags;
    }
    if (n.op == Op::kIndicator) {
      flush_bags();
      parts.push_back("onehot" + std::to_string(n.width));
    }
    if (n.op == Op::kDense || n.op == Op::kCross || n.op == Op::kDotInteraction) {
      layers << (first_layer ? "" : "-") << (n.op == Op::kCross ? "x" : n.op == Op::kDotInteraction ? "dot" : "")
             << n.width;
      first_layer = false;
    }
  }
  flush_bags();
  if (dense_cols > 0) parts.insert(parts.begin(), std::to_string(dense_cols));
  for (std::size_t i = 0; i < parts.size(); ++i) in << (i ? "+" : "") << parts[i];
  std::ostringstream os;
  os << name_ << (def.scope.empty() ? "" : " " + def.scope) << ": " << in.str() << " -> " << layers.str() << " ("
     << num_parameters() << " parameters)";
  return os.str();
}

bool GraphModel::dense_stack_shape(train::DenseStackShape* shape) const {
  if (loss_ != Loss::kSoftmaxCrossEntropy) return false;
  const detail::GraphDef& def = program_->def;
  train::DenseStackShape s;
  int previous = -1;
  for (std::size_t i = 0; i < def.nodes.size(); ++i) {
    if (!program_->live[i]) continue;
    const Node& n = def.nodes[i];
    const bool last = static_cast<int>(i) == program_->output;
    if (previous < 0) {
      if (n.op != Op::kDenseInput || n.first_column != 0) return false;
      s.input_dim = n.width;
    } else {
      if (n.op != Op::kDense || n.inputs.size() != 1 || n.inputs[0] != previous) return false;
      if (n.activation != (last ? Activation::kNone : Activation::kRelu)) return false;
      if (last) {
        s.num_classes = n.width;
      } else {
        s.hidden.push_back(n.width);
      }
    }
    previous = static_cast<int>(i);
  }
  if (previous != program_->output || s.num_classes == 0) return false;
  if (shape != nullptr) *shape = std::move(s);
  return true;
}

std::vector<std::int64_t> GraphModel::rows_needed(const std::string& var, const train::Inputs& inputs) const {
  const detail::GraphDef& def = program_->def;
  int table = -1;
  for (int t : program_->tables)
    if (def.vars[static_cast<std::size_t>(t)].name == var) table = t;
  if (table < 0) return train::Model::rows_needed(var, inputs);
  if (inputs.size < 0 || inputs.num_fields < program_->id_fields || (inputs.size > 0 && inputs.sparse_ids == nullptr))
    throw Error("nn: model " + name_ + " reads " + std::to_string(program_->id_fields) +
                " sparse id fields, the inputs have " + std::to_string(inputs.num_fields));
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i < def.nodes.size(); ++i) {
    const Node& n = def.nodes[i];
    if (!program_->live[i] || n.op != Op::kEmbedding || n.table != table) continue;
    for (int b = 0; b < inputs.size; ++b)
      for (int s = 0; s < n.ids.count; ++s) {
        const std::int64_t id =
            inputs.sparse_ids[static_cast<std::size_t>(b) * inputs.num_fields + n.ids.first_field + s];
        if (id == kNoId) continue;
        if (n.vocab > 0 && (id < 0 || id >= n.vocab))
          throw Error("nn: id " + std::to_string(id) + " (example " + std::to_string(b) + ", field " +
                      std::to_string(n.ids.first_field + s) + ") is outside [0, " + std::to_string(n.vocab) +
                      ") of '" + var + "'");
        ids.push_back(id);
      }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::unique_ptr<Workspace> GraphModel::acquire() const {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!pool_.empty()) {
      std::unique_ptr<Workspace> ws = std::move(pool_.back());
      pool_.pop_back();
      return ws;
    }
  }
  auto ws = std::make_unique<Workspace>();
  const std::size_t n = program_->def.nodes.size(), v = program_->def.vars.size();
  ws->value.resize(n);
  ws->grad.resize(n);
  ws->aux.resize(n);
  ws->slot.resize(n);
  ws->table.resize(v);
  ws->var_value.resize(v);
  ws->var_grad.resize(v);
  ws->var_written.resize(v);
  ws->fresh.resize(n);
  return ws;
}

void GraphModel::release(std::unique_ptr<Workspace> ws) const {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.push_back(std::move(ws));
}

namespace {
// Returns the workspace to the pool however the call ends.
template <typename Acquire, typename Release>
struct Lease {
  Lease(Acquire acq, Release rel) : ws(acq()), release(rel) {}
  ~Lease() { release(std::move(ws)); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  std::unique_ptr<Workspace> ws;
  Release release;
};
}  // namespace

train::StepResult GraphModel::step(const train::Params& params, const train::Inputs& inputs,
                                   train::Grads* grads) const {
  auto acq = [this] { return acquire(); };
  auto rel = [this](std::unique_ptr<Workspace> w) { release(std::move(w)); };
  Lease<decltype(acq), decltype(rel)> lease(acq, rel);
  return run(params, inputs, grads, *lease.ws, nullptr);
}

bool GraphModel::predict(const train::Params& params, const train::Inputs& inputs, float* scores_out) const {
  if (inputs.size > 0 && scores_out == nullptr) throw Error("nn: predict: scores_out is null");
  auto acq = [this] { return acquire(); };
  auto rel = [this](std::unique_ptr<Workspace> w) { release(std::move(w)); };
  Lease<decltype(acq), decltype(rel)> lease(acq, rel);
  run(params, inputs, nullptr, *lease.ws, scores_out);
  return true;
}

int GraphModel::prediction_width() const {
  return program_->def.nodes[static_cast<std::size_t>(program_->output)].width;
}

train::PredictionKind GraphModel::prediction_kind() const {
  switch (loss_) {
    case Loss::kSoftmaxCrossEntropy: return train::PredictionKind::kClassProbabilities;
    case Loss::kSigmoidCrossEntropy: return train::PredictionKind::kBinaryProbability;
    case Loss::kMeanSquaredError: break;
  }
  return train::PredictionKind::kRegression;
}

train::StepResult GraphModel::run(const train::Params& params, const train::Inputs& in, train::Grads* grads,
                                  Workspace& ws, float* scores_out) const {
  const Program& prog = *program_;
  const detail::GraphDef& def = prog.def;
  const int batch = in.size;
  const std::size_t nb = static_cast<std::size_t>(batch > 0 ? batch : 0);
  const bool training = grads != nullptr;
  const std::size_t num_nodes = def.nodes.size();

  // ---- (1) inputs ----
  if (batch < 0) throw Error("nn: model " + name_ + ": batch size " + std::to_string(batch) + " is negative");
  if (prog.dense_columns > 0 && (in.dense_dim < prog.dense_columns || (batch > 0 && in.dense == nullptr)))
    throw Error("nn: model " + name_ + " reads " + std::to_string(prog.dense_columns) +
                " dense feature columns, the inputs have " + std::to_string(in.dense == nullptr ? 0 : in.dense_dim));
  if (prog.id_fields > 0 && (in.num_fields < prog.id_fields || (batch > 0 && in.sparse_ids == nullptr)))
    throw Error("nn: model " + name_ + " reads " + std::to_string(prog.id_fields) +
                " sparse id fields, the inputs have " + std::to_string(in.sparse_ids == nullptr ? 0 : in.num_fields));
  const int out_width = def.nodes[static_cast<std::size_t>(prog.output)].width;
  const bool need_labels = scores_out == nullptr && loss_ != Loss::kMeanSquaredError;
  if (need_labels && batch > 0) {
    if (in.labels == nullptr) throw Error("nn: model " + name_ + ": labels are missing");
    const int classes = loss_ == Loss::kSoftmaxCrossEntropy ? out_width : 2;
    for (int b = 0; b < batch; ++b)
      if (in.labels[b] < 0 || in.labels[b] >= classes)
        throw Error("nn: model " + name_ + ": label " + std::to_string(in.labels[b]) + " of example " +
                    std::to_string(b) + " is outside [0, " + std::to_string(classes) + ")");
  }
  if (scores_out == nullptr && loss_ == Loss::kMeanSquaredError && batch > 0 && in.targets == nullptr)
    throw Error("nn: model " + name_ + ": regression targets (Inputs::targets) are missing");

  // Dense parameters.
  for (std::size_t v = 0; v < def.vars.size(); ++v) {
    const Var& var = def.vars[v];
    if (!prog.var_live[v] || var.sparse) continue;
    const auto it = params.dense.find(var.name);
    if (it == params.dense.end()) throw Error("nn: model parameter '" + var.name + "' was not provided");
    const std::int64_t want = ps::num_elements(var.shape);
    if (static_cast<std::int64_t>(it->second.size()) != want)
      throw Error("nn: model parameter '" + var.name + "' has " + std::to_string(it->second.size()) +
                  " elements, expected " + std::to_string(want));
    ws.var_value[v] = it->second.data();
  }

  // ---- (2) embedding tables: unique ids, pulled rows, per-slot indices ----
  for (int t : prog.tables) {
    const Var& var = def.vars[static_cast<std::size_t>(t)];
    detail::TableScratch& ts = ws.table[static_cast<std::size_t>(t)];
    const std::int64_t vocab = var.dynamic ? 0 : var.shape[0];  // 0: any id
    const int dim = static_cast<int>(var.shape[1]);
    // The batch's ids of this table, deduplicated through a hash set as they are read (batches of
    // click data repeat ids), then only the distinct ids sorted: the ascending ids and every slot's
    // index in them, without a search per slot. Hashing decides nothing but speed.
    std::size_t total = 0;
    for (std::size_t i = 0; i < num_nodes; ++i)
      if (prog.live[i] && def.nodes[i].table == t) total += nb * static_cast<std::size_t>(def.nodes[i].ids.count);
    if (total > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max() / 2))
      throw Error("nn: a batch reads more than 2^30 ids of table '" + var.name + "'");
    if (ts.set_key.size() < 2 * total) {
      std::size_t cap = 64;
      while (cap < 2 * total) cap *= 2;
      ts.set_key.assign(cap, 0);
      ts.set_index.assign(cap, 0);
      ts.set_stamp.assign(cap, 0);
      ts.epoch = 0;
    }
    if (++ts.epoch == 0) {
      std::fill(ts.set_stamp.begin(), ts.set_stamp.end(), 0u);
      ts.epoch = 1;
    }
    const std::size_t mask = ts.set_key.size() - 1;
    ts.flat_slot.resize(total);
    ts.distinct.clear();
    std::size_t pos = 0;
    for (std::size_t i = 0; i < num_nodes; ++i) {
      const Node& n = def.nodes[i];
      if (!prog.live[i] || n.table != t) continue;
      for (int b = 0; b < batch; ++b)
        for (int s = 0; s < n.ids.count; ++s, ++pos) {
          const std::int64_t id = in.sparse_ids[static_cast<std::size_t>(b) * in.num_fields + n.ids.first_field + s];
          if (id == kNoId) {
            ts.flat_slot[pos] = -1;
            continue;
          }
          if (vocab > 0 && (id < 0 || id >= vocab))
            throw Error("nn: id " + std::to_string(id) + " (example " + std::to_string(b) + ", field " +
                        std::to_string(n.ids.first_field + s) + ") is outside [0, " + std::to_string(vocab) +
                        ") of '" + var.name + "'");
          std::size_t h = static_cast<std::size_t>(mix(static_cast<std::uint64_t>(id))) & mask;
          while (ts.set_stamp[h] == ts.epoch && ts.set_key[h] != id) h = (h + 1) & mask;
          if (ts.set_stamp[h] != ts.epoch) {
            ts.set_stamp[h] = ts.epoch;
            ts.set_key[h] = id;
            ts.set_index[h] = static_cast<std::int32_t>(ts.distinct.size());
            ts.distinct.emplace_back(id, ts.set_index[h]);
          }
          ts.flat_slot[pos] = ts.set_index[h];
        }
    }
    std::sort(ts.distinct.begin(), ts.distinct.end());
    ts.ids.resize(ts.distinct.size());
    ts.rank.resize(ts.distinct.size());
    for (std::size_t j = 0; j < ts.distinct.size(); ++j) {
      ts.ids[j] = ts.distinct[j].first;
      ts.rank[static_cast<std::size_t>(ts.distinct[j].second)] = static_cast<std::int32_t>(j);
    }
    for (std::int32_t& slot : ts.flat_slot)
      if (slot >= 0) slot = ts.rank[static_cast<std::size_t>(slot)];
    pos = 0;
    for (std::size_t i = 0; i < num_nodes; ++i) {
      const Node& n = def.nodes[i];
      if (!prog.live[i] || n.table != t) continue;
      const std::size_t count = nb * static_cast<std::size_t>(n.ids.count);
      ws.slot[i].assign(ts.flat_slot.begin() + static_cast<std::ptrdiff_t>(pos),
                        ts.flat_slot.begin() + static_cast<std::ptrdiff_t>(pos + count));
      pos += count;
    }
    const auto it = params.sparse.find(var.name);
    if (it == params.sparse.end()) throw Error("nn: model parameter '" + var.name + "' (sparse) was not provided");
    const model::SparseParam& p = it->second;
    if (p.width != dim || p.values.size() != p.rows.size() * static_cast<std::size_t>(dim))
      throw Error("nn: model parameter '" + var.name + "' holds " + std::to_string(p.values.size()) + " values for " +
                  std::to_string(p.rows.size()) + " rows of width " + std::to_string(p.width) + ", expected width " +
                  std::to_string(dim));
    // A whole table (local training) holds row r at index r; a pull holds rows_needed(), i.e.
    // ascending rows: both are found without building anything. Any other order falls back to a
    // sorted index in the workspace.
    ts.rows.resize(ts.ids.size());
    ts.index.clear();
    for (std::size_t j = 0; j < ts.ids.size(); ++j) {
      const std::int64_t id = ts.ids[j];
      std::size_t at = p.rows.size();
      if (j < p.rows.size() && p.rows[j] == id) {
        at = j;  // a pull of exactly rows_needed()
      } else if (static_cast<std::size_t>(id) < p.rows.size() && p.rows[static_cast<std::size_t>(id)] == id) {
        at = static_cast<std::size_t>(id);
      } else {
        const auto r = std::lower_bound(p.rows.begin(), p.rows.end(), id);
        if (r != p.rows.end() && *r == id) at = static_cast<std::size_t>(r - p.rows.begin());
      }
      if (at == p.rows.size()) {
        if (ts.index.empty()) {
          ts.index.resize(p.rows.size());
          for (std::size_t r = 0; r < p.rows.size(); ++r) ts.index[r] = {p.rows[r], static_cast<std::int32_t>(r)};
          std::sort(ts.index.begin(), ts.index.end());
        }
        const auto r = std::lower_bound(ts.index.begin(), ts.index.end(), std::make_pair(id, std::int32_t{-1}));
        if (r == ts.index.end() || r->first != id)
          throw Error("nn: model parameter '" + var.name + "': row " + std::to_string(id) + " was not pulled");
        at = static_cast<std::size_t>(r->second);
      }
      ts.rows[j] = p.values.data() + at * static_cast<std::size_t>(dim);
    }
  }

  // ---- (3) forward ----
  auto view = [&](int node) -> View {
    const Node& n = def.nodes[static_cast<std::size_t>(node)];
    if (n.op == Op::kDenseInput) return View{in.dense + n.first_column, in.dense_dim};
    return View{ws.value[static_cast<std::size_t>(node)].data(), n.width};
  };
  for (std::size_t i = 0; i < num_nodes; ++i) {
    if (!prog.live[i]) continue;
    const Node& n = def.nodes[i];
    if (n.op == Op::kDenseInput) continue;
    const int w = n.width;
    detail::FloatBuffer& y = ws.value[i];
    resize(y, nb * static_cast<std::size_t>(w));
    switch (n.op) {
      case Op::kDenseInput: break;
      case Op::kDense: {
        const View x = view(n.inputs[0]);
        const int in_w = def.nodes[static_cast<std::size_t>(n.inputs[0])].width;
        detail::gemm(false, false, batch, w, in_w, x.p, x.stride, ws.var_value[static_cast<std::size_t>(n.kernel)], w,
                     false, y.data(), w);
        bias_activation(n.activation, y.data(), ws.var_value[static_cast<std::size_t>(n.bias)], nb, w);
        break;
      }
      case Op::kEmbedding: {
        const detail::TableScratch& ts = ws.table[static_cast<std::size_t>(n.table)];
        const std::vector<std::int32_t>& slot = ws.slot[i];
        detail::FloatBuffer& scale = ws.aux[i];
        resize(scale, nb);
        for (std::size_t b = 0; b < nb; ++b) {
          float* row = y.data() + b * static_cast<std::size_t>(w);
          std::fill(row, row + w, 0.0f);
          int count = 0;
          for (int s = 0; s < n.ids.count; ++s) {
            const std::int32_t k = slot[b * static_cast<std::size_t>(n.ids.count) + static_cast<std::size_t>(s)];
            if (k < 0) continue;
            const float* src = ts.rows[static_cast<std::size_t>(k)];
            for (int j = 0; j < w; ++j) row[j] += src[j];
            ++count;
          }
          float c = 1.0f;
          if (count > 0 && n.combiner == Combiner::kMean) c = 1.0f / static_cast<float>(count);
          if (count > 0 && n.combiner == Combiner::kSqrtn) c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(count)));
          scale[b] = c;
          if (c != 1.0f)
            for (int j = 0; j < w; ++j) row[j] *= c;
        }
        break;
      }
      case Op::kIndicator: {
        std::fill(y.begin(), y.end(), 0.0f);
        for (int b = 0; b < batch; ++b)
          for (int s = 0; s < n.ids.count; ++s) {
            const std::int64_t id = in.sparse_ids[static_cast<std::size_t>(b) * in.num_fields + n.ids.first_field + s];
            if (id == kNoId) continue;
            if (id < 0 || id >= n.vocab)
              throw Error("nn: id " + std::to_string(id) + " (example " + std::to_string(b) + ", field " +
                          std::to_string(n.ids.first_field + s) + ") is outside [0, " + std::to_string(n.vocab) +
                          ") of an indicator");
            y[static_cast<std::size_t>(b) * w + static_cast<std::size_t>(id)] += 1.0f;
          }
        break;
      }
      case Op::kConcatenate: {
        int offset = 0;
        for (int src : n.inputs) {
          const View x = view(src);
          const int xw = def.nodes[static_cast<std::size_t>(src)].width;
          for (std::size_t b = 0; b < nb; ++b)
            std::memcpy(y.data() + b * static_cast<std::size_t>(w) + offset, x.p + b * static_cast<std::size_t>(x.stride),
                        sizeof(float) * static_cast<std::size_t>(xw));
          offset += xw;
        }
        break;
      }
      case Op::kAdd:
      case Op::kMultiply: {
        const bool add = n.op == Op::kAdd;
        for (std::size_t b = 0; b < nb; ++b) {
          float* row = y.data() + b * static_cast<std::size_t>(w);
          const View x0 = view(n.inputs[0]);
          std::memcpy(row, x0.p + b * static_cast<std::size_t>(x0.stride), sizeof(float) * static_cast<std::size_t>(w));
          for (std::size_t k = 1; k < n.inputs.size(); ++k) {
            const View x = view(n.inputs[k]);
            const float* src = x.p + b * static_cast<std::size_t>(x.stride);
            if (add)
              for (int j = 0; j < w; ++j) row[j] += src[j];
            else
              for (int j = 0; j < w; ++j) row[j] *= src[j];
          }
        }
        break;
      }
      case Op::kDotInteraction: {
        // Per example the k inputs (d wide each) are copied transposed, xt[j * kp + p] = x_p[j], so
        // that the dots of x_p with x_0..x_{p-1} run as blocks of lanes over q instead of one
        // horizontal reduction per pair. Each dot still sums j = 0..d-1 in order from 0 (lanes
        // are independent and contraction is off), so the bits are those of the pairwise loop.
        const int d = def.nodes[static_cast<std::size_t>(n.inputs[0])].width;
        const int k = static_cast<int>(n.inputs.size());
        const std::size_t ks = static_cast<std::size_t>(k), ds = static_cast<std::size_t>(d), kp = dot_padded(k);
        detail::FloatBuffer& scratch = ws.aux[i];
        if (scratch.size() != dot_scratch_floats(k, d)) scratch.assign(dot_scratch_floats(k, d), 0.0f);
        float* xt = scratch.data();
        for (std::size_t b = 0; b < nb; ++b) {
          float* row = y.data() + b * static_cast<std::size_t>(w);
          int o = 0;
          if (n.concat_first) {
            const View x0 = view(n.inputs[0]);
            std::memcpy(row, x0.p + b * static_cast<std::size_t>(x0.stride), sizeof(float) * ds);
            o = d;
          }
          for (std::size_t p = 0; p < ks; ++p) {
            const View xp = view(n.inputs[p]);
            const float* a = xp.p + b * static_cast<std::size_t>(xp.stride);
            for (std::size_t j = 0; j < ds; ++j) xt[j * kp + p] = a[j];
          }
          for (std::size_t p = 1; p < ks; ++p) {
            for (std::size_t q0 = 0; q0 < p; q0 += kDotBlock) {
              float acc[kDotBlock] = {};
              for (std::size_t j = 0; j < ds; ++j) {
                const float a = xt[j * kp + p];
                const float* c = xt + j * kp + q0;
                for (std::size_t l = 0; l < kDotBlock; ++l) acc[l] += a * c[l];
              }
              std::memcpy(row + o + q0, acc, sizeof(float) * std::min(kDotBlock, p - q0));
            }
            o += static_cast<int>(p);
          }
        }
        break;
      }
      case Op::kCross: {
        const View x0 = view(n.inputs[0]);
        const View x = view(n.inputs[1]);
        detail::FloatBuffer& u = ws.aux[i];  // x W + b, kept for backward
        resize(u, nb * static_cast<std::size_t>(w));
        detail::gemm(false, false, batch, w, w, x.p, x.stride, ws.var_value[static_cast<std::size_t>(n.kernel)], w,
                     false, u.data(), w);
        const float* bias = ws.var_value[static_cast<std::size_t>(n.bias)];
        for (std::size_t b = 0; b < nb; ++b) {
          float* urow = u.data() + b * static_cast<std::size_t>(w);
          float* row = y.data() + b * static_cast<std::size_t>(w);
          const float* a0 = x0.p + b * static_cast<std::size_t>(x0.stride);
          const float* xl = x.p + b * static_cast<std::size_t>(x.stride);
          for (int j = 0; j < w; ++j) {
            urow[j] += bias[j];
            row[j] = a0[j] * urow[j] + xl[j];
          }
        }
        break;
      }
      case Op::kBias: {
        const View x = view(n.inputs[0]);
        const float* bias = ws.var_value[static_cast<std::size_t>(n.bias)];
        for (std::size_t b = 0; b < nb; ++b) {
          float* row = y.data() + b * static_cast<std::size_t>(w);
          const float* src = x.p + b * static_cast<std::size_t>(x.stride);
          for (int j = 0; j < w; ++j) row[j] = src[j] + bias[j];
        }
        break;
      }
      case Op::kDropout: {
        const View x = view(n.inputs[0]);
        detail::FloatBuffer& mask = ws.aux[i];
        resize(mask, training ? nb * static_cast<std::size_t>(w) : 0);
        const float keep_scale = static_cast<float>(1.0 / (1.0 - n.rate));
        for (std::size_t b = 0; b < nb; ++b) {
          float* row = y.data() + b * static_cast<std::size_t>(w);
          const float* src = x.p + b * static_cast<std::size_t>(x.stride);
          if (!training) {
            std::memcpy(row, src, sizeof(float) * static_cast<std::size_t>(w));
            continue;
          }
          float* m = mask.data() + b * static_cast<std::size_t>(w);
          for (int j = 0; j < w; ++j) {
            m[j] = dropout_scale(n.seed, in.step, in.first_example + static_cast<std::int64_t>(b), j, n.rate, keep_scale);
            row[j] = src[j] * m[j];
          }
        }
        break;
      }
    }
  }

  // ---- (4) loss, metrics, predictions, d(mean loss)/d(output) ----
  const View out = view(prog.output);
  train::StepResult result;
  detail::FloatBuffer& dout = ws.grad[static_cast<std::size_t>(prog.output)];
  if (training) resize(dout, nb * static_cast<std::size_t>(out_width));
  const float inv_batch = batch > 0 ? 1.0f / static_cast<float>(batch) : 0.0f;
  double total = 0.0;
  for (std::size_t b = 0; b < nb; ++b) {
    const float* z = out.p + b * static_cast<std::size_t>(out.stride);
    if (loss_ == Loss::kSoftmaxCrossEntropy) {
      // Stable log-softmax, as the built-in models compute it: log sum exp(z - max z).
      int best = 0;
      for (int j = 1; j < out_width; ++j)
        if (z[j] > z[best]) best = j;
      const float m = z[best];
      double sum = 0.0;
      for (int j = 0; j < out_width; ++j) sum += std::exp(static_cast<double>(z[j] - m));
      if (scores_out != nullptr) {
        for (int j = 0; j < out_width; ++j)
          scores_out[b * static_cast<std::size_t>(out_width) + static_cast<std::size_t>(j)] =
              static_cast<float>(std::exp(static_cast<double>(z[j] - m)) / sum);
        continue;
      }
      const std::int32_t label = in.labels[b];
      total += std::log(sum) - static_cast<double>(z[label] - m);
      result.correct += best == label;
      if (training) {
        float* g = dout.data() + b * static_cast<std::size_t>(out_width);
        const double inv_sum = 1.0 / sum;
        for (int j = 0; j < out_width; ++j)
          g[j] = static_cast<float>(std::exp(static_cast<double>(z[j] - m)) * inv_sum) * inv_batch;
        g[label] -= inv_batch;
      }
    } else if (loss_ == Loss::kSigmoidCrossEntropy) {
      // max(z, 0) - z y + log(1 + exp(-|z|)): TF's sigmoid_cross_entropy_with_logits, no overflow.
      const double zd = z[0];
      const float p = static_cast<float>(1.0 / (1.0 + std::exp(-zd)));
      if (scores_out != nullptr) {
        scores_out[b] = p;
        continue;
      }
      const double y = in.labels[b] == 1 ? 1.0 : 0.0;
      total += std::max(zd, 0.0) - zd * y + std::log1p(std::exp(-std::fabs(zd)));
      result.correct += (p >= 0.5f) == (in.labels[b] == 1);
      if (training) dout[b] = (p - static_cast<float>(y)) * inv_batch;
    } else {
      if (scores_out != nullptr) {
        scores_out[b] = z[0];
        continue;
      }
      const float e = z[0] - in.targets[b];
      total += static_cast<double>(e) * static_cast<double>(e);
      if (training) dout[b] = 2.0f * e * inv_batch;
    }
  }
  if (scores_out != nullptr) return result;
  if (batch > 0) result.loss = total / static_cast<double>(batch);
  // An empty slice still trains: its gradients are zeros (and no table rows), so a replica
  // without examples contributes nothing instead of last step's values.
  if (!training) return result;

  // ---- (5) backward ----
  // Gradient buffers of the variables: the tables' zeroed and restricted to the batch's unique
  // ids, ascending; the dense ones sized, then assigned by their first use and added to by any
  // further one (written[v]), which spares a pass over every kernel.
  for (std::size_t v = 0; v < def.vars.size(); ++v) {
    if (!prog.var_live[v]) continue;
    const Var& var = def.vars[v];
    if (var.sparse) {
      detail::TableScratch& ts = ws.table[v];
      model::SparseParam& g = grads->sparse[var.name];
      g.rows.assign(ts.ids.begin(), ts.ids.end());
      g.width = static_cast<int>(var.shape[1]);
      g.values.assign(ts.ids.size() * static_cast<std::size_t>(g.width), 0.0f);
      ts.grad = g.values.data();
    } else {
      model::DenseParam& g = grads->dense[var.name];
      if (g.shape != var.shape) g.shape = var.shape;
      g.value.resize(static_cast<std::size_t>(ps::num_elements(var.shape)));
      ws.var_grad[v] = g.value.data();
      ws.var_written[v] = 0;
    }
  }
  // Node gradients likewise: sized here, zeroed (or assigned by a GEMM) on their first write.
  for (std::size_t i = 0; i < num_nodes; ++i) {
    if (!prog.live[i] || !prog.needs_grad[i] || static_cast<int>(i) == prog.output) continue;
    ws.grad[i].resize(nb * static_cast<std::size_t>(def.nodes[i].width));
    ws.fresh[i] = 1;
  }
  ws.fresh[static_cast<std::size_t>(prog.output)] = 0;
  // The gradient buffer of `node` to add into (zeroed on first use); null when it needs none.
  auto grad_of = [&](int node) -> float* {
    const std::size_t k = static_cast<std::size_t>(node);
    if (!prog.needs_grad[k]) return nullptr;
    if (ws.fresh[k]) {
      std::fill(ws.grad[k].begin(), ws.grad[k].end(), 0.0f);
      ws.fresh[k] = 0;
    }
    return ws.grad[k].data();
  };
  // For a GEMM writer: the buffer and whether to accumulate (false: the GEMM assigns it).
  auto gemm_grad_of = [&](int node, bool* accumulate) -> float* {
    const std::size_t k = static_cast<std::size_t>(node);
    if (!prog.needs_grad[k]) return nullptr;
    *accumulate = !ws.fresh[k];
    ws.fresh[k] = 0;
    return ws.grad[k].data();
  };
  auto var_grad = [&](int v, bool* accumulate) -> float* {
    const std::size_t k = static_cast<std::size_t>(v);
    *accumulate = ws.var_written[k] != 0;
    ws.var_written[k] = 1;
    return ws.var_grad[k];
  };
  for (std::size_t i = num_nodes; i-- > 0;) {
    if (!prog.live[i] || !prog.needs_grad[i]) continue;
    const Node& n = def.nodes[i];
    const int w = n.width;
    if (ws.fresh[i]) grad_of(static_cast<int>(i));  // no consumer wrote it (cannot happen; cheap)
    float* dy = ws.grad[i].data();
    switch (n.op) {
      case Op::kDenseInput:
      case Op::kIndicator: break;
      case Op::kDense: {
        const View x = view(n.inputs[0]);
        const int in_w = def.nodes[static_cast<std::size_t>(n.inputs[0])].width;
        const float* y = ws.value[i].data();
        // dZ = dY * act'(z), in place: dY is this node's alone and is not needed afterwards.
        times_slope(n.activation, dy, y, nb * static_cast<std::size_t>(w));
        // dW += x^T dZ; db += the column sums of dZ, row by row in batch order (address-independent).
        bool acc = false;
        float* dw = var_grad(n.kernel, &acc);
        detail::gemm(true, false, in_w, w, batch, x.p, x.stride, dy, w, acc, dw, w);
        float* db = var_grad(n.bias, &acc);
        if (!acc) std::fill(db, db + w, 0.0f);
        for (std::size_t b = 0; b < nb; ++b)
          for (int j = 0; j < w; ++j) db[j] += dy[b * static_cast<std::size_t>(w) + static_cast<std::size_t>(j)];
        // dX += dZ W^T, only when something under x is trainable.
        if (float* dx = gemm_grad_of(n.inputs[0], &acc))
          detail::gemm(false, true, batch, in_w, w, dy, w, ws.var_value[static_cast<std::size_t>(n.kernel)], w, acc, dx,
                       in_w);
        break;
      }
      case Op::kEmbedding: {
        const detail::TableScratch& ts = ws.table[static_cast<std::size_t>(n.table)];
        const std::vector<std::int32_t>& slot = ws.slot[i];
        const detail::FloatBuffer& scale = ws.aux[i];
        for (std::size_t b = 0; b < nb; ++b) {
          const float* g = dy + b * static_cast<std::size_t>(w);
          for (int s = 0; s < n.ids.count; ++s) {
            const std::int32_t k = slot[b * static_cast<std::size_t>(n.ids.count) + static_cast<std::size_t>(s)];
            if (k < 0) continue;
            float* dst = ts.grad + static_cast<std::size_t>(k) * static_cast<std::size_t>(w);
            for (int j = 0; j < w; ++j) dst[j] += scale[b] * g[j];
          }
        }
        break;
      }
      case Op::kConcatenate: {
        int offset = 0;
        for (int src : n.inputs) {
          const int xw = def.nodes[static_cast<std::size_t>(src)].width;
          if (float* dx = grad_of(src))
            for (std::size_t b = 0; b < nb; ++b) {
              const float* g = dy + b * static_cast<std::size_t>(w) + offset;
              float* d = dx + b * static_cast<std::size_t>(xw);
              for (int j = 0; j < xw; ++j) d[j] += g[j];
            }
          offset += xw;
        }
        break;
      }
      case Op::kAdd:
        for (int src : n.inputs)
          if (float* dx = grad_of(src))
            for (std::size_t e = 0; e < nb * static_cast<std::size_t>(w); ++e) dx[e] += dy[e];
        break;
      case Op::kMultiply:
        for (std::size_t k = 0; k < n.inputs.size(); ++k) {
          float* dx = grad_of(n.inputs[k]);
          if (dx == nullptr) continue;
          for (std::size_t b = 0; b < nb; ++b)
            for (int j = 0; j < w; ++j) {
              float g = dy[b * static_cast<std::size_t>(w) + static_cast<std::size_t>(j)];
              for (std::size_t o = 0; o < n.inputs.size(); ++o) {
                if (o == k) continue;
                const View x = view(n.inputs[o]);
                g *= x.p[b * static_cast<std::size_t>(x.stride) + static_cast<std::size_t>(j)];
              }
              dx[b * static_cast<std::size_t>(w) + static_cast<std::size_t>(j)] += g;
            }
        }
        break;
      case Op::kDotInteraction: {
        // d out / d x_p = sum over q != p of g_pq x_q, with g symmetric: per example the pairs'
        // gradients fill a k x kp matrix sym (zero diagonal and padding) and the inputs' gradients
        // are formed transposed, dxt[j * kp + p], in blocks of lanes over p, summing q = 0..k-1 in
        // order (the diagonal adds a zero product); each input's gradient then receives its sum
        // once per example.
        const int d = def.nodes[static_cast<std::size_t>(n.inputs[0])].width;
        const int k = static_cast<int>(n.inputs.size());
        const std::size_t ks = static_cast<std::size_t>(k), ds = static_cast<std::size_t>(d), kp = dot_padded(k);
        detail::FloatBuffer& scratch = ws.aux[i];
        if (scratch.size() != dot_scratch_floats(k, d)) scratch.assign(dot_scratch_floats(k, d), 0.0f);
        float* xt = scratch.data();
        float* dxt = xt + kp * ds;
        float* sym = dxt + kp * ds;
        bool any_input_grad = false;
        for (std::size_t p = 0; p < ks; ++p) any_input_grad = (grad_of(n.inputs[p]) != nullptr) || any_input_grad;
        for (std::size_t b = 0; b < nb; ++b) {
          const float* g = dy + b * static_cast<std::size_t>(w);
          if (n.concat_first) {
            if (float* dx = grad_of(n.inputs[0]))
              for (std::size_t j = 0; j < ds; ++j) dx[b * ds + j] += g[j];
            g += d;
          }
          if (!any_input_grad) continue;
          for (std::size_t p = 0; p < ks; ++p) {
            const View xp = view(n.inputs[p]);
            const float* a = xp.p + b * static_cast<std::size_t>(xp.stride);
            for (std::size_t j = 0; j < ds; ++j) xt[j * kp + p] = a[j];
          }
          for (std::size_t p = 1, o = 0; p < ks; ++p)
            for (std::size_t q = 0; q < p; ++q, ++o) sym[p * kp + q] = sym[q * kp + p] = g[o];
          for (std::size_t p0 = 0; p0 < ks; p0 += kDotBlock)
            for (std::size_t j = 0; j < ds; ++j) {
              float acc[kDotBlock] = {};
              const float* x = xt + j * kp;
              for (std::size_t q = 0; q < ks; ++q) {
                const float a = x[q];
                const float* s = sym + q * kp + p0;
                for (std::size_t l = 0; l < kDotBlock; ++l) acc[l] += a * s[l];
              }
              std::memcpy(dxt + j * kp + p0, acc, sizeof(acc));
            }
          for (std::size_t p = 0; p < ks; ++p)
            if (float* dx = grad_of(n.inputs[p]))
              for (std::size_t j = 0; j < ds; ++j) dx[b * ds + j] += dxt[j * kp + p];
        }
        break;
      }
      case Op::kCross: {
        const View x0 = view(n.inputs[0]);
        const View x = view(n.inputs[1]);
        detail::FloatBuffer& u = ws.aux[i];
        float* dx0 = grad_of(n.inputs[0]);
        float* dx = grad_of(n.inputs[1]);
        // y = x0 * u + x with u = x W + b: dx0 += dY * u, then u becomes dU = dY * x0.
        for (std::size_t b = 0; b < nb; ++b) {
          float* urow = u.data() + b * static_cast<std::size_t>(w);
          const float* g = dy + b * static_cast<std::size_t>(w);
          const float* a0 = x0.p + b * static_cast<std::size_t>(x0.stride);
          for (int j = 0; j < w; ++j) {
            if (dx0 != nullptr) dx0[b * static_cast<std::size_t>(w) + static_cast<std::size_t>(j)] += g[j] * urow[j];
            urow[j] = g[j] * a0[j];
          }
        }
        bool acc = false;
        float* dw = var_grad(n.kernel, &acc);
        detail::gemm(true, false, w, w, batch, x.p, x.stride, u.data(), w, acc, dw, w);
        float* db = var_grad(n.bias, &acc);
        if (!acc) std::fill(db, db + w, 0.0f);
        for (std::size_t b = 0; b < nb; ++b)
          for (int j = 0; j < w; ++j) db[j] += u[b * static_cast<std::size_t>(w) + static_cast<std::size_t>(j)];
        if (dx != nullptr) {
          for (std::size_t e = 0; e < nb * static_cast<std::size_t>(w); ++e) dx[e] += dy[e];
          detail::gemm(false, true, batch, w, w, u.data(), w, ws.var_value[static_cast<std::size_t>(n.kernel)], w, true,
                       dx, w);
        }
        break;
      }
      case Op::kBias: {
        // db += the column sums of dY, row by row in batch order (address-independent); dX += dY.
        float* db = ws.var_grad[static_cast<std::size_t>(n.bias)];
        for (std::size_t b = 0; b < nb; ++b)
          for (int j = 0; j < w; ++j) db[j] += dy[b * static_cast<std::size_t>(w) + static_cast<std::size_t>(j)];
        if (float* dx = grad_of(n.inputs[0]))
          for (std::size_t e = 0; e < nb * static_cast<std::size_t>(w); ++e) dx[e] += dy[e];
        break;
      }
      case Op::kDropout:
        if (float* dx = grad_of(n.inputs[0])) {
          const detail::FloatBuffer& mask = ws.aux[i];
          for (std::size_t e = 0; e < nb * static_cast<std::size_t>(w); ++e) dx[e] += dy[e] * mask[e];
        }
        break;
    }
  }
  return result;
}

train::Params init_local_params(const train::Model& model) {
  const std::vector<std::string> sparse = model.sparse_variables();
  train::Params params;
  for (const ps::VariableSpec& spec : model.variables()) {
    STRATA_CHECK(spec.dtype == ps::DType::kF32, "model variable ", spec.name, " is not f32");
    const std::int64_t rows = ps::num_rows(spec.shape);
    std::vector<float> values(static_cast<std::size_t>(ps::num_elements(spec.shape)));
    ps::fill(spec.init, spec.dtype, spec.shape, 0, rows, values.data());
    if (std::find(sparse.begin(), sparse.end(), spec.name) != sparse.end()) {
      model::SparseParam& p = params.sparse[spec.name];
      p.width = static_cast<int>(spec.shape.at(1));
      p.rows.resize(static_cast<std::size_t>(rows));
      for (std::int64_t r = 0; r < rows; ++r) p.rows[static_cast<std::size_t>(r)] = r;
      p.values = std::move(values);
    } else {
      params.dense[spec.name] = model::DenseParam{std::move(values), spec.shape};
    }
  }
  return params;
}

void check_disjoint_variables(const train::Model& a, const train::Model& b) {
  const std::vector<ps::VariableSpec> va = a.variables(), vb = b.variables();
  for (const ps::VariableSpec& x : va)
    for (const ps::VariableSpec& y : vb)
      if (x.name == y.name)
        throw ConfigError("models " + a.name() + " and " + b.name() + " both declare variable '" + x.name +
                          "' (give their graphs different scopes)");
}

}  // namespace strata::nn
