// softmax and mlp: dense inputs through a DenseStack (no hidden layer for softmax, i.e.
// multinomial logistic regression logits = x W + b), softmax cross-entropy on top.
#include <sstream>

#include "builtin_models.h"
#include "layers.h"
#include "strata/common/error.h"

namespace strata::model::detail {
namespace {

class MlpModel final : public Model {
 public:
  explicit MlpModel(const ModelConfig& config)
      : Model(config), stack_("", config.input_dim, config.hidden, config.num_classes) {}

  // Creation order is layer order, kernel before bias (Keras' order), which fixes round-robin
  // placement and the variable-sequence hash every worker must agree on.
  std::vector<ps::VariableSpec> variables() const override {
    std::vector<ps::VariableSpec> specs;
    stack_.append_variables(config().seed, &specs);
    return specs;
  }

  double train_step(const Params& params, const Inputs& inputs, Grads* grads,
                    std::int64_t* correct) const override {
    if (inputs.dense_dim != config().input_dim)
      throw Error("model " + name() + ": inputs have " + std::to_string(inputs.dense_dim) +
                  " dense features, the model takes " + std::to_string(config().input_dim));
    if (inputs.size < 0 || (inputs.size > 0 && inputs.dense == nullptr))
      throw Error("model " + name() + ": inputs have no dense features");
    check_labels(inputs, num_classes());
    // The batch is used in place: a Map over the caller's buffer, never copied.
    const ConstMatrixMap x(inputs.dense, inputs.size, inputs.dense_dim);
    // Per thread, reused: no allocation per step once the batch size is steady (layers.h).
    thread_local DenseStack::Activations acts;
    stack_.forward(params, x, &acts);
    const double loss = softmax_cross_entropy(acts.logits, inputs.labels, grads != nullptr, correct);
    // No d(loss)/d(pixels): nothing consumes it, and it would be the largest GEMM of the step.
    if (grads != nullptr) stack_.backward(params, x, &acts, grads, nullptr);
    return loss;
  }

  std::string describe() const override {
    std::ostringstream os;
    os << name() << ' ' << stack_.dims_string() << (config().hidden.empty() ? "" : " relu") << " ("
       << stack_.num_parameters() << " parameters)";
    return os.str();
  }

 private:
  DenseStack stack_;
};

}  // namespace

std::unique_ptr<Model> make_mlp_model(const ModelConfig& config) { return std::make_unique<MlpModel>(config); }

}  // namespace strata::model::detail
