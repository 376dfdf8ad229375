// Test-side glue between the PS layer's table snapshots (src/ps/dynamic_table.h) and the
// checkpoint layer's DynamicTableState (include/strata/checkpoint/dynamic.h): the two layers do
// not know each other, and the strategy layer's glue will do the same field-for-field copy when
// the data plane wires dynamic tables into the PS.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ps/dynamic_table.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/ps/optimizer.h"

namespace strata::test {

inline checkpoint::DynamicTableCounters to_counters(const ps::DynamicTableStats& s) {
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

// A full state from export_rows().
inline checkpoint::DynamicTableState full_state(const std::string& name, const ps::DynamicTableConfig& config,
                                                ps::DynamicTableSnapshot snap) {
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
  t.clock = snap.clock;
  t.sketch_width = snap.sketch_width;
  t.sketch = std::move(snap.sketch);
  t.counters = to_counters(snap.stats);
  return t;
}

// A delta from export_delta(), linked to the save at `parent_step` whose content checksum was
// `parent_checksum`; `total_rows` is the table's row count now.
inline checkpoint::DynamicTableState delta_state(const std::string& name, const ps::DynamicTableConfig& config,
                                                 ps::DynamicTableDelta delta, std::int64_t total_rows,
                                                 std::int64_t parent_step, std::uint32_t parent_checksum) {
  checkpoint::DynamicTableState t = full_state(name, config, std::move(delta.rows));
  t.kind = checkpoint::DynamicKind::kDelta;
  t.total_rows = total_rows;
  t.evicted_ids = std::move(delta.evicted_ids);
  t.parent_step = parent_step;
  t.parent_checksum = parent_checksum;
  return t;
}

// The snapshot a restored (full) state imports from; the counters go with it.
inline ps::DynamicTableSnapshot to_snapshot(checkpoint::DynamicTableState t) {
  ps::DynamicTableSnapshot s;
  s.dim = t.dim;
  s.sketch_width = t.sketch_width;
  s.ids = std::move(t.ids);
  s.values = std::move(t.values);
  s.slots = std::move(t.slots);
  s.stamps = std::move(t.stamps);
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

}  // namespace strata::test

namespace strata::test {

// One logical table from the states of its shards (disjoint ids): rows merged by id, counters
// summed, clock the largest, sketches added cell by cell (saturating), evicted ids merged;
// total_rows summed. What the collective writer will assemble from the PS ranks.
inline checkpoint::DynamicTableState union_of_shards(const std::vector<checkpoint::DynamicTableState>& shards) {
  checkpoint::DynamicTableState out = shards.at(0);
  const auto dim = static_cast<std::size_t>(out.dim);
  std::vector<std::pair<std::int64_t, std::pair<std::size_t, std::size_t>>> order;
  for (std::size_t s = 0; s < shards.size(); ++s)
    for (std::size_t i = 0; i < shards[s].ids.size(); ++i) order.push_back({shards[s].ids[i], {s, i}});
  std::sort(order.begin(), order.end());
  out.ids.clear();
  out.stamps.clear();
  out.values.clear();
  for (auto& sl : out.slots) sl.clear();
  for (const auto& [id, at] : order) {
    const auto& src = shards[at.first];
    const std::size_t i = at.second;
    out.ids.push_back(id);
    out.stamps.push_back(src.stamps[i]);
    out.values.insert(out.values.end(), src.values.begin() + static_cast<std::ptrdiff_t>(i * dim),
                      src.values.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
    for (std::size_t k = 0; k < out.slots.size(); ++k)
      out.slots[k].insert(out.slots[k].end(), src.slots[k].begin() + static_cast<std::ptrdiff_t>(i * dim),
                          src.slots[k].begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
  }
  for (std::size_t s = 1; s < shards.size(); ++s) {
    const auto& t = shards[s];
    out.total_rows += t.total_rows;
    out.clock = std::max(out.clock, t.clock);
    for (std::size_t c = 0; c < out.sketch.size() && c < t.sketch.size(); ++c)
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

}  // namespace strata::test
