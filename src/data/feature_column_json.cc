// The JSON schema of feature columns (include/strata/data/feature_column.h lists it).
//
// Every member is checked for presence, type and range before a factory sees it, and unknown
// members are refused, so a misspelt "hash_bucket_sise" is an error and not a silent default.
// The factories' own checks (sorted boundaries, duplicate terms, ...) are reported under the
// column's path too.
#include "data/feature_column_json.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

#include "data/text_util.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"

namespace strata::data {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::size_t kMaxExcerpt = 60;

std::string excerpt(const Json& v) {
  std::string text = v.dump();
  if (text.size() > kMaxExcerpt) text = text.substr(0, kMaxExcerpt) + "...";
  return text;
}

class Reader {
 public:
  Reader(std::string origin, std::string base_dir) : origin_(std::move(origin)), base_dir_(std::move(base_dir)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& problem) const {
    throw ConfigError(origin_ + ": " + path + ": " + problem);
  }

  FeatureColumn column(const Json& j, const std::string& path) const {
    if (!j.is_object()) fail(path, "expected a feature column object, got " + excerpt(j));
    const auto type_it = j.find("type");
    if (type_it == j.end()) fail(path, "missing \"type\"");
    if (!type_it->is_string()) fail(path + ".type", "expected a string, got " + excerpt(*type_it));
    const std::string type = type_it->get<std::string>();
    try {
      if (type == "numeric" || type == "numeric_column") return numeric(j, path);
      if (type == "bucketized" || type == "bucketized_column") {
        members(j, path, {"type", "source", "boundaries"});
        const FeatureColumn source = column(required(j, path, "source"), path + ".source");
        if (source.kind != ColumnKind::kNumeric) fail(path + ".source", "expected a numeric column");
        const Json& b = required(j, path, "boundaries");
        if (!b.is_array()) fail(path + ".boundaries", "expected an array of numbers, got " + excerpt(b));
        std::vector<double> boundaries;
        for (std::size_t i = 0; i < b.size(); ++i) boundaries.push_back(number(b[i], path + ".boundaries[" + std::to_string(i) + "]"));
        return bucketized_column(source, std::move(boundaries));
      }
      if (type == "identity" || type == "categorical_column_with_identity") {
        members(j, path, {"type", "key", "num_buckets", "default_value"});
        std::optional<std::int64_t> def;
        if (j.contains("default_value")) def = integer(j["default_value"], path + ".default_value", 0, kMaxBuckets);
        return categorical_column_with_identity(key(j, path), integer(required(j, path, "num_buckets"), path + ".num_buckets", 1, kMaxBuckets), def);
      }
      const bool dynamic_hash = type == "dynamic_hash" || type == "categorical_column_with_dynamic_hash";
      const bool hash_bucket = type == "hash_bucket" || type == "categorical_column_with_hash_bucket";
      if (dynamic_hash || (hash_bucket && j.contains("dynamic"))) {
        if (!dynamic_hash) {
          const Json& d = j["dynamic"];
          if (!d.is_boolean()) fail(path + ".dynamic", "expected true or false, got " + excerpt(d));
        }
        if (dynamic_hash || j["dynamic"].get<bool>()) {
          members(j, path, {"type", "key", "dynamic", "admit_after", "capacity", "ttl"});
          if (dynamic_hash && j.contains("dynamic") && !(j["dynamic"].is_boolean() && j["dynamic"].get<bool>()))
            fail(path + ".dynamic",
                 "a " + type + " column is dynamic; expected true or no member, got " + excerpt(j["dynamic"]));
          DynamicIdOptions o;
          o.admit_after = optional_int(j, path, "admit_after", o.admit_after, 0, kMaxDynamicAdmitAfter);
          o.capacity = optional_int(j, path, "capacity", o.capacity, 1, kMaxDynamicCapacity);
          o.ttl = optional_int(j, path, "ttl", o.ttl, 0, std::int64_t{1} << 40);
          return categorical_column_with_dynamic_hash(key(j, path), o);
        }
      }
      if (type == "hash_bucket" || type == "categorical_column_with_hash_bucket") {
        members(j, path, {"type", "key", "hash_bucket_size", "dynamic"});
        return categorical_column_with_hash_bucket(
            key(j, path), integer(required(j, path, "hash_bucket_size"), path + ".hash_bucket_size", 1, kMaxBuckets));
      }
      if (type == "vocabulary_list" || type == "categorical_column_with_vocabulary_list") {
        members(j, path, {"type", "key", "vocabulary", "num_oov_buckets", "default_value"});
        const Json& v = required(j, path, "vocabulary");
        if (!v.is_array()) fail(path + ".vocabulary", "expected an array of strings, got " + excerpt(v));
        std::vector<std::string> terms;
        for (std::size_t i = 0; i < v.size(); ++i) {
          if (!v[i].is_string()) fail(path + ".vocabulary[" + std::to_string(i) + "]", "expected a string, got " + excerpt(v[i]));
          terms.push_back(v[i].get<std::string>());
        }
        return categorical_column_with_vocabulary_list(key(j, path), std::move(terms), optional_int(j, path, "default_value", -1, -1, kMaxBuckets),
                                                       optional_int(j, path, "num_oov_buckets", 0, 0, kMaxBuckets));
      }
      if (type == "vocabulary_file" || type == "categorical_column_with_vocabulary_file") {
        members(j, path, {"type", "key", "vocabulary_file", "vocabulary_size", "num_oov_buckets", "default_value"});
        const Json& f = required(j, path, "vocabulary_file");
        if (!f.is_string() || f.get<std::string>().empty()) fail(path + ".vocabulary_file", "expected a file name, got " + excerpt(f));
        std::string file = f.get<std::string>();
        if (!base_dir_.empty() && file.front() != '/') file = base_dir_ + "/" + file;
        return categorical_column_with_vocabulary_file(key(j, path), file, optional_int(j, path, "vocabulary_size", -1, 1, kMaxBuckets),
                                                       optional_int(j, path, "num_oov_buckets", 0, 0, kMaxBuckets),
                                                       optional_int(j, path, "default_value", -1, -1, kMaxBuckets));
      }
      if (type == "crossed" || type == "crossed_column") {
        members(j, path, {"type", "keys", "hash_bucket_size", "hash_key"});
        const Json& k = required(j, path, "keys");
        if (!k.is_array()) fail(path + ".keys", "expected an array of column names and categorical columns, got " + excerpt(k));
        std::vector<CrossKey> keys;
        for (std::size_t i = 0; i < k.size(); ++i) {
          const std::string p = path + ".keys[" + std::to_string(i) + "]";
          if (k[i].is_string()) {
            if (k[i].get<std::string>().empty()) fail(p, "empty column name");
            keys.emplace_back(k[i].get<std::string>());
          } else {
            keys.emplace_back(categorical(k[i], p));
          }
        }
        std::uint64_t hash_key = kDefaultCrossHashKey;
        if (j.contains("hash_key")) {
          const Json& h = j["hash_key"];
          if (h.is_number_unsigned()) hash_key = h.get<std::uint64_t>();
          else if (h.is_number_integer() && h.get<std::int64_t>() >= 0) hash_key = static_cast<std::uint64_t>(h.get<std::int64_t>());
          else fail(path + ".hash_key", "expected an integer in [0, 2^64), got " + excerpt(h));
        }
        return crossed_column(std::move(keys), integer(required(j, path, "hash_bucket_size"), path + ".hash_bucket_size", 1, kMaxBuckets),
                              hash_key);
      }
      if (type == "embedding" || type == "embedding_column") {
        members(j, path, {"type", "categorical", "dimension", "combiner"});
        Combiner combiner = Combiner::kMean;
        if (j.contains("combiner")) {
          if (!j["combiner"].is_string()) fail(path + ".combiner", "expected \"mean\", \"sum\" or \"sqrtn\", got " + excerpt(j["combiner"]));
          combiner = parse_combiner(j["combiner"].get<std::string>(), origin_ + ": " + path + ".combiner");
        }
        const FeatureColumn cat = categorical(required(j, path, "categorical"), path + ".categorical");
        return embedding_column(cat, static_cast<int>(integer(required(j, path, "dimension"), path + ".dimension", 1, kMaxNumericShape)),
                                combiner);
      }
      if (type == "indicator" || type == "indicator_column") {
        members(j, path, {"type", "categorical"});
        return indicator_column(categorical(required(j, path, "categorical"), path + ".categorical"));
      }
    } catch (const ConfigError& e) {
      // A factory's own message; the nested readers' messages already start with the origin.
      const std::string& m = e.message();
      if (m.compare(0, origin_.size() + 2, origin_ + ": ") == 0) throw;
      fail(path, m);
    }
    fail(path + ".type",
         "unknown column type " + excerpt(*type_it) +
             " (numeric, bucketized, identity, hash_bucket, dynamic_hash, vocabulary_list, vocabulary_file, crossed, "
             "embedding, indicator)");
  }

 private:
  static constexpr std::int64_t kMaxBuckets = std::int64_t{1} << 48;

  FeatureColumn categorical(const Json& j, const std::string& path) const {
    FeatureColumn c = column(j, path);
    if (!c.is_categorical())
      fail(path, std::string("expected a categorical column (bucketized, identity, hash_bucket, vocabulary_list, ") +
                     "vocabulary_file or crossed), got " + to_string(c.kind));
    return c;
  }

  FeatureColumn numeric(const Json& j, const std::string& path) const {
    members(j, path, {"type", "key", "shape", "default_value", "normalizer"});
    const int shape = static_cast<int>(optional_int(j, path, "shape", 1, 1, kMaxNumericShape));
    std::optional<float> def;
    if (j.contains("default_value")) {
      const double v = number(j["default_value"], path + ".default_value");
      if (std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max())) fail(path + ".default_value", "outside float's range");
      def = static_cast<float>(v);
    }
    std::optional<Normalizer> norm;
    if (j.contains("normalizer")) {
      const Json& n = j["normalizer"];
      const std::string p = path + ".normalizer";
      if (!n.is_object()) fail(p, "expected {\"mean\": M, \"std\": S}, got " + excerpt(n));
      members(n, p, {"mean", "std"});
      norm = Normalizer{number(required(n, p, "mean"), p + ".mean"), number(required(n, p, "std"), p + ".std")};
      if (!(norm->std > 0)) fail(p + ".std", "expected a number > 0, got " + excerpt(n["std"]));
    }
    return numeric_column(key(j, path), shape, def, norm);
  }

  void members(const Json& j, const std::string& path, std::initializer_list<const char*> allowed) const {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return it.key() == a; })) {
        std::string list;
        for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        fail(path + "." + printable(it.key(), kMaxExcerpt), "unknown member (this column takes " + list + ")");
      }
    }
  }

  const Json& required(const Json& j, const std::string& path, const char* name) const {
    const auto it = j.find(name);
    if (it == j.end()) fail(path, std::string("missing \"") + name + "\"");
    return *it;
  }

  std::string key(const Json& j, const std::string& path) const {
    const Json& k = required(j, path, "key");
    if (!k.is_string() || k.get<std::string>().empty()) fail(path + ".key", "expected a column name, got " + excerpt(k));
    return k.get<std::string>();
  }

  double number(const Json& v, const std::string& path) const {
    if (!v.is_number()) fail(path, "expected a number, got " + excerpt(v));
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail(path, "expected a finite number");
    return x;
  }

  std::int64_t integer(const Json& v, const std::string& path, std::int64_t lo, std::int64_t hi) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) ||
        v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
      fail(path, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + excerpt(v));
    return v.get<std::int64_t>();
  }

  std::int64_t optional_int(const Json& j, const std::string& path, const char* name, std::int64_t fallback, std::int64_t lo,
                            std::int64_t hi) const {
    const auto it = j.find(name);
    return it == j.end() ? fallback : integer(*it, path + "." + name, lo, hi);
  }

  std::string origin_;
  std::string base_dir_;
};

}  // namespace

FeatureColumn feature_column_from_json(const Json& column, const std::string& origin, const std::string& path,
                                       const std::string& base_dir) {
  return Reader(origin, base_dir).column(column, path);
}

namespace {

constexpr std::size_t kMaxForKeys = 4096;

// "for_keys": an array of column names, or "PREFIXa..PREFIXb" (decimal a <= b, one prefix).
std::vector<std::string> for_keys(const Json& v, const std::string& origin, const std::string& path) {
  auto bad = [&](const std::string& problem) -> std::vector<std::string> { throw ConfigError(origin + ": " + path + ": " + problem); };
  std::vector<std::string> keys;
  if (v.is_array()) {
    if (v.empty() || v.size() > kMaxForKeys) return bad("expected 1 to 4096 column names, got " + std::to_string(v.size()));
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string() || v[i].get<std::string>().empty())
        return bad("[" + std::to_string(i) + "]: expected a column name, got " + excerpt(v[i]));
      keys.push_back(v[i].get<std::string>());
    }
    return keys;
  }
  const std::string text = v.is_string() ? v.get<std::string>() : std::string();
  const auto dots = text.find("..");
  // Splits "C12" into "C" and 12; false without a trailing number of at most 9 digits.
  auto split = [](const std::string& name, std::string& prefix, long& number) {
    std::size_t d = name.size();
    while (d > 0 && std::isdigit(static_cast<unsigned char>(name[d - 1]))) --d;
    // Zero-padded numbers ("C08") are refused rather than silently written without the padding.
    if (d == name.size() || name.size() - d > 9 || (name.size() - d > 1 && name[d] == '0')) return false;
    prefix = name.substr(0, d);
    number = std::stol(name.substr(d));
    return true;
  };
  std::string p1, p2;
  long a = 0, b = 0;
  if (dots == std::string::npos || !split(text.substr(0, dots), p1, a) || !split(text.substr(dots + 2), p2, b) || p1 != p2 ||
      a > b)
    return bad("expected an array of column names or a range like \"C1..C26\" (one prefix, numbers rising, no leading "
               "zeros), got " +
               excerpt(v));
  if (static_cast<std::size_t>(b - a) >= kMaxForKeys) return bad("the range has more than 4096 keys");
  for (long k = a; k <= b; ++k) keys.push_back(p1 + std::to_string(k));
  return keys;
}

// Sets the "key" of the column `j` (or of the column it wraps) to `key`; false when `j` is no
// column that reads one key (crossed reads several).
bool set_key(Json& j, const std::string& key) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return false;
  const std::string type = j["type"].get<std::string>();
  for (const char* wraps : {"categorical", "source"})
    if (j.contains(wraps)) return set_key(j[wraps], key);
  if (type.find("crossed") != std::string::npos) return false;
  j["key"] = key;
  return true;
}

// True when `j` or a column it wraps has a "key" of its own.
bool has_key(const Json& j) {
  if (!j.is_object()) return false;
  if (j.contains("key")) return true;
  for (const char* wraps : {"categorical", "source"})
    if (j.contains(wraps) && has_key(j[wraps])) return true;
  return false;
}

}  // namespace

std::vector<FeatureColumn> feature_columns_from_json(const Json& columns, const std::string& origin, const std::string& path,
                                                     const std::string& base_dir) {
  if (!columns.is_array()) throw ConfigError(origin + ": " + path + ": expected an array of feature columns, got " + excerpt(columns));
  if (columns.empty()) throw ConfigError(origin + ": " + path + ": the list is empty");
  const Reader reader(origin, base_dir);
  std::vector<FeatureColumn> out;
  for (std::size_t i = 0; i < columns.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    const Json& element = columns[i];
    if (element.is_object() && element.contains("for_pairs")) {
      // Every unordered pair of the listed keys, in list order: (k0,k1), (k0,k2), ..., (k1,k2), ...
      const std::vector<std::string> keys = for_keys(element["for_pairs"], origin, at + ".for_pairs");
      if (keys.size() < 2) throw ConfigError(origin + ": " + at + ".for_pairs: needs at least 2 keys to pair");
      if (element.contains("keys") || element.contains("for_keys"))
        throw ConfigError(origin + ": " + at + ": a column with \"for_pairs\" takes its keys from there; remove its \"keys\"");
      const std::string type = element.contains("type") && element["type"].is_string() ? element["type"].get<std::string>() : "";
      if (type != "crossed" && type != "crossed_column")
        throw ConfigError(origin + ": " + at + ": \"for_pairs\" needs a crossed column, got " + excerpt(element));
      const std::size_t pairs = keys.size() * (keys.size() - 1) / 2;
      if (out.size() + pairs > kMaxForKeys * 4)
        throw ConfigError(origin + ": " + path + ": more than " + std::to_string(kMaxForKeys * 4) + " columns (" +
                          std::to_string(pairs) + " pairs of " + std::to_string(keys.size()) + " keys)");
      for (std::size_t a = 0; a < keys.size(); ++a)
        for (std::size_t b = a + 1; b < keys.size(); ++b) {
          Json one = element;
          one.erase("for_pairs");
          one["keys"] = Json::array({keys[a], keys[b]});
          out.push_back(reader.column(one, at + " (keys " + printable(keys[a], kMaxExcerpt) + ", " + printable(keys[b], kMaxExcerpt) + ")"));
        }
      continue;
    }
    if (!element.is_object() || !element.contains("for_keys")) {
      out.push_back(reader.column(element, at));
      continue;
    }
    const std::vector<std::string> keys = for_keys(element["for_keys"], origin, at + ".for_keys");
    if (has_key(element))
      throw ConfigError(origin + ": " + at + ": a column with \"for_keys\" takes its key from there; remove its \"key\"");
    if (out.size() + keys.size() > kMaxForKeys * 4)
      throw ConfigError(origin + ": " + path + ": more than " + std::to_string(kMaxForKeys * 4) + " columns");
    for (const std::string& key : keys) {
      Json one = element;
      one.erase("for_keys");
      if (!set_key(one, key))
        throw ConfigError(origin + ": " + at + ": \"for_keys\" needs a column that reads one key (not crossed), got " +
                          excerpt(element));
      out.push_back(reader.column(one, at + " (key " + printable(key, kMaxExcerpt) + ")"));
    }
  }
  return out;
}

namespace {

[[noreturn]] void csv_fail(const std::string& origin, const std::string& path, const std::string& problem) {
  throw ConfigError(origin + ": " + path + ": " + problem);
}

char one_char(const Json& v, const std::string& origin, const std::string& path) {
  if (v.is_string()) {
    const std::string text = v.get<std::string>();
    if (text == "tab" || text == "\\t") return '\t';
    if (text.size() == 1 && text[0] != '"' && text[0] != '\n' && text[0] != '\r' && text[0] != '\0') return text[0];
  }
  csv_fail(origin, path, "expected one character (or \"tab\"), not a quote or a line break, got " + excerpt(v));
}

}  // namespace

CsvOptions csv_options_from_json(const Json& j, const std::string& origin, const std::string& path) {
  if (!j.is_object()) csv_fail(origin, path, "expected an object, got " + excerpt(j));
  const char* allowed[] = {"preset", "delimiter", "header", "columns", "max_record_bytes"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::none_of(std::begin(allowed), std::end(allowed), [&](const char* a) { return it.key() == a; }))
      csv_fail(origin, path + "." + printable(it.key(), kMaxExcerpt),
               "unknown member (preset, delimiter, header, columns, max_record_bytes)");
  CsvOptions o;
  if (j.contains("preset")) {
    const Json& p = j["preset"];
    if (!p.is_string() || p.get<std::string>() != "criteo")
      csv_fail(origin, path + ".preset", "unknown preset " + excerpt(p) + " (criteo)");
    if (j.contains("columns")) csv_fail(origin, path + ".columns", "cannot be combined with a preset");
    o = criteo_csv_options();
  }
  if (j.contains("delimiter")) o.delimiter = one_char(j["delimiter"], origin, path + ".delimiter");
  if (j.contains("header")) {
    const Json& h = j["header"];
    const std::string text = h.is_string() ? h.get<std::string>() : std::string();
    if (text == "detect") o.header = CsvHeader::kDetect;
    else if (text == "present") o.header = CsvHeader::kPresent;
    else if (text == "absent") o.header = CsvHeader::kAbsent;
    else csv_fail(origin, path + ".header", "expected \"detect\", \"present\" or \"absent\", got " + excerpt(h));
  }
  if (j.contains("max_record_bytes")) {
    const Json& m = j["max_record_bytes"];
    if (!m.is_number_unsigned() || m.get<std::uint64_t>() < 1 || m.get<std::uint64_t>() > (std::uint64_t{1} << 31))
      csv_fail(origin, path + ".max_record_bytes", "expected an integer in [1, 2^31], got " + excerpt(m));
    o.max_record_bytes = static_cast<std::size_t>(m.get<std::uint64_t>());
  }
  if (j.contains("columns")) {
    const Json& cols = j["columns"];
    if (!cols.is_array() || cols.empty()) csv_fail(origin, path + ".columns", "expected a non-empty array of columns, got " + excerpt(cols));
    for (std::size_t i = 0; i < cols.size(); ++i) {
      const std::string p = path + ".columns[" + std::to_string(i) + "]";
      const Json& c = cols[i];
      if (!c.is_object()) csv_fail(origin, p, "expected {\"name\": ..., \"type\": ...}, got " + excerpt(c));
      for (auto it = c.begin(); it != c.end(); ++it)
        if (it.key() != "name" && it.key() != "type" && it.key() != "default" && it.key() != "separator" &&
            it.key() != "max_values")
          csv_fail(origin, p + "." + printable(it.key(), kMaxExcerpt),
                   "unknown member (name, type, default, separator, max_values)");
      CsvColumn column;
      if (!c.contains("name") || !c["name"].is_string() || c["name"].get<std::string>().empty())
        csv_fail(origin, p + ".name", "expected a column name");
      column.name = c["name"].get<std::string>();
      if (c.contains("type")) {
        if (!c["type"].is_string()) csv_fail(origin, p + ".type", "expected \"int64\", \"float\" or \"string\", got " + excerpt(c["type"]));
        column.type = parse_csv_type(c["type"].get<std::string>(), origin + ": " + p + ".type");
      }
      if (c.contains("default")) {
        const Json& d = c["default"];
        if (d.is_string()) column.default_value = d.get<std::string>();
        else if (d.is_number()) column.default_value = d.dump();
        else csv_fail(origin, p + ".default", "expected a string or a number, got " + excerpt(d));
      }
      if (c.contains("separator")) column.separator = one_char(c["separator"], origin, p + ".separator");
      if (c.contains("max_values")) {
        const Json& m = c["max_values"];
        if (!column.separator || !m.is_number_unsigned() || m.get<std::uint64_t>() < 1 || m.get<std::uint64_t>() > 4096)
          csv_fail(origin, p + ".max_values", "expected an integer in [1, 4096] on a column with a separator, got " + excerpt(m));
        column.max_values = static_cast<int>(m.get<std::uint64_t>());
      }
      o.columns.push_back(std::move(column));
    }
  }
  return o;
}

CsvOptions parse_csv_options_json(std::string_view text, const std::string& origin) {
  check_json_depth(text, origin);
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw ConfigError(origin + " is not valid JSON: " + e.what());
  }
  return csv_options_from_json(doc, origin, "csv");
}

std::vector<FeatureColumn> parse_feature_columns_json(std::string_view text, const std::string& origin,
                                                      const std::string& base_dir) {
  check_json_depth(text, origin);
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw ConfigError(origin + " is not valid JSON: " + e.what());
  }
  if (doc.is_object()) {
    const auto it = doc.find("feature_columns");
    if (it == doc.end()) throw ConfigError(origin + ": no \"feature_columns\" member");
    return feature_columns_from_json(*it, origin, "feature_columns", base_dir);
  }
  return feature_columns_from_json(doc, origin, "feature_columns", base_dir);
}

}  // namespace strata::data
