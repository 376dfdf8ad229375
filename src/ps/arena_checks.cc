// Checks of the words other ranks write into a PS arena (arena_checks.h).
#include "ps/arena_checks.h"

#include <algorithm>

#include "strata/common/error.h"

namespace strata::ps {


std::string describe(const WordWriter& writer) {
  return writer.task + " (rank " + std::to_string(writer.rank) + ")";
}

void fail_word(const WordWriter& writer, const std::string& what) { throw Error(describe(writer) + " " + what); }

namespace {
std::string shard_words(const ShardName& shard) {
  return "variable '" + shard.variable + "' shard " + std::to_string(shard.part);
}
}  // namespace

void check_inbox_rows(const std::int64_t* rows, std::size_t n, const ShardName& shard, const WordWriter& writer) {
  // One unsigned comparison covers both ends: a negative index wraps above any row count.
  const auto limit = static_cast<std::uint64_t>(shard.rows);
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) bad |= static_cast<std::uint64_t>(rows[i]) >= limit;
  if (!bad) [[likely]]
    return;
  std::size_t i = 0;
  while (static_cast<std::uint64_t>(rows[i]) < limit) ++i;
  fail_word(writer, "put row index " + std::to_string(rows[i]) + " (entry " + std::to_string(i) + " of " +
                        std::to_string(n) + ") into its inbox for " + shard_words(shard) + ", which has " +
                        std::to_string(shard.rows) + " rows");
}

std::int64_t new_chunks(std::int64_t arrived, std::int64_t applied, std::int64_t per_push, const ShardName& shard,
                        const WordWriter& writer) {
  // `applied` and `per_push` are the PS's own counts (applied >= 0, per_push >= 1).
  const std::int64_t push_end = (applied / per_push + 1) * per_push;
  if (arrived < applied || arrived > push_end) [[unlikely]] {
    fail_word(writer, "announced " + std::to_string(arrived) + " chunks of its streamed pushes to " +
                          shard_words(shard) + " after " + std::to_string(applied) +
                          " were applied (a push has " + std::to_string(per_push) +
                          " chunks and one is in flight per shard: the counter must read " + std::to_string(applied) +
                          " to " + std::to_string(push_end) + ")");
  }
  return arrived - applied;
}

std::uint64_t checked_stream_piece(std::uint64_t offset, std::uint64_t bytes, const StreamGeometry& g,
                                   std::int64_t expected, const ShardName& shard, const WordWriter& writer) {
  if (offset >= g.payload && offset - g.payload <= g.shard_bytes) {
    const std::uint64_t rel = offset - g.payload;
    const std::uint64_t due = std::min(g.chunk_bytes, g.shard_bytes - rel);
    if (rel % g.chunk_bytes == 0 && bytes == due && bytes > 0 && bytes % g.elem_bytes == 0 &&
        rel / g.chunk_bytes == static_cast<std::uint64_t>(expected)) [[likely]]
      return rel / g.elem_bytes;
  }
  fail_word(writer, "streamed a piece of " + std::to_string(bytes) + " bytes at region offset " +
                        std::to_string(offset) + " for " + shard_words(shard) + ", whose push is " +
                        std::to_string(g.shard_bytes) + " bytes at offset " + std::to_string(g.payload) +
                        " in chunks of " + std::to_string(g.chunk_bytes) + " (chunk " + std::to_string(expected) +
                        " was due)");
}

}  // namespace strata::ps
