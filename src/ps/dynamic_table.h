// A parameter server's dynamic embedding table (issue 22, item 2): rows of `dim` floats keyed by
// arbitrary int64 ids, with no vocabulary, created on first use, admitted by frequency and evicted
// by age or capacity. Private to the ps layer; the data plane (later) owns one table per shard.
//
// Layout (docs/DYNAMIC.md has the figures):
//   * Row store: fixed-size pages (about 64 KiB) of records, cut from 2 MiB-aligned slabs that go
//     onto huge pages (dynamic_table.cc, "Huge pages"); record r = [id int64][stamp u32]
//     [update count u32][values dim f32][slot 0 dim f32][slot 1 dim f32] (as many slots as the optimizer has),
//     padded to 8 bytes. The stamp is 32 bits to make room for the count within the same 16-byte
//     header: an offset from a base that follows the clock, exact for rows updated within the
//     last 3 * 2^30 - 1 steps (older rows read as that old; dynamic_table.cc, "Stamps beyond 32
//     bits"); the count is the number of applied updates that named the row (once per batch),
//     saturating at 2^32 - 1.
//     A row keeps its record number for its whole life; freed records form a free list threaded
//     through their id field, so memory of evicted rows is reused, never returned.
//   * Index: open addressing with Robin Hood linear probing over a power-of-two array of 6-byte
//     slots {probe distance + 1 (8 bits), hash tag (8 bits), record number (32 bits)}. A slot
//     never holds an id, so no id value is reserved as the "empty" marker: empty is distance 0,
//     and every int64 (INT64_MIN, -1, 0, ...) is an ordinary key. Deletion shifts the following
//     cluster back (no tombstones). The index doubles when it would pass 7/8 load.
//   * Hashes: mix64 is splitmix64's finaliser (bijective on 64 bits). The index hash is
//     mix64(id ^ mix64(seed ^ kIndexSalt)); its top bits pick the home slot, its low 8 bits are
//     the tag. It decides only where a row sits in memory, never its contents.
//
// Determinism: a row's initial values are ps::fill() of the table's Initializer with the seed
// row_seed(init.seed, id), i.e. a pure function of (initializer, id): the same on every PS, in any
// insertion order, under any shard count. Optimizer slots start at slot_initial_value(). Updates
// use the dense PS's optimizer code (apply_dense in strata/ps/optimizer.h, over a batch's rows
// gathered into contiguous arrays), so a row updated here is bit-identical to the same row of a
// dense variable updated with apply_sparse_rows.
//
// Admission: with admit_after = N > 1, an id becomes a row on the lookup that sees it for the N-th
// time, counted in a count-min sketch with conservative update (depth 4, `sketch_width` 16-bit
// saturating counters per hash row). Estimates never undercount (until decay_admission_counts()
// halves them), so an id is never admitted late; a hash collision of all four cells can admit it
// early. Until then a training lookup returns zeros
// (DeepRec's default_value_no_permission; TFRA's default is also a constant) and an update is
// dropped; both are counted. Only training lookups count as "seen"; updates do not.
//
// Update counts: every row counts the apply() batches that updated it (an id named several times
// in one batch counts once, like its one optimizer update; a gradient dropped because the id is
// not admitted or finds no room counts nothing, since there is no row). A row starts at 0 when it
// is created (also after an eviction), and export/import carry the count, so it survives a
// reshard and a checkpoint. With synchronous or asynchronous workers alike, a row's count equals
// the number of pushes that named its id since the row was created: the "no lost update" check.
//
// Eviction: rows carry the step of their last update ("stamp"; creation stamps the table's clock).
// evict_older_than() removes rows not updated for `ttl` steps (exactly, for ttl <= 3 * 2^30 - 1;
// see Layout). When the table is at `capacity`, a new row replaces the least-recently-updated row
// (exact LRU by stamp, ties by id; rows older than 3 * 2^30 - 1 steps tie with each other),
// found from a batch of the oldest rows picked by one scan (1/32 of the table per scan). A row
// stamped at the current clock is never evicted to make room (so a batch never evicts a row it
// just created or updated); an id that finds no room is treated like a not-admitted id (zeros,
// update dropped, counted in rejected_full).
//
// Rounds (config round_boundaries, what the PS sets for synchronous training): several workers'
// lookups of one step reach a PS in whatever order the network gives, so anything a lookup decides
// from what earlier lookups of the same step did would differ from run to run. With rounds, a
// lookup decides only from the state at the last end_round(): an id is admitted when its count
// committed by then plus this sighting reaches N (the same answer for every worker that looks it up
// in the step), the sighting itself is held until end_round(), and a row created at capacity
// evicts nothing. end_round() counts
// the held sightings in id order and evicts least-recently-updated rows (ties by id, so the set of
// rows decides, not their order of arrival) down to capacity. A sync job is then bit-for-bit
// repeatable, and equal to one table fed every worker's lookups and then updates, with admission
// and capacity eviction too. An update of an id not looked up in its step is admitted as if it had
// been (count + 1 >= N). Memory: within a round the table may hold up to four times its capacity;
// a round that brings more new ids than that has the excess refused (rejected_full) in arrival
// order, the one case where the order still shows. After end_round() it holds at most capacity
// rows, or the rows the round itself updated if those are more (they are never evicted).
//
// Thread-safety: none inside. One thread (the shard's service thread) owns a table and makes every
// call; const member functions may run concurrently with each other only. With a team
// (use_team), lookup and apply split a batch of at least 2 x 2048 ids over the team's threads and
// return once every part is done; the results are bit for bit those of one thread (see
// dynamic_table.cc, lookup_split and apply).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "strata/ps/optimizer.h"
#include "strata/ps/variable.h"

namespace strata::ps {

class ApplyTeam;

// splitmix64's finaliser, the hash every function below builds on.
std::uint64_t dynamic_mix64(std::uint64_t x);

// The shard (0 <= shard < num_shards) that owns `id`: Lamping & Veach's jump consistent hash of
// mix64(id ^ kShardSalt). Depends only on (id, num_shards), never on a table's seed or contents;
// going from n to n + 1 shards moves only about 1/(n + 1) of the ids, all to the new shard.
// num_shards must be in [1, 2^31 - 1] (strata::Error otherwise).
int shard_of(std::int64_t id, int num_shards);

// The seed of row `id`'s initializer stream: mix64(mix64(table_seed ^ kRowSalt) + id). Distinct
// ids of one table get distinct seeds (mix64 is a bijection).
std::uint64_t row_seed(std::uint64_t table_seed, std::int64_t id);

// The largest step a table takes (apply's step, evict_older_than's global step, a snapshot's clock
// and stamps): 2^62, far beyond any job, and low enough that step arithmetic never overflows.
inline constexpr std::int64_t kMaxDynamicStep = std::int64_t{1} << 62;

struct DynamicTableConfig {
  std::int64_t dim = 16;  // floats per row, in [1, 65536]
  // Initial values: any Initializer kind except glorot_uniform (an unbounded table has no fans).
  Initializer init = Initializer::uniform(-0.05, 0.05, 0);
  OptimizerConfig optimizer = OptimizerConfig::defaults(OptimizerKind::kAdagrad);
  std::int64_t capacity = std::int64_t{1} << 24;  // most rows, in [1, kMaxCapacity]
  std::int64_t admit_after = 0;                   // N: 0 or 1 admit at once; at most 65535
  std::int64_t sketch_width = std::int64_t{1} << 16;  // counters per sketch row (N > 1): a power of two in [64, 2^26]
  bool round_boundaries = false;  // sync training: admission and capacity act at end_round() (see above)

  static constexpr std::int64_t kMaxCapacity = (std::int64_t{1} << 31) - 1;
  static constexpr int kSketchDepth = 4;

  // ConfigError naming the field and value when anything above is out of range (the optimizer
  // and the initializer are validated too).
  void validate() const;
};

// Counters of one table, cumulative since construction (or as restored by import()).
struct DynamicTableStats {
  std::int64_t rows = 0;              // live rows now
  std::int64_t admitted = 0;          // rows created for admitted ids, on lookup or update (an id
                                      // evicted and seen again is admitted again)
  std::int64_t lookups = 0;           // ids looked up (training and inference)
  std::int64_t updates = 0;           // row updates applied (duplicates in one batch: one update)
  std::int64_t rejected_lookups = 0;  // training lookups answered with zeros: id not admitted yet
  std::int64_t rejected_updates = 0;  // gradients dropped: id not admitted yet
  std::int64_t rejected_full = 0;     // ids refused because no row could be evicted (see header)
  std::int64_t evicted_ttl = 0;       // rows removed by evict_older_than
  std::int64_t evicted_capacity = 0;  // rows replaced at capacity
  std::int64_t imported = 0;          // rows taken from snapshots
  std::int64_t bytes = 0;             // memory the table holds now (row pages, index, sketch, scratch)
  std::int64_t row_bytes = 0;         // bytes of one row's values and slots: dim * 4 * (1 + slots)
};

// A table's contents in memory, what a dynamic checkpoint stores (strata/checkpoint/dynamic.h
// mirrors it as DynamicTableState; checkpoint/FORMAT.md section 10). Rows are sorted by id,
// so two tables with the same rows export equal snapshots whatever their history.
//   ids           n ids, strictly increasing
//   values        n * dim floats, row i at i * dim
//   slots         num_slots(optimizer) arrays of n * dim floats, in slot_names() order
//   stamps        n steps of last update, in [0, kMaxDynamicStep]; a row older than 3 * 2^30 - 1
//                 steps exports a later stamp (at least that old; see Layout)
//   update_counts n update counts (one per id); an import also takes an empty vector, meaning
//                 every count 0 (a checkpoint written before the counts existed)
//   clock         the table's clock (largest step seen)
//   sketch        kSketchDepth * sketch_width counters (empty when admit_after <= 1), row-major
//   stats         the counters at export (bytes and rows describe the exporting table)
struct DynamicTableSnapshot {
  std::int64_t dim = 0;
  std::int64_t sketch_width = 0;
  std::vector<std::int64_t> ids;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
  std::vector<std::int64_t> stamps;
  std::vector<std::uint32_t> update_counts;
  std::int64_t clock = 0;
  std::vector<std::uint16_t> sketch;
  DynamicTableStats stats;
};

// What changed since the last DynamicTable::mark_saved(): the rows created, updated or imported
// since then (a snapshot of just those rows, sorted by id; clock, sketch and counters are the
// table's whole state at export) and the ids of rows that were in the table at the save and are
// gone now (evicted), strictly increasing. An id evicted and then created again is a changed row,
// not an evicted id. Applying it to the state of the save gives the state now:
// base.import_rows(saved); base.apply_delta(delta) exports what the live table exports.
struct DynamicTableDelta {
  DynamicTableSnapshot rows;
  std::vector<std::int64_t> evicted_ids;
};

class DynamicTable {
 public:
  // Validates `config` (ConfigError). config.init.seed is the table seed: it fixes every row's
  // initial values and salts the index hash.
  explicit DynamicTable(const DynamicTableConfig& config);
  ~DynamicTable();
  DynamicTable(const DynamicTable&) = delete;
  DynamicTable& operator=(const DynamicTable&) = delete;

  const DynamicTableConfig& config() const { return config_; }
  std::int64_t dim() const { return config_.dim; }
  std::int64_t size() const;

  enum class LookupMode {
    kTrain,      // counts ids for admission and creates admitted rows
    kInference,  // reads only: a missing row reads as zeros, nothing is counted or created
  };
  // Writes the rows of ids[0..n) to out[i * dim .. (i + 1) * dim). Duplicates are fine. n == 0 is
  // a no-op; ids and out must be non-null otherwise, and n * dim must fit in size_t (strata::Error).
  void lookup(const std::int64_t* ids, std::size_t n, float* out, LookupMode mode = LookupMode::kTrain);

  // Applies one optimizer update with gradient rows grads[i * dim ..] to the rows of ids[0..n).
  // The gradients of an id listed several times are summed in order of appearance, then its row
  // gets one update (apply_sparse_rows' semantics). A missing id gets a row first if it is
  // admitted (its count already reached N), else its gradient is dropped (rejected_updates).
  // Each row updated gains one in its update count. `step` in [1, kMaxDynamicStep] (strata::Error
  // otherwise) is Adam's t (1-based count of updates, as for a dense variable); the clock becomes
  // max(clock, step) and stamps every row of the batch (so out-of-order steps from asynchronous
  // workers never move a stamp backwards).
  void apply(const std::int64_t* ids, std::size_t n, const float* grads, std::int64_t step);

  // Removes the rows whose stamp s satisfies s + ttl <= global_step (not updated during the last
  // `ttl` steps); ttl >= 1, global_step in [0, kMaxDynamicStep]. Advances the clock to
  // max(clock, global_step). Returns rows removed.
  std::int64_t evict_older_than(std::int64_t global_step, std::int64_t ttl);

  // With round_boundaries, the end of a step's round (after its updates): counts the step's held
  // sightings in id order, then evicts the least-recently-updated rows stamped before the clock
  // (ties by id) until at most `capacity` remain. Returns rows evicted. Without round_boundaries it
  // does nothing (returns 0). export_rows() and the delta see only counted sightings: call it
  // before a save.
  std::int64_t end_round();

  // Halves every admission counter (TinyLFU's reset): ids that stopped appearing lose their
  // progress towards admission. No-op without admission.
  void decay_admission_counts();

  // Snapshot of every row (see DynamicTableSnapshot).
  DynamicTableSnapshot export_rows() const;
  // Adds the rows of `snap` that belong to shard `shard` of `num_shards` (shard_of), replacing a
  // row already present; clock = max(clock, snap.clock). The admission sketch is added counter by
  // counter (saturating; exact when one snapshot goes into an empty table of the same geometry,
  // an over-estimate when several shards merge; ignored when the widths differ). With
  // num_shards == 1 (a restore of the whole snapshot) the counters other than rows and bytes are
  // added as well; a reshard (num_shards > 1) leaves them alone, since every new shard reads every
  // old snapshot and would count them again. Everything is checked first (dims, array sizes, ids
  // strictly increasing, room under capacity): a bad snapshot throws strata::Error naming the
  // field and changes nothing. A row's update count becomes the snapshot's (0 when the snapshot
  // has none).
  void import_rows(const DynamicTableSnapshot& snap, int shard = 0, int num_shards = 1);

  // ---- incremental saves --------------------------------------------------------------------
  // The table remembers, in bounded memory (two bits per record and a list holding each evicted id
  // of the last save's state at most once), what changed since the last mark_saved() (or since
  // construction): rows created (lookup, apply, import), rows updated, and rows of the saved state
  // evicted (TTL or capacity).
  //
  // The rows changed since the last mark_saved() and the ids evicted since (DynamicTableDelta).
  DynamicTableDelta export_delta() const;
  // Starts a new delta period: call it once the state exported (export_rows or export_delta) is
  // committed, and after a restore (the restored state is the saved one).
  void mark_saved();
  // Rows export_delta() would return now.
  std::int64_t changed_rows() const;
  // Applies a delta onto a table that holds the state it was taken against: removes the evicted
  // ids of shard `shard` of `num_shards`, then imports the delta's rows of that shard as
  // import_rows does. Whole (num_shards == 1): the counters and the admission sketch become the
  // delta's (they are the table's whole state at the later save); a reshard leaves the counters
  // alone and takes the cellwise maximum of the sketches. Checked first like import_rows (and
  // evicted ids strictly increasing, none also a row of the delta); a bad delta changes nothing.
  // Removals are not counted as evictions and do not enter this table's delta tracking.
  void apply_delta(const DynamicTableDelta& delta, int shard = 0, int num_shards = 1);

  DynamicTableStats stats() const;

  // Splits large lookups and updates over `team` (null: one thread, the default). The team is not
  // owned and must outlive the table's use of it; ApplyTeam::run is not reentrant, so the caller
  // must never run the team from two threads at once (the PS holds its apply lock around every
  // use of its team, this table's included).
  void use_team(ApplyTeam* team);
  // Lookups and applies that ran split over the team since construction (not saved).
  std::int64_t split_batches() const;

  // Bytes that the kernel backs with huge pages now in the mappings holding the index and the row
  // store (huge_page_bytes in mapped_memory.h: reads /proc/self/smaps, and may count memory beside
  // the table where the kernel merged mappings); -1 when smaps cannot be read. For tests and
  // benchmarks (speed only: a table on 4 KiB pages returns the same results).
  std::int64_t huge_page_bytes() const;

  // The update count of `id`'s row (see "Update counts" above), or -1 when the table holds no row
  // for it. Reads only (counts nothing, creates nothing).
  std::int64_t update_count(std::int64_t id) const;

 private:
  struct Impl;
  void lookup_serial(const std::int64_t* ids, std::size_t n, float* out, LookupMode mode);
  bool lookup_split(const std::int64_t* ids, std::size_t n, float* out, LookupMode mode, int parts);
  DynamicTableSnapshot export_records(const std::vector<std::uint32_t>& records) const;
  void import_snapshot(const DynamicTableSnapshot& snap, const std::vector<std::int64_t>& removed, int shard,
                       int num_shards, bool delta);
  DynamicTableConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::ps
