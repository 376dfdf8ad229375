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
// Optimizers: TensorFlow trains the linear part with FTRL and the DNN part with Adagrad, one
// optimizer per part. strata applies one optimizer to the whole job (the parameter servers hold
// one optimizer today), so each estimator's default is one optimizer: Linear* FTRL with TF's
// default learning rate min(0.2, 1/sqrt(number of columns)), DNN* and DNNLinearCombined* Adagrad
// 0.05 (TF's DNN default), DLRM Adagrad 0.05. --optimizer / --lr override it.
//
// Variables are named "<scope>/linear/...", "<scope>/dnn/...", "<scope>/dlrm/..." (scope may be
// empty), so two estimators with different scopes share parameter servers without clashing.
//
// Thread-safety: make_estimator is reentrant; the model is a GraphModel (see graph_model.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/data/feature_column.h"
#include "strata/nn/graph.h"
#include "strata/nn/graph_model.h"

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
};

// The columns the estimator reads, for data::FeatureTransform: the linear ones, then the DNN
// ones not already listed (a column used by both parts, by name, is transformed once).
std::vector<data::FeatureColumn> input_columns(const EstimatorConfig& config);

// Builds the estimator's model (its training defaults are the estimator's optimizer, learning
// rate and 10 epochs) over data laid out by `layout` (FeatureTransform::layout() of
// input_columns(config)). ConfigError naming the estimator and the column for a column a part
// cannot take, a column missing from the layout, or bad sizes.
std::unique_ptr<GraphModel> make_estimator(const EstimatorConfig& config, const data::FeatureLayout& layout);

}  // namespace strata::nn
