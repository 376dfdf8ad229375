// Feature columns: descriptors, their checks, and the transform from a CsvTable into a Dataset.
//
// A transform binds each column tree to the table's columns once per table (Bound), then walks
// the rows: numeric columns write their floats into the row's dense features; categorical
// columns append the row's ids into a scratch vector that is copied into the column's slots.
#include "strata/data/feature_column.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <cmath>
#include <fstream>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "data/text_util.h"
#include "strata/common/error.h"

namespace strata::data {
namespace {

[[noreturn]] void bad(const std::string& what, const std::string& problem) { throw ConfigError(what + ": " + problem); }

std::string column_what(const char* factory, const std::string& key) {
  return std::string(factory) + "('" + key + "')";
}

void check_key(const char* factory, const std::string& key) {
  if (key.empty()) throw ConfigError(std::string(factory) + ": the key is empty");
  if (has_control(key)) throw ConfigError(std::string(factory) + ": key '" + printable(key) + "' has a control character");
}

// A column tree bound to one table: the table column each key reads and the vocabulary map.
struct Bound {
  const FeatureColumn* fc = nullptr;
  int table_column = -1;
  std::vector<Bound> children;  // bucketized: {source}; crossed: one per key; embedding/indicator: {categorical}
  std::shared_ptr<std::unordered_map<std::string, std::int64_t>> vocabulary;
  int slots = 0;  // categorical kinds: id slots per row
};

// Value accessors that accept any stored type where the meaning is clear, and name the row's
// file:line and the column when it is not.
struct Access {
  const CsvTable& t;

  [[noreturn]] void fail(std::int64_t row, int col, const std::string& problem) const {
    throw ConfigError(t.where(row) + ": column '" + t.columns()[static_cast<std::size_t>(col)].name + "': " + problem);
  }

  double number(int col, std::int64_t v, std::int64_t row) const {
    switch (t.columns()[static_cast<std::size_t>(col)].type) {
      case CsvType::kFloat: return t.float_value(col, v);
      case CsvType::kInt64: return static_cast<double>(t.int_value(col, v));
      case CsvType::kString: {
        const std::string_view s = t.string_value(col, v);
        std::string text(s);
        char* end = nullptr;
        errno = 0;
        const double x = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(x))
          fail(row, col, "'" + printable(text) + "' is not a number");
        return x;
      }
    }
    return 0;
  }

  std::int64_t integer(int col, std::int64_t v, std::int64_t row) const {
    switch (t.columns()[static_cast<std::size_t>(col)].type) {
      case CsvType::kInt64: return t.int_value(col, v);
      case CsvType::kFloat: {
        const float x = t.float_value(col, v);
        if (x != std::floor(x) || std::fabs(x) > 9.0e15f) fail(row, col, std::to_string(x) + " is not an integer");
        return static_cast<std::int64_t>(x);
      }
      case CsvType::kString: {
        const std::string text(t.string_value(col, v));
        std::int64_t x = 0;
        char* end = nullptr;
        errno = 0;
        const long long parsed = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
          fail(row, col, "'" + printable(text) + "' is not an integer");
        x = parsed;
        return x;
      }
    }
    return 0;
  }
};

std::int64_t checked_slots(const CsvTable& t, int col) {
  const CsvColumn& c = t.columns()[static_cast<std::size_t>(col)];
  if (c.separator == '\0') return 1;
  if (c.max_values > 0) return c.max_values;
  return std::max<std::int64_t>(1, t.max_values(col));
}

}  // namespace

// ---- descriptors -------------------------------------------------------------------------------

const char* to_string(ColumnKind kind) {
  switch (kind) {
    case ColumnKind::kNumeric: return "numeric";
    case ColumnKind::kBucketized: return "bucketized";
    case ColumnKind::kIdentity: return "identity";
    case ColumnKind::kHashBucket: return "hash_bucket";
    case ColumnKind::kVocabulary: return "vocabulary";
    case ColumnKind::kCrossed: return "crossed";
    case ColumnKind::kEmbedding: return "embedding";
    case ColumnKind::kIndicator: return "indicator";
  }
  return "?";
}

const char* to_string(Combiner combiner) {
  switch (combiner) {
    case Combiner::kMean: return "mean";
    case Combiner::kSum: return "sum";
    case Combiner::kSqrtn: return "sqrtn";
  }
  return "?";
}

Combiner parse_combiner(std::string_view text, std::string_view what) {
  if (text == "mean") return Combiner::kMean;
  if (text == "sum") return Combiner::kSum;
  if (text == "sqrtn") return Combiner::kSqrtn;
  throw ConfigError(std::string(what) + ": unknown combiner '" + printable(text) +
                    "' (mean, sum or sqrtn)");
}

CrossKey::CrossKey(const FeatureColumn& column) : categorical(std::make_shared<const FeatureColumn>(column)) {}

std::string FeatureColumn::name() const {
  switch (kind) {
    case ColumnKind::kBucketized: return source->name() + "_bucketized";
    case ColumnKind::kCrossed: {
      std::string out;
      for (std::size_t i = 0; i < cross_keys.size(); ++i)
        out += (i ? "_X_" : "") + (cross_keys[i].categorical ? cross_keys[i].categorical->name() : cross_keys[i].raw_key);
      return out;
    }
    case ColumnKind::kEmbedding: return categorical->name() + "_embedding";
    case ColumnKind::kIndicator: return categorical->name() + "_indicator";
    default: return key;
  }
}

bool FeatureColumn::is_categorical() const {
  return kind == ColumnKind::kBucketized || kind == ColumnKind::kIdentity || kind == ColumnKind::kHashBucket ||
         kind == ColumnKind::kVocabulary || kind == ColumnKind::kCrossed;
}

std::int64_t FeatureColumn::vocabulary_size() const {
  switch (kind) {
    case ColumnKind::kBucketized:
      return static_cast<std::int64_t>(boundaries.size() + 1) * source->shape;
    case ColumnKind::kIdentity:
    case ColumnKind::kHashBucket:
    case ColumnKind::kCrossed: return num_buckets;
    case ColumnKind::kVocabulary: return static_cast<std::int64_t>(vocabulary.size()) + num_oov_buckets;
    case ColumnKind::kEmbedding:
    case ColumnKind::kIndicator: return categorical->vocabulary_size();
    case ColumnKind::kNumeric: return 0;
  }
  return 0;
}

FeatureColumn numeric_column(std::string key, int shape, std::optional<float> default_value,
                             std::optional<Normalizer> normalizer) {
  check_key("numeric_column", key);
  const std::string what = column_what("numeric_column", key);
  if (shape < 1 || shape > kMaxNumericShape)
    bad(what, "shape " + std::to_string(shape) + " is outside [1, " + std::to_string(kMaxNumericShape) + "]");
  if (default_value && !std::isfinite(*default_value)) bad(what, "default_value is not finite");
  if (normalizer && (!std::isfinite(normalizer->mean) || !std::isfinite(normalizer->std) || !(normalizer->std > 0)))
    bad(what, "the normalizer needs a finite mean and a finite std > 0");
  FeatureColumn c;
  c.kind = ColumnKind::kNumeric;
  c.key = std::move(key);
  c.shape = shape;
  c.default_value = default_value;
  c.normalizer = normalizer;
  return c;
}

FeatureColumn bucketized_column(const FeatureColumn& source, std::vector<double> boundaries) {
  if (source.kind != ColumnKind::kNumeric)
    throw ConfigError("bucketized_column: the source must be a numeric_column, got a " +
                      std::string(to_string(source.kind)) + " column");
  const std::string what = column_what("bucketized_column", source.key);
  if (boundaries.empty()) bad(what, "boundaries are empty");
  for (std::size_t i = 0; i < boundaries.size(); ++i) {
    if (!std::isfinite(boundaries[i])) bad(what, "boundary " + std::to_string(i) + " is not finite");
    if (i > 0 && !(boundaries[i] > boundaries[i - 1])) bad(what, "boundaries must be sorted and distinct");
  }
  FeatureColumn c;
  c.kind = ColumnKind::kBucketized;
  c.source = std::make_shared<const FeatureColumn>(source);
  c.boundaries = std::move(boundaries);
  return c;
}

FeatureColumn categorical_column_with_identity(std::string key, std::int64_t num_buckets,
                                               std::optional<std::int64_t> default_value) {
  check_key("categorical_column_with_identity", key);
  const std::string what = column_what("categorical_column_with_identity", key);
  if (num_buckets < 1) bad(what, "num_buckets is " + std::to_string(num_buckets) + ", expected >= 1");
  if (default_value && (*default_value < 0 || *default_value >= num_buckets))
    bad(what, "default_value " + std::to_string(*default_value) + " is outside [0, " + std::to_string(num_buckets) + ")");
  FeatureColumn c;
  c.kind = ColumnKind::kIdentity;
  c.key = std::move(key);
  c.num_buckets = num_buckets;
  c.has_default_id = default_value.has_value();
  c.default_id = default_value.value_or(-1);
  return c;
}

FeatureColumn categorical_column_with_hash_bucket(std::string key, std::int64_t hash_bucket_size) {
  check_key("categorical_column_with_hash_bucket", key);
  if (hash_bucket_size < 1)
    bad(column_what("categorical_column_with_hash_bucket", key),
        "hash_bucket_size is " + std::to_string(hash_bucket_size) + ", expected >= 1");
  FeatureColumn c;
  c.kind = ColumnKind::kHashBucket;
  c.key = std::move(key);
  c.num_buckets = hash_bucket_size;
  return c;
}

std::int64_t dynamic_hash_id(std::string_view text) {
  const auto id = static_cast<std::int64_t>(fingerprint64(text) & static_cast<std::uint64_t>(kDynamicVocabulary));
  return id == kDynamicVocabulary ? kDynamicVocabulary - 1 : id;
}

FeatureColumn categorical_column_with_dynamic_hash(std::string key, const DynamicIdOptions& options) {
  check_key("categorical_column_with_dynamic_hash", key);
  const std::string what = column_what("categorical_column_with_dynamic_hash", key);
  constexpr std::int64_t kMaxTtl = std::int64_t{1} << 31;  // ps::DynamicVariableSpec::kMaxTtl
  if (options.admit_after < 0 || options.admit_after > kMaxDynamicAdmitAfter)
    bad(what, "admit_after is " + std::to_string(options.admit_after) + ", expected in [0, 65535]");
  if (options.capacity < 1 || options.capacity > kMaxDynamicCapacity)
    bad(what, "capacity is " + std::to_string(options.capacity) + ", expected in [1, 2^31 - 1]");
  if (options.ttl < 0 || options.ttl > kMaxTtl)
    bad(what, "ttl is " + std::to_string(options.ttl) + ", expected in [0, 2^31] (0: never)");
  FeatureColumn c;
  c.kind = ColumnKind::kHashBucket;
  c.key = std::move(key);
  c.num_buckets = kDynamicVocabulary;
  c.dynamic = true;
  c.dynamic_options = options;
  return c;
}

namespace {

FeatureColumn vocabulary_column(const char* factory, std::string key, std::vector<std::string> vocabulary,
                                std::int64_t default_value, std::int64_t num_oov_buckets, const std::string& file) {
  check_key(factory, key);
  const std::string what = column_what(factory, key);
  if (vocabulary.empty()) bad(what, "the vocabulary is empty");
  std::unordered_set<std::string_view> seen;
  for (const std::string& term : vocabulary) {
    if (term.empty()) bad(what, "the vocabulary has an empty term (an empty value is 'missing' and never looked up)");
    if (!seen.insert(term).second) bad(what, "the vocabulary has '" + printable(term) + "' twice");
  }
  if (num_oov_buckets < 0) bad(what, "num_oov_buckets is " + std::to_string(num_oov_buckets) + ", expected >= 0");
  const auto size = static_cast<std::int64_t>(vocabulary.size());
  if (default_value != -1 && (default_value < 0 || default_value >= size))
    bad(what, "default_value " + std::to_string(default_value) + " is neither -1 nor in [0, " + std::to_string(size) + ")");
  if (default_value != -1 && num_oov_buckets > 0) bad(what, "default_value and num_oov_buckets cannot both be set");
  FeatureColumn c;
  c.kind = ColumnKind::kVocabulary;
  c.key = std::move(key);
  c.vocabulary = std::move(vocabulary);
  c.vocabulary_file = file;
  c.default_id = default_value;
  c.num_oov_buckets = num_oov_buckets;
  return c;
}

}  // namespace

FeatureColumn categorical_column_with_vocabulary_list(std::string key, std::vector<std::string> vocabulary,
                                                      std::int64_t default_value, std::int64_t num_oov_buckets) {
  return vocabulary_column("categorical_column_with_vocabulary_list", std::move(key), std::move(vocabulary),
                           default_value, num_oov_buckets, "");
}

FeatureColumn categorical_column_with_vocabulary_file(std::string key, const std::string& vocabulary_file,
                                                      std::int64_t vocabulary_size, std::int64_t num_oov_buckets,
                                                      std::int64_t default_value) {
  check_key("categorical_column_with_vocabulary_file", key);
  const std::string what = column_what("categorical_column_with_vocabulary_file", key);
  if (vocabulary_file.empty() || has_control(vocabulary_file))
    bad(what, "vocabulary file name '" + printable(vocabulary_file, 200) + "' is empty or has a control character");
  if (vocabulary_size == 0 || vocabulary_size < -1)
    bad(what, "vocabulary_size is " + std::to_string(vocabulary_size) + ", expected >= 1 (or -1: the whole file)");
  std::ifstream in(vocabulary_file, std::ios::binary);
  if (!in) bad(what, "cannot open vocabulary file '" + vocabulary_file + "'");
  in.seekg(0, std::ios::end);
  const std::streamoff bytes = in.tellg();
  if (bytes < 0) bad(what, "cannot read vocabulary file '" + vocabulary_file + "'");
  if (bytes > kMaxVocabularyFileBytes)
    bad(what, "vocabulary file '" + vocabulary_file + "' has " + std::to_string(bytes) + " bytes, at most " +
                  std::to_string(kMaxVocabularyFileBytes));
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<std::size_t>(bytes), '\0');
  in.read(text.data(), bytes);
  if (in.gcount() != bytes) bad(what, "short read of vocabulary file '" + vocabulary_file + "'");
  std::vector<std::string> terms;
  std::unordered_set<std::string> seen;
  std::size_t pos = 0;
  std::int64_t line = 0;
  while (pos < text.size() && (vocabulary_size < 0 || static_cast<std::int64_t>(terms.size()) < vocabulary_size)) {
    ++line;
    std::size_t stop = text.find('\n', pos);
    if (stop == std::string::npos) stop = text.size();
    std::string term = text.substr(pos, stop - pos);
    pos = stop + 1;
    if (!term.empty() && term.back() == '\r') term.pop_back();
    const std::string at = vocabulary_file + ":" + std::to_string(line);
    if (term.empty()) bad(what, at + ": empty term");
    if (term.find('\0') != std::string::npos) bad(what, at + ": NUL byte in a term");
    if (!seen.insert(term).second) bad(what, at + ": term '" + printable(term) + "' appears twice");
    terms.push_back(std::move(term));
  }
  if (terms.empty()) bad(what, "vocabulary file '" + vocabulary_file + "' has no terms");
  if (vocabulary_size > static_cast<std::int64_t>(terms.size()))
    bad(what, "vocabulary_size " + std::to_string(vocabulary_size) + " but vocabulary file '" + vocabulary_file +
                  "' has " + std::to_string(terms.size()) + " terms");
  return vocabulary_column("categorical_column_with_vocabulary_file", std::move(key), std::move(terms), default_value,
                           num_oov_buckets, vocabulary_file);
}

FeatureColumn crossed_column(std::vector<CrossKey> keys, std::int64_t hash_bucket_size, std::uint64_t hash_key) {
  if (keys.size() < 2) throw ConfigError("crossed_column: needs at least 2 keys, got " + std::to_string(keys.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const CrossKey& k = keys[i];
    if (k.categorical && !k.categorical->is_categorical())
      throw ConfigError("crossed_column: key " + std::to_string(i) + " is a " + to_string(k.categorical->kind) +
                        " column; keys are CSV column names or categorical columns");
    if (!k.categorical && k.raw_key.empty()) throw ConfigError("crossed_column: key " + std::to_string(i) + " is empty");
    if (!k.categorical && has_control(k.raw_key))
      throw ConfigError("crossed_column: key " + std::to_string(i) + " '" + printable(k.raw_key) + "' has a control character");
  }
  FeatureColumn c;
  c.kind = ColumnKind::kCrossed;
  c.cross_keys = std::move(keys);
  if (hash_bucket_size < 1)
    throw ConfigError("crossed_column('" + c.name() + "'): hash_bucket_size is " + std::to_string(hash_bucket_size) +
                      ", expected >= 1");
  c.num_buckets = hash_bucket_size;
  c.hash_key = hash_key;
  return c;
}

FeatureColumn embedding_column(const FeatureColumn& categorical, int dimension, Combiner combiner) {
  if (!categorical.is_categorical())
    throw ConfigError("embedding_column: needs a categorical column, got a " + std::string(to_string(categorical.kind)) +
                      " column");
  if (dimension < 1 || dimension > kMaxNumericShape)
    throw ConfigError("embedding_column('" + categorical.name() + "'): dimension " + std::to_string(dimension) +
                      " is outside [1, " + std::to_string(kMaxNumericShape) + "]");
  FeatureColumn c;
  c.kind = ColumnKind::kEmbedding;
  c.categorical = std::make_shared<const FeatureColumn>(categorical);
  c.dimension = dimension;
  c.combiner = combiner;
  return c;
}

FeatureColumn indicator_column(const FeatureColumn& categorical) {
  if (!categorical.is_categorical())
    throw ConfigError("indicator_column: needs a categorical column, got a " + std::string(to_string(categorical.kind)) +
                      " column");
  if (categorical.kind == ColumnKind::kHashBucket && categorical.dynamic)
    throw ConfigError("indicator_column('" + categorical.name() +
                      "'): a dynamic hash column has no vocabulary to count over; use an embedding_column");
  FeatureColumn c;
  c.kind = ColumnKind::kIndicator;
  c.categorical = std::make_shared<const FeatureColumn>(categorical);
  return c;
}

// ---- CSV schema --------------------------------------------------------------------------------

std::vector<CsvColumn> csv_columns_for(const std::vector<FeatureColumn>& columns, const LabelSpec& label) {
  std::vector<CsvColumn> out;
  out.push_back(CsvColumn{label.key, label.regression ? CsvType::kFloat : CsvType::kInt64, std::nullopt, '\0'});
  auto want = [&](const std::string& key, CsvType type, std::optional<std::string> def) {
    for (CsvColumn& c : out) {
      if (c.name != key) continue;
      if (c.type != type && c.type != CsvType::kString && type != CsvType::kString) c.type = CsvType::kFloat;
      else if (c.type == CsvType::kString && type != CsvType::kString) {
        c.type = type;
        c.default_value = def;
      }
      return;
    }
    out.push_back(CsvColumn{key, type, std::move(def), '\0'});
  };
  // Numeric uses first, so a key both numeric and hashed keeps its number type.
  std::function<void(const FeatureColumn&)> visit = [&](const FeatureColumn& fc) {
    switch (fc.kind) {
      case ColumnKind::kNumeric: {
        std::optional<std::string> def;
        if (fc.default_value) {
          char buf[32];
          const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, *fc.default_value);
          if (ec == std::errc()) def = std::string(buf, end);
        }
        want(fc.key, CsvType::kFloat, def);
        break;
      }
      case ColumnKind::kBucketized: visit(*fc.source); break;
      case ColumnKind::kIdentity: want(fc.key, CsvType::kInt64, std::nullopt); break;
      case ColumnKind::kHashBucket:
      case ColumnKind::kVocabulary: want(fc.key, CsvType::kString, std::string()); break;
      case ColumnKind::kCrossed:
        for (const CrossKey& k : fc.cross_keys) {
          if (k.categorical) visit(*k.categorical);
          else want(k.raw_key, CsvType::kString, std::string());
        }
        break;
      case ColumnKind::kEmbedding:
      case ColumnKind::kIndicator: visit(*fc.categorical); break;
    }
  };
  for (const FeatureColumn& fc : columns) visit(fc);
  return out;
}

// ---- transform ---------------------------------------------------------------------------------

namespace {

class Binder {
 public:
  // plan: size slots from the table; otherwise slots come from `planned` (same tree shape).
  explicit Binder(const CsvTable& t) : t_(t) {}

  Bound bind(const FeatureColumn& fc, const Bound* planned) {
    Bound b;
    b.fc = &fc;
    const std::string what = std::string(to_string(fc.kind)) + " column '" + fc.name() + "'";
    switch (fc.kind) {
      case ColumnKind::kNumeric:
        b.table_column = t_.require_column(fc.key, what);
        break;
      case ColumnKind::kBucketized:
        b.children.push_back(bind(*fc.source, planned ? &planned->children[0] : nullptr));
        b.slots = fc.source->shape;
        break;
      case ColumnKind::kIdentity:
      case ColumnKind::kHashBucket:
      case ColumnKind::kVocabulary:
        b.table_column = t_.require_column(fc.key, what);
        b.slots = planned ? planned->slots : static_cast<int>(std::min<std::int64_t>(checked_slots(t_, b.table_column), kMaxCrossedSlots));
        if (!planned && checked_slots(t_, b.table_column) > kMaxCrossedSlots)
          throw ConfigError(what + ": a row holds " + std::to_string(checked_slots(t_, b.table_column)) +
                            " values, at most " + std::to_string(kMaxCrossedSlots));
        if (fc.kind == ColumnKind::kVocabulary) {
          b.vocabulary = std::make_shared<std::unordered_map<std::string, std::int64_t>>();
          b.vocabulary->reserve(fc.vocabulary.size());
          for (std::size_t i = 0; i < fc.vocabulary.size(); ++i)
            b.vocabulary->emplace(fc.vocabulary[i], static_cast<std::int64_t>(i));
        }
        break;
      case ColumnKind::kCrossed: {
        std::int64_t slots = 1;
        for (std::size_t i = 0; i < fc.cross_keys.size(); ++i) {
          const CrossKey& k = fc.cross_keys[i];
          const Bound* p = planned ? &planned->children[i] : nullptr;
          if (k.categorical) {
            b.children.push_back(bind(*k.categorical, p));
          } else {
            Bound raw;
            raw.table_column = t_.require_column(k.raw_key, what);
            if (t_.columns()[static_cast<std::size_t>(raw.table_column)].type == CsvType::kFloat)
              throw ConfigError(what + ": key '" + k.raw_key +
                                "' is a float column; a cross takes string or int64 values (as TensorFlow)");
            raw.slots = p ? p->slots : static_cast<int>(std::min<std::int64_t>(checked_slots(t_, raw.table_column), kMaxCrossedSlots));
            b.children.push_back(std::move(raw));
          }
          slots *= b.children.back().slots;
          if (slots > kMaxCrossedSlots)
            throw ConfigError(what + ": the cross of its keys' values needs more than " +
                              std::to_string(kMaxCrossedSlots) + " slots per row");
        }
        b.slots = static_cast<int>(slots);
        break;
      }
      case ColumnKind::kEmbedding:
      case ColumnKind::kIndicator:
        b.children.push_back(bind(*fc.categorical, planned ? &planned->children[0] : nullptr));
        b.slots = b.children[0].slots;
        break;
    }
    return b;
  }

 private:
  const CsvTable& t_;
};

class RowWriter {
 public:
  explicit RowWriter(const CsvTable& t) : a_{t}, t_(t) {}

  // The `shape` normalised floats of a numeric column in row r.
  void numeric(const Bound& b, std::int64_t r, float* out) const {
    const FeatureColumn& fc = *b.fc;
    const int col = b.table_column;
    const std::int64_t first = t_.value_begin(col, r), end = t_.value_end(col, r);
    const std::int64_t count = end - first;
    if (count == 0 && fc.default_value) {
      std::fill(out, out + fc.shape, to_float(normalise(fc, *fc.default_value), r, col));
      return;
    }
    if (count != fc.shape)
      a_.fail(r, col, std::to_string(count) + " values, numeric_column '" + fc.key + "' has shape " +
                          std::to_string(fc.shape) + (fc.default_value ? "" : " and no default_value"));
    for (std::int64_t v = first; v < end; ++v) out[v - first] = to_float(normalise(fc, a_.number(col, v, r)), r, col);
  }

  // Appends row r's ids of categorical column b to `ids` (at most b.slots of them).
  void ids(const Bound& b, std::int64_t r, std::vector<std::int64_t>& ids) const {
    const FeatureColumn& fc = *b.fc;
    const std::size_t before = ids.size();
    switch (fc.kind) {
      case ColumnKind::kBucketized: {
        const FeatureColumn& src = *fc.source;
        scratch_.resize(static_cast<std::size_t>(src.shape));
        numeric(b.children[0], r, scratch_.data());
        const auto width = static_cast<std::int64_t>(fc.boundaries.size() + 1);
        for (int i = 0; i < src.shape; ++i) {
          const auto bucket = std::upper_bound(fc.boundaries.begin(), fc.boundaries.end(),
                                               static_cast<double>(scratch_[static_cast<std::size_t>(i)])) -
                              fc.boundaries.begin();
          ids.push_back(bucket + i * width);
        }
        break;
      }
      case ColumnKind::kIdentity: {
        const int col = b.table_column;
        for (std::int64_t v = t_.value_begin(col, r), end = t_.value_end(col, r); v < end; ++v) {
          const std::int64_t x = a_.integer(col, v, r);
          if (x == -1) continue;
          if (x >= 0 && x < fc.num_buckets) ids.push_back(x);
          else if (fc.has_default_id) ids.push_back(fc.default_id);
          else
            a_.fail(r, col, "id " + std::to_string(x) + " is outside [0, " + std::to_string(fc.num_buckets) +
                                ") and categorical_column_with_identity('" + fc.key + "') has no default_value");
        }
        break;
      }
      case ColumnKind::kHashBucket:
      case ColumnKind::kVocabulary: {
        const int col = b.table_column;
        const bool is_string = t_.columns()[static_cast<std::size_t>(col)].type == CsvType::kString;
        for (std::int64_t v = t_.value_begin(col, r), end = t_.value_end(col, r); v < end; ++v) {
          std::string_view text;
          if (is_string) {
            text = t_.string_value(col, v);
          } else {
            text_ = t_.value_text(col, v);
            text = text_;
          }
          if (text.empty()) continue;
          if (fc.kind == ColumnKind::kHashBucket && fc.dynamic) {
            ids.push_back(dynamic_hash_id(text));
            continue;
          }
          if (fc.kind == ColumnKind::kHashBucket) {
            ids.push_back(static_cast<std::int64_t>(fingerprint64(text) % static_cast<std::uint64_t>(fc.num_buckets)));
            continue;
          }
          text_ = std::string(text);
          const auto it = b.vocabulary->find(text_);
          if (it != b.vocabulary->end()) ids.push_back(it->second);
          else if (fc.num_oov_buckets > 0)
            ids.push_back(static_cast<std::int64_t>(fc.vocabulary.size()) +
                          static_cast<std::int64_t>(fingerprint64(text_) % static_cast<std::uint64_t>(fc.num_oov_buckets)));
          else if (fc.default_id >= 0) ids.push_back(fc.default_id);
        }
        break;
      }
      case ColumnKind::kCrossed: cross(b, r, ids); break;
      case ColumnKind::kEmbedding:
      case ColumnKind::kIndicator: this->ids(b.children[0], r, ids); break;
      case ColumnKind::kNumeric: break;
    }
    if (ids.size() - before > static_cast<std::size_t>(b.slots))
      throw ConfigError(t_.where(r) + ": " + to_string(fc.kind) + " column '" + fc.name() + "' has " +
                        std::to_string(ids.size() - before) + " ids in this row, the layout (planned on the training data) has " +
                        std::to_string(b.slots) + " slots");
  }

 private:
  static double normalise(const FeatureColumn& fc, double x) {
    if (fc.normalizer) x = (x - fc.normalizer->mean) / fc.normalizer->std;
    return x;
  }

  // Checked before the conversion: a double outside float's range converts with undefined
  // behaviour.
  float to_float(double x, std::int64_t r, int col) const {
    if (!std::isfinite(x) || std::fabs(x) > static_cast<double>(std::numeric_limits<float>::max()))
      a_.fail(r, col, "the value (normalised: " + std::to_string(x) + ") does not fit a float");
    return static_cast<float>(x);
  }

  // TF's HashCrosser over the cartesian product of the keys' values, the last key fastest.
  void cross(const Bound& b, std::int64_t r, std::vector<std::int64_t>& ids) const {
    const FeatureColumn& fc = *b.fc;
    std::vector<std::vector<std::uint64_t>> hashes(b.children.size());
    std::vector<std::int64_t> sub;
    for (std::size_t k = 0; k < b.children.size(); ++k) {
      const Bound& child = b.children[k];
      if (child.fc != nullptr) {
        sub.clear();
        this->ids(child, r, sub);
        for (std::int64_t id : sub) hashes[k].push_back(static_cast<std::uint64_t>(id));
      } else {
        const int col = child.table_column;
        const bool is_string = t_.columns()[static_cast<std::size_t>(col)].type == CsvType::kString;
        std::int64_t count = 0;
        for (std::int64_t v = t_.value_begin(col, r), end = t_.value_end(col, r); v < end; ++v, ++count)
          hashes[k].push_back(is_string ? fingerprint64(t_.string_value(col, v))
                                        : static_cast<std::uint64_t>(t_.int_value(col, v)));
        if (count > child.slots)
          a_.fail(r, col, std::to_string(count) + " values, the layout (planned on the training data) has " +
                              std::to_string(child.slots) + " slots for this key of '" + fc.name() + "'");
      }
      if (hashes[k].empty()) return;  // an empty key: no combination
    }
    std::vector<std::size_t> at(hashes.size(), 0);
    std::vector<std::uint64_t> combo(hashes.size());
    for (;;) {
      for (std::size_t k = 0; k < hashes.size(); ++k) combo[k] = hashes[k][at[k]];
      ids.push_back(sparse_cross_hash(combo, fc.num_buckets, fc.hash_key));
      std::size_t k = hashes.size();
      while (k > 0) {
        --k;
        if (++at[k] < hashes[k].size()) break;
        at[k] = 0;
        if (k == 0) return;
      }
    }
  }

  Access a_;
  const CsvTable& t_;
  mutable std::vector<float> scratch_;
  mutable std::string text_;
};

int label_column(const CsvTable& t, const LabelSpec& label) {
  const int col = t.require_column(label.key, "label");
  if (t.columns()[static_cast<std::size_t>(col)].separator != '\0')
    throw ConfigError("label: column '" + label.key + "' is multi-valued; a label is one value");
  return col;
}

}  // namespace

struct FeatureTransform::Plan {
  std::vector<FeatureColumn> columns;
  std::vector<Bound> bound;  // planned against the training table; points into `columns`
};

FeatureTransform::FeatureTransform(std::vector<FeatureColumn> columns, LabelSpec label, const CsvTable& table) {
  auto plan = std::make_shared<Plan>();
  plan->columns = std::move(columns);
  const std::vector<FeatureColumn>& cols = plan->columns;
  if (cols.empty()) throw ConfigError("feature columns: the list is empty");
  std::unordered_set<std::string> names;
  for (const FeatureColumn& fc : cols)
    if (!names.insert(fc.name()).second) throw ConfigError("feature columns: two columns are named '" + fc.name() + "'");
  if (!label.regression && (label.num_classes < 0 || label.num_classes == 1))
    throw ConfigError("label: num_classes is " + std::to_string(label.num_classes) + ", expected 0 (infer) or >= 2");
  const int lcol = label_column(table, label);
  if (!label.regression && label.num_classes == 0) {
    const Access a{table};
    std::int64_t most = 1;
    for (std::int64_t r = 0; r < table.num_rows(); ++r) {
      const std::int64_t y = a.integer(lcol, r, r);
      if (y < 0 || y >= (std::int64_t{1} << 24))
        a.fail(r, lcol, "label " + std::to_string(y) + " is not a class index in [0, 2^24)");
      most = std::max(most, y);
    }
    label.num_classes = static_cast<int>(most + 1);
  }
  layout_.label = label;
  Binder binder(table);
  std::int64_t dense = 0, slots = 0;
  for (const FeatureColumn& fc : cols) {
    plan->bound.push_back(binder.bind(fc, nullptr));
    const Bound& b = plan->bound.back();
    ColumnLayout cl;
    cl.name = fc.name();
    cl.kind = fc.kind;
    if (fc.kind == ColumnKind::kNumeric) {
      cl.dense_offset = static_cast<int>(dense);
      cl.dense_width = fc.shape;
      dense += fc.shape;
    } else {
      cl.first_slot = static_cast<int>(slots);
      cl.num_slots = b.slots;
      cl.vocabulary_size = fc.vocabulary_size();
      slots += b.slots;
      layout_.sparse_vocab = std::max(layout_.sparse_vocab, cl.vocabulary_size);
    }
    {
      const FeatureColumn* cat = fc.categorical ? fc.categorical.get() : &fc;
      if (cat->kind == ColumnKind::kHashBucket && cat->dynamic) {
        cl.dynamic = true;
        cl.dynamic_options = cat->dynamic_options;
      }
    }
    if (fc.kind == ColumnKind::kEmbedding) {
      cl.dimension = fc.dimension;
      cl.combiner = fc.combiner;
    }
    if (dense > (1 << 24) || slots > (1 << 24)) throw ConfigError("feature columns: the layout is too wide");
    layout_.columns.push_back(cl);
  }
  layout_.dense_dim = static_cast<int>(dense);
  layout_.num_fields = static_cast<int>(slots);
  plan_ = std::move(plan);
}

const std::vector<FeatureColumn>& FeatureTransform::columns() const { return plan_->columns; }

Dataset FeatureTransform::apply(const CsvTable& table) const {
  // Bound anew, so an evaluation file may order its columns differently, with the slot counts
  // planned on the training table.
  Binder binder(table);
  std::vector<Bound> bound;
  for (std::size_t i = 0; i < plan_->columns.size(); ++i) bound.push_back(binder.bind(plan_->columns[i], &plan_->bound[i]));
  const int lcol = label_column(table, layout_.label);
  const Access a{table};
  const RowWriter writer(table);

  Dataset d;
  d.size = table.num_rows();
  d.dense_dim = layout_.dense_dim;
  d.num_fields = layout_.num_fields;
  d.sparse_vocab = layout_.sparse_vocab;
  const auto n = static_cast<std::size_t>(d.size);
  const auto dense = static_cast<std::size_t>(d.dense_dim), fields = static_cast<std::size_t>(d.num_fields);
  d.features.assign(n * dense, 0.0f);
  d.sparse_ids.assign(n * fields, kNoId);
  if (layout_.label.regression) d.targets.resize(n);
  else {
    d.labels.resize(n);
    d.num_classes = layout_.label.num_classes;
  }
  std::vector<std::int64_t> ids;
  for (std::int64_t r = 0; r < d.size; ++r) {
    const auto row = static_cast<std::size_t>(r);
    for (std::size_t i = 0; i < bound.size(); ++i) {
      const ColumnLayout& cl = layout_.columns[i];
      if (cl.kind == ColumnKind::kNumeric) {
        writer.numeric(bound[i], r, d.features.data() + row * dense + static_cast<std::size_t>(cl.dense_offset));
        continue;
      }
      ids.clear();
      writer.ids(bound[i], r, ids);
      std::copy(ids.begin(), ids.end(), d.sparse_ids.begin() + static_cast<std::ptrdiff_t>(row * fields + static_cast<std::size_t>(cl.first_slot)));
    }
    if (layout_.label.regression) {
      const double y = a.number(lcol, r, r);
      if (!(std::fabs(y) <= static_cast<double>(std::numeric_limits<float>::max())))
        a.fail(r, lcol, "the target " + std::to_string(y) + " does not fit a float");
      d.targets[row] = static_cast<float>(y);
    } else {
      const std::int64_t y = a.integer(lcol, r, r);
      if (y < 0 || y >= d.num_classes)
        a.fail(r, lcol, "label " + std::to_string(y) + " is outside [0, num_classes=" + std::to_string(d.num_classes) + ")");
      d.labels[row] = static_cast<std::int32_t>(y);
    }
  }
  d.files = table.files();
  d.file_of = table.file_of();
  validate(d);
  return d;
}

FeatureLayout dense_feature_layout(const std::vector<FeatureColumn>& columns, LabelSpec label, const Dataset& data,
                                   const std::string& source) {
  if (columns.empty()) throw ConfigError("feature columns: the list is empty");
  FeatureLayout layout;
  std::unordered_set<std::string> names;
  std::int64_t dense = 0;
  for (const FeatureColumn& fc : columns) {
    if (!names.insert(fc.name()).second) throw ConfigError("feature columns: two columns are named '" + fc.name() + "'");
    if (fc.kind != ColumnKind::kNumeric)
      throw ConfigError("feature column '" + fc.name() + "': " + source + " holds dense features only; a " +
                        to_string(fc.kind) + " column needs CSV input (--data csv:FILE)");
    ColumnLayout cl;
    cl.name = fc.name();
    cl.kind = fc.kind;
    cl.dense_offset = static_cast<int>(dense);
    cl.dense_width = fc.shape;
    dense += fc.shape;
    layout.columns.push_back(cl);
  }
  if (dense != data.dense_dim)
    throw ConfigError("feature columns: their shapes add up to " + std::to_string(dense) + " features, but " + source +
                      " has " + std::to_string(data.dense_dim) + " per example (give numeric columns whose shapes sum to " +
                      std::to_string(data.dense_dim) + ")");
  if (label.regression) {
    if (data.targets.empty())
      throw ConfigError("label: a regressor needs float targets, and " + source + " holds class labels only");
  } else {
    if (data.labels.empty()) throw ConfigError("label: a classifier needs class labels, and " + source + " has none");
    if (label.num_classes < 0 || label.num_classes == 1)
      throw ConfigError("label: num_classes is " + std::to_string(label.num_classes) + ", expected 0 (infer) or >= 2");
    if (label.num_classes == 0) label.num_classes = std::max(2, data.num_classes);
    if (label.num_classes < data.num_classes)
      throw ConfigError("label: num_classes is " + std::to_string(label.num_classes) + ", but " + source +
                        " has labels up to " + std::to_string(data.num_classes - 1));
  }
  layout.label = label;
  layout.dense_dim = static_cast<int>(dense);
  return layout;
}

void normalize_dense(const std::vector<FeatureColumn>& columns, const FeatureLayout& layout, Dataset& data,
                     const std::string& source) {
  if (columns.size() != layout.columns.size() || data.dense_dim != layout.dense_dim)
    throw ConfigError(source + ": " + std::to_string(data.dense_dim) + " features per example, but the feature columns take " +
                      std::to_string(layout.dense_dim));
  if (!layout.label.regression) {
    if (data.labels.empty()) throw ConfigError(source + ": a classifier needs class labels, and the data has none");
    if (data.num_classes > layout.label.num_classes)
      throw ConfigError(source + ": labels up to " + std::to_string(data.num_classes - 1) + ", but num_classes is " +
                        std::to_string(layout.label.num_classes));
    data.num_classes = layout.label.num_classes;
  } else if (data.targets.empty()) {
    throw ConfigError(source + ": a regressor needs float targets, and the data holds class labels only");
  }
  const auto dim = static_cast<std::size_t>(data.dense_dim);
  for (std::size_t i = 0; i < columns.size(); ++i) {
    if (!columns[i].normalizer) continue;
    const double mean = columns[i].normalizer->mean, std = columns[i].normalizer->std;
    const auto begin = static_cast<std::size_t>(layout.columns[i].dense_offset);
    const auto end = begin + static_cast<std::size_t>(layout.columns[i].dense_width);
    for (std::size_t row = 0; row < static_cast<std::size_t>(data.size); ++row)
      for (std::size_t j = begin; j < end; ++j) {
        float& x = data.features[row * dim + j];
        x = static_cast<float>((static_cast<double>(x) - mean) / std);
      }
  }
}

namespace {

// Worker `worker`'s share of a streamed input (csv_batch_source's sharding): its files, and
// whether it keeps only the rows whose index in the whole input is worker modulo num_workers.
struct CsvShare {
  std::vector<std::string> paths;
  bool by_line = false;
};

CsvShare csv_share(std::vector<std::string> paths, AutoShard policy, int num_workers, int worker) {
  if (num_workers < 1 || worker < 0 || worker >= num_workers)
    throw ConfigError("csv stream: worker " + std::to_string(worker) + " of " + std::to_string(num_workers) + " workers");
  if (paths.empty()) throw ConfigError("csv: no input files");
  if (policy == AutoShard::kAuto)
    policy = paths.size() >= static_cast<std::size_t>(num_workers) ? AutoShard::kFile : AutoShard::kData;
  CsvShare share;
  share.by_line = policy == AutoShard::kData && num_workers > 1;
  if (policy == AutoShard::kFile) {
    if (paths.size() < static_cast<std::size_t>(num_workers))
      throw ConfigError("csv stream: FILE sharding needs at least one file per worker: " + std::to_string(paths.size()) +
                        " files for " + std::to_string(num_workers) + " workers");
    for (std::size_t f = static_cast<std::size_t>(worker); f < paths.size(); f += static_cast<std::size_t>(num_workers))
      share.paths.push_back(paths[f]);
  } else {
    share.paths = std::move(paths);
  }
  return share;
}

}  // namespace

std::int64_t csv_shard_rows(std::vector<std::string> paths, CsvOptions options, AutoShard policy, int num_workers,
                            int worker, std::int64_t chunk_rows) {
  if (chunk_rows < 1) throw ConfigError("csv stream: chunk_rows is " + std::to_string(chunk_rows) + ", expected >= 1");
  const CsvShare share = csv_share(std::move(paths), policy, num_workers, worker);
  const std::int64_t rows = count_csv_rows(share.paths, options);
  if (!share.by_line) return rows;
  return rows / num_workers + (worker < rows % num_workers ? 1 : 0);
}

bool csv_shards_by_line(std::size_t files, AutoShard policy, int num_workers) {
  if (policy == AutoShard::kAuto) policy = files >= static_cast<std::size_t>(num_workers) ? AutoShard::kFile : AutoShard::kData;
  return policy == AutoShard::kData && num_workers > 1;
}

std::int64_t csv_shard_rows_of(const std::vector<std::int64_t>& file_rows, AutoShard policy, int num_workers,
                               int worker) {
  // csv_share's rules (and its checks): the files' names do not matter, only their order and count.
  const CsvShare share = csv_share(std::vector<std::string>(file_rows.size()), policy, num_workers, worker);
  const bool by_file = policy == AutoShard::kFile ||
                       (policy == AutoShard::kAuto && file_rows.size() >= static_cast<std::size_t>(num_workers));
  std::int64_t rows = 0;
  for (std::size_t f = 0; f < file_rows.size(); ++f) {
    if (file_rows[f] < 0) throw Error("csv stream: file " + std::to_string(f) + " has a negative row count");
    if (!by_file || f % static_cast<std::size_t>(num_workers) == static_cast<std::size_t>(worker)) rows += file_rows[f];
  }
  if (!share.by_line) return rows;
  return rows / num_workers + (worker < rows % num_workers ? 1 : 0);
}

BatchIterator::Source csv_batch_source(std::vector<std::string> paths, CsvOptions options, FeatureTransform transform,
                                       int batch_size, bool drop_remainder, AutoShard policy, int num_workers, int worker,
                                       std::int64_t chunk_rows, std::int64_t shuffle_buffer, std::uint64_t seed) {
  if (batch_size < 1) throw ConfigError("csv stream: batch size is " + std::to_string(batch_size) + ", expected >= 1");
  if (chunk_rows < 1) throw ConfigError("csv stream: chunk_rows is " + std::to_string(chunk_rows) + ", expected >= 1");
  if (shuffle_buffer < 0 || shuffle_buffer > (std::int64_t{1} << 32))
    throw ConfigError("csv stream: shuffle buffer is " + std::to_string(shuffle_buffer) + ", expected 0..2^32 rows");
  CsvShare share = csv_share(std::move(paths), policy, num_workers, worker);
  paths = std::move(share.paths);
  // One row of a batch in flat form: dense features, ids, label or target.
  struct Rows {
    std::vector<float> features;
    std::vector<std::int64_t> ids;
    std::vector<std::int32_t> labels;
    std::vector<float> targets;
  };
  struct State {
    CsvStream stream;
    FeatureTransform transform;
    CsvTable chunk;
    Dataset pending;
    std::vector<std::int64_t> keep;  // rows of `pending` this worker takes, in order
    std::size_t next = 0;
    std::int64_t rows_seen = 0;  // rows of the whole input before `pending`
    Rows buffer;                 // the shuffle buffer
    std::int64_t buffered = 0;
    bool input_done = false;
    std::uint64_t rng = 0;
  };
  auto state = std::make_shared<State>(State{CsvStream(std::move(paths), std::move(options)), std::move(transform),
                                             CsvTable{}, Dataset{}, {}, 0, 0, Rows{}, 0, false, seed});
  const bool by_line = share.by_line;
  return [state, batch_size, drop_remainder, by_line, num_workers, worker, chunk_rows, shuffle_buffer](Batch& out) {
    State& s = *state;
    const FeatureLayout& L = s.transform.layout();
    const auto dense = static_cast<std::size_t>(L.dense_dim), fields = static_cast<std::size_t>(L.num_fields);
    const bool labels = !L.label.regression;
    // Copies the next input row this worker keeps into row `at` of `dst` (resized as needed);
    // false at the end of the input.
    const auto pull = [&](Rows& dst, std::size_t at) {
      while (s.next == s.keep.size()) {
        if (s.input_done || !s.stream.next(s.chunk, chunk_rows)) {
          s.input_done = true;
          return false;
        }
        s.pending = s.transform.apply(s.chunk);
        s.keep.clear();
        s.next = 0;
        for (std::int64_t r = 0; r < s.pending.size; ++r)
          if (!by_line || (s.rows_seen + r) % num_workers == worker) s.keep.push_back(r);
        s.rows_seen += s.pending.size;
      }
      const auto r = static_cast<std::size_t>(s.keep[s.next++]);
      const Dataset& d = s.pending;
      if (dst.features.size() < (at + 1) * dense) dst.features.resize((at + 1) * dense);
      if (dst.ids.size() < (at + 1) * fields) dst.ids.resize((at + 1) * fields);
      std::copy_n(d.features.begin() + static_cast<std::ptrdiff_t>(r * dense), dense,
                  dst.features.begin() + static_cast<std::ptrdiff_t>(at * dense));
      std::copy_n(d.sparse_ids.begin() + static_cast<std::ptrdiff_t>(r * fields), fields,
                  dst.ids.begin() + static_cast<std::ptrdiff_t>(at * fields));
      if (labels) {
        if (dst.labels.size() < at + 1) dst.labels.resize(at + 1);
        dst.labels[at] = d.labels[r];
      } else {
        if (dst.targets.size() < at + 1) dst.targets.resize(at + 1);
        dst.targets[at] = d.targets[r];
      }
      return true;
    };
    const auto move_row = [&](const Rows& src, std::size_t from, Rows& dst, std::size_t to) {
      if (dst.features.size() < (to + 1) * dense) dst.features.resize((to + 1) * dense);
      if (dst.ids.size() < (to + 1) * fields) dst.ids.resize((to + 1) * fields);
      std::copy_n(src.features.begin() + static_cast<std::ptrdiff_t>(from * dense), dense,
                  dst.features.begin() + static_cast<std::ptrdiff_t>(to * dense));
      std::copy_n(src.ids.begin() + static_cast<std::ptrdiff_t>(from * fields), fields,
                  dst.ids.begin() + static_cast<std::ptrdiff_t>(to * fields));
      if (labels) {
        if (dst.labels.size() < to + 1) dst.labels.resize(to + 1);
        dst.labels[to] = src.labels[from];
      } else {
        if (dst.targets.size() < to + 1) dst.targets.resize(to + 1);
        dst.targets[to] = src.targets[from];
      }
    };
    Rows rows;
    rows.features = std::move(out.features);
    rows.ids = std::move(out.sparse_ids);
    rows.labels = std::move(out.labels);
    rows.targets = std::move(out.targets);
    rows.features.clear();
    rows.ids.clear();
    rows.labels.clear();
    rows.targets.clear();
    int size = 0;
    while (size < batch_size) {
      if (shuffle_buffer == 0) {
        if (!pull(rows, static_cast<std::size_t>(size))) break;
      } else {
        while (!s.input_done && s.buffered < shuffle_buffer && pull(s.buffer, static_cast<std::size_t>(s.buffered))) ++s.buffered;
        if (s.buffered == 0) break;
        // splitmix64: a portable, seeded choice (no std:: distributions).
        s.rng += 0x9e3779b97f4a7c15ULL;
        std::uint64_t z = s.rng;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        const auto j = static_cast<std::size_t>(z % static_cast<std::uint64_t>(s.buffered));
        move_row(s.buffer, j, rows, static_cast<std::size_t>(size));
        if (s.input_done || !pull(s.buffer, j)) {
          move_row(s.buffer, static_cast<std::size_t>(s.buffered - 1), s.buffer, j);
          --s.buffered;
        }
      }
      ++size;
    }
    const auto n = static_cast<std::size_t>(size);
    rows.features.resize(n * dense);
    rows.ids.resize(n * fields);
    rows.labels.resize(labels ? n : 0);
    rows.targets.resize(labels ? 0 : n);
    out.size = size;
    out.dense_dim = L.dense_dim;
    out.num_fields = L.num_fields;
    out.features = std::move(rows.features);
    out.sparse_ids = std::move(rows.ids);
    out.labels = std::move(rows.labels);
    out.targets = std::move(rows.targets);
    return size > 0 && (size == batch_size || !drop_remainder);
  };
}

}  // namespace strata::data
