// wide_deep (Cheng et al. 2016, Keras WideDeepModel): logits = wide + deep.
//
//   wide: a linear model over the sparse ids, sum over the example's ids of the row
//         "wide/weights"[id] ([vocab, classes]); padding ids (-1) contribute nothing.
//   deep: the embedding "deep/embedding"[id] ([vocab, embed_dim]) of each field, concatenated in
//         field order (a padding field gives zeros), followed by the dense features, through a
//         ReLU MLP "deep/dense_<i>" and a linear "deep/logits" layer.
//
// Both tables are sparse variables: a step pulls only the rows its batch uses and pushes summed
// gradients for those rows (SparseParam). One id space is shared by all fields (hashed features),
// so one rows_needed() list serves both tables.
#include <sstream>

#include "builtin_models.h"
#include "layers.h"
#include "strata/common/error.h"

namespace strata::model::detail {
namespace {

const std::string kWide = "wide/weights";
const std::string kEmbedding = "deep/embedding";

class WideDeepModel final : public Model {
 public:
  explicit WideDeepModel(const ModelConfig& config)
      : Model(config),
        stack_("deep/", config.num_fields * config.embed_dim + config.input_dim, config.hidden,
               config.num_classes) {}

  std::vector<ps::VariableSpec> variables() const override {
    const ModelConfig& c = config();
    std::vector<ps::VariableSpec> specs;
    ps::VariableSpec wide;
    wide.name = kWide;
    wide.shape = {c.vocab, c.num_classes};
    wide.init = ps::Initializer::zeros();  // Keras LinearModel's default kernel initializer
    specs.push_back(std::move(wide));
    ps::VariableSpec embedding;
    embedding.name = kEmbedding;
    embedding.shape = {c.vocab, c.embed_dim};
    embedding.init = ps::Initializer::uniform(-0.05, 0.05, derive_seed(c.seed, kEmbedding));  // Keras Embedding
    specs.push_back(std::move(embedding));
    stack_.append_variables(c.seed, &specs);
    return specs;
  }

  std::vector<std::string> sparse_variables() const override { return {kWide, kEmbedding}; }

  std::vector<std::int64_t> rows_needed(const std::string& var, const Inputs& inputs) const override {
    if (var != kWide && var != kEmbedding) return Model::rows_needed(var, inputs);
    check_sparse(inputs);
    return unique_ids(inputs, config().vocab, var);
  }

  double train_step(const Params& params, const Inputs& inputs, Grads* grads,
                    std::int64_t* correct) const override {
    const ModelConfig& c = config();
    check_sparse(inputs);
    if (inputs.dense_dim != c.input_dim)
      throw Error("model wide_deep: inputs have " + std::to_string(inputs.dense_dim) +
                  " dense features, the model takes " + std::to_string(c.input_dim));
    if (inputs.size > 0 && c.input_dim > 0 && inputs.dense == nullptr)
      throw Error("model wide_deep: inputs have no dense features");
    check_labels(inputs, c.num_classes);
    // Validates every id before any lookup, so a bad id is reported as such, not as a missing row.
    const std::vector<std::int64_t> ids = unique_ids(inputs, c.vocab, kEmbedding);
    const RowIndex wide(params, kWide, c.num_classes);
    const RowIndex embedding(params, kEmbedding, c.embed_dim);

    const int batch = inputs.size, fields = c.num_fields, width = c.embed_dim, classes = c.num_classes;
    const int embed_cols = fields * width;
    // Deep input [batch, fields * embed_dim + dense_dim]: the one copy this model makes, since
    // the embeddings are gathered from scattered rows anyway.
    RowMatrix x(batch, embed_cols + c.input_dim);
    for (int b = 0; b < batch; ++b) {
      for (int f = 0; f < fields; ++f) {
        const std::int64_t id = inputs.sparse_ids[static_cast<std::size_t>(b) * fields + f];
        auto dst = x.row(b).segment(f * width, width);
        if (id < 0) dst.setZero();
        else dst = ConstRowVectorMap(embedding.row(id), width);
      }
    }
    if (c.input_dim > 0) x.rightCols(c.input_dim) = ConstMatrixMap(inputs.dense, batch, c.input_dim);

    // Per thread, reused: no allocation per step once the batch size is steady (layers.h).
    thread_local DenseStack::Activations acts;
    stack_.forward(params, x, &acts);
    for (int b = 0; b < batch; ++b)
      for (int f = 0; f < fields; ++f)
        if (const std::int64_t id = inputs.sparse_ids[static_cast<std::size_t>(b) * fields + f]; id >= 0)
          acts.logits.row(b) += ConstRowVectorMap(wide.row(id), classes);

    const double loss = softmax_cross_entropy(acts.logits, inputs.labels, grads != nullptr, correct);
    if (grads == nullptr) return loss;

    // acts.logits now holds d(loss)/d(logits): the wide rows' gradient is its sum over the
    // examples (and fields) using each id; the deep tower back-propagates to the embeddings.
    SparseParam& wide_grad = sparse_grad(grads, kWide, ids, classes);
    RowMatrix dx;
    stack_.backward(params, x, &acts, grads, &dx);
    SparseParam& embedding_grad = sparse_grad(grads, kEmbedding, ids, width);
    for (int b = 0; b < batch; ++b) {
      for (int f = 0; f < fields; ++f) {
        const std::int64_t id = inputs.sparse_ids[static_cast<std::size_t>(b) * fields + f];
        if (id < 0) continue;
        const std::size_t k = static_cast<std::size_t>(index_of(ids, id));
        RowVectorMap(wide_grad.values.data() + k * classes, classes) += acts.logits.row(b);
        RowVectorMap(embedding_grad.values.data() + k * width, width) += dx.row(b).segment(f * width, width);
      }
    }
    return loss;
  }

  std::string describe() const override {
    const ModelConfig& c = config();
    std::ostringstream os;
    os << "wide_deep wide[" << c.vocab << "x" << c.num_classes << "] + deep[" << c.num_fields << "x"
       << c.embed_dim << " emb + " << c.input_dim << " dense] " << stack_.dims_string() << " relu ("
       << num_parameters() << " parameters)";
    return os.str();
  }

 private:
  void check_sparse(const Inputs& inputs) const {
    if (inputs.num_fields != config().num_fields)
      throw Error("model wide_deep: inputs have " + std::to_string(inputs.num_fields) +
                  " sparse fields, the model takes " + std::to_string(config().num_fields));
    if (inputs.size < 0 || (inputs.size > 0 && inputs.sparse_ids == nullptr))
      throw Error("model wide_deep: inputs have no sparse ids");
  }

  // The gradient of a table restricted to `ids` (ascending), zeroed for accumulation.
  static SparseParam& sparse_grad(Grads* grads, const std::string& name, const std::vector<std::int64_t>& ids,
                                  int width) {
    SparseParam& g = grads->sparse[name];
    g.rows = ids;
    g.width = width;
    g.values.assign(ids.size() * static_cast<std::size_t>(width), 0.0f);
    return g;
  }

  DenseStack stack_;
};

}  // namespace

std::unique_ptr<Model> make_wide_deep_model(const ModelConfig& config) {
  return std::make_unique<WideDeepModel>(config);
}

}  // namespace strata::model::detail
