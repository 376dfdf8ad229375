// Test access to a PS arena: where this worker's inbox, doorbell and chunk counter
// for a shard live, and raw transport operations on a PS region. Tests use it to write words a
// worker never would (a malformed inbox, a doorbell run ahead) and check that the PS refuses them
// (arena_checks.h). Not for the library's own use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ps/dynamic_table.h"
#include "strata/ps/parameter_servers.h"

namespace strata::ps {

struct ParameterServersTestPeer {
  // This worker's words for one shard (by its name: "emb" or "emb/part_1") on the PS holding it.
  struct InboxWords {
    int rank = -1;                 // the PS's transport rank
    std::uint64_t header = 0;      // i64 row count (-1 dense), then the row indices
    std::uint64_t payload = 0;     // the gradient
    std::uint64_t doorbell = 0;    // i64: this worker's pushes sent
    std::uint64_t chunks = 0;      // i64: streamed chunks delivered (0 when the shard is not streamed)
    std::uint64_t chunk_bytes = 0;
  };
  static InboxWords inbox_words(PsClient& client, std::string_view shard_name);
  // This worker's request area and doorbell for dynamic variable `name` on PS `ps`.
  struct DynamicWords {
    int rank = -1;              // the PS's transport rank
    std::uint64_t request = 0;  // header (count, kind, step, last), ids at +64
    std::uint64_t doorbell = 0;
  };
  static DynamicWords dynamic_words(PsClient& client, std::string_view name, int ps);
  // PS 0's control words (its rank is ps_rank): the chief's save request id and every worker's clock.
  struct ControlWords {
    int ps_rank = -1;
    std::uint64_t save_request = 0;
    std::uint64_t clock_of_worker0 = 0;  // worker w's clock at clock_of_worker0 + 8 w
  };
  static ControlWords control_words(PsEndpoint& endpoint);
  // This rank's wake words (wake_word.h): whether its own is mapped (a PS's word, or a worker's word
  // on PS 0), the sleeps it took on them and how many a ring ended before their timeout.
  struct WakeCounts {
    bool mapped = false;
    std::int64_t sleeps = 0;
    std::int64_t rung = 0;
  };
  static WakeCounts wake_counts(PsEndpoint& endpoint);
  // This PS's table of dynamic variable `name`, exported (its rows, slots, stamps, counters).
  static DynamicTableSnapshot export_dynamic(PsServer& server, std::string_view name);
  // Raw one-sided operations on the PS region (remote completion included).
  static void put(PsEndpoint& endpoint, int rank, std::uint64_t offset, const void* src, std::size_t bytes);
  static std::int64_t fetch_add(PsEndpoint& endpoint, int rank, std::uint64_t offset, std::int64_t value);
  // A put_notify of `bytes` as one piece counted at `counter` (remote completion included): how a
  // worker sends a dynamic request where the transport keeps its operations in order.
  static void put_notify(PsEndpoint& endpoint, int rank, std::uint64_t offset, const void* src, std::size_t bytes,
                         std::uint64_t counter);
};

}  // namespace strata::ps
