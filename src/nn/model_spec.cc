// JSON model files: see strata/nn/model_spec.h.
#include "strata/nn/model_spec.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "data/feature_column_json.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"
#include "strata/nn/graph.h"
#include "strata/ps/optimizer.h"

namespace strata::nn {
namespace {

using Json = nlohmann::ordered_json;

// One line quoting a value, however large.
std::string excerpt(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 60) + "...";
  return s;
}

class Reader {
 public:
  // `prefix`: the object's own member path ("csv."), so errors name "file: csv.delimiter: ...".
  Reader(const Json& doc, std::string origin, std::string prefix = "")
      : doc_(doc), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ConfigError(origin_ + ": " + prefix_ + path + ": " + what);
  }
  bool has(const char* key) const { return doc_.contains(key); }
  const Json& at(const char* key) const { return doc_.at(key); }

  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const Json& v = at(key);
    if (!v.is_string()) fail(key, "expected a string, got " + excerpt(v));
    return v.get<std::string>();
  }
  std::int64_t integer(const char* key, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const {
    if (!has(key)) return fallback;
    return integer_value(at(key), key, lo, hi);
  }
  std::int64_t integer_value(const Json& v, const std::string& path, std::int64_t lo, std::int64_t hi) const {
    std::int64_t x = 0;
    if (v.is_number_integer()) {
      x = v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi) ? hi + 1 : v.get<std::int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
               std::fabs(v.get<double>()) < 9e15) {
      x = static_cast<std::int64_t>(v.get<double>());
    } else {
      fail(path, "expected an integer, got " + excerpt(v));
    }
    if (x < lo || x > hi)
      fail(path, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + excerpt(v));
    return x;
  }
  double number(const char* key, double fallback, double lo, double hi_exclusive) const {
    if (!has(key)) return fallback;
    const Json& v = at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, "expected a number, got " + excerpt(v));
    const double x = v.get<double>();
    if (x < lo || x >= hi_exclusive)
      fail(key, "expected a number in [" + format_double(lo) + ", " + format_double(hi_exclusive) + "), got " + excerpt(v));
    return x;
  }
  std::vector<int> widths(const char* key) const {
    std::vector<int> out;
    if (!has(key)) return out;
    const Json& v = at(key);
    if (!v.is_array()) fail(key, "expected an array of layer widths, got " + excerpt(v));
    if (v.size() > 64) fail(key, "at most 64 layers, got " + std::to_string(v.size()));
    for (std::size_t i = 0; i < v.size(); ++i)
      out.push_back(static_cast<int>(integer_value(v[i], std::string(key) + "[" + std::to_string(i) + "]", 1, 1 << 16)));
    return out;
  }

 private:
  static std::string format_double(double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  }
  const Json& doc_;
  std::string origin_;
  std::string prefix_;
};

Activation parse_activation(const Reader& r, const char* key) {
  const std::string a = r.string(key, "relu");
  if (a == "relu") return Activation::kRelu;
  if (a == "tanh") return Activation::kTanh;
  if (a == "sigmoid") return Activation::kSigmoid;
  if (a == "linear" || a == "none") return Activation::kNone;
  r.fail(key, "'" + a + "' is not relu, tanh, sigmoid or linear");
}

// The CSV dialect of the spec's "csv" member; column types come from the feature columns.
data::CsvOptions parse_csv(const Json& doc, const Reader& top, const std::string& origin,
                           const std::vector<data::FeatureColumn>& columns, const data::LabelSpec& label) {
  const Json empty = Json::object();
  const Json& csv = doc.contains("csv") ? doc.at("csv") : empty;
  if (!csv.is_object()) top.fail("csv", "expected an object, got " + excerpt(csv));
  static const std::set<std::string> kKeys{"layout", "delimiter", "header", "columns", "separators"};
  for (const auto& [k, v] : csv.items())
    if (!kKeys.count(k)) top.fail("csv." + k, "unknown member (expected layout, delimiter, header, columns, separators)");
  Reader r(csv, origin, "csv.");
  const std::string layout = r.string("layout", "");
  if (!layout.empty()) {
    if (layout != "criteo") r.fail("layout", "'" + layout + "' is not criteo");
    for (const char* k : {"delimiter", "header", "columns", "separators"})
      if (csv.contains(k)) r.fail(k, "does not go with layout criteo (its layout is fixed)");
    return data::criteo_csv_options();
  }
  data::CsvOptions opt;
  const std::string delim = r.string("delimiter", ",");
  if (delim == "\t" || delim == "tab") opt.delimiter = '\t';
  else if (delim.size() == 1 && delim != "\"" && delim != "\r" && delim != "\n") opt.delimiter = delim[0];
  else r.fail("delimiter", "expected one character (or \"tab\"), got '" + delim + "'");
  bool header = true;
  if (csv.contains("header")) {
    if (!csv.at("header").is_boolean()) r.fail("header", "expected true or false, got " + excerpt(csv.at("header")));
    header = csv.at("header").get<bool>();
  }
  std::vector<data::CsvColumn> used = data::csv_columns_for(columns, label);
  if (csv.contains("columns")) {
    const Json& names = csv.at("columns");
    if (!names.is_array() || names.empty()) r.fail("columns", "expected a non-empty array of column names");
    std::vector<data::CsvColumn> listed;
    std::set<std::string> seen;
    for (std::size_t i = 0; i < names.size(); ++i) {
      const std::string path = "columns[" + std::to_string(i) + "]";
      if (!names[i].is_string() || names[i].get<std::string>().empty())
        r.fail(path, "expected a column name, got " + excerpt(names[i]));
      const std::string name = names[i].get<std::string>();
      if (!seen.insert(name).second) r.fail(path, "column '" + name + "' is listed twice");
      data::CsvColumn c{name, data::CsvType::kString, std::string(), '\0'};
      for (const auto& u : used)
        if (u.name == name) c = u;
      listed.push_back(c);
    }
    for (const auto& u : used)
      if (!seen.count(u.name)) r.fail("columns", "does not list column '" + u.name + "', which the model reads");
    opt.columns = std::move(listed);
  } else {
    if (!header) r.fail("header", "false needs \"columns\": the names of the file's columns, in order");
    opt.columns = std::move(used);
  }
  opt.header = header ? data::CsvHeader::kPresent : data::CsvHeader::kAbsent;
  if (csv.contains("separators")) {
    const Json& seps = csv.at("separators");
    if (!seps.is_object()) r.fail("separators", "expected an object: column name -> one character");
    for (const auto& [name, sep] : seps.items()) {
      const std::string path = "separators." + name;
      if (!sep.is_string() || sep.get<std::string>().size() != 1) r.fail(path, "expected one character, got " + excerpt(sep));
      const char c = sep.get<std::string>()[0];
      if (c == opt.delimiter || c == '"' || c == '\r' || c == '\n')
        r.fail(path, "the separator must differ from the delimiter, '\"' and line ends");
      bool found = false;
      for (auto& col : opt.columns)
        if (col.name == name) {
          col.separator = c;
          found = true;
        }
      if (!found) r.fail(path, "no column '" + name + "' is read");
    }
  }
  return opt;
}

std::vector<data::FeatureColumn> columns_member(const Json& doc, const char* key, const std::string& origin,
                                                const std::string& base_dir, const Reader& r) {
  const Json& v = doc.at(key);
  if (!v.is_array() || v.empty()) r.fail(key, "expected a non-empty array of feature columns");
  return data::feature_columns_from_json(v, origin, key, base_dir);
}

}  // namespace

ModelSpec parse_model_spec(std::string_view text, const std::string& origin, const std::string& base_dir) {
  if (static_cast<std::int64_t>(text.size()) > kMaxModelSpecBytes)
    throw ConfigError(origin + ": larger than " + std::to_string(kMaxModelSpecBytes) + " bytes");
  check_json_depth(text, origin);
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw ConfigError(origin + " is not valid JSON: " + e.what());
  }
  if (!doc.is_object()) throw ConfigError(origin + ": expected a JSON object (the model spec), got " + excerpt(doc));
  const Reader r(doc, origin);
  if (!doc.contains("estimator")) r.fail("estimator", "missing (e.g. \"DNNLinearCombinedClassifier\")");
  ModelSpec spec;
  EstimatorConfig& e = spec.estimator;
  e.kind = parse_estimator_kind(r.string("estimator", ""), origin + ": estimator");
  const bool combined =
      e.kind == EstimatorKind::kDNNLinearCombinedClassifier || e.kind == EstimatorKind::kDNNLinearCombinedRegressor;
  const bool linear = e.kind == EstimatorKind::kLinearClassifier || e.kind == EstimatorKind::kLinearRegressor;
  const bool dlrm = e.kind == EstimatorKind::kDLRM;
  // The members each estimator takes (TensorFlow's argument names).
  std::set<std::string> allowed{"estimator", "label", "scope", "csv", "optimizer", "learning_rate", "epochs",
                                "batch_size", "seed"};
  if (!is_regressor(e.kind)) allowed.insert("n_classes");
  if (combined) {
    for (const char* k : {"linear_feature_columns", "dnn_feature_columns", "dnn_hidden_units", "dnn_dropout",
                          "dnn_activation", "linear_optimizer", "dnn_optimizer", "linear_learning_rate",
                          "dnn_learning_rate"})
      allowed.insert(k);
  } else if (linear) {
    allowed.insert("feature_columns");
  } else if (dlrm) {
    for (const char* k : {"feature_columns", "bottom_units", "top_units", "dropout", "activation"}) allowed.insert(k);
  } else {
    for (const char* k : {"feature_columns", "hidden_units", "dropout", "activation"}) allowed.insert(k);
  }
  for (const auto& [k, v] : doc.items())
    if (!allowed.count(k)) r.fail(k, std::string("unknown member for ") + to_string(e.kind));

  if (!is_regressor(e.kind)) e.n_classes = static_cast<int>(r.integer("n_classes", 2, 2, 1 << 20));
  e.scope = r.string("scope", "");
  // The graph's own rule for scope names, checked now so the error names the member.
  try {
    (void)Graph(e.scope);
  } catch (const ConfigError& err) {
    std::string why = err.what();
    if (why.rfind("nn: ", 0) == 0) why = why.substr(4);
    r.fail("scope", why);
  }
  e.seed = static_cast<std::uint64_t>(r.integer("seed", 0, 0, std::int64_t{1} << 53));
  spec.label.key = r.string("label", "label");
  if (spec.label.key.empty()) r.fail("label", "expected a column name");
  spec.label.regression = is_regressor(e.kind);
  spec.label.num_classes = is_regressor(e.kind) ? 0 : e.n_classes;

  if (combined) {
    for (const char* k : {"linear_feature_columns", "dnn_feature_columns"})
      if (!doc.contains(k)) r.fail(k, "missing");
    e.linear_feature_columns = columns_member(doc, "linear_feature_columns", origin, base_dir, r);
    e.dnn_feature_columns = columns_member(doc, "dnn_feature_columns", origin, base_dir, r);
    e.hidden_units = r.widths("dnn_hidden_units");
    if (e.hidden_units.empty()) r.fail("dnn_hidden_units", "missing or empty (e.g. [256, 128])");
    e.dropout = r.number("dnn_dropout", 0, 0, 1);
    e.activation = parse_activation(r, "dnn_activation");
  } else {
    if (!doc.contains("feature_columns")) r.fail("feature_columns", "missing");
    auto cols = columns_member(doc, "feature_columns", origin, base_dir, r);
    if (linear) {
      e.linear_feature_columns = std::move(cols);
    } else {
      e.dnn_feature_columns = std::move(cols);
      e.dropout = r.number("dropout", 0, 0, 1);
      e.activation = parse_activation(r, "activation");
      if (dlrm) {
        e.bottom_units = r.widths("bottom_units");
        e.hidden_units = r.widths("top_units");
        if (e.bottom_units.empty()) r.fail("bottom_units", "missing or empty (e.g. [64, 16]; the last is the embedding dimension)");
      } else {
        e.hidden_units = r.widths("hidden_units");
        if (e.hidden_units.empty()) r.fail("hidden_units", "missing or empty (e.g. [256, 128])");
      }
    }
  }
  spec.csv = parse_csv(doc, r, origin, input_columns(e), spec.label);
  spec.optimizer = r.string("optimizer", "");
  // Checked here, so a bad one is refused naming the spec's member (not a flag) before any rank
  // starts.
  if (!spec.optimizer.empty()) {
    try {
      (void)ps::OptimizerConfig::parse(spec.optimizer);
    } catch (const ConfigError& e) {
      std::string why = e.what();
      for (const char* flag : {"--optimizer: ", "--optimizer "})
        if (why.rfind(flag, 0) == 0) why = why.substr(std::string(flag).size());
      r.fail("optimizer", why);
    }
  }
  if (combined) {
    // Each part's optimizer (estimator.h): named ones always, TensorFlow's defaults (FTRL, Adagrad)
    // only when the spec names no job-wide "optimizer".
    e.linear_optimizer = r.string("linear_optimizer", "");
    e.dnn_optimizer = r.string("dnn_optimizer", "");
    for (const char* k : {"linear_optimizer", "dnn_optimizer"})
      if (doc.contains(k) && doc.at(k).get<std::string>().empty()) r.fail(k, "expected an optimizer (e.g. \"ftrl\")");
    e.linear_learning_rate = r.number("linear_learning_rate", 0, 0, 1e6);
    e.dnn_learning_rate = r.number("dnn_learning_rate", 0, 0, 1e6);
    for (const char* k : {"linear_learning_rate", "dnn_learning_rate"})
      if (doc.contains(k) && doc.at(k).get<double>() <= 0) r.fail(k, "must be positive");
    e.part_optimizer_defaults = spec.optimizer.empty();
    try {
      (void)part_optimizers(e);
    } catch (const ConfigError& err) {
      // part_optimizers names the member first ("dnn_optimizer: ..."): the spec's path.
      const std::string why = err.message();
      const auto colon = why.find(": ");
      if (colon == std::string::npos) r.fail("linear_optimizer", why);
      std::string rest = why.substr(colon + 2);
      for (const char* flag : {"--optimizer: ", "--optimizer "})
        if (rest.rfind(flag, 0) == 0) rest = rest.substr(std::string(flag).size());
      r.fail(why.substr(0, colon), rest);
    }
  }
  spec.learning_rate = r.number("learning_rate", 0, 0, 1e6);
  if (doc.contains("learning_rate") && spec.learning_rate <= 0) r.fail("learning_rate", "must be positive");
  spec.epochs = static_cast<int>(r.integer("epochs", 0, 1, 1 << 20));
  spec.batch_size = static_cast<int>(r.integer("batch_size", 0, 1, 1 << 24));
  return spec;
}

ModelSpec load_model_spec(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError("--model-spec: '" + path + "' is not a readable file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || static_cast<std::int64_t>(size) > kMaxModelSpecBytes)
    throw ConfigError("--model-spec: '" + path + "' is larger than " + std::to_string(kMaxModelSpecBytes) + " bytes");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("--model-spec: cannot open '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  const std::string base = std::filesystem::path(path).parent_path().string();
  return parse_model_spec(text.str(), path, base);
}

}  // namespace strata::nn
