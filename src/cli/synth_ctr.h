// `strata data synth-ctr`: click-through data in the Criteo layout drawn from a planted model, so
// that a trained model's AUC can be judged against the best any model can reach on the same rows
// (the oracle AUC: the AUC of the true logit).
//
// Layout (one row a line, tab-separated, as Criteo's public click logs): `label`, then `I1`..`I13`
// (non-negative integers), then `C1`..`C26` (8 lower-case hex digits), 40 columns; a missing value
// is an empty field. With the header option the first line names the columns.
//
// The planted model (constants in synth_ctr.cc), per row:
//   * each categorical field f draws an id in [0, vocab_f) from a Zipf law (P(k) ~ 1/(k+1)^zipf);
//     its written value is a per-field bijection of the id onto 32 bits, so distinct ids never
//     share a value;
//   * logit = bias + sum_f a_f * w_f(id) + sum over 6 field pairs (f, g) of c * <e_f(id_f), e_g(id_g)>
//             + sum_j b_j * x_j, where w and the 4-dimensional e are hidden per-(field, id) weights
//     (approximately standard normal, a pure function of seed, field and id), x_j are the standard
//     normal latent values behind the integer columns (I_j = floor(exp(1 + 1.2 x_j))), and some
//     fields and integers carry no signal at all (a_f = 0, b_j = 0);
//   * a missing field contributes nothing (its term is dropped from the logit);
//   * label ~ Bernoulli(sigmoid(logit)).
// The pairwise terms are products of embeddings (what a factorisation machine, DLRM's dot
// interaction or DCN's cross layer can represent and a linear model over single fields cannot).
//
// Days and churning ids (--days, --id-bits, --churn): ids without a vocabulary, as a CTR system
// sees them. The rows are split into `days` consecutive days, file k holding day k. With
// `id_bits` set, each field has `vocab_f` popularity ranks (the Zipf law is over ranks, as above),
// and rank k holds on day d the id of generation g = floor(d * churn + phase_k), phase_k uniform in
// [0, 1) per (field, rank): from one day to the next a rank changes generation with probability
// exactly `churn`, so a fraction `churn` of every field's population is replaced by fresh ids each
// day, at every popularity. The id of (field, rank, generation) is a keyed bijection of
// generation * vocab_f + rank onto [0, 2^id_bits) (distinct within a field, spread over the whole
// space), written as ceil(id_bits / 4) lower-case hex digits. The hidden weight and embedding of an
// id are seeded by (seed, field, id), so the oracle logit stays exact and a new id carries as much
// signal as an old one. Without `id_bits` the values are the 8-digit bijection of the rank (the
// bytes written before days existed, whatever `days`).
//
// Determinism: a row is a pure function of (seed, row index), from counter-based SplitMix64 streams
// (data/rng.h) and arithmetic limited to IEEE-exact +, -, *, / and exact scaling by 2^k (the exp
// and log used here are strata's own polynomials, never libm's), so the bytes written are the same
// on every platform and for any --files split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::cli {

constexpr int kCtrIntFields = 13;
constexpr int kCtrCatFields = 26;

struct SynthCtrOptions {
  std::uint64_t rows = 100000;                             // [1, kMaxRows]
  std::uint64_t seed = 1;                                  // any
  std::string out;                                         // FILE; a ".gz" suffix writes gzip
  int files = 1;                                           // [1, kMaxFiles], <= rows
  std::vector<std::uint64_t> vocab = std::vector<std::uint64_t>(kCtrCatFields, 10000);  // [1, kMaxVocab]
  double zipf = 1.05;                                      // [0, 10]
  double missing = 0.02;                                   // [0, 0.95]
  bool header = false;
  int id_bits = 0;                                         // 0 (8-digit values of the rank) or [16, 62]
  int days = 0;                                            // 0 (no days) or [1, kMaxDays], <= rows
  double churn = 0;                                        // [0, 1]; > 0 needs id_bits and days >= 2

  static constexpr std::uint64_t kMaxRows = 100'000'000;  // the oracle AUC keeps 25 bytes a row
  static constexpr int kMaxFiles = 10000;
  static constexpr std::uint64_t kMaxVocab = 10'000'000;  // the Zipf table keeps 8 bytes an id
  static constexpr int kMaxDays = 1000;
  // With days, the per-day counts keep 8 bytes per (field, rank): the vocabularies' sum is capped.
  static constexpr std::uint64_t kMaxDayVocabSum = 50'000'000;

  // Throws ConfigError (one line naming the flag and the value) when a field is out of range.
  // validate() checks the values, validate_output() that `out` names a file in an existing
  // directory.
  void validate() const;
  void validate_output() const;
};

// The flags' text; an empty string keeps the default.
struct SynthCtrFlagText {
  std::string rows, seed, out, files, vocab, zipf, missing, id_bits, days, churn;
  bool header = false;
};

// Parses the flags' text, then validates. --vocab is one number for every field or 26
// comma-separated numbers, one per field. With --days and no --files, files = days.
SynthCtrOptions parse_synth_ctr_options(const SynthCtrFlagText& text);

// One generated row, before formatting.
struct CtrRow {
  int label = 0;
  double logit = 0;
  std::int64_t ints[kCtrIntFields] = {};
  bool int_missing[kCtrIntFields] = {};
  std::uint64_t cats[kCtrCatFields] = {};  // the written value (the id, or the rank's 32-bit bijection)
  std::uint64_t cat_ids[kCtrCatFields] = {};  // the Zipf rank drawn, 0 most frequent
  std::uint32_t cat_gens[kCtrCatFields] = {};  // the rank's generation on the row's day (0 without churn)
  bool cat_missing[kCtrCatFields] = {};
  int day = 0;  // the row's day (0 without days)
};

// Generates rows of one planted model (the model's tables are built once, for the vocabularies and
// the Zipf exponent). Thread-safe after construction (row() is const and keeps no state).
class SynthCtrModel {
 public:
  explicit SynthCtrModel(const SynthCtrOptions& options);
  CtrRow row(std::uint64_t index) const;
  // Appends the row's text line (with '\n') to `line`.
  void format(const CtrRow& row, std::string* line) const;

  // The day of row `index`: day k holds rows [k * rows / days, (k + 1) * rows / days).
  int day_of(std::uint64_t index) const;
  // The generation of (field, rank) on `day`, and the value written for (field, rank, generation).
  // Requires field in [0, 26), rank < vocab of the field, day in [0, max(days, 1)).
  std::uint32_t generation(int field, std::uint64_t rank, int day) const;
  std::uint64_t value(int field, std::uint64_t rank, std::uint32_t generation) const;

 private:
  SynthCtrOptions options_;
  std::vector<std::vector<double>> cumulative_;  // per field: unnormalised Zipf CDF
};

// The files written: `out` itself when files == 1; otherwise out with "-NNNNN-of-MMMMM" inserted
// before the first '.' of its base name after its first character (train.tsv.gz ->
// train-00000-of-00004.tsv.gz).
std::vector<std::string> synth_ctr_file_names(const std::string& out, int files);

// Ids of one day (with days): per field, the distinct ids written that day and those of them never
// written on an earlier day. A missing field writes no id and counts nowhere.
struct SynthCtrDay {
  std::uint64_t rows = 0;
  std::vector<std::uint64_t> distinct, fresh;  // kCtrCatFields each
  double oracle_auc = 0;                       // of the day's rows (NaN when one class is absent)
};

struct SynthCtrSummary {
  std::uint64_t rows = 0, positives = 0;
  double oracle_auc = 0, oracle_log_loss = 0;
  std::vector<std::string> files;
  std::vector<SynthCtrDay> days;            // empty without days
  std::vector<std::uint64_t> distinct_ids;  // with days: per field, distinct ids over all days
  std::string json;  // one line, also written to out + ".json"
};

// Writes the files (row i of the whole set goes to file i * files / rows, in order) and
// out + ".json". Throws strata::Error naming the file when one cannot be written completely.
SynthCtrSummary write_synth_ctr(const SynthCtrOptions& options);

// exp and natural log from +, -, *, / and ldexp only, so they give the same bits on every
// platform (libm's need not). Relative error about 1e-16; exp underflows to 0 below -745 and
// overflows to +Inf above 709.78; det_log requires x > 0 and finite.
double det_exp(double x);
double det_log(double x);

}  // namespace strata::cli
