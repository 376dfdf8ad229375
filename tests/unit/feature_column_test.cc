// Unit tests of FarmHash Fingerprint64 and the feature columns (strata/data/hash.h,
// strata/data/feature_column.h): published TensorFlow and FarmHash vectors; each column's
// transform against values worked out by hand; vocabulary OOV buckets; crossed-column
// determinism and TF's cross hash; the layout; labels and targets; the JSON schema and its
// errors (FeatureColumnSecurity: hostile spec and vocabulary files).
#include "common/test_util.h"
#include "strata/data/feature_column.h"
#include "strata/data/hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "data/feature_column_json.h"
#include "strata/common/error.h"

namespace strata::data {
namespace {

using strata::testing::config_error;
using strata::testing::Contains;

std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "strata_fc_" + info->test_suite_name() + "_" + info->name() + "_" + name;
}

std::string write_text(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return path;
}

// ---- Fingerprint64 ------------------------------------------------------------------------------

TEST(Fingerprint64, MatchesTensorFlowsPublishedValues) {
  // tensorflow/core/platform/fingerprint_test.cc, Fingerprint64.IsForeverFrozen.
  EXPECT_EQ(fingerprint64("Hello"), 15404698994557526151ULL);
  EXPECT_EQ(fingerprint64("World"), 18308117990299812472ULL);
  // tensorflow/python/kernel_tests/strings_ops/string_to_hash_bucket_op_test.py,
  // testStringToHashBucketsFast: the fingerprints in its comment and the buckets it asserts.
  EXPECT_EQ(fingerprint64("a"), 12917804110809363939ULL);
  EXPECT_EQ(fingerprint64("b"), 11795596070477164822ULL);
  EXPECT_EQ(fingerprint64("c"), 11430444447143000872ULL);
  EXPECT_EQ(fingerprint64("d"), 4470636696479570465ULL);
  std::vector<std::int64_t> buckets;
  for (const char* s : {"a", "b", "c", "d"}) buckets.push_back(to_hash_bucket_fast(s, 10));
  EXPECT_EQ(buckets, (std::vector<std::int64_t>{9, 2, 2, 5}));
  for (const char* s : {"a", "b", "c"}) EXPECT_EQ(to_hash_bucket_fast(s, 1), 0);  // testStringToOneHashBucketFast
  // The tf.strings.to_hash_bucket_fast documentation's example.
  buckets.clear();
  for (const char* s : {"Hello", "TensorFlow", "2.x"}) buckets.push_back(to_hash_bucket_fast(s, 3));
  EXPECT_EQ(buckets, (std::vector<std::int64_t>{0, 2, 2}));
  EXPECT_THROW(to_hash_bucket_fast("a", 0), ConfigError);
}

TEST(Fingerprint64, MatchesFarmHashSelfTestTable) {
  // FarmHash's self-test (google/farmhash src/farmhash.cc): a 1 MiB buffer from its generator,
  // hashed at (offset, length) = (i*i, i) for i < 299, then (0, i) for i growing by i/7 up to the
  // whole buffer; the expected values are the farmhashnaTest table's Hash64 entries (its high
  // and low 32-bit halves joined). The lengths cover all four branches and the block loop.
  constexpr std::uint64_t k0 = 0xc3a5c85c97cb3127ULL;
  std::vector<char> data(std::size_t{1} << 20);
  std::uint64_t a = 9, b = 777;
  for (std::size_t i = 0; i < data.size(); ++i) {
    a += b;
    b += a;
    a = (a ^ (a >> 41)) * k0;
    b = (b ^ (b >> 41)) * k0 + i;
    const auto u = static_cast<std::uint8_t>(b >> 37);
    std::memcpy(&data[i], &u, 1);
  }
  struct Vector {
    std::size_t offset, length;
    std::uint64_t hash;
  };
  const Vector vectors[] = {
      {0, 0, 11160318154034397263ULL},
      {1, 1, 6057711933287653014ULL},
      {4, 2, 1096493076212885441ULL},
      {9, 3, 17262924617777385131ULL},
      {16, 4, 1287846036432493960ULL},
      {25, 5, 9448345910734356659ULL},
      {49, 7, 1970894657613724145ULL},
      {64, 8, 11597051931199355094ULL},
      {81, 9, 18126316081798418699ULL},
      {225, 15, 4919969303722224776ULL},
      {256, 16, 282273162512842838ULL},
      {289, 17, 7691019942193281883ULL},
      {576, 24, 3936312831952133527ULL},
      {961, 31, 6178288770513559229ULL},
      {1024, 32, 541269899254986215ULL},
      {1089, 33, 711203541633906104ULL},
      {1600, 40, 97231716562744398ULL},
      {3969, 63, 12172596441206182967ULL},
      {4096, 64, 16066393710399699995ULL},
      {4225, 65, 4381627749513796415ULL},
      {10000, 100, 409043573355470048ULL},
      {16129, 127, 11027467577531522736ULL},
      {16384, 128, 17629800649466220701ULL},
      {16641, 129, 15345954539186508726ULL},
      {40000, 200, 4680135810112858625ULL},
      {65025, 255, 8429558128705429752ULL},
      {65536, 256, 9210440767890242563ULL},
      {88804, 298, 2319855510833732255ULL},
      {0, 299, 14734041553762417017ULL},
      {0, 341, 10389017116275415821ULL},
      {0, 661, 18115869654871407704ULL},
      {0, 4874, 2694101599243153095ULL},
      {0, 1016994, 15964842784149948926ULL},
      {0, 1048576, 17893921758998833411ULL},
  };
  for (const Vector& v : vectors)
    EXPECT_EQ(fingerprint64(std::string_view(data.data() + v.offset, v.length)), v.hash) << "length " << v.length;
}

TEST(Fingerprint64, CrossHashMatchesTensorFlowsSparseCrossHashed) {
  // tensorflow/python/kernel_tests/sparse_ops/sparse_cross_op_test.py:
  // test_hashed_zero_bucket_no_hash_key and test_hashed_zero_bucket (hash_key + 1).
  const std::vector<std::uint64_t> f = {fingerprint64("batch1-FC1-F1"), fingerprint64("batch1-FC2-F1"),
                                        fingerprint64("batch1-FC3-F1")};
  EXPECT_EQ(sparse_cross_hash(f, 0), 1971693436396284976LL);
  EXPECT_EQ(sparse_cross_hash(f, 0, kDefaultCrossHashKey + 1), 4847552627144134031LL);
  // Order matters: a cross of (A, B) is not (B, A).
  EXPECT_NE(sparse_cross_hash({f[0], f[1]}, 0), sparse_cross_hash({f[1], f[0]}, 0));
  EXPECT_THROW(sparse_cross_hash(f, -1), ConfigError);
}

// ---- transforms ---------------------------------------------------------------------------------

CsvColumn col(const std::string& name, CsvType type, std::optional<std::string> def = std::nullopt, char sep = '\0') {
  return CsvColumn{name, type, std::move(def), sep};
}

// label,x,pair,n,word,tags
CsvTable small_table(const std::string& name, const std::string& rows) {
  CsvOptions o;
  o.header = CsvHeader::kPresent;
  o.columns = {col("label", CsvType::kInt64),        col("x", CsvType::kFloat, "7"),
               col("pair", CsvType::kFloat, "", ';'), col("n", CsvType::kInt64, "-1"),
               col("word", CsvType::kString, ""),     col("tags", CsvType::kString, "", '|')};
  return read_csv({write_text(name, rows)}, o);
}

const char* kRows =
    "label,x,pair,n,word,tags\n"
    "1,-1,1;2,3,a,b|c\n"
    "0,10,,,zz,\n"
    "1,,3;4,0,b,a|a|d\n";

TEST(FeatureColumns, NumericAndBucketizedByHand) {
  const CsvTable t = small_table("t.csv", kRows);
  const FeatureColumn x = numeric_column("x", 1, std::nullopt, Normalizer{2.0, 4.0});
  const FeatureColumn pair = numeric_column("pair", 2, 0.5f);
  // Boundaries [0, 10]: bucket 0 below 0, bucket 1 in [0, 10), bucket 2 at 10 and above; on the
  // normalised x ((-1-2)/4, (10-2)/4, (7-2)/4) = (-0.75, 2, 1.25).
  const FeatureColumn xb = bucketized_column(x, {0.0, 2.0});
  const FeatureColumn pb = bucketized_column(numeric_column("pair", 2, 0.5f), {1.5, 3.0});
  const FeatureTransform ft({x, pair, xb, pb}, LabelSpec{}, t);
  const FeatureLayout& L = ft.layout();
  EXPECT_EQ(L.dense_dim, 3);
  EXPECT_EQ(L.num_fields, 3);
  EXPECT_EQ(L.columns[1].dense_offset, 1);
  EXPECT_EQ(L.columns[1].dense_width, 2);
  EXPECT_EQ(L.columns[2].name, "x_bucketized");
  EXPECT_EQ(L.columns[2].vocabulary_size, 3);
  EXPECT_EQ(L.columns[3].first_slot, 1);
  EXPECT_EQ(L.columns[3].num_slots, 2);
  EXPECT_EQ(L.columns[3].vocabulary_size, 6);  // (2 boundaries + 1) x shape 2
  EXPECT_EQ(L.sparse_vocab, 6);
  const Dataset d = ft.apply(t);
  ASSERT_EQ(d.size, 3);
  const std::vector<float> want = {-0.75f, 1, 2, 2.0f, 0.5f, 0.5f, 1.25f, 3, 4};
  EXPECT_EQ(d.features, want);
  // x buckets: -0.75 -> 0, 2 -> 2 (a value on a boundary goes up), 1.25 -> 1.
  // pair buckets: (1, 2) -> (0, 3+1); (0.5, 0.5) -> (0, 3+0); (3, 4) -> (2, 3+2).
  const std::vector<std::int64_t> ids = {0, 0, 4, 2, 0, 3, 1, 2, 5};
  EXPECT_EQ(d.sparse_ids, ids);
  EXPECT_EQ(d.labels, (std::vector<std::int32_t>{1, 0, 1}));
  EXPECT_EQ(d.num_classes, 2);
  EXPECT_EQ(d.files, t.files());
}

TEST(FeatureColumns, CategoricalColumnsByHand) {
  const CsvTable t = small_table("t.csv", kRows);
  const FeatureColumn id = categorical_column_with_identity("n", 4);
  const FeatureColumn hashed = categorical_column_with_hash_bucket("tags", 10);
  const FeatureColumn vocab = categorical_column_with_vocabulary_list("word", {"b", "a"}, -1, 3);
  const FeatureColumn vocab_default = categorical_column_with_vocabulary_list("tags", {"d", "c"}, 1);
  const FeatureColumn vocab_drop = categorical_column_with_vocabulary_list("word", {"a"});
  const FeatureColumn hashed_int = categorical_column_with_hash_bucket("n", 1000);
  const FeatureTransform ft({id, hashed, embedding_column(vocab, 8, Combiner::kSqrtn), indicator_column(vocab_default),
                             vocab_drop, indicator_column(hashed_int)},
                            LabelSpec{}, t);
  const FeatureLayout& L = ft.layout();
  ASSERT_EQ(L.columns.size(), 6u);
  EXPECT_EQ(L.columns[1].num_slots, 3);  // the most tags on a row
  EXPECT_EQ(L.columns[2].name, "word_embedding");
  EXPECT_EQ(L.columns[2].dimension, 8);
  EXPECT_EQ(L.columns[2].combiner, Combiner::kSqrtn);
  EXPECT_EQ(L.columns[2].vocabulary_size, 5);
  EXPECT_EQ(L.columns[3].kind, ColumnKind::kIndicator);
  EXPECT_EQ(L.num_fields, 1 + 3 + 1 + 3 + 1 + 1);
  const Dataset d = ft.apply(t);
  const auto row = [&](int r, int column) {
    const ColumnLayout& c = L.columns[static_cast<std::size_t>(column)];
    const auto* p = d.sparse_ids.data() + r * d.num_fields + c.first_slot;
    return std::vector<std::int64_t>(p, p + c.num_slots);
  };
  const auto h = [](const char* s, std::uint64_t n) { return static_cast<std::int64_t>(fingerprint64(s) % n); };
  // identity: 3; -1 (the empty field's default) gives no id; 0.
  EXPECT_EQ(row(0, 0), std::vector<std::int64_t>{3});
  EXPECT_EQ(row(1, 0), std::vector<std::int64_t>{kNoId});
  EXPECT_EQ(row(2, 0), std::vector<std::int64_t>{0});
  // hash bucket of each tag, padded; "b" -> 2 and "a" -> 9 as in TF's test; "d" -> 5.
  EXPECT_EQ(row(0, 1), (std::vector<std::int64_t>{h("b", 10), h("c", 10), kNoId}));
  EXPECT_EQ(row(0, 1), (std::vector<std::int64_t>{2, 2, kNoId}));
  EXPECT_EQ(row(1, 1), (std::vector<std::int64_t>{kNoId, kNoId, kNoId}));
  EXPECT_EQ(row(2, 1), (std::vector<std::int64_t>{9, 9, 5}));
  // vocabulary with 3 OOV buckets: "a" -> 1, "zz" -> 2 + fp("zz") % 3, "b" -> 0.
  EXPECT_EQ(row(0, 2), std::vector<std::int64_t>{1});
  EXPECT_EQ(row(1, 2), std::vector<std::int64_t>{2 + h("zz", 3)});
  EXPECT_EQ(row(2, 2), std::vector<std::int64_t>{0});
  // vocabulary with default_value 1: "b" -> 1 (OOV), "c" -> 1; "a a d" -> 1 1 0.
  EXPECT_EQ(row(0, 3), (std::vector<std::int64_t>{1, 1, kNoId}));
  EXPECT_EQ(row(2, 3), (std::vector<std::int64_t>{1, 1, 0}));
  // vocabulary without OOV buckets or default: OOV values give no id.
  EXPECT_EQ(row(0, 4), std::vector<std::int64_t>{0});
  EXPECT_EQ(row(1, 4), std::vector<std::int64_t>{kNoId});
  // An int64 column hashes its decimal text, as TF's as_string then to_hash_bucket_fast.
  EXPECT_EQ(row(0, 5), std::vector<std::int64_t>{h("3", 1000)});
  EXPECT_EQ(row(1, 5), std::vector<std::int64_t>{h("-1", 1000)});
}

TEST(FeatureColumns, DynamicHashGivesTheFull63BitFingerprintWithoutCollisions) {
  const CsvTable t = small_table("t.csv", kRows);
  const FeatureColumn dyn = categorical_column_with_dynamic_hash("tags", DynamicIdOptions{2, 1000, 50});
  const FeatureColumn dyn_int = categorical_column_with_dynamic_hash("n");
  const FeatureTransform ft({embedding_column(dyn, 4, Combiner::kSum), dyn_int}, LabelSpec{}, t);
  const FeatureLayout& L = ft.layout();
  ASSERT_EQ(L.columns.size(), 2u);
  EXPECT_TRUE(L.columns[0].dynamic);
  EXPECT_EQ(L.columns[0].dynamic_options.admit_after, 2);
  EXPECT_EQ(L.columns[0].dynamic_options.capacity, 1000);
  EXPECT_EQ(L.columns[0].dynamic_options.ttl, 50);
  EXPECT_EQ(L.columns[0].vocabulary_size, kDynamicVocabulary);
  EXPECT_TRUE(L.columns[1].dynamic);
  EXPECT_EQ(L.columns[1].dynamic_options.admit_after, 0);
  const Dataset d = ft.apply(t);  // validated: every id in [0, sparse_vocab)
  const auto id = [](const char* s) {
    return static_cast<std::int64_t>(fingerprint64(s) & 0x7fffffffffffffffULL);
  };
  EXPECT_EQ(dynamic_hash_id("b"), id("b"));
  // "b" and "c" share bucket 2 of 10 (the test above); their dynamic ids differ.
  EXPECT_NE(dynamic_hash_id("b"), dynamic_hash_id("c"));
  const auto row = [&](int r, int column) {
    const ColumnLayout& c = L.columns[static_cast<std::size_t>(column)];
    const auto* p = d.sparse_ids.data() + r * d.num_fields + c.first_slot;
    return std::vector<std::int64_t>(p, p + c.num_slots);
  };
  EXPECT_EQ(row(0, 0), (std::vector<std::int64_t>{id("b"), id("c"), kNoId}));
  EXPECT_EQ(row(1, 0), (std::vector<std::int64_t>{kNoId, kNoId, kNoId}));
  EXPECT_EQ(row(2, 0), (std::vector<std::int64_t>{id("a"), id("a"), id("d")}));
  EXPECT_EQ(row(0, 1), std::vector<std::int64_t>{id("3")});  // an int64 column hashes its text
  for (const char* s : {"", "a", "zz", "-1", "criteo"}) {
    EXPECT_GE(dynamic_hash_id(s), 0) << s;
    EXPECT_LT(dynamic_hash_id(s), kDynamicVocabulary) << s;
  }
  // Options out of range and an indicator over it are ConfigErrors naming the column and field.
  EXPECT_TRUE(Contains(config_error([] { categorical_column_with_dynamic_hash("c", DynamicIdOptions{-1, 10, 0}); }),
                       "categorical_column_with_dynamic_hash('c'): admit_after is -1"));
  EXPECT_TRUE(Contains(config_error([] { categorical_column_with_dynamic_hash("c", DynamicIdOptions{0, 0, 0}); }),
                       "capacity is 0, expected in [1, 2^31 - 1]"));
  EXPECT_TRUE(Contains(config_error([] { categorical_column_with_dynamic_hash("c", DynamicIdOptions{0, 10, -3}); }),
                       "ttl is -3"));
  EXPECT_TRUE(Contains(config_error([&] { indicator_column(dyn); }), "indicator_column('tags'): a dynamic hash column"));
}

TEST(FeatureColumns, CrossedColumnIsTensorFlowsHashAndDeterministic) {
  const CsvTable t = small_table("t.csv", kRows);
  const FeatureColumn xb = bucketized_column(numeric_column("x"), {0.0, 8.0});
  const FeatureColumn cross = crossed_column({"word", "tags"}, 1000);
  const FeatureColumn cross_ids = crossed_column({xb, "n"}, 50, 7);
  EXPECT_EQ(cross.name(), "word_X_tags");
  EXPECT_EQ(cross_ids.name(), "x_bucketized_X_n");
  const FeatureTransform ft({cross, cross_ids}, LabelSpec{}, t);
  EXPECT_EQ(ft.layout().columns[0].num_slots, 3);  // 1 word x 3 tag slots
  const Dataset d = ft.apply(t);
  const auto fp = [](const char* s) { return fingerprint64(s); };
  // Row 0: word "a" x tags (b, c), in tag order.
  EXPECT_EQ(d.sparse_ids[0], sparse_cross_hash({fp("a"), fp("b")}, 1000));
  EXPECT_EQ(d.sparse_ids[1], sparse_cross_hash({fp("a"), fp("c")}, 1000));
  EXPECT_EQ(d.sparse_ids[2], kNoId);
  // Ids and int64 values enter the cross as themselves: x=-1 -> bucket 0, n=3.
  EXPECT_EQ(d.sparse_ids[3], sparse_cross_hash({0, 3}, 50, 7));
  // Row 1 has no tags and n = -1: the word/tags cross is empty; n's -1 is a raw int64 value and
  // crosses as itself (TF drops nothing from a dense raw key): bucket of x=10 is 2.
  EXPECT_EQ(d.sparse_ids[4], kNoId);
  EXPECT_EQ(d.sparse_ids[7], sparse_cross_hash({2, static_cast<std::uint64_t>(-1)}, 50, 7));
  // Deterministic: a second transform and a second read give the same ids.
  const CsvTable t2 = small_table("t2.csv", kRows);
  EXPECT_EQ(FeatureTransform({cross, cross_ids}, LabelSpec{}, t2).apply(t2).sparse_ids, d.sparse_ids);
  // The cartesian product, the last key fastest: word x tags x tags on row 2 ("b"; a a d).
  const FeatureTransform three({crossed_column({"word", "tags", "tags"}, 100000)}, LabelSpec{}, t);
  EXPECT_EQ(three.layout().columns[0].num_slots, 9);
  const Dataset d3 = three.apply(t);
  const std::int64_t* r2 = d3.sparse_ids.data() + 2 * 9;
  EXPECT_EQ(r2[0], sparse_cross_hash({fp("b"), fp("a"), fp("a")}, 100000));
  EXPECT_EQ(r2[2], sparse_cross_hash({fp("b"), fp("a"), fp("d")}, 100000));
  EXPECT_EQ(r2[6], sparse_cross_hash({fp("b"), fp("d"), fp("a")}, 100000));
}

TEST(FeatureColumns, LabelsTargetsAndEvaluationData) {
  const CsvTable t = small_table("t.csv", kRows);
  LabelSpec regress;
  regress.key = "x";
  regress.regression = true;
  const Dataset r = FeatureTransform({numeric_column("pair", 2, 0.0f)}, regress, t).apply(t);
  EXPECT_EQ(r.targets, (std::vector<float>{-1, 10, 7}));
  EXPECT_TRUE(r.labels.empty());
  EXPECT_EQ(r.num_classes, 0);
  LabelSpec infer;
  infer.key = "n";
  infer.num_classes = 0;
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({numeric_column("x")}, infer, t); }),
                       ":3: column 'n': label -1 is not a class index"));
  // Evaluation data with its columns in another order applies under the training layout; a row
  // with more values than the planned slots is an error naming it.
  const FeatureTransform ft({categorical_column_with_hash_bucket("tags", 10)}, LabelSpec{}, t);
  CsvOptions o;
  o.columns = {col("tags", CsvType::kString, "", '|'), col("label", CsvType::kInt64)};
  const std::string eval = write_text("eval.csv", "tags,label\nq,0\na|b|c|d,1\n");
  const CsvTable e = read_csv({eval}, o);
  EXPECT_TRUE(Contains(config_error([&] { ft.apply(e); }),
                       eval + ":3: hash_bucket column 'tags' has 4 ids in this row, the layout (planned on the training data) has 3 slots"));
  // With max_values on the CSV column the layout has that many slots whatever the rows hold, and
  // the reader refuses a row with more.
  CsvOptions bounded = o;
  bounded.columns[0].max_values = 4;
  const CsvTable e4 = read_csv({eval}, bounded);
  const FeatureTransform ft4({categorical_column_with_hash_bucket("tags", 10)}, LabelSpec{}, e4);
  EXPECT_EQ(ft4.layout().columns[0].num_slots, 4);
  EXPECT_EQ(ft4.apply(e4).sparse_ids[4 + 3], fingerprint64("d") % 10);
  bounded.columns[0].max_values = 3;
  EXPECT_TRUE(Contains(config_error([&] { read_csv({eval}, bounded); }), eval + ":3: column 'tags' holds 4 values, at most 3 (its max_values)"));
  const CsvTable e2 = read_csv({write_text("eval2.csv", "tags,label\nq,0\na|b,5\n")}, o);
  EXPECT_TRUE(Contains(config_error([&] { ft.apply(e2); }), ":3: column 'label': label 5 is outside [0, num_classes=2)"));
}

TEST(FeatureColumns, CsvColumnsForDerivesTheSchema) {
  const std::vector<CsvColumn> s =
      csv_columns_for({numeric_column("a", 1, 2.5f), categorical_column_with_hash_bucket("a", 5),
                       categorical_column_with_identity("b", 3), crossed_column({"c", "b"}, 9)},
                      LabelSpec{});
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].name, "label");
  EXPECT_EQ(s[0].type, CsvType::kInt64);
  EXPECT_FALSE(s[0].default_value.has_value());
  EXPECT_EQ(s[1].name, "a");
  EXPECT_EQ(s[1].type, CsvType::kFloat);
  EXPECT_EQ(s[1].default_value, std::optional<std::string>("2.5"));
  EXPECT_EQ(s[2].type, CsvType::kInt64);
  EXPECT_EQ(s[3].name, "c");
  EXPECT_EQ(s[3].type, CsvType::kString);
  EXPECT_EQ(s[3].default_value, std::optional<std::string>(""));
}

TEST(FeatureColumns, VocabularyFileReadsOneTermPerLine) {
  const std::string path = write_text("vocab.txt", "red\r\ngreen\nblue\n");
  const FeatureColumn c = categorical_column_with_vocabulary_file("color", path, -1, 2);
  EXPECT_EQ(c.vocabulary, (std::vector<std::string>{"red", "green", "blue"}));
  EXPECT_EQ(c.vocabulary_size(), 5);
  EXPECT_EQ(categorical_column_with_vocabulary_file("color", path, 2).vocabulary.size(), 2u);
}

// ---- streaming ----------------------------------------------------------------------------------

// Two files of 7 and 6 rows: label = i % 2, x = i, tags = "t<i>|u<i % 3>" (one quoted, with CRLF).
std::vector<std::string> stream_files() {
  std::string a = "label,x,tags\n", b = "label,x,tags\r\n";
  for (int i = 0; i < 13; ++i) {
    const std::string row = std::to_string(i % 2) + "," + std::to_string(i) + ",\"t" + std::to_string(i) + "|u" +
                            std::to_string(i % 3) + "\"";
    if (i < 7) a += row + "\n";
    else b += row + "\r\n";
  }
  return {write_text("a.csv", a), write_text("b.csv", b)};
}

CsvOptions stream_options() {
  CsvOptions o;
  o.columns = {col("label", CsvType::kInt64), col("x", CsvType::kFloat), col("tags", CsvType::kString, "", '|')};
  return o;
}

TEST(CsvStream, ChunksConcatenateToTheWholeInput) {
  const std::vector<std::string> files = stream_files();
  const CsvTable whole = read_csv(files, stream_options());
  ASSERT_EQ(whole.num_rows(), 13);
  CsvStream stream(files, stream_options());
  CsvTable chunk;
  std::int64_t row = 0;
  std::vector<std::int64_t> sizes;
  while (stream.next(chunk, 4)) {
    sizes.push_back(chunk.num_rows());
    for (std::int64_t r = 0; r < chunk.num_rows(); ++r, ++row) {
      EXPECT_EQ(chunk.where(r), whole.where(row));
      EXPECT_EQ(chunk.float_value(1, r), whole.float_value(1, row));
      EXPECT_EQ(chunk.string_value(2, chunk.value_begin(2, r)), whole.string_value(2, whole.value_begin(2, row)));
    }
  }
  EXPECT_EQ(row, 13);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{4, 4, 4, 1}));
  EXPECT_FALSE(stream.next(chunk, 4));
  EXPECT_THROW(stream.next(chunk, 0), ConfigError);
}

TEST(CsvStream, BatchSourceMatchesTheInMemoryTransformAndShards) {
  const std::vector<std::string> files = stream_files();
  const CsvTable whole = read_csv(files, stream_options());
  const FeatureTransform ft({numeric_column("x"), categorical_column_with_hash_bucket("tags", 97)}, LabelSpec{}, whole);
  const Dataset d = ft.apply(whole);
  const auto collect = [&](AutoShard policy, int workers, int worker, bool drop) {
    BatchIterator it(csv_batch_source(files, stream_options(), ft, 4, drop, policy, workers, worker, 3));
    std::vector<float> xs;
    std::vector<int> sizes;
    Batch b;
    while (it.next(b)) {
      sizes.push_back(b.size);
      for (int r = 0; r < b.size; ++r) {
        const auto x = static_cast<std::int64_t>(b.features[static_cast<std::size_t>(r)]);
        xs.push_back(b.features[static_cast<std::size_t>(r)]);
        // Every row equals the in-memory transform's row x.
        EXPECT_EQ(b.labels[static_cast<std::size_t>(r)], d.labels[static_cast<std::size_t>(x)]);
        for (int f = 0; f < b.num_fields; ++f)
          EXPECT_EQ(b.sparse_ids[static_cast<std::size_t>(r * b.num_fields + f)], d.sparse_ids[static_cast<std::size_t>(x * d.num_fields + f)]);
      }
    }
    return std::make_pair(xs, sizes);
  };
  const auto all = collect(AutoShard::kOff, 1, 0, false);
  EXPECT_EQ(all.first, d.features);
  EXPECT_EQ(all.second, (std::vector<int>{4, 4, 4, 1}));
  EXPECT_EQ(collect(AutoShard::kOff, 1, 0, true).second, (std::vector<int>{4, 4, 4}));
  // DATA: rows alternate between 2 workers; FILE: one file each (AUTO picks FILE with 2 files).
  EXPECT_EQ(collect(AutoShard::kData, 2, 1, false).first, (std::vector<float>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(collect(AutoShard::kAuto, 2, 1, false).first, (std::vector<float>{7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(collect(AutoShard::kAuto, 3, 2, false).first, (std::vector<float>{2, 5, 8, 11}));  // DATA: 2 files < 3
  // csv_shard_rows counts what each share's source yields (the training loop's steps per epoch).
  for (const AutoShard policy : {AutoShard::kOff, AutoShard::kData, AutoShard::kAuto})
    for (int workers = 1; workers <= 3; ++workers)
      for (int w = 0; w < workers; ++w) {
        if (policy == AutoShard::kOff && workers > 1) continue;
        EXPECT_EQ(csv_shard_rows(files, stream_options(), policy, workers, w, 2),
                  static_cast<std::int64_t>(collect(policy, workers, w, false).first.size()))
            << static_cast<int>(policy) << " " << workers << " " << w;
      }
  // The same from the files' counts (each counted by one worker in `strata train`), also for FILE.
  std::vector<std::int64_t> file_rows;
  for (const auto& f : files) file_rows.push_back(count_csv_rows({f}, stream_options()));
  EXPECT_EQ(file_rows, (std::vector<std::int64_t>{7, 6}));
  for (const AutoShard policy : {AutoShard::kOff, AutoShard::kData, AutoShard::kAuto, AutoShard::kFile})
    for (int workers = 1; workers <= 3; ++workers) {
      if (policy == AutoShard::kFile && workers > 2) continue;
      EXPECT_EQ(csv_shards_by_line(files.size(), policy, workers),
                workers > 1 && (policy == AutoShard::kData || (policy == AutoShard::kAuto && workers > 2)));
      for (int w = 0; w < workers; ++w)
        EXPECT_EQ(csv_shard_rows_of(file_rows, policy, workers, w),
                  static_cast<std::int64_t>(collect(policy, workers, w, false).first.size()))
            << static_cast<int>(policy) << " " << workers << " " << w;
    }
  EXPECT_TRUE(Contains(config_error([&] { csv_shard_rows_of(file_rows, AutoShard::kFile, 3, 0); }),
                       "FILE sharding needs at least one file per worker: 2 files for 3 workers"));
  EXPECT_THROW(csv_shard_rows_of({7, -1}, AutoShard::kData, 2, 0), Error);
  EXPECT_TRUE(Contains(config_error([&] { csv_batch_source(files, stream_options(), ft, 4, false, AutoShard::kFile, 3, 0); }),
                       "FILE sharding needs at least one file per worker: 2 files for 3 workers"));
  // A shuffle buffer permutes the rows (each exactly once), deterministically in the seed.
  const auto shuffled = [&](std::int64_t buffer, std::uint64_t seed) {
    BatchIterator it(csv_batch_source(files, stream_options(), ft, 4, false, AutoShard::kOff, 1, 0, 3, buffer, seed));
    std::vector<float> xs;
    Batch b;
    while (it.next(b)) {
      for (int r = 0; r < b.size; ++r) {
        const float x = b.features[static_cast<std::size_t>(r)];
        xs.push_back(x);
        EXPECT_EQ(b.labels[static_cast<std::size_t>(r)], d.labels[static_cast<std::size_t>(x)]);
        EXPECT_EQ(b.sparse_ids[static_cast<std::size_t>(r * b.num_fields)], d.sparse_ids[static_cast<std::size_t>(x) * 2]);
      }
    }
    return xs;
  };
  const std::vector<float> s1 = shuffled(5, 1);
  EXPECT_NE(s1, d.features);
  std::vector<float> sorted = s1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, d.features);
  EXPECT_EQ(shuffled(5, 1), s1);
  EXPECT_NE(shuffled(5, 2), s1);
  EXPECT_EQ(shuffled(1, 9), d.features);  // a buffer of one row keeps the order, as in TF
  // A bad row deep in a file surfaces from next() with its file and line.
  const std::string bad = write_text("bad.csv", "label,x,tags\n0,1,a\n1,oops,b\n");
  BatchIterator it(csv_batch_source({bad}, stream_options(), ft, 1, false, AutoShard::kOff, 1, 0, 1));
  Batch b;
  EXPECT_TRUE(it.next(b));
  EXPECT_TRUE(Contains(config_error([&] { it.next(b); }), bad + ":3: column 'x': 'oops' is not a finite number"));
}

// ---- JSON ---------------------------------------------------------------------------------------

TEST(FeatureColumnJson, ParsesEveryColumnType) {
  const std::string vocab = write_text("v.txt", "x\ny\n");
  const std::string text = R"({"feature_columns": [
    {"type": "numeric", "key": "I1", "default_value": 0, "normalizer": {"mean": 1.5, "std": 2}},
    {"type": "bucketized", "source": {"type": "numeric_column", "key": "I2"}, "boundaries": [0, 1, 10]},
    {"type": "indicator", "categorical": {"type": "identity", "key": "I3", "num_buckets": 10, "default_value": 0}},
    {"type": "embedding", "categorical": {"type": "hash_bucket", "key": "C1", "hash_bucket_size": 100000}, "dimension": 8},
    {"type": "embedding", "categorical": {"type": "vocabulary_list", "key": "C2", "vocabulary": ["a", "b"],
      "num_oov_buckets": 2}, "dimension": 4, "combiner": "sum"},
    {"type": "categorical_column_with_vocabulary_file", "key": "C3", "vocabulary_file": ")" +
                           vocab.substr(vocab.rfind('/') + 1) + R"("},
    {"type": "crossed", "keys": ["C1", {"type": "bucketized", "source": {"type": "numeric", "key": "I2"},
      "boundaries": [5]}], "hash_bucket_size": 1000, "hash_key": 18446744073709551615}
  ]})";
  const std::vector<FeatureColumn> c = parse_feature_columns_json(text, "spec.json", vocab.substr(0, vocab.rfind('/')));
  ASSERT_EQ(c.size(), 7u);
  EXPECT_EQ(c[0].normalizer->std, 2.0);
  EXPECT_EQ(c[1].boundaries, (std::vector<double>{0, 1, 10}));
  EXPECT_EQ(c[2].name(), "I3_indicator");
  EXPECT_EQ(c[2].categorical->default_id, 0);
  EXPECT_EQ(c[3].dimension, 8);
  EXPECT_EQ(c[3].combiner, Combiner::kMean);  // TF's default
  EXPECT_EQ(c[3].vocabulary_size(), 100000);
  EXPECT_EQ(c[4].combiner, Combiner::kSum);
  EXPECT_EQ(c[4].vocabulary_size(), 4);
  EXPECT_EQ(c[5].vocabulary, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(c[6].name(), "C1_X_I2_bucketized");
  EXPECT_EQ(c[6].hash_key, 18446744073709551615ULL);
}

TEST(FeatureColumnJson, ParsesDynamicHashColumns) {
  const std::string text = R"([
    {"type": "embedding", "categorical": {"type": "hash_bucket", "key": "C1", "dynamic": true, "admit_after": 3,
      "capacity": 5000, "ttl": 100}, "dimension": 8},
    {"type": "embedding", "categorical": {"type": "dynamic_hash", "key": "C2"}, "dimension": 4},
    {"type": "hash_bucket", "key": "C3", "hash_bucket_size": 10, "dynamic": false}
  ])";
  const std::vector<FeatureColumn> c = parse_feature_columns_json(text, "spec.json");
  ASSERT_EQ(c.size(), 3u);
  ASSERT_TRUE(c[0].categorical->dynamic);
  EXPECT_EQ(c[0].categorical->dynamic_options.admit_after, 3);
  EXPECT_EQ(c[0].categorical->dynamic_options.capacity, 5000);
  EXPECT_EQ(c[0].categorical->dynamic_options.ttl, 100);
  EXPECT_EQ(c[0].vocabulary_size(), kDynamicVocabulary);
  ASSERT_TRUE(c[1].categorical->dynamic);
  EXPECT_EQ(c[1].categorical->dynamic_options.admit_after, 0);
  EXPECT_EQ(c[1].categorical->dynamic_options.capacity, DynamicIdOptions{}.capacity);
  EXPECT_FALSE(c[2].dynamic);
  EXPECT_EQ(c[2].vocabulary_size(), 10);
  struct Case {
    std::string text, expect;
  } cases[] = {
      {R"([{"type": "hash_bucket", "key": "a", "dynamic": 1}])", "feature_columns[0].dynamic: expected true or false, got 1"},
      {R"([{"type": "hash_bucket", "key": "a", "dynamic": true, "hash_bucket_size": 10}])",
       "feature_columns[0].hash_bucket_size: unknown member"},
      {R"([{"type": "hash_bucket", "key": "a", "dynamic": true, "admit_after": -1}])",
       "feature_columns[0].admit_after: expected an integer in [0, 65535], got -1"},
      {R"([{"type": "dynamic_hash", "key": "a", "capacity": 0}])", "feature_columns[0].capacity: expected an integer in [1, "},
      {R"([{"type": "dynamic_hash", "key": "a", "ttl": "never"}])", "feature_columns[0].ttl: expected an integer"},
      {R"([{"type": "dynamic_hash", "key": "a", "admit_after": 65536}])", "feature_columns[0].admit_after: expected an integer in [0, 65535]"},
      {R"([{"type": "dynamic_hash", "key": "a", "capacity": 2147483648}])", "feature_columns[0].capacity: expected an integer in [1, 2147483647]"},
      {R"([{"type": "dynamic_hash", "key": "a", "dynamic": false}])", "feature_columns[0].dynamic: a dynamic_hash column is dynamic"},
      {R"([{"type": "dynamic_hash", "key": "a", "admitafter": 2}])", "feature_columns[0].admitafter: unknown member"},
      {R"([{"type": "hash_bucket", "key": "a", "hash_bucket_size": 10, "dynamic": false, "ttl": 5}])",
       "feature_columns[0].ttl: unknown member"},
      {R"([{"type": "indicator", "categorical": {"type": "dynamic_hash", "key": "a"}}])", "a dynamic hash column has no vocabulary"},
  };
  for (const Case& k : cases) {
    const std::string message = config_error([&] { parse_feature_columns_json(k.text, "spec.json"); });
    EXPECT_TRUE(Contains(message, k.expect)) << k.text << " -> " << message;
  }
}

TEST(FeatureColumnJson, ParsesCsvOptions) {
  const CsvOptions c = parse_csv_options_json(R"({"preset": "criteo", "header": "absent"})", "spec.json");
  EXPECT_EQ(c.delimiter, '\t');
  EXPECT_EQ(c.header, CsvHeader::kAbsent);
  ASSERT_EQ(c.columns.size(), 40u);
  const CsvOptions o = parse_csv_options_json(
      R"({"delimiter": "tab", "columns": [{"name": "y", "type": "float"}, {"name": "tags", "default": "", "separator": "|", "max_values": 5},
          {"name": "n", "type": "int64", "default": 0}], "max_record_bytes": 4096})",
      "spec.json");
  EXPECT_EQ(o.delimiter, '\t');
  EXPECT_EQ(o.header, CsvHeader::kDetect);
  EXPECT_EQ(o.max_record_bytes, 4096u);
  ASSERT_EQ(o.columns.size(), 3u);
  EXPECT_EQ(o.columns[0].type, CsvType::kFloat);
  EXPECT_FALSE(o.columns[0].default_value.has_value());
  EXPECT_EQ(o.columns[1].type, CsvType::kString);
  EXPECT_EQ(o.columns[1].separator, '|');
  EXPECT_EQ(o.columns[1].max_values, 5);
  EXPECT_EQ(o.columns[2].default_value, std::optional<std::string>("0"));
  struct Case {
    std::string text, expect;
  } cases[] = {
      {R"({"preset": "kaggle"})", "spec.json: csv.preset: unknown preset \"kaggle\""},
      {R"({"preset": "criteo", "columns": [{"name": "a"}]})", "csv.columns: cannot be combined with a preset"},
      {R"({"delimiter": ";;"})", "csv.delimiter: expected one character"},
      {R"({"delimiter": "\""})", "csv.delimiter: expected one character"},
      {R"({"header": true})", "csv.header: expected \"detect\""},
      {R"({"columns": [{"name": "a", "type": "int32"}]})", "csv.columns[0].type: unknown column type 'int32'"},
      {R"({"columns": [{"name": "a", "sep": "|"}]})", "csv.columns[0].sep: unknown member"},
      {R"({"columns": [{"type": "float"}]})", "csv.columns[0].name: expected a column name"},
      {R"({"max_record_bytes": 0})", "csv.max_record_bytes: expected an integer in [1, 2^31]"},
      {R"({"columns": [{"name": "a", "max_values": 3}]})", "csv.columns[0].max_values: expected an integer in [1, 4096] on a column with a separator"},
      {R"({"delimeter": ","})", "csv.delimeter: unknown member"},
  };
  for (const Case& k : cases) EXPECT_TRUE(Contains(config_error([&] { parse_csv_options_json(k.text, "spec.json"); }), k.expect)) << k.text;
}

TEST(FeatureColumnSecurity, SchemaErrorsNameTheFieldPath) {
  struct Case {
    std::string text, expect;
  } cases[] = {
      {R"([{"type": "numeric", "key": "a"}, {"type": "numeric"}])", "spec.json: feature_columns[1]: missing \"key\""},
      {R"([{"type": "numeric", "key": "a", "shape": 0}])", "feature_columns[0].shape: expected an integer in [1, 65536], got 0"},
      {R"([{"type": "numeric", "key": 5}])", "feature_columns[0].key: expected a column name, got 5"},
      {R"([{"type": "hash_bucket", "key": "a", "hash_bucket_sise": 5}])", "feature_columns[0].hash_bucket_sise: unknown member"},
      {R"([{"type": "embedding", "categorical": {"type": "hash_bucket", "key": "a", "hash_bucket_size": -5}, "dimension": 2}])",
       "feature_columns[0].categorical.hash_bucket_size: expected an integer in [1, "},
      {R"([{"type": "embedding", "categorical": {"type": "numeric", "key": "a"}, "dimension": 2}])",
       "feature_columns[0].categorical: expected a categorical column"},
      {R"([{"type": "embedding", "categorical": {"type": "identity", "key": "a", "num_buckets": 3}, "dimension": 2, "combiner": "max"}])",
       "feature_columns[0].combiner: unknown combiner 'max'"},
      {R"([{"type": "bucketized", "source": {"type": "numeric", "key": "a"}, "boundaries": [3, 1]}])",
       "feature_columns[0]: bucketized_column('a'): boundaries must be sorted and distinct"},
      {R"([{"type": "vocabulary_list", "key": "a", "vocabulary": ["x", "x"]}])", "feature_columns[0]: categorical_column_with_vocabulary_list('a'): the vocabulary has 'x' twice"},
      {R"([{"type": "vocabulary_list", "key": "a", "vocabulary": ["x"], "num_oov_buckets": 1, "default_value": 0}])",
       "default_value and num_oov_buckets cannot both be set"},
      {R"([{"type": "crossed", "keys": ["a"], "hash_bucket_size": 10}])", "feature_columns[0]: crossed_column: needs at least 2 keys"},
      {R"([{"type": "crossed", "keys": ["a", {"type": "embedding"}], "hash_bucket_size": 10}])", "feature_columns[0].keys[1]: missing \"categorical\""},
      {R"([{"type": "crossed", "keys": ["a", "b"], "hash_bucket_size": 10, "hash_key": -1}])", "feature_columns[0].hash_key: expected an integer"},
      {R"([{"type": "wide"}])", "feature_columns[0].type: unknown column type \"wide\""},
      {R"([{"type": "vocabulary_file", "key": "a", "vocabulary_file": "/nonexistent/v.txt"}])", "cannot open vocabulary file '/nonexistent/v.txt'"},
      {R"([])", "feature_columns: the list is empty"},
      {R"({"columns": []})", "spec.json: no \"feature_columns\" member"},
      {R"([{"type": "numeric", "key": "a", "default_value": 1e400}])", "spec.json is not valid JSON"},
      {R"([{"type": )", "spec.json is not valid JSON"},
      {std::string(100000, '[') , "JSON nested deeper than"},
      {R"([{"type": "numeric", "key": "a\nb"}])", "numeric_column: key 'a?b' has a control character"},
      {R"([{"type": "numeric", "key": "a", "x\ny": 1}])", "feature_columns[0].x?y: unknown member"},
      {R"([{"type": "vocabulary_list", "key": "a", "vocabulary": ["x\ny", "x\ny"]}])", "the vocabulary has 'x?y' twice"},
  };
  for (const Case& c : cases) {
    const std::string message = config_error([&] { parse_feature_columns_json(c.text, "spec.json"); });
    EXPECT_TRUE(Contains(message, c.expect)) << c.text.substr(0, 120);
  }
}

TEST(FeatureColumnSecurity, BadVocabularyFilesNameFileAndLine) {
  const std::string dup = write_text("dup.txt", "a\nb\na\n");
  EXPECT_TRUE(Contains(config_error([&] { categorical_column_with_vocabulary_file("k", dup); }), dup + ":3: term 'a' appears twice"));
  const std::string blank = write_text("blank.txt", "a\n\nb\n");
  EXPECT_TRUE(Contains(config_error([&] { categorical_column_with_vocabulary_file("k", blank); }), blank + ":2: empty term"));
  const std::string empty = write_text("empty.txt", "");
  EXPECT_TRUE(Contains(config_error([&] { categorical_column_with_vocabulary_file("k", empty); }), "has no terms"));
  const std::string two = write_text("two.txt", "a\nb\n");
  EXPECT_TRUE(Contains(config_error([&] { categorical_column_with_vocabulary_file("k", two, 3); }),
                       "vocabulary_size 3 but vocabulary file '" + two + "' has 2 terms"));
}

TEST(FeatureColumnSecurity, BadValuesAtTransformTimeNameFileLineAndColumn) {
  const CsvTable t = small_table("t.csv", kRows);
  // identity without a default: 3 is outside [0, 2).
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({categorical_column_with_identity("n", 2)}, LabelSpec{}, t).apply(t); }),
                       ":2: column 'n': id 3 is outside [0, 2)"));
  // numeric of shape 3 over a column with 2 values, and a string column that is not a number.
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({numeric_column("pair", 3)}, LabelSpec{}, t).apply(t); }),
                       ":2: column 'pair': 2 values, numeric_column 'pair' has shape 3"));
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({numeric_column("word")}, LabelSpec{}, t).apply(t); }),
                       ":2: column 'word': 'a' is not a number"));
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({numeric_column("nope")}, LabelSpec{}, t); }),
                       "numeric column 'nope': no column 'nope' in the data (columns: label, x, pair, n, word, tags)"));
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({crossed_column({"x", "word"}, 5)}, LabelSpec{}, t); }),
                       "key 'x' is a float column"));
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({numeric_column("x"), numeric_column("x")}, LabelSpec{}, t); }),
                       "two columns are named 'x'"));
  // A number beyond float's range, raw or after normalising, is refused, not converted.
  CsvOptions big;
  big.columns = {col("label", CsvType::kFloat), col("v", CsvType::kString)};
  const CsvTable b = read_csv({write_text("big.csv", "label,v\n1,2\n1,1e300\n")}, big);
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({numeric_column("v")}, LabelSpec{}, b).apply(b); }),
                       ":3: column 'v': the value (normalised: 1000000"));
  EXPECT_TRUE(Contains(config_error([&] {
                         FeatureTransform({numeric_column("v", 1, std::nullopt, Normalizer{0, 1e-300})}, LabelSpec{}, b).apply(b);
                       }),
                       ":2: column 'v': the value"));
  LabelSpec target;
  target.key = "v";
  target.regression = true;
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({numeric_column("label")}, target, b).apply(b); }),
                       ":3: column 'v': the target 1000000"));
  // A cross whose product of slots passes the bound is refused when planned.
  std::string wide = "label,t\n0,";
  for (int i = 0; i < 100; ++i) wide += (i ? "|" : "") + std::to_string(i);
  CsvOptions o;
  o.columns = {col("label", CsvType::kInt64), col("t", CsvType::kString, "", '|')};
  const CsvTable w = read_csv({write_text("wide.csv", wide + "\n")}, o);
  EXPECT_TRUE(Contains(config_error([&] { FeatureTransform({crossed_column({"t", "t"}, 5)}, LabelSpec{}, w); }),
                       "needs more than 4096 slots per row"));
}


// A spec of numeric columns over a dense dataset (Fashion-MNIST, .h5): the columns take the
// features in order, normalisers apply to train and test alike, and everything else is refused.
TEST(FeatureColumnDense, ColumnsTakeTheFeaturesInOrderAndNormalise) {
  Dataset d;
  d.size = 2;
  d.dense_dim = 3;
  d.features = {1, 2, 3, 4, 5, 6};
  d.labels = {0, 4};
  d.num_classes = 5;
  const std::vector<FeatureColumn> cols = {numeric_column("a", 1), numeric_column("b", 2, std::nullopt, Normalizer{1.0, 2.0})};
  LabelSpec label;
  label.num_classes = 0;
  const FeatureLayout layout = dense_feature_layout(cols, label, d, "--data x.h5");
  ASSERT_EQ(layout.columns.size(), 2u);
  EXPECT_EQ(layout.columns[1].name, "b");
  EXPECT_EQ(layout.columns[1].dense_offset, 1);
  EXPECT_EQ(layout.columns[1].dense_width, 2);
  EXPECT_EQ(layout.dense_dim, 3);
  EXPECT_EQ(layout.num_fields, 0);
  EXPECT_EQ(layout.label.num_classes, 5);  // 0: the dataset's
  normalize_dense(cols, layout, d, "--data x.h5");
  const std::vector<float> want = {1, 0.5f, 1, 4, 2, 2.5f};
  EXPECT_EQ(d.features, want);

  label.num_classes = 8;  // more classes than the labels use: kept, and the data is told
  const FeatureLayout wide = dense_feature_layout(cols, label, d, "--data x.h5");
  normalize_dense({numeric_column("a", 1), numeric_column("b", 2)}, wide, d, "--data x.h5");
  EXPECT_EQ(d.num_classes, 8);
}

TEST(FeatureColumnDense, RefusesWhatDenseDataCannotFeed) {
  Dataset d;
  d.size = 1;
  d.dense_dim = 4;
  d.features = {0, 0, 0, 0};
  d.labels = {6};
  d.num_classes = 7;
  LabelSpec label;
  EXPECT_TRUE(Contains(config_error([&] {
                         dense_feature_layout({categorical_column_with_hash_bucket("img", 10)}, label, d, "--data fashion-mnist");
                       }),
                       "feature column 'img': --data fashion-mnist holds dense features only"));
  EXPECT_TRUE(Contains(config_error([&] { dense_feature_layout({numeric_column("img", 3)}, label, d, "--data f.h5"); }),
                       "their shapes add up to 3 features, but --data f.h5 has 4 per example"));
  label.num_classes = 2;
  EXPECT_TRUE(Contains(config_error([&] { dense_feature_layout({numeric_column("img", 4)}, label, d, "--data f.h5"); }),
                       "num_classes is 2, but --data f.h5 has labels up to 6"));
  label.regression = true;
  EXPECT_TRUE(Contains(config_error([&] { dense_feature_layout({numeric_column("img", 4)}, label, d, "--data f.h5"); }),
                       "a regressor needs float targets"));
  EXPECT_TRUE(Contains(config_error([&] {
                         dense_feature_layout({numeric_column("img", 2), numeric_column("img", 2)}, LabelSpec{}, d, "--data f.h5");
                       }),
                       "two columns are named 'img'"));
}

}  // namespace
}  // namespace strata::data

namespace strata::data {
namespace {
using strata::testing::config_error;
using strata::testing::Contains;

// "for_keys" repeats one element per key: a range or a list, into nested categoricals and sources.
TEST(FeatureColumnJson, ForKeysRepeatsAnElementPerKey) {
  const std::vector<FeatureColumn> c = parse_feature_columns_json(R"([
    {"type": "numeric", "for_keys": "I1..I3", "normalizer": {"mean": 1, "std": 2}},
    {"type": "embedding", "dimension": 4, "for_keys": ["C7", "C9"],
     "categorical": {"type": "hash_bucket", "hash_bucket_size": 100}},
    {"type": "indicator", "for_keys": "B8..B10",
     "categorical": {"type": "bucketized", "source": {"type": "numeric"}, "boundaries": [0, 1]}},
    {"type": "numeric", "key": "x"}
  ])", "spec.json");
  std::vector<std::string> names;
  for (const auto& f : c) names.push_back(f.name());
  const std::vector<std::string> want = {"I1", "I2", "I3", "C7_embedding", "C9_embedding", "B8_bucketized_indicator",
                                         "B9_bucketized_indicator", "B10_bucketized_indicator", "x"};
  EXPECT_EQ(names, want);
  ASSERT_TRUE(c[1].normalizer.has_value());
  EXPECT_EQ(c[1].normalizer->std, 2);
  EXPECT_EQ(c[4].categorical->num_buckets, 100);
}

// "for_pairs" makes one crossed column per unordered pair, in list order, each the same column as
// the one written out by hand.
TEST(FeatureColumnJson, ForPairsCrossesEveryPairOnce) {
  const std::vector<FeatureColumn> c = parse_feature_columns_json(R"([
    {"type": "crossed", "for_pairs": "C1..C4", "hash_bucket_size": 1000, "hash_key": 7},
    {"type": "crossed", "for_pairs": ["a", "b"], "hash_bucket_size": 10}
  ])", "spec.json");
  ASSERT_EQ(c.size(), 7u);
  const std::vector<FeatureColumn> by_hand = parse_feature_columns_json(R"([
    {"type": "crossed", "keys": ["C1", "C2"], "hash_bucket_size": 1000, "hash_key": 7},
    {"type": "crossed", "keys": ["C1", "C3"], "hash_bucket_size": 1000, "hash_key": 7},
    {"type": "crossed", "keys": ["C1", "C4"], "hash_bucket_size": 1000, "hash_key": 7},
    {"type": "crossed", "keys": ["C2", "C3"], "hash_bucket_size": 1000, "hash_key": 7},
    {"type": "crossed", "keys": ["C2", "C4"], "hash_bucket_size": 1000, "hash_key": 7},
    {"type": "crossed", "keys": ["C3", "C4"], "hash_bucket_size": 1000, "hash_key": 7},
    {"type": "crossed", "keys": ["a", "b"], "hash_bucket_size": 10}
  ])", "spec.json");
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].name(), by_hand[i].name()) << i;
    EXPECT_EQ(c[i].kind, ColumnKind::kCrossed) << i;
    EXPECT_EQ(c[i].num_buckets, by_hand[i].num_buckets) << i;
    EXPECT_EQ(c[i].hash_key, by_hand[i].hash_key) << i;
  }
  EXPECT_EQ(c[0].name(), "C1_X_C2");
  EXPECT_EQ(c[0].hash_key, 7u);
  EXPECT_NE(c[0].name(), c[1].name());
}

TEST(FeatureColumnSecurity, ForPairsErrorsNameTheElement) {
  struct Case {
    std::string text, expect;
  } cases[] = {
      {R"([{"type": "crossed", "for_pairs": ["a"], "hash_bucket_size": 5}])", "feature_columns[0].for_pairs: needs at least 2 keys"},
      {R"([{"type": "crossed", "for_pairs": "C1..C3", "keys": ["x", "y"], "hash_bucket_size": 5}])",
       "a column with \"for_pairs\" takes its keys from there"},
      {R"([{"type": "numeric", "for_pairs": "C1..C3"}])", "\"for_pairs\" needs a crossed column"},
      {R"([{"type": "crossed", "for_pairs": "C1..C200", "hash_bucket_size": 5}])", "more than 16384 columns (19900 pairs of 200 keys)"},
      {R"([{"type": "crossed", "for_pairs": "C3..C1", "hash_bucket_size": 5}])", "feature_columns[0].for_pairs: expected an array"},
      {R"([{"type": "crossed", "for_pairs": "C1..C3", "hash_bucket_size": 0}])", "feature_columns[0] (keys C1, C2).hash_bucket_size"},
  };
  for (const Case& k : cases) {
    const std::string message = config_error([&] { parse_feature_columns_json(k.text, "spec.json"); });
    EXPECT_TRUE(Contains(message, k.expect)) << k.text << "\n" << message;
  }
}

TEST(FeatureColumnSecurity, ForKeysErrorsNameTheElement) {
  struct Case {
    std::string text, expect;
  } cases[] = {
      {R"([{"type": "numeric", "for_keys": "C1..B3"}])", "feature_columns[0].for_keys: expected an array of column names or a range"},
      {R"([{"type": "numeric", "for_keys": "C5..C1"}])", "numbers rising"},
      {R"([{"type": "numeric", "for_keys": "C01..C10"}])", "no leading zeros"},
      {R"([{"type": "numeric", "for_keys": "C1..C999999"}])", "the range has more than 4096 keys"},
      {R"([{"type": "numeric", "for_keys": 7}])", "feature_columns[0].for_keys: expected an array"},
      {R"([{"type": "numeric", "for_keys": []}])", "expected 1 to 4096 column names, got 0"},
      {R"([{"type": "numeric", "for_keys": ["a", ""]}])", "feature_columns[0].for_keys: [1]: expected a column name"},
      {R"([{"type": "numeric", "key": "a", "for_keys": ["b"]}])", "feature_columns[0]: a column with \"for_keys\" takes its key from there"},
      {R"([{"type": "crossed", "for_keys": ["b"], "keys": ["x", "y"], "hash_bucket_size": 5}])",
       "\"for_keys\" needs a column that reads one key (not crossed)"},
      {R"([{"type": "embedding", "for_keys": "C1..C3", "dimension": 0, "categorical": {"type": "hash_bucket", "hash_bucket_size": 5}}])",
       "spec.json: feature_columns[0] (key C1).dimension: expected an integer in [1, 65536], got 0"},
  };
  for (const Case& k : cases) {
    const std::string message = config_error([&] { parse_feature_columns_json(k.text, "spec.json"); });
    EXPECT_TRUE(Contains(message, k.expect)) << k.text << "\n" << message;
  }
}

}  // namespace
}  // namespace strata::data
