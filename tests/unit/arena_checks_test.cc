// The checks a PS applies to words other ranks wrote into its arena (src/ps/arena_checks.h), on
// crafted values in-process: inbox row counts, row indices, doorbells, chunk counters, streamed
// pieces and layout sizes. Each bad value must be an Error naming the writer and what was wrong;
// each good value must pass unchanged (the service loop relies on both). The same checks in a real
// multi-rank job are in tests/ranks/ps_untrusted_test.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ps/arena_checks.h"
#include "strata/common/error.h"
#include "strata/ps/shard_map.h"

namespace strata::ps {
namespace {

const WordWriter kWorker1{"worker:1", 2};
const ShardName kKernel{"dense/kernel", 0, 784};

// The message of the Error `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(ArenaChecks, InboxRowCountIsDenseOrAtMostTheShardsRows) {
  EXPECT_EQ(checked_inbox_count(-1, kKernel, kWorker1), -1);
  EXPECT_EQ(checked_inbox_count(0, kKernel, kWorker1), 0);
  EXPECT_EQ(checked_inbox_count(784, kKernel, kWorker1), 784);
  EXPECT_EQ(error_of([] { checked_inbox_count(785, kKernel, kWorker1); }),
            "worker:1 (rank 2) put a row count of 785 into its inbox for variable 'dense/kernel' shard 0, which has "
            "784 rows (-1 marks a dense gradient)");
  EXPECT_EQ(error_of([] { checked_inbox_count(-2, kKernel, kWorker1); }),
            "worker:1 (rank 2) put a row count of -2 into its inbox for variable 'dense/kernel' shard 0, which has "
            "784 rows (-1 marks a dense gradient)");
  const std::int64_t huge = std::int64_t{1} << 59;
  EXPECT_NE(error_of([&] { checked_inbox_count(huge, kKernel, kWorker1); }).find("row count of 576460752303423488"),
            std::string::npos);
  EXPECT_NE(error_of([] { checked_inbox_count(std::numeric_limits<std::int64_t>::min(), kKernel, kWorker1); }), "");
}

TEST(ArenaChecks, RowIndicesOutsideTheShardAreNamed) {
  const std::vector<std::int64_t> good = {0, 5, 5, 783, 1};
  EXPECT_EQ(error_of([&] { check_inbox_rows(good.data(), good.size(), kKernel, kWorker1); }), "");
  EXPECT_EQ(error_of([] { check_inbox_rows(nullptr, 0, kKernel, kWorker1); }), "");

  const std::vector<std::int64_t> far = {std::int64_t{1} << 40};
  EXPECT_EQ(error_of([&] { check_inbox_rows(far.data(), far.size(), kKernel, kWorker1); }),
            "worker:1 (rank 2) put row index 1099511627776 (entry 0 of 1) into its inbox for variable "
            "'dense/kernel' shard 0, which has 784 rows");
  const std::vector<std::int64_t> negative = {3, 2, 1, -1, 7};
  EXPECT_EQ(error_of([&] { check_inbox_rows(negative.data(), negative.size(), kKernel, kWorker1); }),
            "worker:1 (rank 2) put row index -1 (entry 3 of 5) into its inbox for variable 'dense/kernel' shard 0, "
            "which has 784 rows");
  const std::vector<std::int64_t> one_past = {783, 784};
  EXPECT_NE(error_of([&] { check_inbox_rows(one_past.data(), one_past.size(), kKernel, kWorker1); })
                .find("row index 784 (entry 1 of 2)"),
            std::string::npos);
  const std::vector<std::int64_t> lowest = {std::numeric_limits<std::int64_t>::min()};
  EXPECT_NE(error_of([&] { check_inbox_rows(lowest.data(), lowest.size(), kKernel, kWorker1); })
                .find("row index -9223372036854775808"),
            std::string::npos);
  // A shard without rows admits no index at all.
  const ShardName empty{"e", 2, 0};
  const std::vector<std::int64_t> zero = {0};
  EXPECT_EQ(error_of([&] { check_inbox_rows(zero.data(), zero.size(), empty, kWorker1); }),
            "worker:1 (rank 2) put row index 0 (entry 0 of 1) into its inbox for variable 'e' shard 2, which has 0 rows");
}

TEST(ArenaChecks, DoorbellMovesByAtMostOnePush) {
  EXPECT_FALSE(doorbell_rang(7, 7, kKernel, kWorker1));
  EXPECT_TRUE(doorbell_rang(8, 7, kKernel, kWorker1));
  EXPECT_EQ(error_of([] { doorbell_rang(9, 7, kKernel, kWorker1); }),
            "worker:1 (rank 2) rang its doorbell for variable 'dense/kernel' shard 0 to 9 after 7 of its pushes were "
            "applied (one push in flight per shard: the doorbell must read 7 or 8)");
  EXPECT_NE(error_of([] { doorbell_rang(6, 7, kKernel, kWorker1); }).find("to 6 after 7"), std::string::npos);
  EXPECT_NE(error_of([] { doorbell_rang(std::numeric_limits<std::int64_t>::min(), 0, kKernel, kWorker1); }), "");
}

TEST(ArenaChecks, ChunkCounterStaysWithinThePushInFlight) {
  // Pushes of 4 chunks. From a push boundary the counter may run to the end of the next push.
  for (std::int64_t arrived = 0; arrived <= 4; ++arrived) EXPECT_EQ(new_chunks(arrived, 0, 4, kKernel, kWorker1), arrived);
  EXPECT_EQ(new_chunks(8, 4, 4, kKernel, kWorker1), 4);
  // Mid-push it may only finish that push.
  EXPECT_EQ(new_chunks(4, 2, 4, kKernel, kWorker1), 2);
  EXPECT_EQ(error_of([] { new_chunks(5, 2, 4, kKernel, kWorker1); }),
            "worker:1 (rank 2) announced 5 chunks of its streamed pushes to variable 'dense/kernel' shard 0 after 2 "
            "were applied (a push has 4 chunks and one is in flight per shard: the counter must read 2 to 4)");
  EXPECT_NE(error_of([] { new_chunks(5, 0, 4, kKernel, kWorker1); }), "");
  EXPECT_NE(error_of([] { new_chunks(1, 2, 4, kKernel, kWorker1); }).find("announced 1 chunks"), std::string::npos);
  EXPECT_NE(error_of([] { new_chunks(std::numeric_limits<std::int64_t>::max(), 0, 1, kKernel, kWorker1); }), "");
}

TEST(ArenaChecks, StreamedPieceMustBeTheChunkDue) {
  // 40 bytes of f32 at offset 1000 in chunks of 16: [1000, 1016), [1016, 1032), [1032, 1040).
  StreamGeometry g;
  g.payload = 1000;
  g.shard_bytes = 40;
  g.chunk_bytes = 16;
  g.elem_bytes = 4;
  EXPECT_EQ(checked_stream_piece(1000, 16, g, 0, kKernel, kWorker1), 0u);
  EXPECT_EQ(checked_stream_piece(1016, 16, g, 1, kKernel, kWorker1), 4u);
  EXPECT_EQ(checked_stream_piece(1032, 8, g, 2, kKernel, kWorker1), 8u);

  auto bad = [&](std::uint64_t offset, std::uint64_t bytes, std::int64_t due) {
    return error_of([&] { checked_stream_piece(offset, bytes, g, due, kKernel, kWorker1); });
  };
  EXPECT_EQ(bad(1016, 16, 0),
            "worker:1 (rank 2) streamed a piece of 16 bytes at region offset 1016 for variable 'dense/kernel' shard 0, "
            "whose push is 40 bytes at offset 1000 in chunks of 16 (chunk 0 was due)");
  EXPECT_NE(bad(984, 16, 0), "");                          // before the payload
  EXPECT_NE(bad(1004, 16, 0), "");                         // not on a chunk boundary
  EXPECT_NE(bad(1000, 8, 0), "");                          // a short piece that is not the last
  EXPECT_NE(bad(1032, 16, 2), "");                         // the last chunk, run past the shard
  EXPECT_NE(bad(1040, 0, 3), "");                          // empty, at the end
  EXPECT_NE(bad(1048, 16, 3), "");                         // past the end
  EXPECT_NE(bad(std::numeric_limits<std::uint64_t>::max() - 3, 16, 0), "");  // offset + bytes wraps
  EXPECT_NE(bad(1000, std::uint64_t{1} << 63, 0), "");     // a length that wraps past the payload
  g.chunk_bytes = 18;  // a chunk that is not a whole number of elements
  g.shard_bytes = 18;
  EXPECT_NE(bad(1000, 18, 0), "");
}

TEST(ArenaChecks, SizeArithmeticReportsWrapping) {
  std::uint64_t out = 0;
  EXPECT_TRUE(add_fits(1, 2, &out));
  EXPECT_EQ(out, 3u);
  EXPECT_FALSE(add_fits(std::numeric_limits<std::uint64_t>::max(), 1, &out));
  EXPECT_TRUE(mul_fits(std::uint64_t{1} << 31, std::uint64_t{1} << 32, &out));
  EXPECT_EQ(out, std::uint64_t{1} << 63);
  EXPECT_FALSE(mul_fits(std::uint64_t{1} << 32, std::uint64_t{1} << 32, &out));
}

TEST(ArenaChecks, VariablesAddingUpPast64BitsOnOnePsAreRefused) {
  // Each is 2^63 - 8 bytes, under VariableSpec::validate's bound; two on one PS wrap a 64-bit sum.
  auto big = [](const std::string& name) {
    VariableSpec spec;
    spec.name = name;
    spec.shape = {(std::int64_t{1} << 60) - 1};
    spec.dtype = DType::kF64;
    return spec;
  };
  std::string error;
  try {
    ShardMap::build({big("a"), big("b"), big("c")}, 1, PlacementPolicy::kRoundRobin);
  } catch (const ConfigError& e) {
    error = e.message();
  }
  EXPECT_EQ(error, "variable #2 'c': ps:0 would hold more than 2^64 bytes of variables");
}

}  // namespace
}  // namespace strata::ps
