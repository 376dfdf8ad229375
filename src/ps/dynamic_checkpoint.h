// The copy between the PS layer's table snapshots (dynamic_table.h) and the checkpoint layer's
// DynamicTableState (strata/checkpoint/dynamic.h). The checkpoint layer does not know the PS
// layer; this is the one place that knows both. Private to the ps layer. A job's PS ranks save
// their shards with checkpoint::write_dynamic_checkpoint over their communicator, each its own
// rows (FORMAT.md 10.7); union_of_shards and the point-to-point transfers below are what the
// gathered save used (every shard sent to PS 0, merged there): kept for tests, which assemble the
// live tables of a job to compare them, and for the gather-vs-parallel benchmark
// (tests/tools/dynamic_save_bench.cc). No save path uses them.
//
// Thread-safety: plain functions on values; the MPI helpers follow MPI_THREAD_MULTIPLE rules
// (one call per request at a time).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>


#include "ps/dynamic_table.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/comm/group.h"

namespace strata::ps {

checkpoint::DynamicTableCounters to_counters(const DynamicTableStats& s);

// A full state from DynamicTable::export_rows(): named `name` (a table name, see table_name()),
// optimizer and slot names from `config`.
checkpoint::DynamicTableState full_state(const std::string& name, const DynamicTableConfig& config,
                                         DynamicTableSnapshot snap);

// A delta from DynamicTable::export_delta(), linked to the save at `parent_step` whose content
// checksum was `parent_checksum`; `total_rows` is the table's row count now.
checkpoint::DynamicTableState delta_state(const std::string& name, const DynamicTableConfig& config,
                                          DynamicTableDelta delta, std::int64_t total_rows, std::int64_t parent_step,
                                          std::uint32_t parent_checksum);

// The snapshot a restored (full) state imports from; the counters go with it.
DynamicTableSnapshot to_snapshot(checkpoint::DynamicTableState t);

// One logical table from the states of its shards (disjoint ids, same kind, dim and slots): rows
// merged by id, counters and total_rows summed, clock the largest, sketches added cell by cell
// (saturating at 65535), evicted ids merged. The first shard's name, kind and parent link are kept.
// Error when the shards disagree on dim, slots or sketch width, or share an id.
checkpoint::DynamicTableState union_of_shards(std::vector<checkpoint::DynamicTableState> shards);

// The checkpoint table name of dynamic variable `variable`: checkpoint::dynamic_table_name().
std::string table_name(std::string_view variable);

// Point-to-point transfer of one state over `group` (tag kDynamicSaveTag), in pieces of at most
// 1 GiB, each wait bounded by `timeout_s` (TimeoutError naming `what` and blaming `blame`, the
// peer's rank in the job). recv_state checks the header against what the receiver expects (dim, slot
// count, sketch width, row and evicted counts within the table's limits) before allocating:
// Error naming the peer otherwise.
inline constexpr int kDynamicSaveTag = 0x5d7a;
struct PeerLink {
  comm::Group* group = nullptr;
  int peer = -1;  // the peer's rank in group
  int blame = -1;  // the peer's rank in the job (named by a timeout)
  double timeout_s = 60;
  std::string what;  // what the transfer is for, in messages
};
void send_state(const checkpoint::DynamicTableState& s, const PeerLink& link);
checkpoint::DynamicTableState recv_state(const PeerLink& link, std::int64_t dim, std::size_t num_slots,
                                         std::int64_t sketch_width);
// A status word and a message (at most 64 KiB), the same way.
void send_outcome(std::int64_t status, const std::string& message, const PeerLink& link);
std::int64_t recv_outcome(std::string* message, const PeerLink& link);

}  // namespace strata::ps
