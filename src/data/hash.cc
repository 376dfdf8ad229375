// FarmHash Fingerprint64 (farmhashna::Hash64) and TensorFlow's hashed feature cross.
//
// Written from the algorithm's description: every arithmetic step is on uint64 with wrap-around,
// loads are little-endian whatever the host's byte order (memcpy then a byte swap on big-endian
// hosts), so the value is the same on every platform, as a fingerprint must be.
#include "strata/data/hash.h"

#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "strata/common/error.h"

namespace strata::data {
namespace {

constexpr std::uint64_t kK0 = 0xc3a5c85c97cb3127ULL;
constexpr std::uint64_t kK1 = 0xb492b66fbe98f273ULL;
constexpr std::uint64_t kK2 = 0x9ae16a3b2f90404fULL;

inline std::uint64_t load64(const char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

inline std::uint64_t load32(const char* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

inline std::uint64_t rotr(std::uint64_t v, int shift) noexcept {
  return shift == 0 ? v : (v >> shift) | (v << (64 - shift));
}

inline std::uint64_t shift_mix(std::uint64_t v) noexcept { return v ^ (v >> 47); }

// Murmur-style mix of two words with a length-dependent multiplier.
inline std::uint64_t mix16(std::uint64_t u, std::uint64_t v, std::uint64_t mul) noexcept {
  std::uint64_t a = (u ^ v) * mul;
  a ^= a >> 47;
  std::uint64_t b = (v ^ a) * mul;
  b ^= b >> 47;
  return b * mul;
}

std::uint64_t hash_0_to_16(const char* s, std::size_t len) noexcept {
  if (len >= 8) {
    const std::uint64_t mul = kK2 + len * 2;
    const std::uint64_t a = load64(s) + kK2;
    const std::uint64_t b = load64(s + len - 8);
    const std::uint64_t c = rotr(b, 37) * mul + a;
    const std::uint64_t d = (rotr(a, 25) + b) * mul;
    return mix16(c, d, mul);
  }
  if (len >= 4) {
    const std::uint64_t mul = kK2 + len * 2;
    const std::uint64_t a = load32(s);
    return mix16(len + (a << 3), load32(s + len - 4), mul);
  }
  if (len > 0) {
    const auto a = static_cast<std::uint8_t>(s[0]);
    const auto b = static_cast<std::uint8_t>(s[len >> 1]);
    const auto c = static_cast<std::uint8_t>(s[len - 1]);
    // 32-bit intermediates, widened before the 64-bit products.
    const std::uint32_t y = static_cast<std::uint32_t>(a) + (static_cast<std::uint32_t>(b) << 8);
    const std::uint32_t z = static_cast<std::uint32_t>(len) + (static_cast<std::uint32_t>(c) << 2);
    return shift_mix(y * kK2 ^ z * kK0) * kK2;
  }
  return kK2;
}

std::uint64_t hash_17_to_32(const char* s, std::size_t len) noexcept {
  const std::uint64_t mul = kK2 + len * 2;
  const std::uint64_t a = load64(s) * kK1;
  const std::uint64_t b = load64(s + 8);
  const std::uint64_t c = load64(s + len - 8) * mul;
  const std::uint64_t d = load64(s + len - 16) * kK2;
  return mix16(rotr(a + b, 43) + rotr(c, 30) + d, a + rotr(b + kK2, 18) + c, mul);
}

std::uint64_t hash_33_to_64(const char* s, std::size_t len) noexcept {
  const std::uint64_t mul = kK2 + len * 2;
  const std::uint64_t a = load64(s) * kK2;
  const std::uint64_t b = load64(s + 8);
  const std::uint64_t c = load64(s + len - 8) * mul;
  const std::uint64_t d = load64(s + len - 16) * kK2;
  const std::uint64_t y = rotr(a + b, 43) + rotr(c, 30) + d;
  const std::uint64_t z = mix16(y, a + rotr(b + kK2, 18) + c, mul);
  const std::uint64_t e = load64(s + 16) * mul;
  const std::uint64_t f = load64(s + 24);
  const std::uint64_t g = (y + load64(s + len - 32)) * mul;
  const std::uint64_t h = (z + load64(s + len - 24)) * mul;
  return mix16(rotr(e + f, 43) + rotr(g, 30) + h, e + rotr(f + a, 18) + g, mul);
}

using Pair = std::pair<std::uint64_t, std::uint64_t>;

// A weak 16-byte hash of the 32 bytes at s and two seeds.
inline Pair weak32(const char* s, std::uint64_t a, std::uint64_t b) noexcept {
  const std::uint64_t w = load64(s), x = load64(s + 8), y = load64(s + 16), z = load64(s + 24);
  a += w;
  b = rotr(b + a + z, 21);
  const std::uint64_t c = a;
  a += x;
  a += y;
  b += rotr(a, 44);
  return {a + z, b + c};
}

// Lengths above 64: a 56-byte state (v, w, x, y, z) absorbs 64-byte blocks; the last block is the
// final 64 bytes of the input (overlapping the previous one), mixed with a different multiplier.
std::uint64_t hash_long(const char* s, std::size_t len) noexcept {
  constexpr std::uint64_t kSeed = 81;
  std::uint64_t x = kSeed;
  std::uint64_t y = kSeed * kK1 + 113;
  std::uint64_t z = shift_mix(y * kK2 + 113) * kK2;
  Pair v{0, 0}, w{0, 0};
  x = x * kK2 + load64(s);
  const char* const end = s + ((len - 1) / 64) * 64;
  const char* const last64 = s + len - 64;
  do {
    x = rotr(x + y + v.first + load64(s + 8), 37) * kK1;
    y = rotr(y + v.second + load64(s + 48), 42) * kK1;
    x ^= w.second;
    y += v.first + load64(s + 40);
    z = rotr(z + w.first, 33) * kK1;
    v = weak32(s, v.second * kK1, x + w.first);
    w = weak32(s + 32, z + w.second, y + load64(s + 16));
    std::swap(z, x);
    s += 64;
  } while (s != end);
  const std::uint64_t mul = kK1 + ((z & 0xff) << 1);
  s = last64;
  w.first += (len - 1) & 63;
  v.first += w.first;
  w.first += v.first;
  x = rotr(x + y + v.first + load64(s + 8), 37) * mul;
  y = rotr(y + v.second + load64(s + 48), 42) * mul;
  x ^= w.second * 9;
  y += v.first * 9 + load64(s + 40);
  z = rotr(z + w.first, 33) * mul;
  v = weak32(s, v.second * mul, x + w.first);
  w = weak32(s + 32, z + w.second, y + load64(s + 16));
  std::swap(z, x);
  return mix16(mix16(v.first, w.first, mul) + shift_mix(y) * kK0 + z, mix16(v.second, w.second, mul) + x, mul);
}

}  // namespace

std::uint64_t fingerprint64(std::string_view text) noexcept {
  const char* s = text.data();
  const std::size_t len = text.size();
  if (len <= 16) return hash_0_to_16(s, len);
  if (len <= 32) return hash_17_to_32(s, len);
  if (len <= 64) return hash_33_to_64(s, len);
  return hash_long(s, len);
}

std::int64_t to_hash_bucket_fast(std::string_view s, std::int64_t num_buckets) {
  if (num_buckets < 1)
    throw ConfigError("to_hash_bucket_fast: num_buckets is " + std::to_string(num_buckets) + ", expected >= 1");
  return static_cast<std::int64_t>(fingerprint64(s) % static_cast<std::uint64_t>(num_buckets));
}

std::uint64_t fingerprint_cat64(std::uint64_t fp1, std::uint64_t fp2) noexcept {
  constexpr std::uint64_t kMul = 0xc6a4a7935bd1e995ULL;
  std::uint64_t result = fp1 ^ kMul;
  result ^= shift_mix(fp2 * kMul) * kMul;
  result *= kMul;
  result = shift_mix(result) * kMul;
  return shift_mix(result);
}

std::int64_t sparse_cross_hash(const std::vector<std::uint64_t>& feature_hashes, std::int64_t num_buckets,
                               std::uint64_t hash_key) {
  if (num_buckets < 0)
    throw ConfigError("sparse_cross_hash: num_buckets is " + std::to_string(num_buckets) + ", expected >= 0");
  std::uint64_t h = hash_key;
  for (std::uint64_t f : feature_hashes) h = fingerprint_cat64(h, f);
  const std::uint64_t modulus = num_buckets > 0 ? static_cast<std::uint64_t>(num_buckets)
                                                : static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  return static_cast<std::int64_t>(h % modulus);
}

}  // namespace strata::data
