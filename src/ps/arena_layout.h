// The layout of a PS region: where every word and buffer lives in the arena of each PS rank. The
// one place that computes it; the server (ps_server.cc), the client (ps_client.cc) and the
// checkpoint protocol (checkpoint_protocol.cc) only read the offsets it hands out. Every rank
// computes the same layout from the same variable list, so a worker addresses a PS's words
// without asking it.
//
// Arena of one PS (byte offsets; every piece starts on a 64-byte boundary unless noted):
//
//   control block (every PS allocates it; the words marked "PS 0" are used on PS 0 only)
//     [0]    global step (PS 0): fetch-and-add by the workers, read by the save
//     [8]    workers done: each worker adds 1 on every PS in done(); serve() returns at W
//     [16]   save request id (PS 0): the latest requested save, 1, 2, ... (chief, fetch_add)
//     [24]   save target clock (PS 0): workers join the request at this clock (chief)
//     [32]   save flags (PS 0): kSaveFinal | kSaveStop (chief)
//     [40]   save arrivals (PS 0): workers arrived, over all saves (n saves: n * W)
//     [48]   save done (PS 0): id of the latest committed save (PS 0's service loop)
//     [56]   preemption reports (PS 0): ranks of any role that got a preemption signal
//     [64]   save status (PS 0): the SaveStatus of the latest committed save
//     [72..127] unused
//     [128 + 8 w]            worker w's clock (PS 0; only worker w advances it)
//     [positions + 32 w]     worker w's WorkerPosition (epoch, offset, step) at the last save it
//                            joined, then that save's id (PS 0)
//     [stats + 0..39]        this PS's own ServeStats: updates, elements, busy ns, split updates,
//                            most threads (5 x i64), published before each ack
//     [wakes + 0]            this PS's wake word (u32, wake_word.h): set while its service
//                            loop sleeps; a co-located worker rings it after a doorbell
//     [wakes + 4 + 4 w]      worker w's wake word for this PS (u32): set while worker w sleeps
//                            on an ack of this PS, which rings it after storing acks
//     (positions = 128 + 8 W, stats = positions + 32 W, wakes = stats + 40; 8-byte aligned, not 64)
//
//   then, per shard placed on this PS, in shard-map order:
//     values                 shard bytes
//     optimizer slots        num_slots x shard bytes (trainable shards only), num_slots of the
//                            variable's own optimizer (VariableSpec::optimizer) or the job's
//     inboxes                W x inbox bytes; an inbox is an i64 row count (-1: dense), the row
//                            ids (i64, up to the shard's rows) and the payload (shard bytes), the
//                            payload at a 64-byte boundary inside it
//     doorbells              i64 per worker: pushes sent
//     acks                   i64 per worker: pushes applied (written by the PS)
//     chunk counters         i64 per worker: chunks of streamed pushes delivered (streamed
//                            shards only)
//   Inboxes, doorbells and acks exist only when pushes go through the PS (a stateful optimizer or
//   sync consistency); chunk counters only for streamed shards (streams_shard below).
//
//   then, per dynamic variable (DynamicVariableSpec), in declaration order, on every PS (each PS
//   serves the ids of its shard, shard_of(id, num_ps) == its index; offsets differ per PS):
//     requests               W x request bytes; a request is a 64-byte header (dynamic_header's
//                            words: id count n, kind, step, last-of-round flag), then the n ids
//                            (i64) and, for an update, the n gradient rows (dim f32) right after
//                            them; a lookup's answer (n rows) goes to `rows`, past max_ids ids
//     doorbells              i64 per worker: requests sent
//     acks                   i64 per worker: requests answered (written by the PS)
//   A job without dynamic variables has none of this: its arenas are byte for byte what they were.
//
// Every offset and size is computed with checked arithmetic: shapes come from the chief's variable
// list, and a layout that wrapped would put shards outside the arena. A layout that does not fit is
// the same ConfigError on every rank.
// Thread-safety: an ArenaLayout is immutable after build(); read it from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/ps/optimizer.h"
#include "strata/ps/shard_map.h"

namespace strata::ps {

// The control block's fixed words (see above).
namespace control {
constexpr std::uint64_t kGlobalStep = 0;
constexpr std::uint64_t kDone = 8;
// Save protocol words (checkpoint_protocol.cc). Only the chief changes the request words, always
// with fetch_add, so every access stays in MPI's atomic domain.
constexpr std::uint64_t kSaveRequest = 16;
constexpr std::uint64_t kSaveTarget = 24;
constexpr std::uint64_t kSaveFlags = 32;
constexpr std::uint64_t kSaveArrivals = 40;
constexpr std::uint64_t kSaveDone = 48;
constexpr std::uint64_t kPreempt = 56;
constexpr std::uint64_t kSaveStatus = 64;
// Workers that finished training (each adds 1 on entering finish_checkpoints; read by the chief,
// which keeps the periodic saves going while slower workers still train).
constexpr std::uint64_t kTrainingDone = 72;
constexpr std::uint64_t kClocks = 128;
constexpr std::uint64_t kPositionBytes = 32;  // epoch, offset, step, save id
constexpr std::uint64_t kStatsBytes = 40;     // five i64
constexpr std::int64_t kSaveFinal = 1;
constexpr std::int64_t kSaveStop = 2;
}  // namespace control

constexpr std::uint64_t kArenaAlign = 64;

// Streamed pushes (async inbox pushes of dense shards of two chunks or more) go in chunks of this
// size (ps_server.cc narrates why).
constexpr std::uint64_t kStreamChunkBytes = std::uint64_t{256} << 10;

// Where one shard's pieces live in its PS arena (0 where a piece does not exist).
struct ShardLayout {
  std::uint64_t values = 0;
  std::uint64_t slots = 0;        // slot k at slots + k * shard bytes
  std::uint64_t inboxes = 0;      // worker w's inbox at inboxes + w * inbox_bytes
  std::uint64_t inbox_bytes = 0;  // header (i64 row count, -1 = dense) | row ids (i64) | payload
  std::uint64_t payload = 0;      // offset of the payload inside an inbox
  std::uint64_t doorbells = 0;    // i64 per worker: pushes sent
  std::uint64_t acks = 0;         // i64 per worker: pushes applied
  std::uint64_t chunks = 0;       // i64 per worker: chunks of streamed pushes delivered (0: not streamed)
  std::uint64_t chunk_bytes = 0;  // a streamed push's chunk (the last one may be shorter)

  std::uint64_t slot(int k, std::uint64_t shard_bytes) const { return slots + static_cast<std::uint64_t>(k) * shard_bytes; }
  std::uint64_t inbox(int w) const { return inboxes + static_cast<std::uint64_t>(w) * inbox_bytes; }
  std::uint64_t doorbell(int w) const { return doorbells + 8ull * static_cast<std::uint64_t>(w); }
  std::uint64_t ack(int w) const { return acks + 8ull * static_cast<std::uint64_t>(w); }
  std::uint64_t chunk_counter(int w) const { return chunks + 8ull * static_cast<std::uint64_t>(w); }
};

// Where one dynamic variable's pieces live in one PS's arena (dynamic_service.cc uses them).
struct DynamicLayout {
  std::uint64_t requests = 0;       // worker w's request area at requests + w * request_bytes
  std::uint64_t request_bytes = 0;  // header | ids (| gradients) ... | answer rows
  std::uint64_t ids = 0;            // offset of the ids inside a request (after the header)
  std::uint64_t rows = 0;           // offset of a lookup's answer rows inside a request
  std::uint64_t doorbells = 0;      // i64 per worker: requests sent
  std::uint64_t acks = 0;           // i64 per worker: requests answered
  std::int64_t max_ids = 0;
  std::int64_t dim = 0;

  std::uint64_t request(int w) const { return requests + static_cast<std::uint64_t>(w) * request_bytes; }
  std::uint64_t doorbell(int w) const { return doorbells + 8ull * static_cast<std::uint64_t>(w); }
  std::uint64_t ack(int w) const { return acks + 8ull * static_cast<std::uint64_t>(w); }
};

// The words of a dynamic request's header (byte offsets inside the request).
namespace dynamic_header {
constexpr std::uint64_t kCount = 0;  // ids in this request, [0, max_ids]
constexpr std::uint64_t kKind = 8;   // DynamicRequestKind
constexpr std::uint64_t kStep = 16;  // update: the optimizer step, >= 1
constexpr std::uint64_t kLast = 24;  // update: 1 on the last request of this worker's batch (sync round)
constexpr std::uint64_t kBytes = 64;
}  // namespace dynamic_header
enum class DynamicRequestKind : std::int64_t { kLookupTrain = 1, kLookupInference = 2, kUpdate = 3 };

// Whether a shard takes gradients (a trainable float variable; int64 variables take assign only).
bool takes_gradients(const ShardMap& map, const Shard& shard);

// How pushes reach the PS ranks, which decides what the arenas hold.
struct PushPath {
  bool inbox = false;  // through the PS's inboxes (stateful optimizer or sync), else accumulates
  bool sync = false;   // sync consistency: rounds of every worker's push, never streamed
};

class ArenaLayout {
 public:
  ArenaLayout() = default;
  // ConfigError when a PS's arena would exceed 2^64 bytes.
  // `optimizer`: the job's, for the variables without their own (VariableSpec::optimizer).
  // `dynamic`: the dynamic variables, placed after every shard on every PS.
  static ArenaLayout build(const ShardMap& map, int num_workers, int num_ps, OptimizerKind optimizer, PushPath path,
                           const std::vector<DynamicVariableSpec>& dynamic = {});

  const ShardLayout& shard(std::size_t s) const { return shards_[s]; }
  const DynamicLayout& dynamic(std::size_t d, int ps) const {
    return dynamic_[d * static_cast<std::size_t>(num_ps_) + static_cast<std::size_t>(ps)];
  }
  std::uint64_t arena_bytes(int ps) const { return arena_bytes_[static_cast<std::size_t>(ps)]; }
  int num_workers() const { return workers_; }

  // Control-block words that depend on the worker count.
  std::uint64_t clock(int w) const { return control::kClocks + 8ull * static_cast<std::uint64_t>(w); }
  std::uint64_t positions() const { return clock(workers_); }
  std::uint64_t position(int w) const { return positions() + control::kPositionBytes * static_cast<std::uint64_t>(w); }
  std::uint64_t stats() const { return position(workers_); }
  std::uint64_t ps_wake() const { return stats() + control::kStatsBytes; }
  std::uint64_t worker_wake(int w) const { return ps_wake() + 4 + 4ull * static_cast<std::uint64_t>(w); }
  // Bytes of the control block before the first shard (64-byte aligned).
  std::uint64_t control_bytes() const;

 private:
  std::vector<ShardLayout> shards_;        // per shard (index into map.shards())
  std::vector<std::uint64_t> arena_bytes_;  // per PS index
  std::vector<DynamicLayout> dynamic_;      // per dynamic variable, per PS index
  int num_ps_ = 0;
  int workers_ = 0;
};

}  // namespace strata::ps
