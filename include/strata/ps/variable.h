// Variable descriptions for the parameter servers: dtype, shape, seeded initializer, partitioner.
//
// Everything here is pure (no MPI, no allocation of variable memory) so that every worker can
// compute the same description of the model and the runtime can compare them (shard_map.h).
//
// Initializers are counter-based: the value of element k (flat row-major index into the FULL
// variable) is a pure function of (kind, parameters, seed, k). A PS that owns rows [b, e) of a
// partitioned variable therefore fills exactly the values a single PS would have written there,
// and a checkpoint written under one partitioning matches a fresh init under another. TF does
// not have this property (its partitioned initializers draw once per slice); strata wants it so
// that placement never changes the model.
//
// Partitioners follow TensorFlow's tf.distribute.experimental.partitioners (FixedShards,
// MinSize, MaxSize) and ParameterServerStrategyV2's rules around them; see Partitioner.
//
// Thread-safety: all types are values; all functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/ps/optimizer.h"

namespace strata::ps {

// ---- dtypes ---------------------------------------------------------------------------------

enum class DType { kF32, kF64, kI64 };

std::size_t dtype_size(DType dtype);  // 4, 8, 8
const char* to_string(DType dtype);   // "f32", "f64", "i64"
// Accepts "f32"/"float32", "f64"/"float64", "i64"/"int64"; anything else is a ConfigError.
DType parse_dtype(std::string_view text);

// ---- shapes ---------------------------------------------------------------------------------

// Row-major, axis 0 is the partitioned axis. {} is a scalar (one element).
using Shape = std::vector<std::int64_t>;

// Product of the dims (1 for a scalar). ConfigError on a negative dim or int64 overflow.
std::int64_t num_elements(const Shape& shape);
// "[10,4]", "[]" for a scalar.
std::string shape_to_string(const Shape& shape);
// Rows along axis 0: shape[0], or 1 for a scalar (a scalar is one row of one element).
std::int64_t num_rows(const Shape& shape);

// ---- initializers ---------------------------------------------------------------------------

struct Initializer {
  enum class Kind { kZeros, kOnes, kConstant, kUniform, kNormal, kTruncatedNormal, kGlorotUniform };

  Kind kind = Kind::kZeros;
  double value = 0.0;   // kConstant
  double minval = 0.0;  // kUniform: values in [minval, maxval)
  double maxval = 1.0;
  double mean = 0.0;    // kNormal, kTruncatedNormal
  double stddev = 1.0;  // kTruncatedNormal redraws anything beyond 2 stddev (TF semantics)
  std::uint64_t seed = 0;  // ignored by zeros/ones/constant

  static Initializer zeros();
  static Initializer ones();
  static Initializer constant(double value);
  static Initializer uniform(double minval, double maxval, std::uint64_t seed);
  static Initializer normal(double mean, double stddev, std::uint64_t seed);
  static Initializer truncated_normal(double mean, double stddev, std::uint64_t seed);
  // TF/Keras GlorotUniform: uniform in [-limit, limit) with limit = sqrt(3 / max(1, fan_avg)),
  // i.e. sqrt(6 / (fan_in + fan_out)) for any shape with fan_in + fan_out >= 2; fans come from
  // the FULL shape (TF's _compute_fans: scalar 1/1, 1-D n/n, 2-D rows/cols, N-D
  // shape[-2]*rf / shape[-1]*rf with rf the product of the leading dims).
  static Initializer glorot_uniform(std::uint64_t seed);

  // ConfigError when the parameters cannot produce values of `dtype`: non-finite parameters,
  // maxval < minval, stddev < 0; for kI64 a non-integral constant/bounds, minval == maxval, or a
  // normal / truncated_normal / glorot_uniform kind (TF rejects those for integer dtypes too).
  void validate(DType dtype) const;

  // "zeros", "constant(0.5)", "uniform(-0.05,0.05,seed=7)", ... for messages and checkpoints.
  std::string to_string() const;
};

// glorot_uniform's limit for a full shape (exposed for tests and for documentation output).
double glorot_limit(const Shape& full_shape);

// Fills rows [row_begin, row_end) of the FULL variable `full_shape` into `out`, which must hold
// (row_end - row_begin) * row_elements * dtype_size(dtype) bytes, row-major. The values depend
// only on (init, dtype, full_shape, element index), so any split along axis 0 reproduces the
// whole-variable fill bit for bit. For a scalar the only row is [0, 1).
// Throws ConfigError when init.validate(dtype) does, strata::Error on a row range outside
// [0, num_rows(full_shape)].
void fill(const Initializer& init, DType dtype, const Shape& full_shape, std::int64_t row_begin,
          std::int64_t row_end, void* out);

// ---- partitioners ---------------------------------------------------------------------------

// How many shards along axis 0 a variable gets. num_shards() implements TF's formulas (see
// src/ps/variable.cc for the derivation) and then ParameterServerStrategyV2's guards:
//   - a scalar (rank 0) is never partitioned                               (TF: same)
//   - never more shards than rows                                          (TF: same)
//   - a variable with zero elements is never partitioned (1 shard, 0 bytes). TF raises for it
//     (FixedShards returns 0 partitions, MaxSize divides by zero); strata allows empty variables
//     and keeps them whole rather than refusing the model.
// A result of 1 means "not partitioned": the variable keeps its plain name (TF V2: same).
struct Partitioner {
  enum class Kind { kNone, kFixedShards, kMinMax, kMaxShardBytes };

  Kind kind = Kind::kNone;
  int shards = 1;                              // kFixedShards: requested shard count (>= 1)
  int max_partitions = 1;                      // kMinMax: upper bound (>= 1)
  std::uint64_t min_slice_bytes = 256u << 10;  // kMinMax: minimum bytes per shard (>= 1)
  std::uint64_t max_bytes = 0;                 // kMaxShardBytes: maximum bytes per shard (>= 1)
  int max_shards = 0;                          // kMaxShardBytes: optional cap, 0 = none

  static Partitioner none();
  // TF fixed_size_partitioner / FixedShardsPartitioner(num_shards).
  static Partitioner fixed_shards(int num_shards);
  // TF min_max_variable_partitioner / MinSizePartitioner(min_shard_bytes, max_shards).
  static Partitioner min_max(int max_partitions, std::uint64_t min_slice_bytes = 256u << 10);
  // TF variable_axis_size_partitioner / MaxSizePartitioner(max_shard_bytes, max_shards).
  static Partitioner max_shard_bytes(std::uint64_t max_bytes, int max_shards = 0);

  bool is_none() const { return kind == Kind::kNone; }
  // ConfigError on non-positive parameters.
  void validate() const;
  // Number of shards along axis 0 (>= 1). Validates first; ConfigError when the rules would ask
  // for more than INT_MAX shards (max_shard_bytes on an absurdly long variable).
  int num_shards(const Shape& shape, DType dtype) const;
  // "none", "fixed_shards(4)", "min_max(8,262144)", "max_shard_bytes(1048576)".
  std::string to_string() const;
};

// Rows [begin, end) of shard `part` when `rows` rows are split into `parts` shards the way TF
// does: the first rows % parts shards take one extra row (10 over 4: 3,3,2,2).
struct RowRange {
  std::int64_t begin;
  std::int64_t end;
};
RowRange shard_rows(std::int64_t rows, int parts, int part);

// ---- variable specs -------------------------------------------------------------------------

// One variable as a worker creates it inside strategy.scope(). Names carry their scope prefix
// ("tower/dense/kernel"); the prefix has no meaning beyond being part of the name.
struct VariableSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  Initializer init;
  bool trainable = true;
  Partitioner partitioner;
  // Name of an EARLIER variable whose PS this one shares (TF colocate_vars_with). A colocated
  // variable is never partitioned: giving it a partitioner is a ConfigError (TF V2 silently
  // ignores the partitioner; strata refuses the ambiguity).
  std::string colocate_with;
  // The optimizer that updates this variable on its PS, overriding the job's
  // (PsOptions::optimizer): TensorFlow's per-part optimizers (FTRL for a wide-and-deep model's
  // linear part, Adagrad for its DNN part). Unset: the job's optimizer, exactly as a job without
  // per-variable optimizers (same arena layout, same bits). Its slots are laid out, applied and
  // checkpointed under its own slot names; every worker must give the same one (the creation
  // check compares it). Ignored for variables that take no gradients.
  std::optional<OptimizerConfig> optimizer;

  // Checks the spec on its own (name, dims, initializer vs dtype, partitioner parameters,
  // colocation with itself, its optimizer's hyper-parameters); cross-variable rules are
  // ShardMap::build's. ConfigError naming the variable.
  void validate() const;
};

// The optimizer that updates `spec`: its own when it has one, else `job`.
inline const OptimizerConfig& effective_optimizer(const VariableSpec& spec, const OptimizerConfig& job) {
  return spec.optimizer ? *spec.optimizer : job;
}

// ---- dynamic variables --------------------------------------------------------------------

// A dynamic embedding table (issue 22): rows of `dim` floats keyed by arbitrary int64 ids, with
// no vocabulary and no shape. Every PS holds the rows of the ids id with
// shard_of(id, num_ps) == its PS index (src/ps/dynamic_table.h; the PS count is the shard count),
// and workers reach them through PsClient::lookup_dynamic / update_dynamic. Declared next to the
// dense variables (ParameterServers::materialize's `dynamic` list), in the same order on every
// worker. The job's optimizer (PsOptions::optimizer) updates its rows.
struct DynamicVariableSpec {
  std::string name;
  std::int64_t dim = 16;  // floats per row, in [1, 65536]
  // A row's initial values: a pure function of (init, id). Any kind except glorot_uniform.
  Initializer init = Initializer::uniform(-0.05, 0.05, 0);
  std::int64_t admit_after = 0;                   // an id gets a row once seen this often (0/1: at once)
  std::int64_t capacity = std::int64_t{1} << 24;  // most rows per PS (least-recently-updated evicted)
  std::int64_t ttl = 0;                           // rows not updated for ttl steps go; 0: never
  // Most distinct ids one request to one PS carries (a larger batch goes in several requests):
  // sizes the per-worker request area of every PS, max_ids * (8 + 4 * dim) bytes per worker.
  std::int64_t max_ids = 4096;

  static constexpr std::int64_t kMaxIds = std::int64_t{1} << 20;
  // The largest ttl (about 25 days at 1,000 steps a second): a table keeps exact ages up to
  // 3 * 2^30 - 1 steps in its 32-bit stamps (src/ps/dynamic_table.h), whatever the step.
  static constexpr std::int64_t kMaxTtl = std::int64_t{1} << 31;

  // ConfigError naming the variable, the field and the value when anything is out of range (the
  // initializer and the table's own limits included).
  void validate() const;
};

// ConfigError unless `name` is a usable variable name: non-empty, no whitespace or control
// characters, no leading or trailing '/', no empty path component ("a//b").
void validate_variable_name(std::string_view name);

}  // namespace strata::ps
