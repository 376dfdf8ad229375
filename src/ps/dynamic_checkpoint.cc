// The copy between table snapshots and checkpoint states, and the point-to-point transfer of a
// state (dynamic_checkpoint.h: for tests and the gather-vs-parallel benchmark).
#include "ps/dynamic_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "strata/common/error.h"
#include "strata/ps/optimizer.h"

namespace strata::ps {

checkpoint::DynamicTableCounters to_counters(const DynamicTableStats& s) {
  checkpoint::DynamicTableCounters c;
  c.admitted = s.admitted;
  c.lookups = s.lookups;
  c.updates = s.updates;
  c.rejected_lookups = s.rejected_lookups;
  c.rejected_updates = s.rejected_updates;
  c.rejected_full = s.rejected_full;
  c.evicted_ttl = s.evicted_ttl;
  c.evicted_capacity = s.evicted_capacity;
  c.imported = s.imported;
  return c;
}

checkpoint::DynamicTableState full_state(const std::string& name, const DynamicTableConfig& config,
                                         DynamicTableSnapshot snap) {
  checkpoint::DynamicTableState t;
  t.name = name;
  t.kind = checkpoint::DynamicKind::kFull;
  t.dim = snap.dim;
  t.optimizer = ps::to_string(config.optimizer.kind);
  t.slot_names = ps::slot_names(config.optimizer.kind);
  t.total_rows = static_cast<std::int64_t>(snap.ids.size());
  t.ids = std::move(snap.ids);
  t.values = std::move(snap.values);
  t.slots = std::move(snap.slots);
  t.stamps = std::move(snap.stamps);
  t.update_counts = std::move(snap.update_counts);
  t.clock = snap.clock;
  t.sketch_width = snap.sketch_width;
  t.sketch = std::move(snap.sketch);
  t.counters = to_counters(snap.stats);
  return t;
}

checkpoint::DynamicTableState delta_state(const std::string& name, const DynamicTableConfig& config,
                                          DynamicTableDelta delta, std::int64_t total_rows, std::int64_t parent_step,
                                          std::uint32_t parent_checksum) {
  checkpoint::DynamicTableState t = full_state(name, config, std::move(delta.rows));
  t.kind = checkpoint::DynamicKind::kDelta;
  t.total_rows = total_rows;
  t.evicted_ids = std::move(delta.evicted_ids);
  t.parent_step = parent_step;
  t.parent_checksum = parent_checksum;
  return t;
}

DynamicTableSnapshot to_snapshot(checkpoint::DynamicTableState t) {
  DynamicTableSnapshot s;
  s.dim = t.dim;
  s.sketch_width = t.sketch_width;
  s.ids = std::move(t.ids);
  s.values = std::move(t.values);
  s.slots = std::move(t.slots);
  s.stamps = std::move(t.stamps);
  s.update_counts = std::move(t.update_counts);
  s.clock = t.clock;
  s.sketch = std::move(t.sketch);
  const checkpoint::DynamicTableCounters& c = t.counters;
  s.stats.admitted = c.admitted;
  s.stats.lookups = c.lookups;
  s.stats.updates = c.updates;
  s.stats.rejected_lookups = c.rejected_lookups;
  s.stats.rejected_updates = c.rejected_updates;
  s.stats.rejected_full = c.rejected_full;
  s.stats.evicted_ttl = c.evicted_ttl;
  s.stats.evicted_capacity = c.evicted_capacity;
  s.stats.imported = c.imported;
  return s;
}

checkpoint::DynamicTableState union_of_shards(std::vector<checkpoint::DynamicTableState> shards) {
  if (shards.empty()) throw Error("union_of_shards: no shard");
  if (shards.size() == 1) return std::move(shards[0]);
  checkpoint::DynamicTableState out;
  const checkpoint::DynamicTableState& first = shards[0];
  out.name = first.name;
  out.kind = first.kind;
  out.dim = first.dim;
  out.optimizer = first.optimizer;
  out.slot_names = first.slot_names;
  out.sketch_width = first.sketch_width;
  out.sketch.assign(first.sketch.size(), 0);
  out.parent_step = first.parent_step;
  out.parent_checksum = first.parent_checksum;
  const auto dim = static_cast<std::size_t>(first.dim);
  std::size_t rows = 0, evicted = 0;
  for (const auto& t : shards) {
    if (t.dim != first.dim || t.slots.size() != first.slots.size() || t.sketch.size() != first.sketch.size() ||
        t.kind != first.kind)
      throw Error("dynamic table '" + first.name + "': the PS ranks' shards disagree on dim, slots, sketch or kind");
    rows += t.ids.size();
    evicted += t.evicted_ids.size();
  }
  // Rows by id over every shard; an id held twice means the shard map was not respected.
  std::vector<std::pair<std::int64_t, std::pair<std::size_t, std::size_t>>> order;
  order.reserve(rows);
  for (std::size_t s = 0; s < shards.size(); ++s)
    for (std::size_t i = 0; i < shards[s].ids.size(); ++i) order.push_back({shards[s].ids[i], {s, i}});
  std::sort(order.begin(), order.end());
  out.ids.reserve(rows);
  out.stamps.reserve(rows);
  // Counts when any shard has them (a shard without them, from an older file, counts 0 a row).
  const bool counts = std::any_of(shards.begin(), shards.end(), [](const auto& t) { return !t.update_counts.empty(); });
  if (counts) out.update_counts.reserve(rows);
  out.values.resize(rows * dim);
  out.slots.assign(first.slots.size(), std::vector<float>(rows * dim));
  for (std::size_t r = 0; r < order.size(); ++r) {
    const auto& [id, at] = order[r];
    if (r > 0 && order[r - 1].first == id)
      throw Error("dynamic table '" + first.name + "': id " + std::to_string(id) + " is held by two PS ranks");
    const auto& src = shards[at.first];
    const std::size_t i = at.second;
    out.ids.push_back(id);
    out.stamps.push_back(src.stamps[i]);
    if (counts) out.update_counts.push_back(src.update_counts.empty() ? 0 : src.update_counts.at(i));
    std::memcpy(out.values.data() + r * dim, src.values.data() + i * dim, dim * sizeof(float));
    for (std::size_t k = 0; k < out.slots.size(); ++k)
      std::memcpy(out.slots[k].data() + r * dim, src.slots[k].data() + i * dim, dim * sizeof(float));
  }
  out.evicted_ids.reserve(evicted);
  for (const auto& t : shards) {
    out.total_rows += t.total_rows;
    out.clock = std::max(out.clock, t.clock);
    for (std::size_t c = 0; c < out.sketch.size(); ++c)
      out.sketch[c] = static_cast<std::uint16_t>(std::min<unsigned>(0xffff, unsigned{out.sketch[c]} + t.sketch[c]));
    out.counters.admitted += t.counters.admitted;
    out.counters.lookups += t.counters.lookups;
    out.counters.updates += t.counters.updates;
    out.counters.rejected_lookups += t.counters.rejected_lookups;
    out.counters.rejected_updates += t.counters.rejected_updates;
    out.counters.rejected_full += t.counters.rejected_full;
    out.counters.evicted_ttl += t.counters.evicted_ttl;
    out.counters.evicted_capacity += t.counters.evicted_capacity;
    out.counters.imported += t.counters.imported;
    out.evicted_ids.insert(out.evicted_ids.end(), t.evicted_ids.begin(), t.evicted_ids.end());
  }
  std::sort(out.evicted_ids.begin(), out.evicted_ids.end());
  return out;
}

std::string table_name(std::string_view variable) { return checkpoint::dynamic_table_name(variable); }

namespace {

constexpr std::size_t kPiece = std::size_t{1} << 30;

// A wait of the link's that passed its deadline names the peer's rank in the job.
template <typename F>
auto blaming(const PeerLink& link, F&& f) {
  try {
    return f();
  } catch (const TimeoutError&) {
    // The message stays posted: the job ends on this error, and MPI_Abort reclaims it.
    throw TimeoutError(link.what + ": rank " + std::to_string(link.blame) + " did not answer within " +
                           std::to_string(link.timeout_s) + " s",
                       {link.blame});
  }
}

void send_bytes(const void* data, std::size_t bytes, const PeerLink& link) {
  const char* p = static_cast<const char*>(data);
  do {
    const std::size_t n = std::min(bytes, kPiece);
    blaming(link, [&] {
      link.group->send(link.peer, kDynamicSaveTag, p, n, comm::Deadline{link.timeout_s, link.what});
      return 0;
    });
    p += n;
    bytes -= n;
  } while (bytes > 0);
}

void recv_bytes(void* data, std::size_t bytes, const PeerLink& link) {
  char* p = static_cast<char*>(data);
  do {
    const std::size_t n = std::min(bytes, kPiece);
    const auto m = blaming(link, [&] { return link.group->recv(link.peer, kDynamicSaveTag, comm::Deadline{link.timeout_s, link.what}); });
    if (m.size() != n)
      throw Error(link.what + ": rank " + std::to_string(link.blame) + " sent a piece of " + std::to_string(m.size()) +
                  " bytes where " + std::to_string(n) + " were due");
    if (n > 0) std::memcpy(p, m.data(), n);  // (an empty vector's data() may be null)
    p += n;
    bytes -= n;
  } while (bytes > 0);
}

template <typename T>
void send_vector(const std::vector<T>& v, const PeerLink& link) {
  send_bytes(v.data(), v.size() * sizeof(T), link);
}

template <typename T>
void recv_vector(std::vector<T>& v, std::size_t n, const PeerLink& link) {
  v.resize(n);
  recv_bytes(v.data(), n * sizeof(T), link);
}

// The header words of a state on the wire.
enum Word { kRows, kDim, kSlots, kSketchWidth, kEvicted, kClock, kTotalRows, kCountRows, kCounters, kWords = kCounters + 9 };

}  // namespace

void send_state(const checkpoint::DynamicTableState& s, const PeerLink& link) {
  std::int64_t h[kWords] = {};
  h[kRows] = static_cast<std::int64_t>(s.ids.size());
  h[kDim] = s.dim;
  h[kSlots] = static_cast<std::int64_t>(s.slots.size());
  h[kSketchWidth] = s.sketch_width;
  h[kEvicted] = static_cast<std::int64_t>(s.evicted_ids.size());
  h[kClock] = s.clock;
  h[kTotalRows] = s.total_rows;
  h[kCountRows] = static_cast<std::int64_t>(s.update_counts.size());
  const auto& c = s.counters;
  const std::int64_t counters[9] = {c.admitted,      c.lookups,     c.updates,          c.rejected_lookups, c.rejected_updates,
                                    c.rejected_full, c.evicted_ttl, c.evicted_capacity, c.imported};
  std::copy(counters, counters + 9, h + kCounters);
  send_bytes(h, sizeof h, link);
  send_vector(s.ids, link);
  send_vector(s.values, link);
  for (const auto& slot : s.slots) send_vector(slot, link);
  send_vector(s.stamps, link);
  send_vector(s.update_counts, link);
  send_vector(s.sketch, link);
  send_vector(s.evicted_ids, link);
}

checkpoint::DynamicTableState recv_state(const PeerLink& link, std::int64_t dim, std::size_t num_slots,
                                         std::int64_t sketch_width) {
  std::int64_t h[kWords] = {};
  recv_bytes(h, sizeof h, link);
  const std::int64_t limit = DynamicTableConfig::kMaxCapacity;
  const auto bad = [&](const std::string& why) {
    return Error(link.what + ": rank " + std::to_string(link.blame) + " sent " + why);
  };
  if (h[kDim] != dim) throw bad("rows of " + std::to_string(h[kDim]) + " floats, expected " + std::to_string(dim));
  if (h[kSlots] != static_cast<std::int64_t>(num_slots))
    throw bad(std::to_string(h[kSlots]) + " slots, expected " + std::to_string(num_slots));
  if (h[kSketchWidth] != sketch_width)
    throw bad("a sketch of width " + std::to_string(h[kSketchWidth]) + ", expected " + std::to_string(sketch_width));
  if (h[kRows] < 0 || h[kRows] > limit || h[kEvicted] < 0 || h[kEvicted] > limit || h[kClock] < 0 ||
      h[kTotalRows] < 0 || h[kTotalRows] > limit)
    throw bad("a header out of range (rows " + std::to_string(h[kRows]) + ", evicted " + std::to_string(h[kEvicted]) +
              ", clock " + std::to_string(h[kClock]) + ", total rows " + std::to_string(h[kTotalRows]) + ")");
  for (int k = 0; k < 9; ++k)
    if (h[kCounters + k] < 0) throw bad("a negative counter");
  if (h[kCountRows] != 0 && h[kCountRows] != h[kRows])
    throw bad(std::to_string(h[kCountRows]) + " update counts for " + std::to_string(h[kRows]) + " rows");
  checkpoint::DynamicTableState s;
  s.dim = dim;
  s.sketch_width = sketch_width;
  s.clock = h[kClock];
  s.total_rows = h[kTotalRows];
  auto& c = s.counters;
  std::int64_t* counters[9] = {&c.admitted,      &c.lookups,     &c.updates,          &c.rejected_lookups, &c.rejected_updates,
                               &c.rejected_full, &c.evicted_ttl, &c.evicted_capacity, &c.imported};
  for (int k = 0; k < 9; ++k) *counters[k] = h[kCounters + k];
  const auto n = static_cast<std::size_t>(h[kRows]);
  const std::size_t elems = n * static_cast<std::size_t>(dim);
  recv_vector(s.ids, n, link);
  recv_vector(s.values, elems, link);
  s.slots.resize(num_slots);
  for (auto& slot : s.slots) recv_vector(slot, elems, link);
  recv_vector(s.stamps, n, link);
  recv_vector(s.update_counts, static_cast<std::size_t>(h[kCountRows]), link);
  recv_vector(s.sketch, static_cast<std::size_t>(sketch_width) * DynamicTableConfig::kSketchDepth, link);
  recv_vector(s.evicted_ids, static_cast<std::size_t>(h[kEvicted]), link);
  return s;
}

void send_outcome(std::int64_t status, const std::string& message, const PeerLink& link) {
  const std::string text = message.substr(0, std::size_t{1} << 16);
  const std::int64_t h[2] = {status, static_cast<std::int64_t>(text.size())};
  send_bytes(h, sizeof h, link);
  send_bytes(text.data(), text.size(), link);
}

std::int64_t recv_outcome(std::string* message, const PeerLink& link) {
  std::int64_t h[2] = {};
  recv_bytes(h, sizeof h, link);
  if (h[1] < 0 || h[1] > (std::int64_t{1} << 16))
    throw Error(link.what + ": rank " + std::to_string(link.blame) + " sent a message of " + std::to_string(h[1]) +
                " bytes");
  message->resize(static_cast<std::size_t>(h[1]));
  recv_bytes(message->data(), message->size(), link);
  return h[0];
}

}  // namespace strata::ps
