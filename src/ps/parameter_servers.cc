// Parameter servers: materialisation, the PS service loop and the worker-side data plane. The
// protocols are narrated in include/strata/ps/parameter_servers.h.
#include "strata/ps/parameter_servers.h"

// Every strata translation unit that includes Eigen agrees on EIGEN_FAST_MATH (src/model/layers.h).
#ifndef EIGEN_FAST_MATH
#define EIGEN_FAST_MATH 0
#endif
#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "ps/apply_team.h"
#include "ps/arena_checks.h"
#include "ps/test_peer.h"
#include "strata/cluster/runtime.h"
#include "strata/comm/registry.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/parse.h"
#include "strata/common/signals.h"

namespace strata::ps {

// ---- checks of words other ranks wrote (arena_checks.h) -----------------------------------------

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

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kAlign = 64;
constexpr std::uint64_t kGlobalStepOffset = 0;
constexpr std::uint64_t kDoneOffset = 8;
// Save protocol words (PS 0; see ParameterServers::at_step_boundary). Only the chief changes the
// request words, always with fetch_add, so every access stays in MPI's atomic domain.
constexpr std::uint64_t kSaveRequestOffset = 16;  // id of the latest requested save (1, 2, ...)
constexpr std::uint64_t kSaveTargetOffset = 24;   // clock at which workers join it
constexpr std::uint64_t kSaveFlagsOffset = 32;    // kSaveFinal | kSaveStop
constexpr std::uint64_t kSaveArrivalsOffset = 40; // workers arrived, over all saves (n saves: n*W)
constexpr std::uint64_t kSaveDoneOffset = 48;     // id of the latest committed save
constexpr std::uint64_t kPreemptOffset = 56;      // ranks that got a preemption signal
constexpr std::uint64_t kSaveStatusOffset = 64;   // SaveStatus of the latest committed save id
constexpr std::uint64_t kClocksOffset = 128;
// Per worker after the clocks (PS 0): its WorkerPosition (epoch, offset, step) at the last save it
// joined, then that save's id (which names the workers a save still waits for).
constexpr std::uint64_t kPositionBytes = 32;
constexpr std::int64_t kSaveFinal = 1;
constexpr std::int64_t kSaveStop = 2;
// Largest optimizer or global step a checkpoint may restore.
constexpr std::int64_t kMaxRestoredStep = std::int64_t{1} << 62;

std::uint64_t align_up(std::uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

std::int64_t load_i64(const void* p) { return __atomic_load_n(static_cast<const std::int64_t*>(p), __ATOMIC_ACQUIRE); }
void store_i64(void* p, std::int64_t v) { __atomic_store_n(static_cast<std::int64_t*>(p), v, __ATOMIC_RELEASE); }

// Calls Transport::progress() from a helper thread for its lifetime. The owner must make no
// transport call meanwhile (Transport::progress's thread contract).
class BackgroundProgress {
 public:
  explicit BackgroundProgress(comm::Transport& transport)
      : thread_([this, &transport] {
          while (!stop_.load(std::memory_order_acquire)) {
            transport.progress();
            std::this_thread::sleep_for(std::chrono::microseconds(50));
          }
        }) {}
  ~BackgroundProgress() {
    stop_.store(true, std::memory_order_release);
    thread_.join();
  }
  BackgroundProgress(const BackgroundProgress&) = delete;
  BackgroundProgress& operator=(const BackgroundProgress&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Where one shard's pieces live in its PS arena.
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
};

comm::ElemType elem_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return comm::ElemType::kF32;
    case DType::kF64: return comm::ElemType::kF64;
    case DType::kI64: return comm::ElemType::kI64;
  }
  return comm::ElemType::kF32;
}

// Bytes the kernel says a new allocation can take without swapping; 0 if unknown.
std::uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// Backoff for polling loops: spin briefly (latency), then sleep in growing steps so an
// oversubscribed node keeps its cores for the ranks doing work.
class Backoff {
 public:
  void reset() { idle_ = 0; }
  void pause() {
    if (++idle_ < 64) return;
    auto us = std::min<int>(500, 1 << std::min(idle_ / 64, 9));
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

 private:
  int idle_ = 0;
};

template <typename T>
void scale(T* out, const T* in, std::size_t n, T factor) {
  for (std::size_t i = 0; i < n; ++i) out[i] = in[i] * factor;
}

// A sync round's mean gradient: out[i] = (((0 + g[0][i]) + g[1][i]) + ...) / workers, the sum
// in worker order starting from +0 (so a round is bit-identical to summing the workers one after
// another, however many there are). Eigen vectorises each element-wise pass and never reorders
// them; walking 4 KiB chunks keeps `out` in L1 across the passes. It runs on the PS between the
// last worker's push and the apply, i.e. on the critical path of every sync step.
template <typename T>
void mean_in_worker_order(T* out, const std::vector<const T*>& grads, std::size_t n) {
  using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
  constexpr std::size_t kChunk = 4096 / sizeof(T);
  const T workers = static_cast<T>(grads.size());
  for (std::size_t begin = 0; begin < n; begin += kChunk) {
    const auto len = static_cast<Eigen::Index>(std::min(kChunk, n - begin));
    Eigen::Map<Vec> sum(out + begin, len);
    sum.setZero();
    for (const T* g : grads) sum += Eigen::Map<const Vec>(g + begin, len);
    sum /= workers;
  }
}

}  // namespace

ConsistencyConfig ConsistencyConfig::parse(std::string_view text) {
  ConsistencyConfig c;
  if (text == "async") return c;
  if (text == "sync") {
    c.mode = Consistency::kSync;
    return c;
  }
  if (text.rfind("staleness:", 0) == 0) {
    c.mode = Consistency::kStaleness;
    c.staleness = parse_int(text.substr(10), "--consistency staleness", 0, 1 << 30);
    return c;
  }
  throw ConfigError("--consistency: '" + std::string(text) + "' is not one of async, sync, staleness:N");
}

std::string ConsistencyConfig::to_string() const {
  switch (mode) {
    case Consistency::kAsync: return "async";
    case Consistency::kSync: return "sync";
    case Consistency::kStaleness: return "staleness:" + std::to_string(staleness);
  }
  return "?";
}

struct ParameterServers::Impl {
  PsOptions options;
  ShardMap map;
  std::vector<ShardLayout> layout;        // per shard (index into map.shards())
  std::vector<std::uint64_t> arena_bytes;  // per PS index
  std::vector<int> ps_rank;                // PS index -> transport rank
  std::unique_ptr<comm::Transport> transport;
  std::unique_ptr<comm::Region> region;
  MPI_Comm comm = MPI_COMM_NULL;  // the runtime's communicator (borrowed; outlives this object)
  bool is_ps = false;
  int ps_index = -1;
  int worker = -1;       // index among chief + workers
  int num_workers = 0;
  bool uses_inbox = false;
  bool done_called = false;

  // Worker state.
  std::vector<std::int64_t> pushes;  // per shard: pushes this worker sent
  std::vector<std::int64_t> acked;   // per shard: the last ack of this worker's pushes read from its PS
  // Per shard: the ack word a streamed push reads back (put_notify), valid once drained by a flush;
  // readback_pending says one is on its way. Sized once: the transport writes into it.
  std::vector<std::int64_t> ack_readback;
  std::vector<char> readback_pending;
  std::int64_t clock = 0;
  std::int64_t max_staleness = 0;
  std::int64_t known_low = 0;  // worker: a lower bound of the slowest worker's clock (clocks only grow)
  std::int64_t saves_joined = 0;      // saves this worker took part in
  std::int64_t save_posted = 0;       // chief: the last request id it posted
  std::int64_t posted_target = 0;     // chief: value of the target word it last wrote
  std::int64_t posted_flags = 0;      // chief: value of the flags word it last wrote
  bool last_save_stopped = false;
  std::int64_t last_flags = 0;        // flags of the last save joined
  std::int64_t saves_committed = 0;   // worker: saves joined that committed a checkpoint
  std::int64_t saves_failed = 0;      // worker: saves joined that failed; PS: saves that failed here
  bool save_error_stop = false;       // a failed save stopped the job (stop_on_save_error)
  bool preemption_reported = false;
  bool staleness_owed = false;        // worker: end_step left its staleness wait to join a save first
  ParameterServers::SavePauses pauses;  // worker: saves joined at training step boundaries
  // PS state. The optimizer state (values, slots) and everything below up to `team` are written
  // by the service loop and, for streamed pushes that the transport hands over
  // (consume_notified), by the transport's thread: both hold apply_mu while they do.
  std::mutex apply_mu;
  std::vector<std::size_t> local_shards;  // shards served here through the inbox ("local shard" ls indexes it)
  std::vector<std::vector<std::int64_t>> consumed;  // per local shard, per worker: pushes applied
  std::vector<std::vector<std::int64_t>> bells_seen;   // per local shard, per worker: doorbell pushes applied
  std::vector<std::vector<std::int64_t>> chunks_seen;  // per local shard, per worker: streamed chunks applied
  std::vector<std::vector<std::int64_t>> stream_step;  // per local shard, per worker: step of its streamed push
  std::vector<std::vector<std::int64_t>> handed_seen;  // per local shard, per worker: chunks the transport handed over
  // Who writes each worker's words (per worker index) and how messages name each shard (per shard):
  // what a check of a word read from this arena names when it fails (arena_checks.h).
  std::vector<WordWriter> writers;
  std::vector<ShardName> shard_names;
  std::vector<std::int64_t> rounds;                 // per shard: applications in this job (sync rounds)
  std::vector<std::int64_t> step_base;              // per shard: optimizer steps restored from a checkpoint
  std::int64_t applied = 0;
  std::int64_t applied_elements = 0;
  double busy_s = 0;  // PS: time in apply() and sync-round sums
  std::int64_t split_updates = 0;  // PS: applications split over the apply team
  std::int64_t max_parts = 1;       // PS: most threads one application used
  std::unique_ptr<ApplyTeam> team;  // PS: optimizer threads beyond the loop's own (serve())
  std::vector<float> round_sum_f32;   // PS: a sync round's mean gradient (reused across rounds)
  std::vector<double> round_sum_f64;
  template <typename T>
  std::vector<T>& round_sum() {
    if constexpr (std::is_same_v<T, float>) return round_sum_f32;
    else return round_sum_f64;
  }
  std::int64_t saves_done = 0;  // PS: saves this PS took part in
  bool stopped = false;         // PS: a preemption save happened

  std::uint64_t positions_offset() const { return kClocksOffset + 8ull * static_cast<std::uint64_t>(num_workers); }
  // Every PS's own service statistics (updates, elements, busy ns, split updates), published in its header after
  // each application and before the ack that announces it, so a worker that saw every ack of
  // its pushes reads statistics that include them (ParameterServers::ps_stats).
  std::uint64_t stats_offset() const { return positions_offset() + kPositionBytes * static_cast<std::uint64_t>(num_workers); }
  void publish_stats() {
    store_i64(base() + stats_offset(), applied);
    store_i64(base() + stats_offset() + 8, applied_elements);
    store_i64(base() + stats_offset() + 16, static_cast<std::int64_t>(busy_s * 1e9));
    store_i64(base() + stats_offset() + 24, split_updates);
    store_i64(base() + stats_offset() + 32, max_parts);
  }
  int ps0() const { return ps_rank[0]; }
  int chief_rank = -1;  // worker 0's transport rank (the chief, which requests every save)
  std::int64_t read_ps0(std::uint64_t offset) { return transport->atomic_read(*region, ps0(), offset); }
  char* base() { return static_cast<char*>(region->local_base()); }
  const Shard& shard(std::size_t s) const { return map.shards()[s]; }
  bool trainable_shard(std::size_t s) const {
    const VariableSpec* spec = map.find(shard(s).variable);
    return spec->trainable && spec->dtype != DType::kI64;
  }
  std::size_t row_bytes(std::size_t s) const {
    const Shard& sh = shard(s);
    std::int64_t rows = std::max<std::int64_t>(1, sh.row_end - sh.row_begin);
    return sh.bytes / static_cast<std::size_t>(rows);
  }

  // Streamed pushes (async inbox pushes of dense shards of 512 KiB or more): the worker delivers
  // the gradient in 256 KiB chunks, each announced by a counter, and the PS applies every chunk
  // as it arrives, so the transfer of chunk k+1 overlaps the optimizer on chunk k: a push costs
  // about max(transfer, apply) instead of their sum (between nodes both are about a millisecond
  // per MiB). Bits are unchanged: the update is element-wise with one optimizer step for all the
  // chunks of a push. Chunks of different workers' pushes may interleave on the PS, as whole
  // updates may under async (TF's unlocked applies interleave element by element).
  static constexpr std::uint64_t kStreamChunkBytes = std::uint64_t{256} << 10;
  bool streams(std::size_t s) const {
    return uses_inbox && options.consistency.mode != Consistency::kSync && trainable_shard(s) &&
           shard(s).bytes >= 2 * kStreamChunkBytes;
  }

  [[noreturn]] void timeout(const std::string& what, std::vector<int> ranks) const {
    std::ostringstream os;
    os << what << " did not complete within " << options.timeout_s << " s";
    throw TimeoutError(os.str(), std::move(ranks));
  }

  // Polls `ready` until it is true or the deadline passes.
  template <typename Pred>
  void wait_for(Pred ready, const std::string& what, std::vector<int> blame) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options.timeout_s));
    Backoff backoff;
    while (!ready()) {
      if (Clock::now() > deadline) timeout(what, blame);
      backoff.pause();
    }
  }

  // Every offset and size is computed with checked arithmetic: shapes come from the chief's variable
  // list, and a layout that wrapped would put shards outside the arena. Every rank lays out the same
  // list, so a layout that does not fit is the same ConfigError everywhere.
  void layout_arenas(int num_ps) {
    const int num_slots_per_var = ps::num_slots(options.optimizer.kind);
    const auto workers = static_cast<std::uint64_t>(num_workers);
    arena_bytes.assign(num_ps, align_up(kClocksOffset + 8ull * workers + kPositionBytes * workers + 40));
    layout.resize(map.shards().size());
    for (std::size_t s = 0; s < map.shards().size(); ++s) {
      const Shard& sh = shard(s);
      auto& l = layout[s];
      std::uint64_t& top = arena_bytes[sh.ps];
      auto too_big = [&]() -> std::uint64_t {
        throw ConfigError("cannot place the variables: ps:" + std::to_string(sh.ps) + "'s arena would exceed 2^64 bytes at '" +
                          sh.name + "' (" + std::to_string(sh.bytes) + " bytes)");
      };
      // a + b rounded up to the alignment, or a ConfigError.
      auto grow = [&](std::uint64_t a, std::uint64_t b) {
        std::uint64_t sum = 0;
        return add_fits(a, b, &sum) && add_fits(sum, kAlign - 1, &sum) ? align_up(a + b) : too_big();
      };
      auto times = [&](std::uint64_t a, std::uint64_t b) {
        std::uint64_t product = 0;
        return mul_fits(a, b, &product) ? product : too_big();
      };
      l.values = top;
      top = grow(top, sh.bytes);
      if (!trainable_shard(s)) continue;
      l.slots = top;
      top = grow(top, times(static_cast<std::uint64_t>(num_slots_per_var), sh.bytes));
      if (!uses_inbox) continue;
      const std::uint64_t rows = static_cast<std::uint64_t>(std::max<std::int64_t>(1, sh.row_end - sh.row_begin));
      l.payload = grow(8, times(8, rows));
      l.inbox_bytes = grow(l.payload, sh.bytes);
      l.inboxes = top;
      top = grow(top, times(l.inbox_bytes, workers));
      l.doorbells = top;
      top = grow(top, 8 * workers);
      l.acks = top;
      top = grow(top, 8 * workers);
      if (streams(s)) {
        l.chunk_bytes = kStreamChunkBytes;
        l.chunks = top;
        top = grow(top, 8 * workers);
      }
    }
  }

  void initialise_local_shards() {
    for (std::size_t s = 0; s < map.shards().size(); ++s) {
      const Shard& sh = shard(s);
      if (sh.ps != ps_index) continue;
      const VariableSpec& spec = *map.find(sh.variable);
      ShardBuffers buffers = shard_buffers(s);
      // Slots first: a restore overwrites the slots its checkpoint has and keeps the rest initial.
      for (std::size_t k = 0; k < buffers.slots.size(); ++k) {
        double v = slot_initial_value(options.optimizer, static_cast<int>(k));
        const std::size_t n = sh.bytes / dtype_size(spec.dtype);
        if (spec.dtype == DType::kF32)
          std::fill_n(static_cast<float*>(buffers.slots[k]), n, static_cast<float>(v));
        else
          std::fill_n(static_cast<double*>(buffers.slots[k]), n, v);
      }
      const bool restored = options.checkpoint.restore && options.checkpoint.restore(buffers);
      if (!restored) fill(spec.init, spec.dtype, spec.shape, sh.row_begin, sh.row_end, buffers.values);
      // A restored step is a number from a file; the bound keeps every later step (step_base +
      // applications) from overflowing.
      if (buffers.optimizer_step < 0 || buffers.optimizer_step > kMaxRestoredStep)
        throw ConfigError("the checkpoint restores '" + sh.name + "' at optimizer step " +
                          std::to_string(buffers.optimizer_step) + ", outside [0, 2^62]");
      step_base[s] = buffers.optimizer_step;
    }
    if (ps_index == 0 && options.checkpoint.restore_global_step) {
      const std::int64_t step = options.checkpoint.restore_global_step();
      if (step < 0 || step > kMaxRestoredStep)
        throw ConfigError("the checkpoint restores the global step " + std::to_string(step) + ", outside [0, 2^62]");
      store_i64(base() + kGlobalStepOffset, step);
    }
    transport->sync_local(*region);
  }

  // This PS's view of shard s (s must be placed here).
  ShardBuffers shard_buffers(std::size_t s) {
    ShardBuffers b;
    b.shard = &shard(s);
    b.values = base() + layout[s].values;
    if (trainable_shard(s))
      for (int k = 0; k < ps::num_slots(options.optimizer.kind); ++k)
        b.slots.push_back(base() + layout[s].slots + static_cast<std::uint64_t>(k) * shard(s).bytes);
    b.optimizer_step = s < rounds.size() ? rounds[s] + step_base[s] : 0;
    return b;
  }

  // ---- checkpoint saves ---------------------------------------------------------------------

  // PS ranks, from the service loop: runs save `n` once every worker arrived at it. Every PS rank
  // sees the same monotone counters on PS 0, so all of them enter the collective save for n.
  //
  // The protocol words on PS 0 are written by the chief (request, flags) and the workers (arrivals,
  // positions, the global step) and checked before use: the chief posts one request at a time,
  // each once the previous one committed, so a new request is exactly saves_done + 1 (which also
  // keeps n * workers small); no worker arrives at a save before it is posted.
  bool maybe_save() {
    const std::int64_t n = read_ps0(kSaveRequestOffset);
    if (n <= saves_done) return false;
    if (n != saves_done + 1)
      fail_word(writers[0], "posted checkpoint save request " + std::to_string(n) + " on ps:0 after " +
                                std::to_string(saves_done) + " saves (requests are posted one at a time)");
    const std::int64_t arrivals = read_ps0(kSaveArrivalsOffset);
    if (arrivals < n * num_workers) return false;
    if (arrivals > n * num_workers)
      throw Error("ps:0's checkpoint arrival count reads " + std::to_string(arrivals) + " at save " + std::to_string(n) +
                  ", more than the " + std::to_string(n * num_workers) + " arrivals of " + std::to_string(num_workers) +
                  " workers at " + std::to_string(n) + " saves (each worker arrives once per save)");
    SaveContext ctx;
    ctx.save_number = n;
    // Every worker arrived quiesced (its pushes applied) and increments the global step inside its
    // step, before its boundary: the word counts exactly the steps whose updates the arenas hold.
    ctx.global_step = read_ps0(kGlobalStepOffset);
    if (ctx.global_step < 0) throw Error("the global step on ps:0 reads " + std::to_string(ctx.global_step) + " at save " + std::to_string(n));
    const std::int64_t flags = read_ps0(kSaveFlagsOffset);
    if ((flags & ~(kSaveFinal | kSaveStop)) != 0)
      fail_word(writers[0], "posted checkpoint save flags " + std::to_string(flags) + " for save " + std::to_string(n) +
                                " (known flags: 1 final, 2 stop)");
    ctx.final = (flags & kSaveFinal) != 0;
    ctx.stop = (flags & kSaveStop) != 0;
    constexpr std::size_t kWords = kPositionBytes / 8;
    std::vector<std::int64_t> pos(kWords * static_cast<std::size_t>(num_workers));
    transport->get(*region, ps0(), positions_offset(), pos.data(), pos.size() * 8);
    transport->flush(*region, ps0());
    for (int w = 0; w < num_workers; ++w) {
      const std::int64_t* word = pos.data() + kWords * static_cast<std::size_t>(w);
      const WorkerPosition p{word[0], word[1], word[2]};
      if (p.epoch < 0 || p.offset < 0 || p.step < 0)
        fail_word(writers[w], "published the input position epoch " + std::to_string(p.epoch) + ", offset " +
                                  std::to_string(p.offset) + ", step " + std::to_string(p.step) + " for checkpoint save " +
                                  std::to_string(n) + " (none may be negative)");
      // A worker writes its position and n before it arrives: with n * W arrivals counted, every
      // worker's word reads n, or the position beside it is not the one of this save.
      if (word[3] != n)
        fail_word(writers[w], "arrived at checkpoint save " + std::to_string(n) + " but its position word names save " +
                                  std::to_string(word[3]));
      ctx.positions.push_back(p);
    }
    transport->sync_local(*region);
    {
      // The save itself reads values and slots without the lock: every worker arrived, so each
      // of its pushes was applied (acknowledged) and none is in flight.
      std::lock_guard<std::mutex> lock(apply_mu);
      for (std::size_t s = 0; s < map.shards().size(); ++s)
        if (shard(s).ps == ps_index) ctx.shards.push_back(shard_buffers(s));
    }
    STRATA_LOG(DEBUG) << "saving checkpoint " << n << " at global step " << ctx.global_step;
    SaveStatus status = SaveStatus::kFailed;
    {
      // The save is a blocking collective (parallel HDF5) during which this thread makes no
      // transport call. Transports whose one-sided operations need the target's progress (UCX over
      // TCP) would otherwise stall every peer reading this PS: another PS still reading the save
      // counters here before joining the collective (a deadlock), and workers polling for the commit.
      BackgroundProgress keep_answering(*transport);
      status = options.checkpoint.save(ctx);
    }
    saves_done = n;
    if (ctx.stop) stopped = true;
    if (status == SaveStatus::kFailed) {
      ++saves_failed;
      if (options.checkpoint.stop_on_save_error) save_error_stop = true;
    }
    if (ps_index == 0) {
      // The status first: a worker that reads done >= n then reads n's status (it cannot change
      // before that worker arrives at save n + 1).
      store_i64(base() + kSaveStatusOffset, static_cast<std::int64_t>(status));
      store_i64(base() + kSaveDoneOffset, n);
      transport->sync_local(*region);
    }
    return true;
  }

  // Worker: whether save request n (the newest one) is this boundary's to join: not joined yet,
  // its target clock reached, and not the final save (joined from finish_checkpoints() only: a
  // worker still training would push after it and then wait for a request that never comes).
  bool joinable(std::int64_t n) {
    if (n <= saves_joined) return false;
    if (clock < read_ps0(kSaveTargetOffset)) return false;
    return (read_ps0(kSaveFlagsOffset) & kSaveFinal) == 0;
  }
  bool save_waiting_here() { return options.checkpoint.enabled && joinable(read_ps0(kSaveRequestOffset)); }

  // Worker: takes part in save `n`: quiesce (every push applied), publish the position, arrive,
  // wait until every worker arrived, then for the commit. `training`: joined at a step boundary of
  // the training loop; the time it took is this worker's save pause (ParameterServers::save_pauses).
  ParameterServers::Boundary join_save(std::int64_t n, const WorkerPosition& position, bool training) {
    const auto t0 = Clock::now();
    flush_all_peers();
    for (std::size_t s = 0; s < pushes.size(); ++s) wait_ack(s, "checkpoint quiesce");
    const std::int64_t words[kPositionBytes / 8] = {position.epoch, position.offset, position.step, n};
    transport->put(*region, ps0(), positions_offset() + kPositionBytes * static_cast<std::uint64_t>(worker), words,
                   sizeof words);
    transport->flush(*region, ps0());
    // Read n's flags before arriving: once every worker arrived the save can commit and the chief
    // may post n + 1 (overwriting the flags) before this worker looks again.
    last_flags = read_ps0(kSaveFlagsOffset);
    transport->fetch_add(*region, ps0(), kSaveArrivalsOffset, 1);
    wait_arrivals(n);
    const double limit = std::max(options.save_timeout_s, options.timeout_s);
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
    Backoff backoff;
    while (read_ps0(kSaveDoneOffset) < n) {
      if (Clock::now() > deadline) {
        std::vector<int> blame(ps_rank.begin(), ps_rank.end());
        throw TimeoutError("worker " + std::to_string(worker) + " waited " + std::to_string(limit) +
                               " s for the PS ranks to write checkpoint save " + std::to_string(n) +
                               " (every worker arrived)",
                           std::move(blame));
      }
      backoff.pause();
    }
    saves_joined = n;
    const auto status = static_cast<SaveStatus>(read_ps0(kSaveStatusOffset));
    ParameterServers::Boundary b;
    b.saved = true;
    b.failed = status == SaveStatus::kFailed;
    b.skipped = status == SaveStatus::kSkipped;
    if (status == SaveStatus::kSaved) ++saves_committed;
    if (b.failed) {
      ++saves_failed;
      if (options.checkpoint.stop_on_save_error) save_error_stop = true;
    }
    last_save_stopped = (last_flags & kSaveStop) != 0 || (b.failed && options.checkpoint.stop_on_save_error);
    b.stop = last_save_stopped;
    if (training) {
      const double paused = std::chrono::duration<double>(Clock::now() - t0).count();
      pauses.total_s += paused;
      pauses.max_s = std::max(pauses.max_s, paused);
      ++pauses.saves;
    }
    return b;
  }

  // Worker, arrived at save n: waits until every worker arrived. A worker that is not at a step
  // boundary yet is still in a step (async: its next boundary; sync: the target clock), so the
  // bound is --timeout without progress: the deadline moves on while the job's global step moves.
  // Past it, the message names the workers whose position word does not name save n.
  void wait_arrivals(std::int64_t n) {
    const auto bound = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));
    auto deadline = Clock::now() + bound;
    std::int64_t step = read_ps0(kGlobalStepOffset);
    Backoff backoff;
    while (read_ps0(kSaveArrivalsOffset) < n * num_workers && read_ps0(kSaveDoneOffset) < n) {
      if (const std::int64_t now_step = read_ps0(kGlobalStepOffset); now_step != step) {
        step = now_step;
        deadline = Clock::now() + bound;
      }
      if (Clock::now() > deadline) {
        std::vector<int> late;
        std::string names;
        for (int w = 0; w < num_workers; ++w) {
          const std::uint64_t id_word = positions_offset() + kPositionBytes * static_cast<std::uint64_t>(w) + 24;
          if (transport->atomic_read(*region, ps0(), id_word) >= n) continue;
          late.push_back(writers[w].rank);
          names += (names.empty() ? "" : ", ") + describe(writers[w]);
        }
        std::ostringstream os;
        os << "worker " << worker << " waited " << options.timeout_s << " s at checkpoint save " << n
           << " while the job's global step stayed at " << step << "; not arrived at a step boundary: "
           << (names.empty() ? "(none: they arrived meanwhile)" : names) << " (--timeout / STRATA_TIMEOUT_S)";
        throw TimeoutError(os.str(), std::move(late));
      }
      backoff.pause();
    }
  }

  // Chief: posts request n = saves_joined + 1. Target and flags are written before the id, each
  // remotely complete, so a worker that reads id n reads n's target and flags.
  void post_save(std::int64_t target, std::int64_t flags) {
    transport->fetch_add(*region, ps0(), kSaveTargetOffset, target - posted_target);
    transport->fetch_add(*region, ps0(), kSaveFlagsOffset, flags - posted_flags);
    posted_target = target;
    posted_flags = flags;
    save_posted = transport->fetch_add(*region, ps0(), kSaveRequestOffset, 1) + 1;
  }

  // Under staleness:N: the slowest worker's clock (W remote atomics on PS 0); `who` gets the
  // workers at it.
  std::int64_t read_slowest(std::vector<int>* who) {
    std::int64_t low = clock;
    std::vector<std::int64_t> clocks(static_cast<std::size_t>(num_workers));
    for (int w = 0; w < num_workers; ++w) {
      clocks[w] = transport->atomic_read(*region, ps0(), kClocksOffset + 8ull * w);
      if (clocks[w] < 0) fail_word(writers[w], "set its clock word on ps:0 to " + std::to_string(clocks[w]));
      low = std::min(low, clocks[w]);
    }
    if (who)
      for (int w = 0; w < num_workers; ++w)
        if (clocks[w] == low) who->push_back(w);
    return low;
  }

  // Under staleness:N: waits until this worker's clock is at most N ahead of the slowest worker's
  // and records the gap. Returns false without waiting further when a save this worker must join
  // is posted meanwhile (save_waiting_here): a worker that arrived at a save keeps its clock until
  // the save commits, and the save waits for this worker, so the caller joins it first and then
  // waits again (at_step_boundary).
  bool wait_staleness(bool yield_to_save) {
    const std::int64_t bound = options.consistency.staleness;
    std::int64_t low = read_slowest(nullptr);
    bool yielded = false;
    if (clock - low > bound) {
      try {
        wait_for(
            [&] {
              if (clock - (low = read_slowest(nullptr)) <= bound) return true;
              return yielded = yield_to_save && save_waiting_here();
            },
            "bounded staleness wait (clock " + std::to_string(clock) + ", bound " + std::to_string(bound) + ")", {});
      } catch (const TimeoutError&) {
        std::vector<int> late;
        read_slowest(&late);
        std::string names;
        for (int w : late) names += (names.empty() ? "" : ",") + std::to_string(w);
        throw TimeoutError("worker " + std::to_string(worker) + " waited " + std::to_string(options.timeout_s) +
                               " s for slowest worker(s) " + names + " at clock " + std::to_string(low) +
                               " (own clock " + std::to_string(clock) + ", staleness bound " + std::to_string(bound) +
                               ")",
                           late);
      }
    }
    known_low = std::max(known_low, low);
    if (yielded) return false;
    max_staleness = std::max(max_staleness, clock - low);
    return true;
  }

  // ---- PS service loop ----------------------------------------------------------------------

  template <typename T>
  void apply(std::size_t s, const T* grad_or_null, const std::vector<std::int64_t>& rows, const T* row_grads) {
    const Shard& sh = shard(s);
    const int nslots = ps::num_slots(options.optimizer.kind);
    T* var = reinterpret_cast<T*>(base() + layout[s].values);
    std::vector<T*> slots(nslots);
    for (int k = 0; k < nslots; ++k)
      slots[k] = reinterpret_cast<T*>(base() + layout[s].slots + static_cast<std::uint64_t>(k) * sh.bytes);
    const std::int64_t step = ++rounds[s] + step_base[s];
    const auto t0 = Clock::now();
    double progress_s = 0;  // serving peers between chunks is not optimizer work: not busy time
    if (grad_or_null) {
      // Large shards are applied in chunks with a progress call between this thread's chunks, so
      // a PS never sits in pure compute for long while remote operations wait for it, and split
      // over the apply team (--ps-threads). The update is element-wise with the same step for
      // every element, so neither chunking nor splitting changes a single bit.
      const int parts = apply_dense_team<T>(team.get(), options.optimizer, step, var, slots.data(), nslots,
                                            grad_or_null, sh.bytes / sizeof(T), [this, &progress_s] {
                                              const auto p0 = Clock::now();
                                              transport->progress();
                                              progress_s += std::chrono::duration<double>(Clock::now() - p0).count();
                                            });
      if (parts > 1) ++split_updates;
      max_parts = std::max<std::int64_t>(max_parts, parts);
    } else {
      apply_sparse_rows(options.optimizer, step, var, slots.data(), row_bytes(s) / sizeof(T), rows.data(), row_grads,
                        rows.size());
    }
    ++applied;
    applied_elements += grad_or_null ? static_cast<std::int64_t>(sh.bytes / sizeof(T))
                                     : static_cast<std::int64_t>(rows.size() * (row_bytes(s) / sizeof(T)));
    busy_s += std::chrono::duration<double>(Clock::now() - t0).count() - progress_s;
    publish_stats();
  }

  // One chunk of worker w's streamed push to local shard ls (= shard s): elements [begin, begin +
  // count), `grad` pointing at the chunk's first element. The first chunk of a push takes the
  // push's optimizer step, which every later chunk shares; the last counts the push as one
  // application and publishes the worker's ack. The service loop (chunks from the inbox) and the
  // transport's thread (chunks handed over, consume_chunk) both come here, so both paths give the
  // same bits. `on_loop`: the service loop drives the transport's progress between team parts; the
  // transport's own thread needs none. Caller holds apply_mu.
  template <typename T>
  void apply_stream_chunk(std::size_t ls, std::size_t s, int w, std::size_t begin, std::size_t count, const T* grad,
                          bool first, bool last, bool on_loop) {
    if (first) stream_step[ls][w] = ++rounds[s] + step_base[s];
    const std::int64_t step = stream_step[ls][w];
    const Shard& sh = shard(s);
    const int nslots = ps::num_slots(options.optimizer.kind);
    T* var = reinterpret_cast<T*>(base() + layout[s].values) + begin;
    T* slots[8] = {};
    STRATA_CHECK(nslots <= 8, "optimizer with ", nslots, " slots");
    for (int k = 0; k < nslots; ++k)
      slots[k] = reinterpret_cast<T*>(base() + layout[s].slots + static_cast<std::uint64_t>(k) * sh.bytes) + begin;
    const auto t0 = Clock::now();
    double progress_s = 0;
    const int parts = apply_dense_team<T>(team.get(), options.optimizer, step, var, slots, nslots, grad, count,
                                          [this, &progress_s, on_loop] {
                                            if (!on_loop) return;
                                            const auto p0 = Clock::now();
                                            transport->progress();
                                            progress_s += std::chrono::duration<double>(Clock::now() - p0).count();
                                          });
    if (parts > 1 && last) ++split_updates;
    max_parts = std::max<std::int64_t>(max_parts, parts);
    applied_elements += static_cast<std::int64_t>(count);
    busy_s += std::chrono::duration<double>(Clock::now() - t0).count() - progress_s;
    if (last) ++applied;
    publish_stats();
    if (last) store_i64(base() + layout[s].acks + 8ull * static_cast<std::uint64_t>(w), ++consumed[ls][w]);
  }

  // Reads one inbox: dense (header -1: *dense = true, rows empty, returns the gradient) or sparse
  // (fills rows, returns the packed row gradients). The header and the row indices are copied out
  // of the arena before they are checked, so what is checked is what the update uses, whatever the
  // writer does to its inbox meanwhile; a row count within the shard's rows also keeps the packed
  // gradients inside the inbox's payload (rows x row bytes = shard bytes).
  template <typename T>
  const T* read_inbox(std::size_t s, int w, std::vector<std::int64_t>& rows, bool* dense) {
    const char* inbox = base() + layout[s].inboxes + static_cast<std::uint64_t>(w) * layout[s].inbox_bytes;
    std::int64_t n = 0;
    std::memcpy(&n, inbox, 8);
    n = checked_inbox_count(n, shard_names[s], writers[w]);
    rows.clear();
    *dense = n < 0;
    if (n > 0) {
      rows.resize(static_cast<std::size_t>(n));
      std::memcpy(rows.data(), inbox + 8, 8 * static_cast<std::size_t>(n));
      check_inbox_rows(rows.data(), rows.size(), shard_names[s], writers[w]);
    }
    return reinterpret_cast<const T*>(inbox + layout[s].payload);
  }

  template <typename T>
  bool serve_shard_async(std::size_t ls, std::size_t s) {
    bool worked = false;
    for (int w = 0; w < num_workers; ++w) {
      // A worker has at most one push in flight per shard (it waits for the previous ack), so a
      // doorbell push and a streamed push of the same worker never overlap.
      const std::int64_t bell = load_i64(base() + layout[s].doorbells + 8ull * w);
      if (doorbell_rang(bell, bells_seen[ls][w], shard_names[s], writers[w])) {
        std::vector<std::int64_t> rows;
        bool dense = false;
        const T* payload = read_inbox<T>(s, w, rows, &dense);
        if (dense)
          apply<T>(s, payload, rows, nullptr);
        else
          apply<T>(s, nullptr, rows, payload);
        bells_seen[ls][w] = bell;
        store_i64(base() + layout[s].acks + 8ull * w, ++consumed[ls][w]);
        worked = true;
      }
      if (layout[s].chunks == 0) continue;
      const std::int64_t arrived = load_i64(base() + layout[s].chunks + 8ull * w);
      if (arrived == chunks_seen[ls][w]) continue;
      const std::size_t n = shard(s).bytes / sizeof(T);
      const std::size_t per = layout[s].chunk_bytes / sizeof(T);
      const auto per_push = static_cast<std::int64_t>((n + per - 1) / per);
      new_chunks(arrived, chunks_seen[ls][w], per_push, shard_names[s], writers[w]);
      const T* grad = reinterpret_cast<const T*>(base() + layout[s].inboxes +
                                                 static_cast<std::uint64_t>(w) * layout[s].inbox_bytes +
                                                 layout[s].payload);
      for (std::int64_t c = chunks_seen[ls][w]; c < arrived; ++c) {
        const std::int64_t k = c % per_push;
        const std::size_t begin = static_cast<std::size_t>(k) * per;
        apply_stream_chunk<T>(ls, s, w, begin, std::min(per, n - begin), grad + begin, k == 0, k == per_push - 1, true);
      }
      chunks_seen[ls][w] = arrived;
      worked = true;
    }
    return worked;
  }

  template <typename T>
  bool serve_shard_sync(std::size_t ls, std::size_t s) {
    const std::int64_t round = rounds[s];
    for (int w = 0; w < num_workers; ++w)
      if (!doorbell_rang(load_i64(base() + layout[s].doorbells + 8ull * w), round, shard_names[s], writers[w]))
        return false;
    // Every worker's gradient for this round is in: aggregate in worker order, then apply once.
    // The aggregation is PS work too (apply() times itself and publishes the total).
    const auto t_sum = Clock::now();
    const Shard& sh = shard(s);
    const T inv = static_cast<T>(1) / static_cast<T>(num_workers);
    std::vector<std::int64_t> rows;
    bool dense = false;
    read_inbox<T>(s, 0, rows, &dense);  // every worker sends the same kind for a shard (checked below)
    const bool first_dense = dense;
    auto same_kind = [&](int w) {
      if (dense != first_dense) [[unlikely]] {
        fail_word(writers[w], "put a " + std::string(dense ? "dense" : "sparse") + " gradient into its inbox for variable '" +
                                  shard_names[s].variable + "' shard " + std::to_string(shard_names[s].part) +
                                  " in sync round " + std::to_string(round + 1) + ", where " + describe(writers[0]) +
                                  " put a " + (first_dense ? "dense" : "sparse") + " one");
      }
    };
    if (dense) {
      const std::size_t n = sh.bytes / sizeof(T);
      // One buffer kept across rounds: a fresh vector of a large shard each round was an mmap,
      // page faults and a memset on every sync step.
      std::vector<T>& sum = round_sum<T>();
      if (sum.size() < n) sum.resize(n);
      std::vector<const T*> grads(static_cast<std::size_t>(num_workers));
      for (int w = 0; w < num_workers; ++w) {
        grads[static_cast<std::size_t>(w)] = read_inbox<T>(s, w, rows, &dense);
        same_kind(w);
      }
      mean_in_worker_order(sum.data(), grads, n);
      busy_s += std::chrono::duration<double>(Clock::now() - t_sum).count();
      apply<T>(s, sum.data(), rows, nullptr);
    } else {
      std::vector<std::int64_t> all_rows;
      std::vector<T> all_grads;
      const std::size_t width = row_bytes(s) / sizeof(T);
      for (int w = 0; w < num_workers; ++w) {
        const T* g = read_inbox<T>(s, w, rows, &dense);
        same_kind(w);
        all_rows.insert(all_rows.end(), rows.begin(), rows.end());
        for (std::size_t i = 0; i < rows.size() * width; ++i) all_grads.push_back(g[i] * inv);
      }
      busy_s += std::chrono::duration<double>(Clock::now() - t_sum).count();
      apply<T>(s, nullptr, all_rows, all_grads.data());
    }
    for (int w = 0; w < num_workers; ++w) {
      consumed[ls][w] = round + 1;
      store_i64(base() + layout[s].acks + 8ull * w, round + 1);
    }
    return true;
  }

  // PS: the service state, and a consumer for every streamed push the transport can hand over.
  // Called once, after the shards are initialised and before the barrier that lets workers push.
  void prepare_service() {
    for (std::size_t s = 0; s < map.shards().size(); ++s)
      if (shard(s).ps == ps_index && uses_inbox && trainable_shard(s)) local_shards.push_back(s);
    consumed.assign(local_shards.size(), std::vector<std::int64_t>(num_workers, 0));
    bells_seen = consumed;
    chunks_seen = consumed;
    stream_step = consumed;
    handed_seen = consumed;
    if (options.apply_threads > 1) team = std::make_unique<ApplyTeam>(options.apply_threads);
    for (std::size_t ls = 0; ls < local_shards.size(); ++ls) {
      const std::size_t s = local_shards[ls];
      if (layout[s].chunks == 0) continue;
      const bool f32 = map.find(shard(s).variable)->dtype == DType::kF32;
      for (int w = 0; w < num_workers; ++w) {
        comm::Transport::PieceHandler h;
        if (f32)
          h = [this, ls, s, w](std::uint64_t off, const void* data, std::size_t n) { consume_chunk<float>(ls, s, w, off, data, n); };
        else
          h = [this, ls, s, w](std::uint64_t off, const void* data, std::size_t n) { consume_chunk<double>(ls, s, w, off, data, n); };
        if (!transport->consume_notified(*region, layout[s].chunks + 8ull * static_cast<std::uint64_t>(w), std::move(h)))
          return;  // this transport never hands pieces over: the service loop applies every chunk
      }
    }
  }

  // A chunk of worker w's streamed push to local shard ls (= shard s), handed over by the
  // transport's thread (consume_notified) from a buffer in cache: applied there and then, as the
  // service loop would apply it from the inbox, so the gradient is read once, while hot, and no
  // core has to wake the loop. Same chunk bounds and the same apply_stream_chunk as the loop's path.
  // The piece's offset and length come from the request on the wire: it must be exactly the chunk
  // due next (the transport hands a push's pieces over in order, one push in flight per shard).
  template <typename T>
  void consume_chunk(std::size_t ls, std::size_t s, int w, std::uint64_t offset, const void* data, std::size_t bytes) {
    StreamGeometry g;
    g.payload = layout[s].inboxes + static_cast<std::uint64_t>(w) * layout[s].inbox_bytes + layout[s].payload;
    g.shard_bytes = shard(s).bytes;
    g.chunk_bytes = layout[s].chunk_bytes;
    g.elem_bytes = sizeof(T);
    const std::int64_t per_push = static_cast<std::int64_t>((g.shard_bytes + g.chunk_bytes - 1) / g.chunk_bytes);
    std::lock_guard<std::mutex> lock(apply_mu);
    const std::int64_t due = handed_seen[ls][w] % per_push;
    const std::uint64_t begin = checked_stream_piece(offset, bytes, g, due, shard_names[s], writers[w]);
    ++handed_seen[ls][w];
    apply_stream_chunk<T>(ls, s, w, static_cast<std::size_t>(begin), bytes / sizeof(T), static_cast<const T*>(data),
                          due == 0, due == per_push - 1, false);
  }

  bool serve_once(const std::vector<std::size_t>& local) {
    std::lock_guard<std::mutex> lock(apply_mu);
    transport->sync_local(*region);
    bool worked = false;
    for (std::size_t ls = 0; ls < local.size(); ++ls) {
      const std::size_t s = local[ls];
      const bool f32 = map.find(shard(s).variable)->dtype == DType::kF32;
      if (options.consistency.mode == Consistency::kSync)
        worked |= f32 ? serve_shard_sync<float>(ls, s) : serve_shard_sync<double>(ls, s);
      else
        worked |= f32 ? serve_shard_async<float>(ls, s) : serve_shard_async<double>(ls, s);
    }
    if (worked) transport->sync_local(*region);
    return worked;
  }

  // ---- worker data plane --------------------------------------------------------------------

  const VariableSpec& spec_of(std::string_view variable, const char* op) const {
    const VariableSpec* spec = map.find(variable);
    if (!spec) throw Error(std::string(op) + ": unknown variable '" + std::string(variable) + "'");
    return *spec;
  }

  void check_bytes(const VariableSpec& spec, std::size_t bytes, const char* op) const {
    const std::size_t want = static_cast<std::size_t>(num_elements(spec.shape)) * dtype_size(spec.dtype);
    if (bytes != want)
      throw Error(std::string(op) + " '" + spec.name + "': " + std::to_string(bytes) + " bytes given, but " +
                  shape_to_string(spec.shape) + " " + to_string(spec.dtype) + " has " + std::to_string(want));
  }

  void check_trainable(const VariableSpec& spec, const char* op) const {
    if (!spec.trainable) throw Error(std::string(op) + " '" + spec.name + "': the variable is not trainable");
    if (spec.dtype == DType::kI64)
      throw Error(std::string(op) + " '" + spec.name + "': int64 variables take assign(), not gradients");
  }

  void require_worker(const char* op) const {
    if (worker < 0) throw Error(std::string(op) + " is a worker operation; this rank is not a worker");
  }

  // Waits until the PS applied this worker's previous push to shard s. The first wait of a step
  // reads the acks of every shard with a push outstanding in one pipelined batch (one round trip
  // per PS instead of one per shard, which between nodes is most of a push), and later waits of
  // the same step find theirs already read.
  void wait_ack(std::size_t s, const char* why) {
    const std::int64_t sent = pushes[s];
    if (sent == 0 || acked[s] >= sent) return;
    refresh_acks();
    if (acked[s] >= sent) return;
    const int peer = ps_rank[shard(s).ps];
    const std::uint64_t ack = layout[s].acks + 8ull * worker;
    wait_for([&] { return (acked[s] = transport->atomic_read(*region, peer, ack)) >= sent; },
             std::string(why) + ": push " + std::to_string(sent) + " of '" + shard(s).name + "' to ps:" +
                 std::to_string(shard(s).ps) + " (rank " + std::to_string(peer) + ") was not applied",
             {peer});
  }

  // Reads this worker's ack word of every shard with a push not yet seen acknowledged: gets to
  // every PS first, then one flush. An 8-byte aligned word the PS stores atomically reads whole.
  void refresh_acks() {
    std::vector<std::size_t> pending;
    for (std::size_t t = 0; t < pushes.size(); ++t)
      if (pushes[t] > acked[t] && !readback_pending[t]) pending.push_back(t);
    std::vector<std::int64_t> words(pending.size(), 0);
    for (std::size_t i = 0; i < pending.size(); ++i) {
      const std::size_t t = pending[i];
      transport->get(*region, ps_rank[shard(t).ps], layout[t].acks + 8ull * worker, &words[i], 8);
    }
    transport->flush_all(*region);  // drains the streamed pushes' read-backs too
    for (std::size_t i = 0; i < pending.size(); ++i) acked[pending[i]] = std::max(acked[pending[i]], words[i]);
    for (std::size_t t = 0; t < pushes.size(); ++t)
      if (readback_pending[t]) {
        acked[t] = std::max(acked[t], ack_readback[t]);
        readback_pending[t] = 0;
      }
  }


  // Sends one inbox message (rows empty and dense = true for a dense gradient).
  void send_inbox(std::size_t s, bool dense, const std::vector<std::int64_t>& rows, const void* payload,
                  std::size_t payload_bytes) {
    wait_ack(s, "push");
    const int peer = ps_rank[shard(s).ps];
    const std::uint64_t inbox = layout[s].inboxes + static_cast<std::uint64_t>(worker) * layout[s].inbox_bytes;
    std::vector<char> head(8 + 8 * rows.size());
    std::int64_t n = dense ? -1 : static_cast<std::int64_t>(rows.size());
    std::memcpy(head.data(), &n, 8);
    if (!rows.empty()) std::memcpy(head.data() + 8, rows.data(), 8 * rows.size());
    transport->put(*region, peer, inbox, head.data(), head.size());
    transport->put(*region, peer, inbox + layout[s].payload, payload, payload_bytes);
    if (transport->ordered_to(peer)) {
      // The transport applies our operations to this peer in order: the doorbell cannot overtake
      // the payload, so it goes as a one-way int64 accumulate, with no round trip at all (between
      // nodes a flush and a fetch-and-add cost two network round trips per shard and step).
      const std::int64_t one = 1;
      transport->accumulate(*region, peer, layout[s].doorbells + 8ull * worker, &one, 1, comm::ElemType::kI64);
    } else {
      // The payload must be remotely complete before the doorbell rings.
      transport->flush(*region, peer);
      transport->fetch_add(*region, peer, layout[s].doorbells + 8ull * worker, 1);
    }
    ++pushes[s];
    // Under sync the round is waited for by this worker's next read (settle_sync), not here: the
    // step's other pushes go out first, so the PS finds the whole step's rounds in one pass.
  }

  // Sync consistency: waits until every round this worker pushed is applied (one batched read of
  // the acks, then a wait per shard still behind). Called before every read of parameters, so a
  // sync worker never sees values without its own last step. No-op otherwise and on PS ranks.
  void settle_sync(const char* why) {
    if (options.consistency.mode != Consistency::kSync) return;
    for (std::size_t s = 0; s < pushes.size(); ++s) wait_ack(s, why);
  }

  // A streamed push (see streams()): one put_notify, which announces each chunk by adding 1 to
  // this worker's chunk counter once the chunk's bytes are in the inbox (so the PS never reads a
  // chunk before its bytes). Between nodes over tcp that is one request on the wire, answered
  // with this worker's ack word once the whole push took effect; when the PS's transport hands
  // chunks over (consume_notified) the PS applied them by then, so that answer is the ack.
  void send_streamed(std::size_t s, const void* payload) {
    wait_ack(s, "push");
    const int peer = ps_rank[shard(s).ps];
    const std::uint64_t inbox = layout[s].inboxes + static_cast<std::uint64_t>(worker) * layout[s].inbox_bytes;
    const std::uint64_t ack = layout[s].acks + 8ull * worker;
    if (transport->ordered_to(peer)) {
      // No flush: the read-back is answered after the whole push, and wait_ack drains it.
      transport->put_notify(*region, peer, inbox + layout[s].payload, payload, shard(s).bytes, layout[s].chunk_bytes,
                            layout[s].chunks + 8ull * worker, &ack_readback[s], ack);
      readback_pending[s] = 1;
    } else {
      transport->put_notify(*region, peer, inbox + layout[s].payload, payload, shard(s).bytes, layout[s].chunk_bytes,
                            layout[s].chunks + 8ull * worker, nullptr, 0);
      transport->flush(*region, peer);
    }
    ++pushes[s];
  }

  template <typename T>
  void push_dense_shard(std::size_t s, const T* grad) {
    const Shard& sh = shard(s);
    const std::size_t n = sh.bytes / sizeof(T);
    if (layout[s].chunks != 0) return send_streamed(s, grad);
    if (!uses_inbox) {
      // Async SGD: the update is an atomic element-wise sum of -lr * g on the PS.
      std::vector<T> delta(n);
      scale(delta.data(), grad, n, static_cast<T>(-options.optimizer.learning_rate));
      transport->accumulate(*region, ps_rank[sh.ps], layout[s].values, delta.data(), n, elem_type(map.find(sh.variable)->dtype));
      return;
    }
    send_inbox(s, true, {}, grad, sh.bytes);
  }

  template <typename T>
  void push_rows_typed(const VariableSpec& spec, const std::vector<std::int64_t>& rows, const T* grads) {
    const std::int64_t total_rows = num_rows(spec.shape);
    const std::size_t width = static_cast<std::size_t>(num_elements(spec.shape) / std::max<std::int64_t>(1, total_rows));
    // Sum duplicate rows first (TF semantics); std::map keeps rows sorted for the indexed datatype.
    std::map<std::int64_t, std::vector<T>> combined;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= total_rows)
        throw Error("push_rows '" + spec.name + "': row " + std::to_string(rows[i]) + " is out of range [0, " +
                    std::to_string(total_rows) + ")");
      auto [it, fresh] = combined.try_emplace(rows[i], width, static_cast<T>(0));
      for (std::size_t c = 0; c < width; ++c) it->second[c] += grads[i * width + c];
    }
    auto shards = map.shards_of(spec.name);
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const Shard& sh = shards[k];
      const std::size_t s = static_cast<std::size_t>(&sh - map.shards().data());
      std::vector<std::int64_t> local_rows;
      std::vector<T> payload;
      for (auto it = combined.lower_bound(sh.row_begin); it != combined.end() && it->first < sh.row_end; ++it) {
        local_rows.push_back(it->first - sh.row_begin);
        payload.insert(payload.end(), it->second.begin(), it->second.end());
      }
      if (local_rows.empty() && options.consistency.mode != Consistency::kSync) continue;
      if (!uses_inbox) {
        for (auto& x : payload) x *= static_cast<T>(-options.optimizer.learning_rate);
        transport->accumulate_rows(*region, ps_rank[sh.ps], layout[s].values, width, elem_type(spec.dtype), local_rows,
                                   payload.data());
      } else {
        // Sync rounds need every worker's message for every shard, even an empty one.
        send_inbox(s, false, local_rows, payload.data(), payload.size() * sizeof(T));
      }
    }
    if (!uses_inbox) flush_all_peers();
  }

  void flush_all_peers() { transport->flush_all(*region); }
};

ParameterServers::ParameterServers(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ParameterServers::~ParameterServers() {
  // Collective: region and transport are freed in the same order on every rank.
  try {
    impl_->region.reset();
    impl_->transport.reset();
  } catch (const std::exception& e) {
    STRATA_LOG(ERROR) << "freeing the parameter-server region failed: " << e.what();
    std::terminate();
  }
}

std::unique_ptr<ParameterServers> ParameterServers::materialize(const Runtime& runtime, const PsOptions& options,
                                                                const std::vector<VariableSpec>& specs) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->options.optimizer.validate();
  MPI_Comm comm = runtime.comms().runtime();
  impl->comm = comm;
  const double timeout = options.timeout_s;

  // Who is who: PS index -> rank, worker index (chief first, then workers by index).
  std::vector<int> worker_ranks;
  int chief_rank = -1;
  for (const auto& info : runtime.ranks()) {
    if (info.task.type == "ps") {
      if (static_cast<int>(impl->ps_rank.size()) <= info.task.index) impl->ps_rank.resize(info.task.index + 1, -1);
      impl->ps_rank[info.task.index] = info.rank;
    } else if (info.task.type == "chief" || info.task.type == "master") {
      chief_rank = info.rank;
    }
  }
  if (chief_rank >= 0) worker_ranks.push_back(chief_rank);
  {
    std::vector<std::pair<int, int>> workers;
    for (const auto& info : runtime.ranks())
      if (info.task.type == "worker") workers.emplace_back(info.task.index, info.rank);
    std::sort(workers.begin(), workers.end());
    for (const auto& w : workers) worker_ranks.push_back(w.second);
  }
  if (impl->ps_rank.empty()) throw ConfigError("the cluster has no ps task: parameter servers need at least one");
  if (worker_ranks.empty()) throw ConfigError("the cluster has no chief or worker task to train");
  impl->num_workers = static_cast<int>(worker_ranks.size());
  impl->is_ps = runtime.role() == Role::kPs;
  if (impl->is_ps) impl->ps_index = runtime.task().index;
  for (int w = 0; w < impl->num_workers; ++w)
    if (worker_ranks[w] == runtime.rank()) impl->worker = w;
  impl->chief_rank = worker_ranks[0];
  for (int r : worker_ranks) {
    WordWriter writer;
    writer.rank = r;
    for (const auto& info : runtime.ranks())
      if (info.rank == r) writer.task = info.task.str();
    impl->writers.push_back(std::move(writer));
  }

  // Between-graph replication check: every worker must have created the same variable sequence.
  const std::string mine = impl->worker >= 0 ? specs_to_json(specs) : std::string();
  std::vector<std::string> all = allgather_strings(comm, mine, timeout, "variable creation check");
  const std::string& reference = all[worker_ranks[0]];
  std::vector<VariableSpec> ref_specs = specs_from_json(reference);
  std::string mismatch;
  for (int w = 1; w < impl->num_workers; ++w) {
    const std::string& theirs = all[worker_ranks[w]];
    if (theirs == reference) continue;
    std::string diff = describe_difference(ref_specs, specs_from_json(theirs));
    mismatch += (mismatch.empty() ? "" : "; ") + std::string("worker ") + std::to_string(w) + " (rank " +
                std::to_string(worker_ranks[w]) + "): " + diff;
  }
  if (!mismatch.empty())
    throw ConfigError("variable creation differs from worker 0 (rank " + std::to_string(worker_ranks[0]) +
                      ") on " + mismatch + " (every worker must create the same variables in the same order)");

  impl->uses_inbox = impl->options.optimizer.kind != OptimizerKind::kSgd ||
                     impl->options.consistency.mode == Consistency::kSync;
  impl->map = ShardMap::build(ref_specs, static_cast<int>(impl->ps_rank.size()), options.placement);
  impl->layout_arenas(static_cast<int>(impl->ps_rank.size()));
  for (const Shard& sh : impl->map.shards()) impl->shard_names.push_back(ShardName{sh.variable, sh.part, sh.row_end - sh.row_begin});

  // Each PS checks that its arena fits before anyone allocates: a refusal is reported on every rank
  // instead of one rank failing inside a collective allocation.
  std::string verdict;
  if (impl->is_ps) {
    const std::uint64_t need = impl->arena_bytes[impl->ps_index];
    const std::uint64_t avail = mem_available_bytes();
    if (options.max_arena_bytes > 0 && need > options.max_arena_bytes)
      verdict = "ps:" + std::to_string(impl->ps_index) + " needs an arena of " + std::to_string(need) +
                " bytes, above the cap of " + std::to_string(options.max_arena_bytes) + " (STRATA_PS_MAX_ARENA_BYTES)";
    else if (avail > 0 && need > avail / 10 * 9)
      verdict = "ps:" + std::to_string(impl->ps_index) + " needs an arena of " + std::to_string(need) +
                " bytes but its node has " + std::to_string(avail) + " bytes available";
  }
  std::string refusals;
  for (const auto& v : allgather_strings(comm, verdict, timeout, "arena size check"))
    if (!v.empty()) refusals += (refusals.empty() ? "" : "; ") + v;
  if (!refusals.empty()) throw ConfigError("cannot place the variables: " + refusals);
  // A pending restore is checked the same way, before allocation: every PS looks at the checkpoint
  // against the variable list; identical complaints from several PS ranks are reported once.
  std::string restore_verdict;
  if (impl->is_ps && options.checkpoint.check) restore_verdict = options.checkpoint.check(impl->map);
  std::vector<std::string> complaints;
  for (const auto& v : allgather_strings(comm, restore_verdict, timeout, "checkpoint restore check"))
    if (!v.empty() && std::find(complaints.begin(), complaints.end(), v) == complaints.end()) complaints.push_back(v);
  if (!complaints.empty()) {
    std::string all;
    for (const auto& c : complaints) all += (all.empty() ? "" : "; ") + c;
    throw ConfigError(all);
  }

  impl->transport = comm::create_transport(options.transport, comm);
  impl->region = impl->transport->allocate_region(impl->is_ps ? impl->arena_bytes[impl->ps_index] : 0);
  impl->pushes.assign(impl->map.shards().size(), 0);
  impl->acked.assign(impl->map.shards().size(), 0);
  impl->ack_readback.assign(impl->map.shards().size(), 0);
  impl->readback_pending.assign(impl->map.shards().size(), 0);
  impl->rounds.assign(impl->map.shards().size(), 0);
  impl->step_base.assign(impl->map.shards().size(), 0);
  if (impl->is_ps) {
    impl->initialise_local_shards();
    impl->prepare_service();
  }
  // Values must be in place before any worker pulls, and stream consumers registered before any
  // worker pushes.
  STRATA_CHECK_MPI(MPI_Barrier(comm));
  STRATA_LOG(DEBUG) << "materialised " << impl->map.variables().size() << " variables, "
                    << impl->map.shards().size() << " shards on " << impl->ps_rank.size() << " PS";
  return std::unique_ptr<ParameterServers>(new ParameterServers(std::move(impl)));
}

const ShardMap& ParameterServers::shard_map() const { return impl_->map; }
bool ParameterServers::is_ps() const { return impl_->is_ps; }
int ParameterServers::num_workers() const { return impl_->num_workers; }
int ParameterServers::worker_index() const { return impl_->worker; }
std::int64_t ParameterServers::applied_updates() const { return impl_->applied; }
std::int64_t ParameterServers::max_observed_staleness() const { return impl_->max_staleness; }
void ParameterServers::wait_applied() {
  Impl& m = *impl_;
  m.require_worker("wait_applied");
  for (std::size_t s = 0; s < m.map.shards().size(); ++s) m.wait_ack(s, "wait_applied");
}

std::string ParameterServers::transport_description() const {
  const comm::Transport& t = *impl_->transport;
  return std::string(t.name()) + " (" + t.describe() + ")" + (t.why().empty() ? "" : "; " + t.why());
}

std::vector<ParameterServers::ServeStats> ParameterServers::ps_stats() {
  Impl& m = *impl_;
  std::vector<ServeStats> out(m.ps_rank.size());
  for (std::size_t p = 0; p < m.ps_rank.size(); ++p) {
    ServeStats& st = out[p];
    st.updates = m.transport->atomic_read(*m.region, m.ps_rank[p], m.stats_offset());
    st.elements = m.transport->atomic_read(*m.region, m.ps_rank[p], m.stats_offset() + 8);
    st.busy_s = 1e-9 * static_cast<double>(m.transport->atomic_read(*m.region, m.ps_rank[p], m.stats_offset() + 16));
    st.split_updates = m.transport->atomic_read(*m.region, m.ps_rank[p], m.stats_offset() + 24);
    st.max_threads = m.transport->atomic_read(*m.region, m.ps_rank[p], m.stats_offset() + 32);
  }
  return out;
}

bool ParameterServers::serve() {
  Impl& m = *impl_;
  if (!m.is_ps) throw Error("serve() runs on PS ranks only");
  const std::vector<std::size_t>& local = m.local_shards;
  Backoff backoff;
  while (true) {
    // Read the done counter before draining: every push a worker made precedes its done().
    m.transport->sync_local(*m.region);
    const bool all_done = load_i64(m.base() + kDoneOffset) >= m.num_workers;
    bool worked = m.serve_once(local);
    if (m.options.checkpoint.enabled) {
      if (!m.preemption_reported && preemption_signal() != 0) report_preemption();
      worked |= m.maybe_save();
    }
    if (all_done && !worked) break;
    m.transport->progress();
    if (worked)
      backoff.reset();
    else
      backoff.pause();
  }
  return m.stopped;
}

void ParameterServers::pull(std::string_view variable, void* dst, std::size_t bytes) {
  pull_many({PullTarget{variable, dst, bytes}});
}

void ParameterServers::pull_many(const std::vector<PullTarget>& targets) {
  Impl& m = *impl_;
  m.settle_sync("sync pull");
  for (const PullTarget& t : targets) {
    const VariableSpec& spec = m.spec_of(t.variable, "pull");
    m.check_bytes(spec, t.bytes, "pull");
    const std::size_t row_bytes = t.bytes / static_cast<std::size_t>(std::max<std::int64_t>(1, num_rows(spec.shape)));
    for (const Shard& sh : m.map.shards_of(spec.name)) {
      const std::size_t s = static_cast<std::size_t>(&sh - m.map.shards().data());
      m.transport->get(*m.region, m.ps_rank[sh.ps], m.layout[s].values,
                       static_cast<char*>(t.dst) + static_cast<std::size_t>(sh.row_begin) * row_bytes, sh.bytes);
    }
  }
  m.flush_all_peers();
}

void ParameterServers::push(std::string_view variable, const void* grad, std::size_t bytes) {
  Impl& m = *impl_;
  m.require_worker("push");
  const VariableSpec& spec = m.spec_of(variable, "push");
  m.check_trainable(spec, "push");
  m.check_bytes(spec, bytes, "push");
  const std::size_t row_bytes = bytes / static_cast<std::size_t>(std::max<std::int64_t>(1, num_rows(spec.shape)));
  for (const Shard& sh : m.map.shards_of(spec.name)) {
    const std::size_t s = static_cast<std::size_t>(&sh - m.map.shards().data());
    const char* g = static_cast<const char*>(grad) + static_cast<std::size_t>(sh.row_begin) * row_bytes;
    if (spec.dtype == DType::kF32)
      m.push_dense_shard<float>(s, reinterpret_cast<const float*>(g));
    else
      m.push_dense_shard<double>(s, reinterpret_cast<const double*>(g));
  }
  if (!m.uses_inbox) m.flush_all_peers();
}

void ParameterServers::pull_rows(std::string_view variable, const std::vector<std::int64_t>& rows, void* dst,
                                 std::size_t bytes) {
  Impl& m = *impl_;
  const VariableSpec& spec = m.spec_of(variable, "pull_rows");
  const std::int64_t total_rows = num_rows(spec.shape);
  const std::size_t row_bytes =
      static_cast<std::size_t>(num_elements(spec.shape) / std::max<std::int64_t>(1, total_rows)) * dtype_size(spec.dtype);
  if (bytes != rows.size() * row_bytes)
    throw Error("pull_rows '" + spec.name + "': " + std::to_string(bytes) + " bytes given for " +
                std::to_string(rows.size()) + " rows of " + std::to_string(row_bytes) + " bytes");
  m.settle_sync("sync pull_rows");
  auto shards = m.map.shards_of(spec.name);
  // Group requested positions by shard, fetch each group with one indexed get, then scatter.
  std::vector<std::vector<std::size_t>> positions(shards.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= total_rows)
      throw Error("pull_rows '" + spec.name + "': row " + std::to_string(rows[i]) + " is out of range [0, " +
                  std::to_string(total_rows) + ")");
    std::size_t k = 0;
    while (rows[i] >= shards[k].row_end) ++k;
    positions[k].push_back(i);
  }
  std::vector<std::vector<char>> staged(shards.size());
  for (std::size_t k = 0; k < shards.size(); ++k) {
    if (positions[k].empty()) continue;
    const Shard& sh = shards[k];
    const std::size_t s = static_cast<std::size_t>(&sh - m.map.shards().data());
    std::vector<std::int64_t> local;
    for (std::size_t i : positions[k]) local.push_back(rows[i] - sh.row_begin);
    staged[k].resize(local.size() * row_bytes);
    m.transport->get_rows(*m.region, m.ps_rank[sh.ps], m.layout[s].values, row_bytes, local, staged[k].data());
  }
  m.flush_all_peers();
  for (std::size_t k = 0; k < shards.size(); ++k)
    for (std::size_t j = 0; j < positions[k].size(); ++j)
      std::memcpy(static_cast<char*>(dst) + positions[k][j] * row_bytes, staged[k].data() + j * row_bytes, row_bytes);
}

void ParameterServers::push_rows(std::string_view variable, const std::vector<std::int64_t>& rows, const void* grads,
                                 std::size_t bytes) {
  Impl& m = *impl_;
  m.require_worker("push_rows");
  const VariableSpec& spec = m.spec_of(variable, "push_rows");
  m.check_trainable(spec, "push_rows");
  const std::int64_t total_rows = num_rows(spec.shape);
  const std::size_t row_bytes =
      static_cast<std::size_t>(num_elements(spec.shape) / std::max<std::int64_t>(1, total_rows)) * dtype_size(spec.dtype);
  if (bytes != rows.size() * row_bytes)
    throw Error("push_rows '" + spec.name + "': " + std::to_string(bytes) + " bytes given for " +
                std::to_string(rows.size()) + " rows of " + std::to_string(row_bytes) + " bytes");
  if (spec.dtype == DType::kF32)
    m.push_rows_typed<float>(spec, rows, static_cast<const float*>(grads));
  else
    m.push_rows_typed<double>(spec, rows, static_cast<const double*>(grads));
}

void ParameterServers::assign(std::string_view variable, const void* values, std::size_t bytes) {
  Impl& m = *impl_;
  const VariableSpec& spec = m.spec_of(variable, "assign");
  m.check_bytes(spec, bytes, "assign");
  m.settle_sync("sync assign");  // a pending round must not land on top of the assigned values
  const std::size_t row_bytes = bytes / static_cast<std::size_t>(std::max<std::int64_t>(1, num_rows(spec.shape)));
  for (const Shard& sh : m.map.shards_of(spec.name)) {
    const std::size_t s = static_cast<std::size_t>(&sh - m.map.shards().data());
    m.transport->put(*m.region, m.ps_rank[sh.ps], m.layout[s].values,
                     static_cast<const char*>(values) + static_cast<std::size_t>(sh.row_begin) * row_bytes, sh.bytes);
  }
  m.flush_all_peers();
}

std::int64_t ParameterServers::global_step() {
  return impl_->transport->atomic_read(*impl_->region, impl_->ps_rank[0], kGlobalStepOffset);
}

std::int64_t ParameterServers::increment_global_step() {
  return impl_->transport->fetch_add(*impl_->region, impl_->ps_rank[0], kGlobalStepOffset, 1) + 1;
}

std::int64_t ParameterServers::end_step() {
  Impl& m = *impl_;
  m.require_worker("end_step");
  const int ps0 = m.ps_rank[0];
  // Only this worker advances its clock word, so it reads back exactly the clock it last set; the
  // other workers' clocks are never negative. Checked, the differences below cannot overflow.
  const std::int64_t before = m.transport->fetch_add(*m.region, ps0, kClocksOffset + 8ull * m.worker, 1);
  if (before != m.clock)
    throw Error("the clock word of " + describe(m.writers[m.worker]) + " on ps:0 read " + std::to_string(before) +
                ", but only this worker advances it and it last set " + std::to_string(m.clock));
  m.clock = before + 1;
  // Reading every worker's clock costs W remote atomics on PS 0 per worker step, O(W^2) per round
  // over the job: too much at hundreds of workers. Clocks only grow, so the last slowest clock
  // seen is a lower bound of the current one: under staleness:N the clocks are read only when
  // that bound alone cannot prove the wait unnecessary (exact), and otherwise (async, sync, or
  // a proven bound) only every kClockSampleSteps steps, for the max_observed_staleness gauge.
  constexpr std::int64_t kClockSampleSteps = 16;
  const bool bounded = m.options.consistency.mode == Consistency::kStaleness;
  const bool must_read = bounded && m.clock - m.known_low > m.options.consistency.staleness;
  if (!must_read && m.clock % kClockSampleSteps != 0) return m.clock;
  if (bounded) {
    // With checkpoints on, the wait gives way to a save posted meanwhile; at_step_boundary (which
    // every worker calls after end_step then) joins it and finishes the wait.
    m.staleness_owed = !m.wait_staleness(m.options.checkpoint.enabled);
    return m.clock;
  }
  const std::int64_t low = m.read_slowest(nullptr);
  m.known_low = std::max(m.known_low, low);
  m.max_staleness = std::max(m.max_staleness, m.clock - low);
  return m.clock;
}

std::int64_t ParameterServers::slowest_clock() {
  Impl& m = *impl_;
  m.require_worker("slowest_clock");
  std::int64_t low = std::numeric_limits<std::int64_t>::max();
  for (int w = 0; w < m.num_workers; ++w)
    low = std::min(low, m.transport->atomic_read(*m.region, m.ps_rank[0], kClocksOffset + 8ull * w));
  return low;
}

void ParameterServers::done() {
  Impl& m = *impl_;
  m.require_worker("done");
  if (m.done_called) return;
  m.done_called = true;
  // Async pushes must be remotely complete before the PS may stop serving.
  m.flush_all_peers();
  for (int ps : m.ps_rank) m.transport->fetch_add(*m.region, ps, kDoneOffset, 1);
}

void ParameterServers::request_save(bool stop) {
  Impl& m = *impl_;
  m.require_worker("request_save");
  if (m.worker != 0) throw Error("request_save: only the chief (worker 0) requests saves");
  if (!m.options.checkpoint.enabled) throw Error("request_save: checkpointing is not enabled");
  if (save_pending()) return;
  // Sync: the target c+1 is where every worker's round c+1 ends (none can be past it). Async and
  // staleness:N: 0, so every worker joins at its own next boundary and none waits for another to
  // reach the chief's clock (a slow worker costs the others at most its step in progress).
  const bool sync = m.options.consistency.mode == Consistency::kSync;
  m.post_save(sync ? m.clock + 1 : 0, stop ? kSaveStop : 0);
}

bool ParameterServers::save_pending() const { return impl_->save_posted > impl_->saves_joined; }

ParameterServers::Boundary ParameterServers::at_step_boundary(const WorkerPosition& position) {
  Impl& m = *impl_;
  m.require_worker("at_step_boundary");
  if (!m.options.checkpoint.enabled) return {};
  if (!m.preemption_reported && preemption_signal() != 0) report_preemption();
  // Join the save this boundary owes, then finish a staleness wait end_step left for it; a save
  // posted during that wait is joined too (at the same position: this worker pushed nothing since).
  Boundary b;
  while (true) {
    if (const std::int64_t n = m.read_ps0(kSaveRequestOffset); m.joinable(n)) {
      const Boundary joined = m.join_save(n, position, true);
      const bool failed = b.failed || joined.failed;
      b = joined;
      b.failed = failed;
      if (b.stop) {
        m.staleness_owed = false;
        return b;
      }
    }
    if (!m.staleness_owed) return b;
    m.staleness_owed = !m.wait_staleness(true);
  }
}

ParameterServers::Boundary ParameterServers::finish_checkpoints(const WorkerPosition& position) {
  Impl& m = *impl_;
  m.require_worker("finish_checkpoints");
  if (!m.options.checkpoint.enabled || m.last_save_stopped) return {};
  Boundary last;
  if (m.worker == 0) {
    // A request posted at the last boundary targets a clock nobody reaches: every worker is at its
    // end, so all of them join it here regardless of the target; then the final save.
    if (save_pending()) last = m.join_save(m.save_posted, position, false);
    if (last.stop) return last;
    m.post_save(0, kSaveFinal);
    return m.join_save(m.save_posted, position, false);
  }
  // Join whatever the chief still requests until its final (or a stop) save. The chief may still
  // be training (async: legitimately for long), so the bound is the one of the job's end-of-training
  // barrier: --timeout without progress. The deadline moves on while the job's global step moves
  // or a save is joined; a chief alive but stuck (no step, no request) is named after --timeout.
  const double limit = m.options.timeout_s;
  const auto bound = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  auto deadline = Clock::now() + bound;
  std::int64_t step = m.read_ps0(kGlobalStepOffset);
  Backoff backoff;
  while (true) {
    if (!m.preemption_reported && preemption_signal() != 0) report_preemption();
    const std::int64_t n = m.read_ps0(kSaveRequestOffset);
    if (n > m.saves_joined) {
      last = m.join_save(n, position, false);
      if (last.stop || (m.last_flags & (kSaveFinal | kSaveStop)) != 0) return last;
      backoff.reset();
      deadline = Clock::now() + bound;
      continue;
    }
    if (const std::int64_t now_step = m.read_ps0(kGlobalStepOffset); now_step != step) {
      step = now_step;
      deadline = Clock::now() + bound;
    }
    if (Clock::now() > deadline) {
      std::ostringstream os;
      os << "worker " << m.worker << " finished training and waited " << limit << " s for the chief (worker 0, rank "
         << m.chief_rank << ") to request the final checkpoint, while the job's global step stayed at " << step
         << " (--timeout / STRATA_TIMEOUT_S)";
      throw TimeoutError(os.str(), {m.chief_rank});
    }
    backoff.pause();
  }
}

void ParameterServers::barrier() {
  Impl& m = *impl_;
  MPI_Request request;
  STRATA_CHECK_MPI(MPI_Ibarrier(m.comm, &request));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(m.options.timeout_s));
  Backoff backoff;
  int done = 0;
  while (true) {
    STRATA_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (Clock::now() > deadline)
      throw TimeoutError("parameter servers: barrier did not complete within " + std::to_string(m.options.timeout_s) +
                             " s; some rank of the job did not arrive (MPI_Ibarrier cannot say which)",
                         {});
    m.transport->progress();
    backoff.pause();
  }
}

void ParameterServers::report_preemption() {
  Impl& m = *impl_;
  if (m.preemption_reported) return;
  m.preemption_reported = true;
  m.transport->fetch_add(*m.region, m.ps0(), kPreemptOffset, 1);
}

std::int64_t ParameterServers::preemption_reports() { return impl_->read_ps0(kPreemptOffset); }

ParameterServersTestPeer::InboxWords ParameterServersTestPeer::inbox_words(ParameterServers& servers,
                                                                           std::string_view shard_name) {
  ParameterServers::Impl& m = *servers.impl_;
  m.require_worker("inbox_words");
  for (std::size_t s = 0; s < m.map.shards().size(); ++s) {
    if (m.shard(s).name != shard_name) continue;
    const ShardLayout& l = m.layout[s];
    if (l.inbox_bytes == 0) throw Error("inbox_words: '" + std::string(shard_name) + "' has no inboxes in this job");
    InboxWords words;
    words.rank = m.ps_rank[static_cast<std::size_t>(m.shard(s).ps)];
    words.header = l.inboxes + static_cast<std::uint64_t>(m.worker) * l.inbox_bytes;
    words.payload = words.header + l.payload;
    words.doorbell = l.doorbells + 8ull * static_cast<std::uint64_t>(m.worker);
    words.chunks = l.chunks == 0 ? 0 : l.chunks + 8ull * static_cast<std::uint64_t>(m.worker);
    words.chunk_bytes = l.chunk_bytes;
    return words;
  }
  throw Error("inbox_words: no shard named '" + std::string(shard_name) + "'");
}

ParameterServersTestPeer::ControlWords ParameterServersTestPeer::control_words(ParameterServers& servers) {
  ParameterServers::Impl& m = *servers.impl_;
  ControlWords words;
  words.ps_rank = m.ps0();
  words.save_request = kSaveRequestOffset;
  words.clock_of_worker0 = kClocksOffset;
  return words;
}

void ParameterServersTestPeer::put(ParameterServers& servers, int rank, std::uint64_t offset, const void* src,
                                   std::size_t bytes) {
  ParameterServers::Impl& m = *servers.impl_;
  m.transport->put(*m.region, rank, offset, src, bytes);
  m.transport->flush(*m.region, rank);
}

std::int64_t ParameterServersTestPeer::fetch_add(ParameterServers& servers, int rank, std::uint64_t offset,
                                                 std::int64_t value) {
  ParameterServers::Impl& m = *servers.impl_;
  return m.transport->fetch_add(*m.region, rank, offset, value);
}

std::int64_t ParameterServers::saves_completed() const { return impl_->saves_committed; }
ParameterServers::SavePauses ParameterServers::save_pauses() const { return impl_->pauses; }
std::int64_t ParameterServers::save_failures() const { return impl_->saves_failed; }
bool ParameterServers::save_error_stopped() const { return impl_->save_error_stop; }

}  // namespace strata::ps
