// A layer graph wired functionally (Keras' functional API, TF's name scopes): the user creates
// inputs, calls layers on tensors and gets tensors back; nn::GraphModel (strata/nn/graph_model.h)
// turns the graph's output and a loss into a train::Model with forward and backward for free.
//
//   nn::Graph g("ctr", /*seed=*/7);                        // variables named "ctr/..."
//   nn::Tensor dense = g.dense_input(0, 13);               // columns 0..12 of Inputs::dense
//   nn::Tensor emb = g.embedding(g.ids_input(0, 1), 1000, 8, nn::Combiner::kMean);
//   nn::Tensor h = g.dense(g.concatenate({dense, emb}), 64, nn::Activation::kRelu);
//   nn::Tensor logit = g.dense(h, 1);
//   nn::GraphModel model(g, logit, nn::Loss::kSigmoidCrossEntropy);
//
// Tensors are [batch, width] row-major floats. Inputs are views of model::Inputs: a slice of the
// dense features (first column, width) and a range of sparse-id slots (first field, count; a
// multi-valued feature occupies `count` slots padded with -1 = kNoId, as the Dataset stores them).
//
// Variables and names: every variable is "<scope>/<name scopes...>/<layer>/<variable>", e.g.
// "ctr/dense_1/kernel". A layer without an explicit name is "<type>_<k>", k counting that type's
// unnamed layers in this graph from 0 (dense_0, dense_1, embedding_0, cross_0). Scope, name-scope
// and layer names are one path segment each of [A-Za-z0-9_.-]; anything else is a ConfigError, so
// two graphs with different non-empty scopes can never produce the same variable name (the first
// segment differs) and can share parameter servers. An empty scope gives unprefixed names (the
// built-in models' layout). A name used twice in one graph is a ConfigError naming it.
// Initial values are seeded by model::derive_seed(seed, full variable name).
//
// Thread-safety: building a graph is single-threaded. A Graph is a value: copying it copies the
// definition; a GraphModel keeps its own frozen copy, so editing the Graph afterwards does not
// change models built from it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/ps/variable.h"

namespace strata::nn {

namespace detail {
struct GraphDef;
}

// Padding of multi-valued id slots (model::Inputs::sparse_ids).
constexpr std::int64_t kNoId = -1;

enum class Activation { kNone, kRelu, kSigmoid, kTanh };

// How an embedding bag reduces the rows of one example's ids (TF's embedding_column combiners):
// kSum: sum of rows; kMean: sum / n; kSqrtn: sum / sqrt(n), n = the example's non-padding ids
// (a repeated id counts each time). An example with no id gives zeros.
enum class Combiner { kSum, kMean, kSqrtn };

// A value in one Graph: node index and width. Only meaningful with the graph that returned it.
struct Tensor {
  int node = -1;
  int width = 0;
};

// A range of sparse-id slots of the inputs: fields [first_field, first_field + count).
struct Ids {
  int first_field = 0;
  int count = 0;
};

// An embedding table: a [vocab, dim] sparse variable held by the parameter servers (pulled and
// pushed by rows), or a dynamic table (dynamic_embedding_table: vocab 0, rows keyed by any int64
// id, looked up and updated by id). Several embedding() calls may read one table (shared
// embeddings).
struct Table {
  int var = -1;
  std::int64_t vocab = 0;  // 0 for a dynamic table
  int dim = 0;
  bool dynamic = false;
};

// Admission and eviction of a dynamic table (the fields of ps::DynamicVariableSpec, whose
// validate() checks them: ConfigError naming the table and the field).
struct DynamicTableOptions {
  std::int64_t admit_after = 0;                   // an id gets a row once seen this often (0/1: at once)
  std::int64_t capacity = std::int64_t{1} << 24;  // most rows per PS (least-recently-updated evicted)
  std::int64_t ttl = 0;                           // rows not updated for ttl steps go; 0: never
  std::int64_t max_ids = 4096;                    // most distinct ids per request to one PS
};

class Graph {
 public:
  // `scope`: "" or one name segment (see above). `seed`: the initializers' model seed.
  explicit Graph(const std::string& scope = "", std::uint64_t seed = 0);
  Graph(const Graph& other);
  Graph& operator=(const Graph& other);
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  ~Graph();

  const std::string& scope() const;
  std::uint64_t seed() const;

  // ---- inputs ----
  // Columns [first_column, first_column + width) of Inputs::dense (width >= 1).
  Tensor dense_input(int first_column, int width);
  // Slots [first_field, first_field + count) of Inputs::sparse_ids (count >= 1). Not a tensor:
  // ids feed embedding() and indicator().
  Ids ids_input(int first_field, int count);

  // ---- name scopes (TF name_scope) ----
  // While the returned guard lives, new layers are named "<scope>/<name>/<layer>". Nested guards
  // nest; they must be destroyed in reverse order (automatic for scoped variables).
  class NameScope {
   public:
    NameScope(NameScope&& other) noexcept;
    NameScope(const NameScope&) = delete;
    NameScope& operator=(const NameScope&) = delete;
    NameScope& operator=(NameScope&&) = delete;
    ~NameScope();

   private:
    friend class Graph;
    explicit NameScope(detail::GraphDef* def) : def_(def) {}
    detail::GraphDef* def_;
  };
  [[nodiscard]] NameScope name_scope(const std::string& name);

  // ---- layers ----
  // Keras Dense: act(x W + b), kernel [in, units] Glorot-uniform, bias [units] zeros.
  Tensor dense(Tensor x, int units, Activation activation = Activation::kNone, const std::string& name = "");
  // A [vocab, dim] table (variable "<layer>/<variable>", "<layer>/embeddings" by default; another
  // `variable` segment keeps a layout's existing names, e.g. the built-in wide_deep's
  // "wide/weights"); default initializer Keras Embedding's uniform(-0.05, 0.05), seeded from the
  // variable's name when `init` has no seed of its own.
  Table embedding_table(std::int64_t vocab, int dim, const std::string& name = "",
                        std::optional<ps::Initializer> init = std::nullopt,
                        const std::string& variable = "embeddings");
  // A dynamic table of `dim` floats per row (variable "<layer>/embeddings", a
  // ps::DynamicVariableSpec): no vocabulary, any int64 id other than kNoId is a row, created on
  // the PS at its first (admitted) lookup from `init`, a pure function of (init, id). Default
  // initializer uniform(-0.05, 0.05) seeded from the variable's name; glorot_uniform is refused
  // (a row has no fan). The model lists it in dynamic_variables(), not variables().
  Table dynamic_embedding_table(int dim, const std::string& name = "",
                                std::optional<ps::Initializer> init = std::nullopt,
                                const DynamicTableOptions& options = {});
  // An embedding bag: per example, the combination of the table rows of its ids -> [batch, dim].
  // For a fixed table, ids outside [0, vocab) (other than kNoId) are an Error at step time naming
  // the table; a dynamic table takes any id but kNoId.
  Tensor embedding(Ids ids, const Table& table, Combiner combiner = Combiner::kMean);
  // A new table read once: embedding(ids, embedding_table(vocab, dim, name), combiner).
  Tensor embedding(Ids ids, std::int64_t vocab, int dim, Combiner combiner = Combiner::kMean,
                   const std::string& name = "");
  // TF indicator_column: multi-hot counts [batch, vocab] (an id present twice counts 2). No
  // variable; not differentiable (an input).
  Tensor indicator(Ids ids, std::int64_t vocab);
  // Along the feature axis, in argument order (>= 1 tensor).
  Tensor concatenate(const std::vector<Tensor>& xs);
  // Elementwise sum / product of >= 2 tensors of one width.
  Tensor add(const std::vector<Tensor>& xs);
  Tensor multiply(const std::vector<Tensor>& xs);
  // DLRM's interaction: xs are k >= 2 tensors of one width d; the output is the dot products
  // <x_i, x_j> for every i > j, in order (1,0), (2,0), (2,1), (3,0), ... (the strictly lower
  // triangle row by row), preceded by xs[0] itself when concat_first (DLRM concatenates the
  // bottom MLP's output): width k(k-1)/2 (+ d).
  Tensor dot_interaction(const std::vector<Tensor>& xs, bool concat_first = true);
  // DCN-v2 cross layer: x0 * (x W + b) + x, W [d, d] Glorot-uniform, b [d] zeros; x0 and x have
  // the same width d. The first layer of a cross network is cross(x0, x0).
  Tensor cross(Tensor x0, Tensor x, const std::string& name = "");
  // x + b with a trainable b [width] (zeros): an offset on its own, e.g. the bias of a linear
  // model whose terms are all embedding sums (no Dense carries one).
  Tensor bias(Tensor x, const std::string& name = "");
  // Inverted dropout while training (step() with gradients): each element is kept with
  // probability 1 - rate and scaled by 1 / (1 - rate). The mask is a pure function of (seed,
  // Inputs::step, Inputs::first_example + row, column), so runs are bit-reproducible. Identity
  // when not training (evaluation, predict). rate in [0, 1).
  Tensor dropout(Tensor x, double rate, std::uint64_t seed);

  // The definition (for GraphModel).
  const detail::GraphDef& def() const { return *def_; }

 private:
  std::unique_ptr<detail::GraphDef> def_;
};

}  // namespace strata::nn
