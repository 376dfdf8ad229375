// The built-in models of `strata train --model` (softmax, mlp, wide_deep) as layer graphs: one
// implementation of forward and backward for every model strata trains (nn::GraphModel).
//
//   softmax    logits = x W + b ("logits/kernel", "logits/bias"), softmax cross-entropy.
//   mlp        x -> Dense ReLU "dense_0" ... "dense_<h-1>" -> Dense "logits" (default 256-128).
//   wide_deep  logits = wide + deep (Cheng et al. 2016, Keras WideDeepModel):
//              wide: the sum over every field's id of the row "wide/weights"[id] ([vocab, classes],
//                    zeros), so one id space is shared by all fields (hashed features);
//              deep: per field the row "deep/embedding"[id] ([vocab, embed_dim], uniform +-0.05),
//                    concatenated in field order (a padding id, -1, gives zeros), then the dense
//                    features, through Dense ReLU "deep/dense_<i>" (default 64-32) and a Dense
//                    "deep/logits".
//
// Variable names, shapes, initializers and creation order are those of the built-in models'
// checkpoints (Keras' layout: kernel [in, out] Glorot-uniform, bias zeros), seeded by
// model::derive_seed(seed, name). Defaults when a RunConfig / TrainSpec leaves them empty:
// softmax and mlp Adam at its own rate for 20 epochs; wide_deep Adagrad 0.2 for 3 epochs.
//
// Thread-safety: see nn::GraphModel. Errors: a bad name or size is a ConfigError naming the model
// and the field (model::resolve_model_config).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/data/dataset.h"
#include "strata/model/model.h"
#include "strata/nn/graph_model.h"

namespace strata::nn {

// The model `config` describes (validated, defaults filled: model::resolve_model_config).
std::unique_ptr<GraphModel> make_builtin_model(const model::ModelConfig& config);

// A built-in model sized for `train` (input width, classes, fields, vocabulary), e.g.
// make_builtin_model("mlp", {}, seed, train). ConfigError for an unknown name.
std::unique_ptr<GraphModel> make_builtin_model(const std::string& name, const std::vector<int>& hidden,
                                               std::uint64_t seed, const data::Dataset& train);

}  // namespace strata::nn
