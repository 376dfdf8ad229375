// The client part of the parameter servers (client_core.h): a worker's data plane (pulls,
// pushes, rows, assign, acks, the settling of sync rounds) and its clocks. The protocols are
// narrated in include/strata/ps/parameter_servers.h; the arena's layout in arena_layout.h.
#include "ps/client_core.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "strata/common/error.h"

namespace strata::ps {

namespace {

comm::ElemType elem_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return comm::ElemType::kF32;
    case DType::kF64: return comm::ElemType::kF64;
    case DType::kI64: return comm::ElemType::kI64;
  }
  return comm::ElemType::kF32;
}

template <typename T>
void scale(T* out, const T* in, std::size_t n, T factor) {
  for (std::size_t i = 0; i < n; ++i) out[i] = in[i] * factor;
}

}  // namespace

// ---- worker data plane --------------------------------------------------------------------

const VariableSpec& ClientCore::spec_of(std::string_view variable, const char* op) const {
  const VariableSpec* spec = map.find(variable);
  if (!spec) throw Error(std::string(op) + ": unknown variable '" + std::string(variable) + "'");
  return *spec;
}


void ClientCore::check_bytes(const VariableSpec& spec, std::size_t bytes, const char* op) const {
  const std::size_t want = static_cast<std::size_t>(num_elements(spec.shape)) * dtype_size(spec.dtype);
  if (bytes != want)
    throw Error(std::string(op) + " '" + spec.name + "': " + std::to_string(bytes) + " bytes given, but " +
                shape_to_string(spec.shape) + " " + to_string(spec.dtype) + " has " + std::to_string(want));
}


void ClientCore::check_trainable(const VariableSpec& spec, const char* op) const {
  if (!spec.trainable) throw Error(std::string(op) + " '" + spec.name + "': the variable is not trainable");
  if (spec.dtype == DType::kI64)
    throw Error(std::string(op) + " '" + spec.name + "': int64 variables take assign(), not gradients");
}


// Waits until the PS applied this worker's previous push to shard s. The first wait of a step
// reads the acks of every shard with a push outstanding in one pipelined batch (one round trip
// per PS instead of one per shard, which between nodes is most of a push), and later waits of
// the same step find theirs already read.
void ClientCore::wait_ack(std::size_t s, const char* why) {
  const std::int64_t sent = pushes[s];
  if (sent == 0 || acked[s] >= sent) return;
  refresh_acks();
  if (acked[s] >= sent) return;
  const int peer = ps_rank[shard(s).ps];
  const std::uint64_t ack = layout.shard(s).acks + 8ull * worker;
  wait_for([&] { return (acked[s] = transport->atomic_read(*region, peer, ack)) >= sent; },
           std::string(why) + ": push " + std::to_string(sent) + " of '" + shard(s).name + "' to ps:" +
               std::to_string(shard(s).ps) + " (rank " + std::to_string(peer) + ") was not applied",
           {peer}, worker_wake[static_cast<std::size_t>(shard(s).ps)]);
}


// Reads this worker's ack word of every shard with a push not yet seen acknowledged: gets to
// every PS first, then one flush. An 8-byte aligned word the PS stores atomically reads whole.
void ClientCore::refresh_acks() {
  std::vector<std::size_t> pending;
  for (std::size_t t = 0; t < pushes.size(); ++t)
    if (pushes[t] > acked[t] && !readback_pending[t]) pending.push_back(t);
  std::vector<std::int64_t> words(pending.size(), 0);
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const std::size_t t = pending[i];
    transport->get(*region, ps_rank[shard(t).ps], layout.shard(t).acks + 8ull * worker, &words[i], 8);
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
void ClientCore::send_inbox(std::size_t s, bool dense, const std::vector<std::int64_t>& rows, const void* payload,
                std::size_t payload_bytes) {
  wait_ack(s, "push");
  const int peer = ps_rank[shard(s).ps];
  const std::uint64_t inbox = layout.shard(s).inboxes + static_cast<std::uint64_t>(worker) * layout.shard(s).inbox_bytes;
  std::vector<char> head(8 + 8 * rows.size());
  std::int64_t n = dense ? -1 : static_cast<std::int64_t>(rows.size());
  std::memcpy(head.data(), &n, 8);
  if (!rows.empty()) std::memcpy(head.data() + 8, rows.data(), 8 * rows.size());
  transport->put(*region, peer, inbox, head.data(), head.size());
  transport->put(*region, peer, inbox + layout.shard(s).payload, payload, payload_bytes);
  if (transport->ordered_to(peer)) {
    // The transport applies our operations to this peer in order: the doorbell cannot overtake
    // the payload, so it goes as a one-way int64 accumulate, with no round trip at all (between
    // nodes a flush and a fetch-and-add cost two network round trips per shard and step).
    const std::int64_t one = 1;
    transport->accumulate(*region, peer, layout.shard(s).doorbells + 8ull * worker, &one, 1, comm::ElemType::kI64);
  } else {
    // The payload must be remotely complete before the doorbell rings.
    transport->flush(*region, peer);
    transport->fetch_add(*region, peer, layout.shard(s).doorbells + 8ull * worker, 1);
  }
  ring_ps(shard(s).ps);
  ++pushes[s];
  // Under sync the round is waited for by this worker's next read (settle_sync), not here: the
  // step's other pushes go out first, so the PS finds the whole step's rounds in one pass.
}


// Sync consistency: waits until every round this worker pushed is applied (one batched read of
// the acks, then a wait per shard still behind). Called before every read of parameters, so a
// sync worker never sees values without its own last step. No-op otherwise and on PS ranks.
void ClientCore::settle_sync(const char* why) {
  if (options.consistency.mode != Consistency::kSync) return;
  for (std::size_t s = 0; s < pushes.size(); ++s) wait_ack(s, why);
}


// A streamed push (see streams()): one put_notify, which announces each chunk by adding 1 to
// this worker's chunk counter once the chunk's bytes are in the inbox (so the PS never reads a
// chunk before its bytes). Between nodes over tcp that is one request on the wire, answered
// with this worker's ack word once the whole push took effect; when the PS's transport hands
// chunks over (consume_notified) the PS applied them by then, so that answer is the ack.
void ClientCore::send_streamed(std::size_t s, const void* payload) {
  wait_ack(s, "push");
  const int peer = ps_rank[shard(s).ps];
  const std::uint64_t inbox = layout.shard(s).inboxes + static_cast<std::uint64_t>(worker) * layout.shard(s).inbox_bytes;
  const std::uint64_t ack = layout.shard(s).acks + 8ull * worker;
  if (transport->ordered_to(peer)) {
    // No flush: the read-back is answered after the whole push, and wait_ack drains it.
    transport->put_notify(*region, peer, inbox + layout.shard(s).payload, payload, shard(s).bytes, layout.shard(s).chunk_bytes,
                          layout.shard(s).chunks + 8ull * worker, &ack_readback[s], ack);
    readback_pending[s] = 1;
  } else {
    transport->put_notify(*region, peer, inbox + layout.shard(s).payload, payload, shard(s).bytes, layout.shard(s).chunk_bytes,
                          layout.shard(s).chunks + 8ull * worker, nullptr, 0);
    transport->flush(*region, peer);
  }
  ring_ps(shard(s).ps);
  ++pushes[s];
}


template <typename T>
void ClientCore::push_dense_shard(std::size_t s, const T* grad) {
  const Shard& sh = shard(s);
  const std::size_t n = sh.bytes / sizeof(T);
  if (layout.shard(s).chunks != 0) return send_streamed(s, grad);
  if (!uses_inbox) {
    // Async SGD: the update is an atomic element-wise sum of -lr * g on the PS.
    std::vector<T> delta(n);
    scale(delta.data(), grad, n, static_cast<T>(-options.optimizer.learning_rate));
    transport->accumulate(*region, ps_rank[sh.ps], layout.shard(s).values, delta.data(), n, elem_type(map.find(sh.variable)->dtype));
    return;
  }
  send_inbox(s, true, {}, grad, sh.bytes);
}


template <typename T>
void ClientCore::push_rows_typed(const VariableSpec& spec, const std::vector<std::int64_t>& rows, const T* grads) {
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
      transport->accumulate_rows(*region, ps_rank[sh.ps], layout.shard(s).values, width, elem_type(spec.dtype), local_rows,
                                 payload.data());
    } else {
      // Sync rounds need every worker's message for every shard, even an empty one.
      send_inbox(s, false, local_rows, payload.data(), payload.size() * sizeof(T));
    }
  }
  if (!uses_inbox) flush_all_peers();
}


// Under staleness:N: the slowest worker's clock (W remote atomics on PS 0); `who` gets the
// workers at it.
std::int64_t ClientCore::read_slowest(std::vector<int>* who) {
  std::int64_t low = clock;
  std::vector<std::int64_t> clocks(static_cast<std::size_t>(num_workers));
  for (int w = 0; w < num_workers; ++w) {
    clocks[w] = transport->atomic_read(*region, ps0(), layout.clock(w));
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
bool ClientCore::wait_staleness(bool yield_to_save) {
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

// ---- PsClient -----------------------------------------------------------------------------------

PsClient::PsClient(std::unique_ptr<ClientCore> core) : PsEndpoint(std::move(core)) {}
PsClient::~PsClient() = default;
ClientCore& PsClient::core() { return static_cast<ClientCore&>(*core_); }
const ClientCore& PsClient::core() const { return static_cast<const ClientCore&>(*core_); }

int PsClient::worker_index() const { return core().worker; }

std::int64_t PsClient::max_observed_staleness() const { return core().max_staleness; }

void PsClient::wait_applied() {
  ClientCore& m = core();
  for (std::size_t s = 0; s < m.map.shards().size(); ++s) m.wait_ack(s, "wait_applied");
}

std::vector<ServeStats> PsClient::ps_stats() {
  ClientCore& m = core();
  std::vector<ServeStats> out(m.ps_rank.size());
  for (std::size_t p = 0; p < m.ps_rank.size(); ++p) {
    ServeStats& st = out[p];
    st.updates = m.transport->atomic_read(*m.region, m.ps_rank[p], m.layout.stats());
    st.elements = m.transport->atomic_read(*m.region, m.ps_rank[p], m.layout.stats() + 8);
    st.busy_s = 1e-9 * static_cast<double>(m.transport->atomic_read(*m.region, m.ps_rank[p], m.layout.stats() + 16));
    st.split_updates = m.transport->atomic_read(*m.region, m.ps_rank[p], m.layout.stats() + 24);
    st.max_threads = m.transport->atomic_read(*m.region, m.ps_rank[p], m.layout.stats() + 32);
  }
  return out;
}

void PsClient::pull(std::string_view variable, void* dst, std::size_t bytes) {
  pull_many({PullTarget{variable, dst, bytes}});
}

void PsClient::pull_many(const std::vector<PullTarget>& targets) {
  ClientCore& m = core();
  m.settle_sync("sync pull");
  const bool sync = m.options.consistency.mode == Consistency::kSync;
  for (const PullTarget& t : targets) {
    const VariableSpec& spec = m.spec_of(t.variable, "pull");
    m.check_bytes(spec, t.bytes, "pull");
    if (t.in_place) {
      *t.in_place = nullptr;
      const auto shards = m.map.shards_of(spec.name);
      if (sync && shards.size() == 1) {
        const std::size_t s = static_cast<std::size_t>(&shards[0] - m.map.shards().data());
        *t.in_place = m.transport->local_view(*m.region, m.ps_rank[shards[0].ps], m.layout.shard(s).values, t.bytes);
        if (*t.in_place) continue;
      }
    }
    const std::size_t row_bytes = t.bytes / static_cast<std::size_t>(std::max<std::int64_t>(1, num_rows(spec.shape)));
    for (const Shard& sh : m.map.shards_of(spec.name)) {
      const std::size_t s = static_cast<std::size_t>(&sh - m.map.shards().data());
      m.transport->get(*m.region, m.ps_rank[sh.ps], m.layout.shard(s).values,
                       static_cast<char*>(t.dst) + static_cast<std::size_t>(sh.row_begin) * row_bytes, sh.bytes);
    }
  }
  m.flush_all_peers();
}

void PsClient::release_in_place(const void* values, std::size_t bytes) {
  ClientCore& m = core();
  m.transport->release_view(*m.region, values, bytes);
}

void PsClient::push(std::string_view variable, const void* grad, std::size_t bytes) {
  ClientCore& m = core();
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

void PsClient::pull_rows(std::string_view variable, const std::vector<std::int64_t>& rows, void* dst,
                                 std::size_t bytes) {
  ClientCore& m = core();
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
    m.transport->get_rows(*m.region, m.ps_rank[sh.ps], m.layout.shard(s).values, row_bytes, local, staged[k].data());
  }
  m.flush_all_peers();
  for (std::size_t k = 0; k < shards.size(); ++k)
    for (std::size_t j = 0; j < positions[k].size(); ++j)
      std::memcpy(static_cast<char*>(dst) + positions[k][j] * row_bytes, staged[k].data() + j * row_bytes, row_bytes);
}

void PsClient::push_rows(std::string_view variable, const std::vector<std::int64_t>& rows, const void* grads,
                                 std::size_t bytes) {
  ClientCore& m = core();
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

void PsClient::assign(std::string_view variable, const void* values, std::size_t bytes) {
  ClientCore& m = core();
  const VariableSpec& spec = m.spec_of(variable, "assign");
  m.check_bytes(spec, bytes, "assign");
  m.settle_sync("sync assign");  // a pending round must not land on top of the assigned values
  const std::size_t row_bytes = bytes / static_cast<std::size_t>(std::max<std::int64_t>(1, num_rows(spec.shape)));
  for (const Shard& sh : m.map.shards_of(spec.name)) {
    const std::size_t s = static_cast<std::size_t>(&sh - m.map.shards().data());
    m.transport->put(*m.region, m.ps_rank[sh.ps], m.layout.shard(s).values,
                     static_cast<const char*>(values) + static_cast<std::size_t>(sh.row_begin) * row_bytes, sh.bytes);
  }
  m.flush_all_peers();
}

std::int64_t PsClient::global_step() {
  return core().transport->atomic_read(*core().region, core().ps_rank[0], control::kGlobalStep);
}

std::int64_t PsClient::increment_global_step() {
  return core().transport->fetch_add(*core().region, core().ps_rank[0], control::kGlobalStep, 1) + 1;
}

std::int64_t PsClient::end_step() {
  ClientCore& m = core();
  const int ps0 = m.ps_rank[0];
  // Only this worker advances its clock word, so it reads back exactly the clock it last set; the
  // other workers' clocks are never negative. Checked, the differences below cannot overflow.
  const std::int64_t before = m.transport->fetch_add(*m.region, ps0, m.layout.clock(m.worker), 1);
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

std::int64_t PsClient::slowest_clock() {
  ClientCore& m = core();
  std::int64_t low = std::numeric_limits<std::int64_t>::max();
  for (int w = 0; w < m.num_workers; ++w)
    low = std::min(low, m.transport->atomic_read(*m.region, m.ps_rank[0], m.layout.clock(w)));
  return low;
}

void PsClient::done() {
  ClientCore& m = core();
  if (m.done_called) return;
  m.done_called = true;
  // Async pushes must be remotely complete before the PS may stop serving.
  m.flush_all_peers();
  for (int ps : m.ps_rank) m.transport->fetch_add(*m.region, ps, control::kDone, 1);
  for (int p = 0; p < m.num_ps(); ++p) m.ring_ps(p);
}

}  // namespace strata::ps
