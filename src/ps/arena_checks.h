// Checks of the words other ranks write into a PS arena.
//
// Workers write a PS's inboxes (row count, row indices, gradient), doorbells, streamed-push chunk
// counters and the save-protocol words through the transports (RMA, shared memory, tcp puts), and
// the PS reads them back from its own memory. The PS trusts none of them (docs/SECURITY.md):
// every count, row index, offset and size among them is checked here before the PS uses it or
// allocates for it, and sizes are computed without wrapping. A violation throws strata::Error
// naming the rank that wrote the word (task and rank) and what was wrong; it ends the job through
// the fail-stop path (section 9): out of ParameterServers::serve() on the service loop, or on the
// transport's thread for a streamed piece, which ends the job there. Never a crash, never a
// silent skip.
//
// Cost: O(1) per message, plus one pass over a sparse message's row indices, which the update
// reads anyway. The gradient values themselves are not checked (any bits are a valid float).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::ps {

// The rank that wrote a word, as messages name it: "worker:1 (rank 2)".
struct WordWriter {
  std::string task;  // "chief:0", "worker:1", ...
  int rank = -1;
};
std::string describe(const WordWriter& writer);

// The shard a message is for, as messages name it: "variable 'dense/kernel' shard 0".
struct ShardName {
  std::string variable;
  int part = 0;           // shard index within the variable (0 when unpartitioned)
  std::int64_t rows = 0;  // the shard's rows: the most rows a sparse message carries, and the
                          // bound of its (shard-local) row indices
};

// Throws Error("<writer> <what>"). Cold.
[[noreturn]] void fail_word(const WordWriter& writer, const std::string& what);

// An inbox header's row count: -1 marks a dense gradient, 0..rows a sparse one. Returns `count`.
inline std::int64_t checked_inbox_count(std::int64_t count, const ShardName& shard, const WordWriter& writer) {
  if (count < -1 || count > shard.rows) [[unlikely]] {
    fail_word(writer, "put a row count of " + std::to_string(count) + " into its inbox for variable '" +
                          shard.variable + "' shard " + std::to_string(shard.part) + ", which has " +
                          std::to_string(shard.rows) + " rows (-1 marks a dense gradient)");
  }
  return count;
}

// A sparse message's row indices, each in [0, shard.rows). One branch-free pass; the offender is
// looked for only once the pass found one.
void check_inbox_rows(const std::int64_t* rows, std::size_t n, const ShardName& shard, const WordWriter& writer);

// A doorbell (or, under sync, a round's doorbell) read as `bell` after `applied` of this writer's
// pushes were applied. A worker has at most one push in flight per shard (it waits for the ack
// before the next), so the bell reads `applied` (nothing new) or `applied + 1` (one push waiting).
// Returns true for a waiting push.
inline bool doorbell_rang(std::int64_t bell, std::int64_t applied, const ShardName& shard, const WordWriter& writer) {
  if (bell == applied) return false;
  if (bell != applied + 1) [[unlikely]] {
    fail_word(writer, "rang its doorbell for variable '" + shard.variable + "' shard " + std::to_string(shard.part) +
                          " to " + std::to_string(bell) + " after " + std::to_string(applied) +
                          " of its pushes were applied (one push in flight per shard: the doorbell must read " +
                          std::to_string(applied) + " or " + std::to_string(applied + 1) + ")");
  }
  return true;
}

// A streamed push's chunk counter read as `arrived` after `applied` chunks of this writer were
// applied, each push having `per_push` chunks. With one push in flight per shard the counter never
// runs past the end of the push that chunk `applied` belongs to, nor backwards. Returns the number
// of chunks to apply now.
std::int64_t new_chunks(std::int64_t arrived, std::int64_t applied, std::int64_t per_push, const ShardName& shard,
                        const WordWriter& writer);

// A streamed push's geometry in the PS arena: the payload's byte offset, the shard's bytes, the
// chunk size and the element size.
struct StreamGeometry {
  std::uint64_t payload = 0;
  std::uint64_t shard_bytes = 0;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t elem_bytes = 0;
};

// A piece of a streamed push handed over by the transport (offset and length from the request on
// the wire): it must be exactly chunk `expected` of the shard (chunks arrive in order, one push in
// flight). The arithmetic cannot wrap. Returns the piece's first element.
std::uint64_t checked_stream_piece(std::uint64_t offset, std::uint64_t bytes, const StreamGeometry& geometry,
                                   std::int64_t expected, const ShardName& shard, const WordWriter& writer);

// Checked size arithmetic for arena layouts: false when the result does not fit.
inline bool add_fits(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return !__builtin_add_overflow(a, b, out); }
inline bool mul_fits(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

}  // namespace strata::ps
