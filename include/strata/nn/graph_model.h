// A layer graph (strata/nn/graph.h) with a loss on top, as a train::Model: train_and_evaluate
// trains it like any model. Gradients come from reverse-mode differentiation of the graph.
//
// Losses (the mean over the batch):
//   kSoftmaxCrossEntropy  output = logits [batch, classes >= 2]; labels int32 in [0, classes);
//                         correct = argmax (first maximum) == label.
//   kSigmoidCrossEntropy  output = one logit [batch, 1]; labels 0 or 1;
//                         correct = (sigmoid(logit) >= 0.5) == label.
//   kMeanSquaredError     output = prediction [batch, 1]; Inputs::targets [batch] floats;
//                         correct = 0 (no accuracy for a regressor).
// predict() writes class probabilities (softmax), the probability of class 1 (sigmoid) or the
// prediction (mse); prediction_width() values per example.
//
// Only the part of the graph the output depends on is part of the model: its variables, in the
// order the graph created them, are variables(); its embedding tables are sparse_variables(), and
// its dynamic tables are both sparse_variables() and dynamic_variables() (their rows are keyed by
// id: Params::sparse holds the ids rows_needed() returns, any int64 but kNoId).
//
// Thread-safety: every const member function may run concurrently on several threads (CPU
// replicas). step() and predict() take a scratch workspace from a pool owned by the model and
// return it when done; once each concurrent caller has run one step of a given batch size,
// further steps of that size allocate no heap memory in the model (the caller's Grads are reused
// in place; their buffers keep their capacity).
//
// Errors: a malformed graph (output not in the graph, width mismatch for the loss) is a
// ConfigError at construction; inputs that do not fit (too few dense columns or id fields, bad
// labels, missing targets, an id outside a table) or missing parameters are a strata::Error at
// step time naming the variable or value.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/nn/graph.h"
#include "strata/train/model.h"

namespace strata::nn {

enum class Loss { kSoftmaxCrossEntropy, kSigmoidCrossEntropy, kMeanSquaredError };

namespace detail {
struct Workspace;
struct Program;
}  // namespace detail

// What a RunConfig / TrainSpec left empty falls back to (train::Model's defaults).
struct TrainingDefaults {
  std::string optimizer = "adam";
  double learning_rate = 0;  // 0: the optimizer's own
  int epochs = 20;
};

class GraphModel : public train::Model {
 public:
  // `name`: the summary line's model name. ConfigError for a malformed graph or duplicate names.
  GraphModel(const Graph& graph, Tensor output, Loss loss, std::string name = "graph",
             TrainingDefaults defaults = {});
  ~GraphModel() override;
  GraphModel(const GraphModel&) = delete;
  GraphModel& operator=(const GraphModel&) = delete;

  std::string name() const override { return name_; }
  // "graph ctr: 13+26x8 -> 256-128-1 (N parameters)": dense input columns, embedding bags
  // (count x dim), indicator widths, then the Dense/Cross widths in creation order.
  std::string describe() const override;
  std::vector<ps::VariableSpec> variables() const override;
  std::vector<std::string> sparse_variables() const override;
  // The live dynamic tables (Graph::dynamic_embedding_table), creation order. They are sparse
  // variables too (Params::sparse, rows keyed by id), but not in variables().
  std::vector<ps::DynamicVariableSpec> dynamic_variables() const override;
  std::vector<std::int64_t> rows_needed(const std::string& var, const train::Inputs& inputs) const override;
  train::StepResult step(const train::Params& params, const train::Inputs& inputs,
                         train::Grads* grads) const override;
  bool predict(const train::Params& params, const train::Inputs& inputs, float* scores_out) const override;
  int prediction_width() const override;
  // A dense stack when the live graph is exactly dense_input(0, d) -> Dense ReLU ... -> Dense
  // (no activation) as the output, with softmax cross-entropy (train::DenseStackShape).
  bool dense_stack_shape(train::DenseStackShape* shape) const override;
  train::PredictionKind prediction_kind() const override;

  std::string default_optimizer() const override { return defaults_.optimizer; }
  double default_learning_rate() const override { return defaults_.learning_rate; }
  int default_epochs() const override { return defaults_.epochs; }

  Loss loss() const { return loss_; }
  // Total trainable elements (tables counted in full).
  std::int64_t num_parameters() const;

 private:
  // Forward (training or not) into `ws`; backward into *grads when non-null.
  train::StepResult run(const train::Params& params, const train::Inputs& inputs, train::Grads* grads,
                        detail::Workspace& ws, float* scores_out) const;
  std::unique_ptr<detail::Workspace> acquire() const;
  void release(std::unique_ptr<detail::Workspace> ws) const;

  std::string name_;
  Loss loss_;
  TrainingDefaults defaults_;
  std::unique_ptr<const detail::Program> program_;
  mutable std::mutex pool_mutex_;  // guards pool_
  mutable std::vector<std::unique_ptr<detail::Workspace>> pool_;
};

// Every variable of `model` filled from its initializer in this process (sparse variables as
// whole tables, rows 0..vocab-1), the values the parameter servers materialise: single-process
// training and tests (model::init_local_params for any train::Model). Dynamic tables have no
// whole table: they are left out (their rows are looked up by id on the PS).
train::Params init_local_params(const train::Model& model);

// ConfigError naming the first variable name both models declare: models trained against the
// same parameter servers must not share a name (give their graphs different scopes).
void check_disjoint_variables(const train::Model& a, const train::Model& b);

}  // namespace strata::nn
