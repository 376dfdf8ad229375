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
// kEmbedDim vectors of unit-variance entries, divided by sqrt(kEmbedDim), has unit variance). In a
// simulation of these constants the pairs carry most of the signal: the oracle AUC is about 0.82,
// and the true logit without its pair terms ranks the rows at about 0.71.
constexpr int kPairs[][2] = {{0, 1}, {2, 3}, {4, 5}, {8, 9}, {10, 11}, {12, 13}};
constexpr double kPairWeight = 0.5;
constexpr int kEmbedDim = 4;
// I_j = floor(exp(kIntOffset + kIntScale * x_j)): count-like, heavy-tailed, 0..174.
constexpr double kIntOffset = 1.0;
constexpr double kIntScale = 1.2;

// Stream tags (data/rng.h derive_seed): rows, hidden weights, value bijections.
constexpr std::uint64_t kTagRow = 0x5c7c0001;
constexpr std::uint64_t kTagWeight = 0x5c7c0002;
constexpr std::uint64_t kTagValue = 0x5c7c0003;

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

void append_hex8(std::uint32_t v, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int shift = 28; shift >= 0; shift -= 4) out->push_back(kHex[(v >> shift) & 0xF]);
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

SynthCtrOptions parse_synth_ctr_options(const std::string& rows, const std::string& seed, const std::string& out,
                                        const std::string& files, const std::string& vocab, const std::string& zipf,
                                        const std::string& missing, bool header) {
  SynthCtrOptions o;
  if (!rows.empty()) o.rows = parse_uint64(rows, "--rows");
  if (!seed.empty()) o.seed = parse_uint64(seed, "--seed");
  o.out = out;
  if (!files.empty()) o.files = parse_int(files, "--files", 1, SynthCtrOptions::kMaxFiles);
  if (!vocab.empty()) {
    const std::vector<std::string> parts = split(vocab, ',');
    if (parts.size() != 1 && parts.size() != static_cast<std::size_t>(kCtrCatFields))
      throw ConfigError("--vocab: '" + vocab + "' has " + std::to_string(parts.size()) +
                        " sizes, expected 1 (every field) or 26 (C1..C26)");
    o.vocab.clear();
    for (const std::string& p : parts) o.vocab.push_back(parse_uint64(p, "--vocab"));
    if (o.vocab.size() == 1) o.vocab.assign(kCtrCatFields, o.vocab[0]);
  }
  if (!zipf.empty()) o.zipf = parse_double(zipf, "--zipf");
  if (!missing.empty()) o.missing = parse_double(missing, "--missing");
  o.header = header;
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

CtrRow SynthCtrModel::row(std::uint64_t index) const {
  CtrRow r;
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

  // Hidden per-(field, id) weight and embedding: a pure function of seed, field and id.
  double weight[kCtrCatFields];
  double embed[kCtrCatFields][kEmbedDim];
  for (int f = 0; f < kCtrCatFields; ++f) {
    Rng w(derive_seed(options_.seed, kTagWeight, static_cast<std::uint64_t>(f), r.cat_ids[f]));
    weight[f] = normalish(w);
    for (double& e : embed[f]) e = normalish(w);
    const auto key = static_cast<std::uint32_t>(derive_seed(options_.seed, kTagValue, static_cast<std::uint64_t>(f)));
    r.cats[f] = permute32(static_cast<std::uint32_t>(r.cat_ids[f]), key);
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

void SynthCtrModel::format(const CtrRow& row, std::string* line) {
  line->push_back(row.label ? '1' : '0');
  for (int j = 0; j < kCtrIntFields; ++j) {
    line->push_back('\t');
    if (!row.int_missing[j]) append_uint(static_cast<std::uint64_t>(row.ints[j]), line);
  }
  for (int f = 0; f < kCtrCatFields; ++f) {
    line->push_back('\t');
    if (!row.cat_missing[f]) append_hex8(row.cats[f], line);
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
      SynthCtrModel::format(r, &sink.buffer());
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
  doc["files"] = summary.files;
  summary.json = doc.dump();

  Sink json(options.out + ".json");
  json.buffer() = summary.json + "\n";
  json.close();
  return summary;
}

}  // namespace strata::cli
