// The specs of docs/DYNAMIC.md's "One table of millions of ids": C1 is a column of its own, with a
// table sized for millions of ids (2^24 buckets fixed; dynamic with ttl and a per-PS capacity),
// and the two specs differ only in the categorical columns' tables.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "strata/data/feature_column.h"
#include "strata/nn/estimator.h"
#include "strata/nn/model_spec.h"

namespace strata::nn {
namespace {

ModelSpec load_shipped(const std::string& name) {
  return load_model_spec(std::string(STRATA_SOURCE_DIR) + "/examples/specs/" + name);
}

TEST(ModelSpec, BigColumnChurnSpecsParse) {
  const ModelSpec fixed = load_shipped("criteo_dlrm_churn_big_fixed.json");
  const ModelSpec dyn = load_shipped("criteo_dlrm_churn_big_dynamic.json");
  for (const ModelSpec* s : {&fixed, &dyn}) {
    EXPECT_EQ(s->estimator.kind, EstimatorKind::kDLRM);
    // 13 numeric columns, then C1 alone, then C2..C26 (no bucketized embeddings of the integers).
    ASSERT_EQ(s->estimator.dnn_feature_columns.size(), 13u + 26u);
    EXPECT_EQ(s->estimator.dnn_feature_columns[13].name(), "C1_embedding");
    EXPECT_EQ(s->estimator.dnn_feature_columns[38].name(), "C26_embedding");
    for (std::size_t i = 13; i < 39; ++i) {
      ASSERT_TRUE(s->estimator.dnn_feature_columns[i].categorical) << i;
      EXPECT_EQ(s->estimator.dnn_feature_columns[i].dimension, 8) << i;
    }
  }
  const data::FeatureColumn& f1 = fixed.estimator.dnn_feature_columns[13];
  EXPECT_FALSE(f1.categorical->dynamic);
  EXPECT_EQ(f1.vocabulary_size(), 16777216);
  EXPECT_EQ(fixed.estimator.dnn_feature_columns[14].vocabulary_size(), 524288);

  const data::FeatureColumn& d1 = dyn.estimator.dnn_feature_columns[13];
  ASSERT_TRUE(d1.categorical->dynamic);
  EXPECT_EQ(d1.vocabulary_size(), data::kDynamicVocabulary);
  EXPECT_EQ(d1.categorical->dynamic_options.capacity, 524288);
  EXPECT_EQ(d1.categorical->dynamic_options.ttl, 1600);
  const data::FeatureColumn& d26 = dyn.estimator.dnn_feature_columns[38];
  ASSERT_TRUE(d26.categorical->dynamic);
  EXPECT_EQ(d26.categorical->dynamic_options.capacity, 65536);
  EXPECT_EQ(d26.categorical->dynamic_options.ttl, 1600);
}

}  // namespace
}  // namespace strata::nn
