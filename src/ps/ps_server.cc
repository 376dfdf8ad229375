// The server part of the parameter servers (server_core.h): a PS rank's service loop, the
// optimizer applications and the streamed pushes. The protocols are narrated in
// include/strata/ps/parameter_servers.h; the arena's layout in arena_layout.h.
//
// Streamed pushes (async inbox pushes of dense shards of two chunks or more, kStreamChunkBytes):
// the worker delivers the gradient in chunks, each announced by a counter, and the PS applies
// every chunk as it arrives, so the transfer of chunk k+1 overlaps the optimizer on chunk k: a
// push costs about max(transfer, apply) instead of their sum (between nodes the two are of the
// same order: docs/PERFORMANCE.md, "Between nodes"). Bits are unchanged: the update is
// element-wise with one optimizer step for all the chunks of a push. Chunks of different workers'
// pushes may interleave on the PS, as whole updates may under async (TF's unlocked applies
// interleave element by element).
#include "ps/server_core.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/signals.h"

namespace strata::ps {

void ServerCore::publish_stats() {
  store_i64(base() + layout.stats(), applied);
  store_i64(base() + layout.stats() + 8, applied_elements);
  store_i64(base() + layout.stats() + 16, static_cast<std::int64_t>(busy_s * 1e9));
  store_i64(base() + layout.stats() + 24, split_updates);
  store_i64(base() + layout.stats() + 32, max_parts);
}


void ServerCore::initialise_local_shards() {
  shard_optimizers.clear();
  for (const Shard& sh : map.shards()) shard_optimizers.push_back(effective_optimizer(*map.find(sh.variable), options.optimizer));
  for (std::size_t s = 0; s < map.shards().size(); ++s) {
    const Shard& sh = shard(s);
    if (sh.ps != ps_index) continue;
    const VariableSpec& spec = *map.find(sh.variable);
    ShardBuffers buffers = shard_buffers(s);
    // Slots first: a restore overwrites the slots its checkpoint has and keeps the rest initial.
    for (std::size_t k = 0; k < buffers.slots.size(); ++k) {
      double v = slot_initial_value(optimizer_of(s), static_cast<int>(k));
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
    store_i64(base() + control::kGlobalStep, step);
  }
  transport->sync_local(*region);
}


// This PS's view of shard s (s must be placed here).
ShardBuffers ServerCore::shard_buffers(std::size_t s) {
  ShardBuffers b;
  b.shard = &shard(s);
  b.values = base() + layout.shard(s).values;
  if (trainable_shard(s))
    for (int k = 0; k < ps::num_slots(optimizer_of(s).kind); ++k)
      b.slots.push_back(base() + layout.shard(s).slots + static_cast<std::uint64_t>(k) * shard(s).bytes);
  b.optimizer_step = s < rounds.size() ? rounds[s] + step_base[s] : 0;
  return b;
}


// ---- PS service loop ----------------------------------------------------------------------

template <typename T>
void ServerCore::apply(std::size_t s, const T* grad_or_null, const std::vector<std::int64_t>& rows, const T* row_grads) {
  const Shard& sh = shard(s);
  const OptimizerConfig& optimizer = optimizer_of(s);
  const int nslots = ps::num_slots(optimizer.kind);
  T* var = reinterpret_cast<T*>(base() + layout.shard(s).values);
  std::vector<T*> slots(nslots);
  for (int k = 0; k < nslots; ++k)
    slots[k] = reinterpret_cast<T*>(base() + layout.shard(s).slots + static_cast<std::uint64_t>(k) * sh.bytes);
  const std::int64_t step = ++rounds[s] + step_base[s];
  const auto t0 = Clock::now();
  double progress_s = 0;  // serving peers between chunks is not optimizer work: not busy time
  if (grad_or_null) {
    // Large shards are applied in chunks with a progress call between this thread's chunks, so
    // a PS never sits in pure compute for long while remote operations wait for it, and split
    // over the apply team (--ps-threads). The update is element-wise with the same step for
    // every element, so neither chunking nor splitting changes a single bit.
    const int parts = apply_dense_team<T>(team.get(), optimizer, step, var, slots.data(), nslots,
                                          grad_or_null, sh.bytes / sizeof(T), [this, &progress_s] {
                                            const auto p0 = Clock::now();
                                            transport->progress();
                                            progress_s += std::chrono::duration<double>(Clock::now() - p0).count();
                                          });
    if (parts > 1) ++split_updates;
    max_parts = std::max<std::int64_t>(max_parts, parts);
  } else {
    apply_sparse_rows(optimizer, step, var, slots.data(), row_bytes(s) / sizeof(T), rows.data(), row_grads,
                      rows.size());
  }
  ++applied;
  applied_elements += grad_or_null ? static_cast<std::int64_t>(sh.bytes / sizeof(T))
                                   : static_cast<std::int64_t>(rows.size() * (row_bytes(s) / sizeof(T)));
  busy_s += std::chrono::duration<double>(Clock::now() - t0).count() - progress_s;
  publish_stats();
}


template <typename T>
void ServerCore::apply_mean(std::size_t s, const std::vector<const T*>& grads, T* scratch) {
  const Shard& sh = shard(s);
  const OptimizerConfig& optimizer = optimizer_of(s);
  const int nslots = ps::num_slots(optimizer.kind);
  T* var = reinterpret_cast<T*>(base() + layout.shard(s).values);
  T* slots[8] = {};
  STRATA_CHECK(nslots <= 8, "optimizer with ", nslots, " slots");
  for (int k = 0; k < nslots; ++k)
    slots[k] = reinterpret_cast<T*>(base() + layout.shard(s).slots + static_cast<std::uint64_t>(k) * sh.bytes);
  const std::int64_t step = ++rounds[s] + step_base[s];
  const auto t0 = Clock::now();
  double progress_s = 0;
  const std::size_t n = sh.bytes / sizeof(T);
  const int parts = apply_mean_team<T>(team.get(), optimizer, step, var, slots, nslots, grads.data(),
                                       static_cast<int>(grads.size()), scratch, n, [this, &progress_s] {
                                         const auto p0 = Clock::now();
                                         transport->progress();
                                         progress_s += std::chrono::duration<double>(Clock::now() - p0).count();
                                       });
  if (parts > 1) ++split_updates;
  max_parts = std::max<std::int64_t>(max_parts, parts);
  ++applied;
  applied_elements += static_cast<std::int64_t>(n);
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
void ServerCore::apply_stream_chunk(std::size_t ls, std::size_t s, int w, std::size_t begin, std::size_t count, const T* grad,
                        bool first, bool last, bool on_loop) {
  if (first) stream_step[ls][w] = ++rounds[s] + step_base[s];
  const std::int64_t step = stream_step[ls][w];
  const Shard& sh = shard(s);
  const OptimizerConfig& optimizer = optimizer_of(s);
  const int nslots = ps::num_slots(optimizer.kind);
  T* var = reinterpret_cast<T*>(base() + layout.shard(s).values) + begin;
  T* slots[8] = {};
  STRATA_CHECK(nslots <= 8, "optimizer with ", nslots, " slots");
  for (int k = 0; k < nslots; ++k)
    slots[k] = reinterpret_cast<T*>(base() + layout.shard(s).slots + static_cast<std::uint64_t>(k) * sh.bytes) + begin;
  const auto t0 = Clock::now();
  double progress_s = 0;
  const int parts = apply_dense_team<T>(team.get(), optimizer, step, var, slots, nslots, grad, count,
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
  if (last) store_ack(layout.shard(s).ack(w), w, ++consumed[ls][w]);
}


// Reads one inbox: dense (header -1: *dense = true, rows empty, returns the gradient) or sparse
// (fills rows, returns the packed row gradients). The header and the row indices are copied out
// of the arena before they are checked, so what is checked is what the update uses, whatever the
// writer does to its inbox meanwhile; a row count within the shard's rows also keeps the packed
// gradients inside the inbox's payload (rows x row bytes = shard bytes).
template <typename T>
const T* ServerCore::read_inbox(std::size_t s, int w, std::vector<std::int64_t>& rows, bool* dense) {
  const char* inbox = base() + layout.shard(s).inboxes + static_cast<std::uint64_t>(w) * layout.shard(s).inbox_bytes;
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
  return reinterpret_cast<const T*>(inbox + layout.shard(s).payload);
}


template <typename T>
bool ServerCore::serve_shard_async(std::size_t ls, std::size_t s) {
  bool worked = false;
  for (int w = 0; w < num_workers; ++w) {
    // A worker has at most one push in flight per shard (it waits for the previous ack), so a
    // doorbell push and a streamed push of the same worker never overlap.
    const std::int64_t bell = load_i64(base() + layout.shard(s).doorbells + 8ull * w);
    if (doorbell_rang(bell, bells_seen[ls][w], shard_names[s], writers[w])) {
      std::vector<std::int64_t> rows;
      bool dense = false;
      const T* payload = read_inbox<T>(s, w, rows, &dense);
      if (dense)
        apply<T>(s, payload, rows, nullptr);
      else
        apply<T>(s, nullptr, rows, payload);
      bells_seen[ls][w] = bell;
      store_ack(layout.shard(s).ack(w), w, ++consumed[ls][w]);
      worked = true;
    }
    if (layout.shard(s).chunks == 0) continue;
    const std::int64_t arrived = load_i64(base() + layout.shard(s).chunks + 8ull * w);
    if (arrived == chunks_seen[ls][w]) continue;
    const std::size_t n = shard(s).bytes / sizeof(T);
    const std::size_t per = layout.shard(s).chunk_bytes / sizeof(T);
    const auto per_push = static_cast<std::int64_t>((n + per - 1) / per);
    new_chunks(arrived, chunks_seen[ls][w], per_push, shard_names[s], writers[w]);
    const T* grad = reinterpret_cast<const T*>(base() + layout.shard(s).inboxes +
                                               static_cast<std::uint64_t>(w) * layout.shard(s).inbox_bytes +
                                               layout.shard(s).payload);
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
bool ServerCore::serve_shard_sync(std::size_t ls, std::size_t s) {
  const std::int64_t round = rounds[s];
  for (int w = 0; w < num_workers; ++w)
    if (!doorbell_rang(load_i64(base() + layout.shard(s).doorbells + 8ull * w), round, shard_names[s], writers[w]))
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
    // One buffer kept across rounds: a fresh vector of a large shard each round would be an mmap,
    // page faults and a memset on every sync step.
    std::vector<T>& sum = round_sum<T>();
    if (sum.size() < n) sum.resize(n);
    std::vector<const T*> grads(static_cast<std::size_t>(num_workers));
    for (int w = 0; w < num_workers; ++w) {
      grads[static_cast<std::size_t>(w)] = read_inbox<T>(s, w, rows, &dense);
      same_kind(w);
    }
    busy_s += std::chrono::duration<double>(Clock::now() - t_sum).count();
    apply_mean<T>(s, grads, sum.data());
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
    store_ack(layout.shard(s).ack(w), w, round + 1);
  }
  return true;
}


// PS: the service state, and a consumer for every streamed push the transport can hand over.
// Called once, after the shards are initialised and before the barrier that lets workers push.
void ServerCore::prepare_service() {
  ack_stored.assign(static_cast<std::size_t>(num_workers), 0);
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
    if (layout.shard(s).chunks == 0) continue;
    const bool f32 = map.find(shard(s).variable)->dtype == DType::kF32;
    for (int w = 0; w < num_workers; ++w) {
      comm::Transport::PieceHandler h;
      if (f32)
        h = [this, ls, s, w](std::uint64_t off, const void* data, std::size_t n) { consume_chunk<float>(ls, s, w, off, data, n); };
      else
        h = [this, ls, s, w](std::uint64_t off, const void* data, std::size_t n) { consume_chunk<double>(ls, s, w, off, data, n); };
      if (!transport->consume_notified(*region, layout.shard(s).chunks + 8ull * static_cast<std::uint64_t>(w), std::move(h)))
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
void ServerCore::consume_chunk(std::size_t ls, std::size_t s, int w, std::uint64_t offset, const void* data, std::size_t bytes) {
  StreamGeometry g;
  g.payload = layout.shard(s).inboxes + static_cast<std::uint64_t>(w) * layout.shard(s).inbox_bytes + layout.shard(s).payload;
  g.shard_bytes = shard(s).bytes;
  g.chunk_bytes = layout.shard(s).chunk_bytes;
  g.elem_bytes = sizeof(T);
  const std::int64_t per_push = static_cast<std::int64_t>((g.shard_bytes + g.chunk_bytes - 1) / g.chunk_bytes);
  std::lock_guard<std::mutex> lock(apply_mu);
  const std::int64_t due = handed_seen[ls][w] % per_push;
  const std::uint64_t begin = checked_stream_piece(offset, bytes, g, due, shard_names[s], writers[w]);
  ++handed_seen[ls][w];
  apply_stream_chunk<T>(ls, s, w, static_cast<std::size_t>(begin), bytes / sizeof(T), static_cast<const T*>(data),
                        due == 0, due == per_push - 1, false);
  ring_acks();
}


bool ServerCore::serve_once() {
  const std::vector<std::size_t>& local = local_shards;
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
  for (std::size_t d = 0; d < dynamic_state.size(); ++d) worked |= serve_dynamic(d);
  if (!dynamic_failure.empty()) [[unlikely]]
    throw Error(dynamic_failure);
  if (worked) {
    transport->sync_local(*region);
    ring_acks();
  }
  return worked;
}

bool ServerCore::serve() {
  Backoff backoff;
  // Once the spin is over, the loop announces itself on its wake word before each pass and sleeps
  // on it when the pass found nothing, so a co-located worker's doorbell ends the sleep (its
  // timeout stays the backoff's: pushes from other nodes, saves and signals do not ring).
  std::uint32_t* const word = ps_wake[static_cast<std::size_t>(ps_index)];
  while (true) {
    if (word != nullptr && backoff.sleeps_next()) wake::announce(word);
    // Read the done counter before draining: every push a worker made precedes its done().
    transport->sync_local(*region);
    const bool all_done = load_i64(base() + control::kDone) >= num_workers;
    bool worked = serve_once();
    if (options.checkpoint.enabled) {
      if (!preemption_reported && preemption_signal() != 0) report_preemption();
      worked |= maybe_save();
    }
    if (all_done && !worked) break;
    transport->progress();
    if (worked) {
      backoff.reset();
      if (word != nullptr) wake::withdraw(word);
    } else if (word != nullptr && backoff.sleeps_next()) {
      ++wake_sleeps;
      wake_rung += backoff.pause_on(word) ? 1 : 0;
    } else {
      backoff.pause();
    }
  }
  if (word != nullptr) wake::withdraw(word);
  return stopped;
}

// ---- PsServer -----------------------------------------------------------------------------------

PsServer::PsServer(std::unique_ptr<ServerCore> core) : PsEndpoint(std::move(core)) {}
// The region and the transport go first: the transport's thread may still hand streamed chunks
// to this server's state until then.
PsServer::~PsServer() { core_->release(); }
ServerCore& PsServer::core() { return static_cast<ServerCore&>(*core_); }
const ServerCore& PsServer::core() const { return static_cast<const ServerCore&>(*core_); }
int PsServer::ps_index() const { return core().ps_index; }
bool PsServer::serve() { return core().serve(); }
std::int64_t PsServer::applied_updates() const { return core().applied; }

}  // namespace strata::ps
