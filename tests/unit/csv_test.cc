// Unit tests of the CSV/TSV reader (strata/data/csv.h): the RFC 4180 dialect (quotes, CRLF, a
// missing last newline, blank lines), header vs listed columns, record_defaults, typed and
// multi-valued columns, gzip, several files, the Criteo layout; and, in CsvSecurity, what hostile
// files do: every one is one ConfigError line naming file:line (and the column where there is
// one), never a crash or unbounded memory. Also regression targets in Dataset/Batch.
#include "common/test_util.h"
#include "strata/data/csv.h"
#include "strata/data/dataset.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "strata/common/error.h"

namespace strata::data {
namespace {

using strata::testing::config_error;
using strata::testing::Contains;

std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "strata_csv_" + info->test_suite_name() + "_" + info->name() + "_" + name;
}

std::string write_text(const std::string& name, const std::string& text, bool gzip = false) {
  const std::string path = temp_path(name);
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    if (!text.empty()) {
      EXPECT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
    }
    EXPECT_EQ(gzclose(f), Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
  }
  return path;
}

std::vector<std::string> strings(const CsvTable& t, const std::string& column, std::int64_t row) {
  const int c = t.column_index(column);
  std::vector<std::string> out;
  for (std::int64_t v = t.value_begin(c, row); v < t.value_end(c, row); ++v) out.emplace_back(t.string_value(c, v));
  return out;
}

CsvColumn col(const std::string& name, CsvType type, std::optional<std::string> def = std::nullopt, char sep = '\0') {
  return CsvColumn{name, type, std::move(def), sep};
}

TEST(CsvReader, HeaderNamesColumnsAsStrings) {
  const std::string path = write_text("a.csv", "name,age\nann,31\nbob,7\n");
  const CsvTable t = read_csv({path}, CsvOptions{});
  ASSERT_EQ(t.num_rows(), 2);
  ASSERT_EQ(t.columns().size(), 2u);
  EXPECT_EQ(t.columns()[1].name, "age");
  EXPECT_EQ(t.columns()[1].type, CsvType::kString);
  EXPECT_EQ(strings(t, "name", 1), std::vector<std::string>{"bob"});
  EXPECT_EQ(t.where(0), path + ":2");
  EXPECT_EQ(t.where(1), path + ":3");
  EXPECT_EQ(t.files(), std::vector<std::string>{path});
}

TEST(CsvReader, QuotedFieldsFollowRfc4180) {
  // A quoted field holds delimiters, doubled quotes and a line break; CRLF line ends; no newline
  // at the end of the file.
  const std::string path = write_text("q.csv", "a,b\r\n\"x,y\",\"say \"\"hi\"\"\"\r\n\"two\nlines\",\"\"\r\nplain,z");
  CsvOptions o;
  o.columns = {col("a", CsvType::kString), col("b", CsvType::kString, "")};
  const CsvTable t = read_csv({path}, o);
  ASSERT_EQ(t.num_rows(), 3);
  EXPECT_EQ(strings(t, "a", 0), std::vector<std::string>{"x,y"});
  EXPECT_EQ(strings(t, "b", 0), std::vector<std::string>{"say \"hi\""});
  EXPECT_EQ(strings(t, "a", 1), std::vector<std::string>{"two\nlines"});
  EXPECT_EQ(strings(t, "b", 1), std::vector<std::string>{""});  // "" is empty: the default
  EXPECT_EQ(strings(t, "b", 2), std::vector<std::string>{"z"});
  EXPECT_EQ(t.line(1), 3);
  EXPECT_EQ(t.line(2), 5);  // the quoted line break counts
}

TEST(CsvReader, ListedColumnsTypesAndDefaults) {
  // No header: the columns are listed. Empty fields take record_defaults; blank lines are skipped.
  const std::string path = write_text("t.csv", "1,2.5,x\n\n,,\n-7,+3e2,\"\"\n");
  CsvOptions o;
  o.header = CsvHeader::kAbsent;
  o.columns = {col("i", CsvType::kInt64, "42"), col("f", CsvType::kFloat, "-1.5"), col("s", CsvType::kString, "dflt")};
  const CsvTable t = read_csv({path}, o);
  ASSERT_EQ(t.num_rows(), 3);
  const int i = t.column_index("i"), f = t.column_index("f"), s = t.column_index("s");
  EXPECT_EQ(t.int_value(i, 0), 1);
  EXPECT_FLOAT_EQ(t.float_value(f, 0), 2.5f);
  EXPECT_EQ(t.int_value(i, 1), 42);
  EXPECT_FLOAT_EQ(t.float_value(f, 1), -1.5f);
  EXPECT_EQ(t.string_value(s, 1), "dflt");
  EXPECT_EQ(t.int_value(i, 2), -7);
  EXPECT_FLOAT_EQ(t.float_value(f, 2), 300.0f);
  EXPECT_EQ(t.string_value(s, 2), "dflt");
  EXPECT_EQ(t.line(1), 3);
  EXPECT_EQ(t.value_text(i, 2), "-7");
  EXPECT_THROW(t.float_value(i, 0), Error);  // no silent conversion between types
}

TEST(CsvReader, HeaderMapsListedColumnsByName) {
  // The header orders columns differently and has an extra one; detect recognises a header only
  // when it is exactly the listed names, so with kPresent the file may differ.
  const std::string path = write_text("h.csv", "extra,b,a\nq,2,1\n");
  CsvOptions o;
  o.header = CsvHeader::kPresent;
  o.columns = {col("a", CsvType::kInt64), col("b", CsvType::kInt64)};
  const CsvTable t = read_csv({path}, o);
  ASSERT_EQ(t.num_rows(), 1);
  EXPECT_EQ(t.int_value(t.column_index("a"), 0), 1);
  EXPECT_EQ(t.int_value(t.column_index("b"), 0), 2);
  EXPECT_EQ(t.column_index("extra"), -1);
  // kDetect: a first line equal to the listed names is a header, another first line is data.
  o.header = CsvHeader::kDetect;
  EXPECT_EQ(read_csv({write_text("d1.csv", "a,b\n1,2\n")}, o).num_rows(), 1);
  EXPECT_EQ(read_csv({write_text("d2.csv", "3,4\n1,2\n")}, o).num_rows(), 2);
  EXPECT_TRUE(Contains(config_error([&] { read_csv({write_text("d3.csv", "b,c\n1,2\n")}, [] {
                         CsvOptions p;
                         p.header = CsvHeader::kPresent;
                         p.columns = {col("a", CsvType::kInt64)};
                         return p;
                       }()); }),
                       "the header has no column 'a' (it has b, c)"));
}

TEST(CsvReader, MultiValuedColumnsSplitOnTheirSeparator) {
  const std::string path = write_text("m.csv", "id\ttags\tw\n1\ta|b|c\t1;2\n2\t\t\n3\tx||y|\t5\n");
  CsvOptions o;
  o.delimiter = '\t';
  o.columns = {col("id", CsvType::kInt64), col("tags", CsvType::kString, "", '|'), col("w", CsvType::kInt64, "", ';')};
  const CsvTable t = read_csv({path}, o);
  ASSERT_EQ(t.num_rows(), 3);
  EXPECT_EQ(strings(t, "tags", 0), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(strings(t, "tags", 1).empty());
  EXPECT_EQ(strings(t, "tags", 2), (std::vector<std::string>{"x", "y"}));  // empty tokens skipped
  const int w = t.column_index("w");
  EXPECT_EQ(t.value_end(w, 0) - t.value_begin(w, 0), 2);
  EXPECT_EQ(t.int_value(w, t.value_begin(w, 0) + 1), 2);
  EXPECT_EQ(t.value_end(w, 1) - t.value_begin(w, 1), 0);
  EXPECT_EQ(t.max_values(t.column_index("tags")), 3);
}

TEST(CsvReader, GzipAndSeveralFilesKeepFileProvenance) {
  const std::string a = write_text("a.csv.gz", "x,y\n1,2\n3,4\n", /*gzip=*/true);
  const std::string b = write_text("b.csv", "x,y\n5,6\n");
  CsvOptions o;
  o.columns = {col("x", CsvType::kInt64), col("y", CsvType::kInt64)};
  const CsvTable t = read_csv({a, b}, o);
  ASSERT_EQ(t.num_rows(), 3);
  EXPECT_EQ(t.files(), (std::vector<std::string>{a, b}));
  EXPECT_EQ(t.file_of(), (std::vector<std::int32_t>{0, 0, 1}));
  EXPECT_EQ(t.int_value(0, 2), 5);
  EXPECT_EQ(t.where(2), b + ":2");
}

// count_csv_rows (what a streamed input counts before its first epoch) gives the rows read_csv
// reads, over quotes holding line breaks, CRLF, blank lines, a header in every file (detected),
// gzip and a missing last newline; values are not parsed, so a bad one is left to the read, but
// the structure is checked with read_csv's own error.
TEST(CsvReader, CountMatchesTheRowsReadWithoutParsingValues) {
  const std::string a = write_text("a.csv.gz", "x,y\r\n1,\"two\nlines\"\r\n\r\n3,\"4,5\"\n", /*gzip=*/true);
  const std::string b = write_text("b.csv", "x,y\n\n5,6\n7,\"\"\"8\"\"\"");
  CsvOptions o;
  o.columns = {col("x", CsvType::kInt64), col("y", CsvType::kString)};
  EXPECT_EQ(read_csv({a, b}, o).num_rows(), 4);
  EXPECT_EQ(count_csv_rows({a, b}, o), 4);
  EXPECT_EQ(count_csv_rows({b}, o), 2);
  const std::string bad_value = write_text("bad_value.csv", "x,y\n1,a\nnot-a-number,b\n");
  EXPECT_TRUE(Contains(config_error([&] { read_csv({bad_value}, o); }), "column 'x'"));
  EXPECT_EQ(count_csv_rows({bad_value}, o), 2);
  const std::string short_row = write_text("short.csv", "x,y\n1,a\n2\n");
  const std::string want = config_error([&] { read_csv({short_row}, o); });
  EXPECT_TRUE(Contains(want, short_row + ":3: 1 fields, expected 2")) << want;
  EXPECT_EQ(config_error([&] { count_csv_rows({short_row}, o); }), want);
  const std::string open_quote = write_text("open.csv", "x,y\n1,\"a\n");
  EXPECT_EQ(config_error([&] { count_csv_rows({open_quote}, o); }), config_error([&] { read_csv({open_quote}, o); }));
  EXPECT_TRUE(Contains(config_error([&] { count_csv_rows({}, o); }), "no input files"));
}

TEST(CsvReader, ReadsCriteoRowsWithAndWithoutHeader) {
  // Two Criteo-style rows: label, 13 integers (some empty), 26 hex categories (some empty).
  std::string row1 = "1\t5\t\t-2", row2 = "0";
  for (int i = 4; i <= 13; ++i) row1 += "\t" + std::to_string(i);
  for (int i = 2; i <= 13; ++i) row2 += "\t";
  row2 += "\t";
  for (int i = 1; i <= 26; ++i) {
    row1 += i == 3 ? "\t" : "\t68fd1e64";
    row2 += i == 26 ? "\tbe589b51" : "\t";
  }
  const CsvOptions criteo = criteo_csv_options();
  ASSERT_EQ(criteo.columns.size(), 40u);
  const CsvTable t = read_csv({write_text("day_0", row1 + "\n" + row2 + "\n")}, criteo);
  ASSERT_EQ(t.num_rows(), 2);
  EXPECT_EQ(t.int_value(t.column_index("label"), 0), 1);
  EXPECT_EQ(t.int_value(t.column_index("I1"), 0), 5);
  EXPECT_EQ(t.int_value(t.column_index("I2"), 0), 0);  // empty: the default 0
  EXPECT_EQ(t.int_value(t.column_index("I3"), 0), -2);
  EXPECT_EQ(t.int_value(t.column_index("I13"), 0), 13);
  EXPECT_EQ(t.string_value(t.column_index("C1"), 0), "68fd1e64");
  EXPECT_EQ(t.string_value(t.column_index("C3"), 0), "");
  EXPECT_EQ(t.string_value(t.column_index("C26"), 1), "be589b51");
  // The same rows behind a header line naming the 40 columns.
  std::string header = "label";
  for (int i = 1; i <= 13; ++i) header += "\tI" + std::to_string(i);
  for (int i = 1; i <= 26; ++i) header += "\tC" + std::to_string(i);
  const CsvTable h = read_csv({write_text("with_header.tsv", header + "\n" + row1 + "\n" + row2 + "\n")}, criteo);
  ASSERT_EQ(h.num_rows(), 2);
  EXPECT_EQ(h.line(0), 2);
  EXPECT_EQ(h.string_value(h.column_index("C26"), 1), "be589b51");
}

// ---- hostile input ------------------------------------------------------------------------------

CsvOptions two_ints() {
  CsvOptions o;
  o.columns = {col("a", CsvType::kInt64), col("b", CsvType::kFloat)};
  return o;
}

TEST(CsvSecurity, BadRecordsNameFileLineAndColumn) {
  const CsvOptions o = two_ints();
  struct Case {
    std::string text, expect;
  } cases[] = {
      {"a,b\n1,2\n3\n", ":3: 1 fields, expected 2"},
      {"a,b\n1,2,3\n", ":2: 3 fields, expected 2"},
      {"a,b\n1,2\nx1,2\n", ":3: column 'a': 'x1' is not an integer"},
      {"a,b\n1,nan\n", ":2: column 'b': 'nan' is not a finite number"},
      {"a,b\n1,1e39\n", ":2: column 'b': '1e39' is not a finite number within float's range"},
      {"a,b\n99999999999999999999,1\n", ":2: column 'a': '99999999999999999999' is not an integer"},
      {"a,b\n,1\n", ":2: column 'a' is empty and has no default"},
      {"a,b\n1,\"2\" x\n", ":2: text after the closing quote of field 2"},
      {"a,b\n1,2\"\n", ":2: field 2 '2\"' has a quote but does not start with one"},
      {"a,b\n1,\"2\n3,4\n", ":2: quoted field not closed before the end of the file"},
      {std::string("a,b\n1,2\0\n", 9), ":2: NUL byte"},
  };
  for (const Case& c : cases) {
    const std::string path = write_text("bad.csv", c.text);
    const std::string message = config_error([&] { read_csv({path}, o); });
    EXPECT_TRUE(Contains(message, path + c.expect)) << c.text;
  }
}

TEST(CsvSecurity, BadHeadersAreRefused) {
  const std::string dup = write_text("dup.csv", "a,a\n1,2\n");
  EXPECT_TRUE(Contains(config_error([&] { read_csv({dup}, CsvOptions{}); }), dup + ":1: the header names column 'a' twice"));
  const std::string control = write_text("control.csv", "\"a\nb\",c\n1,2\n");
  EXPECT_TRUE(Contains(config_error([&] { read_csv({control}, CsvOptions{}); }),
                       control + ":1: header field 1 'a?b' has a control character"));
  const std::string empty = write_text("empty.csv", "a,,c\n1,2,3\n");
  EXPECT_TRUE(Contains(config_error([&] { read_csv({empty}, CsvOptions{}); }), empty + ":1: header field 2 is empty"));
}

TEST(CsvSecurity, OverlongRecordIsRefusedAtItsLine) {
  CsvOptions o = two_ints();
  o.max_record_bytes = 64;
  const std::string path = write_text("long.csv", "a,b\n1,2\n1," + std::string(100, '7') + "\n");
  EXPECT_TRUE(Contains(config_error([&] { read_csv({path}, o); }), path + ":3: record longer than 64 bytes"));
  // A file with no newline at all (one giant quoted field) is bounded the same way.
  const std::string quote = write_text("quote.csv", "a,b\n\"" + std::string(1000, 'x'));
  EXPECT_TRUE(Contains(config_error([&] { read_csv({quote}, o); }), quote + ":2: record longer than 64 bytes"));
}

TEST(CsvSecurity, TruncatedOrCorruptGzipIsAnError) {
  std::string text = "a,b\n";
  for (int i = 0; i < 20000; ++i) text += std::to_string(i) + "," + std::to_string(i * 3) + "\n";
  const std::string good = write_text("good.csv.gz", text, true);
  EXPECT_EQ(read_csv({good}, two_ints()).num_rows(), 20000);
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = write_text("cut.csv.gz", bytes.substr(0, bytes.size() / 2));
  EXPECT_TRUE(Contains(config_error([&] { read_csv({cut}, two_ints()); }), cut + ": corrupt or truncated gzip data"));
  std::string flipped = bytes;
  for (std::size_t i = 20; i < 60 && i < flipped.size(); ++i) flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
  const std::string bad = write_text("flipped.csv.gz", flipped);
  EXPECT_TRUE(Contains(config_error([&] { read_csv({bad}, two_ints()); }), bad + ":"));
}

TEST(CsvSecurity, BadOptionsAreRefusedBeforeReading) {
  const std::string path = write_text("x.csv", "a,b\n1,2\n");
  CsvOptions o = two_ints();
  o.columns[0].default_value = "zero";
  EXPECT_TRUE(Contains(config_error([&] { read_csv({path}, o); }), "column 'a': default 'zero': 'zero' is not an integer"));
  o = two_ints();
  o.columns[1].name = "a";
  EXPECT_TRUE(Contains(config_error([&] { read_csv({path}, o); }), "column 'a' appears twice"));
  o = two_ints();
  o.columns[0].separator = ',';
  EXPECT_TRUE(Contains(config_error([&] { read_csv({path}, o); }), "cannot be the delimiter"));
  o = CsvOptions{};
  o.header = CsvHeader::kAbsent;
  EXPECT_TRUE(Contains(config_error([&] { read_csv({path}, o); }), "nothing names the columns"));
  EXPECT_TRUE(Contains(config_error([&] { read_csv({}, two_ints()); }), "no input files"));
  EXPECT_TRUE(Contains(config_error([&] { read_csv({temp_path("missing.csv")}, two_ints()); }), "missing.csv: cannot open"));
  EXPECT_TRUE(Contains(config_error([] { parse_csv_type("int32", "--x"); }), "--x: unknown column type 'int32'"));
}

TEST(CsvSecurity, LaterFilesMustNameTheFirstFilesColumns) {
  const std::string a = write_text("a.csv", "x,y\n1,2\n");
  const std::string b = write_text("b.csv", "x,z\n1,2\n");
  EXPECT_TRUE(Contains(config_error([&] { read_csv({a, b}, CsvOptions{}); }), b + ":1: the header names columns x, z"));
}

TEST(CsvSecurity, MutatedFilesGiveRowsOrOneLineErrors) {
  // Bounded fuzzing: random byte edits (quotes, delimiters, separators, line breaks, NUL, high
  // bytes, truncation) of a valid file; each read either succeeds with consistent rows or throws
  // one ConfigError line. Deterministic (fixed seed), so a failure reproduces.
  const std::string base = "a,b,tags\n1,2.5,x|y\n\"3\",4,\"q,\"\"r\"\"\"\n-5,,z\n";
  CsvOptions o;
  o.columns = {col("a", CsvType::kInt64), col("b", CsvType::kFloat, "0"), col("tags", CsvType::kString, "", '|')};
  o.max_record_bytes = 256;
  const char alphabet[] = {'"', ',', '|', '\n', '\r', '\0', '7', 'e', '-', '\xff', ' '};
  std::uint64_t seed = 12345;
  const auto next = [&seed](std::uint64_t n) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (seed >> 33) % n;
  };
  int ok = 0, refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(next(4));
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = static_cast<std::size_t>(next(text.size() + 1));
      switch (next(3)) {
        case 0: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), alphabet[next(sizeof alphabet)]); break;
        case 1: if (at < text.size()) text[at] = alphabet[next(sizeof alphabet)]; break;
        default: text.resize(at); break;
      }
    }
    const std::string path = write_text("fuzz.csv", text);
    // The count agrees with the read wherever the read succeeds (so it refuses only what the read
    // refuses; the read may stop earlier, at a bad value the count does not parse).
    std::int64_t counted = -1;
    std::string count_error;
    try {
      counted = count_csv_rows({path}, o);
    } catch (const ConfigError& e) {
      count_error = e.message();
    }
    try {
      const CsvTable t = read_csv({path}, o);
      ++ok;
      EXPECT_EQ(counted, t.num_rows()) << count_error;
      for (std::int64_t r = 0; r < t.num_rows(); ++r) {
        EXPECT_EQ(t.value_end(0, r) - t.value_begin(0, r), 1);
        EXPECT_LE(t.value_begin(2, r), t.value_end(2, r));
      }
    } catch (const ConfigError& e) {
      ++refused;
      EXPECT_EQ(e.message().find('\n'), std::string::npos) << e.message();
      EXPECT_EQ(e.message().compare(0, path.size(), path), 0) << e.message();
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(refused, 0);
}

// ---- regression targets -------------------------------------------------------------------------

TEST(Targets, TravelThroughValidateConcatenateBatchesAndSplits) {
  Dataset d;
  d.size = 5;
  d.dense_dim = 1;
  d.features = {0, 1, 2, 3, 4};
  d.targets = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f};
  validate(d);  // targets without labels is a regression dataset
  Dataset bad = d;
  bad.targets.pop_back();
  EXPECT_THROW(validate(bad), Error);
  bad = d;
  bad.targets[2] = std::nanf("");
  EXPECT_THROW(validate(bad), Error);
  bad = d;
  bad.targets.clear();
  EXPECT_THROW(validate(bad), Error);  // neither labels nor targets

  const Dataset both = concatenate({d, d});
  ASSERT_EQ(both.targets.size(), 10u);
  EXPECT_TRUE(both.labels.empty());
  EXPECT_FLOAT_EQ(both.targets[7], 2.5f);
  Dataset classes;
  classes.size = 1;
  classes.dense_dim = 1;
  classes.features = {0};
  classes.labels = {0};
  classes.num_classes = 2;
  EXPECT_TRUE(Contains(config_error([&] { concatenate({d, classes}); }), "part 1 has class labels and no regression targets"));

  BatchIterator it(d, {4, 0, 2}, 2, false);
  Batch b;
  ASSERT_TRUE(it.next(b));
  EXPECT_EQ(b.targets, (std::vector<float>{4.5f, 0.5f}));
  EXPECT_TRUE(b.labels.empty());
  const std::vector<Batch> parts = split_batch(b, 2);
  EXPECT_EQ(parts[0].targets, std::vector<float>{4.5f});
  EXPECT_EQ(parts[1].targets, std::vector<float>{0.5f});
  ASSERT_TRUE(it.next(b));
  EXPECT_EQ(b.targets, std::vector<float>{2.5f});
  EXPECT_FALSE(it.next(b));
}

}  // namespace
}  // namespace strata::data
