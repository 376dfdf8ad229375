// Unit tests of `strata data synth-ctr` (src/cli/synth_ctr.h): determinism in the seed (bytes,
// whatever the file split, and a golden digest so another platform that differs is caught),
// the Criteo layout, the planted model's oracle AUC, and option checking.
#include "cli/synth_ctr.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "strata/common/parse.h"
#include "strata/train/metrics.h"

namespace strata::cli {
namespace {

using strata::testing::config_error;
using strata::testing::Contains;

std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "strata_synth_" + std::to_string(::getpid()) + "_" + info->name() + "_" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return "";
  std::string out;
  char buf[65536];
  int got = 0;
  while ((got = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(got));
  gzclose(f);
  return out;
}

void remove_outputs(const SynthCtrSummary& s, const std::string& out) {
  for (const auto& f : s.files) std::remove(f.c_str());
  std::remove((out + ".json").c_str());
}

SynthCtrOptions options(const std::string& out, std::uint64_t rows, std::uint64_t seed = 1) {
  SynthCtrOptions o;
  o.out = out;
  o.rows = rows;
  o.seed = seed;
  return o;
}

// Flag text from up to 10 strings: rows, seed, out, files, vocab, zipf, missing, id-bits, days,
// churn (missing ones empty).
SynthCtrFlagText flag_text(std::vector<std::string> a, bool header = false) {
  a.resize(10);
  SynthCtrFlagText t;
  t.rows = a[0];
  t.seed = a[1];
  t.out = a[2];
  t.files = a[3];
  t.vocab = a[4];
  t.zipf = a[5];
  t.missing = a[6];
  t.id_bits = a[7];
  t.days = a[8];
  t.churn = a[9];
  t.header = header;
  return t;
}

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

TEST(SynthCtrTest, DetExpAndLogMatchLibmClosely) {
  for (double x = -740; x < 709; x += 0.731) {
    const double want = std::exp(x);
    EXPECT_NEAR(det_exp(x), want, 4e-16 * want) << x;
  }
  for (double x : {0.0, 1e-300, -0.0}) EXPECT_NEAR(det_exp(x), std::exp(x), 1e-300);
  EXPECT_EQ(det_exp(-800), 0.0);
  EXPECT_TRUE(std::isinf(det_exp(800)));
  for (double x = 1e-300; x < 1e300; x *= 1.7371) {
    const double want = std::log(x);
    EXPECT_NEAR(det_log(x), want, 4e-16 * std::fabs(want) + 1e-300) << x;
  }
  EXPECT_EQ(det_log(1.0), 0.0);
  EXPECT_NEAR(det_log(2.0), 0.6931471805599453, 1e-16);
}

TEST(SynthCtrTest, CriteoLayoutWithHeaderAndHexValues) {
  const std::string out = temp_path("layout.tsv");
  SynthCtrOptions o = options(out, 2000);
  o.header = true;
  o.missing = 0.1;
  const SynthCtrSummary s = write_synth_ctr(o);
  ASSERT_EQ(s.files, std::vector<std::string>{out});
  std::istringstream in(read_file(out));
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  std::string expected_header = "label";
  for (int j = 1; j <= 13; ++j) expected_header += "\tI" + std::to_string(j);
  for (int f = 1; f <= 26; ++f) expected_header += "\tC" + std::to_string(f);
  EXPECT_EQ(line, expected_header);
  std::uint64_t rows = 0, positives = 0, empty = 0, fields = 0;
  while (std::getline(in, line)) {
    ++rows;
    const std::vector<std::string> cols = split(line, '\t');
    ASSERT_EQ(cols.size(), 40u) << line;
    ASSERT_TRUE(cols[0] == "0" || cols[0] == "1") << line;
    positives += cols[0] == "1";
    for (int j = 1; j <= 13; ++j) {
      ++fields;
      if (cols[j].empty()) { ++empty; continue; }
      EXPECT_EQ(cols[j].find_first_not_of("0123456789"), std::string::npos) << cols[j];
      EXPECT_LE(std::stoll(cols[j]), 200);
    }
    for (int f = 14; f < 40; ++f) {
      ++fields;
      if (cols[f].empty()) { ++empty; continue; }
      EXPECT_EQ(cols[f].size(), 8u) << cols[f];
      EXPECT_EQ(cols[f].find_first_not_of("0123456789abcdef"), std::string::npos) << cols[f];
    }
  }
  EXPECT_EQ(rows, 2000u);
  EXPECT_EQ(positives, s.positives);
  // --missing 0.1: about a tenth of the 78,000 fields are empty.
  EXPECT_NEAR(static_cast<double>(empty) / static_cast<double>(fields), 0.1, 0.01);
  // The JSON next to the data is the line printed.
  EXPECT_EQ(read_file(out + ".json"), s.json + "\n");
  EXPECT_TRUE(Contains(s.json, "\"oracle_auc\":"));
  EXPECT_TRUE(Contains(s.json, "\"rows\":2000"));
  remove_outputs(s, out);
}

TEST(SynthCtrTest, DeterministicInTheSeedAndIndependentOfTheFileSplit) {
  const std::string a = temp_path("a.tsv"), b = temp_path("b.tsv"), c = temp_path("c.tsv"),
                    split_out = temp_path("split.tsv.gz");
  const SynthCtrSummary sa = write_synth_ctr(options(a, 3001, 7));
  const SynthCtrSummary sb = write_synth_ctr(options(b, 3001, 7));
  const SynthCtrSummary sc = write_synth_ctr(options(c, 3001, 8));
  const std::string text = read_file(a);
  EXPECT_EQ(text, read_file(b));
  EXPECT_NE(text, read_file(c));
  EXPECT_EQ(sa.oracle_auc, sb.oracle_auc);
  EXPECT_EQ(sa.positives, sb.positives);
  SynthCtrOptions o = options(split_out, 3001, 7);
  o.files = 4;
  const SynthCtrSummary ss = write_synth_ctr(o);
  ASSERT_EQ(ss.files.size(), 4u);
  EXPECT_EQ(ss.files[0], temp_path("split-00000-of-00004.tsv.gz"));
  std::string joined;
  for (const auto& f : ss.files) {
    const std::string part = read_gzip(f);
    EXPECT_GT(part.size(), 0u);
    joined += part;
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(ss.oracle_auc, sa.oracle_auc);
  for (const auto& [s, out] : {std::pair{sa, a}, {sb, b}, {sc, c}, {ss, split_out}}) remove_outputs(s, out);
}

TEST(SynthCtrTest, ShardFileNames) {
  EXPECT_EQ(synth_ctr_file_names("x/train.tsv.gz", 1), std::vector<std::string>{"x/train.tsv.gz"});
  EXPECT_EQ(synth_ctr_file_names("x/train.tsv.gz", 2),
            (std::vector<std::string>{"x/train-00000-of-00002.tsv.gz", "x/train-00001-of-00002.tsv.gz"}));
  EXPECT_EQ(synth_ctr_file_names("a.b/train", 2)[1], "a.b/train-00001-of-00002");
  EXPECT_EQ(synth_ctr_file_names("d/.h.tsv", 3)[2], "d/.h-00002-of-00003.tsv");
}

// The bytes of seed 1's first rows, recorded once: a platform whose arithmetic or RNG gives other
// bytes fails here instead of silently training on different data.
TEST(SynthCtrTest, GoldenDigestOfSeedOne) {
  const SynthCtrModel model(options("unused", 10));
  std::string text;
  for (std::uint64_t i = 0; i < 64; ++i) model.format(model.row(i), &text);
  EXPECT_EQ(fnv1a(text), 0xae77bd0cee527230ull) << std::hex << fnv1a(text) << "\n" << text.substr(0, 400);
}

TEST(SynthCtrTest, OracleAucAtTheDefaultsIsBetween07And09) {
  const std::string out = temp_path("oracle.tsv");
  const SynthCtrSummary s = write_synth_ctr(options(out, 40000));
  const double rate = static_cast<double>(s.positives) / static_cast<double>(s.rows);
  EXPECT_GT(s.oracle_auc, 0.7);
  EXPECT_LT(s.oracle_auc, 0.9);
  EXPECT_GT(rate, 0.15);
  EXPECT_LT(rate, 0.4);
  // The log loss of the true probabilities is below that of the base rate (the entropy).
  const double entropy = -(rate * std::log(rate) + (1 - rate) * std::log(1 - rate));
  EXPECT_LT(s.oracle_log_loss, entropy - 0.05);
  remove_outputs(s, out);
}

TEST(SynthCtrTest, IdsAreZipfAndValuesABijection) {
  SynthCtrOptions o = options("unused", 1);
  o.vocab.assign(kCtrCatFields, 50);
  o.missing = 0;
  const SynthCtrModel model(o);
  std::map<std::uint64_t, std::uint64_t> value_to_id;
  std::vector<std::uint64_t> counts(50);
  for (std::uint64_t i = 0; i < 20000; ++i) {
    const CtrRow r = model.row(i);
    ASSERT_LT(r.cat_ids[3], 50u);
    ++counts[r.cat_ids[3]];
    auto [it, inserted] = value_to_id.emplace(r.cats[3], r.cat_ids[3]);
    EXPECT_EQ(it->second, r.cat_ids[3]) << "two ids share a written value";
  }
  // Zipf 1.05 over 50 ids: P(0) = 1/H, P(1) = P(0)/2^1.05, P(9) = P(0)/10^1.05.
  EXPECT_GT(counts[0], counts[1]);
  EXPECT_GT(counts[1], counts[9]);
  EXPECT_NEAR(static_cast<double>(counts[0]) / static_cast<double>(counts[1]), std::pow(2.0, 1.05), 0.2);
  // Zipf 0 is uniform.
  o.zipf = 0;
  const SynthCtrModel uniform(o);
  std::vector<std::uint64_t> flat(50);
  for (std::uint64_t i = 0; i < 20000; ++i) ++flat[uniform.row(i).cat_ids[0]];
  for (std::uint64_t c : flat) EXPECT_NEAR(static_cast<double>(c), 400.0, 100.0);
}

SynthCtrOptions churn_options(const std::string& out, double churn) {
  SynthCtrOptions o = options(out, 40000, 5);
  o.vocab.assign(kCtrCatFields, 100);
  o.missing = 0;
  o.id_bits = 40;
  o.days = 4;
  o.files = 4;
  o.churn = churn;
  return o;
}

// Per day, per field: the values written (the files of a --days run, one day each).
std::vector<std::vector<std::set<std::string>>> values_by_day(const SynthCtrSummary& s) {
  std::vector<std::vector<std::set<std::string>>> days;
  for (const std::string& file : s.files) {
    days.emplace_back(kCtrCatFields);
    std::istringstream in(read_file(file));
    std::string line;
    while (std::getline(in, line)) {
      const std::vector<std::string> cols = split(line, '\t');
      EXPECT_EQ(cols.size(), 40u) << line;
      if (cols.size() != 40u) continue;
      for (int f = 0; f < kCtrCatFields; ++f)
        if (!cols[14 + f].empty()) days.back()[static_cast<std::size_t>(f)].insert(cols[14 + f]);
    }
  }
  return days;
}

// --days 4 --churn 0.25 --id-bits 40 over 100 ranks a field, 10,000 rows a day: every rank is
// drawn every day, so the values written on a day are that day's whole population and the
// measured overlap from one day to the next is 1 - churn.
TEST(SynthCtrTest, ChurningIdsFitTheSpaceAndOverlapAsAsked) {
  const std::string out = temp_path("churn.tsv");
  const SynthCtrOptions o = churn_options(out, 0.25);
  const SynthCtrSummary s = write_synth_ctr(o);
  ASSERT_EQ(s.files.size(), 4u);
  ASSERT_EQ(s.days.size(), 4u);
  const auto days = values_by_day(s);
  ASSERT_EQ(days.size(), 4u);
  std::uint64_t largest = 0;
  std::vector<std::set<std::string>> seen(kCtrCatFields);
  for (std::size_t d = 0; d < days.size(); ++d) {
    EXPECT_EQ(s.days[d].rows, 10000u);
    double overlap = 0;
    for (int f = 0; f < kCtrCatFields; ++f) {
      const std::set<std::string>& today = days[d][static_cast<std::size_t>(f)];
      std::uint64_t fresh = 0;
      for (const std::string& v : today) {
        // 40 bits: exactly 10 hex digits.
        ASSERT_EQ(v.size(), 10u) << v;
        ASSERT_EQ(v.find_first_not_of("0123456789abcdef"), std::string::npos) << v;
        largest = std::max<std::uint64_t>(largest, std::stoull(v, nullptr, 16));
        fresh += seen[static_cast<std::size_t>(f)].insert(v).second ? 1 : 0;
      }
      // The sidecar's counts are the files' own.
      EXPECT_EQ(s.days[d].distinct[static_cast<std::size_t>(f)], today.size()) << "day " << d << " C" << f + 1;
      EXPECT_EQ(s.days[d].fresh[static_cast<std::size_t>(f)], fresh) << "day " << d << " C" << f + 1;
      EXPECT_GE(today.size(), 97u) << "day " << d << " C" << f + 1 << ": not every rank was drawn";
      if (d == 0) continue;
      const std::set<std::string>& yesterday = days[d - 1][static_cast<std::size_t>(f)];
      std::uint64_t both = 0;
      for (const std::string& v : today) both += yesterday.count(v);
      overlap += static_cast<double>(both) / static_cast<double>(today.size());
    }
    if (d == 0) {
      EXPECT_EQ(s.days[d].fresh, s.days[d].distinct);
      continue;
    }
    // 26 fields x 100 ranks, each replaced with probability 0.25: the mean overlap has a
    // standard deviation of about 0.0085.
    overlap /= kCtrCatFields;
    EXPECT_NEAR(overlap, 0.75, 0.04) << "day " << d;
  }
  for (int f = 0; f < kCtrCatFields; ++f)
    EXPECT_EQ(s.distinct_ids[static_cast<std::size_t>(f)], seen[static_cast<std::size_t>(f)].size());
  // The ids spread over the 2^40 space, not just its bottom.
  EXPECT_GT(largest, std::uint64_t{1} << 38);
  // The population itself (all ranks, drawn or not), from the model: the fraction of ranks whose
  // generation changes from one day to the next is the churn.
  const SynthCtrModel model(o);
  for (int d = 1; d < 4; ++d) {
    std::uint64_t replaced = 0;
    for (int f = 0; f < kCtrCatFields; ++f)
      for (std::uint64_t k = 0; k < 100; ++k) {
        const std::uint32_t g0 = model.generation(f, k, d - 1), g1 = model.generation(f, k, d);
        ASSERT_TRUE(g1 == g0 || g1 == g0 + 1) << g0 << " -> " << g1;
        replaced += g1 != g0;
        EXPECT_NE(model.value(f, k, g0) != model.value(f, k, g1), g0 == g1);
      }
    EXPECT_NEAR(static_cast<double>(replaced) / 2600.0, 0.25, 0.04) << "day " << d;
  }
  EXPECT_TRUE(Contains(s.json, "\"id_bits\":40"));
  EXPECT_TRUE(Contains(s.json, "\"churn\":0.25"));
  EXPECT_TRUE(Contains(s.json, "\"per_day\":[{\"day\":0,"));
  EXPECT_TRUE(Contains(s.json, "\"distinct_ids\":["));
  EXPECT_GT(s.oracle_auc, 0.7);
  EXPECT_LT(s.oracle_auc, 0.9);
  remove_outputs(s, out);
}

// Churn 0 keeps every id; churn 1 replaces every id every day.
TEST(SynthCtrTest, ChurnZeroAndOneAreNoneAndAll) {
  for (double churn : {0.0, 1.0}) {
    SCOPED_TRACE(churn);
    const std::string out = temp_path(churn == 0 ? "c0.tsv" : "c1.tsv");
    const SynthCtrSummary s = write_synth_ctr(churn_options(out, churn));
    const auto days = values_by_day(s);
    for (std::size_t d = 1; d < days.size(); ++d)
      for (int f = 0; f < kCtrCatFields; ++f) {
        std::uint64_t both = 0;
        for (const std::string& v : days[d][static_cast<std::size_t>(f)]) both += days[d - 1][static_cast<std::size_t>(f)].count(v);
        const std::uint64_t today = days[d][static_cast<std::size_t>(f)].size();
        const std::uint64_t fresh = s.days[d].fresh[static_cast<std::size_t>(f)];
        if (churn == 0) {
          EXPECT_LE(fresh, today - both);  // fresh: written on no earlier day, not just yesterday
        } else {
          EXPECT_EQ(both, 0u);
          EXPECT_EQ(fresh, today);
        }
      }
    if (churn == 0) {
      // Without churn the fresh ids after day 0 are only rare ranks drawn for the first time.
      std::uint64_t fresh = 0, distinct = 0;
      for (std::size_t d = 1; d < s.days.size(); ++d)
        for (int f = 0; f < kCtrCatFields; ++f) {
          fresh += s.days[d].fresh[static_cast<std::size_t>(f)];
          distinct += s.days[d].distinct[static_cast<std::size_t>(f)];
        }
      EXPECT_LT(static_cast<double>(fresh), 0.01 * static_cast<double>(distinct));
    }
    remove_outputs(s, out);
  }
}

// Same seed, same bytes; the hidden weights follow the id, so every day is as predictable as the
// first (a fresh id carries as much signal as an old one); --days without --id-bits writes the
// bytes of the plain layout, split by day.
TEST(SynthCtrTest, ChurnIsDeterministicAndFreshIdsCarrySignal) {
  const std::string a = temp_path("a.tsv"), b = temp_path("b.tsv"), c = temp_path("c.tsv");
  const SynthCtrSummary sa = write_synth_ctr(churn_options(a, 0.5));
  const SynthCtrSummary sb = write_synth_ctr(churn_options(b, 0.5));
  SynthCtrOptions other = churn_options(c, 0.5);
  other.seed = 6;
  const SynthCtrSummary sc = write_synth_ctr(other);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(read_file(sa.files[i]), read_file(sb.files[i]));
    EXPECT_NE(read_file(sa.files[i]), read_file(sc.files[i]));
  }
  EXPECT_EQ(sa.oracle_auc, sb.oracle_auc);
  for (std::size_t d = 0; d < 4; ++d) EXPECT_EQ(sa.days[d].fresh, sb.days[d].fresh);

  const SynthCtrOptions o = churn_options(a, 0.5);
  const SynthCtrModel model(o);
  std::string text;
  for (std::uint64_t i = 0; i < 64; ++i) model.format(model.row(i * 625), &text);
  EXPECT_EQ(fnv1a(text), 0xbd62b28b34ed4dfbull) << std::hex << fnv1a(text) << "\n" << text.substr(0, 400);

  // The oracle AUC of each day's rows: day 3 (half of its ids replaced every day since day 0)
  // ranks as well as day 0.
  std::vector<double> day_auc;
  for (int d = 0; d < 4; ++d) {
    std::vector<double> logits;
    std::vector<std::uint8_t> labels;
    for (std::uint64_t i = static_cast<std::uint64_t>(d) * 10000; i < static_cast<std::uint64_t>(d + 1) * 10000; ++i) {
      const CtrRow r = model.row(i);
      ASSERT_EQ(r.day, d);
      logits.push_back(r.logit);
      labels.push_back(static_cast<std::uint8_t>(r.label));
    }
    day_auc.push_back(train::exact_auc(logits.data(), labels.data(), labels.size()));
  }
  EXPECT_GT(day_auc[0], 0.7);
  EXPECT_NEAR(day_auc[3], day_auc[0], 0.03);
  // The sidecar's per-day oracle is the same computation.
  for (int d = 0; d < 4; ++d) EXPECT_EQ(sa.days[static_cast<std::size_t>(d)].oracle_auc, day_auc[static_cast<std::size_t>(d)]);

  SynthCtrOptions plain = options(c, 4000, 3), by_day = options(b, 4000, 3);
  by_day.days = 3;
  by_day.files = 3;
  const SynthCtrSummary sp = write_synth_ctr(plain);
  const SynthCtrSummary sd = write_synth_ctr(by_day);
  std::string joined;
  for (const std::string& f : sd.files) joined += read_file(f);
  EXPECT_EQ(joined, read_file(c));
  EXPECT_EQ(sd.days.size(), 3u);
  for (const auto& [s, out] : {std::pair{sa, a}, {sb, b}, {sc, c}, {sd, b}, {sp, c}}) remove_outputs(s, out);
}

TEST(SynthCtrTest, BadOptionsGetOneLineNamingTheFlag) {
  const std::string out = temp_path("x.tsv");
  struct Case {
    std::vector<std::string> args;  // flag_text's order
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {{"0", "", out, "", "", "", ""}, "--rows: 0 is out of range"},
           {{"100000001", "", out, "", "", "", ""}, "--rows"},
           {{"-5", "", out, "", "", "", ""}, "--rows"},
           {{"12x", "", out, "", "", "", ""}, "'12x'"},
           {{"", "-1", out, "", "", "", ""}, "--seed"},
           {{"", "", "", "", "", "", ""}, "--out"},
           {{"", "", "/nonexistent_dir_strata/x.tsv", "", "", "", ""}, "does not exist"},
           {{"", "", ::testing::TempDir(), "", "", "", ""}, "--out"},
           {{"", "", out, "0", "", "", ""}, "--files"},
           {{"", "", out, "10001", "", "", ""}, "--files"},
           {{"10", "", out, "11", "", "", ""}, "11 files for 10 rows"},
           {{"", "", out, "", "0", "", ""}, "--vocab: C1 size 0"},
           {{"", "", out, "", "10000001", "", ""}, "--vocab"},
           {{"", "", out, "", "5,6", "", ""}, "expected 1 (every field) or 26"},
           {{"", "", out, "", "5,,6", "", ""}, "--vocab"},
           {{"", "", out, "", "", "-0.5", ""}, "--zipf: -0.5 is out of range [0, 10]"},
           {{"", "", out, "", "", "nan", ""}, "--zipf"},
           {{"", "", out, "", "", "11", ""}, "--zipf"},
           {{"", "", out, "", "", "", "0.96"}, "--missing: 0.96"},
           {{"", "", out, "", "", "", "-0.1"}, "--missing"},
           {{"", "", out, "", "", "", "", "15"}, "--id-bits"},
           {{"", "", out, "", "", "", "", "63"}, "--id-bits"},
           {{"", "", out, "", "", "", "", "40x"}, "--id-bits"},
           {{"", "", out, "", "", "", "", "", "0"}, "--days"},
           {{"", "", out, "", "", "", "", "", "1001"}, "--days"},
           {{"5", "", out, "", "", "", "", "", "6"}, "--days: 6 days for 5 rows"},
           {{"", "", out, "3", "", "", "", "", "4"}, "--files: 3 files for 4 days"},
           {{"", "", out, "", "", "", "", "40", "4", "1.5"}, "--churn: 1.5 is out of range [0, 1]"},
           {{"", "", out, "", "", "", "", "40", "4", "-0.1"}, "--churn"},
           {{"", "", out, "", "", "", "", "40", "4", "nan"}, "--churn"},
           {{"", "", out, "", "", "", "", "40", "", "0.2"}, "--churn: 0.2 needs --days of at least 2"},
           {{"", "", out, "", "", "", "", "40", "1", "0.2"}, "--days of at least 2"},
           {{"", "", out, "", "", "", "", "", "4", "0.2"}, "--churn: 0.2 needs --id-bits"},
           // 10000 ranks x 12 generations (11 days at churn 1) do not fit 2^16 ids.
           {{"", "", out, "", "", "", "", "16", "11", "1"}, "--id-bits: 16 bits hold 65536 ids, fewer than C1's"},
           {{"", "", out, "", "10000000", "", "", "", "4"}, "--vocab: the 26 sizes add up to 260000000"},
       }) {
    SCOPED_TRACE(c.needle);
    const auto& a = c.args;
    const std::string msg = config_error([&] { parse_synth_ctr_options(flag_text(a)); });
    EXPECT_TRUE(Contains(msg, c.needle));
  }
  // 26 per-field sizes are accepted.
  std::string sizes;
  for (int f = 0; f < 26; ++f) sizes += (f ? "," : "") + std::to_string(f + 2);
  const SynthCtrOptions o = parse_synth_ctr_options(flag_text({"10", "3", out, "2", sizes, "0.5", "0"}, true));
  EXPECT_EQ(o.vocab[25], 27u);
  EXPECT_EQ(o.files, 2);
  EXPECT_TRUE(o.header);
  // --days sets --files; 16 bits hold 10000 ranks x 6 generations (5 days at churn 1).
  const SynthCtrOptions d = parse_synth_ctr_options(flag_text({"100", "", out, "", "", "", "", "16", "5", "1"}));
  EXPECT_EQ(d.files, 5);
  EXPECT_EQ(d.days, 5);
  EXPECT_EQ(d.id_bits, 16);
  EXPECT_EQ(d.churn, 1.0);
}

}  // namespace
}  // namespace strata::cli
