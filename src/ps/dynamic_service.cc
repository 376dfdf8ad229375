// The data plane of dynamic variables (issue 22, item 3): lookups and updates by id between the
// workers and the PS ranks' DynamicTables.
//
// Protocol, per dynamic variable d, worker w and PS p (areas in arena_layout.h):
//   worker  waits until p answered its previous request (it always has: every call below waits
//           for its answers before returning) and sends the request, header | ids | (update)
//           gradient rows, as one message into its area on p, to every PS before waiting on any:
//           where the transport keeps this worker's operations to p in order (tcp between nodes)
//           as one put_notify whose counter is the doorbell and which reads the ack word back;
//           elsewhere as a put, a flush and a fetch_add of the doorbell, as the dense inboxes do.
//   PS      checks every header word (the writer is hostile, arena_checks.h), then: a lookup
//           writes the rows into the area's answer rows, an update applies the gradients; then it
//           stores the ack. Between nodes over tcp the transport's thread hands the message over
//           on arrival (consume_notified) and the PS serves it there, before the transport serves
//           the worker's next operation; otherwise the service loop finds the doorbell.
//   worker  a lookup reads the answer with one get: between nodes issued right behind the
//           request (one round trip for both; used when the read-back ack says it was served),
//           else after waiting for the ack (the job's timeout, naming the PS).
// Sync consistency: a PS applies a round only once every worker's batch for it arrived, then in
// worker order (one table fed worker 0's batch, then worker 1's, ...), so no lookup ever sees part
// of a round. The PS copies every update request of a round out of the worker's area; those before
// the last one of the worker's batch are acknowledged at once (the area takes the next), the last
// one once the round is applied: update_dynamic returns on that ack, when the whole round is
// applied on that PS, so a lookup that follows sees all of it.
// Admission: the client deduplicates, so one call counts each distinct id once.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "ps/client_core.h"
#include "ps/server_core.h"
#include "strata/common/env.h"
#include "strata/common/error.h"

namespace strata::ps {

namespace {

constexpr std::int64_t kMaxStep = kMaxDynamicStep;
// Posted ahead in chunks (STRATA_TCP_DYNAMIC_CHUNKS > 1), a chunk has at least this many ids: each
// request costs a wake-up and a reply on both sides.
constexpr std::size_t kMinChunkIds = 256;
constexpr std::int64_t kMaxChunks = 64;

const char* kind_name(DynamicRequestKind kind) {
  switch (kind) {
    case DynamicRequestKind::kLookupTrain: return "lookup";
    case DynamicRequestKind::kLookupInference: return "inference lookup";
    case DynamicRequestKind::kUpdate: return "update";
  }
  return "?";
}

DynamicTableConfig table_config(const DynamicVariableSpec& spec, const OptimizerConfig& optimizer) {
  DynamicTableConfig config;
  config.dim = spec.dim;
  config.init = spec.init;
  config.optimizer = optimizer;
  config.capacity = spec.capacity;
  config.admit_after = spec.admit_after;
  return config;
}

// Packs header | ids | (update) gradient rows into `msg`, one contiguous message; returns its
// bytes. The buffer only grows: a resize within its size would zero what is written next anyway.
std::size_t pack_request(std::vector<std::int64_t>& msg, std::int64_t dim, DynamicRequestKind kind,
                         const std::int64_t* ids, std::size_t n, const float* rows, std::int64_t step, bool last) {
  const std::size_t row_floats = rows ? n * static_cast<std::size_t>(dim) : 0;
  const std::size_t words = dynamic_header::kBytes / 8 + n + (row_floats + 1) / 2;
  if (msg.size() < words) msg.resize(words);
  std::fill(msg.begin(), msg.begin() + dynamic_header::kBytes / 8, 0);
  msg[dynamic_header::kCount / 8] = static_cast<std::int64_t>(n);
  msg[dynamic_header::kKind / 8] = static_cast<std::int64_t>(kind);
  msg[dynamic_header::kStep / 8] = step;
  msg[dynamic_header::kLast / 8] = last ? 1 : 0;
  if (n > 0) std::memcpy(msg.data() + dynamic_header::kBytes / 8, ids, 8 * n);
  if (row_floats > 0) std::memcpy(msg.data() + dynamic_header::kBytes / 8 + n, rows, 4 * row_floats);
  return dynamic_header::kBytes + 8 * n + 4 * row_floats;
}

// A request's header as the PS read it, checked.
struct Request {
  std::int64_t count = 0;
  DynamicRequestKind kind = DynamicRequestKind::kLookupTrain;
  std::int64_t step = 0;
  bool last = true;
};

Request checked_request(const char* header, const DynamicLayout& l, const std::string& variable, int ps,
                        std::int64_t number, const WordWriter& writer) {
  std::int64_t words[4];
  std::memcpy(words, header, sizeof words);
  const std::string where = " in its request " + std::to_string(number) + " for dynamic variable '" + variable +
                            "' to ps:" + std::to_string(ps);
  Request r;
  r.count = words[dynamic_header::kCount / 8];
  if (r.count < 0 || r.count > l.max_ids) [[unlikely]]
    fail_word(writer, "wrote an id count of " + std::to_string(r.count) + where + " (at most " +
                          std::to_string(l.max_ids) + " ids per request)");
  const std::int64_t kind = words[dynamic_header::kKind / 8];
  if (kind < 1 || kind > 3) [[unlikely]]
    fail_word(writer, "wrote a request kind of " + std::to_string(kind) + where +
                          " (1 lookup, 2 inference lookup, 3 update)");
  r.kind = static_cast<DynamicRequestKind>(kind);
  if (r.kind != DynamicRequestKind::kUpdate) return r;
  r.step = words[dynamic_header::kStep / 8];
  if (r.step < 1 || r.step > kMaxStep) [[unlikely]]
    fail_word(writer, "wrote an update step of " + std::to_string(r.step) + where + " (steps are in [1, 2^62])");
  const std::int64_t last = words[dynamic_header::kLast / 8];
  if (last != 0 && last != 1) [[unlikely]]
    fail_word(writer, "wrote a last-of-batch flag of " + std::to_string(last) + where + " (0 or 1)");
  r.last = last == 1;
  return r;
}

}  // namespace

// ---- spec -----------------------------------------------------------------------------------

void DynamicVariableSpec::validate() const {
  validate_variable_name(name);
  const std::string who = "dynamic variable '" + name + "': ";
  if (max_ids < 1 || max_ids > kMaxIds)
    throw ConfigError(who + "max_ids = " + std::to_string(max_ids) + " is out of range [1, 2^20]");
  if (ttl < 0 || ttl > kMaxTtl)
    throw ConfigError(who + "ttl = " + std::to_string(ttl) + " is out of range [0, 2^31] (0: no ttl)");
  try {
    table_config(*this, OptimizerConfig::defaults(OptimizerKind::kSgd)).validate();
  } catch (const ConfigError& e) {
    throw ConfigError(who + e.message());
  }
}

std::size_t PsCore::dynamic_index(std::string_view name, const char* op) const {
  for (std::size_t d = 0; d < dynamic.size(); ++d)
    if (dynamic[d].name == name) return d;
  throw Error(std::string(op) + ": unknown dynamic variable '" + std::string(name) + "'");
}

// ---- server ---------------------------------------------------------------------------------

void ServerCore::prepare_dynamic() {
  dynamic_state.clear();
  dynamic_state.resize(dynamic.size());
  for (std::size_t d = 0; d < dynamic.size(); ++d) {
    DynamicState& st = dynamic_state[d];
    DynamicTableConfig config = table_config(dynamic[d], options.optimizer);
    // Sync: the workers' lookups of a step arrive in any order; rounds make admission and capacity
    // eviction independent of it (dynamic_table.h, "Rounds"), ended below once a round is applied.
    config.round_boundaries = options.consistency.mode == Consistency::kSync;
    st.table = std::make_unique<DynamicTable>(config);
    st.table->use_team(team.get());  // --ps-threads: large lookups and updates split over the team
    const auto workers = static_cast<std::size_t>(num_workers);
    st.seen.assign(workers, 0);
    st.bells.assign(workers, 0);
    st.waiting.assign(workers, 0);
    st.staged_ids.resize(workers);
    st.staged_rows.resize(workers);
    st.staged_steps.resize(workers);
    if (d < dyn_restored.size()) {
      // This shard's rows, read by restore_dynamic (already only its ids). Onto one PS the table
      // is the whole table and takes the counters too; onto several, each keeps its own counters.
      const int k = num_ps();
      st.table->import_rows(dyn_restored[d], k == 1 ? 0 : ps_index, k);
      st.table->mark_saved();
      st.restored_step = dyn_restored_steps[d];
      dyn_restored[d] = DynamicTableSnapshot();
    }
  }
  dyn_restored.clear();
  // Between nodes over tcp, requests are handed to the transport's thread as they arrive and
  // served there (consume_dynamic), so the answer is ready before any later operation of the
  // worker is served: a lookup's get of the rows can follow its request with no wait between.
  for (std::size_t d = 0; d < dynamic.size(); ++d) {
    const DynamicLayout& l = layout.dynamic(d, ps_index);
    for (int w = 0; w < num_workers; ++w) {
      comm::Transport::PieceHandler h = [this, d, w](std::uint64_t off, const void* data, std::size_t n) {
        consume_dynamic(d, w, off, data, n);
      };
      if (!transport->consume_notified(*region, l.doorbell(w), std::move(h))) return;
    }
  }
}

void ServerCore::apply_dynamic(std::size_t d, const std::int64_t* ids, std::size_t n, const float* rows,
                               std::int64_t step) {
  DynamicState& st = dynamic_state[d];
  const DynamicVariableSpec& spec = dynamic[d];
  st.table->apply(ids, n, rows, step);
  if (spec.ttl > 0 && step >= st.next_evict) {
    // A scan of the table: every ttl/8 steps, so a row outlives its ttl by at most that.
    st.table->evict_older_than(step, spec.ttl);
    st.next_evict = step + std::max<std::int64_t>(1, spec.ttl / 8);
  }
  ++applied;
  applied_elements += static_cast<std::int64_t>(n) * spec.dim;
}

void ServerCore::apply_dynamic_round(std::size_t d) {
  DynamicState& st = dynamic_state[d];
  const DynamicLayout& l = layout.dynamic(d, ps_index);
  const auto dim = static_cast<std::size_t>(dynamic[d].dim);
  for (int w = 0; w < num_workers; ++w) {
    const auto wi = static_cast<std::size_t>(w);
    // Its requests of the round, in the order sent.
    std::size_t at = 0;
    const std::vector<std::int64_t>& steps = st.staged_steps[wi];
    for (std::size_t k = 0; k + 1 < steps.size(); k += 2) {
      const auto n = static_cast<std::size_t>(steps[k + 1]);
      apply_dynamic(d, st.staged_ids[wi].data() + at, n, st.staged_rows[wi].data() + at * dim, steps[k]);
      at += n;
    }
    st.staged_ids[wi].clear();
    st.staged_rows[wi].clear();
    st.staged_steps[wi].clear();
  }
  st.table->end_round();
  for (int w = 0; w < num_workers; ++w) {
    const auto wi = static_cast<std::size_t>(w);
    st.waiting[wi] = 0;
    ++st.requests;
    st.seen[wi] += 1;
    store_ack(l.ack(w), w, st.seen[wi]);
  }
}

void ServerCore::serve_request(std::size_t d, int w, const char* req, std::size_t bytes, bool exact,
                               std::int64_t number) {
  DynamicState& st = dynamic_state[d];
  const DynamicLayout& l = layout.dynamic(d, ps_index);
  const DynamicVariableSpec& spec = dynamic[d];
  const auto wi = static_cast<std::size_t>(w);
  if (bytes < dynamic_header::kBytes) [[unlikely]]
    fail_word(writers[wi], "sent a request of " + std::to_string(bytes) + " bytes for dynamic variable '" + spec.name +
                               "' to ps:" + std::to_string(ps_index) + " (a header alone is 64)");
  const Request r = checked_request(req, l, spec.name, ps_index, number, writers[wi]);
  const auto n = static_cast<std::size_t>(r.count);
  const auto dim = static_cast<std::size_t>(spec.dim);
  // header | ids | (update) gradient rows; count <= max_ids keeps it inside the request area.
  const std::size_t need = dynamic_header::kBytes + 8 * n + (r.kind == DynamicRequestKind::kUpdate ? 4 * n * dim : 0);
  if (need > bytes || (exact && need != bytes)) [[unlikely]]
    fail_word(writers[wi], "sent a request of " + std::to_string(bytes) + " bytes for dynamic variable '" + spec.name +
                               "' to ps:" + std::to_string(ps_index) + " whose header says " + std::to_string(n) +
                               " ids (" + std::to_string(need) + " bytes)");
  const auto t0 = Clock::now();
  const auto* ids = reinterpret_cast<const std::int64_t*>(req + dynamic_header::kBytes);
  const auto* grads = reinterpret_cast<const float*>(req + dynamic_header::kBytes + 8 * n);
  const bool sync = options.consistency.mode == Consistency::kSync;
  if (r.kind == DynamicRequestKind::kUpdate && sync) {
    // Copied out (the round reads only these copies, never words the worker could rewrite after
    // they were checked), and acknowledged now unless it is the batch's last request.
    st.staged_ids[wi].insert(st.staged_ids[wi].end(), ids, ids + n);
    st.staged_rows[wi].insert(st.staged_rows[wi].end(), grads, grads + n * dim);
    st.staged_steps[wi].push_back(r.step);
    st.staged_steps[wi].push_back(r.count);
    busy_s += std::chrono::duration<double>(Clock::now() - t0).count();
    if (r.last) {
      st.waiting[wi] = 1;  // acknowledged with the round
      if (std::all_of(st.waiting.begin(), st.waiting.end(), [](char c) { return c != 0; })) {
        const auto t1 = Clock::now();
        apply_dynamic_round(d);
        const double s = std::chrono::duration<double>(Clock::now() - t1).count();
        busy_s += s;
        st.update_s += s;
        ++st.update_requests;
      }
      return;
    }
  } else if (r.kind == DynamicRequestKind::kUpdate) {
    apply_dynamic(d, ids, n, grads, r.step);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    busy_s += s;
    st.update_s += s;
    ++st.update_requests;
  } else {
    // The answer goes to the rows of the worker's area (past every id it could send).
    auto* out = reinterpret_cast<float*>(base() + l.request(w) + l.rows);
    const std::int64_t admitted_before = st.table->stats().admitted;
    st.table->lookup(ids, n, out,
                     r.kind == DynamicRequestKind::kLookupTrain ? DynamicTable::LookupMode::kTrain
                                                                : DynamicTable::LookupMode::kInference);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    busy_s += s;
    if (st.table->stats().admitted == admitted_before) {
      st.lookup_s += s;
      ++st.lookup_requests;
    }
  }
  ++st.requests;
  st.seen[wi] = number;
  store_ack(l.ack(w), w, number);
}

bool ServerCore::serve_dynamic(std::size_t d) {
  DynamicState& st = dynamic_state[d];
  const DynamicLayout& l = layout.dynamic(d, ps_index);
  const DynamicVariableSpec& spec = dynamic[d];
  bool worked = false;
  for (int w = 0; w < num_workers; ++w) {
    const auto wi = static_cast<std::size_t>(w);
    if (st.waiting[wi]) continue;  // its round's last request, taken with the round
    const std::int64_t bell = load_i64(base() + l.doorbell(w));
    if (bell == st.bells[wi]) continue;
    // One request in flight per worker: the doorbell reads the requests it announced that were
    // served, or one more (requests handed over by the transport never ring it).
    if (bell != st.bells[wi] + 1) [[unlikely]]
      fail_word(writers[wi], "rang its doorbell for dynamic variable '" + spec.name + "' on ps:" +
                                 std::to_string(ps_index) + " to " + std::to_string(bell) + " after " +
                                 std::to_string(st.bells[wi]) + " of its requests were served (it must read " +
                                 std::to_string(st.bells[wi]) + " or " + std::to_string(st.bells[wi] + 1) + ")");
    st.bells[wi] = bell;
    serve_request(d, w, base() + l.request(w), static_cast<std::size_t>(l.request_bytes), false, st.seen[wi] + 1);
    worked = true;
  }
  return worked;
}

void ServerCore::consume_dynamic(std::size_t d, int w, std::uint64_t offset, const void* data, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(apply_mu);
  if (!dynamic_failure.empty()) return;  // the job is ending: the service loop throws it
  try {
    consume_dynamic_locked(d, w, offset, data, bytes);
    ring_acks();
  } catch (const Error& e) {
    // Thrown from the service loop (serve_once), as a malformed request found there would be,
    // rather than from the transport's thread, which would abort the job without serve() saying why.
    dynamic_failure = e.message();
  }
}

void ServerCore::consume_dynamic_locked(std::size_t d, int w, std::uint64_t offset, const void* data,
                                        std::size_t bytes) {
  DynamicState& st = dynamic_state[d];
  const DynamicLayout& l = layout.dynamic(d, ps_index);
  const auto wi = static_cast<std::size_t>(w);
  if (offset != l.request(w) || bytes > l.request_bytes) [[unlikely]]
    fail_word(writers[wi], "sent " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                               " with the doorbell of its request area for dynamic variable '" + dynamic[d].name +
                               "' on ps:" + std::to_string(ps_index) + " (the area is " +
                               std::to_string(l.request_bytes) + " bytes at " + std::to_string(l.request(w)) + ")");
  if (st.waiting[wi]) [[unlikely]]
    fail_word(writers[wi], "sent a request for dynamic variable '" + dynamic[d].name + "' to ps:" +
                               std::to_string(ps_index) + " while its last update of the sync round was pending");
  serve_request(d, w, static_cast<const char*>(data), bytes, true, st.seen[wi] + 1);
}

// ---- client ---------------------------------------------------------------------------------

void ClientCore::wait_dynamic(std::size_t d, int p, const char* op) {
  std::int64_t& acked = dyn_acked[d][static_cast<std::size_t>(p)];
  const std::int64_t sent = dyn_sent[d][static_cast<std::size_t>(p)];
  if (acked >= sent) return;
  const int peer = ps_rank[static_cast<std::size_t>(p)];
  if (dyn_readback_pending[d][static_cast<std::size_t>(p)]) {
    transport->flush(*region, peer);  // the read-back of the last put_notify
    take_readback(d, p);
    if (acked >= sent) return;
  }
  const std::uint64_t ack = layout.dynamic(d, p).ack(worker);
  wait_for([&] { return (acked = transport->atomic_read(*region, peer, ack)) >= sent; },
           std::string(op) + ": request " + std::to_string(sent) + " for dynamic variable '" + dynamic[d].name +
               "' to ps:" + std::to_string(p) + " (rank " + std::to_string(peer) + ") was not answered",
           {peer}, worker_wake[static_cast<std::size_t>(p)]);
}

void ClientCore::send_dynamic(std::size_t d, int p, DynamicRequestKind kind, const std::int64_t* ids, std::size_t n,
                              const float* rows, std::int64_t step, bool last) {
  wait_dynamic(d, p, kind_name(kind));
  const DynamicLayout& l = layout.dynamic(d, p);
  const auto pi = static_cast<std::size_t>(p);
  const int peer = ps_rank[pi];
  const std::uint64_t area = l.request(worker);
  const std::size_t bytes = pack_request(dyn_message, l.dim, kind, ids, n, rows, step, last);
  const std::vector<std::int64_t>& msg = dyn_message;
  if (transport->ordered_to(peer)) {
    // One message (the doorbell is its counter), answered with the ack word once the PS took it:
    // between nodes over tcp the PS serves it on arrival, so the answer usually says done.
    transport->put_notify(*region, peer, area, msg.data(), bytes, bytes, l.doorbell(worker), &dyn_readback[d][pi],
                          l.ack(worker));
    dyn_readback_pending[d][pi] = 1;
  } else {
    // The request must be remotely complete before the doorbell rings.
    transport->put(*region, peer, area, msg.data(), bytes);
    transport->flush(*region, peer);
    transport->fetch_add(*region, peer, l.doorbell(worker), 1);
  }
  ring_ps(p);
  ++dyn_sent[d][pi];
}

void ClientCore::take_readback(std::size_t d, int p) {
  const auto pi = static_cast<std::size_t>(p);
  if (!dyn_readback_pending[d][pi]) return;
  dyn_acked[d][pi] = std::max(dyn_acked[d][pi], dyn_readback[d][pi]);
  dyn_readback_pending[d][pi] = 0;
}

// Deduplicates with an open-addressing table of at least 2n slots (linear probing on mix64 of the
// id) whose entries carry the call's epoch, so the table is never cleared between calls. Then a
// counting sort by PS (stable: each PS's ids stay in order of first appearance, the order the
// requests have always carried). A batch of 4096 ids costs a few microseconds.
void ClientCore::start_dedupe(std::size_t n) {
  DynamicBatch& b = dyn_batch;
  std::size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  if (b.table.size() < cap) {
    b.table.assign(cap, DynamicBatch::Slot{0, 0, 0});
    b.epoch = 0;
  }
  if (++b.epoch == 0) {  // 2^32 calls: start the epochs again from a clear table
    std::fill(b.table.begin(), b.table.end(), DynamicBatch::Slot{0, 0, 0});
    b.epoch = 1;
  }
  if (b.slot_of.size() < n) b.slot_of.resize(n);
  if (b.first_ids.size() < n) b.first_ids.resize(n);
  b.distinct = 0;
}

namespace {

// dedupe_chunk's loop, compiled twice: a lookup's without the sums, so that it stays the plain
// probe loop (the summing code, even unused, slows the lookup's loop; docs/DYNAMIC.md, third pass).
template <bool kSum>
std::uint32_t dedupe_ids(const std::int64_t* ids, std::size_t lo, std::size_t hi, ClientCore::DynamicBatch::Slot* table,
                         std::size_t slots, std::uint32_t epoch, std::uint32_t* slot_of, std::int64_t* first,
                         std::uint32_t distinct, const float* grads, std::size_t dim, float* sums) {
  using Slot = ClientCore::DynamicBatch::Slot;
  // The table holds at least twice the call's ids (start_dedupe), so a probe always ends.
  const std::size_t mask = slots - 1;
  const int shift = 64 - __builtin_ctzll(slots);  // the table size is a power of two
  // Inline mixing (the high bits of a multiply after a fold): a call per id would cost more than
  // the probe. Only this call's slot choice depends on it.
  auto home = [shift](std::int64_t id) {
    auto x = static_cast<std::uint64_t>(id);
    x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ULL;
    return static_cast<std::size_t>(x >> shift);
  };
  // The table is usually cold (the PS, or the caller's model, ran in between on this core): the
  // slots of the ids kAhead places on are fetched while this one is probed.
  constexpr std::size_t kAhead = 16;
  for (std::size_t i = lo; i < std::min(hi, lo + kAhead); ++i) __builtin_prefetch(table + home(ids[i]), 1, 3);
  for (std::size_t i = lo; i < hi; ++i) {
    const std::int64_t id = ids[i];
    if (i + kAhead < hi) __builtin_prefetch(table + home(ids[i + kAhead]), 1, 3);
    std::size_t h = home(id);
    Slot* e = table + h;
    // Past slots of this call that hold other ids (rare: at most half the slots are in use).
    while (e->epoch == epoch && e->key != id) {
      h = (h + 1) & mask;
      e = table + h;
    }
    // New or seen, without a branch on it (it is as good as random): the slot is rewritten either
    // way, and the id is stored at the next distinct place, which only a new id keeps.
    const bool fresh = e->epoch != epoch;
    const std::uint32_t number = fresh ? distinct : e->number;
    *e = Slot{id, epoch, number};
    first[distinct] = id;
    slot_of[i] = number;
    distinct += fresh ? 1u : 0u;
    if constexpr (kSum) {
      // The id's sum: its first gradient, or the sum so far plus this one (order of appearance).
      // A select, not a branch: a new id reads whatever the buffer held there (a float the
      // buffer was sized with or an earlier call left) and drops it.
      float* acc = sums + std::size_t{number} * dim;
      const float* g = grads + i * dim;
      for (std::size_t c = 0; c < dim; ++c) acc[c] = fresh ? g[c] : acc[c] + g[c];
    }
  }
  return distinct;
}

}  // namespace

void ClientCore::dedupe_chunk(const std::int64_t* ids, std::size_t lo, std::size_t hi, const float* grads,
                              std::size_t dim, float* sums) {
  DynamicBatch& b = dyn_batch;
  const auto distinct = static_cast<std::uint32_t>(b.distinct);
  b.distinct = grads ? dedupe_ids<true>(ids, lo, hi, b.table.data(), b.table.size(), b.epoch, b.slot_of.data(),
                                        b.first_ids.data(), distinct, grads, dim, sums)
                     : dedupe_ids<false>(ids, lo, hi, b.table.data(), b.table.size(), b.epoch, b.slot_of.data(),
                                         b.first_ids.data(), distinct, nullptr, 0, nullptr);
}

void ClientCore::group_dynamic(const std::int64_t* ids, std::size_t n, const float* grads, std::size_t dim) {
  DynamicBatch& b = dyn_batch;
  const int P = num_ps();
  const auto num = static_cast<std::size_t>(P);
  start_dedupe(n);
  // Sums in order of distinct numbers: with one PS these are the positions, so straight into
  // `rows`; with several, into `sums`, moved to their positions below.
  std::vector<float>& sums = P == 1 ? b.rows : b.sums;
  if (grads && sums.size() < n * dim) sums.resize(n * dim);
  dedupe_chunk(ids, 0, n, grads, dim, grads ? sums.data() : nullptr);
  const std::size_t distinct = b.distinct;
  b.begin.assign(num + 1, 0);
  if (P == 1) {
    b.ids.assign(b.first_ids.begin(), b.first_ids.begin() + static_cast<long>(distinct));  // positions are the distinct numbers
    b.begin[1] = distinct;
    return;
  }
  b.first_ps.resize(distinct);
  for (std::size_t j = 0; j < distinct; ++j) b.first_ps[j] = shard_of(b.first_ids[j], P);
  for (const std::int32_t p : b.first_ps) ++b.begin[static_cast<std::size_t>(p) + 1];
  for (std::size_t p = 0; p < num; ++p) b.begin[p + 1] += b.begin[p];
  b.ids.resize(distinct);
  b.position.resize(distinct);
  std::vector<std::size_t> next(b.begin.begin(), b.begin.end() - 1);
  for (std::size_t j = 0; j < distinct; ++j) {
    const std::size_t at = next[static_cast<std::size_t>(b.first_ps[j])]++;
    b.position[j] = static_cast<std::uint32_t>(at);
    b.ids[at] = b.first_ids[j];
  }
  for (std::size_t i = 0; i < n; ++i) b.slot_of[i] = b.position[b.slot_of[i]];
  if (!grads) return;
  if (b.rows.size() < distinct * dim) b.rows.resize(distinct * dim);
  for (std::size_t j = 0; j < distinct; ++j)
    std::memcpy(b.rows.data() + std::size_t{b.position[j]} * dim, sums.data() + j * dim, 4 * dim);
}

bool ClientCore::dynamic_pipelined() {
  const auto num = static_cast<std::size_t>(num_ps());
  if (dyn_on_arrival.size() != num) {
    dyn_on_arrival.assign(num, 0);
    const std::int64_t chunks = Env::from_process().get_int("STRATA_TCP_DYNAMIC_CHUNKS", 1);
    if (chunks < 1 || chunks > kMaxChunks)
      throw ConfigError("STRATA_TCP_DYNAMIC_CHUNKS = " + std::to_string(chunks) + " is out of range [1, " +
                        std::to_string(kMaxChunks) + "]");
    dyn_chunks = static_cast<int>(chunks);
  }
  return std::all_of(dyn_on_arrival.begin(), dyn_on_arrival.end(), [](char c) { return c != 0; });
}

void ClientCore::post_dynamic(std::size_t d, int p, DynamicRequestKind kind, const std::int64_t* ids, std::size_t n,
                              const float* rows, std::int64_t step, bool last, float* answer) {
  const DynamicLayout& l = layout.dynamic(d, p);
  const auto pi = static_cast<std::size_t>(p);
  const std::size_t bytes = pack_request(dyn_message, l.dim, kind, ids, n, rows, step, last);
  const std::vector<std::int64_t>& msg = dyn_message;
  // put_notify returns once the message is handed to the kernel, so the buffer is free again.
  dyn_posted_readback.push_back(0);
  if (answer)  // the answer rows come back behind the ack word, in the same reply
    transport->put_notify_get(*region, ps_rank[pi], l.request(worker), msg.data(), bytes, bytes, l.doorbell(worker),
                              &dyn_posted_readback.back(), l.ack(worker), l.request(worker) + l.rows, answer,
                              4 * n * static_cast<std::size_t>(l.dim));
  else
    transport->put_notify(*region, ps_rank[pi], l.request(worker), msg.data(), bytes, bytes, l.doorbell(worker),
                          &dyn_posted_readback.back(), l.ack(worker));
  dyn_posted.push_back(Posted{p, ++dyn_sent[d][pi], last});
}

void ClientCore::finish_posted(std::size_t d, const char* op) {
  if (dyn_posted.empty()) return;
  transport->flush_all(*region);  // every read-back, and every row read behind them
  for (std::size_t k = 0; k < dyn_posted.size(); ++k) {
    const Posted& q = dyn_posted[k];
    const auto pi = static_cast<std::size_t>(q.p);
    const std::int64_t answer = dyn_posted_readback[k];
    dyn_acked[d][pi] = std::max(dyn_acked[d][pi], answer);
    // A sync round's last update is answered once the round is applied (wait_dynamic below); any
    // other request is served on arrival, before the next one is read, or its answer rows would
    // have been overwritten by the next: an answer behind it is the PS breaking the protocol.
    if (answer < q.number && !q.last) [[unlikely]] {
      const int peer = ps_rank[pi];
      dyn_posted.clear();
      dyn_posted_readback.clear();
      throw Error(std::string(op) + ": ps:" + std::to_string(q.p) + " (rank " + std::to_string(peer) +
                  ") answered request " + std::to_string(q.number) + " for dynamic variable '" + dynamic[d].name +
                  "' with " + std::to_string(answer) + " on arrival (requests to it are served on arrival)");
    }
  }
  dyn_posted.clear();
  dyn_posted_readback.clear();
  for (int p = 0; p < num_ps(); ++p) wait_dynamic(d, p, op);
}

// Chunks of the caller's ids, each deduplicated against the earlier ones and posted as soon as it
// is: the PS looks up chunk k while this thread deduplicates chunk k+1 and chunk k-1's rows come
// back. Each PS's rows of a chunk are one run of `rows` (distinct numbers in chunk order, then
// grouped per PS inside the chunk), read with one get right behind the request.
void ClientCore::lookup_pipelined(std::size_t d, const std::int64_t* ids, std::size_t n, float* out,
                                  DynamicRequestKind kind) {
  const auto dim = static_cast<std::size_t>(dynamic[d].dim);
  const int P = num_ps();
  const auto num = static_cast<std::size_t>(P);
  const auto max_ids = static_cast<std::size_t>(dynamic[d].max_ids);
  for (int p = 0; p < P; ++p) wait_dynamic(d, p, "lookup_dynamic");
  DynamicBatch& b = dyn_batch;
  start_dedupe(n);
  if (b.rows.size() < n * dim) b.rows.resize(n * dim);
  if (b.ids.size() < n) b.ids.resize(n);
  if (P > 1) {
    b.position.resize(n);
    b.first_ps.resize(n);
  }
  float* rows = b.rows.data();
  std::vector<std::size_t>& start = b.begin;  // per PS: where its ids of the chunk start
  start.assign(num + 1, 0);
  const auto chunks = static_cast<std::size_t>(dyn_chunks);
  const std::size_t chunk = std::max(kMinChunkIds, (n + chunks - 1) / chunks);
  for (std::size_t lo = 0; lo < n; lo += chunk) {
    const std::size_t hi = std::min(n, lo + chunk);
    const std::size_t d0 = b.distinct;
    dedupe_chunk(ids, lo, hi);
    const std::size_t d1 = b.distinct;
    if (d1 == d0) continue;
    if (P == 1) {
      std::copy(b.first_ids.begin() + static_cast<long>(d0), b.first_ids.begin() + static_cast<long>(d1),
                b.ids.begin() + static_cast<long>(d0));
      start[0] = d0;
      start[1] = d1;
    } else {
      // A counting sort of the chunk's new ids by PS, inside [d0, d1).
      std::fill(start.begin(), start.end(), 0);
      for (std::size_t j = d0; j < d1; ++j) {
        b.first_ps[j] = shard_of(b.first_ids[j], P);
        ++start[static_cast<std::size_t>(b.first_ps[j]) + 1];
      }
      start[0] = d0;
      for (std::size_t p = 0; p < num; ++p) start[p + 1] += start[p];
      std::vector<std::size_t>& next = b.next;
      next.assign(start.begin(), start.end() - 1);
      for (std::size_t j = d0; j < d1; ++j) {
        const std::size_t at = next[static_cast<std::size_t>(b.first_ps[j])]++;
        b.position[j] = static_cast<std::uint32_t>(at);
        b.ids[at] = b.first_ids[j];
      }
    }
    for (std::size_t pi = 0; pi < num; ++pi)
      for (std::size_t first = start[pi]; first < start[pi + 1]; first += max_ids) {
        const std::size_t count = std::min(max_ids, start[pi + 1] - first);
        post_dynamic(d, static_cast<int>(pi), kind, b.ids.data() + first, count, nullptr, 0, false, rows + first * dim);
      }
    transport->progress();  // takes in the answers that arrived, so no PS waits to send them
  }
  finish_posted(d, "lookup_dynamic");
  const std::uint32_t* slot_of = b.slot_of.data();
  if (P == 1) {
    for (std::size_t i = 0; i < n; ++i) std::memcpy(out + i * dim, rows + std::size_t{slot_of[i]} * dim, 4 * dim);
  } else {
    const std::uint32_t* position = b.position.data();
    for (std::size_t i = 0; i < n; ++i)
      std::memcpy(out + i * dim, rows + std::size_t{position[slot_of[i]]} * dim, 4 * dim);
  }
}

void ClientCore::lookup_dynamic(std::size_t d, const std::int64_t* ids, std::size_t n, float* out,
                                DynamicRequestKind kind) {
  if (n == 0) return;
  if (!ids || !out) throw Error("lookup_dynamic '" + dynamic[d].name + "': null ids or out with n = " + std::to_string(n));
  if (n > (std::size_t{1} << 31)) throw Error("lookup_dynamic '" + dynamic[d].name + "': " + std::to_string(n) + " ids in one call (at most 2^31)");
  // A sync worker reads after its own pushed rounds are applied, as pull does.
  settle_sync("lookup_dynamic");
  if (dynamic_pipelined()) return lookup_pipelined(d, ids, n, out, kind);
  const auto dim = static_cast<std::size_t>(dynamic[d].dim);
  const int P = num_ps();
  const auto num = static_cast<std::size_t>(P);
  group_dynamic(ids, n);
  DynamicBatch& b = dyn_batch;
  if (b.rows.size() < b.ids.size() * dim) b.rows.resize(b.ids.size() * dim);
  // Answers are read straight into the distinct rows, at their positions.
  float* rows = b.rows.data();
  const auto max_ids = static_cast<std::size_t>(dynamic[d].max_ids);
  std::vector<std::size_t> pos(num, 0), count(num, 0);
  for (bool more = true; more;) {
    more = false;
    for (std::size_t pi = 0; pi < num; ++pi) {
      count[pi] = std::min(max_ids, b.begin[pi + 1] - b.begin[pi] - pos[pi]);
      if (count[pi] > 0)
        send_dynamic(d, static_cast<int>(pi), kind, b.ids.data() + b.begin[pi] + pos[pi], count[pi], nullptr, 0, true);
    }
    // Where operations reach the PS in issue order and it serves requests on arrival (tcp between
    // nodes), the rows are read at once: one round trip for the request and the answer together,
    // valid when the request's read-back says it was served.
    auto read_rows = [&](std::size_t pi) {
      const DynamicLayout& l = layout.dynamic(d, static_cast<int>(pi));
      transport->get(*region, ps_rank[pi], l.request(worker) + l.rows, rows + (b.begin[pi] + pos[pi]) * dim,
                     4 * count[pi] * dim);
    };
    bool speculated = false;
    for (std::size_t pi = 0; pi < num; ++pi) {
      if (count[pi] == 0 || !dyn_readback_pending[d][pi]) continue;
      read_rows(pi);
      speculated = true;
    }
    if (speculated) transport->flush_all(*region);
    bool fetched = false;
    for (std::size_t pi = 0; pi < num; ++pi) {
      if (count[pi] == 0) continue;
      const bool was_speculated = dyn_readback_pending[d][pi] != 0;
      take_readback(d, static_cast<int>(pi));
      if (was_speculated && dyn_acked[d][pi] >= dyn_sent[d][pi]) {
        dyn_on_arrival[pi] = 1;  // served on arrival: later calls post ahead
        continue;
      }
      wait_dynamic(d, static_cast<int>(pi), "lookup_dynamic");
      read_rows(pi);
      fetched = true;
    }
    if (fetched) transport->flush_all(*region);
    for (std::size_t pi = 0; pi < num; ++pi) {
      pos[pi] += count[pi];
      more |= b.begin[pi] + pos[pi] < b.begin[pi + 1];
    }
  }
  const std::uint32_t* slot_of = b.slot_of.data();
  for (std::size_t i = 0; i < n; ++i) std::memcpy(out + i * dim, rows + std::size_t{slot_of[i]} * dim, 4 * dim);
}

void ClientCore::update_dynamic(std::size_t d, const std::int64_t* ids, std::size_t n, const float* grads,
                                std::int64_t step) {
  const std::string& name = dynamic[d].name;
  if (step < 1 || step > kMaxStep)
    throw Error("update_dynamic '" + name + "': step " + std::to_string(step) + " is out of range [1, 2^62]");
  if (n > 0 && (!ids || !grads)) throw Error("update_dynamic '" + name + "': null ids or grads with n = " + std::to_string(n));
  if (n > (std::size_t{1} << 31)) throw Error("update_dynamic '" + name + "': " + std::to_string(n) + " ids in one call (at most 2^31)");
  const bool sync = options.consistency.mode == Consistency::kSync;
  if (n == 0 && !sync) return;
  const auto dim = static_cast<std::size_t>(dynamic[d].dim);
  const int P = num_ps();
  const auto num = static_cast<std::size_t>(P);
  // The gradients of each distinct id are summed in order of appearance, starting from the first
  // (as the table does, so a batch summed here equals the same batch summed there, bit for bit),
  // while the ids are deduplicated, and end at the id's position: each request's gradient rows
  // are then one contiguous run.
  group_dynamic(ids, n, grads, dim);
  DynamicBatch& b = dyn_batch;
  float* sum = b.rows.data();
  const bool ahead = dynamic_pipelined();
  // Posted ahead in several chunks, requests are cut smaller: the PS applies one while the next is
  // on the wire. The largest PS share sets the size, so that every PS gets about `dyn_chunks`.
  auto max_ids = static_cast<std::size_t>(dynamic[d].max_ids);
  if (ahead && dyn_chunks > 1) {
    std::size_t largest = 0;
    for (std::size_t pi = 0; pi < num; ++pi) largest = std::max(largest, b.begin[pi + 1] - b.begin[pi]);
    const auto chunks = static_cast<std::size_t>(dyn_chunks);
    max_ids = std::min(max_ids, std::max(kMinChunkIds, (largest + chunks - 1) / chunks));
  }
  std::vector<std::size_t> requests(num);
  std::size_t waves = 0;
  for (std::size_t pi = 0; pi < num; ++pi) {
    requests[pi] = (b.begin[pi + 1] - b.begin[pi] + max_ids - 1) / max_ids;
    if (sync) requests[pi] = std::max<std::size_t>(1, requests[pi]);  // every PS takes part in every round
    waves = std::max(waves, requests[pi]);
  }
  for (std::size_t k = 0; k < waves; ++k) {
    for (std::size_t pi = 0; pi < num; ++pi) {
      if (k >= requests[pi]) continue;
      const std::size_t size = b.begin[pi + 1] - b.begin[pi];
      const std::size_t first = std::min(k * max_ids, size);
      const std::size_t count = std::min(max_ids, size - first);
      const std::size_t at = b.begin[pi] + first;
      if (ahead) {
        // Sync: only a PS's last request may wait for its round (finish_posted waits for it).
        post_dynamic(d, static_cast<int>(pi), DynamicRequestKind::kUpdate, b.ids.data() + at, count, sum + at * dim,
                     step, k + 1 == requests[pi]);
        continue;
      }
      send_dynamic(d, static_cast<int>(pi), DynamicRequestKind::kUpdate, b.ids.data() + at, count, sum + at * dim,
                   step, k + 1 == requests[pi]);
    }
    if (ahead) {
      transport->progress();
      continue;
    }
    // Between waves, wait for the requests that are not a PS's last (a last one may be held
    // until the round completes, which can need this worker's later waves elsewhere).
    for (std::size_t pi = 0; pi < num; ++pi)
      if (k + 1 < requests[pi]) wait_dynamic(d, static_cast<int>(pi), "update_dynamic");
  }
  if (ahead) return finish_posted(d, "update_dynamic");
  for (int p = 0; p < P; ++p) wait_dynamic(d, p, "update_dynamic");
}

// ---- public ---------------------------------------------------------------------------------

void PsClient::lookup_dynamic(std::string_view variable, const std::int64_t* ids, std::size_t n, float* out,
                              DynamicLookup mode) {
  ClientCore& m = core();
  m.lookup_dynamic(m.dynamic_index(variable, "lookup_dynamic"), ids, n, out,
                   mode == DynamicLookup::kTrain ? DynamicRequestKind::kLookupTrain
                                                 : DynamicRequestKind::kLookupInference);
}

void PsClient::update_dynamic(std::string_view variable, const std::int64_t* ids, std::size_t n, const float* grads,
                              std::int64_t step) {
  ClientCore& m = core();
  m.update_dynamic(m.dynamic_index(variable, "update_dynamic"), ids, n, grads, step);
}

std::int64_t PsClient::dynamic_dim(std::string_view variable) const {
  const ClientCore& m = core();
  return m.dynamic[m.dynamic_index(variable, "dynamic_dim")].dim;
}

const std::vector<DynamicVariableSpec>& PsServer::dynamic_variables() const { return core().dynamic; }

DynamicShardStats PsServer::dynamic_stats(std::string_view name) const {
  const ServerCore& m = core();
  const ServerCore::DynamicState& st = m.dynamic_state[m.dynamic_index(name, "dynamic_stats")];
  const DynamicTableStats t = st.table->stats();
  DynamicShardStats s;
  s.rows = t.rows;
  s.admitted = t.admitted;
  s.lookups = t.lookups;
  s.updates = t.updates;
  s.rejected_lookups = t.rejected_lookups;
  s.rejected_updates = t.rejected_updates;
  s.rejected_full = t.rejected_full;
  s.evicted_ttl = t.evicted_ttl;
  s.evicted_capacity = t.evicted_capacity;
  s.bytes = t.bytes;
  s.requests = st.requests;
  s.lookup_s = st.lookup_s;
  s.lookup_requests = st.lookup_requests;
  s.update_s = st.update_s;
  s.update_requests = st.update_requests;
  s.split_batches = st.table->split_batches();
  s.restored_step = st.restored_step;
  s.saved_step = m.dyn_saved_step;
  return s;
}

}  // namespace strata::ps
