// The model a user brings to train_and_evaluate (the Estimator's model_fn, as an interface).
//
// A Model is math on host buffers: it declares its variables (created in the strategy's scope on
// every worker, in the same order), says which rows of its embedding tables a batch reads, and
// computes the mean loss of a batch with its gradients and the number of correct predictions
// (the metrics: loss and accuracy). It never talks to a parameter server: the training layer
// pulls the parameters, calls step() on every replica, all-reduces and pushes the gradients.
//
// Thread-safety: step() and rows_needed() are const and run concurrently, one call per replica
// thread; each call may use only its own scratch memory and the caller's buffers.
//
// Every model strata builds is an nn::GraphModel (a layer graph: strata/nn/graph_model.h), the
// built-in softmax, mlp and wide_deep among them (strata/nn/builtin.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/data/dataset.h"
#include "strata/model/model.h"
#include "strata/ps/variable.h"

namespace strata::train {

using model::Grads;
using model::Inputs;
using model::Params;

// What one step() computed on one replica's slice of the batch.
struct StepResult {
  double loss = 0;            // mean loss over the slice (0 for an empty slice)
  std::int64_t correct = 0;   // examples predicted right (for accuracy)
};

// A plain dense classifier: the inputs' first input_dim dense columns through Dense ReLU layers of
// the hidden widths, then a Dense layer to num_classes logits, softmax cross-entropy, variables
// (kernel [in, out], bias [out]) per layer in layer order. What a GPU replica
// (replica::GpuMlpReplica) runs.
struct DenseStackShape {
  int input_dim = 0;
  std::vector<int> hidden;
  int num_classes = 0;
};

// What Model::predict writes per example.
enum class PredictionKind {
  kNone,                // predict() is not supported
  kClassProbabilities,  // prediction_width() class probabilities (softmax)
  kBinaryProbability,   // one value: the probability of class 1 (a binary classifier)
  kRegression,          // one value: the predicted target
};

class Model {
 public:
  virtual ~Model() = default;

  // A short name for the summary line ("mlp", "logreg").
  virtual std::string name() const { return "custom"; }
  // One line for the job's first log line, e.g. "mlp 784-256-128-10 relu (235146 parameters)".
  virtual std::string describe() const = 0;
  // Every variable, in creation order; every worker must return the same list (checked).
  virtual std::vector<ps::VariableSpec> variables() const = 0;
  // Variables pulled and pushed by rows (embedding tables); empty for dense models.
  virtual std::vector<std::string> sparse_variables() const { return {}; }
  // Dynamic embedding tables (ps::DynamicVariableSpec), created after variables() in this order;
  // each is also named in sparse_variables(), and rows_needed() returns the ids it reads (any
  // int64, unique ascending), looked up and updated by id on the PS.
  virtual std::vector<ps::DynamicVariableSpec> dynamic_variables() const { return {}; }
  // Unique ascending rows of sparse variable `var` that `inputs` reads.
  virtual std::vector<std::int64_t> rows_needed(const std::string& var, const Inputs& inputs) const;
  // Forward (and backward unless grads is null) over one slice: the mean loss, the correct count,
  // and d(mean loss)/d(variable) for every trainable variable in *grads (dense in grads->dense,
  // sparse variables' touched rows in grads->sparse).
  virtual StepResult step(const Params& params, const Inputs& inputs, Grads* grads) const = 0;

  // Per-example outputs for evaluation (exact AUC, regression errors): writes
  // inputs.size * prediction_width() floats to scores_out, as prediction_kind() describes, and
  // returns true; the default returns false (not supported) and writes nothing. Same threading
  // contract as step(); never trains (dropout is off).
  virtual bool predict(const Params& params, const Inputs& inputs, float* scores_out) const {
    (void)params, (void)inputs, (void)scores_out;
    return false;
  }
  virtual int prediction_width() const { return 0; }
  virtual PredictionKind prediction_kind() const { return PredictionKind::kNone; }

  // True, with *shape filled, when the model is exactly a dense stack (above): such a model can
  // also run on GPU replicas. The default is false.
  virtual bool dense_stack_shape(DenseStackShape* shape) const {
    (void)shape;
    return false;
  }

  // Defaults a RunConfig / TrainSpec field falls back to when left empty.
  virtual std::string default_optimizer() const { return "adam"; }
  virtual double default_learning_rate() const { return 0; }  // 0: the optimizer's own
  virtual int default_epochs() const { return 20; }
};

// The batch `b` as model Inputs (views of its buffers).
Inputs inputs_of(const data::Batch& b);

}  // namespace strata::train
