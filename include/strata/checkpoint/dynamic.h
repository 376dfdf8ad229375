// Dynamic embedding tables in HDF5 checkpoint files, full and incremental (checkpoint/FORMAT.md
// section 10). A save writes `<dir>/dynamic-<global_step>.h5`, one group per table under
// /dynamic; each table is either a FULL state (every row) or a DELTA (the rows changed since the
// parent save plus the ids evicted since), linked to its parent by (step, content checksum). A
// restore reads the newest file, follows the parent links down to a full base and merges forward;
// a damaged or missing link falls back to the newest state whose chain is intact and says so.
//
// These functions are local (no MPI, HDF5's sec2 driver), except the parallel save, with which a
// training job's PS ranks write each save's file together, each its own rows (FORMAT.md 10.7). This layer
// does not depend on the PS layer: DynamicTableState mirrors ps::DynamicTableSnapshot /
// ps::DynamicTableDelta field for field, and the ps layer's glue (src/ps/dynamic_checkpoint.h)
// converts.
//
// Integrity is that of the dense checkpoints (FORMAT.md sections 3-5): an HDF5 user block with
// the whole-file CRC-32 and the byte range and CRC-32 of every dataset, checked with plain reads
// before HDF5 opens the file, and a metadata checksum over every attribute. Every size, dim and
// count is checked against the others before anything is allocated for it; a bad file gives one
// strata::Error naming the file and the field.
//
// Thread-safety: every function holds the process's HDF5 lock while it calls HDF5
// (strata/common/hdf5_lock.h), so in-process ranks may call them concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <mpi.h>

#include "strata/comm/group.h"
#include "strata/common/error.h"

namespace strata::checkpoint {

// The newest dynamic_format_version this strata reads and writes (1: one sorted run per table; 2:
// also one sorted run per writing rank, FORMAT.md 10.9). Version 1 files stay readable.
inline constexpr int kDynamicFormatVersion = 2;

// Cumulative counters of a table (ps::DynamicTableStats without rows, bytes and row_bytes).
struct DynamicTableCounters {
  std::int64_t admitted = 0, lookups = 0, updates = 0, rejected_lookups = 0, rejected_updates = 0, rejected_full = 0,
               evicted_ttl = 0, evicted_capacity = 0, imported = 0;
  bool operator==(const DynamicTableCounters& o) const;
};

enum class DynamicKind { kFull, kDelta };
const char* to_string(DynamicKind kind);  // "full", "delta"

// One table's state (full) or change (delta), in memory.
//   ids        n ids, strictly increasing
//   values     n * dim floats, row i at i * dim
//   slots      one n * dim array per name in slot_names (the optimizer's slots, in its order)
//   stamps     n steps of last update, >= 0
//   update_counts  n update counts (how many pushed batches updated the row since it was
//              created), or empty: none kept (a file written before the counts existed), which
//              reads as 0 for every row
//   sketch     4 * sketch_width admission counters (empty and width 0 without admission); in a
//              delta with sketch_sparse, only the counters that changed since the parent: their
//              flat indices (row * sketch_width + column) in sketch_cells, strictly increasing,
//              and their values in sketch, one per cell (sparsify_sketch())
//   total_rows rows of the full state this describes (a delta: after applying it)
// A delta also has evicted_ids (strictly increasing, none of them in ids) and the link to its
// parent: parent_step (the global step of the parent save) and parent_checksum (the parent
// table's content_checksum). content_checksum is the CRC-32 of the table's canonical text
// (FORMAT.md 10.3): filled in by write_dynamic_checkpoint and by every read.
struct DynamicTableState {
  std::string name;  // [A-Za-z0-9_.-]{1,255}, not "." or ".."
  DynamicKind kind = DynamicKind::kFull;
  std::int64_t dim = 0;
  std::string optimizer;
  std::vector<std::string> slot_names;
  std::vector<std::int64_t> ids;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
  std::vector<std::int64_t> stamps;
  std::vector<std::uint32_t> update_counts;
  std::int64_t clock = 0;
  std::int64_t sketch_width = 0;
  std::vector<std::uint16_t> sketch;
  bool sketch_sparse = false;
  std::vector<std::int64_t> sketch_cells;
  DynamicTableCounters counters;
  std::int64_t total_rows = 0;
  std::vector<std::int64_t> evicted_ids;
  std::int64_t parent_step = -1;
  std::uint32_t parent_checksum = 0;
  std::uint32_t content_checksum = 0;
  std::int64_t stored_rows = 0;  // rows the file holds (ids' length), set by reads, with or without data
};

// "dynamic-<step>.h5".
std::string dynamic_file_name(std::int64_t global_step);

// The table name of dynamic variable `variable` in a training job's files (FORMAT.md 10.7):
// letters, digits, '_' and '.' unchanged, every other byte as '-' and two lowercase hex digits
// ("user/emb" -> "user-2femb"); one-to-one, so two variables never share a table. ConfigError
// when the result exceeds the format's 255 bytes.
std::string dynamic_table_name(std::string_view variable);

// What a save wrote.
struct DynamicSaveResult {
  std::string path;
  std::uint64_t file_bytes = 0;
  std::vector<std::uint32_t> content_checksums;  // per table, in the order given: the next delta's parent_checksum
  // Parallel save, rank 0 only: each table's whole sketch (the shards' sum), in the order given:
  // what the next delta's sketch is compared with (DynamicParallelOptions::parent_sketches).
  std::vector<std::vector<std::uint16_t>> sketches;
};

// Writes the tables to <dir>/dynamic-<global_step>.h5 atomically (write .tmp, read back and
// check every dataset's CRC-32, write the integrity block, fsync, rename, fsync the directory);
// replaces a file of the same step. Every table is validated first (sizes, sorted ids, a delta's
// link and evicted ids, unique names): ConfigError naming the table and field. I/O failures
// throw Error naming the file; the .tmp is removed and nothing committed changes.
DynamicSaveResult write_dynamic_checkpoint(const std::string& dir, std::int64_t global_step,
                                           const std::vector<DynamicTableState>& tables);

// The parallel save of a training job's PS ranks (FORMAT.md 10.7, 10.9): collective over `comm`;
// every rank passes its shard of every table (the same tables, names, kinds, dims, slots, sketch
// widths and parent links in the same order on every rank; disjoint ids; each shard's ids and
// evicted ids strictly increasing, counters, clock, total_rows and sketch its own) and writes its
// own rows into the one file <dir>/dynamic-<global_step>.h5 with parallel HDF5 (MPI-IO on `comm`,
// collective metadata, independent writes of each rank's hyperslab at the sum of the lower
// ranks' row counts). Nothing is gathered: the dataset CRC-32s are combined from the ranks'
// (crc32_combine), the table's totals summed (clock: the largest), the sketches added on rank 0
// (saturating at 65535), which writes them and the run table. The file holds one sorted run of
// rows per rank (version 2, `row_runs`); with one rank it is the version-1 file
// write_dynamic_checkpoint writes. Commit as write_dynamic_checkpoint: .tmp, read back (each rank
// an equal share of the file), integrity block, fsync, rename, fsync the directory, by rank 0.
// Every error is agreed: ConfigError (bad or mismatched shards) or Error (I/O) on every rank,
// naming the rank that failed (options.rank_names[rank] when given), the .tmp removed and nothing
// committed touched. A rank that never arrives blocks the others in MPI; the job's timeouts
// handle that. Returns the same result on every rank (sketches on rank 0 only). Over in-process
// ranks (a comm::Group without an MPI communicator) rank 0 writes the same file, the others
// sending it their rows, and each agreement is bounded by options.timeout_s.
struct DynamicParallelOptions {
  // Rank 0: per table, the whole sketch of the delta's parent state (DynamicSaveResult::sketches
  // of the parent save); a delta then carries only the changed counters when that is smaller
  // (sparsify_sketch). Empty, or a size that does not match: the whole sketch.
  std::vector<std::vector<std::uint16_t>> parent_sketches;
  // How messages name each rank of comm ("ps:1 (rank 3)"); "rank r of n" when empty.
  std::vector<std::string> rank_names;
  // When set, whether this rank's shard may hold `id` (the PS passes its shard map). Every id of
  // this rank's shards, rows and evicted ids, is checked before anything is written: an id the
  // map gives to another rank is a ConfigError on every rank, naming this rank, the table and the
  // id, so two ranks never write one id into the file. Unset: the ids are trusted (the reader
  // still refuses a file with an id in two runs).
  std::function<bool(std::int64_t)> owns;
  // In-process ranks only: the bound of each agreement (TimeoutError naming the late ranks).
  double timeout_s = 600;
};
DynamicSaveResult write_dynamic_checkpoint(comm::Group& group, const std::string& dir, std::int64_t global_step,
                                           const std::vector<DynamicTableState>& shards,
                                           const DynamicParallelOptions& options = {});
DynamicSaveResult write_dynamic_checkpoint(MPI_Comm comm, const std::string& dir, std::int64_t global_step,
                                           const std::vector<DynamicTableState>& shards,
                                           const DynamicParallelOptions& options = {});

// One file, verified (whole-file CRC-32 before HDF5 opens it, metadata checksum, every table's
// content checksum and every consistency rule of FORMAT.md 10.4) and read. With `with_data`
// false only the attributes and the evicted ids are read (ids/values/slots/stamps/sketch stay
// empty). Throws Error "dynamic checkpoint '<path>': <what>" (ConfigError when it is no dynamic
// checkpoint at all).
struct DynamicCheckpointFile {
  std::string path;
  std::int64_t global_step = 0;
  std::uint64_t file_bytes = 0;
  std::vector<DynamicTableState> tables;  // sorted by name
  const DynamicTableState* find(const std::string& name) const;
};
DynamicCheckpointFile read_dynamic_checkpoint(const std::string& path, bool with_data = true);

// Makes the delta `delta` carry only the sketch counters that differ from `parent_sketch` (the
// whole sketch of its parent state), when that is smaller than the whole sketch (10 bytes per
// changed counter against 2 per counter). True when it did. A merge restores the whole sketch:
// the parent's with these counters replaced. Nothing changes for a full table, a table without
// admission, or a parent sketch of another size.
bool sparsify_sketch(DynamicTableState& delta, const std::vector<std::uint16_t>& parent_sketch);

// Applies `delta` to the full state `base` (the state of the delta's parent): removes the evicted
// ids, inserts or replaces the delta's rows; clock, sketch, counters and total_rows become the
// delta's. The result is a full state whose parent link is cleared. Error when they do not fit
// (name, dim, optimizer, slots, or the merged row count differs from the delta's total_rows
// while `keep` filtered nothing).
DynamicTableState merge_dynamic_delta(const DynamicTableState& base, const DynamicTableState& delta);

// The steps of the committed dynamic-<step>.h5 files in `dir`, ascending (regular files only;
// other names and .tmp files are ignored).
std::vector<std::int64_t> list_dynamic_checkpoints(const std::string& dir);

// A table restored from a chain.
struct DynamicRestore {
  DynamicTableState state;         // full, merged (rows filtered by `keep` when given)
  std::int64_t step = -1;          // the global step of the state restored
  std::vector<std::string> chain;  // files used, base first
  std::string warning;             // one line when newer states were skipped (why), else ""
};
// Which files a restore of table `name` at the newest step <= `at_step` would use, from the files'
// verified headers only (no values read): the chain, base first, and the warning restore would
// give. Error when no step has an intact chain (as restore_dynamic_table).
struct DynamicRestorePlan {
  std::int64_t step = -1;
  std::vector<std::string> chain;
  std::string warning;
};
DynamicRestorePlan plan_dynamic_restore(const std::string& dir, const std::string& name,
                                        std::optional<std::int64_t> at_step = std::nullopt);

// Restores table `name` at the newest step <= `at_step` (every step when nullopt) whose chain is
// intact: every file verifies, every link names an existing parent whose content checksum
// matches. Newer candidates that fail are skipped and named in `warning`. `keep` (when given)
// selects the ids to keep (e.g. those of one PS shard: shard_of(id, k) == s), applied while
// merging so memory holds only those rows. Error naming the table and the first failure when no
// step has an intact chain.
DynamicRestore restore_dynamic_table(const std::string& dir, const std::string& name,
                                     std::optional<std::int64_t> at_step = std::nullopt,
                                     const std::function<bool(std::int64_t)>& keep = {});

// Retention (FORMAT.md 10.8): which dynamic-<step>.h5 files of `dir` the checkpoints at
// `kept_steps` (the steps checkpoint.json keeps) need. A kept step S needs the newest file at or
// before S (the state a restore at S starts from) and, for every table in that file, every link
// of its chain down to the full base. When that file does not verify or a chain is not intact, a
// restore at S falls back to an older state (10.5), so then every file at or before it is needed
// (and `notes` says why). Files newer than every kept step belong to a save that has not committed
// (remove_orphaned_files() judges those) and are always needed; with no kept step every file is.
// `compactable`: the steps of `compact_steps` (the preserved ones, keep_every_n_hours) whose own
// file is a delta that no other kept step's chain runs through, and whose rewriting as a full
// state would free at least one older file. Reads the verified headers of the files on the
// chains (each read whole once), no row data. Local, no MPI; throws Error only when the directory
// cannot be listed.
struct DynamicRetention {
  std::vector<std::int64_t> needed;       // ascending
  std::vector<std::int64_t> unneeded;     // ascending: no kept step needs them
  std::vector<std::string> notes;         // one line per kept step whose newest state is not intact
  std::vector<std::int64_t> compactable;  // ascending
};
DynamicRetention plan_dynamic_retention(const std::string& dir, const std::vector<std::int64_t>& kept_steps,
                                        const std::vector<std::int64_t>& compact_steps = {});

// Rewrites every compactable step as a full state (the file replaced atomically; nothing links to
// it but itself), then deletes the files plan_dynamic_retention() finds unneeded: regular files
// only, never through a symbolic link. Called by save() after checkpoint.json is committed, with
// the preserved steps as `compact_steps` (so a crash between the two leaves extra files, never a
// kept step with a missing link; the next save removes them), and by `strata ckpt prune`. Throws
// Error when a compaction fails (the files are then as they were, or the step's file is whole).
struct DynamicPrune {
  DynamicRetention plan;                 // after the compactions
  std::vector<std::string> compacted;    // file names rewritten whole
  std::vector<std::string> removed;      // file names, by step
  std::vector<std::string> not_removed;  // "<file>: <why>" for unneeded files left in place
};
DynamicPrune prune_dynamic_checkpoints(const std::string& dir, const std::vector<std::int64_t>& kept_steps,
                                       const std::vector<std::int64_t>& compact_steps = {});

// Compaction: rewrites the state at `at_step` (the newest file when nullopt; it must be the
// newest file in `dir`, since newer deltas link to the content of their parent) as one file in
// which every table is full, replacing dynamic-<step>.h5 atomically. With `remove_ancestors`,
// the files that were links of the compacted chains and are older than it are then deleted.
// Returns the new file's save result.
DynamicSaveResult compact_dynamic_checkpoints(const std::string& dir,
                                              std::optional<std::int64_t> at_step = std::nullopt,
                                              bool remove_ancestors = false);

}  // namespace strata::checkpoint
