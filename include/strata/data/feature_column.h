// Feature columns: TensorFlow's tf.feature_column names and meanings over a CsvTable (csv.h),
// turned into a data::Dataset plus a layout a model builder reads. docs/DATA.md describes them
// for users; the JSON schema is below and in that document.
//
// Columns (descriptors; the factories check their arguments and throw ConfigError):
//  - numeric_column(key, shape, default_value, normalizer): `shape` floats taken from the CSV
//    column `key` (shape > 1 needs a multi-valued column with exactly that many values; a row
//    with none takes default_value, repeated, when given). The normaliser, when given, is
//    (x - mean) / std with constants (std > 0). Dense.
//  - bucketized_column(source, boundaries): TF's Bucketize: with sorted boundaries b, a value x
//    falls in bucket i when b[i-1] <= x < b[i] (bucket 0 below b[0], bucket len(b) at or above the
//    last), applied to the source's normalised value as TF does. A source of shape n gives n ids,
//    the i-th offset by i * (len(b) + 1); vocabulary (len(b) + 1) * n. Categorical.
//  - categorical_column_with_identity(key, num_buckets, default_value): the integer value is the
//    id. -1 means "missing" and gives no id (TF drops it the same way); another value outside
//    [0, num_buckets) takes default_value, or is an error naming file:line when there is none.
//  - categorical_column_with_hash_bucket(key, hash_bucket_size): fingerprint64(text) % size, TF's
//    to_hash_bucket_fast (hash.h); an integer column hashes its decimal text, as TF's as_string.
//  - categorical_column_with_vocabulary_list / _file(key, terms, num_oov_buckets, default_value):
//    a term's id is its position; an out-of-vocabulary value goes to bucket
//    size + fingerprint64(text) % num_oov_buckets when num_oov_buckets > 0 (TF's
//    StaticVocabularyTable with its default fast hash), else to default_value, or gives no id when
//    default_value is -1. Setting both is an error, as in TF. Duplicate terms are errors. A
//    vocabulary file has one term per line (LF or CRLF), at most kMaxVocabularyFileBytes; the
//    first vocabulary_size lines when given; errors name the file and line.
//  - crossed_column(keys, hash_bucket_size, hash_key): each key is a CSV column name (a string
//    value contributes fingerprint64(value), an int64 value itself) or a categorical column (its
//    ids). Every combination of the keys' values (the cartesian product, the last key varying
//    fastest) gives id sparse_cross_hash(hashes, hash_bucket_size, hash_key): FingerprintCat64
//    folded from hash_key (default 0xDECAFCAFFE). This is exactly TF's sparse_cross_hashed, hence
//    crossed_column's bucket assignment, for string and int64 keys and for categorical keys whose
//    ids agree with TF's; tests check TF's published sparse_cross_hashed values.
//  - embedding_column(categorical, dimension, combiner = mean|sum|sqrtn) and
//    indicator_column(categorical): descriptors for the model builder; their ids are the
//    categorical column's.
// Empty strings are "missing" in every categorical column (no id), as TF's dense-to-sparse
// conversion drops them.
//
// The Dataset a FeatureTransform makes:
//  - dense features: the numeric columns, in list order, each at its dense offset;
//  - sparse_ids: each categorical, embedding or indicator column in list order occupies
//    contiguous slots [first_slot, first_slot + num_slots) of every row; ids are local to the
//    column's own vocabulary [0, vocabulary_size) and unused slots hold kNoId (-1), used ones
//    first. sparse_vocab is the largest vocabulary_size (so validate() holds); a model adds its own
//    per-column offsets or keeps one table per column;
//  - labels (LabelSpec::regression false: int classes in [0, num_classes)) or targets (true).
//
// Thread-safety: descriptors and a built FeatureTransform are immutable; apply() is reentrant.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/data/csv.h"
#include "strata/data/dataset.h"
#include "strata/data/hash.h"

namespace strata::data {

enum class ColumnKind {
  kNumeric,
  kBucketized,
  kIdentity,
  kHashBucket,
  kVocabulary,  // both vocabulary_list and vocabulary_file
  kCrossed,
  kEmbedding,
  kIndicator,
};
const char* to_string(ColumnKind kind);

enum class Combiner { kMean, kSum, kSqrtn };
const char* to_string(Combiner combiner);
// "mean", "sum", "sqrtn"; ConfigError naming `what` otherwise.
Combiner parse_combiner(std::string_view text, std::string_view what);

struct Normalizer {
  double mean = 0;
  double std = 1;  // > 0
};

// A dynamic hash column's table (categorical_column_with_dynamic_hash): admission and eviction,
// the fields of ps::DynamicVariableSpec (docs/DYNAMIC.md).
struct DynamicIdOptions {
  std::int64_t admit_after = 0;                   // an id gets a row once seen this often, in [0, 65535]
  std::int64_t capacity = std::int64_t{1} << 24;  // most rows per PS, in [1, 2^31 - 1]
  std::int64_t ttl = 0;                           // rows not updated for ttl steps go, in [0, 2^31]; 0: never
};
// The dynamic table's own limits (src/ps/dynamic_table.cc).
inline constexpr std::int64_t kMaxDynamicAdmitAfter = 65535;
inline constexpr std::int64_t kMaxDynamicCapacity = (std::int64_t{1} << 31) - 1;
// The vocabulary size a dynamic column reports: its ids lie in [0, kDynamicVocabulary).
inline constexpr std::int64_t kDynamicVocabulary = std::numeric_limits<std::int64_t>::max();
// The id of `text` in a dynamic hash column: fingerprint64(text) with its top bit cleared (63
// bits, no modulo, so never kNoId), the one value 2^63-1 folded to 2^63-2.
std::int64_t dynamic_hash_id(std::string_view text);

struct FeatureColumn;
using FeatureColumnPtr = std::shared_ptr<const FeatureColumn>;

// One key of a crossed column: a raw CSV column (by name) or a categorical column.
struct CrossKey {
  CrossKey(std::string raw) : raw_key(std::move(raw)) {}  // NOLINT: implicit, as TF's keys list
  CrossKey(const char* raw) : raw_key(raw) {}             // NOLINT
  CrossKey(const FeatureColumn& categorical);             // NOLINT
  std::string raw_key;
  FeatureColumnPtr categorical;
};

// A column descriptor; build one with the factories below (they check every field). Only the
// fields of its kind are meaningful.
struct FeatureColumn {
  ColumnKind kind = ColumnKind::kNumeric;
  std::string key;  // numeric, identity, hash bucket, vocabulary: the CSV column read
  // numeric
  int shape = 1;
  std::optional<float> default_value;
  std::optional<Normalizer> normalizer;
  // bucketized (source: a numeric column)
  std::vector<double> boundaries;
  FeatureColumnPtr source;
  // identity: num_buckets; hash bucket and crossed: hash_bucket_size
  std::int64_t num_buckets = 0;
  // hash bucket: dynamic (categorical_column_with_dynamic_hash): no buckets, ids are
  // dynamic_hash_id(text), num_buckets is kDynamicVocabulary, and an embedding over it is a
  // dynamic table with these options.
  bool dynamic = false;
  DynamicIdOptions dynamic_options;
  // identity and vocabulary: the id of an out-of-range / out-of-vocabulary value; -1 for none
  std::int64_t default_id = -1;
  bool has_default_id = false;  // identity only: false makes an out-of-range value an error
  // vocabulary
  std::vector<std::string> vocabulary;
  std::string vocabulary_file;  // where the terms came from, empty for a list
  std::int64_t num_oov_buckets = 0;
  // crossed
  std::vector<CrossKey> cross_keys;
  std::uint64_t hash_key = kDefaultCrossHashKey;
  // embedding, indicator
  FeatureColumnPtr categorical;
  int dimension = 0;
  Combiner combiner = Combiner::kMean;

  // TF's column names: the key; "<source>_bucketized"; "A_X_B" for a cross of A and B;
  // "<categorical>_embedding"; "<categorical>_indicator".
  std::string name() const;
  // Produces ids (bucketized, identity, hash bucket, vocabulary, crossed).
  bool is_categorical() const;
  // Number of distinct ids of a categorical column (for embedding and indicator: their
  // categorical's).
  std::int64_t vocabulary_size() const;
};

inline constexpr std::int64_t kMaxVocabularyFileBytes = std::int64_t{1} << 30;
inline constexpr int kMaxNumericShape = 1 << 16;
inline constexpr int kMaxCrossedSlots = 1 << 12;

FeatureColumn numeric_column(std::string key, int shape = 1, std::optional<float> default_value = std::nullopt,
                             std::optional<Normalizer> normalizer = std::nullopt);
FeatureColumn bucketized_column(const FeatureColumn& source, std::vector<double> boundaries);
FeatureColumn categorical_column_with_identity(std::string key, std::int64_t num_buckets,
                                               std::optional<std::int64_t> default_value = std::nullopt);
FeatureColumn categorical_column_with_hash_bucket(std::string key, std::int64_t hash_bucket_size);
// The no-collision variant of categorical_column_with_hash_bucket (strata's own; TF has none):
// every distinct string is its own id (dynamic_hash_id), and an embedding_column over it reads a
// dynamic table on the parameter servers (rows created on first sight, admitted after
// options.admit_after sightings, evicted by ttl and capacity). ConfigError naming the column and
// the field for an option out of range. An indicator_column over it is refused (no vocabulary).
FeatureColumn categorical_column_with_dynamic_hash(std::string key, const DynamicIdOptions& options = {});
FeatureColumn categorical_column_with_vocabulary_list(std::string key, std::vector<std::string> vocabulary,
                                                      std::int64_t default_value = -1,
                                                      std::int64_t num_oov_buckets = 0);
// vocabulary_size -1: every line of the file.
FeatureColumn categorical_column_with_vocabulary_file(std::string key, const std::string& vocabulary_file,
                                                      std::int64_t vocabulary_size = -1,
                                                      std::int64_t num_oov_buckets = 0,
                                                      std::int64_t default_value = -1);
FeatureColumn crossed_column(std::vector<CrossKey> keys, std::int64_t hash_bucket_size,
                             std::uint64_t hash_key = kDefaultCrossHashKey);
FeatureColumn embedding_column(const FeatureColumn& categorical, int dimension, Combiner combiner = Combiner::kMean);
FeatureColumn indicator_column(const FeatureColumn& categorical);

// The label column: int classes in [0, num_classes) (num_classes 0: 1 + the largest label seen,
// at least 2) or, for a regressor, float targets.
struct LabelSpec {
  std::string key = "label";
  bool regression = false;
  int num_classes = 2;
};

// Where a top-level column landed in the Dataset.
struct ColumnLayout {
  std::string name;
  ColumnKind kind = ColumnKind::kNumeric;
  int dense_offset = -1;  // numeric: its features [dense_offset, dense_offset + dense_width)
  int dense_width = 0;
  int first_slot = -1;  // others: its sparse id slots [first_slot, first_slot + num_slots)
  int num_slots = 0;
  std::int64_t vocabulary_size = 0;  // ids lie in [0, vocabulary_size)
  int dimension = 0;                 // embedding
  Combiner combiner = Combiner::kMean;
  // A categorical column over a dynamic hash column (vocabulary_size is then kDynamicVocabulary):
  // an embedding reads a dynamic table with these options.
  bool dynamic = false;
  DynamicIdOptions dynamic_options;
};

struct FeatureLayout {
  std::vector<ColumnLayout> columns;  // one per top-level column, in list order
  int dense_dim = 0;
  int num_fields = 0;
  std::int64_t sparse_vocab = 0;  // the largest vocabulary_size (0 without categorical columns)
  LabelSpec label;                // num_classes resolved
};

// The CSV columns (name, type, default) the feature columns and the label read, for a CsvOptions
// of a file that lists no types of its own: numeric sources are float (default from
// default_value), identity keys int64, hashed, vocabulary and crossed raw keys string with default
// "" (missing); a key used as both float and int64 is float. The label is required (int64 for
// classes, float for targets). Columns appear in first-use order, the label first. Set a
// separator on the result for multi-valued columns.
std::vector<CsvColumn> csv_columns_for(const std::vector<FeatureColumn>& columns, const LabelSpec& label);

class FeatureTransform {
 public:
  // Plans the layout against `table` (the training data): checks that every key exists with a
  // usable type, sizes each multi-valued column's slots by its CsvColumn::max_values, or else by
  // the most values a row of `table` holds (a crossed column: the product of its keys' slots;
  // either at most kMaxCrossedSlots) and
  // resolves num_classes 0. ConfigError naming the column otherwise. Duplicate column names are
  // errors. Keys, column names and terms with control characters are refused by the factories
  // and the reader, so every message and layout name is one printable line.
  FeatureTransform(std::vector<FeatureColumn> columns, LabelSpec label, const CsvTable& table);

  const FeatureLayout& layout() const { return layout_; }
  const std::vector<FeatureColumn>& columns() const;

  // The Dataset of `table` under this layout (train or evaluation data alike); files and file_of
  // come from the table. ConfigError naming file:line and the column for a value that does not
  // fit (a bad number in a string column, an identity id out of range without a default, a label
  // out of range, a row with more values than the column's slots).
  Dataset apply(const CsvTable& table) const;

 private:
  struct Plan;  // the columns and their bindings to the training table; shared by copies
  std::shared_ptr<const Plan> plan_;
  FeatureLayout layout_;
};

// A model spec over a dense dataset instead of CSV (Fashion-MNIST, an .h5 file of images and
// labels): every column must be numeric, and their shapes, in list order, cover the dataset's
// dense features exactly (the first column takes features [0, shape0), the next the following
// ones), as a `numeric_column("image", shape=784)` does for Fashion-MNIST. num_classes 0 takes
// the dataset's; a smaller one than the dataset's labels need is an error; a regressor needs
// targets. ConfigError naming `source` and the column otherwise. Returns the layout the
// estimator is built on; normalize_dense applies the columns' normalizers to a dataset of that
// layout (training and evaluation data alike), as the CSV transform does.
FeatureLayout dense_feature_layout(const std::vector<FeatureColumn>& columns, LabelSpec label, const Dataset& data,
                                   const std::string& source);
void normalize_dense(const std::vector<FeatureColumn>& columns, const FeatureLayout& layout, Dataset& data,
                     const std::string& source);

// Streaming input for data larger than memory: a BatchIterator::Source that reads `paths` a
// chunk of chunk_rows rows at a time (CsvStream), applies `transform` (planned beforehand, e.g.
// on a sample read with read_csv) and yields batches of batch_size rows in file order, the last
// one partial unless drop_remainder. Memory: one chunk and one batch. Sharding as TF's auto-shard
// over files then lines: kFile gives worker w the files f with f % num_workers == w (ConfigError
// when there are fewer files than workers); kData reads every file and keeps the rows whose
// index in the whole input is w modulo num_workers; kAuto is kFile when there are at least
// num_workers files, else kData; kOff keeps every row. shuffle_buffer > 0 shuffles as TF's
// Dataset.shuffle(buffer_size) does: the first shuffle_buffer rows fill a buffer, each output row
// is a uniformly chosen buffer row (deterministic in `seed`; pass seed + epoch for a new order
// each epoch), replaced by the next input row; memory grows by shuffle_buffer rows. 0 keeps file
// order. ConfigError for a bad argument; read and transform errors surface from
// BatchIterator::next().
BatchIterator::Source csv_batch_source(std::vector<std::string> paths, CsvOptions options, FeatureTransform transform,
                                       int batch_size, bool drop_remainder, AutoShard policy = AutoShard::kAuto,
                                       int num_workers = 1, int worker = 0, std::int64_t chunk_rows = 65536,
                                       std::int64_t shuffle_buffer = 0, std::uint64_t seed = 0);

// The rows worker `worker` of num_workers takes from `paths` per pass under csv_batch_source's
// sharding (before drop_remainder): one pass over its files (every file for DATA sharding) that
// counts their records without parsing values (count_csv_rows; a bad value is reported when the
// batches read it). chunk_rows is checked as csv_batch_source checks it. ConfigError as
// csv_batch_source; structural read errors as CsvStream's.
std::int64_t csv_shard_rows(std::vector<std::string> paths, CsvOptions options, AutoShard policy = AutoShard::kAuto,
                            int num_workers = 1, int worker = 0, std::int64_t chunk_rows = 65536);

// Whether csv_batch_source's sharding of `files` files over num_workers has every worker read every
// file (DATA: each keeps every num_workers-th row; AUTO with fewer files than workers), so that
// counting a share means counting every file.
bool csv_shards_by_line(std::size_t files, AutoShard policy, int num_workers);
// csv_shard_rows from every file's row count (file_rows[f] records in the f-th file, counted
// elsewhere: `strata train` has each file counted by one worker and the counts exchanged); reads
// no file. The same ConfigErrors for the sharding as csv_shard_rows; Error on a negative count.
std::int64_t csv_shard_rows_of(const std::vector<std::int64_t>& file_rows, AutoShard policy, int num_workers,
                               int worker);

// Feature columns from JSON text: an array of column objects, or an object whose
// "feature_columns" member is that array. Schema (every member but those marked optional is
// required; unknown members are errors, so a typo never passes silently):
//   {"type": "numeric", "key": K, "shape": 1?, "default_value": 0.0?,
//    "normalizer": {"mean": M, "std": S}?}
//   {"type": "bucketized", "source": <numeric>, "boundaries": [b0, b1, ...]}
//   {"type": "identity", "key": K, "num_buckets": N, "default_value": D?}
//   {"type": "hash_bucket", "key": K, "hash_bucket_size": N}
//   {"type": "hash_bucket", "key": K, "dynamic": true, "admit_after": 0?, "capacity": 2^24?,
//    "ttl": 0?}, or the same as {"type": "dynamic_hash", ...}: categorical_column_with_dynamic_hash
//    (no hash_bucket_size; "dynamic": false is the plain hash bucket)
//   {"type": "vocabulary_list", "key": K, "vocabulary": ["a", ...], "num_oov_buckets": 0?,
//    "default_value": -1?}
//   {"type": "vocabulary_file", "key": K, "vocabulary_file": PATH, "vocabulary_size": N?,
//    "num_oov_buckets": 0?, "default_value": -1?}   (a relative PATH is relative to base_dir)
//   {"type": "crossed", "keys": [K or <categorical>, ...], "hash_bucket_size": N, "hash_key": H?}
//   {"type": "embedding", "categorical": <categorical>, "dimension": D, "combiner": "mean"?}
//   {"type": "indicator", "categorical": <categorical>}
// One element of the list stands for several columns alike when it carries
// "for_keys": ["C1", "C2", ...] or a range "C1..C26" (one prefix, decimal numbers a <= b without leading
// zeros, at most 4096 keys): it is repeated once per key, with the "key" of the column (of its categorical, of a
// bucketized source) set to that key; the element itself has no "key" then, and a crossed column
// cannot be repeated so. Errors in a repetition name it: "feature_columns[2] (key C7).dimension".
// A crossed column with "for_pairs" (same forms as "for_keys", at least 2 keys) and no "keys" stands
// for one crossed column per unordered pair of those keys, in list order ((C1,C2), (C1,C3), ...,
// (C2,C3), ...): the wide part's second-order crosses without naming the pairs that matter.
// TensorFlow's function names are accepted as types too ("numeric_column",
// "categorical_column_with_hash_bucket", ...). Errors are ConfigErrors naming `origin` and the
// member's path: "spec.json: feature_columns[3].categorical.hash_bucket_size: expected a positive
// integer, got -5".
std::vector<FeatureColumn> parse_feature_columns_json(std::string_view text, const std::string& origin,
                                                      const std::string& base_dir = "");

}  // namespace strata::data
