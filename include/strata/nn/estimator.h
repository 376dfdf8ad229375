// Canned estimators (TensorFlow's tf.estimator names and meanings) built on the layer graph:
// a list of feature columns (strata/data/feature_column.h) and a few parameters in, a
// GraphModel out, with no gradient written by hand.
//
//   LinearClassifier / LinearRegressor        logits = sum over columns of a linear term + bias
//   DNNClassifier / DNNRegressor              dense input layer -> hidden_units (activation,
//                                             dropout) -> logits
//   DNNLinearCombinedClassifier / Regressor   the two above added (wide and deep)
//   DLRM                                      numeric columns -> bottom MLP; embedding columns and
//                                             the bottom MLP's output -> DotInteraction (DLRM's
//                                             pairwise dots, with the bottom output itself) -> top
//                                             MLP -> logits
//
// Heads: a classifier with n_classes == 2 has one logit and the sigmoid cross-entropy loss
// (TensorFlow's binary head), n_classes > 2 a softmax over n_classes logits; a regressor one
// output and the mean squared error.
//
// How each column enters a part (TensorFlow's rules, where strata differs it says so):
//   linear part   numeric: a weight per value (one Dense over every numeric value, with the bias);
//                 a categorical column (bucketized, identity, hash bucket, vocabulary, crossed),
//                 or an indicator column over one: a weight per id, summed over the example's ids
//                 (sparse_combiner "sum"), a PS-held table [vocabulary, logits] initialised to
//                 zeros like TF's linear model; an embedding column: its embedding goes through
//                 the Dense with the numeric values. With no numeric or embedding column the bias
//                 is a layer of its own.
//   DNN part      numeric: its values; embedding: an embedding bag (dimension, combiner);
//                 indicator: its multi-hot counts; all concatenated in list order. A bare
//                 categorical column is a ConfigError (TF requires embedding_column or
//                 indicator_column around it, and so does strata).
//   DLRM          numeric columns feed the bottom MLP (whose last width must equal the embedding
//                 dimension); every embedding column must have that dimension; the interaction
//                 sees the bottom output first, then the embeddings in list order. Indicator and
//                 bare categorical columns are ConfigErrors.
//
// Optimizers (TensorFlow's defaults): Linear* trains with FTRL at min(0.2, 1/sqrt(number of
// columns)), DNN* and DLRM with Adagrad at 0.05, each as the job's optimizer (--optimizer / --lr
// override it). DNNLinearCombined* trains each part with its own optimizer, as TensorFlow's
// linear_optimizer / dnn_optimizer do: every variable of the part carries it
// (ps::VariableSpec::optimizer) and its parameter servers apply it. A part's optimizer is the one
// named for it (linear_optimizer / dnn_optimizer), else TensorFlow's default for the part (linear
// FTRL at min(0.2, 1/sqrt(linear columns)), DNN Adagrad 0.05) while part_optimizer_defaults is set,
// else the job's optimizer. A job-wide choice (--optimizer, a spec's "optimizer") clears
// part_optimizer_defaults, so it trains every part no optimizer was named for.
//
// Variables are named "<scope>/linear/...", "<scope>/dnn/...", "<scope>/dlrm/..." (scope may be
// empty), so two estimators with different scopes share parameter servers without clashing.
//
// Thread-safety: make_estimator is reentrant; the model is a GraphModel (see graph_model.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/data/feature_column.h"
#include "strata/nn/graph.h"
#include "strata/nn/graph_model.h"
#include "strata/ps/optimizer.h"

namespace strata::nn {

enum class EstimatorKind {
  kLinearClassifier,
  kLinearRegressor,
  kDNNClassifier,
  kDNNRegressor,
  kDNNLinearCombinedClassifier,
  kDNNLinearCombinedRegressor,
  kDLRM,
};

// "LinearClassifier", ... "DLRM".
const char* to_string(EstimatorKind kind);
// The names above (exact); ConfigError naming `what` and listing them otherwise.
EstimatorKind parse_estimator_kind(const std::string& text, const std::string& what);
bool is_regressor(EstimatorKind kind);

struct EstimatorConfig {
  EstimatorKind kind = EstimatorKind::kDNNClassifier;
  // Linear*: the columns; DNNLinearCombined*: the linear part's.
  std::vector<data::FeatureColumn> linear_feature_columns;
  // DNN* and DLRM: the columns; DNNLinearCombined*: the DNN part's.
  std::vector<data::FeatureColumn> dnn_feature_columns;
  // DNN part's hidden layer widths (DLRM: the top MLP's, before the output layer).
  std::vector<int> hidden_units;
  // DLRM: the bottom MLP over the numeric columns; its last width is the embedding dimension.
  std::vector<int> bottom_units;
  Activation activation = Activation::kRelu;
  double dropout = 0;       // DNN hidden layers, in [0, 1)
  int n_classes = 2;        // classifiers, >= 2
  std::string scope;        // variable name scope ("" = none)
  std::uint64_t seed = 0;   // initializers and dropout
  // DNNLinearCombined* only (ConfigError otherwise): each part's optimizer in
  // ps::OptimizerConfig::parse's syntax ("ftrl:l1=0.01,l2=0.001"; "" = none named) and learning
  // rate (> 0; 0 = the optimizer spec's lr= key, else the part's TensorFlow default: linear
  // min(0.2, 1/sqrt(linear columns)), DNN 0.05). A learning rate given both ways is a ConfigError.
  std::string linear_optimizer;
  std::string dnn_optimizer;
  double linear_learning_rate = 0;
  double dnn_learning_rate = 0;
  // DNNLinearCombined*: a part with no optimizer named gets TensorFlow's default for it (FTRL for
  // the linear part, Adagrad for the DNN part); false: the job's optimizer trains it.
  bool part_optimizer_defaults = true;
};

// The optimizer each part of `config` trains with (see above), as variable name prefixes
// ("<scope>/linear/", "<scope>/dnn/") and configs; empty for estimators other than
// DNNLinearCombined* and for parts that follow the job's optimizer. ConfigError naming the member
// (linear_optimizer, dnn_learning_rate, ...) for a bad optimizer spec or learning rate.
std::vector<std::pair<std::string, ps::OptimizerConfig>> part_optimizers(const EstimatorConfig& config);

// The columns the estimator reads, for data::FeatureTransform: the linear ones, then the DNN
// ones not already listed (a column used by both parts, by name, is transformed once).
std::vector<data::FeatureColumn> input_columns(const EstimatorConfig& config);

// Builds the estimator's model (its training defaults are the estimator's optimizer, learning
// rate and 10 epochs; DNNLinearCombined*'s variables carry their part's optimizer, part_optimizers)
// over data laid out by `layout` (FeatureTransform::layout() of
// input_columns(config)). ConfigError naming the estimator and the column for a column a part
// cannot take, a column missing from the layout, or bad sizes.
std::unique_ptr<GraphModel> make_estimator(const EstimatorConfig& config, const data::FeatureLayout& layout);

}  // namespace strata::nn
