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

  static constexpr std::uint64_t kMaxRows = 100'000'000;  // the oracle AUC keeps 25 bytes a row
  static constexpr int kMaxFiles = 10000;
  static constexpr std::uint64_t kMaxVocab = 10'000'000;  // the Zipf table keeps 8 bytes an id

  // Throws ConfigError (one line naming the flag and the value) when a field is out of range.
  // validate() checks the values, validate_output() that `out` names a file in an existing
  // directory.
  void validate() const;
  void validate_output() const;
};

// Parses the flags' text (empty text keeps the default), then validates. --vocab is one number
// for every field or 26 comma-separated numbers, one per field.
SynthCtrOptions parse_synth_ctr_options(const std::string& rows, const std::string& seed, const std::string& out,
                                        const std::string& files, const std::string& vocab, const std::string& zipf,
                                        const std::string& missing, bool header);

// One generated row, before formatting.
struct CtrRow {
  int label = 0;
  double logit = 0;
  std::int64_t ints[kCtrIntFields] = {};
  bool int_missing[kCtrIntFields] = {};
  std::uint32_t cats[kCtrCatFields] = {};  // the written value (the bijection of the id)
  std::uint64_t cat_ids[kCtrCatFields] = {};  // the Zipf rank drawn, 0 most frequent
  bool cat_missing[kCtrCatFields] = {};
};

// Generates rows of one planted model (the model's tables are built once, for the vocabularies and
// the Zipf exponent). Thread-safe after construction (row() is const and keeps no state).
class SynthCtrModel {
 public:
  explicit SynthCtrModel(const SynthCtrOptions& options);
  CtrRow row(std::uint64_t index) const;
  // Appends the row's text line (with '\n') to `line`.
  static void format(const CtrRow& row, std::string* line);

 private:
  SynthCtrOptions options_;
  std::vector<std::vector<double>> cumulative_;  // per field: unnormalised Zipf CDF
};

// The files written: `out` itself when files == 1; otherwise out with "-NNNNN-of-MMMMM" inserted
// before the first '.' of its base name after its first character (train.tsv.gz ->
// train-00000-of-00004.tsv.gz).
std::vector<std::string> synth_ctr_file_names(const std::string& out, int files);

struct SynthCtrSummary {
  std::uint64_t rows = 0, positives = 0;
  double oracle_auc = 0, oracle_log_loss = 0;
  std::vector<std::string> files;
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
