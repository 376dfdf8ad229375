// Metrics accumulators (contract in include/strata/train/metrics.h).
//
// Exact AUC by one sort: walk the (score, label) pairs in ascending score order, one group of
// equal scores at a time. A group with p positives and q negatives, above `below` negatives with
// strictly lower scores, contributes p*below pairs won by the positive and p*q tied pairs (one half
// each). 2U is kept as an exact 128-bit integer, so the only rounding is the final division.
#include "strata/train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "strata/common/error.h"

namespace strata::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using Pair = std::pair<double, std::uint8_t>;

std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", x);
  return text;
}

// Fills `pairs` with the non-NaN pairs in ascending order; returns false if a score was NaN.
bool sorted_pairs(const double* scores, const std::uint8_t* labels, std::size_t n, std::vector<Pair>* pairs) {
  pairs->clear();
  pairs->reserve(n);
  bool any_nan = false;
  for (std::size_t i = 0; i < n; ++i) {
    if (labels[i] > 1)
      throw Error("metrics: label " + std::to_string(labels[i]) + " of example " + std::to_string(i) +
                  " is not 0 or 1");
    if (std::isnan(scores[i]))
      any_nan = true;
    else
      pairs->emplace_back(scores[i], labels[i]);
  }
  // Lexicographic on (score, label): equal elements are equal values, so the order of the result
  // (and every sum taken over it) does not depend on the input order.
  std::sort(pairs->begin(), pairs->end());
  return !any_nan;
}

double auc_of_sorted(const std::vector<Pair>& pairs) {
  unsigned __int128 twice_u = 0;
  std::uint64_t below = 0, positives = 0;
  for (std::size_t begin = 0; begin < pairs.size();) {
    std::size_t end = begin;
    std::uint64_t p = 0, q = 0;
    while (end < pairs.size() && pairs[end].first == pairs[begin].first) {
      (pairs[end].second ? p : q) += 1;
      ++end;
    }
    twice_u += static_cast<unsigned __int128>(p) * (2 * static_cast<unsigned __int128>(below) + q);
    below += q;
    positives += p;
    begin = end;
  }
  const std::uint64_t negatives = below;
  if (positives == 0 || negatives == 0) return kNaN;
  return static_cast<double>(twice_u) / 2.0 / static_cast<double>(positives) / static_cast<double>(negatives);
}

template <typename T>
void check_binary_batch(const T* probabilities, const T* labels, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double p = static_cast<double>(probabilities[i]);
    const double y = static_cast<double>(labels[i]);
    if (!(p >= 0.0 && p <= 1.0) && !std::isnan(p))
      throw Error("metrics: probability " + number(p) + " of example " + std::to_string(i) +
                  " is outside [0, 1]");
    if (y != 0.0 && y != 1.0)
      throw Error("metrics: label " + number(y) + " of example " + std::to_string(i) + " is not 0 or 1");
  }
}

}  // namespace

double exact_auc(const double* scores, const std::uint8_t* labels, std::size_t n) {
  if (n == 0) return kNaN;
  STRATA_CHECK(scores != nullptr && labels != nullptr, "exact_auc: null scores or labels with n = ", n);
  std::vector<Pair> pairs;
  if (!sorted_pairs(scores, labels, n, &pairs)) return kNaN;
  return auc_of_sorted(pairs);
}

// ---- BinaryClassificationMetrics --------------------------------------------------------------

BinaryClassificationMetrics::BinaryClassificationMetrics(double threshold) : threshold_(threshold) {
  if (!(threshold >= 0.0 && threshold <= 1.0))
    throw ConfigError("metrics: threshold " + number(threshold) + " is outside [0, 1]");
}

template <typename T>
static void append_binary(std::vector<double>& scores, std::vector<std::uint8_t>& labels, const T* probabilities,
                          const T* labels_in, std::size_t n) {
  if (n == 0) return;
  STRATA_CHECK(probabilities != nullptr && labels_in != nullptr, "metrics: null probabilities or labels with n = ", n);
  check_binary_batch(probabilities, labels_in, n);
  for (std::size_t i = 0; i < n; ++i) {
    scores.push_back(static_cast<double>(probabilities[i]));
    labels.push_back(labels_in[i] == T(1) ? 1 : 0);
  }
}

void BinaryClassificationMetrics::add(const float* probabilities, const float* labels, std::size_t n) {
  append_binary(scores_, labels_, probabilities, labels, n);
}

void BinaryClassificationMetrics::add(const double* probabilities, const double* labels, std::size_t n) {
  append_binary(scores_, labels_, probabilities, labels, n);
}

void BinaryClassificationMetrics::add_state(const double* scores, const std::uint8_t* labels, std::size_t n) {
  if (n == 0) return;
  STRATA_CHECK(scores != nullptr && labels != nullptr, "metrics: null state with n = ", n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!(scores[i] >= 0.0 && scores[i] <= 1.0) && !std::isnan(scores[i]))
      throw Error("metrics: gathered probability " + number(scores[i]) + " of example " + std::to_string(i) +
                  " is outside [0, 1]");
    if (labels[i] > 1)
      throw Error("metrics: gathered label " + std::to_string(labels[i]) + " of example " + std::to_string(i) +
                  " is not 0 or 1");
  }
  scores_.insert(scores_.end(), scores, scores + n);
  labels_.insert(labels_.end(), labels, labels + n);
}

void BinaryClassificationMetrics::merge(const BinaryClassificationMetrics& other) {
  if (&other == this) {
    // Self-merge doubles every example; copy first, insert() from its own range is undefined.
    const BinaryClassificationMetrics copy = other;
    merge(copy);
    return;
  }
  add_state(other.scores_.data(), other.labels_.data(), other.scores_.size());
}

void BinaryClassificationMetrics::clear() {
  scores_.clear();
  labels_.clear();
}

BinaryClassificationResult BinaryClassificationMetrics::result() const {
  BinaryClassificationResult r;
  const std::size_t n = scores_.size();
  r.count = static_cast<std::int64_t>(n);
  if (n == 0) {
    r.accuracy = r.auc = r.log_loss = r.precision = r.recall = kNaN;
    return r;
  }
  std::int64_t tp = 0, fp = 0, fn = 0, correct = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool predicted = scores_[i] > threshold_;  // NaN: predicted negative, as in Keras
    const bool actual = labels_[i] != 0;
    tp += predicted && actual;
    fp += predicted && !actual;
    fn += !predicted && actual;
    correct += predicted == actual;
    r.positives += actual;
  }
  r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  r.precision = tp + fp > 0 ? static_cast<double>(tp) / static_cast<double>(tp + fp) : 0.0;
  r.recall = tp + fn > 0 ? static_cast<double>(tp) / static_cast<double>(tp + fn) : 0.0;

  std::vector<Pair> pairs;
  if (!sorted_pairs(scores_.data(), labels_.data(), n, &pairs)) {
    r.auc = r.log_loss = kNaN;
    return r;
  }
  r.auc = auc_of_sorted(pairs);
  // Keras' binary_crossentropy on probabilities: clip to [eps, 1 - eps], then log(p + eps) and
  // log(1 - p + eps). Summed in sorted order, so the sum is independent of the order of arrival.
  double sum = 0;
  for (const Pair& pr : pairs) {
    const double p = std::min(std::max(pr.first, kEpsilon), 1.0 - kEpsilon);
    sum -= pr.second ? std::log(p + kEpsilon) : std::log(1.0 - p + kEpsilon);
  }
  r.log_loss = sum / static_cast<double>(n);
  return r;
}

// ---- RegressionMetrics ----------------------------------------------------------------------

template <typename T>
static void add_regression(double& count, double& sum_abs, double& sum_sq, const T* predictions, const T* targets,
                           std::size_t n) {
  if (n == 0) return;
  STRATA_CHECK(predictions != nullptr && targets != nullptr, "metrics: null predictions or targets with n = ", n);
  for (std::size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(predictions[i]) - static_cast<double>(targets[i]);
    sum_abs += std::abs(e);
    sum_sq += e * e;
  }
  count += static_cast<double>(n);
}

void RegressionMetrics::add(const float* predictions, const float* targets, std::size_t n) {
  add_regression(count_, sum_abs_, sum_sq_, predictions, targets, n);
}

void RegressionMetrics::add(const double* predictions, const double* targets, std::size_t n) {
  add_regression(count_, sum_abs_, sum_sq_, predictions, targets, n);
}

void RegressionMetrics::add_state(const double* state, std::size_t n) {
  if (n != kStateSize || state == nullptr)
    throw Error("metrics: a regression state has " + std::to_string(kStateSize) + " numbers, got " +
                std::to_string(n));
  const double count = state[0];
  if (!(count >= 0.0) || !std::isfinite(count) || count != std::floor(count))
    throw Error("metrics: gathered regression count " + number(count) + " is not a non-negative integer");
  count_ += count;
  sum_abs_ += state[1];
  sum_sq_ += state[2];
}

void RegressionMetrics::merge(const RegressionMetrics& other) {
  const std::vector<double> s = other.state();
  add_state(s.data(), s.size());
}

void RegressionMetrics::clear() { count_ = sum_abs_ = sum_sq_ = 0; }

RegressionResult RegressionMetrics::result() const {
  RegressionResult r;
  r.count = static_cast<std::int64_t>(count_);
  r.mean_absolute_error = count_ > 0 ? sum_abs_ / count_ : kNaN;
  r.mean_squared_error = count_ > 0 ? sum_sq_ / count_ : kNaN;
  return r;
}

}  // namespace strata::train
