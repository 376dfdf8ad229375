// Variable descriptions: dtypes, shapes, counter-based initializers and TF's partitioner rules.
//
// The random initializers are built on a counter-based generator: element k of a variable
// seeded with s draws bits(s, k, d) for its d-th draw, where bits() is splitmix64's output
// function applied to a (key, counter) pair. Nothing depends on how many values were drawn
// before, so a shard computes its values without generating the rows before it, and every
// split along axis 0 reproduces the whole-variable fill bit for bit (given the same libm for
// log/cos in the normal kinds, which is the case for one strata binary across a job).
#include "strata/ps/variable.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "strata/common/error.h"

namespace strata::ps {
namespace {

// ---- counter-based random bits --------------------------------------------------------------

constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;   // splitmix64's Weyl increment
constexpr std::uint64_t kDrawStep = 0xd1b54a32d192ed03ull;  // odd; separates draws of one element

// splitmix64's finaliser: a bijective 64-bit mixer with full avalanche.
inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Per-seed key, computed once per fill. Mixing the seed first keeps nearby seeds (0, 1, 2...)
// from producing shifted copies of one splitmix64 stream.
inline std::uint64_t seed_key(std::uint64_t seed) { return mix64(seed ^ 0x5ee0'57a7'a000'0001ull); }

// Draw `draw` of element `index`: splitmix64's output at position `index` of the stream keyed by
// `key`, mixed once more with the draw number.
inline std::uint64_t bits(std::uint64_t key, std::uint64_t index, std::uint64_t draw) {
  const std::uint64_t stream = mix64(key + (index + 1) * kGolden);
  return mix64(stream + (draw + 1) * kDrawStep);
}

// Uniform double in [0, 1) with 53 random bits.
// High 64 bits of a 64x64-bit product, portably (no __int128).
inline std::uint64_t mul_high(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32, b_lo = b & 0xffffffffu, b_hi = b >> 32;
  const std::uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
  const std::uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
  return hi_hi + (hi_lo >> 32) + (cross >> 32);
}

inline double unit_open(std::uint64_t r) { return static_cast<double>(r >> 11) * 0x1.0p-53; }
// Uniform double in (0, 1]: safe for log().
inline double unit_closed(std::uint64_t r) { return static_cast<double>((r >> 11) + 1) * 0x1.0p-53; }

// Standard normal from draws (2*pair, 2*pair+1) by Box-Muller (cosine half only, so each value
// depends on its own two draws and nothing else).
inline double std_normal(std::uint64_t key, std::uint64_t index, std::uint64_t pair) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double u1 = unit_closed(bits(key, index, 2 * pair));
  const double u2 = unit_open(bits(key, index, 2 * pair + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// TF's truncated normal: redraw until |z| <= 2. P(reject) = 4.55%, so 64 draws all failing has
// probability ~1e-86; the bound only keeps the loop finite, and falls back to the mean.
inline double truncated_std_normal(std::uint64_t key, std::uint64_t index) {
  for (std::uint64_t pair = 0; pair < 64; ++pair) {
    const double z = std_normal(key, index, pair);
    if (std::fabs(z) <= 2.0) return z;
  }
  return 0.0;
}

// ---- helpers --------------------------------------------------------------------------------

std::string format_double(double v) {
  // Shortest text that round-trips, so "0.05" stays "0.05" in messages and canonical text.
  char buf[32];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, ptr) : std::string("?");
}

bool is_integral(double v) { return std::isfinite(v) && std::floor(v) == v; }

// Integers up to 2^53 survive the trip through a double exactly.
constexpr double kMaxExactInt = 9007199254740992.0;

[[noreturn]] void init_error(const Initializer& init, DType dtype, const std::string& why) {
  throw ConfigError("initializer " + init.to_string() + " for " + to_string(dtype) + ": " + why);
}

// Writes one computed value as `T`. For the uniform kinds a value that rounds up to the
// (exclusive) upper bound in the narrower type is moved just below it, so [min, max) holds in
// the stored dtype too.
template <typename T>
inline T narrow_below(double v, T upper, bool half_open) {
  T out = static_cast<T>(v);
  if (half_open && out >= upper) out = std::nextafter(upper, -std::numeric_limits<T>::infinity());
  return out;
}

// Fills `count` elements starting at flat index `first` with gen(index) -> double, stored as T.
template <typename T, typename Gen>
void fill_floating(T* out, std::int64_t first, std::int64_t count, Gen gen) {
  for (std::int64_t i = 0; i < count; ++i) out[i] = gen(static_cast<std::uint64_t>(first + i));
}

}  // namespace

// ---- dtypes ---------------------------------------------------------------------------------

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI64: return "i64";
  }
  return "?";
}

DType parse_dtype(std::string_view text) {
  if (text == "f32" || text == "float32") return DType::kF32;
  if (text == "f64" || text == "float64") return DType::kF64;
  if (text == "i64" || text == "int64") return DType::kI64;
  throw ConfigError("dtype: '" + std::string(text) +
                    "' is not one of f32, float32, f64, float64, i64, int64");
}

// ---- shapes ---------------------------------------------------------------------------------

std::int64_t num_elements(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw ConfigError("shape " + shape_to_string(shape) + " has a negative dimension");
    if (__builtin_mul_overflow(n, d, &n))
      throw ConfigError("shape " + shape_to_string(shape) + " has more than 2^63 elements");
  }
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::int64_t num_rows(const Shape& shape) { return shape.empty() ? 1 : shape[0]; }

// ---- initializers ---------------------------------------------------------------------------

Initializer Initializer::zeros() { return Initializer{}; }

Initializer Initializer::ones() {
  Initializer i;
  i.kind = Kind::kOnes;
  return i;
}

Initializer Initializer::constant(double value) {
  Initializer i;
  i.kind = Kind::kConstant;
  i.value = value;
  return i;
}

Initializer Initializer::uniform(double minval, double maxval, std::uint64_t seed) {
  Initializer i;
  i.kind = Kind::kUniform;
  i.minval = minval;
  i.maxval = maxval;
  i.seed = seed;
  return i;
}

Initializer Initializer::normal(double mean, double stddev, std::uint64_t seed) {
  Initializer i;
  i.kind = Kind::kNormal;
  i.mean = mean;
  i.stddev = stddev;
  i.seed = seed;
  return i;
}

Initializer Initializer::truncated_normal(double mean, double stddev, std::uint64_t seed) {
  Initializer i = normal(mean, stddev, seed);
  i.kind = Kind::kTruncatedNormal;
  return i;
}

Initializer Initializer::glorot_uniform(std::uint64_t seed) {
  Initializer i;
  i.kind = Kind::kGlorotUniform;
  i.seed = seed;
  return i;
}

std::string Initializer::to_string() const {
  const std::string s = ",seed=" + std::to_string(seed) + ")";
  switch (kind) {
    case Kind::kZeros: return "zeros";
    case Kind::kOnes: return "ones";
    case Kind::kConstant: return "constant(" + format_double(value) + ")";
    case Kind::kUniform: return "uniform(" + format_double(minval) + "," + format_double(maxval) + s;
    case Kind::kNormal: return "normal(" + format_double(mean) + "," + format_double(stddev) + s;
    case Kind::kTruncatedNormal:
      return "truncated_normal(" + format_double(mean) + "," + format_double(stddev) + s;
    case Kind::kGlorotUniform: return "glorot_uniform(seed=" + std::to_string(seed) + ")";
  }
  return "?";
}

void Initializer::validate(DType dtype) const {
  const bool integer = dtype == DType::kI64;
  switch (kind) {
    case Kind::kZeros:
    case Kind::kOnes:
      return;
    case Kind::kConstant:
      if (!std::isfinite(value)) init_error(*this, dtype, "the value is not finite");
      if (dtype == DType::kF32 && std::fabs(value) > std::numeric_limits<float>::max())
        init_error(*this, dtype, "the value overflows f32");
      if (integer && (!is_integral(value) || std::fabs(value) > kMaxExactInt))
        init_error(*this, dtype, "the value is not an integer in [-2^53, 2^53]");
      return;
    case Kind::kUniform:
      if (!std::isfinite(minval) || !std::isfinite(maxval) || !std::isfinite(maxval - minval))
        init_error(*this, dtype, "the bounds (and their difference) must be finite");
      if (maxval < minval) init_error(*this, dtype, "maxval is below minval");
      if (integer) {
        // TF draws integers in [minval, maxval) and refuses an empty range.
        if (!is_integral(minval) || !is_integral(maxval) || std::fabs(minval) > kMaxExactInt ||
            std::fabs(maxval) > kMaxExactInt)
          init_error(*this, dtype, "the bounds are not integers in [-2^53, 2^53]");
        if (maxval == minval) init_error(*this, dtype, "the range [minval, maxval) is empty");
      }
      return;
    case Kind::kNormal:
    case Kind::kTruncatedNormal:
    case Kind::kGlorotUniform:
      if (integer) init_error(*this, dtype, "needs a floating-point dtype (f32 or f64)");
      if (kind != Kind::kGlorotUniform) {
        if (!std::isfinite(mean) || !std::isfinite(stddev))
          init_error(*this, dtype, "mean and stddev must be finite");
        if (stddev < 0) init_error(*this, dtype, "stddev is negative");
      }
      return;
  }
}

double glorot_limit(const Shape& full_shape) {
  // TF _compute_fans, computed in double (the products are bounded by num_elements anyway).
  double fan_in = 1.0;
  double fan_out = 1.0;
  const std::size_t rank = full_shape.size();
  if (rank == 1) {
    fan_in = fan_out = static_cast<double>(full_shape[0]);
  } else if (rank == 2) {
    fan_in = static_cast<double>(full_shape[0]);
    fan_out = static_cast<double>(full_shape[1]);
  } else if (rank > 2) {
    // Convolution kernels (..., in_depth, out_depth): the leading dims are the receptive field.
    double receptive = 1.0;
    for (std::size_t i = 0; i + 2 < rank; ++i) receptive *= static_cast<double>(full_shape[i]);
    fan_in = static_cast<double>(full_shape[rank - 2]) * receptive;
    fan_out = static_cast<double>(full_shape[rank - 1]) * receptive;
  }
  // VarianceScaling(scale=1, mode=fan_avg, distribution=uniform): scale /= max(1, fan_avg);
  // limit = sqrt(3 * scale). For fan_in + fan_out >= 2 this is sqrt(6 / (fan_in + fan_out)).
  const double scale = 1.0 / std::max(1.0, (fan_in + fan_out) / 2.0);
  return std::sqrt(3.0 * scale);
}

void fill(const Initializer& init, DType dtype, const Shape& full_shape, std::int64_t row_begin,
          std::int64_t row_end, void* out) {
  init.validate(dtype);
  const std::int64_t rows = num_rows(full_shape);
  const std::int64_t total = num_elements(full_shape);
  STRATA_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= rows, "rows [", row_begin, ",",
               row_end, ") outside a variable of shape ", shape_to_string(full_shape));
  const std::int64_t row_elems = rows == 0 ? 0 : total / rows;
  const std::int64_t first = row_begin * row_elems;
  const std::int64_t count = (row_end - row_begin) * row_elems;
  if (count == 0) return;

  using Kind = Initializer::Kind;
  const std::uint64_t key = seed_key(init.seed);

  if (dtype == DType::kI64) {
    auto* p = static_cast<std::int64_t*>(out);
    switch (init.kind) {
      case Kind::kZeros: std::fill(p, p + count, 0); return;
      case Kind::kOnes: std::fill(p, p + count, 1); return;
      case Kind::kConstant: std::fill(p, p + count, static_cast<std::int64_t>(init.value)); return;
      case Kind::kUniform: {
        // Integers in [lo, hi): multiply-high maps 64 random bits onto the range without the
        // modulo's skew (Lemire's method, minus the rejection step: bias < range / 2^64).
        const auto lo = static_cast<std::int64_t>(init.minval);
        const auto range = static_cast<std::uint64_t>(static_cast<std::int64_t>(init.maxval) - lo);
        for (std::int64_t i = 0; i < count; ++i) {
          const std::uint64_t r = bits(key, static_cast<std::uint64_t>(first + i), 0);
          p[i] = lo + static_cast<std::int64_t>(mul_high(r, range));
        }
        return;
      }
      default: break;  // rejected by validate()
    }
    STRATA_CHECK(false, "unreachable integer initializer ", init.to_string());
  }

  // Floating point: every kind is a function index -> double, then narrowed to the dtype.
  auto run = [&](auto gen, double upper, bool half_open) {
    if (dtype == DType::kF32) {
      const auto upper_f = static_cast<float>(upper);
      fill_floating(static_cast<float*>(out), first, count,
                    [&](std::uint64_t k) { return narrow_below<float>(gen(k), upper_f, half_open); });
    } else {
      fill_floating(static_cast<double*>(out), first, count,
                    [&](std::uint64_t k) { return narrow_below<double>(gen(k), upper, half_open); });
    }
  };
  auto uniform = [&](double lo, double hi) {
    // A degenerate range [x, x] yields x; there is no value below the bound to move to.
    run([=](std::uint64_t k) { return lo + unit_open(bits(key, k, 0)) * (hi - lo); }, hi, hi > lo);
  };
  switch (init.kind) {
    case Kind::kZeros: run([](std::uint64_t) { return 0.0; }, 0.0, false); return;
    case Kind::kOnes: run([](std::uint64_t) { return 1.0; }, 0.0, false); return;
    case Kind::kConstant: run([&](std::uint64_t) { return init.value; }, 0.0, false); return;
    case Kind::kUniform: uniform(init.minval, init.maxval); return;
    case Kind::kGlorotUniform: {
      // Fans come from the FULL shape, as TF's partition_info.full_shape does: a shard's values
      // must not depend on the shard.
      const double limit = glorot_limit(full_shape);
      uniform(-limit, limit);
      return;
    }
    case Kind::kNormal: {
      const double mean = init.mean, sd = init.stddev;
      run([=](std::uint64_t k) { return mean + sd * std_normal(key, k, 0); }, 0.0, false);
      return;
    }
    case Kind::kTruncatedNormal: {
      const double mean = init.mean, sd = init.stddev;
      run([=](std::uint64_t k) { return mean + sd * truncated_std_normal(key, k); }, 0.0, false);
      return;
    }
  }
}

// ---- partitioners ---------------------------------------------------------------------------

Partitioner Partitioner::none() { return Partitioner{}; }

Partitioner Partitioner::fixed_shards(int num_shards) {
  Partitioner p;
  p.kind = Kind::kFixedShards;
  p.shards = num_shards;
  return p;
}

Partitioner Partitioner::min_max(int max_partitions, std::uint64_t min_slice_bytes) {
  Partitioner p;
  p.kind = Kind::kMinMax;
  p.max_partitions = max_partitions;
  p.min_slice_bytes = min_slice_bytes;
  return p;
}

Partitioner Partitioner::max_shard_bytes(std::uint64_t max_bytes, int max_shards) {
  Partitioner p;
  p.kind = Kind::kMaxShardBytes;
  p.max_bytes = max_bytes;
  p.max_shards = max_shards;
  return p;
}

void Partitioner::validate() const {
  // The same parameter checks TF's partitioner constructors make (all counts/bytes positive).
  switch (kind) {
    case Kind::kNone: return;
    case Kind::kFixedShards:
      if (shards < 1) throw ConfigError("partitioner " + to_string() + ": the shard count must be >= 1");
      return;
    case Kind::kMinMax:
      if (max_partitions < 1)
        throw ConfigError("partitioner " + to_string() + ": max_partitions must be >= 1");
      if (min_slice_bytes < 1)
        throw ConfigError("partitioner " + to_string() + ": min_slice_bytes must be >= 1");
      return;
    case Kind::kMaxShardBytes:
      if (max_bytes < 1) throw ConfigError("partitioner " + to_string() + ": max_shard_bytes must be >= 1");
      if (max_shards < 0) throw ConfigError("partitioner " + to_string() + ": max_shards must be >= 0");
      return;
  }
}

int Partitioner::num_shards(const Shape& shape, DType dtype) const {
  validate();
  if (kind == Kind::kNone || shape.empty()) return 1;  // TF V2: rank-0 variables are never split
  const std::int64_t elements = num_elements(shape);
  if (elements == 0) return 1;  // strata's rule for empty variables (see the header)
  const std::int64_t rows = shape[0];
  const auto elem_bytes = static_cast<std::uint64_t>(dtype_size(dtype));

  std::int64_t n = 1;
  switch (kind) {
    case Kind::kNone: break;
    case Kind::kFixedShards:
      // TF fixed_size_partitioner: partitions[axis] = min(num_shards, shape[axis]).
      n = shards;
      break;
    case Kind::kMinMax: {
      // TF min_max_variable_partitioner:
      //   partitions = total_bytes / min_slice_size                      (float division)
      //   result     = max(1, min(shape[axis], max_partitions, ceil(partitions)))
      // ceil of the exact quotient in integers equals TF's float result below 2^53 bytes.
      const std::uint64_t total = static_cast<std::uint64_t>(elements) * elem_bytes;
      const std::uint64_t wanted = total / min_slice_bytes + (total % min_slice_bytes != 0);
      n = static_cast<std::int64_t>(
          std::min<std::uint64_t>(wanted, static_cast<std::uint64_t>(max_partitions)));
      break;
    }
    case Kind::kMaxShardBytes: {
      // TF variable_axis_size_partitioner:
      //   bytes_per_slice  = (num_elements / shape[axis]) * element_size     (one row's bytes)
      //   slices_per_shard = max(1, floor(max_shard_bytes / bytes_per_slice))
      //   axis_shards      = ceil(shape[axis] / slices_per_shard), then min(max_shards, ...)
      // The fewest shards of at most max_shard_bytes each, unless one row alone is bigger
      // (then one row per shard) or max_shards caps the count.
      const std::uint64_t row_bytes = static_cast<std::uint64_t>(elements / rows) * elem_bytes;
      const std::uint64_t rows_per_shard = std::max<std::uint64_t>(1, max_bytes / row_bytes);
      const auto urows = static_cast<std::uint64_t>(rows);
      n = static_cast<std::int64_t>(urows / rows_per_shard + (urows % rows_per_shard != 0));
      if (max_shards > 0) n = std::min<std::int64_t>(n, max_shards);
      break;
    }
  }
  // TF V2 (ParameterServerStrategyV2._create_variable): num_partitions = min(result, shape[0]).
  n = std::max<std::int64_t>(1, std::min(n, rows));
  if (n > std::numeric_limits<int>::max())
    throw ConfigError("partitioner " + to_string() + " would split shape " + shape_to_string(shape) + " into " +
                      std::to_string(n) + " shards");
  return static_cast<int>(n);
}

std::string Partitioner::to_string() const {
  switch (kind) {
    case Kind::kNone: return "none";
    case Kind::kFixedShards: return "fixed_shards(" + std::to_string(shards) + ")";
    case Kind::kMinMax:
      return "min_max(" + std::to_string(max_partitions) + "," + std::to_string(min_slice_bytes) + ")";
    case Kind::kMaxShardBytes:
      return "max_shard_bytes(" + std::to_string(max_bytes) +
             (max_shards > 0 ? "," + std::to_string(max_shards) : std::string()) + ")";
  }
  return "?";
}

RowRange shard_rows(std::int64_t rows, int parts, int part) {
  STRATA_CHECK(parts >= 1 && part >= 0 && part < parts, "part ", part, " of ", parts);
  // TF "div" strategy: base rows each, the first (rows % parts) shards one more.
  const std::int64_t base = rows / parts;
  const std::int64_t extra = rows % parts;
  const std::int64_t begin = part * base + std::min<std::int64_t>(part, extra);
  return RowRange{begin, begin + base + (part < extra ? 1 : 0)};
}

// ---- variable specs -------------------------------------------------------------------------

void validate_variable_name(std::string_view name) {
  auto bad = [&](const char* why) {
    // Escape control characters so the message stays one printable line.
    std::string shown;
    for (char c : name) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '\n') shown += "\\n";
      else if (c == '\t') shown += "\\t";
      else if (u < 0x20 || u == 0x7f) {
        static const char* hex = "0123456789abcdef";
        shown += std::string("\\x") + hex[u >> 4] + hex[u & 15];
      } else shown += c;
    }
    throw ConfigError("variable name '" + shown + "' " + why);
  };
  if (name.empty()) throw ConfigError("variable name is empty");
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) bad("contains whitespace or a control character");
  }
  // Names become paths (HDF5 "/variables/<name>", shard names "<name>/part_<i>"), so every
  // '/'-separated component must be non-empty.
  if (name.front() == '/') bad("starts with '/'");
  if (name.back() == '/') bad("ends with '/'");
  if (name.find("//") != std::string_view::npos) bad("contains an empty scope ('//')");
}

void VariableSpec::validate() const {
  validate_variable_name(name);
  const std::string who = "variable '" + name + "': ";
  try {
    const std::int64_t elements = num_elements(shape);
    // Byte counts are size_t/int64 everywhere downstream; refuse what would overflow them.
    if (elements > std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(dtype_size(dtype)))
      throw ConfigError("shape " + shape_to_string(shape) + " of " + to_string(dtype) +
                        " overflows a 64-bit byte count");
    init.validate(dtype);
    partitioner.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(who + e.message());
  }
  if (optimizer) {
    try {
      optimizer->validate();
    } catch (const ConfigError& e) {
      throw ConfigError(who + "optimizer: " + e.message());
    }
  }
  if (!colocate_with.empty()) {
    try {
      validate_variable_name(colocate_with);
    } catch (const ConfigError& e) {
      throw ConfigError(who + "colocate_with: " + e.message());
    }
    if (colocate_with == name) throw ConfigError(who + "colocate_with names the variable itself");
    if (!partitioner.is_none())
      throw ConfigError(who + "is colocated with '" + colocate_with + "' and cannot also have partitioner " +
                        partitioner.to_string() + " (colocated variables are never partitioned)");
  }
}

}  // namespace strata::ps
