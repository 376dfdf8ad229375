// CSV/TSV input (docs/DATA.md has the user-facing description).
//
// read_csv loads delimited text files into an in-memory column store, CsvTable, which the feature
// columns (feature_column.h) turn into a data::Dataset. The dialect is RFC 4180 with a choice of
// delimiter:
//  - one record per line, LF or CRLF line ends, the last line's end optional; blank lines skipped;
//  - a field that starts with '"' is quoted: it ends at the next lone '"', "" inside stands for
//    one '"', and it may hold delimiters and line breaks; after the closing quote comes the
//    delimiter or the end of the record. A '"' inside an unquoted field is an error (as in TF's
//    decode_csv), so a stray quote never silently swallows the rest of the file;
//  - every record has exactly as many fields as the header (or the listed columns);
//  - files may be gzip-compressed (told apart by the gzip magic; zlib reads both kinds);
//    truncated or corrupt gzip data is an error, not an early end of file.
// Columns are named by a header line or listed by the caller (CsvOptions::columns); each has a
// type (int64, float or string) and optionally a default (TensorFlow's record_defaults): an empty
// field takes the default, and in a column without one an empty field is an error. A column with
// a separator is multi-valued: "a|b|c" holds three values (empty tokens are skipped, so an empty
// field holds none once its default, "" for instance, is allowed).
//
// Hostile input: every error is a ConfigError whose one line names the file, the line and the
// column ("data.csv:17: column 'I3': 'x1' is not an integer"). A record longer than
// max_record_bytes (default 1 MiB) is an error at that line, so memory per record is bounded
// whatever the file holds; the table itself grows with the data, like any in-memory dataset.
//
// Thread-safety: read_csv is reentrant; a CsvTable is immutable after it is returned.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::data {

enum class CsvType { kInt64, kFloat, kString };
// "int64", "float", "string".
const char* to_string(CsvType type);
// Parses the names above ("int" and "double" are accepted too); ConfigError naming `what`.
CsvType parse_csv_type(std::string_view text, std::string_view what);

struct CsvColumn {
  std::string name;
  CsvType type = CsvType::kString;
  // record_defaults: the text an empty field stands for (parsed as `type`, split by `separator`);
  // nullopt makes the column required. Checked by read_csv before any file is opened.
  std::optional<std::string> default_value;
  // Multi-valued when not '\0': the field is split on this character. Must differ from the
  // delimiter, '"', '\r' and '\n'.
  char separator = '\0';
  // Multi-valued only: when > 0, a row holding more values is an error at its line, and the
  // feature columns size this column's id slots by this bound instead of by the most values the
  // training rows hold, so streamed data (whose rows are not all seen when the layout is planned)
  // gets a fixed layout.
  int max_values = 0;
};

enum class CsvHeader {
  kDetect,   // the first record of a file is a header when its fields are exactly the listed
             // column names, in order; with no columns listed, it is always a header
  kPresent,  // the first record of every file is a header
  kAbsent,   // no header; the columns must be listed and appear in the listed order
};

struct CsvOptions {
  char delimiter = ',';  // ',' or '\t' (any byte but '"', '\r', '\n' works)
  CsvHeader header = CsvHeader::kDetect;
  // The columns to read. With a header, each is found by name (fields the header names but this
  // list does not are skipped); with no list, every header column is read as a required string.
  std::vector<CsvColumn> columns;
  std::size_t max_record_bytes = std::size_t{1} << 20;
};

// Criteo's click-log layout: TSV, columns `label` (int64, required), `I1`..`I13` (int64, default
// 0: Criteo leaves many empty), `C1`..`C26` (string, default "": the categorical columns drop an
// empty value, as TensorFlow does, so a missing category gives no id). Header kDetect: Criteo's
// own files have none, a file whose first line names these 40 columns is read too.
CsvOptions criteo_csv_options();

// The column store read_csv fills. Values of a row in column c are the value indices
// [value_begin(c, r), value_end(c, r)): exactly one for a single-valued column, any number for a
// multi-valued one.
class CsvTable {
 public:
  std::int64_t num_rows() const { return static_cast<std::int64_t>(line_.size()); }
  const std::vector<CsvColumn>& columns() const { return columns_; }
  // The column's index, or -1.
  int column_index(std::string_view name) const;
  // The column's index; ConfigError "<what>: no column '<name>' (columns: a, b, ...)" otherwise.
  int require_column(std::string_view name, std::string_view what) const;

  std::int64_t value_begin(int column, std::int64_t row) const;
  std::int64_t value_end(int column, std::int64_t row) const;
  // Typed access to value v of a column of that type; the accessor of another type is an Error
  // (no silent conversion).
  std::int64_t int_value(int column, std::int64_t v) const;
  float float_value(int column, std::int64_t v) const;
  std::string_view string_value(int column, std::int64_t v) const;
  // The value's text: the string itself, or an int64 in decimal (TensorFlow's as_string), or a
  // float in the shortest form that reads back to it.
  std::string value_text(int column, std::int64_t v) const;
  // The most values any row holds in the column (1 for a single-valued column with rows).
  std::int64_t max_values(int column) const;

  // Provenance, for FILE sharding and messages: the files read, each row's file and line.
  const std::vector<std::string>& files() const { return files_; }
  const std::vector<std::int32_t>& file_of() const { return file_of_; }
  std::int64_t line(std::int64_t row) const { return line_[static_cast<std::size_t>(row)]; }
  // "file:line" of a row.
  std::string where(std::int64_t row) const;

  struct Store {
    std::vector<std::int64_t> ints;
    std::vector<float> floats;
    std::string chars;                 // string values, back to back
    std::vector<std::uint64_t> ends;   // end offset in `chars` of each string value
    std::vector<std::uint64_t> row_end;  // multi-valued only: end value index of each row
  };

 private:
  friend class CsvTableBuilder;
  std::vector<CsvColumn> columns_;
  std::vector<Store> stores_;
  std::vector<std::string> files_;
  std::vector<std::int32_t> file_of_;
  std::vector<std::int64_t> line_;
};

// CSV options from JSON text (an object; docs/DATA.md "CSV options in JSON"):
//   {"preset": "criteo"?, "delimiter": ","?, "header": "detect"?, "columns": [{"name": N,
//    "type": "int64" | "float" | "string", "default": TEXT?, "separator": "|"?}, ...]?,
//    "max_record_bytes": N?}
// ConfigError naming `origin` and the member's path ("csv.columns[2].type: ...").
CsvOptions parse_csv_options_json(std::string_view text, const std::string& origin);

// Reads `paths` in order into one table (files() lists them, for FILE sharding). ConfigError as
// described at the top. An empty path list is an error.
CsvTable read_csv(const std::vector<std::string>& paths, const CsvOptions& options);

// The rows read_csv would return for these files, counted without parsing or storing any value:
// records, headers and field counts are checked as read_csv checks them (the same one-line
// errors), values are not (a bad value is reported when the rows are read). Memory is bounded by
// one record; reentrant.
std::int64_t count_csv_rows(const std::vector<std::string>& paths, const CsvOptions& options);

// The same files read a chunk of rows at a time, for data larger than memory: memory is one
// chunk plus one record, whatever the files' size. Each chunk is a CsvTable with the same columns
// whose files() lists every file opened so far (file_of indexes it) and whose rows carry their
// file:line. Errors are read_csv's, raised by the next() that meets them. One thread at a time;
// movable.
class CsvStream {
 public:
  CsvStream(std::vector<std::string> paths, CsvOptions options);
  ~CsvStream();
  CsvStream(CsvStream&&) noexcept;
  CsvStream& operator=(CsvStream&&) noexcept;

  // Replaces `chunk` with the next up to max_rows rows (>= 1); false when none remain.
  bool next(CsvTable& chunk, std::int64_t max_rows);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace strata::data
