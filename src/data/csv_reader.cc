// CSV/TSV reader: a byte-level record splitter over a zlib stream, then field parsing into a
// typed column store. csv.h states the dialect and the error contract.
//
// Records are assembled before they are split so that a quoted field may hold line breaks: a
// newline ends the record only outside a quoted field (pump() tracks the RFC 4180 quote state). The record buffer is bounded by max_record_bytes, which is what bounds memory against
// a file with no newline at all.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/common/error.h"
#include "data/text_util.h"
#include "strata/data/csv.h"

namespace strata::data {
namespace {

constexpr std::size_t kChunkBytes = std::size_t{1} << 18;
constexpr std::size_t kMaxColumns = 1 << 16;

std::string quoted(std::string_view text) { return "'" + printable(text) + "'"; }

std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 12; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 12) out += ", ... (" + std::to_string(names.size()) + " columns)";
  return out;
}

std::string_view trim_spaces(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Strict, locale-independent numbers: the whole (space-trimmed) text must parse.
bool parse_int64_text(std::string_view text, std::int64_t& out) {
  text = trim_spaces(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty() || text.front() == '+') return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool parse_float_text(std::string_view text, float& out) {
  text = trim_spaces(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty() || text.front() == '+') return false;
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) return false;
  if (std::fabs(value) > static_cast<double>(std::numeric_limits<float>::max())) return false;
  out = static_cast<float>(value);
  return true;
}

// Reads a file through zlib (gzip or plain bytes: gzread passes non-gzip data through) in
// chunks. Truncation and corruption are found through gzerror, which gzread alone would report
// as an ordinary end of file.
class ByteSource {
 public:
  explicit ByteSource(const std::string& path) : path_(path) {
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
    buffer_.resize(kChunkBytes);
  }
  ~ByteSource() {
    if (file_ != nullptr) gzclose(file_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // The next chunk; empty at the end of the file.
  std::string_view next() {
    const int got = gzread(file_, buffer_.data(), static_cast<unsigned>(buffer_.size()));
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (got < 0 || (code != Z_OK && code != Z_STREAM_END))
      throw ConfigError(path_ + ": corrupt or truncated gzip data (zlib: " +
                        (message != nullptr && *message != '\0' ? message : "unknown error") + ")");
    return std::string_view(buffer_.data(), static_cast<std::size_t>(got));
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  std::vector<char> buffer_;
};

}  // namespace

// Appends parsed rows to a CsvTable; one per read_csv call.
class CsvTableBuilder {
 public:
  // count_only: records are found and split as for a table (so the count is exactly the rows a
  // read would give, and the structure is checked: quotes, field counts, headers), but their
  // values are neither parsed nor stored; rows() counts them.
  CsvTableBuilder(const CsvOptions& options, CsvTable& table, bool count_only = false)
      : options_(options), table_(table), count_only_(count_only) {
    for (unsigned char c : {static_cast<unsigned char>('\n'), static_cast<unsigned char>('"'), static_cast<unsigned char>('\0'),
                            static_cast<unsigned char>(options.delimiter)})
      special_[c] = true;
  }

  // Starts reading `path` (the next file of the table).
  void open(const std::string& path) {
    file_index_ = static_cast<std::int32_t>(table_.files_.size());
    table_.files_.push_back(path);
    path_ = path;
    first_record_ = true;
    source_ = std::make_unique<ByteSource>(path);
    chunk_ = std::string_view();
    pos_ = 0;
    record_.clear();
    state_ = State::kFieldStart;
    line_ = record_line_ = 1;
  }

  // Reads records of the open file until the table holds `until_rows` rows or the file ends;
  // returns false (and closes the file) at its end.
  //
  // Quote state per RFC 4180: a quote opens a quoted field only at the field's start; inside
  // one, a quote either escapes the next quote or closes the field. Anything else (a quote inside
  // an unquoted field, text after a closing quote) stays in the record for split() to report at
  // its line, and never changes where the record ends.
  bool pump(std::int64_t until_rows) {
    const char delimiter = options_.delimiter;
    for (;;) {
      if (pos_ == chunk_.size()) {
        chunk_ = source_->next();
        pos_ = 0;
        if (chunk_.empty()) break;
      }
      while (pos_ < chunk_.size()) {
        // Ordinary bytes (no quote, delimiter, line break or NUL) are copied a run at a time.
        std::size_t run = pos_;
        while (run < chunk_.size() && !special_[static_cast<unsigned char>(chunk_[run])]) ++run;
        if (run > pos_) {
          if (record_.size() + (run - pos_) > options_.max_record_bytes)
            fail(record_line_, "record longer than " + std::to_string(options_.max_record_bytes) + " bytes");
          record_.append(chunk_.data() + pos_, run - pos_);
          if (state_ != State::kQuoted) state_ = State::kUnquoted;
          pos_ = run;
          if (pos_ == chunk_.size()) break;
        }
        const char c = chunk_[pos_++];
        if (c == '\n') {
          ++line_;
          if (state_ != State::kQuoted) {
            finish_record(record_, record_line_);
            record_.clear();
            record_line_ = line_;
            state_ = State::kFieldStart;
            if (rows() >= until_rows) return true;
            continue;
          }
        } else if (c == '\0') {
          fail(line_, "NUL byte in the text (is this a binary file?)");
        } else if (c == '"') {
          if (state_ == State::kFieldStart) state_ = State::kQuoted;
          else if (state_ == State::kQuoted) state_ = State::kQuoteInQuoted;
          else if (state_ == State::kQuoteInQuoted) state_ = State::kQuoted;
        } else if (c == delimiter && state_ != State::kQuoted) {
          state_ = State::kFieldStart;
        }
        if (record_.size() >= options_.max_record_bytes)
          fail(record_line_, "record longer than " + std::to_string(options_.max_record_bytes) + " bytes");
        record_.push_back(c);
      }
    }
    if (state_ == State::kQuoted) fail(record_line_, "quoted field not closed before the end of the file");
    if (!record_.empty()) finish_record(record_, record_line_);
    record_.clear();
    source_.reset();
    return false;
  }

  // Rows taken so far: the table's, or those counted (count_only).
  std::int64_t rows() const { return count_only_ ? counted_ : table_.num_rows(); }

  // Empties the table's rows, keeping its columns and files, for the next chunk of a stream.
  void clear_rows() {
    for (CsvTable::Store& s : table_.stores_) s = CsvTable::Store{};
    table_.file_of_.clear();
    table_.line_.clear();
  }

  // Set the schema from options when it lists columns; checks defaults and separators.
  void prepare() {
    const char d = options_.delimiter;
    if (d == '"' || d == '\r' || d == '\n' || d == '\0')
      throw ConfigError(std::string("csv: the delimiter cannot be ") + (d == '\0' ? "NUL" : quoted(std::string(1, d))));
    if (options_.max_record_bytes < 1) throw ConfigError("csv: max_record_bytes must be at least 1");
    if (options_.columns.empty() && options_.header == CsvHeader::kAbsent)
      throw ConfigError("csv: no header and no columns listed: nothing names the columns");
    if (options_.columns.size() > kMaxColumns)
      throw ConfigError("csv: " + std::to_string(options_.columns.size()) + " columns listed, at most " +
                        std::to_string(kMaxColumns));
    if (!options_.columns.empty()) set_schema(options_.columns, "csv columns");
  }

 private:
  [[noreturn]] void fail(std::int64_t line, const std::string& problem) const {
    throw ConfigError(path_ + ":" + std::to_string(line) + ": " + problem);
  }

  void set_schema(const std::vector<CsvColumn>& columns, const std::string& origin) {
    std::unordered_map<std::string, int> seen;
    for (const CsvColumn& col : columns) {
      if (col.name.empty()) throw ConfigError(origin + ": a column has an empty name");
      if (has_control(col.name)) throw ConfigError(origin + ": column name " + quoted(col.name) + " has a control character");
      if (!seen.emplace(col.name, 0).second) throw ConfigError(origin + ": column '" + col.name + "' appears twice");
      if (col.max_values < 0 || (col.max_values > 0 && col.separator == '\0'))
        throw ConfigError(origin + ": column '" + col.name + "': max_values " + std::to_string(col.max_values) +
                          " needs a multi-valued column (a separator) and must not be negative");
      const char s = col.separator;
      if (s != '\0' && (s == options_.delimiter || s == '"' || s == '\r' || s == '\n'))
        throw ConfigError(origin + ": column '" + col.name + "': separator " + quoted(std::string(1, s)) +
                          " cannot be the delimiter, a quote or a line break");
    }
    table_.columns_ = columns;
    table_.stores_.assign(columns.size(), CsvTable::Store{});
    defaults_.assign(columns.size(), CsvTable::Store{});
    // Defaults are parsed once, into a one-row store per column, so a bad default is reported
    // before any file is read and an empty field later costs a copy, not a parse.
    for (std::size_t c = 0; c < columns.size(); ++c) {
      if (!columns[c].default_value) continue;
      std::string problem;
      if (!append_values(columns[c], *columns[c].default_value, defaults_[c], problem))
        throw ConfigError(origin + ": column '" + columns[c].name + "': default " + quoted(*columns[c].default_value) +
                          ": " + problem);
    }
  }

  // Parses one field's text into `store` (one value, or the separator's tokens); false with
  // `problem` set when a value does not parse as the column's type.
  static bool append_values(const CsvColumn& col, std::string_view text, CsvTable::Store& store, std::string& problem) {
    auto append_one = [&](std::string_view token) {
      switch (col.type) {
        case CsvType::kInt64: {
          std::int64_t v = 0;
          if (!parse_int64_text(token, v)) {
            problem = quoted(token) + " is not an integer (int64)";
            return false;
          }
          store.ints.push_back(v);
          return true;
        }
        case CsvType::kFloat: {
          float v = 0;
          if (!parse_float_text(token, v)) {
            problem = quoted(token) + " is not a finite number within float's range";
            return false;
          }
          store.floats.push_back(v);
          return true;
        }
        case CsvType::kString:
          store.chars.append(token.data(), token.size());
          store.ends.push_back(store.chars.size());
          return true;
      }
      return false;
    };
    if (col.separator == '\0') return append_one(text);
    std::size_t start = 0;
    while (start <= text.size()) {
      std::size_t stop = text.find(col.separator, start);
      if (stop == std::string_view::npos) stop = text.size();
      if (stop > start && !append_one(text.substr(start, stop - start))) return false;
      start = stop + 1;
    }
    return true;
  }

  static std::uint64_t value_count(const CsvColumn& col, const CsvTable::Store& store) {
    switch (col.type) {
      case CsvType::kInt64: return store.ints.size();
      case CsvType::kFloat: return store.floats.size();
      case CsvType::kString: return store.ends.size();
    }
    return 0;
  }

  // Splits `record` into fields_: views into the record for unquoted fields, into unescaped_
  // for quoted ones (reserved to the record's size first, so the views stay valid).
  void split(const std::string& record, std::int64_t line) {
    fields_.clear();
    unescaped_.clear();
    unescaped_.reserve(record.size());
    const char d = options_.delimiter;
    const std::string_view rec(record);
    std::size_t pos = 0;
    for (;;) {
      std::string_view field;
      if (pos < rec.size() && rec[pos] == '"') {
        ++pos;
        const std::size_t begin = unescaped_.size();
        for (;;) {
          if (pos >= rec.size()) fail(line, "quoted field " + std::to_string(fields_.size() + 1) + " is not closed");
          const char c = rec[pos];
          if (c == '"') {
            if (pos + 1 < rec.size() && rec[pos + 1] == '"') {
              unescaped_.push_back('"');
              pos += 2;
              continue;
            }
            ++pos;
            break;
          }
          unescaped_.push_back(c);
          ++pos;
        }
        field = std::string_view(unescaped_).substr(begin);
        if (pos < rec.size() && rec[pos] != d)
          fail(line, "text after the closing quote of field " + std::to_string(fields_.size() + 1));
      } else {
        std::size_t stop = rec.find(d, pos);
        if (stop == std::string_view::npos) stop = rec.size();
        field = rec.substr(pos, stop - pos);
        if (field.find('"') != std::string_view::npos)
          fail(line, "field " + std::to_string(fields_.size() + 1) + " " + quoted(field) +
                         " has a quote but does not start with one");
        pos = stop;
      }
      fields_.push_back(field);
      if (fields_.size() > kMaxColumns) fail(line, "more than " + std::to_string(kMaxColumns) + " fields");
      if (pos >= rec.size()) break;
      ++pos;  // the delimiter
      if (pos == rec.size()) {  // a trailing delimiter: one last, empty field
        fields_.emplace_back();
        break;
      }
    }
  }

  void finish_record(std::string& record, std::int64_t line) {
    if (!record.empty() && record.back() == '\r') record.pop_back();
    if (record.empty()) return;
    split(record, line);
    if (first_record_) {
      first_record_ = false;
      if (is_header()) {
        map_header(line);
        return;
      }
      map_listed();
    }
    if (fields_.size() != expected_fields_)
      fail(line, std::to_string(fields_.size()) + " fields, expected " + std::to_string(expected_fields_) +
                     (header_names_.empty() ? "" : " (the header's columns: " + list_names(header_names_) + ")"));
    if (count_only_) {
      ++counted_;
      return;
    }
    std::string problem;
    for (std::size_t c = 0; c < table_.columns_.size(); ++c) {
      const CsvColumn& col = table_.columns_[c];
      CsvTable::Store& store = table_.stores_[c];
      const std::string_view text = fields_[static_cast<std::size_t>(field_of_column_[c])];
      if (text.empty()) {
        if (!col.default_value) fail(line, "column '" + col.name + "' is empty and has no default");
        const CsvTable::Store& def = defaults_[c];
        store.ints.insert(store.ints.end(), def.ints.begin(), def.ints.end());
        store.floats.insert(store.floats.end(), def.floats.begin(), def.floats.end());
        for (std::size_t v = 0; v < def.ends.size(); ++v) {
          const std::uint64_t begin = v == 0 ? 0 : def.ends[v - 1];
          store.chars.append(def.chars, static_cast<std::size_t>(begin), static_cast<std::size_t>(def.ends[v] - begin));
          store.ends.push_back(store.chars.size());
        }
      } else if (!append_values(col, text, store, problem)) {
        fail(line, "column '" + col.name + "': " + problem);
      }
      if (col.separator != '\0') {
        const std::uint64_t end = value_count(col, store);
        const std::uint64_t begin = store.row_end.empty() ? 0 : store.row_end.back();
        if (col.max_values > 0 && end - begin > static_cast<std::uint64_t>(col.max_values))
          fail(line, "column '" + col.name + "' holds " + std::to_string(end - begin) + " values, at most " +
                         std::to_string(col.max_values) + " (its max_values)");
        store.row_end.push_back(end);
      }
    }
    table_.file_of_.push_back(file_index_);
    table_.line_.push_back(line);
  }

  bool is_header() const {
    if (options_.header == CsvHeader::kPresent) return true;
    if (options_.header == CsvHeader::kAbsent) return false;
    if (options_.columns.empty()) return true;
    if (fields_.size() != options_.columns.size()) return false;
    for (std::size_t i = 0; i < fields_.size(); ++i)
      if (fields_[i] != options_.columns[i].name) return false;
    return true;
  }

  void map_header(std::int64_t line) {
    header_names_.assign(fields_.begin(), fields_.end());
    std::unordered_map<std::string, int> index;
    for (std::size_t i = 0; i < header_names_.size(); ++i) {
      if (header_names_[i].empty()) fail(line, "header field " + std::to_string(i + 1) + " is empty");
      if (has_control(header_names_[i]))
        fail(line, "header field " + std::to_string(i + 1) + " " + quoted(header_names_[i]) + " has a control character");
      if (!index.emplace(header_names_[i], static_cast<int>(i)).second)
        fail(line, "the header names column '" + printable(header_names_[i]) + "' twice");
    }
    if (table_.columns_.empty()) {
      std::vector<CsvColumn> columns;
      for (const std::string& name : header_names_) columns.push_back(CsvColumn{name, CsvType::kString, std::nullopt, '\0'});
      set_schema(columns, path_ + ":" + std::to_string(line));
    } else if (options_.columns.empty()) {
      // Columns taken from the first file's header: later files must name the same ones.
      std::vector<std::string> names;
      for (const CsvColumn& col : table_.columns_) names.push_back(col.name);
      if (names != header_names_)
        fail(line, "the header names columns " + list_names(header_names_) + ", the first file's names " +
                       list_names(names));
    }
    field_of_column_.clear();
    for (const CsvColumn& col : table_.columns_) {
      const auto it = index.find(col.name);
      if (it == index.end()) fail(line, "the header has no column '" + col.name + "' (it has " + list_names(header_names_) + ")");
      field_of_column_.push_back(it->second);
    }
    expected_fields_ = header_names_.size();
  }

  void map_listed() {
    if (table_.columns_.empty()) throw ConfigError(path_ + ": no header and no columns listed");
    header_names_.clear();
    field_of_column_.resize(table_.columns_.size());
    for (std::size_t c = 0; c < field_of_column_.size(); ++c) field_of_column_[c] = static_cast<int>(c);
    expected_fields_ = table_.columns_.size();
  }

  enum class State { kFieldStart, kUnquoted, kQuoted, kQuoteInQuoted };
  bool special_[256] = {};
  const CsvOptions& options_;
  CsvTable& table_;
  const bool count_only_;
  std::int64_t counted_ = 0;
  std::unique_ptr<ByteSource> source_;
  std::string_view chunk_;
  std::size_t pos_ = 0;
  std::string record_;
  State state_ = State::kFieldStart;
  std::int64_t line_ = 1, record_line_ = 1;
  std::vector<CsvTable::Store> defaults_;
  std::string path_;
  std::int32_t file_index_ = 0;
  bool first_record_ = true;
  std::vector<std::string_view> fields_;
  std::string unescaped_;
  std::vector<std::string> header_names_;
  std::vector<int> field_of_column_;
  std::size_t expected_fields_ = 0;
};

const char* to_string(CsvType type) {
  switch (type) {
    case CsvType::kInt64: return "int64";
    case CsvType::kFloat: return "float";
    case CsvType::kString: return "string";
  }
  return "?";
}

CsvType parse_csv_type(std::string_view text, std::string_view what) {
  if (text == "int64" || text == "int") return CsvType::kInt64;
  if (text == "float" || text == "double") return CsvType::kFloat;
  if (text == "string") return CsvType::kString;
  throw ConfigError(std::string(what) + ": unknown column type " + quoted(text) + " (int64, float or string)");
}

CsvOptions criteo_csv_options() {
  CsvOptions options;
  options.delimiter = '\t';
  options.header = CsvHeader::kDetect;
  options.columns.push_back(CsvColumn{"label", CsvType::kInt64, std::nullopt, '\0'});
  for (int i = 1; i <= 13; ++i) options.columns.push_back(CsvColumn{"I" + std::to_string(i), CsvType::kInt64, "0", '\0'});
  for (int i = 1; i <= 26; ++i) options.columns.push_back(CsvColumn{"C" + std::to_string(i), CsvType::kString, "", '\0'});
  return options;
}

int CsvTable::column_index(std::string_view name) const {
  for (std::size_t c = 0; c < columns_.size(); ++c)
    if (columns_[c].name == name) return static_cast<int>(c);
  return -1;
}

int CsvTable::require_column(std::string_view name, std::string_view what) const {
  const int c = column_index(name);
  if (c >= 0) return c;
  std::vector<std::string> names;
  for (const CsvColumn& col : columns_) names.push_back(col.name);
  throw ConfigError(std::string(what) + ": no column '" + printable(name) + "' in the data (columns: " +
                    list_names(names) + ")");
}

std::int64_t CsvTable::value_begin(int column, std::int64_t row) const {
  const Store& s = stores_.at(static_cast<std::size_t>(column));
  if (columns_[static_cast<std::size_t>(column)].separator == '\0') return row;
  return row == 0 ? 0 : static_cast<std::int64_t>(s.row_end.at(static_cast<std::size_t>(row - 1)));
}

std::int64_t CsvTable::value_end(int column, std::int64_t row) const {
  const Store& s = stores_.at(static_cast<std::size_t>(column));
  if (columns_[static_cast<std::size_t>(column)].separator == '\0') return row + 1;
  return static_cast<std::int64_t>(s.row_end.at(static_cast<std::size_t>(row)));
}

std::int64_t CsvTable::int_value(int column, std::int64_t v) const {
  STRATA_CHECK(columns_.at(static_cast<std::size_t>(column)).type == CsvType::kInt64, "column '",
               columns_[static_cast<std::size_t>(column)].name, "' is not an int64 column");
  return stores_[static_cast<std::size_t>(column)].ints.at(static_cast<std::size_t>(v));
}

float CsvTable::float_value(int column, std::int64_t v) const {
  STRATA_CHECK(columns_.at(static_cast<std::size_t>(column)).type == CsvType::kFloat, "column '",
               columns_[static_cast<std::size_t>(column)].name, "' is not a float column");
  return stores_[static_cast<std::size_t>(column)].floats.at(static_cast<std::size_t>(v));
}

std::string_view CsvTable::string_value(int column, std::int64_t v) const {
  STRATA_CHECK(columns_.at(static_cast<std::size_t>(column)).type == CsvType::kString, "column '",
               columns_[static_cast<std::size_t>(column)].name, "' is not a string column");
  const Store& s = stores_[static_cast<std::size_t>(column)];
  const auto i = static_cast<std::size_t>(v);
  const std::uint64_t begin = i == 0 ? 0 : s.ends.at(i - 1);
  return std::string_view(s.chars).substr(static_cast<std::size_t>(begin), static_cast<std::size_t>(s.ends.at(i) - begin));
}

std::string CsvTable::value_text(int column, std::int64_t v) const {
  switch (columns_.at(static_cast<std::size_t>(column)).type) {
    case CsvType::kInt64: return std::to_string(int_value(column, v));
    case CsvType::kFloat: {
      char buf[32];
      const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, float_value(column, v));
      return ec == std::errc() ? std::string(buf, end) : std::string();
    }
    case CsvType::kString: return std::string(string_value(column, v));
  }
  return {};
}

std::int64_t CsvTable::max_values(int column) const {
  std::int64_t most = 0;
  for (std::int64_t r = 0; r < num_rows(); ++r) most = std::max(most, value_end(column, r) - value_begin(column, r));
  return most;
}

std::string CsvTable::where(std::int64_t row) const {
  const auto r = static_cast<std::size_t>(row);
  return files_.at(static_cast<std::size_t>(file_of_.at(r))) + ":" + std::to_string(line_.at(r));
}

// Every record of `paths`, in order, through `builder` (read_csv and count_csv_rows).
static void read_all(const std::vector<std::string>& paths, CsvTableBuilder& builder) {
  if (paths.empty()) throw ConfigError("csv: no input files");
  if (paths.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw ConfigError("csv: too many input files");
  builder.prepare();
  for (const std::string& path : paths) {
    builder.open(path);
    while (builder.pump(std::numeric_limits<std::int64_t>::max())) {
    }
  }
}

CsvTable read_csv(const std::vector<std::string>& paths, const CsvOptions& options) {
  CsvTable table;
  CsvTableBuilder builder(options, table);
  read_all(paths, builder);
  return table;
}

std::int64_t count_csv_rows(const std::vector<std::string>& paths, const CsvOptions& options) {
  CsvTable table;
  CsvTableBuilder builder(options, table, /*count_only=*/true);
  read_all(paths, builder);
  return builder.rows();
}

struct CsvStream::State {
  explicit State(std::vector<std::string> p, CsvOptions o)
      : paths(std::move(p)), options(std::move(o)), builder(options, table) {}
  std::vector<std::string> paths;
  CsvOptions options;
  CsvTable table;
  CsvTableBuilder builder;
  std::size_t next_file = 0;
  bool open = false;
};

CsvStream::CsvStream(std::vector<std::string> paths, CsvOptions options) {
  if (paths.empty()) throw ConfigError("csv: no input files");
  if (paths.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw ConfigError("csv: too many input files");
  state_ = std::make_unique<State>(std::move(paths), std::move(options));
  state_->builder.prepare();
}

CsvStream::~CsvStream() = default;
CsvStream::CsvStream(CsvStream&&) noexcept = default;
CsvStream& CsvStream::operator=(CsvStream&&) noexcept = default;

bool CsvStream::next(CsvTable& chunk, std::int64_t max_rows) {
  if (max_rows < 1) throw ConfigError("csv stream: max_rows is " + std::to_string(max_rows) + ", expected >= 1");
  State& s = *state_;
  s.builder.clear_rows();
  while (s.table.num_rows() < max_rows) {
    if (!s.open) {
      if (s.next_file == s.paths.size()) break;
      s.builder.open(s.paths[s.next_file++]);
      s.open = true;
    }
    if (!s.builder.pump(max_rows)) s.open = false;
  }
  chunk = s.table;
  return chunk.num_rows() > 0;
}

}  // namespace strata::data
