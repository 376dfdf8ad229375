// The data a model's step works on (Inputs, Params, Grads: host buffers, Keras' layouts), the
// configuration of the built-in models of `strata train` (`--model softmax|mlp|wide_deep`)
// and model-independent helpers (seed derivation, local SGD). The models themselves are
// layer graphs: nn::make_builtin_model (strata/nn/builtin.h) builds the built-in ones from a
// ModelConfig, nn::GraphModel runs them; a model never talks to a parameter server (the training
// loop pulls Params, calls its step and pushes the Grads).
//
// Layout conventions (Keras'): a dense layer's kernel has shape [in, out] and computes
// y = x W + b on row-major batches; embedding tables have shape [vocab, width].
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/ps/variable.h"

namespace strata::model {

// A batch as views of the caller's memory (nothing is copied or owned).
struct Inputs {
  int size = 0;                              // examples in the batch (>= 0)
  // [size, dense_dim] row-major; may be null if dense_dim == 0. Pixel models' defaults (init,
  // learning rates) assume features scaled to [0, 1].
  const float* dense = nullptr;
  int dense_dim = 0;
  const std::int64_t* sparse_ids = nullptr;  // [size, num_fields] row-major; -1 = padding (ignored)
  int num_fields = 0;
  const std::int32_t* labels = nullptr;      // [size], each in [0, num_classes)
  // [size] regression targets (models with a mean-squared-error loss); null for classifiers.
  const float* targets = nullptr;
  // Where this slice sits in training, for per-example randomness that must not depend on the
  // replica count or the run (dropout masks, nn::Graph::dropout): the worker's step counter and
  // the index of row 0 within that step's global batch. 0 when unused.
  std::int64_t step = 0;
  std::int64_t first_example = 0;
};

// How many threads of this process will run the models' products at once (a worker's CPU
// replicas). STRATA_GEMM=auto picks the serial OpenBLAS only for one, since that build takes its
// products in turns on a process-wide mutex. Call before the process's first product: once auto
// has resolved, later calls change nothing. Thread-safe.
void set_multiplying_threads(int threads);

// A whole dense variable, row-major, as pulled from the parameter servers: in `value`, or, when
// `in_place` is set, read in place from a PS on this node (ReplicaContext::read_many's in-place
// form: `in_place` points at num_elements(shape) floats valid until the worker's next push of the
// variable, and `value` is ignored). Readers go through data() and size().
struct DenseParam {
  std::vector<float> value;
  ps::Shape shape;
  const float* in_place = nullptr;

  const float* data() const { return in_place ? in_place : value.data(); }
  std::size_t size() const { return in_place ? static_cast<std::size_t>(ps::num_elements(shape)) : value.size(); }
};

// Some rows of a [vocab, width] table: values holds rows.size() * width floats, row i of values
// being table row rows[i]. As a parameter: the rows pulled for a batch, unique, any order; a
// superset of rows_needed() (e.g. the whole table in local training) is fine. As a gradient: the
// rows the batch touched, unique, sorted ascending, each with its summed gradient.
struct SparseParam {
  std::vector<std::int64_t> rows;
  std::vector<float> values;
  int width = 0;
};

// Keyed by variable name (train::Model::variables()). Sparse variables (sparse_variables()) live
// in `sparse`, every other variable in `dense`.
struct Params {
  std::map<std::string, DenseParam> dense;
  std::map<std::string, SparseParam> sparse;
};

// Same layout as Params; a step fills one entry per trainable variable. Buffers already
// present with the right size are reused, so a caller that keeps one Grads across steps does not
// reallocate the dense gradients.
struct Grads {
  std::map<std::string, DenseParam> dense;
  std::map<std::string, SparseParam> sparse;
};

// A built-in model (nn::make_builtin_model). Zero / empty fields take the model's default where one is listed.
struct ModelConfig {
  std::string name = "mlp";    // softmax | mlp | wide_deep
  int input_dim = 784;         // dense features per example (wide_deep: may be 0)
  int num_classes = 10;        // >= 2 (wide_deep is usually 2)
  std::vector<int> hidden;     // hidden widths; empty = default (mlp {256,128}, wide_deep {64,32});
                               // ignored by softmax
  int num_fields = 0;          // wide_deep: sparse ids per example (>= 1)
  std::int64_t vocab = 0;      // wide_deep: rows of both tables (>= 1)
  int embed_dim = 0;           // wide_deep: embedding width; 0 = 8
  std::uint64_t seed = 0;      // every initializer seed derives from it (derive_seed)
};

// Default hidden layers of the mlp: 256-128 ReLU. Why: the dataset's own benchmark lists an MLP
// 256-128-100 at 0.8833 on Fashion-MNIST, and 256-128 matches it within `strata train`'s time
// budget, where a wider 512-256 gains little accuracy for much more time per epoch (the figures:
// docs/MODELS.md, "The mlp's default hidden layers"). 235k parameters (0.9 MiB) keep the per-step
// pull/push cheap; forward+backward is ~1.0 MFLOP per example, almost all of it in matrix products.
inline const std::vector<int>& default_mlp_hidden() {
  static const std::vector<int> kHidden{256, 128};
  return kHidden;
}
inline const std::vector<int>& default_wide_deep_hidden() {
  static const std::vector<int> kHidden{64, 32};
  return kHidden;
}
constexpr int kDefaultEmbedDim = 8;

// The configuration with its defaults filled in (hidden, embed_dim; softmax drops any hidden
// layer: a --hidden meant for mlp must not silently turn it into one), after checking every
// size. ConfigError naming the model and the field ("model mlp: input_dim must be >= 1, got 0"),
// or listing the known names for an unknown one.
ModelConfig resolve_model_config(const ModelConfig& config);

// The built-in models' names, in documentation order.
const std::vector<std::string>& model_names();

// Seed of one variable: model_seed ^ FNV-1a-64(name). Stable across processes and builds (no
// std::hash), so every worker derives the same initial values.
std::uint64_t derive_seed(std::uint64_t model_seed, const std::string& variable_name);

// Plain SGD in place: value -= lr * grad for every dense gradient and every listed sparse row.
// Error naming the variable when a gradient has no matching parameter, size or row.
void sgd_apply_local(Params& params, const Grads& grads, float lr);

}  // namespace strata::model
