// The definition behind nn::Graph: nodes in creation order (so already topologically sorted: a
// node's inputs always precede it) and variables in creation order. Private to src/nn.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/nn/graph.h"
#include "strata/ps/variable.h"

namespace strata::nn::detail {

enum class Op {
  kDenseInput,
  kDense,
  kEmbedding,
  kIndicator,
  kConcatenate,
  kAdd,
  kMultiply,
  kDotInteraction,
  kCross,
  kDropout,
  kBias,
};

struct Var {
  std::string name;  // full name, scope included
  ps::Shape shape;
  ps::Initializer init;
  bool sparse = false;  // an embedding table
  // A dynamic table (sparse too): shape {0, dim}; the PS-side spec (its name, dim and init are
  // the fields above).
  bool dynamic = false;
  ps::DynamicVariableSpec dynamic_spec;
};

struct Node {
  Op op = Op::kDenseInput;
  int width = 0;                 // output width
  std::vector<int> inputs;       // node indices
  int kernel = -1, bias = -1;    // kDense, kCross (kBias: bias only): variable indices
  int table = -1;                // kEmbedding: variable index
  Ids ids;                       // kEmbedding, kIndicator
  std::int64_t vocab = 0;        // kEmbedding (0: a dynamic table), kIndicator
  int first_column = 0;          // kDenseInput
  Activation activation = Activation::kNone;
  Combiner combiner = Combiner::kMean;
  bool concat_first = false;     // kDotInteraction
  double rate = 0;               // kDropout
  std::uint64_t seed = 0;        // kDropout
};

struct GraphDef {
  std::string scope;
  std::uint64_t seed = 0;
  std::vector<std::string> name_scopes;  // the open name scopes, outermost first
  std::vector<Node> nodes;
  std::vector<Var> vars;
  std::vector<int> unnamed_counts = std::vector<int>(16, 0);  // per layer type (Op)
};

}  // namespace strata::nn::detail
