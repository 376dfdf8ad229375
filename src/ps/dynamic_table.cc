// The dynamic embedding table (dynamic_table.h has the layout, the hashes and the rules).
//
// Why this shape:
//   * A 6-byte index slot (no id in it) and the id stored once, in the record next to the row's
//     values, keep a 16-float SGD row (64 bytes of values) under 1.5x of its values at any index
//     load: record 80 bytes + index 6 / load (6.9 to 13.7 bytes at loads 7/8 to 7/16). The tag
//     filters probes, so a record is read only for the matching slot, and that record holds the
//     values the lookup copies anyway: one index line and one record per hit.
//   * Robin Hood ordering lets a miss stop at the first slot whose resident is closer to its home
//     than the probe is (short misses even at 7/8 load), and makes deletion a backward shift.
//   * The index is rebuilt from the records, not from the old index, so growth never needs the
//     old and the new arrays at once, and a rebuild is also the recovery from a probe-distance
//     overflow (8 bits: 255 slots from home), which a good hash makes practically unreachable.
//   * Huge pages: a table larger than the caches costs, per id, a random index line and a random
//     record, and on 4 KiB pages each of them also a TLB miss and a page walk (a 2^18-row Adagrad
//     table spans 9,000 pages, far beyond the TLB's reach). The index and the row store therefore
//     live in 2 MiB-aligned mappings (mapped_memory.h): the index asks for huge pages at first
//     touch once it is 2 MiB or more (it is written all over, so they cost no memory), and the row
//     store, which grows, is cut into 2 MiB slabs: huge at first touch when a whole slab fits the
//     memory budget (kHugeBudget), else collapsed onto a huge page once every page of the slab has
//     been handed out, which holds no more memory than 4 KiB pages beyond less than one page per
//     full slab (add_page). Where the kernel refuses, the table is the same on 4 KiB pages; what it
//     returns never depends on it.
#include "ps/dynamic_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <queue>
#include <string>

#include "ps/apply_team.h"
#include "ps/mapped_memory.h"
#include "strata/common/error.h"

namespace strata::ps {
namespace {

constexpr std::uint64_t kIndexSalt = 0x1d8e4e27c47d124full;
constexpr std::uint64_t kRowSalt = 0x6a09e667f3bcc909ull;
constexpr std::uint64_t kShardSalt = 0xbb67ae8584caa73bull;
constexpr std::uint64_t kSketchSalt = 0x3c6ef372fe94f82bull;

constexpr std::uint32_t kNoRow = std::numeric_limits<std::uint32_t>::max();
constexpr int kMinIndexBits = 10;
// Index load that triggers doubling. 7/8 with Robin Hood keeps hits at about 4.5 slots (one cache
// line of 6-byte slots) and bounds the index at 6 / (7/16) = 13.7 bytes per row just after a
// doubling.
constexpr double kMaxLoad = 0.875;
constexpr int kMaxDist = 255;          // probe distance + 1 fits the slot's 8 bits
// A row-store slab goes onto huge pages at its first touch (2 MiB taken at once) only while the
// table, that slab included, holds at most this many times its rows' values and slots: below the
// 1.5x of the memory target with room for an index doubling (+6.9 bytes per row).
constexpr double kHugeBudget = 1.4;
// Record header: [id int64][stamp u32][update count u32]. The stamp is 32 bits so that the
// update count fits beside it without growing the record: a 16-float SGD row is 80 bytes with or
// without the count, and a 64-bit stamp plus a 32-bit count would make it 88 (100 bytes a row with
// the index at 1M rows, 1.56x of its values, over the 1.5x budget).
//
// Stamps beyond 32 bits: a record stores its stamp as an offset from the table's stamp base,
// base_for(clock), a pure function of the clock that keeps every age up to kStampKeep exact:
//   base_for(c) = 0 while c <= kStampKeep, else the multiple of kStampQuantum at or below c - kStampKeep,
// so c - base_for(c) is in [kStampKeep, kStampKeep + kStampQuantum - 1] = [3 * 2^30 - 1, 2^32 - 2],
// below the free marker. When the clock moves the base (once every 2^30 steps) every record's
// offset shifts down by the difference, an offset that would go below 0 staying at 0. So a row
// reads the stamp max(true stamp, base_for(clock)): exact for every row younger than kStampKeep
// steps, and an older row reads at least kStampKeep steps old. Every TTL allowed
// (DynamicVariableSpec::kMaxTtl = 2^31 < kStampKeep) therefore evicts exactly the rows it would
// with 64-bit stamps, and least-recently-updated order is exact except among rows older than
// kStampKeep (which tie, ordered by id). Because the base depends only on the clock, two tables at
// the same clock read the same stamps for the same rows: an export and its import agree bit for bit.
constexpr std::size_t kRecordHeader = 16;
constexpr std::size_t kStampAt = 8, kCountAt = 12;
constexpr std::int64_t kFreeStamp = -1;                   // stamp_of() of a free record (live stamps are >= 0)
constexpr std::uint32_t kFreeStampBits = 0xffffffffu;     // how a free record's stamp is stored
constexpr std::int64_t kStampQuantum = std::int64_t{1} << 30;
constexpr std::int64_t kStampKeep = 3 * kStampQuantum - 1;
static_assert(kStampKeep + kStampQuantum - 1 == std::int64_t{kFreeStampBits} - 1,
              "every offset from the base fits 32 bits below the free marker");
static_assert(DynamicVariableSpec::kMaxTtl <= kStampKeep, "every allowed ttl sees exact ages");

std::int64_t base_for(std::int64_t clock) {
  return clock <= kStampKeep ? 0 : (clock - kStampKeep) / kStampQuantum * kStampQuantum;
}

// One index slot: meta = (probe distance + 1) << 8 | tag, 0 when empty; the record number split in
// two halves so the slot packs into 6 bytes with 2-byte alignment.
struct Slot {
  std::uint16_t meta;
  std::uint16_t row_lo;
  std::uint16_t row_hi;
  std::uint32_t row() const { return static_cast<std::uint32_t>(row_lo) | static_cast<std::uint32_t>(row_hi) << 16; }
  void set(std::uint16_t m, std::uint32_t r) {
    meta = m;
    row_lo = static_cast<std::uint16_t>(r);
    row_hi = static_cast<std::uint16_t>(r >> 16);
  }
};
static_assert(sizeof(Slot) == 6, "index slots are 6 bytes");

inline int dist_of(std::uint16_t meta) { return meta >> 8; }

// splitmix64's finaliser, inlined into the hot loops (dynamic_mix64 is the same function).
inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Batched probes (lookup, apply): a table larger than the caches costs two dependent misses per
// id, the index line and then the record. Id i + kIndexAhead is hashed and its index line
// prefetched; id i + kRecordAhead, whose index line has arrived by then, has the record of its
// first tag match prefetched; id i is then found with both in cache. The prefetches only read the
// index, so what a lookup returns and what an update does are exactly those of one find per id.
constexpr std::size_t kIndexAhead = 32;   // a power of two (the hash ring's size)
constexpr std::size_t kRecordAhead = 16;  // < kIndexAhead
constexpr std::size_t kMaxPrefetchLines = 4;  // of a record; the hardware prefetcher takes longer rows
// Ids below which a part of a split batch does not pay for waking a team thread: the wake-up of a
// thread on an idle core can cost as much as the table work on a thousand ids (docs/DYNAMIC.md,
// "Split over the PS's threads").
constexpr std::size_t kMinIdsPerPart = 2048;

[[noreturn]] void bad_config(const char* field, std::int64_t value, const char* expected) {
  throw ConfigError(std::string("dynamic table: ") + field + " = " + std::to_string(value) + " is out of range (expected " +
                    expected + ")");
}

}  // namespace

std::uint64_t dynamic_mix64(std::uint64_t z) { return mix64(z); }

int shard_of(std::int64_t id, int num_shards) {
  STRATA_CHECK(num_shards >= 1, "shard_of: num_shards must be >= 1, got ", num_shards);
  // Jump consistent hash (Lamping & Veach 2014): walk the buckets a key would jump to as the
  // bucket count grows, with a 64-bit LCG seeded by the key; the last jump below num_shards wins.
  std::uint64_t key = dynamic_mix64(static_cast<std::uint64_t>(id) ^ kShardSalt);
  std::int64_t bucket = -1, next = 0;
  while (next < num_shards) {
    bucket = next;
    key = key * 2862933555777941757ull + 1;
    next = static_cast<std::int64_t>(static_cast<double>(bucket + 1) *
                                     (static_cast<double>(std::int64_t{1} << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int>(bucket);
}

std::uint64_t row_seed(std::uint64_t table_seed, std::int64_t id) {
  return dynamic_mix64(dynamic_mix64(table_seed ^ kRowSalt) + static_cast<std::uint64_t>(id));
}

void DynamicTableConfig::validate() const {
  if (dim < 1 || dim > 65536) bad_config("dim", dim, "[1, 65536]");
  if (capacity < 1 || capacity > kMaxCapacity) bad_config("capacity", capacity, "[1, 2^31 - 1]");
  if (admit_after < 0 || admit_after > 65535) bad_config("admit_after", admit_after, "[0, 65535]");
  if (admit_after > 1 && (sketch_width < 64 || sketch_width > (std::int64_t{1} << 26) ||
                          (sketch_width & (sketch_width - 1)) != 0))
    bad_config("sketch_width", sketch_width, "a power of two in [64, 2^26]");
  if (init.kind == Initializer::Kind::kGlorotUniform)
    throw ConfigError("dynamic table: initializer " + init.to_string() +
                      " needs the fans of a fixed shape; a dynamic table has no row count (use uniform)");
  init.validate(DType::kF32);
  optimizer.validate();
}

// ---- state ------------------------------------------------------------------------------------

struct DynamicTable::Impl {
  const DynamicTableConfig& cfg;
  std::size_t dim;
  int num_slot_arrays;
  std::size_t record_bytes;  // header + values + slots, a multiple of 8
  int page_shift;            // records per page = 1 << page_shift
  std::size_t page_bytes;    // record_bytes << page_shift
  // Pages are cut from slabs: 2 MiB-aligned mappings of pages_per_slab pages (slab_bytes, at least
  // 2 MiB), on huge pages from their first touch or from the moment they are full (add_page; "Huge
  // pages" at the top of this file). `store_bytes` is the memory the pages hold: a slab on huge
  // pages counts whole, any other page by page.
  std::size_t pages_per_slab, slab_bytes;
  std::vector<MappedMemory> slabs;
  bool slab_huge_at_fault = false;  // the last slab's
  std::vector<std::uint8_t*> pages;
  std::size_t store_bytes = 0;
  std::size_t row_bytes;  // a row's values and slots: what the memory budget is measured against
  std::uint32_t fresh = 0;   // records ever handed out: [0, fresh) are live or free
  std::uint32_t free_head = kNoRow;
  std::int64_t live = 0;

  // The index: a mapping of its own, on huge pages from 2 MiB up (every 4 KiB page of an index at
  // 7/16 load or more holds slots, so huge pages cost it nothing; the part past the last whole
  // 2 MiB block stays on 4 KiB pages, MappedMemory's contract).
  struct IndexArray {
    MappedMemory memory;
    Slot* slots = nullptr;
    std::size_t count = 0;
    Slot& operator[](std::size_t i) { return slots[i]; }
    const Slot& operator[](std::size_t i) const { return slots[i]; }
    std::size_t size() const { return count; }
  };
  IndexArray index;
  int index_bits = 0;
  std::uint64_t index_salt;

  std::vector<std::uint16_t> sketch;  // kSketchDepth rows of sketch_width (admit_after > 1)
  std::uint64_t sketch_mask = 0;

  // A record and its stamp at the scan. A candidate whose record now holds another stamp was
  // updated (restamped to the clock) or freed since; a record freed and reused after the scan
  // carries a stamp >= the clock of the scan, above every candidate's, so it never matches.
  // Ties go by id, not by record: which record a row sits in depends on the order rows came, the
  // set of (stamp, id) pairs does not (see "Rounds" in the header).
  struct Candidate {
    std::int64_t stamp;
    std::int64_t id;
    std::uint32_t row;
    bool operator<(const Candidate& o) const { return stamp != o.stamp ? stamp < o.stamp : id < o.id; }
  };
  std::vector<Candidate> candidates;  // oldest first, consumed from `next_candidate`
  std::size_t next_candidate = 0;
  std::int64_t empty_scan_clock = -1;  // the clock at which a scan found no evictable row

  std::int64_t clock = 0;
  std::int64_t stamp_base = 0;  // base_for(clock): what a record's 32-bit stamp is an offset from
  DynamicTableStats counters;

  // Delta tracking since the last mark_saved(), one bit per record each: `changed` (created,
  // updated or imported) and `created` (the record's row did not exist at the last save). A row
  // removed by eviction is listed in `evicted` only when it was not created since the save (it
  // was in the saved state); an id that is live again at export is a changed row, not an evicted
  // one. `evicted` holds each id of the saved state at most once, so it is bounded by the rows of
  // the last save.
  std::vector<std::uint64_t> changed_bits, created_bits;
  std::vector<std::int64_t> evicted;

  // Per-batch scratch, kept across calls so that steady batches allocate nothing.
  std::vector<std::uint32_t> batch_rows;
  std::vector<std::uint64_t> batch_hash;
  std::vector<std::uint64_t> dedup;  // (row + 1) << 32 | unique index, 0 = empty
  std::vector<float*> row_ptrs;
  std::vector<const float*> grad_ptrs;
  std::vector<std::uint32_t> sum_at;  // per unique row: its sum's offset in `sums`, or kNoRow
  std::vector<float> sums;
  std::uint8_t touch_sink = 0;   // prefetch_record's loads land here (never read)
  // update_rows: values, slots and gradients of a batch's rows, one buffer per part of a split
  // batch (part 0 also serves the unsplit one).
  std::vector<std::vector<float>> gathered = std::vector<std::vector<float>>(1);
  // A split batch (team below): per part, the ids found missing (lookup) and where its rows start
  // in row_ptrs (apply); a part's probes land their loads in its own sink.
  ApplyTeam* team = nullptr;
  std::int64_t split_batches = 0;
  std::vector<std::vector<std::uint32_t>> part_misses;
  std::vector<std::size_t> part_rows;
  std::vector<std::uint8_t> part_sinks;
  Shape row_shape;
  Initializer row_init;

  explicit Impl(const DynamicTableConfig& c) : cfg(c) {
    dim = static_cast<std::size_t>(c.dim);
    num_slot_arrays = num_slots(c.optimizer.kind);
    const std::size_t floats = dim * static_cast<std::size_t>(1 + num_slot_arrays);
    record_bytes = (kRecordHeader + floats * sizeof(float) + 7) / 8 * 8;
    // About 64 KiB pages (at least 16 records): the last page wastes at most that much, so small
    // tables stay within their memory budget too.
    page_shift = 4;
    while (page_shift < 20 && (record_bytes << (page_shift + 1)) <= (std::size_t{1} << 16)) ++page_shift;
    page_bytes = record_bytes << page_shift;
    row_bytes = floats * sizeof(float);
    pages_per_slab = std::max<std::size_t>(1, kHugePageBytes / page_bytes);
    slab_bytes = (pages_per_slab * page_bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    index_salt = dynamic_mix64(c.init.seed ^ kIndexSalt);
    if (c.admit_after > 1) {
      sketch.assign(static_cast<std::size_t>(DynamicTableConfig::kSketchDepth * c.sketch_width), 0);
      sketch_mask = static_cast<std::uint64_t>(c.sketch_width - 1);
    }
    row_shape = {1, c.dim};
    row_init = c.init;
    try_build(kMinIndexBits);  // empty: cannot fail
  }

  // ---- records ----
  std::uint8_t* record(std::uint32_t r) const {
    return pages[r >> page_shift] + (r & ((std::uint32_t{1} << page_shift) - 1)) * record_bytes;
  }
  std::int64_t id_of(std::uint32_t r) const {
    std::int64_t v;
    std::memcpy(&v, record(r), 8);
    return v;
  }
  std::int64_t stamp_of(std::uint32_t r) const {
    std::uint32_t v;
    std::memcpy(&v, record(r) + kStampAt, 4);
    return v == kFreeStampBits ? kFreeStamp : stamp_base + std::int64_t{v};
  }
  void set_id(std::uint32_t r, std::int64_t v) { std::memcpy(record(r), &v, 8); }
  // `v` is kFreeStamp or a step in [0, clock] (every caller checked its input and advanced the
  // clock first); a step below the base is stored as the base (see "Stamps beyond 32 bits").
  void set_stamp(std::uint32_t r, std::int64_t v) {
    const std::uint32_t bits =
        v == kFreeStamp ? kFreeStampBits : static_cast<std::uint32_t>(v <= stamp_base ? 0 : v - stamp_base);
    std::memcpy(record(r) + kStampAt, &bits, 4);
  }
  // Moves the clock to max(clock, step) (step in [0, kMaxDynamicStep]) and, when that moves the
  // stamp base, shifts every record's offset to the new base: one scan of the records, once every
  // kStampQuantum steps. Call before any stamp at the new clock is stored.
  void advance_clock(std::int64_t step) {
    if (step <= clock) return;
    clock = step;
    const std::int64_t base = base_for(clock);
    if (base == stamp_base) return;
    const std::uint64_t shift = static_cast<std::uint64_t>(base - stamp_base);
    for (std::uint32_t r = 0; r < fresh; ++r) {
      std::uint32_t v;
      std::memcpy(&v, record(r) + kStampAt, 4);
      if (v == kFreeStampBits) continue;
      v = v > shift ? static_cast<std::uint32_t>(v - shift) : 0;
      std::memcpy(record(r) + kStampAt, &v, 4);
    }
    stamp_base = base;
    candidates.clear();  // their stamps may have been raised to the base
    next_candidate = 0;
  }
  std::uint32_t count_of(std::uint32_t r) const {
    std::uint32_t v;
    std::memcpy(&v, record(r) + kCountAt, 4);
    return v;
  }
  void set_count(std::uint32_t r, std::uint32_t v) { std::memcpy(record(r) + kCountAt, &v, 4); }
  // One more applied update of the row whose values start at `values`; saturates at 2^32 - 1
  // rather than wrapping to a small count. Addressed from the values because the count sits just
  // before them (record bytes 12-15), on the line a batch's update loads anyway.
  static void bump_count(float* values) {
    std::uint8_t* at = reinterpret_cast<std::uint8_t*>(values) - kRecordHeader + kCountAt;
    std::uint32_t v;
    std::memcpy(&v, at, 4);
    if (v != std::numeric_limits<std::uint32_t>::max()) ++v;
    std::memcpy(at, &v, 4);
  }
  float* values(std::uint32_t r) const { return reinterpret_cast<float*>(record(r) + kRecordHeader); }

  std::uint32_t alloc_record() {
    if (free_head != kNoRow) {
      const std::uint32_t r = free_head;
      free_head = static_cast<std::uint32_t>(id_of(r));
      return r;
    }
    const std::uint32_t r = fresh++;
    if ((r >> page_shift) >= pages.size()) {
      add_page();
      const std::size_t words = ((pages.size() << page_shift) + 63) / 64;
      changed_bits.resize(words, 0);
      created_bits.resize(words, 0);
    }
    return r;
  }
  // Cuts the next page from the last slab, mapping a new slab when it is used up. Huge pages, two
  // ways (a huge fault is cheaper than the small faults plus a collapse of the same 2 MiB; the
  // measured costs are in docs/DYNAMIC.md, "the table on huge pages"):
  //   * at first touch, when the whole slab fits the memory budget of the rows held now
  //     (kHugeBudget x their values and slots, after what the table holds already): the slab then
  //     counts whole from the start;
  //   * else on 4 KiB pages, collapsed once its last page is handed out: its earlier pages are
  //     filled and the slack after the last one is less than a page (a slab whose slack would
  //     exceed 1/16 of it, with pages of more than 2 MiB, has only the blocks inside its pages
  //     collapsed). A small table never gets there, and one that does holds no more than before.
  // A refusal leaves 4 KiB pages either way.
  void add_page() {
    const std::size_t k = pages.size() % pages_per_slab;
    if (k == 0) {
      const double budget = kHugeBudget * static_cast<double>(live) * static_cast<double>(row_bytes);
      slab_huge_at_fault = static_cast<double>(bytes() + slab_bytes) <= budget;
      slabs.emplace_back(slab_bytes, slab_huge_at_fault ? MappedMemory::Huge::kAtFault : MappedMemory::Huge::kNo);
      if (slab_huge_at_fault) store_bytes += slab_bytes;
    }
    pages.push_back(reinterpret_cast<std::uint8_t*>(slabs.back().data()) + k * page_bytes);
    if (slab_huge_at_fault) return;
    store_bytes += page_bytes;
    if (k + 1 < pages_per_slab) return;
    const std::size_t used = pages_per_slab * page_bytes;
    const std::size_t span = (slab_bytes - used) * 16 <= slab_bytes ? slab_bytes : used;
    if (slabs.back().collapse(0, span) && span > used) store_bytes += span - used;
  }
  static bool bit(const std::vector<std::uint64_t>& bits, std::uint32_t r) { return (bits[r >> 6] >> (r & 63)) & 1; }
  void mark_changed(std::uint32_t r) { changed_bits[r >> 6] |= std::uint64_t{1} << (r & 63); }
  void mark_created(std::uint32_t r) {
    mark_changed(r);
    created_bits[r >> 6] |= std::uint64_t{1} << (r & 63);
  }
  void free_record(std::uint32_t r) {
    changed_bits[r >> 6] &= ~(std::uint64_t{1} << (r & 63));
    created_bits[r >> 6] &= ~(std::uint64_t{1} << (r & 63));
    set_id(r, static_cast<std::int64_t>(free_head));
    set_stamp(r, kFreeStamp);
    free_head = r;
  }

  // ---- index ----
  std::uint64_t hash(std::int64_t id) const { return mix64(static_cast<std::uint64_t>(id) ^ index_salt); }
  std::size_t home(std::uint64_t h) const { return static_cast<std::size_t>(h >> (64 - index_bits)); }
  std::size_t mask() const { return index.size() - 1; }

  std::uint32_t find(std::int64_t id, std::uint64_t h) const {
    const auto tag = static_cast<std::uint16_t>(h & 0xff);
    std::size_t pos = home(h);
    for (int d = 1;; ++d) {
      const Slot& s = index[pos];
      const int sd = dist_of(s.meta);
      if (sd < d) return kNoRow;  // empty, or a resident closer to home: the id would sit here
      if (sd == d && (s.meta & 0xff) == tag && id_of(s.row()) == id) return s.row();
      pos = (pos + 1) & mask();
    }
  }

  // Prefetches the index slots where a probe for hash `h` starts (a probe averages a few 6-byte
  // slots, so it may run into the next line).
  void prefetch_home(std::uint64_t h) const {
    const Slot* s = &index[home(h)];
    __builtin_prefetch(s);
    __builtin_prefetch(reinterpret_cast<const char*>(s) + 32);
  }

  // Prefetches the first `bytes` (at most kMaxPrefetchLines lines) of the record of the first slot
  // whose tag matches `h` on its probe path (the id is not compared: no record is read). Reads the
  // index only, so it never changes what find() returns.
  void prefetch_record(std::uint64_t h, std::size_t bytes, bool for_write, std::uint8_t& sink) const {
    const auto tag = static_cast<std::uint16_t>(h & 0xff);
    std::size_t pos = home(h);
    for (int d = 1;; ++d) {
      const Slot& s = index[pos];
      const int sd = dist_of(s.meta);
      if (sd < d) return;
      if (sd == d && (s.meta & 0xff) == tag) {
        const std::uint8_t* rec = record(s.row());
        // Every line the first `bytes` of the record touch (a record may start anywhere in a line).
        const auto at = reinterpret_cast<std::uintptr_t>(rec);
        const std::size_t lines = std::min(kMaxPrefetchLines, ((at + bytes - 1) >> 6) - (at >> 6) + 1);
        rec = reinterpret_cast<const std::uint8_t*>(at & ~std::uintptr_t{63});
        // For an update, a load rather than a prefetch of the first line: a prefetch that misses
        // the TLB may be dropped, and a table on 4 KiB pages has most records on pages the TLB
        // does not hold; the load walks the page tables (its value is not used). Lookups only
        // prefetch: their loop has too little work to hide a stalled load behind. (Figures, also
        // on huge pages: docs/DYNAMIC.md, "Between nodes".)
        std::size_t k = 0;
        if (for_write) {
          // Relaxed atomic: another part of a split update may restamp this record meanwhile
          // (restamp_shared); the byte's value is not used.
          sink = static_cast<std::uint8_t>(sink + __atomic_load_n(reinterpret_cast<const std::uint8_t*>(rec), __ATOMIC_RELAXED));
          k = 1;
        }
        for (; k < lines; ++k) {
          if (for_write)
            __builtin_prefetch(rec + 64 * k, 1);
          else
            __builtin_prefetch(rec + 64 * k, 0);
        }
        return;
      }
      pos = (pos + 1) & mask();
    }
  }

  // Robin Hood insertion of a record known to be absent. False when a probe distance would pass
  // kMaxDist (the index is then inconsistent and must be rebuilt).
  bool insert_slot(std::uint64_t h, std::uint32_t row) {
    std::uint16_t meta = static_cast<std::uint16_t>(1 << 8 | (h & 0xff));
    std::size_t pos = home(h);
    for (;;) {
      Slot& s = index[pos];
      if (s.meta == 0) {
        s.set(meta, row);
        return true;
      }
      if (dist_of(s.meta) < dist_of(meta)) {
        const std::uint16_t m = s.meta;
        const std::uint32_t r = s.row();
        s.set(meta, row);
        meta = m;
        row = r;
      }
      if (dist_of(meta) == kMaxDist) return false;
      meta = static_cast<std::uint16_t>(meta + (1 << 8));
      pos = (pos + 1) & mask();
    }
  }

  bool try_build(int bits) {
    const std::size_t count = std::size_t{1} << bits;
    if (index.size() == count) {
      std::memset(static_cast<void*>(index.slots), 0, count * sizeof(Slot));
    } else {
      index = IndexArray();  // the old array goes before the new one is mapped
      const std::size_t bytes = count * sizeof(Slot);
      index.memory = MappedMemory(bytes, bytes >= kHugePageBytes ? MappedMemory::Huge::kAtFault : MappedMemory::Huge::kNo);
      index.slots = reinterpret_cast<Slot*>(index.memory.data());  // fresh mappings read as zeros: every slot empty
      index.count = count;
    }
    index_bits = bits;
    // Records are read in order; the slots they land in are random, so prefetch a few ahead.
    constexpr std::uint32_t kAhead = 8;
    for (std::uint32_t r = 0; r < fresh; ++r) {
      if (r + kAhead < fresh) __builtin_prefetch(&index[home(hash(id_of(r + kAhead)))], 1);
      if (stamp_of(r) != kFreeStamp && !insert_slot(hash(id_of(r)), r)) return false;
    }
    return true;
  }

  // Largest index the capacity can justify: room for capacity rows at kMaxLoad, times 8 for
  // collisions. Bounds what hostile ids can make the index grow to.
  int max_index_bits() const {
    int bits = kMinIndexBits;
    while (bits < 34 && static_cast<double>(std::size_t{1} << bits) * kMaxLoad < static_cast<double>(cfg.capacity)) ++bits;
    return std::min(bits + 3, 34);
  }

  bool rebuild_index(int bits) {
    for (int b = bits; b <= std::max(bits, max_index_bits()); ++b)
      if (try_build(b)) return true;
    return false;
  }

  // Adds record `row` (live, counted in `live` already) to the index, growing the index when the
  // table passes kMaxLoad or a probe distance overflows. If no index size up to max_index_bits()
  // can place the ids, the record is freed again, the index rebuilt as it was (Robin Hood's
  // layout depends only on the set of ids, so the old size fits the old set), and Error thrown.
  void index_add(std::uint64_t h, std::uint32_t row) {
    const int before = index_bits;
    if (static_cast<double>(live) <= kMaxLoad * static_cast<double>(index.size()) && insert_slot(h, row)) return;
    if (rebuild_index(index_bits + 1)) return;
    free_record(row);
    --live;
    const bool restored = rebuild_index(before);
    STRATA_CHECK(restored, "dynamic table: the index could not be rebuilt at its previous size");
    throw Error("dynamic table: the index cannot place its ids within " + std::to_string(kMaxDist) +
                " slots of their home even at " + std::to_string(std::size_t{1} << max_index_bits()) +
                " slots (ids crafted to collide in the index hash?)");
  }

  void index_remove(std::int64_t id, std::uint32_t row) {
    std::size_t pos = home(hash(id));
    while (index[pos].row() != row || index[pos].meta == 0) pos = (pos + 1) & mask();
    // Backward shift: pull the rest of the cluster one slot towards home.
    for (;;) {
      const std::size_t next = (pos + 1) & mask();
      const Slot& n = index[next];
      if (dist_of(n.meta) <= 1) break;
      index[pos].set(static_cast<std::uint16_t>(n.meta - (1 << 8)), n.row());
      pos = next;
    }
    index[pos].set(0, 0);
  }

  // ---- admission ----
  std::size_t sketch_cell(std::uint64_t h1, std::uint64_t h2, int d) const {
    return static_cast<std::size_t>(d) * (sketch_mask + 1) + static_cast<std::size_t>((h1 + static_cast<std::uint64_t>(d) * h2) & sketch_mask);
  }
  // Count-min estimate of `id`'s sightings; with `count`, records one more sighting first
  // (conservative update: only the counters at the minimum grow).
  std::int64_t sightings(std::int64_t id, bool count) {
    const std::uint64_t h1 = dynamic_mix64(static_cast<std::uint64_t>(id) ^ kSketchSalt);
    const std::uint64_t h2 = dynamic_mix64(h1) | 1;  // odd: the depths probe distinct cells
    std::uint16_t low = std::numeric_limits<std::uint16_t>::max();
    for (int d = 0; d < DynamicTableConfig::kSketchDepth; ++d) low = std::min(low, sketch[sketch_cell(h1, h2, d)]);
    if (!count || low >= cfg.admit_after || low == std::numeric_limits<std::uint16_t>::max()) return low;
    for (int d = 0; d < DynamicTableConfig::kSketchDepth; ++d) {
      std::uint16_t& c = sketch[sketch_cell(h1, h2, d)];
      if (c == low) ++c;
    }
    return low + 1;
  }
  // With rounds, a sighting is held for end_round() and the decision uses the counted state plus it.
  bool admitted(std::int64_t id, bool count) {
    if (cfg.admit_after <= 1) return true;
    if (!cfg.round_boundaries) return sightings(id, count) >= cfg.admit_after;
    if (count) held_sightings.push_back(id);
    return sightings(id, false) + 1 >= cfg.admit_after;
  }
  std::vector<std::int64_t> held_sightings;  // with rounds: this round's training lookups' ids

  // ---- eviction ----
  // Removes a live row (eviction): an id of the saved state goes on the evicted list.
  void remove_row(std::uint32_t r) {
    if (!bit(created_bits, r)) evicted.push_back(id_of(r));
    index_remove(id_of(r), r);
    free_record(r);
    --live;
  }

  // The oldest live rows stamped before the clock, oldest first: a bounded max-heap over one scan.
  void refill_candidates() {
    candidates.clear();
    next_candidate = 0;
    const std::size_t keep = std::max<std::size_t>(64, static_cast<std::size_t>(live / 32));
    std::priority_queue<Candidate> heap;  // largest on top
    for (std::uint32_t r = 0; r < fresh; ++r) {
      const std::int64_t s = stamp_of(r);
      if (s == kFreeStamp || s >= clock) continue;
      const Candidate c{s, id_of(r), r};
      if (heap.size() < keep) {
        heap.push(c);
      } else if (c < heap.top()) {
        heap.pop();
        heap.push(c);
      }
    }
    candidates.resize(heap.size());
    for (std::size_t i = heap.size(); i-- > 0;) {
      candidates[i] = heap.top();
      heap.pop();
    }
  }

  // Removes the least-recently-updated row stamped before the clock; false when there is none.
  // A scan that found nothing is not repeated until the clock moves (or an import brings rows),
  // so a batch of new ids at a full table of current rows costs one scan, not one per id.
  bool evict_one() {
    bool scanned = false;
    for (;;) {
      while (next_candidate < candidates.size()) {
        const Candidate& c = candidates[next_candidate++];
        if (stamp_of(c.row) == c.stamp && id_of(c.row) == c.id && c.stamp < clock) {
          remove_row(c.row);
          ++counters.evicted_capacity;
          return true;
        }
      }
      if (scanned || empty_scan_clock == clock) return false;
      refill_candidates();
      scanned = true;
      if (candidates.empty()) empty_scan_clock = clock;
    }
  }

  // ---- rows ----
  void init_row(std::uint32_t r, std::int64_t id) {
    float* v = values(r);
    row_init.seed = row_seed(cfg.init.seed, id);
    fill(row_init, DType::kF32, row_shape, 0, 1, v);
    for (int k = 0; k < num_slot_arrays; ++k)
      std::fill(v + (k + 1) * dim, v + (k + 2) * dim, static_cast<float>(slot_initial_value(cfg.optimizer, k)));
  }

  // Creates the row of an absent, admitted id; kNoRow when the table is full and nothing can go.
  std::uint32_t create(std::int64_t id, std::uint64_t h) {
    // With rounds, capacity is restored at end_round(); within a round the table may grow to four
    // times it (the index has room for eight, max_index_bits).
    const bool room = cfg.round_boundaries ? live < std::min(4 * cfg.capacity, DynamicTableConfig::kMaxCapacity)
                                           : live < cfg.capacity || evict_one();
    if (!room) {
      ++counters.rejected_full;
      return kNoRow;
    }
    const std::uint32_t r = alloc_record();
    set_id(r, id);
    set_stamp(r, clock);
    set_count(r, 0);
    init_row(r, id);
    ++live;
    index_add(h, r);
    mark_created(r);
    ++counters.admitted;
    return r;
  }

  // One id of a lookup, its hash `h` at hand: its row copied to `dst`; without one, a training
  // lookup counts the sighting and creates the row when the id is admitted (rejected_lookups
  // otherwise), and zeros are written where no row results.
  void lookup_one(std::int64_t id, std::uint64_t h, float* dst, bool train) {
    std::uint32_t r = find(id, h);
    if (r == kNoRow && train) {
      if (admitted(id, /*count=*/true))
        r = create(id, h);
      else
        ++counters.rejected_lookups;
    }
    if (r == kNoRow)
      std::memset(dst, 0, dim * sizeof(float));
    else
      std::memcpy(dst, values(r), dim * sizeof(float));
  }

  // One optimizer update of each row of row_ptrs[begin, end) with its gradient at grad_ptrs (distinct
  // rows), gathering into `buffer`; parts of a split batch run it on disjoint ranges at once.
  // The rows' values, slots and gradients are gathered, a block of rows at a time, into one
  // contiguous array each, updated by one apply_dense per block, and written back. The result is
  // bit-identical to updating row by row with apply_rows: the optimizer contract
  // (strata/ps/optimizer.h) updates every element independently of its neighbours and of its
  // address. It is faster because a record's values sit 16 bytes into it, so a row of 16 floats
  // is never aligned to a 64-byte vector and Eigen would update it one element at a time; the
  // gathered arrays are vectorised end to end. Blocks of about 4 KiB per array (apply_dense's own
  // chunk) keep the gathered copies in L1 between the gather, the update and the write-back,
  // where one gather of a whole batch streams it through L2 three times.
  void update_rows(const OptimizerConfig& optimizer, std::int64_t step, std::size_t begin, std::size_t end,
                   std::vector<float>& buffer) const {
    if (begin >= end) return;
    const std::size_t m = end - begin;
    const std::size_t arrays = 1 + static_cast<std::size_t>(num_slot_arrays);
    const std::size_t block = std::max<std::size_t>(1, 1024 / dim);
    const std::size_t cap = std::min(block, m) * dim;
    if (buffer.size() < (arrays + 1) * cap) buffer.resize((arrays + 1) * cap);  // values, slots..., gradients
    float* g = buffer.data() + arrays * cap;
    float* slot_arrays[2] = {nullptr, nullptr};
    for (std::size_t a = 1; a < arrays; ++a) slot_arrays[a - 1] = buffer.data() + a * cap;
    for (std::size_t first = begin; first < end; first += block) {
      const std::size_t rows = std::min(block, end - first);
      for (std::size_t u = 0; u < rows; ++u) {
        float* row = row_ptrs[first + u];
        bump_count(row);  // once per row and batch: row_ptrs holds each row once
        for (std::size_t a = 0; a < arrays; ++a)
          std::memcpy(buffer.data() + a * cap + u * dim, row + a * dim, dim * sizeof(float));
        std::memcpy(g + u * dim, grad_ptrs[first + u], dim * sizeof(float));
      }
      apply_dense(optimizer, step, buffer.data(), slot_arrays, g, rows * dim);
      for (std::size_t u = 0; u < rows; ++u)
        for (std::size_t a = 0; a < arrays; ++a)
          std::memcpy(row_ptrs[first + u] + a * dim, buffer.data() + a * cap + u * dim, dim * sizeof(float));
    }
  }

  // ---- split batches ----
  // Parts a batch of n ids is split into: 1 without a team or below kMinIdsPerPart ids a part.
  int parts_for(std::size_t n) const {
    if (team == nullptr || team->size() < 2 || n > (std::size_t{1} << 31)) return 1;
    return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(team->size()), n / kMinIdsPerPart));
  }
  // [begin, end) of part p of n ids in `parts` contiguous parts, in order.
  static void part_range(std::size_t n, int parts, int p, std::size_t* begin, std::size_t* end) {
    *begin = n * static_cast<std::size_t>(p) / static_cast<std::size_t>(parts);
    *end = n * static_cast<std::size_t>(p + 1) / static_cast<std::size_t>(parts);
  }
  void size_parts(int parts) {
    if (part_misses.size() < static_cast<std::size_t>(parts)) part_misses.resize(static_cast<std::size_t>(parts));
    if (gathered.size() < static_cast<std::size_t>(parts)) gathered.resize(static_cast<std::size_t>(parts));
    part_rows.assign(static_cast<std::size_t>(parts) + 1, 0);
    part_sinks.assign(static_cast<std::size_t>(parts), 0);
  }
  // The stamp and the changed bit of a row found by a part of a split update. Two parts may find
  // the same row (an id listed in both) and store the same stamp; the bit's word is shared with
  // 63 other records that another part may mark. Both are atomic, so parts never race.
  void restamp_shared(std::uint32_t r) {
    auto* at = reinterpret_cast<std::uint32_t*>(record(r) + kStampAt);  // 4-aligned: records are 8-aligned
    const auto now = static_cast<std::uint32_t>(clock - stamp_base);
    if (__atomic_load_n(at, __ATOMIC_RELAXED) != now) __atomic_store_n(at, now, __ATOMIC_RELAXED);
    std::uint64_t* word = &changed_bits[r >> 6];
    const std::uint64_t bit = std::uint64_t{1} << (r & 63);
    if ((__atomic_load_n(word, __ATOMIC_RELAXED) & bit) == 0) __atomic_fetch_or(word, bit, __ATOMIC_RELAXED);
  }

  std::size_t gathered_bytes() const {
    std::size_t b = 0;
    for (const auto& g : gathered) b += g.capacity() * sizeof(float);
    for (const auto& m : part_misses) b += m.capacity() * sizeof(std::uint32_t);
    return b;
  }

  std::int64_t bytes() const {
    std::size_t b = sizeof(Impl) + store_bytes + pages.capacity() * sizeof(pages[0]) +
                    slabs.capacity() * sizeof(slabs[0]) + index.memory.size() + sketch.capacity() * sizeof(std::uint16_t) +
                    candidates.capacity() * sizeof(Candidate) + held_sightings.capacity() * sizeof(std::int64_t) +
                    batch_rows.capacity() * sizeof(std::uint32_t) +
                    batch_hash.capacity() * sizeof(std::uint64_t) + dedup.capacity() * sizeof(std::uint64_t) +
                    row_ptrs.capacity() * sizeof(float*) + grad_ptrs.capacity() * sizeof(float*) +
                    sum_at.capacity() * sizeof(std::uint32_t) + sums.capacity() * sizeof(float) +
                    gathered_bytes() +
                    (changed_bits.capacity() + created_bits.capacity()) * sizeof(std::uint64_t) +
                    evicted.capacity() * sizeof(std::int64_t);
    return static_cast<std::int64_t>(b);
  }
};

// ---- public -----------------------------------------------------------------------------------

namespace {

DynamicTableConfig validated(const DynamicTableConfig& c) {
  c.validate();
  return c;
}

// n rows of dim floats, in bytes, or an Error when that does not fit a size_t.
std::size_t batch_floats(const char* what, std::size_t n, std::size_t dim) {
  STRATA_CHECK(n <= std::numeric_limits<std::size_t>::max() / sizeof(float) / dim, what, ": ", n, " rows of ", dim,
               " floats overflow size_t");
  return n * dim;
}

}  // namespace

DynamicTable::DynamicTable(const DynamicTableConfig& config)
    : config_(validated(config)), impl_(std::make_unique<Impl>(config_)) {}

DynamicTable::~DynamicTable() = default;

std::int64_t DynamicTable::size() const { return impl_->live; }

void DynamicTable::lookup(const std::int64_t* ids, std::size_t n, float* out, LookupMode mode) {
  Impl& t = *impl_;
  if (n == 0) return;
  STRATA_CHECK(ids != nullptr && out != nullptr, "dynamic table lookup: null ids or out with n = ", n);
  batch_floats("dynamic table lookup", n, t.dim);
  const int parts = t.parts_for(n);
  if (parts > 1 && lookup_split(ids, n, out, mode, parts))
    ++t.split_batches;
  else
    lookup_serial(ids, n, out, mode);
  t.counters.lookups += static_cast<std::int64_t>(n);
}

void DynamicTable::lookup_serial(const std::int64_t* ids, std::size_t n, float* out, LookupMode mode) {
  Impl& t = *impl_;
  const std::size_t row_bytes = t.dim * sizeof(float);
  const std::size_t touched = kRecordHeader + row_bytes;  // id, stamp, values
  // Hashes of ids [i, i + kIndexAhead), by id index modulo kIndexAhead (see kIndexAhead).
  std::uint64_t ring[kIndexAhead];
  for (std::size_t i = 0; i < std::min(n, kIndexAhead); ++i) {
    ring[i] = t.hash(ids[i]);
    t.prefetch_home(ring[i]);
  }
  for (std::size_t i = 0; i < std::min(n, kRecordAhead); ++i) t.prefetch_record(ring[i], touched, false, t.touch_sink);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t id = ids[i];
    const std::uint64_t h = ring[i % kIndexAhead];
    if (i + kIndexAhead < n) {
      const std::uint64_t ahead = t.hash(ids[i + kIndexAhead]);
      ring[i % kIndexAhead] = ahead;
      t.prefetch_home(ahead);
    }
    if (i + kRecordAhead < n) t.prefetch_record(ring[(i + kRecordAhead) % kIndexAhead], touched, false, t.touch_sink);
    t.lookup_one(id, h, out + i * t.dim, mode == LookupMode::kTrain);
  }
}

// A lookup split over the team: every part finds its ids and copies the rows found (reading only:
// the index and the records do not change while the parts run), noting the ids without a row;
// then this thread handles those, in id order, exactly as lookup_serial would (admission counts,
// creations, rejections; a later duplicate of a created id finds its row). That equals the serial
// lookup as long as no creation can evict a row, since a row a part copied stays as it was; when
// one could (at capacity, without rounds), false is returned having changed nothing but `out`,
// and the caller looks the batch up serially.
bool DynamicTable::lookup_split(const std::int64_t* ids, std::size_t n, float* out, LookupMode mode, int parts) {
  Impl& t = *impl_;
  const std::size_t row_bytes = t.dim * sizeof(float);
  const std::size_t touched = kRecordHeader + row_bytes;
  const bool train = mode == LookupMode::kTrain;
  t.size_parts(parts);
  t.team->run(parts, [&](int p) {
    std::size_t begin, end;
    Impl::part_range(n, parts, p, &begin, &end);
    std::vector<std::uint32_t>& misses = t.part_misses[static_cast<std::size_t>(p)];
    misses.clear();
    std::uint8_t& sink = t.part_sinks[static_cast<std::size_t>(p)];
    const std::size_t count = end - begin;
    const std::int64_t* part_ids = ids + begin;
    std::uint64_t ring[kIndexAhead];
    for (std::size_t i = 0; i < std::min(count, kIndexAhead); ++i) {
      ring[i] = t.hash(part_ids[i]);
      t.prefetch_home(ring[i]);
    }
    for (std::size_t i = 0; i < std::min(count, kRecordAhead); ++i) t.prefetch_record(ring[i], touched, false, sink);
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint64_t h = ring[i % kIndexAhead];
      if (i + kIndexAhead < count) {
        const std::uint64_t ahead = t.hash(part_ids[i + kIndexAhead]);
        ring[i % kIndexAhead] = ahead;
        t.prefetch_home(ahead);
      }
      if (i + kRecordAhead < count) t.prefetch_record(ring[(i + kRecordAhead) % kIndexAhead], touched, false, sink);
      float* dst = out + (begin + i) * t.dim;
      const std::uint32_t r = t.find(part_ids[i], h);
      if (r != kNoRow) {
        std::memcpy(dst, t.values(r), row_bytes);
      } else if (train) {
        misses.push_back(static_cast<std::uint32_t>(begin + i));
      } else {
        std::memset(dst, 0, row_bytes);
      }
    }
  });
  if (!train) return true;
  std::size_t missing = 0;
  for (int p = 0; p < parts; ++p) missing += t.part_misses[static_cast<std::size_t>(p)].size();
  if (missing == 0) return true;
  if (!t.cfg.round_boundaries && t.live + static_cast<std::int64_t>(missing) > t.cfg.capacity) return false;
  for (int p = 0; p < parts; ++p) {
    for (const std::uint32_t i : t.part_misses[static_cast<std::size_t>(p)])
      t.lookup_one(ids[i], t.hash(ids[i]), out + std::size_t{i} * t.dim, /*train=*/true);
  }
  return true;
}

void DynamicTable::apply(const std::int64_t* ids, std::size_t n, const float* grads, std::int64_t step) {
  Impl& t = *impl_;
  STRATA_CHECK(step >= 1 && step <= kMaxDynamicStep, "dynamic table apply: step must be in [1, ", kMaxDynamicStep,
               "] (1-based count of updates), got ", step);
  if (n == 0) return;
  STRATA_CHECK(ids != nullptr && grads != nullptr, "dynamic table apply: null ids or grads with n = ", n);
  batch_floats("dynamic table apply", n, t.dim);
  STRATA_CHECK(n <= (std::size_t{1} << 31), "dynamic table apply: ", n, " ids in one batch (at most 2^31)");
  t.advance_clock(step);
  // Pass 1: rows already present, restamped at once so that no creation below can evict them.
  // Split over the team, each part takes a contiguous range of ids (and later the rows first
  // named in it, whose records its probes brought into its core's cache).
  t.batch_rows.resize(n);
  t.batch_hash.resize(n);
  const int parts = t.parts_for(n);
  auto find_range = [&](std::size_t begin, std::size_t end, std::uint8_t& sink, bool shared) {
    for (std::size_t i = begin; i < end; ++i) t.batch_hash[i] = t.hash(ids[i]);
    // The whole record is prefetched for writing: the stamp now, values and slots in update_rows.
    for (std::size_t i = begin; i < std::min(end, begin + kIndexAhead); ++i) t.prefetch_home(t.batch_hash[i]);
    for (std::size_t i = begin; i < std::min(end, begin + kRecordAhead); ++i)
      t.prefetch_record(t.batch_hash[i], t.record_bytes, true, sink);
    for (std::size_t i = begin; i < end; ++i) {
      if (i + kIndexAhead < end) t.prefetch_home(t.batch_hash[i + kIndexAhead]);
      if (i + kRecordAhead < end) t.prefetch_record(t.batch_hash[i + kRecordAhead], t.record_bytes, true, sink);
      const std::uint32_t r = t.find(ids[i], t.batch_hash[i]);
      t.batch_rows[i] = r;
      if (r == kNoRow) continue;
      if (shared) {
        t.restamp_shared(r);
      } else {
        t.set_stamp(r, t.clock);
        t.mark_changed(r);
      }
    }
  };
  if (parts > 1) {
    ++t.split_batches;
    t.size_parts(parts);
    t.team->run(parts, [&](int p) {
      std::size_t begin, end;
      Impl::part_range(n, parts, p, &begin, &end);
      find_range(begin, end, t.part_sinks[static_cast<std::size_t>(p)], true);
    });
  } else {
    find_range(0, n, t.touch_sink, false);
  }
  // Pass 2: admitted ids without a row get one (an id repeated in the batch finds the row its
  // first occurrence created); the others' gradients are dropped.
  for (std::size_t i = 0; i < n; ++i) {
    if (t.batch_rows[i] != kNoRow) continue;
    std::uint32_t r = t.find(ids[i], t.batch_hash[i]);
    if (r == kNoRow) {
      if (t.admitted(ids[i], /*count=*/false)) r = t.create(ids[i], t.batch_hash[i]);
      else ++t.counters.rejected_updates;
    }
    t.batch_rows[i] = r;
  }
  // Group duplicates: one update per row with the gradients summed in order of appearance,
  // starting from the first (a lone -0.0 stays -0.0), as apply_sparse_rows does.
  std::size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  t.dedup.assign(cap, 0);
  t.row_ptrs.clear();
  t.grad_ptrs.clear();
  t.sum_at.clear();
  std::size_t sums_used = 0;
  int next_part = 1;  // of a split batch: the part whose first id comes next
  for (std::size_t i = 0; i < n; ++i) {
    if (parts > 1) {
      while (next_part < parts) {
        std::size_t begin, end;
        Impl::part_range(n, parts, next_part, &begin, &end);
        if (i < begin) break;
        t.part_rows[static_cast<std::size_t>(next_part++)] = t.row_ptrs.size();
      }
    }
    const std::uint32_t r = t.batch_rows[i];
    if (r == kNoRow) continue;
    const float* g = grads + i * t.dim;
    std::size_t pos = static_cast<std::size_t>((std::uint64_t{r} * 0x9E3779B97F4A7C15ull) >> 40) & (cap - 1);
    while (t.dedup[pos] != 0 && (t.dedup[pos] >> 32) != std::uint64_t{r} + 1) pos = (pos + 1) & (cap - 1);
    if (t.dedup[pos] == 0) {
      t.dedup[pos] = (std::uint64_t{r} + 1) << 32 | t.row_ptrs.size();
      t.row_ptrs.push_back(t.values(r));
      t.grad_ptrs.push_back(g);
      t.sum_at.push_back(kNoRow);
      continue;
    }
    const auto u = static_cast<std::size_t>(static_cast<std::uint32_t>(t.dedup[pos]));
    if (t.sum_at[u] == kNoRow) {
      // At most n / 2 rows repeat: n * dim floats hold every sum. Sized before the first pointer
      // into it is taken, so it never moves under one.
      if (sums_used == 0 && t.sums.size() < n * t.dim) t.sums.resize(n * t.dim);
      t.sum_at[u] = static_cast<std::uint32_t>(sums_used / t.dim);
      std::memcpy(t.sums.data() + sums_used, t.grad_ptrs[u], t.dim * sizeof(float));
      t.grad_ptrs[u] = t.sums.data() + sums_used;
      sums_used += t.dim;
    }
    float* acc = t.sums.data() + std::size_t{t.sum_at[u]} * t.dim;
    for (std::size_t k = 0; k < t.dim; ++k) acc[k] += g[k];
  }
  if (parts > 1) {
    // Rows first named in part p's ids are updated by part p (the rows are distinct, and each
    // element's update is independent of the others, so the split changes no bit).
    while (next_part < parts) t.part_rows[static_cast<std::size_t>(next_part++)] = t.row_ptrs.size();
    t.part_rows[static_cast<std::size_t>(parts)] = t.row_ptrs.size();
    const OptimizerConfig& optimizer = config_.optimizer;
    t.team->run(parts, [&](int p) {
      const auto q = static_cast<std::size_t>(p);
      t.update_rows(optimizer, step, t.part_rows[q], t.part_rows[q + 1], t.gathered[q]);
    });
  } else {
    t.update_rows(config_.optimizer, step, 0, t.row_ptrs.size(), t.gathered[0]);
  }
  t.counters.updates += static_cast<std::int64_t>(t.row_ptrs.size());
}

void DynamicTable::use_team(ApplyTeam* team) { impl_->team = team; }

std::int64_t DynamicTable::split_batches() const { return impl_->split_batches; }

std::int64_t DynamicTable::end_round() {
  Impl& t = *impl_;
  if (!t.cfg.round_boundaries) return 0;
  std::sort(t.held_sightings.begin(), t.held_sightings.end());
  for (const std::int64_t id : t.held_sightings) t.sightings(id, /*count=*/true);
  t.held_sightings.clear();
  std::int64_t evicted = 0;
  while (t.live > t.cfg.capacity && t.evict_one()) ++evicted;
  return evicted;
}

std::int64_t DynamicTable::evict_older_than(std::int64_t global_step, std::int64_t ttl) {
  Impl& t = *impl_;
  STRATA_CHECK(global_step >= 0 && global_step <= kMaxDynamicStep, "dynamic table evict_older_than: global_step must be in [0, ",
               kMaxDynamicStep, "], got ", global_step);
  STRATA_CHECK(ttl >= 1, "dynamic table evict_older_than: ttl must be >= 1 step, got ", ttl);
  t.advance_clock(global_step);
  const std::int64_t limit = global_step - ttl;  // no overflow: global_step >= 0, ttl >= 1
  std::int64_t removed = 0;
  for (std::uint32_t r = 0; r < t.fresh; ++r) {
    const std::int64_t s = t.stamp_of(r);
    if (s != kFreeStamp && s <= limit) {
      t.remove_row(r);
      ++removed;
    }
  }
  t.counters.evicted_ttl += removed;
  return removed;
}

void DynamicTable::decay_admission_counts() {
  for (std::uint16_t& c : impl_->sketch) c = static_cast<std::uint16_t>(c >> 1);
}

DynamicTableSnapshot DynamicTable::export_rows() const {
  const Impl& t = *impl_;
  std::vector<std::uint32_t> records;
  records.reserve(static_cast<std::size_t>(t.live));
  for (std::uint32_t r = 0; r < t.fresh; ++r)
    if (t.stamp_of(r) != kFreeStamp) records.push_back(r);
  return export_records(records);
}

DynamicTableSnapshot DynamicTable::export_records(const std::vector<std::uint32_t>& records) const {
  const Impl& t = *impl_;
  std::vector<std::pair<std::int64_t, std::uint32_t>> order;
  order.reserve(records.size());
  for (std::uint32_t r : records) order.emplace_back(t.id_of(r), r);
  std::sort(order.begin(), order.end());
  DynamicTableSnapshot s;
  s.dim = config_.dim;
  s.sketch_width = t.sketch.empty() ? 0 : config_.sketch_width;
  const std::size_t n = order.size();
  s.ids.resize(n);
  s.stamps.resize(n);
  s.update_counts.resize(n);
  s.values.resize(n * t.dim);
  s.slots.assign(static_cast<std::size_t>(t.num_slot_arrays), std::vector<float>(n * t.dim));
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t r = order[i].second;
    s.ids[i] = order[i].first;
    s.stamps[i] = t.stamp_of(r);
    s.update_counts[i] = t.count_of(r);
    const float* v = t.values(r);
    std::memcpy(s.values.data() + i * t.dim, v, t.dim * sizeof(float));
    for (int k = 0; k < t.num_slot_arrays; ++k)
      std::memcpy(s.slots[static_cast<std::size_t>(k)].data() + i * t.dim, v + (k + 1) * t.dim, t.dim * sizeof(float));
  }
  s.clock = t.clock;
  s.sketch = t.sketch;
  s.stats = stats();
  return s;
}

namespace {

// How an import treats the table-wide state of the snapshot (counters and admission sketch).
enum class ImportMode {
  kRestore,  // a whole snapshot into this table: counters added, sketch added cell by cell
  kReshard,  // one of several old shards: counters left alone, sketch added cell by cell
  kDelta,    // a delta onto a restored base, whole: counters and sketch replaced by the delta's
  kDeltaReshard,  // a delta onto one of several new shards: counters alone, sketch cellwise max
};

}  // namespace

void DynamicTable::import_rows(const DynamicTableSnapshot& snap, int shard, int num_shards) {
  import_snapshot(snap, {}, shard, num_shards, false);
}

void DynamicTable::apply_delta(const DynamicTableDelta& delta, int shard, int num_shards) {
  import_snapshot(delta.rows, delta.evicted_ids, shard, num_shards, true);
}

void DynamicTable::import_snapshot(const DynamicTableSnapshot& snap, const std::vector<std::int64_t>& removed,
                                   int shard, int num_shards, bool delta) {
  Impl& t = *impl_;
  const ImportMode mode = delta ? (num_shards == 1 ? ImportMode::kDelta : ImportMode::kDeltaReshard)
                                : (num_shards == 1 ? ImportMode::kRestore : ImportMode::kReshard);
  auto bad = [](const std::string& why) { throw Error("dynamic table snapshot: " + why); };
  if (num_shards < 1 || shard < 0 || shard >= num_shards)
    bad("shard " + std::to_string(shard) + " of " + std::to_string(num_shards) + " does not exist");
  if (snap.dim != config_.dim)
    bad("dim " + std::to_string(snap.dim) + " does not match the table's " + std::to_string(config_.dim));
  const std::size_t n = snap.ids.size();
  std::size_t floats = 0;
  if (__builtin_mul_overflow(n, t.dim, &floats)) bad("row count " + std::to_string(n) + " overflows");
  if (snap.values.size() != floats)
    bad("values hold " + std::to_string(snap.values.size()) + " floats, expected " + std::to_string(n) + " x " +
        std::to_string(t.dim));
  if (snap.slots.size() != static_cast<std::size_t>(t.num_slot_arrays))
    bad(std::to_string(snap.slots.size()) + " slot arrays, the optimizer " + to_string(config_.optimizer.kind) + " has " +
        std::to_string(t.num_slot_arrays));
  for (std::size_t k = 0; k < snap.slots.size(); ++k)
    if (snap.slots[k].size() != floats)
      bad("slot " + std::to_string(k) + " holds " + std::to_string(snap.slots[k].size()) + " floats, expected " +
          std::to_string(floats));
  if (snap.stamps.size() != n)
    bad(std::to_string(snap.stamps.size()) + " stamps for " + std::to_string(n) + " ids");
  if (!snap.update_counts.empty() && snap.update_counts.size() != n)
    bad(std::to_string(snap.update_counts.size()) + " update counts for " + std::to_string(n) +
        " ids (none, or one per id)");
  if (snap.clock < 0 || snap.clock > kMaxDynamicStep)
    bad("clock " + std::to_string(snap.clock) + " is outside [0, " + std::to_string(kMaxDynamicStep) + "]");
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && snap.ids[i] <= snap.ids[i - 1])
      bad("ids are not strictly increasing at index " + std::to_string(i) + " (" + std::to_string(snap.ids[i - 1]) +
          ", " + std::to_string(snap.ids[i]) + ")");
    if (snap.stamps[i] < 0 || snap.stamps[i] > kMaxDynamicStep)
      bad("stamp " + std::to_string(snap.stamps[i]) + " of id " + std::to_string(snap.ids[i]) + " is outside [0, " +
          std::to_string(kMaxDynamicStep) + "]");
  }
  // Evicted ids: strictly increasing and none of them also a row of the delta (both sorted).
  for (std::size_t i = 0, j = 0; i < removed.size(); ++i) {
    if (i > 0 && removed[i] <= removed[i - 1])
      bad("evicted ids are not strictly increasing at index " + std::to_string(i) + " (" +
          std::to_string(removed[i - 1]) + ", " + std::to_string(removed[i]) + ")");
    while (j < n && snap.ids[j] < removed[i]) ++j;
    if (j < n && snap.ids[j] == removed[i]) bad("id " + std::to_string(removed[i]) + " is both evicted and a row");
  }
  const bool sketch_matches = !t.sketch.empty() && snap.sketch_width == config_.sketch_width;
  if (!snap.sketch.empty()) {
    if (snap.sketch_width < 1 || snap.sketch_width > (std::int64_t{1} << 26) ||
        snap.sketch.size() != static_cast<std::size_t>(DynamicTableConfig::kSketchDepth * snap.sketch_width))
      bad("sketch holds " + std::to_string(snap.sketch.size()) + " counters for width " +
          std::to_string(snap.sketch_width));
  }
  auto mine = [&](std::int64_t id) { return num_shards == 1 || shard_of(id, num_shards) == shard; };
  // Room: rows of this shard that are not here yet, less the rows the delta removes.
  std::int64_t added = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (mine(snap.ids[i]) && t.find(snap.ids[i], t.hash(snap.ids[i])) == kNoRow) ++added;
  for (std::int64_t id : removed)
    if (mine(id) && t.find(id, t.hash(id)) != kNoRow) --added;
  if (t.live + added > config_.capacity)
    bad(std::to_string(added) + " new rows do not fit: " + std::to_string(t.live) + " rows of capacity " +
        std::to_string(config_.capacity));

  // Checked: now change the table. The clock first, so that every stamp below is stored against
  // the base of the clock the import ends at. Removals of a delta are not evictions of this table
  // (the delta's counters already count them) and leave no trace in its delta tracking.
  t.advance_clock(std::max(snap.clock, snap.stamps.empty() ? 0 : *std::max_element(snap.stamps.begin(), snap.stamps.end())));
  for (std::int64_t id : removed) {
    if (!mine(id)) continue;
    const std::uint32_t r = t.find(id, t.hash(id));
    if (r == kNoRow) continue;
    t.index_remove(id, r);
    t.free_record(r);
    --t.live;
  }
  std::int64_t taken = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t id = snap.ids[i];
    if (!mine(id)) continue;
    const std::uint64_t h = t.hash(id);
    std::uint32_t r = t.find(id, h);
    if (r == kNoRow) {
      r = t.alloc_record();
      t.set_id(r, id);
      t.set_stamp(r, snap.stamps[i]);
      ++t.live;
      t.index_add(h, r);
      t.mark_created(r);
    }
    t.mark_changed(r);
    t.set_stamp(r, snap.stamps[i]);
    t.set_count(r, snap.update_counts.empty() ? 0 : snap.update_counts[i]);  // none: a file from before the counts
    float* v = t.values(r);
    std::memcpy(v, snap.values.data() + i * t.dim, t.dim * sizeof(float));
    for (int k = 0; k < t.num_slot_arrays; ++k)
      std::memcpy(v + (k + 1) * t.dim, snap.slots[static_cast<std::size_t>(k)].data() + i * t.dim, t.dim * sizeof(float));
    ++taken;
  }
  if (sketch_matches && !snap.sketch.empty()) {
    for (std::size_t c = 0; c < t.sketch.size(); ++c) {
      const std::uint32_t mine_c = t.sketch[c], theirs = snap.sketch[c];
      std::uint32_t v = std::min<std::uint32_t>(0xffff, mine_c + theirs);
      if (mode == ImportMode::kDelta) v = theirs;
      if (mode == ImportMode::kDeltaReshard) v = std::max(mine_c, theirs);
      t.sketch[c] = static_cast<std::uint16_t>(v);
    }
  }
  t.candidates.clear();  // the scan's view is stale
  t.next_candidate = 0;
  t.empty_scan_clock = -1;
  const DynamicTableStats& s = snap.stats;
  if (mode == ImportMode::kDelta) {
    // The delta's counters are the table's at the later save; `imported` keeps counting here.
    const std::int64_t imported = t.counters.imported;
    t.counters = s;
    t.counters.imported = imported;
  } else if (mode == ImportMode::kRestore) {
    t.counters.admitted += s.admitted;
    t.counters.lookups += s.lookups;
    t.counters.updates += s.updates;
    t.counters.rejected_lookups += s.rejected_lookups;
    t.counters.rejected_updates += s.rejected_updates;
    t.counters.rejected_full += s.rejected_full;
    t.counters.evicted_ttl += s.evicted_ttl;
    t.counters.evicted_capacity += s.evicted_capacity;
    t.counters.imported += s.imported;
  }
  t.counters.imported += taken;
}

DynamicTableDelta DynamicTable::export_delta() const {
  const Impl& t = *impl_;
  std::vector<std::uint32_t> records;
  for (std::size_t w = 0; w < t.changed_bits.size(); ++w)
    for (std::uint64_t bits = t.changed_bits[w]; bits != 0; bits &= bits - 1)
      records.push_back(static_cast<std::uint32_t>(w * 64 + static_cast<std::size_t>(__builtin_ctzll(bits))));
  DynamicTableDelta d;
  d.rows = export_records(records);
  d.evicted_ids.reserve(t.evicted.size());
  for (std::int64_t id : t.evicted)
    if (t.find(id, t.hash(id)) == kNoRow) d.evicted_ids.push_back(id);
  std::sort(d.evicted_ids.begin(), d.evicted_ids.end());
  d.evicted_ids.erase(std::unique(d.evicted_ids.begin(), d.evicted_ids.end()), d.evicted_ids.end());
  return d;
}

void DynamicTable::mark_saved() {
  Impl& t = *impl_;
  std::fill(t.changed_bits.begin(), t.changed_bits.end(), 0);
  std::fill(t.created_bits.begin(), t.created_bits.end(), 0);
  std::vector<std::int64_t>().swap(t.evicted);
}

std::int64_t DynamicTable::changed_rows() const {
  std::int64_t n = 0;
  for (std::uint64_t w : impl_->changed_bits) n += __builtin_popcountll(w);
  return n;
}

std::int64_t DynamicTable::update_count(std::int64_t id) const {
  const Impl& t = *impl_;
  const std::uint32_t r = t.find(id, t.hash(id));
  return r == kNoRow ? -1 : std::int64_t{t.count_of(r)};
}

std::int64_t DynamicTable::huge_page_bytes() const {
  const Impl& t = *impl_;
  std::vector<MemoryRange> ranges{{t.index.memory.data(), t.index.memory.size()}};
  for (const MappedMemory& slab : t.slabs) ranges.push_back({slab.data(), slab.size()});
  return ps::huge_page_bytes(ranges);
}

DynamicTableStats DynamicTable::stats() const {
  DynamicTableStats s = impl_->counters;
  s.rows = impl_->live;
  s.bytes = impl_->bytes();
  s.row_bytes = config_.dim * static_cast<std::int64_t>(sizeof(float)) * (1 + impl_->num_slot_arrays);
  return s;
}

}  // namespace strata::ps
