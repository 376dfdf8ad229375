// String hashing for categorical features, bit-compatible with TensorFlow.
//
// fingerprint64 is FarmHash's Fingerprint64 (google/farmhash, farmhashna::Hash64, the function
// TensorFlow's Fingerprint64 and tf.strings.to_hash_bucket_fast use), written here from the
// algorithm: little-endian 8- and 4-byte loads, constants k0 k1 k2, one path each for lengths
// 0..16, 17..32, 33..64 and a 64-byte-block loop above 64. It is a fingerprint: the same bytes give
// the same value on every platform and in every release, so bucket assignments in a checkpoint
// stay valid. It is not a cryptographic hash: an adversary can craft collisions.
//
// Proof of equality with TensorFlow (tests/unit/feature_column_test.cc, suite Fingerprint64):
//  - TF's fingerprint test (tensorflow/core/platform/fingerprint_test.cc, IsForeverFrozen):
//    "Hello" -> 15404698994557526151, "World" -> 18308117990299812472;
//  - TF's string_to_hash_bucket_op_test.py (testStringToHashBucketsFast): "a" "b" "c" "d" ->
//    12917804110809363939, 11795596070477164822, 11430444447143000872, 4470636696479570465,
//    buckets [9, 2, 2, 5] of 10;
//  - the tf.strings.to_hash_bucket_fast documentation (its "Examples" section):
//    ["Hello", "TensorFlow", "2.x"] with 3 buckets -> [0, 2, 2];
//  - FarmHash's own self-test table (src/farmhash.cc, namespace farmhashnaTest, the Hash64
//    entries): hashes of its pseudo-random buffer at lengths 0..298 and offsets i*i, and longer
//    lengths, which cover every length branch and the block loop.
// sparse_cross_hash reproduces TF's sparse_cross_hashed (tensorflow/core/kernels/sparse_cross_op.cc,
// HashCrosser), checked against the values in TF's sparse_cross_op_test.py.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace strata::data {

// FarmHash Fingerprint64 of the bytes of `s`.
std::uint64_t fingerprint64(std::string_view s) noexcept;

// tf.strings.to_hash_bucket_fast: fingerprint64(s) % num_buckets. ConfigError when
// num_buckets < 1.
std::int64_t to_hash_bucket_fast(std::string_view s, std::int64_t num_buckets);

// TensorFlow's FingerprintCat64: combines two fingerprints into one (order matters).
std::uint64_t fingerprint_cat64(std::uint64_t fp1, std::uint64_t fp2) noexcept;

// The hash key tf.sparse.cross_hashed and tf.feature_column.crossed_column use when none is given
// (sparse_ops._DEFAULT_HASH_KEY).
inline constexpr std::uint64_t kDefaultCrossHashKey = 0xDECAFCAFFEULL;

// One crossed feature as TF's HashCrosser computes it: h = hash_key, then
// h = fingerprint_cat64(h, feature_hashes[i]) for each crossed feature in order, and the result is
// h % num_buckets, or h % INT64_MAX when num_buckets is 0. A feature's hash is fingerprint64 of a
// string value, or an integer value (an id, a raw int64 feature) as it is, cast to uint64.
// ConfigError when num_buckets < 0.
std::int64_t sparse_cross_hash(const std::vector<std::uint64_t>& feature_hashes, std::int64_t num_buckets,
                               std::uint64_t hash_key = kDefaultCrossHashKey);

}  // namespace strata::data
