// Evaluation metrics over a whole evaluation set, accumulated batch by batch and merged across
// workers: accuracy, exact ROC AUC, log loss, precision and recall for binary classifiers; mean
// absolute and mean squared error for regressors. Names and definitions are Keras' metrics
// (tf.keras.metrics.BinaryAccuracy, AUC, BinaryCrossentropy, Precision, Recall,
// MeanAbsoluteError, MeanSquaredError) except where stated.
//
// AUC is exact: the area under the ROC curve of every (score, label) pair added, computed by
// sorting (O(n log n)), a tie between a positive and a negative counting one half. It equals the
// Mann-Whitney U statistic divided by P*N. Keras' AUC approximates it with 200 thresholds; strata
// keeps every score instead (9 bytes per example), so the figure does not depend on the score's
// distribution, and AUC over several workers is the AUC of the union of their examples, never an
// average of per-worker AUCs.
//
// Distribution: an accumulator's state is plain vectors (scores(), labels() or state()). To
// evaluate over several workers, gather those vectors to one rank (e.g. MPI_Gatherv of the doubles
// and the bytes) and add them there with add_state(); merge() does the same within a process.
// BinaryClassificationMetrics::result() is a pure function of the multiset of pairs added: the
// order of batches, of workers and of merges changes no bit of it.
//
// Thread-safety: none; one accumulator per thread, merged afterwards. Copyable value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::train {

// Exact ROC AUC of scores against labels (1 positive, 0 negative): the fraction of
// (positive, negative) pairs whose positive scores higher, ties counting one half. NaN when there
// is no positive or no negative (AUC is undefined) or when any score is NaN. Scores may be any
// real numbers (logits, probabilities, ranks); +-Inf are ordered as usual. Throws strata::Error
// if a label is not 0 or 1. Sorts a copy: O(n log n) time, 16 bytes per example of scratch.
double exact_auc(const double* scores, const std::uint8_t* labels, std::size_t n);

struct BinaryClassificationResult {
  std::int64_t count = 0;      // examples
  std::int64_t positives = 0;  // examples with label 1
  // Every field below is NaN when count is 0, and auc and log_loss are NaN when a score is NaN.
  double accuracy = 0;   // fraction with (probability > threshold) == label
  double auc = 0;        // exact_auc of the probabilities; NaN when one class is absent
  double log_loss = 0;   // mean of -(y*log(p + eps) + (1-y)*log(1 - p + eps)), p clipped to [eps, 1-eps], eps 1e-7
  double precision = 0;  // tp / (tp + fp); 0 when nothing is predicted positive (Keras' divide_no_nan)
  double recall = 0;     // tp / (tp + fn); 0 when there is no positive (Keras' divide_no_nan)
};

// Accumulates (probability of class 1, label) pairs of a binary classifier.
class BinaryClassificationMetrics {
 public:
  // Keras' epsilon, by which log loss clips probabilities.
  static constexpr double kEpsilon = 1e-7;

  // `threshold` (in [0, 1]) decides the predicted class for accuracy, precision and recall: an
  // example is predicted positive when its probability is > threshold (Keras). Throws ConfigError
  // when it is out of range.
  explicit BinaryClassificationMetrics(double threshold = 0.5);

  // Adds n examples. Probabilities must be in [0, 1] or NaN (a diverged model: recorded, and the
  // result reports NaN AUC and log loss); labels must be exactly 0 or 1. Throws strata::Error
  // naming the first bad example (and adds none of the batch) otherwise.
  void add(const float* probabilities, const float* labels, std::size_t n);
  void add(const double* probabilities, const double* labels, std::size_t n);

  // The raw state, for gathering to an evaluator: one probability and one 0/1 label per example,
  // in the order added.
  const std::vector<double>& scores() const { return scores_; }
  const std::vector<std::uint8_t>& labels() const { return labels_; }
  // Adds another accumulator's raw state (scores()/labels() gathered from elsewhere), with the
  // same checks as add() (gathered bytes are not trusted either).
  void add_state(const double* scores, const std::uint8_t* labels, std::size_t n);
  // add_state(other.scores(), other.labels()); the thresholds need not match (each accumulator's
  // result() uses its own).
  void merge(const BinaryClassificationMetrics& other);

  std::size_t size() const { return scores_.size(); }
  double threshold() const { return threshold_; }
  void clear();

  // All metrics over every example added; O(n log n) (AUC sorts). Does not change the state.
  BinaryClassificationResult result() const;

 private:
  double threshold_;
  std::vector<double> scores_;
  std::vector<std::uint8_t> labels_;
};

struct RegressionResult {
  std::int64_t count = 0;
  double mean_absolute_error = 0;  // NaN when count is 0
  double mean_squared_error = 0;   // NaN when count is 0
};

// Accumulates (prediction, target) pairs of a regressor as three sums. NaN or Inf values are not
// rejected: they propagate into the result, which is how a diverged model shows.
class RegressionMetrics {
 public:
  // Length of state(): count, sum of |error|, sum of error^2.
  static constexpr std::size_t kStateSize = 3;

  void add(const float* predictions, const float* targets, std::size_t n);
  void add(const double* predictions, const double* targets, std::size_t n);

  // The raw state, for summing over workers (e.g. MPI_Reduce with MPI_SUM of kStateSize doubles):
  // {count, sum |p - y|, sum (p - y)^2}.
  std::vector<double> state() const { return {count_, sum_abs_, sum_sq_}; }
  // Adds a state() from elsewhere. Throws strata::Error when n != kStateSize or the count is
  // negative, not an integer or not finite.
  void add_state(const double* state, std::size_t n);
  void merge(const RegressionMetrics& other);
  void clear();

  RegressionResult result() const;

 private:
  double count_ = 0, sum_abs_ = 0, sum_sq_ = 0;
};

}  // namespace strata::train
