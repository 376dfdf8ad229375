// Unit tests of the evaluation metrics (strata/train/metrics.h): exact AUC against brute-force pair
// counting on random data with ties and against hand-computed cases; accuracy, log loss,
// precision, recall, MAE and MSE by hand; merging across "workers" through the raw state.
#include "strata/train/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "data/rng.h"
#include "strata/common/error.h"

namespace strata::train {
namespace {

double auc_of(const std::vector<double>& scores, const std::vector<std::uint8_t>& labels) {
  return exact_auc(scores.data(), labels.data(), scores.size());
}

// O(n^2): every (positive, negative) pair, a win counting 2 and a tie 1, over 2*P*N, the same final
// operations as the library so that equal counts give equal bits.
double brute_force_auc(const std::vector<double>& scores, const std::vector<std::uint8_t>& labels) {
  std::uint64_t twice = 0, p = 0, n = 0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    if (labels[i]) ++p; else ++n;
    if (!labels[i]) continue;
    for (std::size_t j = 0; j < scores.size(); ++j) {
      if (labels[j]) continue;
      twice += scores[i] > scores[j] ? 2 : scores[i] == scores[j] ? 1 : 0;
    }
  }
  return static_cast<double>(twice) / 2.0 / static_cast<double>(p) / static_cast<double>(n);
}

TEST(ExactAucTest, HandComputedCases) {
  // The classic example: 3 of 4 pairs ordered correctly.
  EXPECT_EQ(auc_of({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}), 0.75);
  // One tie between a positive and a negative: (1 + 0.5 + 2) / 4.
  EXPECT_EQ(auc_of({0.2, 0.5, 0.5, 0.9}, {0, 1, 0, 1}), 0.875);
  EXPECT_EQ(auc_of({0.5, 0.5}, {0, 1}), 0.5);
  // Ties among positives only do not matter.
  EXPECT_EQ(auc_of({0.7, 0.7, 0.1}, {1, 1, 0}), 1.0);
}

TEST(ExactAucTest, PerfectInvertedAndConstantScorers) {
  std::vector<double> scores;
  std::vector<std::uint8_t> labels;
  for (int i = 0; i < 100; ++i) {
    labels.push_back(i % 3 == 0);
    scores.push_back(i % 3 == 0 ? 1.0 + i : -1.0 - i);
  }
  EXPECT_EQ(auc_of(scores, labels), 1.0);
  for (double& s : scores) s = -s;
  EXPECT_EQ(auc_of(scores, labels), 0.0);
  for (double& s : scores) s = 0.25;
  EXPECT_EQ(auc_of(scores, labels), 0.5);
  // Infinite scores are ordinary extremes.
  EXPECT_EQ(auc_of({-INFINITY, INFINITY}, {0, 1}), 1.0);
}

TEST(ExactAucTest, UndefinedWithOneClassOrNaN) {
  EXPECT_TRUE(std::isnan(auc_of({0.1, 0.9}, {1, 1})));
  EXPECT_TRUE(std::isnan(auc_of({0.1, 0.9}, {0, 0})));
  EXPECT_TRUE(std::isnan(auc_of({}, {})));
  EXPECT_TRUE(std::isnan(auc_of({0.1, NAN, 0.3}, {0, 1, 1})));
  EXPECT_THROW(auc_of({0.1, 0.2}, {0, 2}), Error);
}

TEST(ExactAucTest, EqualsBruteForcePairCountingWithTies) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    data::detail::Rng rng(seed);
    const std::size_t n = 1 + static_cast<std::size_t>(rng.below(600));
    // Few distinct score levels (ties everywhere) for half the seeds, continuous for the others.
    const std::uint64_t levels = seed % 2 ? 1 + rng.below(12) : 0;
    std::vector<double> scores(n);
    std::vector<std::uint8_t> labels(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double u = rng.uniform();
      scores[i] = levels ? static_cast<double>(rng.below(levels)) / static_cast<double>(levels) : u;
      // Labels correlated with the score, so the AUC is away from 0.5.
      labels[i] = rng.uniform() < 0.2 + 0.6 * scores[i];
    }
    SCOPED_TRACE("seed " + std::to_string(seed) + " n " + std::to_string(n));
    const double expected = brute_force_auc(scores, labels);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(auc_of(scores, labels)));
    } else {
      EXPECT_EQ(auc_of(scores, labels), expected);
    }
  }
}

TEST(BinaryClassificationMetricsTest, HandComputedAccuracyPrecisionRecall) {
  BinaryClassificationMetrics m;
  const std::vector<float> p = {0.9f, 0.6f, 0.4f, 0.2f, 0.5f};
  const std::vector<float> y = {1, 0, 1, 0, 1};
  m.add(p.data(), y.data(), p.size());
  const BinaryClassificationResult r = m.result();
  // Predicted positive (p > 0.5, so 0.5 is negative): 0.9, 0.6. tp 1, fp 1, fn 2 (0.4, 0.5), tn 1.
  EXPECT_EQ(r.count, 5);
  EXPECT_EQ(r.positives, 3);
  EXPECT_DOUBLE_EQ(r.accuracy, 0.4);
  EXPECT_DOUBLE_EQ(r.precision, 0.5);
  EXPECT_DOUBLE_EQ(r.recall, 1.0 / 3.0);
  // AUC: positives 0.9, 0.4, 0.5 against negatives 0.6, 0.2: 2 + 1 + 1 wins of 6.
  EXPECT_DOUBLE_EQ(r.auc, 4.0 / 6.0);

  // Another threshold moves the decisions, not the AUC.
  BinaryClassificationMetrics low(0.3);
  low.merge(m);
  const BinaryClassificationResult r2 = low.result();
  EXPECT_DOUBLE_EQ(r2.accuracy, 0.8);  // predicted 1,1,1,0,1
  EXPECT_DOUBLE_EQ(r2.precision, 0.75);
  EXPECT_DOUBLE_EQ(r2.recall, 1.0);
  EXPECT_EQ(r2.auc, r.auc);
}

TEST(BinaryClassificationMetricsTest, LogLossIsKerasClipped) {
  BinaryClassificationMetrics m;
  const std::vector<double> p = {0.5, 0.0, 1.0, 1.0};
  const std::vector<double> y = {1, 0, 0, 1};
  m.add(p.data(), y.data(), p.size());
  // -log(0.5 + 1e-7); p = 0 with label 0: -log(1 - 1e-7 + 1e-7) = 0; p = 1 with label 0 is clipped to
  // 1 - 1e-7: -log(2e-7) = 15.4249484703983...; p = 1 with label 1: -log(1 - 1e-7 + 1e-7) = 0.
  const double expected = (0.69314698056 + 0.0 + 15.4249484703984 + 0.0) / 4.0;
  EXPECT_NEAR(m.result().log_loss, expected, 1e-9);
  EXPECT_TRUE(std::isfinite(m.result().log_loss));
}

TEST(BinaryClassificationMetricsTest, EmptyOneClassAndNaN) {
  BinaryClassificationMetrics m;
  BinaryClassificationResult r = m.result();
  EXPECT_EQ(r.count, 0);
  EXPECT_TRUE(std::isnan(r.auc) && std::isnan(r.accuracy) && std::isnan(r.log_loss));
  const std::vector<float> p = {0.2f, 0.7f};
  const std::vector<float> y = {1, 1};
  m.add(p.data(), y.data(), 2);
  r = m.result();
  EXPECT_TRUE(std::isnan(r.auc));  // no negative: undefined
  EXPECT_DOUBLE_EQ(r.accuracy, 0.5);
  EXPECT_DOUBLE_EQ(r.precision, 1.0);
  EXPECT_DOUBLE_EQ(r.recall, 0.5);
  // Nothing predicted positive: precision 0 as Keras' divide_no_nan.
  BinaryClassificationMetrics none;
  const std::vector<float> q = {0.1f, 0.2f};
  const std::vector<float> z = {0, 1};
  none.add(q.data(), z.data(), 2);
  EXPECT_EQ(none.result().precision, 0.0);
  EXPECT_EQ(none.result().auc, 1.0);
  // A NaN probability (a diverged model) is kept and makes AUC and log loss NaN.
  const float nan = NAN;
  const float one = 1;
  none.add(&nan, &one, 1);
  EXPECT_EQ(none.size(), 3u);
  EXPECT_TRUE(std::isnan(none.result().auc));
  EXPECT_TRUE(std::isnan(none.result().log_loss));
  EXPECT_FALSE(std::isnan(none.result().accuracy));
}

TEST(BinaryClassificationMetricsTest, RejectsBadInputWithoutAddingAnything) {
  BinaryClassificationMetrics m;
  const std::vector<float> p = {0.5f, 1.5f};
  const std::vector<float> y = {1, 0};
  EXPECT_THROW(m.add(p.data(), y.data(), 2), Error);
  const std::vector<float> p2 = {0.5f, 0.5f};
  const std::vector<float> y2 = {1, 0.5f};
  EXPECT_THROW(m.add(p2.data(), y2.data(), 2), Error);
  EXPECT_EQ(m.size(), 0u);
  const double s = 0.3;
  const std::uint8_t bad_label = 7;
  EXPECT_THROW(m.add_state(&s, &bad_label, 1), Error);
  const double bad_score = -0.1;
  const std::uint8_t ok = 1;
  EXPECT_THROW(m.add_state(&bad_score, &ok, 1), Error);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_THROW(BinaryClassificationMetrics(1.5), ConfigError);
  EXPECT_THROW(BinaryClassificationMetrics(NAN), ConfigError);
}

// Four "workers" each see a part of the set; gathering their raw state gives the AUC of the union,
// bit-identical whatever the order, and not the mean of the per-worker AUCs.
TEST(BinaryClassificationMetricsTest, MergeIsExactOverTheUnionAndOrderFree) {
  data::detail::Rng rng(99);
  const std::size_t n = 4000;
  std::vector<double> p(n), y(n);
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = rng.uniform() < 0.3 ? 1 : 0;
    // Worker w's scores are shifted by w: per-worker AUCs stay high, the union's is lower.
    const double shift = static_cast<double>(i % 4) * 0.15;
    p[i] = std::min(1.0, std::floor((0.4 * rng.uniform() + 0.3 * y[i] + shift) * 64) / 64);
  }
  BinaryClassificationMetrics whole;
  whole.add(p.data(), y.data(), n);
  BinaryClassificationMetrics workers[4];
  for (std::size_t i = 0; i < n; ++i) workers[i % 4].add(&p[i], &y[i], 1);
  double mean_auc = 0;
  for (const auto& w : workers) mean_auc += w.result().auc / 4;

  // Gather as the evaluator would: the plain vectors, in two different orders.
  BinaryClassificationMetrics forward, backward;
  for (int w = 0; w < 4; ++w) forward.add_state(workers[w].scores().data(), workers[w].labels().data(), workers[w].size());
  for (int w = 3; w >= 0; --w) backward.merge(workers[w]);
  const BinaryClassificationResult a = whole.result(), b = forward.result(), c = backward.result();
  EXPECT_EQ(b.count, static_cast<std::int64_t>(n));
  EXPECT_EQ(a.auc, b.auc);
  EXPECT_EQ(a.auc, c.auc);
  EXPECT_EQ(a.log_loss, b.log_loss);  // summed in sorted order: bit-identical
  EXPECT_EQ(a.log_loss, c.log_loss);
  EXPECT_EQ(a.accuracy, c.accuracy);
  EXPECT_EQ(a.auc, brute_force_auc(whole.scores(), whole.labels()));
  EXPECT_GT(std::fabs(mean_auc - a.auc), 0.01) << "the test data should separate the two";

  // Self-merge doubles every example (and leaves the AUC unchanged).
  BinaryClassificationMetrics twice = whole;
  twice.merge(twice);
  EXPECT_EQ(twice.size(), 2 * n);
  EXPECT_EQ(twice.result().auc, a.auc);
  twice.clear();
  EXPECT_EQ(twice.size(), 0u);
}

TEST(RegressionMetricsTest, HandComputedAndMerged) {
  RegressionMetrics m;
  const std::vector<float> pred = {1, 2, 3};
  const std::vector<float> target = {2, 2, 5};
  m.add(pred.data(), target.data(), 3);
  RegressionResult r = m.result();
  EXPECT_EQ(r.count, 3);
  EXPECT_DOUBLE_EQ(r.mean_absolute_error, 1.0);
  EXPECT_DOUBLE_EQ(r.mean_squared_error, 5.0 / 3.0);

  RegressionMetrics other;
  const std::vector<double> p2 = {0.5};
  const std::vector<double> t2 = {-0.5};
  other.add(p2.data(), t2.data(), 1);
  const std::vector<double> state = other.state();
  ASSERT_EQ(state.size(), RegressionMetrics::kStateSize);
  m.add_state(state.data(), state.size());
  r = m.result();
  EXPECT_EQ(r.count, 4);
  EXPECT_DOUBLE_EQ(r.mean_absolute_error, 4.0 / 4.0);
  EXPECT_DOUBLE_EQ(r.mean_squared_error, 6.0 / 4.0);

  RegressionMetrics empty;
  EXPECT_TRUE(std::isnan(empty.result().mean_absolute_error));
  EXPECT_THROW(empty.add_state(state.data(), 2), Error);
  const double bad[] = {-1, 0, 0};
  EXPECT_THROW(empty.add_state(bad, 3), Error);
  const double fractional[] = {1.5, 0, 0};
  EXPECT_THROW(empty.add_state(fractional, 3), Error);
  empty.merge(m);
  EXPECT_EQ(empty.result().count, 4);
  m.clear();
  EXPECT_EQ(m.result().count, 0);
}

}  // namespace
}  // namespace strata::train
