// The planted click model of `strata data synth-ctr` (contract in synth_ctr.h).
#include "cli/synth_ctr.h"

#include <sys/stat.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "data/rng.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"
#include "strata/train/metrics.h"

namespace strata::cli {
namespace {

using data::detail::derive_seed;
using data::detail::Rng;

// ---- the planted model's constants ---------------------------------------------------------
// Chosen so that at the defaults (vocab 10000, zipf 1.05, missing 0.02) about a quarter of the rows
// are clicks, as in Criteo's logs, and the oracle AUC is about 0.8: a model can do well, and how
// close it comes to the oracle is measurable. Fields 20..25 and integers 8..12 carry no signal.
constexpr double kBias = -1.55;
constexpr double kCatWeight[kCtrCatFields] = {0.27, 0.27, 0.27, 0.27, 0.27, 0.27, 0.27, 0.27, 0.12, 0.12,
                                              0.12, 0.12, 0.12, 0.12, 0.12, 0.12, 0.12, 0.12, 0.12, 0.12,
                                              0,    0,    0,    0,    0,    0};
constexpr double kIntWeight[kCtrIntFields] = {0.15, 0.15, 0.15, 0.15, 0.15, 0.15, 0.15, 0.15, 0, 0, 0, 0, 0};
// Field pairs whose embeddings interact, and the scale of each product (the dot product of two
// kEmbedDim vectors of unit-variance entries, divided by sqrt(kEmbedDim), has unit variance). The
// pairs are weighted to carry most of the signal, so a model without interactions falls well short
// of the oracle (docs/DATA.md, "Synthetic click data", has the simulated AUCs).
constexpr int kPairs[][2] = {{0, 1}, {2, 3}, {4, 5}, {8, 9}, {10, 11}, {12, 13}};
constexpr double kPairWeight = 0.5;
constexpr int kEmbedDim = 4;
// I_j = floor(exp(kIntOffset + kIntScale * x_j)): count-like, heavy-tailed, 0..174.
constexpr double kIntOffset = 1.0;
constexpr double kIntScale = 1.2;

// Stream tags (data/rng.h derive_seed): rows, hidden weights, value bijections, churn phases.
constexpr std::uint64_t kTagRow = 0x5c7c0001;
constexpr std::uint64_t kTagWeight = 0x5c7c0002;
constexpr std::uint64_t kTagValue = 0x5c7c0003;
constexpr std::uint64_t kTagPhase = 0x5c7c0004;

// Approximately standard normal from four uniforms (Irwin-Hall, scaled to unit variance): only
// +, -, *, so the same bits everywhere, and bounded (|x| <= 2 sqrt 3).
double normalish(Rng& rng) {
  const double s = rng.uniform() + rng.uniform() + rng.uniform() + rng.uniform();
  return (s - 2.0) * 1.7320508075688772;
}

// A bijection of 32-bit ids keyed per field (xor with a key, then odd multiplications and
// xor-shifts, each invertible): distinct ids of a field get distinct written values.
std::uint32_t permute32(std::uint32_t x, std::uint32_t key) {
  x ^= key;
  x *= 0x9E3779B1u;
  x ^= x >> 15;
  x *= 0x85EBCA77u;
  x ^= x >> 13;
  x *= 0xC2B2AE3Du;
  x ^= x >> 16;
  return x;
}

// A bijection of [0, 2^bits) keyed per field: xor with the key, then odd multiplications and
// xor-shifts, each invertible modulo 2^bits (a right shift keeps the value below 2^bits).
std::uint64_t permute_bits(std::uint64_t x, std::uint64_t key, int bits) {
  const std::uint64_t mask = bits == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
  const int half = bits / 2, third = (bits + 2) / 3;
  x = (x ^ key) & mask;
  x = (x * 0x9E3779B97F4A7C15ULL) & mask;
  x ^= x >> half;
  x = (x * 0xBF58476D1CE4E5B9ULL) & mask;
  x ^= x >> third;
  x = (x * 0x94D049BB133111EBULL) & mask;
  x ^= x >> half;
  return x;
}

// Generations a rank can reach over `days` days: g = floor(d * churn + phase) with phase < 1 and
// d <= days - 1.
std::uint64_t generations(int days, double churn) {
  if (churn <= 0 || days <= 1) return 1;
  return static_cast<std::uint64_t>(std::floor(static_cast<double>(days - 1) * churn)) + 2;
}

double sigmoid(double x) { return 1.0 / (1.0 + det_exp(-x)); }

std::string text_of(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// ---- output ---------------------------------------------------------------------------------

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One output file, plain or gzip by its name. Buffers about 1 MiB; every failure (open, short
// write, close: a full disk shows at any of them) throws Error naming the file.
class Sink {
 public:
  explicit Sink(std::string path) : path_(std::move(path)), gzip_(ends_with(path_, ".gz")) {
    if (gzip_) {
      gz_ = gzopen(path_.c_str(), "wb6");
      if (gz_ == nullptr) fail(std::strerror(errno));
    } else {
      file_ = std::fopen(path_.c_str(), "wb");
      if (file_ == nullptr) fail(std::strerror(errno));
    }
    buffer_.reserve(kFlushBytes + 4096);
  }
  Sink(const Sink&) = delete;
  Sink& operator=(const Sink&) = delete;
  ~Sink() {
    if (gz_ != nullptr) gzclose(gz_);
    if (file_ != nullptr) std::fclose(file_);
  }

  std::string& buffer() { return buffer_; }
  void maybe_flush() {
    if (buffer_.size() >= kFlushBytes) flush();
  }
  void close() {
    flush();
    if (gzip_) {
      const int rc = gzclose(gz_);
      gz_ = nullptr;
      if (rc != Z_OK) fail("gzclose failed (zlib status " + std::to_string(rc) + ")");
    } else {
      const int rc = std::fclose(file_);
      file_ = nullptr;
      if (rc != 0) fail(std::strerror(errno));
    }
  }

 private:
  static constexpr std::size_t kFlushBytes = std::size_t{1} << 20;

  void flush() {
    if (buffer_.empty()) return;
    if (gzip_) {
      const int wrote = gzwrite(gz_, buffer_.data(), static_cast<unsigned>(buffer_.size()));
      if (wrote <= 0 || static_cast<std::size_t>(wrote) != buffer_.size()) {
        int code = 0;
        const char* message = gzerror(gz_, &code);
        fail(std::string("gzwrite failed: ") + (message ? message : "?"));
      }
    } else if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
      fail(std::strerror(errno));
    }
    buffer_.clear();
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error("data synth-ctr: cannot write '" + path_ + "': " + why);
  }

  std::string path_;
  bool gzip_;
  gzFile gz_ = nullptr;
  std::FILE* file_ = nullptr;
  std::string buffer_;
};

void append_uint(std::uint64_t v, std::string* out) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) out->push_back(digits[--n]);
}

// `digits` lower-case hex digits of v, most significant first (zero-padded, as Criteo's values).
void append_hex(std::uint64_t v, int digits, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) out->push_back(kHex[(v >> shift) & 0xF]);
}

}  // namespace

// ---- exact-everywhere exp and log -------------------------------------------------------------

// ln 2 split so that n * kLn2Hi is exact for |n| < 2^20 (kLn2Hi has 32 trailing zero bits).
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;

double det_exp(double x) {
  if (std::isnan(x)) return x;
  if (x > 709.78) return std::numeric_limits<double>::infinity();
  if (x < -745.2) return 0.0;
  // x = n ln2 + r, |r| <= ln2/2; e^r by its Taylor series to r^13 (remainder below 1e-17).
  const double n = std::floor(x * 1.4426950408889634 + 0.5);
  const double r = (x - n * kLn2Hi) - n * kLn2Lo;
  double p = 1.0;
  for (int k = 13; k >= 1; --k) p = 1.0 + p * r / static_cast<double>(k);
  return std::ldexp(p, static_cast<int>(n));
}

double det_log(double x) {
  int e = 0;
  double m = std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1)
  if (m < 0.70710678118654752) {
    m *= 2.0;
    e -= 1;
  }
  // log m = 2 atanh(s), s = (m - 1)/(m + 1), |s| <= 0.1716: the odd series to s^23.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double t = 1.0 / 23.0;
  for (int k = 21; k >= 1; k -= 2) t = t * s2 + 1.0 / static_cast<double>(k);
  const double de = static_cast<double>(e);
  return de * kLn2Hi + (de * kLn2Lo + 2.0 * s * t);
}

// ---- options --------------------------------------------------------------------------------

void SynthCtrOptions::validate() const {
  if (rows < 1 || rows > kMaxRows)
    throw ConfigError("--rows: " + std::to_string(rows) + " is out of range [1, " + std::to_string(kMaxRows) + "]");
  if (files < 1 || files > kMaxFiles)
    throw ConfigError("--files: " + std::to_string(files) + " is out of range [1, " + std::to_string(kMaxFiles) +
                      "]");
  if (days < 0 || days > kMaxDays)
    throw ConfigError("--days: " + std::to_string(days) + " is out of range [1, " + std::to_string(kMaxDays) + "]");
  if (static_cast<std::uint64_t>(days) > rows)
    throw ConfigError("--days: " + std::to_string(days) + " days for " + std::to_string(rows) +
                      " rows (every day needs a row)");
  if (static_cast<std::uint64_t>(files) > rows)
    throw ConfigError("--files: " + std::to_string(files) + " files for " + std::to_string(rows) +
                      " rows (every file needs a row)");
  if (vocab.size() != static_cast<std::size_t>(kCtrCatFields))
    throw ConfigError("--vocab: " + std::to_string(vocab.size()) + " sizes given, expected 1 or 26");
  for (std::size_t f = 0; f < vocab.size(); ++f)
    if (vocab[f] < 1 || vocab[f] > kMaxVocab)
      throw ConfigError("--vocab: C" + std::to_string(f + 1) + " size " + std::to_string(vocab[f]) +
                        " is out of range [1, " + std::to_string(kMaxVocab) + "]");
  if (!(zipf >= 0.0 && zipf <= 10.0)) throw ConfigError("--zipf: " + text_of(zipf) + " is out of range [0, 10]");
  if (!(missing >= 0.0 && missing <= 0.95))
    throw ConfigError("--missing: " + text_of(missing) + " is out of range [0, 0.95]");
  if (id_bits != 0 && (id_bits < 16 || id_bits > 62))
    throw ConfigError("--id-bits: " + std::to_string(id_bits) +
                      " is out of range [16, 62] (0: 8-digit values of the popularity rank)");
  if (days > 0 && files != days)
    throw ConfigError("--files: " + std::to_string(files) + " files for " + std::to_string(days) +
                      " days (file k holds day k: leave --files out or give --days)");
  if (!(churn >= 0.0 && churn <= 1.0)) throw ConfigError("--churn: " + text_of(churn) + " is out of range [0, 1]");
  if (churn > 0 && days < 2)
    throw ConfigError("--churn: " + text_of(churn) + " needs --days of at least 2 (ids are replaced from day to day)");
  if (churn > 0 && id_bits == 0)
    throw ConfigError("--churn: " + text_of(churn) + " needs --id-bits (the id space of the fresh ids, e.g. 40)");
  if (days > 0) {
    std::uint64_t sum = 0;
    for (std::uint64_t v : vocab) sum += v;
    if (sum > kMaxDayVocabSum)
      throw ConfigError("--vocab: the 26 sizes add up to " + std::to_string(sum) + ", over " +
                        std::to_string(kMaxDayVocabSum) + " with --days (the per-day id counts keep 8 bytes a rank)");
  }
  if (id_bits != 0) {
    // Every (rank, generation) of a field needs its own id: generation * vocab + rank < 2^id_bits.
    const std::uint64_t gens = generations(days, churn);
    const std::uint64_t space = std::uint64_t{1} << id_bits;
    for (std::size_t f = 0; f < vocab.size(); ++f)
      if (vocab[f] > space / gens)
        throw ConfigError("--id-bits: " + std::to_string(id_bits) + " bits hold " + std::to_string(space) +
                          " ids, fewer than C" + std::to_string(f + 1) + "'s " + std::to_string(vocab[f]) +
                          " ranks x " + std::to_string(gens) + " generations (--days x --churn)");
  }
}

void SynthCtrOptions::validate_output() const {
  if (out.empty()) throw ConfigError("--out: an output file name is required");
  // The directory must exist: a typo there is a usage error, found before any work.
  const auto slash = out.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : out.substr(0, slash));
  struct stat st {};
  if (slash + 1 == out.size() && slash != std::string::npos)
    throw ConfigError("--out: '" + out + "' names a directory, not a file");
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw ConfigError("--out: directory '" + dir + "' of '" + out + "' does not exist");
  if (::stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw ConfigError("--out: '" + out + "' is a directory");
}

SynthCtrOptions parse_synth_ctr_options(const SynthCtrFlagText& text) {
  const std::string& vocab = text.vocab;
  SynthCtrOptions o;
  if (!text.rows.empty()) o.rows = parse_uint64(text.rows, "--rows");
  if (!text.seed.empty()) o.seed = parse_uint64(text.seed, "--seed");
  o.out = text.out;
  if (!text.files.empty()) o.files = parse_int(text.files, "--files", 1, SynthCtrOptions::kMaxFiles);
  if (!text.days.empty()) {
    o.days = parse_int(text.days, "--days", 1, SynthCtrOptions::kMaxDays);
    if (text.files.empty()) o.files = o.days;
  }
  if (!text.id_bits.empty()) o.id_bits = parse_int(text.id_bits, "--id-bits", 16, 62);
  if (!text.churn.empty()) o.churn = parse_double(text.churn, "--churn");
  if (!vocab.empty()) {
    const std::vector<std::string> parts = split(vocab, ',');
    if (parts.size() != 1 && parts.size() != static_cast<std::size_t>(kCtrCatFields))
      throw ConfigError("--vocab: '" + vocab + "' has " + std::to_string(parts.size()) +
                        " sizes, expected 1 (every field) or 26 (C1..C26)");
    o.vocab.clear();
    for (const std::string& p : parts) o.vocab.push_back(parse_uint64(p, "--vocab"));
    if (o.vocab.size() == 1) o.vocab.assign(kCtrCatFields, o.vocab[0]);
  }
  if (!text.zipf.empty()) o.zipf = parse_double(text.zipf, "--zipf");
  if (!text.missing.empty()) o.missing = parse_double(text.missing, "--missing");
  o.header = text.header;
  o.validate();
  o.validate_output();
  return o;
}

// ---- the model ------------------------------------------------------------------------------

SynthCtrModel::SynthCtrModel(const SynthCtrOptions& options) : options_(options) {
  options_.validate();
  // One unnormalised CDF for the largest vocabulary: the weights do not depend on the size, so a
  // field with a smaller vocabulary samples from a prefix of the same table.
  const std::uint64_t largest = *std::max_element(options_.vocab.begin(), options_.vocab.end());
  std::vector<double> cdf(static_cast<std::size_t>(largest));
  double sum = 0;
  for (std::uint64_t k = 0; k < largest; ++k) {
    sum += det_exp(-options_.zipf * det_log(static_cast<double>(k + 1)));
    cdf[static_cast<std::size_t>(k)] = sum;
  }
  cumulative_.push_back(std::move(cdf));
}

int SynthCtrModel::day_of(std::uint64_t index) const {
  if (options_.days <= 1) return 0;
  // Day k starts at floor(k * rows / days): the largest k with k * rows <= (index + 1) * days - 1.
  const auto days = static_cast<std::uint64_t>(options_.days);
  return static_cast<int>(((index + 1) * days - 1) / options_.rows);
}

std::uint32_t SynthCtrModel::generation(int field, std::uint64_t rank, int day) const {
  if (options_.churn <= 0 || day <= 0) return 0;
  Rng phase(derive_seed(options_.seed, kTagPhase, static_cast<std::uint64_t>(field), rank));
  return static_cast<std::uint32_t>(std::floor(static_cast<double>(day) * options_.churn + phase.uniform()));
}

std::uint64_t SynthCtrModel::value(int field, std::uint64_t rank, std::uint32_t generation) const {
  const std::uint64_t key = derive_seed(options_.seed, kTagValue, static_cast<std::uint64_t>(field));
  if (options_.id_bits == 0) return permute32(static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(key));
  const std::uint64_t slot = generation * options_.vocab[static_cast<std::size_t>(field)] + rank;
  return permute_bits(slot, key, options_.id_bits);
}

CtrRow SynthCtrModel::row(std::uint64_t index) const {
  CtrRow r;
  r.day = day_of(index);
  Rng rng(derive_seed(options_.seed, kTagRow, index));
  const std::vector<double>& cdf = cumulative_[0];
  // Draw everything first, in a fixed order and count, whatever is missing.
  for (int f = 0; f < kCtrCatFields; ++f) {
    const auto v = static_cast<std::size_t>(options_.vocab[static_cast<std::size_t>(f)]);
    const double u = rng.uniform() * cdf[v - 1];
    const auto it = std::upper_bound(cdf.begin(), cdf.begin() + static_cast<std::ptrdiff_t>(v), u);
    r.cat_ids[f] = std::min<std::uint64_t>(static_cast<std::uint64_t>(it - cdf.begin()), v - 1);
    r.cat_missing[f] = rng.uniform() < options_.missing;
  }
  double latent[kCtrIntFields];
  for (int j = 0; j < kCtrIntFields; ++j) {
    latent[j] = normalish(rng);
    r.int_missing[j] = rng.uniform() < options_.missing;
    r.ints[j] = static_cast<std::int64_t>(std::floor(det_exp(kIntOffset + kIntScale * latent[j])));
  }
  const double u_label = rng.uniform();

  // Hidden per-(field, id) weight and embedding: a pure function of seed, field and id (the rank
  // without --id-bits, where rank and id are one).
  double weight[kCtrCatFields];
  double embed[kCtrCatFields][kEmbedDim];
  for (int f = 0; f < kCtrCatFields; ++f) {
    r.cat_gens[f] = generation(f, r.cat_ids[f], r.day);
    r.cats[f] = value(f, r.cat_ids[f], r.cat_gens[f]);
    const std::uint64_t id = options_.id_bits == 0 ? r.cat_ids[f] : r.cats[f];
    Rng w(derive_seed(options_.seed, kTagWeight, static_cast<std::uint64_t>(f), id));
    weight[f] = normalish(w);
    for (double& e : embed[f]) e = normalish(w);
  }

  double logit = kBias;
  for (int f = 0; f < kCtrCatFields; ++f)
    if (!r.cat_missing[f]) logit += kCatWeight[f] * weight[f];
  for (const auto& pair : kPairs) {
    const int a = pair[0], b = pair[1];
    if (r.cat_missing[a] || r.cat_missing[b]) continue;
    double dot = 0;
    for (int d = 0; d < kEmbedDim; ++d) dot += embed[a][d] * embed[b][d];
    logit += kPairWeight * (dot * 0.5);  // 0.5 = 1 / sqrt(kEmbedDim)
  }
  for (int j = 0; j < kCtrIntFields; ++j)
    if (!r.int_missing[j]) logit += kIntWeight[j] * latent[j];
  r.logit = logit;
  r.label = u_label < sigmoid(logit) ? 1 : 0;
  return r;
}

void SynthCtrModel::format(const CtrRow& row, std::string* line) const {
  const int digits = options_.id_bits == 0 ? 8 : (options_.id_bits + 3) / 4;
  line->push_back(row.label ? '1' : '0');
  for (int j = 0; j < kCtrIntFields; ++j) {
    line->push_back('\t');
    if (!row.int_missing[j]) append_uint(static_cast<std::uint64_t>(row.ints[j]), line);
  }
  for (int f = 0; f < kCtrCatFields; ++f) {
    line->push_back('\t');
    if (!row.cat_missing[f]) append_hex(row.cats[f], digits, line);
  }
  line->push_back('\n');
}

std::vector<std::string> synth_ctr_file_names(const std::string& out, int files) {
  if (files <= 1) return {out};
  const auto slash = out.find_last_of('/');
  const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  const auto dot = out.find('.', base + 1);  // a leading dot (.hidden) belongs to the stem
  const std::string stem = dot == std::string::npos ? out : out.substr(0, dot);
  const std::string ext = dot == std::string::npos ? "" : out.substr(dot);
  std::vector<std::string> names;
  char part[48];
  for (int i = 0; i < files; ++i) {
    std::snprintf(part, sizeof part, "-%05d-of-%05d", i, files);
    names.push_back(stem + part + ext);
  }
  return names;
}

SynthCtrSummary write_synth_ctr(const SynthCtrOptions& options) {
  options.validate_output();
  const SynthCtrModel model(options);
  SynthCtrSummary summary;
  summary.rows = options.rows;
  summary.files = synth_ctr_file_names(options.out, options.files);

  // With days: per (field, rank) the last day it was written and its generation then. Generations
  // only grow with the day, so (rank, generation) was written before iff the last one written
  // for the rank had that generation.
  const bool by_day = options.days > 0;
  std::vector<std::vector<std::int32_t>> last_day, last_gen;
  if (by_day) {
    for (std::uint64_t v : options.vocab) {
      last_day.emplace_back(static_cast<std::size_t>(v), -1);
      last_gen.emplace_back(static_cast<std::size_t>(v), -1);
    }
    summary.days.resize(static_cast<std::size_t>(options.days));
    for (SynthCtrDay& d : summary.days) {
      d.distinct.assign(kCtrCatFields, 0);
      d.fresh.assign(kCtrCatFields, 0);
    }
    summary.distinct_ids.assign(kCtrCatFields, 0);
  }

  std::vector<double> logits(static_cast<std::size_t>(options.rows));
  std::vector<std::uint8_t> labels(static_cast<std::size_t>(options.rows));
  double log_loss_sum = 0;
  std::uint64_t next = 0;
  const auto count = static_cast<std::uint64_t>(options.files);
  for (std::uint64_t i = 0; i < count; ++i) {
    // File i holds rows [i*rows/files, (i+1)*rows/files): contiguous, sizes differing by at most 1.
    const std::uint64_t end = (i + 1) * options.rows / count;
    Sink sink(summary.files[static_cast<std::size_t>(i)]);
    if (options.header) {
      std::string& b = sink.buffer();
      b += "label";
      for (int j = 1; j <= kCtrIntFields; ++j) b += "\tI" + std::to_string(j);
      for (int f = 1; f <= kCtrCatFields; ++f) b += "\tC" + std::to_string(f);
      b += '\n';
    }
    for (; next < end; ++next) {
      const CtrRow r = model.row(next);
      model.format(r, &sink.buffer());
      if (by_day) {
        SynthCtrDay& day = summary.days[static_cast<std::size_t>(r.day)];
        ++day.rows;
        for (int f = 0; f < kCtrCatFields; ++f) {
          if (r.cat_missing[f]) continue;
          const auto k = static_cast<std::size_t>(r.cat_ids[f]);
          std::int32_t& seen_day = last_day[static_cast<std::size_t>(f)][k];
          std::int32_t& seen_gen = last_gen[static_cast<std::size_t>(f)][k];
          if (seen_day == r.day) continue;
          ++day.distinct[static_cast<std::size_t>(f)];
          if (seen_gen != static_cast<std::int32_t>(r.cat_gens[f])) {
            ++day.fresh[static_cast<std::size_t>(f)];
            ++summary.distinct_ids[static_cast<std::size_t>(f)];
          }
          seen_day = r.day;
          seen_gen = static_cast<std::int32_t>(r.cat_gens[f]);
        }
      }
      sink.maybe_flush();
      logits[static_cast<std::size_t>(next)] = r.logit;
      labels[static_cast<std::size_t>(next)] = static_cast<std::uint8_t>(r.label);
      summary.positives += static_cast<std::uint64_t>(r.label);
      // -log sigmoid(l) = log(1 + e^-l); -log(1 - sigmoid(l)) = log(1 + e^l).
      log_loss_sum += det_log(1.0 + det_exp(r.label ? -r.logit : r.logit));
    }
    sink.close();
  }
  summary.oracle_auc = train::exact_auc(logits.data(), labels.data(), labels.size());
  summary.oracle_log_loss = log_loss_sum / static_cast<double>(options.rows);
  // Day k is rows [k * rows / days, (k + 1) * rows / days), as its file.
  for (std::size_t k = 0; k < summary.days.size(); ++k) {
    const std::size_t begin = static_cast<std::size_t>(k * options.rows / static_cast<std::uint64_t>(options.days));
    summary.days[k].oracle_auc = train::exact_auc(logits.data() + begin, labels.data() + begin,
                                                  static_cast<std::size_t>(summary.days[k].rows));
  }

  nlohmann::json doc;
  doc["rows"] = summary.rows;
  doc["positives"] = summary.positives;
  doc["positive_rate"] = static_cast<double>(summary.positives) / static_cast<double>(summary.rows);
  // NaN (one class absent, possible for tiny --rows) is not JSON: null.
  if (std::isnan(summary.oracle_auc))
    doc["oracle_auc"] = nullptr;
  else
    doc["oracle_auc"] = summary.oracle_auc;
  doc["oracle_log_loss"] = summary.oracle_log_loss;
  doc["layout"] = "criteo";
  doc["columns"] = 1 + kCtrIntFields + kCtrCatFields;
  doc["header"] = options.header;
  doc["seed"] = options.seed;
  const bool same_vocab = std::all_of(options.vocab.begin(), options.vocab.end(),
                                      [&](std::uint64_t v) { return v == options.vocab[0]; });
  if (same_vocab)
    doc["vocab"] = options.vocab[0];
  else
    doc["vocab"] = options.vocab;
  doc["zipf"] = options.zipf;
  doc["missing"] = options.missing;
  if (options.id_bits != 0) {
    doc["id_bits"] = options.id_bits;
    doc["id_hex_digits"] = (options.id_bits + 3) / 4;
  }
  if (by_day) {
    doc["days"] = options.days;
    doc["churn"] = options.churn;
    doc["distinct_ids"] = summary.distinct_ids;
    std::uint64_t all = 0;
    for (std::uint64_t n : summary.distinct_ids) all += n;
    doc["distinct_ids_all_fields"] = all;
    nlohmann::json per_day = nlohmann::json::array();
    for (std::size_t k = 0; k < summary.days.size(); ++k) {
      const SynthCtrDay& d = summary.days[k];
      std::uint64_t distinct = 0, fresh = 0;
      for (int f = 0; f < kCtrCatFields; ++f) {
        distinct += d.distinct[static_cast<std::size_t>(f)];
        fresh += d.fresh[static_cast<std::size_t>(f)];
      }
      per_day.push_back({{"day", k},
                         {"file", summary.files[k]},
                         {"rows", d.rows},
                         {"oracle_auc", std::isnan(d.oracle_auc) ? nlohmann::json(nullptr) : nlohmann::json(d.oracle_auc)},
                         {"distinct", distinct},
                         {"new", fresh},
                         {"distinct_per_field", d.distinct},
                         {"new_per_field", d.fresh}});
    }
    doc["per_day"] = per_day;
  }
  doc["files"] = summary.files;
  summary.json = doc.dump();

  Sink json(options.out + ".json");
  json.buffer() = summary.json + "\n";
  json.close();
  return summary;
}

}  // namespace strata::cli
