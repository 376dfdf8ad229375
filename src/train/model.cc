// train::Model's defaults and the built-in models behind the interface.
#include "strata/train/model.h"

#include "strata/common/error.h"

namespace strata::train {

std::vector<std::int64_t> Model::rows_needed(const std::string& var, const Inputs&) const {
  throw Error("rows_needed('" + var + "'): the model has no sparse variable of that name");
}

BuiltinModel::BuiltinModel(std::unique_ptr<model::Model> model) : model_(std::move(model)) {
  if (!model_) throw Error("BuiltinModel: no model");
}

StepResult BuiltinModel::step(const Params& params, const Inputs& inputs, Grads* grads) const {
  StepResult r;
  r.loss = model_->train_step(params, inputs, grads, &r.correct);
  return r;
}

// Defaults: enough epochs for each model's documented accuracy with margin (mlp >= 0.88, softmax
// ~0.84 on Fashion-MNIST; wide_deep ~0.81 on synthetic-sparse), as measured in
// docs/PERFORMANCE.md.
std::string BuiltinModel::default_optimizer() const { return model_->name() == "wide_deep" ? "adagrad" : "adam"; }
double BuiltinModel::default_learning_rate() const { return model_->name() == "wide_deep" ? 0.2 : 0; }
int BuiltinModel::default_epochs() const { return model_->name() == "wide_deep" ? 3 : 20; }

std::unique_ptr<BuiltinModel> make_builtin_model(const std::string& name, const std::vector<int>& hidden,
                                                 std::uint64_t seed, const data::Dataset& train) {
  model::ModelConfig m;
  m.name = name;
  m.input_dim = train.dense_dim;
  m.num_classes = train.num_classes;
  m.hidden = hidden;
  m.num_fields = train.num_fields;
  m.vocab = train.sparse_vocab;
  m.seed = seed;
  return std::make_unique<BuiltinModel>(model::make_model(m));
}

Inputs inputs_of(const data::Batch& b) {
  Inputs in;
  in.size = b.size;
  in.dense = b.features.empty() ? nullptr : b.features.data();
  in.dense_dim = b.dense_dim;
  in.sparse_ids = b.sparse_ids.empty() ? nullptr : b.sparse_ids.data();
  in.num_fields = b.num_fields;
  in.labels = b.labels.empty() ? nullptr : b.labels.data();
  in.targets = b.targets.empty() ? nullptr : b.targets.data();
  return in;
}

}  // namespace strata::train
