// Dynamic tables in HDF5 checkpoint files (include/strata/checkpoint/dynamic.h, FORMAT.md
// section 10): full and delta round trips, a chain saved from a 2-shard job and restored onto 3
// shards bit for bit, fallback over damaged or missing links, compaction, and files that are
// damaged or crafted (correct checksums, wrong contents) refused with one clear error.
#include "strata/checkpoint/dynamic.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/hdf5/dynamic_io.h"
#include "common/dynamic_glue.h"
#include "ps/dynamic_table.h"
#include "strata/common/error.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using ps::DynamicTable;
using ps::DynamicTableConfig;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "strata-dynckpt-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(std::int64_t step) const { return path_ + "/" + dynamic_file_name(step); }

 private:
  std::string path_;
};

DynamicTableConfig make_config(bool admission) {
  DynamicTableConfig c;
  c.dim = 6;
  c.init = ps::Initializer::uniform(-0.5, 0.5, 9);
  c.optimizer = ps::OptimizerConfig::defaults(ps::OptimizerKind::kAdam);
  c.optimizer.learning_rate = 0.05;
  c.capacity = 1500;
  if (admission) {
    c.admit_after = 2;
    c.sketch_width = 256;
  }
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same_rows(const DynamicTableState& a, const DynamicTableState& b) {
  EXPECT_EQ(a.dim, b.dim);
  ASSERT_EQ(a.ids, b.ids);
  EXPECT_TRUE(same_bits(a.values, b.values));
  ASSERT_EQ(a.slots.size(), b.slots.size());
  for (std::size_t k = 0; k < a.slots.size(); ++k) EXPECT_TRUE(same_bits(a.slots[k], b.slots[k])) << "slot " << k;
  EXPECT_EQ(a.stamps, b.stamps);
  EXPECT_EQ(a.update_counts, b.update_counts);
}

void expect_same_state(const DynamicTableState& a, const DynamicTableState& b) {
  expect_same_rows(a, b);
  EXPECT_EQ(a.clock, b.clock);
  EXPECT_EQ(a.sketch_width, b.sketch_width);
  EXPECT_EQ(a.sketch, b.sketch);
  EXPECT_TRUE(a.counters == b.counters);
  EXPECT_EQ(a.total_rows, b.total_rows);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.slot_names, b.slot_names);
}

// A 2-PS job's shards of table "emb": each op goes to the shard of its ids.
struct Job {
  DynamicTableConfig config;
  std::unique_ptr<DynamicTable> shard[2];
  std::mt19937_64 gen{11};
  std::int64_t step = 1;

  explicit Job(bool admission) : config(make_config(admission)) {
    for (auto& s : shard) s = std::make_unique<DynamicTable>(config);
  }
  void run(int ops) {
    for (int op = 0; op < ops; ++op) {
      const int s = static_cast<int>(gen() % 2);
      std::vector<std::int64_t> ids;
      while (ids.size() < 6) {
        const auto id = static_cast<std::int64_t>(gen() % 3000) * 1000003 - 7;
        if (ps::shard_of(id, 2) == s) ids.push_back(id);
      }
      if (gen() % 3 == 0) {
        std::vector<float> out(ids.size() * 6);
        shard[s]->lookup(ids.data(), ids.size(), out.data());
      } else {
        std::normal_distribution<float> g(0.0f, 1.0f);
        std::vector<float> grads(ids.size() * 6);
        for (float& x : grads) x = g(gen);
        shard[s]->apply(ids.data(), ids.size(), grads.data(), step++);
      }
      if (op % 150 == 149) shard[s]->evict_older_than(step, 400);
    }
  }
  DynamicTableState full() const {
    return test::union_of_shards({test::full_state("emb", config, shard[0]->export_rows()),
                                  test::full_state("emb", config, shard[1]->export_rows())});
  }
  DynamicTableState delta(std::int64_t parent_step, std::uint32_t parent_checksum) const {
    return test::union_of_shards(
        {test::delta_state("emb", config, shard[0]->export_delta(), shard[0]->size(), parent_step, parent_checksum),
         test::delta_state("emb", config, shard[1]->export_delta(), shard[1]->size(), parent_step, parent_checksum)});
  }
  void mark_saved() {
    for (auto& s : shard) s->mark_saved();
  }
};

// Saves base (100) + deltas (200, 300) of `job`; returns the live full states at each save.
std::vector<DynamicTableState> save_chain(Job& job, const TempDir& dir) {
  std::vector<DynamicTableState> states;
  job.run(1500);
  DynamicSaveResult r = write_dynamic_checkpoint(dir.path(), 100, {job.full()});
  job.mark_saved();
  states.push_back(job.full());
  for (std::int64_t step : {200, 300}) {
    job.run(120);
    const DynamicTableState d = job.delta(step - 100, r.content_checksums.at(0));
    EXPECT_GT(d.evicted_ids.size() + d.ids.size(), 0u);
    r = write_dynamic_checkpoint(dir.path(), step, {d});
    job.mark_saved();
    states.push_back(job.full());
  }
  return states;
}

void flip_byte(const std::string& path, double where) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(f.tellg());
  const auto at = static_cast<std::streamoff>(static_cast<double>(size) * where);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
}

std::string error_of(const std::string& path) {
  try {
    read_dynamic_checkpoint(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- round trips ---------------------------------------------------------------------------------

TEST(DynamicCheckpoint, FullAndDeltaRoundTripBitForBit) {
  TempDir dir;
  Job job(/*admission=*/true);
  job.run(800);
  const DynamicTableState full = job.full();
  EXPECT_GT(full.ids.size(), 100u);
  EXPECT_EQ(full.sketch.size(), 4u * 256u);
  const DynamicSaveResult saved = write_dynamic_checkpoint(dir.path(), 7, {full});
  EXPECT_EQ(saved.path, dir.file(7));
  const DynamicCheckpointFile f = read_dynamic_checkpoint(dir.file(7));
  EXPECT_EQ(f.global_step, 7);
  EXPECT_EQ(f.file_bytes, saved.file_bytes);
  ASSERT_EQ(f.tables.size(), 1u);
  expect_same_state(f.tables[0], full);
  EXPECT_EQ(f.tables[0].kind, DynamicKind::kFull);
  EXPECT_EQ(f.tables[0].content_checksum, saved.content_checksums[0]);
  EXPECT_EQ(f.tables[0].slot_names, (std::vector<std::string>{"m", "v"}));

  job.mark_saved();
  job.run(50);
  const DynamicTableState delta = job.delta(7, saved.content_checksums[0]);
  write_dynamic_checkpoint(dir.path(), 9, {delta});
  const DynamicCheckpointFile g = read_dynamic_checkpoint(dir.file(9));
  ASSERT_EQ(g.tables.size(), 1u);
  expect_same_state(g.tables[0], delta);
  EXPECT_EQ(g.tables[0].evicted_ids, delta.evicted_ids);
  EXPECT_EQ(g.tables[0].parent_step, 7);
  EXPECT_EQ(g.tables[0].parent_checksum, saved.content_checksums[0]);
  // Base + delta = the live state.
  expect_same_state(merge_dynamic_delta(f.tables[0], g.tables[0]), job.full());
  // Headers only: attributes and evicted ids, no rows.
  const DynamicCheckpointFile h = read_dynamic_checkpoint(dir.file(9), false);
  EXPECT_TRUE(h.tables[0].ids.empty());
  EXPECT_EQ(h.tables[0].content_checksum, g.tables[0].content_checksum);
  EXPECT_EQ(h.tables[0].stored_rows, static_cast<std::int64_t>(delta.ids.size()));
  EXPECT_EQ(list_dynamic_checkpoints(dir.path()), (std::vector<std::int64_t>{7, 9}));
}

// The per-row update counts go through a file, a delta chain and a restore onto another shard
// count (the chain tests compare them too); a file without them (written before they existed)
// still verifies and restores every count as 0.
TEST(DynamicCheckpoint, UpdateCountsRoundTripAndOlderFilesRestoreZeros) {
  TempDir dir;
  Job job(/*admission=*/false);
  job.run(600);
  const DynamicTableState full = job.full();
  ASSERT_EQ(full.update_counts.size(), full.ids.size());
  std::uint64_t total = 0;
  for (auto c : full.update_counts) total += c;
  EXPECT_GT(total, full.ids.size());  // rows were updated, several times on average
  write_dynamic_checkpoint(dir.path(), 3, {full});
  const DynamicCheckpointFile f = read_dynamic_checkpoint(dir.file(3));
  EXPECT_EQ(f.tables.at(0).update_counts, full.update_counts);
  // Back into one table (both shards' rows): the accessor reads them.
  DynamicTableConfig whole = job.config;
  whole.capacity = 1 << 20;
  DynamicTable back(whole);
  back.import_rows(test::to_snapshot(f.tables.at(0)));
  for (std::size_t i = 0; i < full.ids.size(); i += 7)
    EXPECT_EQ(back.update_count(full.ids[i]), std::int64_t{full.update_counts[i]});
  // No counts: the dataset is left out, the file verifies, and the rows restore with count 0.
  DynamicTableState old = full;
  old.update_counts.clear();
  write_dynamic_checkpoint(dir.path(), 4, {old});
  const DynamicCheckpointFile g = read_dynamic_checkpoint(dir.file(4));
  EXPECT_TRUE(g.tables.at(0).update_counts.empty());
  EXPECT_TRUE(same_bits(g.tables.at(0).values, full.values));
  DynamicTable zeros(whole);
  zeros.import_rows(test::to_snapshot(g.tables.at(0)));
  EXPECT_EQ(zeros.export_rows().update_counts, std::vector<std::uint32_t>(full.ids.size(), 0));
  // A delta with counts onto a base without them: the base's untouched rows count 0.
  job.mark_saved();
  job.run(40);
  const DynamicTableState delta = job.delta(4, g.tables.at(0).content_checksum);
  ASSERT_FALSE(delta.ids.empty());
  const DynamicTableState merged = merge_dynamic_delta(g.tables.at(0), delta);
  ASSERT_EQ(merged.update_counts.size(), merged.ids.size());
  for (std::size_t i = 0, j = 0; i < merged.ids.size(); ++i) {
    while (j < delta.ids.size() && delta.ids[j] < merged.ids[i]) ++j;
    const bool in_delta = j < delta.ids.size() && delta.ids[j] == merged.ids[i];
    EXPECT_EQ(merged.update_counts[i], in_delta ? delta.update_counts[j] : 0u) << "id " << merged.ids[i];
  }
}

TEST(DynamicCheckpoint, SeveralTablesAndEmptyOnesInOneFile) {
  TempDir dir;
  Job job(false);
  job.run(200);
  DynamicTableState a = job.full();
  DynamicTableState empty = test::full_state("empty.table-2", job.config, DynamicTable(job.config).export_rows());
  write_dynamic_checkpoint(dir.path(), 1, {a, empty});
  const DynamicCheckpointFile f = read_dynamic_checkpoint(dir.file(1));
  ASSERT_EQ(f.tables.size(), 2u);
  ASSERT_NE(f.find("empty.table-2"), nullptr);
  EXPECT_TRUE(f.find("empty.table-2")->ids.empty());
  expect_same_state(*f.find("emb"), a);
  // Two tables of one name, or a bad name, are refused before anything is written.
  EXPECT_THROW(write_dynamic_checkpoint(dir.path(), 2, {a, a}), ConfigError);
  a.name = "../x";
  EXPECT_THROW(write_dynamic_checkpoint(dir.path(), 2, {a}), ConfigError);
  EXPECT_FALSE(fs::exists(dir.file(2)));
  EXPECT_FALSE(fs::exists(dir.file(2) + ".tmp"));
}

// ---- restore onto another shard count --------------------------------------------------------------

TEST(DynamicCheckpoint, ChainFromTwoShardsRestoresOntoThreeBitForBit) {
  TempDir dir;
  Job job(/*admission=*/true);
  const std::vector<DynamicTableState> states = save_chain(job, dir);
  std::vector<DynamicTableState> restored_shards;
  for (int s = 0; s < 3; ++s) {
    const DynamicRestore r = restore_dynamic_table(dir.path(), "emb", std::nullopt,
                                                   [s](std::int64_t id) { return ps::shard_of(id, 3) == s; });
    EXPECT_EQ(r.step, 300);
    EXPECT_EQ(r.warning, "");
    EXPECT_EQ(r.chain.size(), 3u);
    DynamicTable table(job.config);
    table.import_rows(test::to_snapshot(r.state), s, 3);
    EXPECT_EQ(table.size(), static_cast<std::int64_t>(r.state.ids.size()));
    restored_shards.push_back(test::full_state("emb", job.config, table.export_rows()));
  }
  DynamicTableState merged = test::union_of_shards(restored_shards);
  expect_same_rows(merged, job.full());
  // Unfiltered: the whole state with the live counters, clock and sketch.
  const DynamicRestore whole = restore_dynamic_table(dir.path(), "emb");
  expect_same_state(whole.state, states.back());
  // At an older step.
  expect_same_state(restore_dynamic_table(dir.path(), "emb", 250).state, states[1]);
}

// ---- damaged links --------------------------------------------------------------------------------

TEST(DynamicCheckpoint, ADamagedNewestDeltaFallsBackToTheStepBefore) {
  TempDir dir;
  Job job(false);
  const std::vector<DynamicTableState> states = save_chain(job, dir);
  flip_byte(dir.file(300), 0.7);
  const DynamicRestore r = restore_dynamic_table(dir.path(), "emb");
  EXPECT_EQ(r.step, 200);
  expect_same_state(r.state, states[1]);
  EXPECT_NE(r.warning.find("restored step 200"), std::string::npos) << r.warning;
  EXPECT_NE(r.warning.find("step 300"), std::string::npos) << r.warning;
  EXPECT_EQ(r.warning.find('\n'), std::string::npos);
  // The plan from the headers alone says the same.
  const DynamicRestorePlan plan = plan_dynamic_restore(dir.path(), "emb");
  EXPECT_EQ(plan.step, r.step);
  EXPECT_EQ(plan.chain, r.chain);
  EXPECT_EQ(plan.warning, r.warning);
}

TEST(DynamicCheckpoint, AMissingParentFallsBackToTheBase) {
  TempDir dir;
  Job job(false);
  const std::vector<DynamicTableState> states = save_chain(job, dir);
  fs::remove(dir.file(200));
  const DynamicRestore r = restore_dynamic_table(dir.path(), "emb");
  EXPECT_EQ(r.step, 100);
  expect_same_state(r.state, states[0]);
  EXPECT_NE(r.warning.find("dynamic-200.h5, which is missing"), std::string::npos) << r.warning;
  EXPECT_EQ(plan_dynamic_restore(dir.path(), "emb").chain, (std::vector<std::string>{dir.file(100)}));
}

TEST(DynamicCheckpoint, AParentWithOtherContentBreaksTheLink) {
  TempDir dir;
  Job job(false);
  const std::vector<DynamicTableState> states = save_chain(job, dir);
  // A valid file at step 200 that is not the parent 300 was written against.
  write_dynamic_checkpoint(dir.path(), 200, {states[0]});
  const DynamicRestore r = restore_dynamic_table(dir.path(), "emb");
  EXPECT_EQ(r.step, 200);
  expect_same_state(r.state, states[0]);
  EXPECT_NE(r.warning.find("content checksum"), std::string::npos) << r.warning;
}

TEST(DynamicCheckpoint, ADamagedBaseLeavesNoCompleteState) {
  TempDir dir;
  Job job(false);
  save_chain(job, dir);
  flip_byte(dir.file(100), 0.5);
  try {
    restore_dynamic_table(dir.path(), "emb");
    FAIL() << "restored from a chain without a base";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no complete state"), std::string::npos) << m;
    EXPECT_NE(m.find("dynamic-100.h5"), std::string::npos) << m;
  }
  EXPECT_THROW(restore_dynamic_table(dir.path(), "other"), Error);
  TempDir empty;
  EXPECT_THROW(restore_dynamic_table(empty.path(), "emb"), ConfigError);
}

// ---- compaction ------------------------------------------------------------------------------------

TEST(DynamicCheckpoint, CompactionRewritesTheChainAsOneFullBase) {
  TempDir dir;
  Job job(true);
  const std::vector<DynamicTableState> states = save_chain(job, dir);
  EXPECT_THROW(compact_dynamic_checkpoints(dir.path(), 200), ConfigError);  // 300 links to 200
  const DynamicSaveResult c = compact_dynamic_checkpoints(dir.path(), std::nullopt, /*remove_ancestors=*/true);
  EXPECT_EQ(list_dynamic_checkpoints(dir.path()), (std::vector<std::int64_t>{300}));
  const DynamicCheckpointFile f = read_dynamic_checkpoint(dir.file(300));
  ASSERT_EQ(f.tables.size(), 1u);
  EXPECT_EQ(f.tables[0].kind, DynamicKind::kFull);
  expect_same_state(f.tables[0], states.back());
  // The next delta links to the compacted base.
  job.run(100);
  write_dynamic_checkpoint(dir.path(), 400, {job.delta(300, c.content_checksums.at(0))});
  const DynamicRestore r = restore_dynamic_table(dir.path(), "emb");
  EXPECT_EQ(r.step, 400);
  EXPECT_EQ(r.warning, "");
  expect_same_state(r.state, job.full());
}

// ---- deltas of the admission sketch ------------------------------------------------------------------

// A delta carries only the sketch counters changed since its parent: smaller, and base + delta
// still restores the whole sketch bit for bit.
TEST(DynamicCheckpoint, ADeltaCarriesOnlyTheChangedSketchCounters) {
  TempDir dir, whole;
  Job job(/*admission=*/true);
  job.config.sketch_width = 4096;
  for (auto& s : job.shard) s = std::make_unique<DynamicTable>(job.config);
  job.run(400);
  const DynamicTableState base = job.full();
  const std::uint32_t crc = write_dynamic_checkpoint(dir.path(), 100, {base}).content_checksums.at(0);
  write_dynamic_checkpoint(whole.path(), 100, {base});
  job.run(60);
  DynamicTableState d = job.delta(100, crc);
  const DynamicSaveResult plain = write_dynamic_checkpoint(whole.path(), 200, {d});
  ASSERT_TRUE(sparsify_sketch(d, base.sketch));
  EXPECT_FALSE(sparsify_sketch(d, base.sketch));  // once
  EXPECT_GT(d.sketch_cells.size(), 0u);
  EXPECT_LT(d.sketch_cells.size(), base.sketch.size() / 5);
  const DynamicSaveResult sparse = write_dynamic_checkpoint(dir.path(), 200, {d});
  // The whole sketch is 4 x 4096 x 2 bytes; the cells cost 10 bytes each, and one more dataset
  // about 1.5 KiB of HDF5 metadata and integrity entries.
  EXPECT_LE(sparse.file_bytes + (4 * 4096 * 2 - d.sketch_cells.size() * 10), plain.file_bytes + 2048)
      << sparse.file_bytes << " vs " << plain.file_bytes << " with " << d.sketch_cells.size() << " cells";
  EXPECT_LT(sparse.file_bytes, plain.file_bytes);
  const DynamicCheckpointFile f = read_dynamic_checkpoint(dir.file(200));
  EXPECT_TRUE(f.tables.at(0).sketch_sparse);
  EXPECT_EQ(f.tables.at(0).sketch_cells, d.sketch_cells);
  EXPECT_EQ(f.tables.at(0).sketch, d.sketch);
  const DynamicRestore r = restore_dynamic_table(dir.path(), "emb");
  EXPECT_EQ(r.step, 200);
  expect_same_state(r.state, job.full());
  EXPECT_FALSE(r.state.sketch_sparse);
  // Nothing to gain: a full table, no sketch, a parent sketch of another size.
  DynamicTableState full = job.full();
  EXPECT_FALSE(sparsify_sketch(full, base.sketch));
  DynamicTableState other = job.delta(200, 0);
  EXPECT_FALSE(sparsify_sketch(other, std::vector<std::uint16_t>(8)));
}

// ---- retention ---------------------------------------------------------------------------------

// Saves steps 1..7 of `job`, a full base every 3 saves (1, 4, 7) and deltas between, as a job
// with --dynamic-full-every 3 does; returns the live full state at each step (index = step).
std::vector<DynamicTableState> save_steps(Job& job, const TempDir& dir) {
  std::vector<DynamicTableState> states(1);
  std::uint32_t parent = 0;
  for (std::int64_t step = 1; step <= 7; ++step) {
    job.run(step == 1 ? 800 : 90);
    const bool full = (step - 1) % 3 == 0;
    parent = write_dynamic_checkpoint(dir.path(), step, {full ? job.full() : job.delta(step - 1, parent)})
                 .content_checksums.at(0);
    job.mark_saved();
    states.push_back(job.full());
  }
  return states;
}

TEST(DynamicRetention, AKeptStepKeepsItsFileAndEveryLinkDownToItsBase) {
  TempDir dir;
  Job job(true);
  save_steps(job, dir);
  using Steps = std::vector<std::int64_t>;
  // The two newest kept (max_to_keep 2): 6 needs 4 and 5; 7 is a base.
  DynamicRetention r = plan_dynamic_retention(dir.path(), {6, 7});
  EXPECT_EQ(r.needed, (Steps{4, 5, 6, 7}));
  EXPECT_EQ(r.unneeded, (Steps{1, 2, 3}));
  EXPECT_TRUE(r.notes.empty());
  // A preserved old step (keep_every_n_hours) keeps its own chain, not the deltas after it.
  r = plan_dynamic_retention(dir.path(), {2, 7});
  EXPECT_EQ(r.needed, (Steps{1, 2, 7}));
  EXPECT_EQ(r.unneeded, (Steps{3, 4, 5, 6}));
  // Files newer than every kept step are an uncommitted save's: never retention's to delete.
  r = plan_dynamic_retention(dir.path(), {4});
  EXPECT_EQ(r.needed, (Steps{4, 5, 6, 7}));
  EXPECT_EQ(r.unneeded, (Steps{1, 2, 3}));
  // A kept step between saves of tables restores from the newest file before it.
  r = plan_dynamic_retention(dir.path(), {100});
  EXPECT_EQ(r.needed, (Steps{7}));
  // No kept step: nothing says what is unneeded.
  r = plan_dynamic_retention(dir.path(), {});
  EXPECT_EQ(r.needed, (Steps{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(r.unneeded.empty());
}

TEST(DynamicRetention, PruneDeletesExactlyTheUnneededFilesAndKeptStepsRestoreBitForBit) {
  TempDir dir;
  Job job(true);
  const std::vector<DynamicTableState> states = save_steps(job, dir);
  // A symbolic link in a file's place is no file of this directory: never followed nor removed.
  const std::string outside = dir.path() + "/outside.h5";
  fs::rename(dir.file(3), outside);
  fs::create_symlink(outside, dir.file(3));
  DynamicPrune p = prune_dynamic_checkpoints(dir.path(), {5, 6});
  EXPECT_EQ(p.removed, (std::vector<std::string>{"dynamic-1.h5", "dynamic-2.h5"}));
  EXPECT_TRUE(p.not_removed.empty());
  EXPECT_TRUE(fs::is_symlink(dir.file(3)) && fs::exists(outside));
  EXPECT_EQ(list_dynamic_checkpoints(dir.path()), (std::vector<std::int64_t>{4, 5, 6, 7}));
  for (const std::int64_t step : {5, 6, 7}) {
    const DynamicRestore r = restore_dynamic_table(dir.path(), "emb", step);
    EXPECT_EQ(r.step, step);
    EXPECT_EQ(r.warning, "");
    expect_same_state(r.state, states.at(static_cast<std::size_t>(step)));
  }
  // Pruning again with the same kept steps removes nothing; with only 7 kept, its base alone stays.
  EXPECT_TRUE(prune_dynamic_checkpoints(dir.path(), {5, 6}).removed.empty());
  p = prune_dynamic_checkpoints(dir.path(), {7});
  EXPECT_EQ(p.removed, (std::vector<std::string>{"dynamic-4.h5", "dynamic-5.h5", "dynamic-6.h5"}));
  EXPECT_EQ(list_dynamic_checkpoints(dir.path()), (std::vector<std::int64_t>{7}));
  expect_same_state(restore_dynamic_table(dir.path(), "emb", 7).state, states.at(7));
}

// A preserved step (keep_every_n_hours) that is a delta is rewritten whole once no newer kept
// step's chain runs through it, so its chain's older links go; never while one does.
TEST(DynamicRetention, APreservedDeltaIsCompactedWhenNothingNewerLinksThroughIt) {
  TempDir dir;
  Job job(true);
  const std::vector<DynamicTableState> states = save_steps(job, dir);
  // 3's chain runs through 2: no compaction of 2.
  EXPECT_TRUE(plan_dynamic_retention(dir.path(), {2, 3}, {2}).compactable.empty());
  // 5 shares its base 4 with 6: rewriting 5 would free nothing.
  EXPECT_TRUE(plan_dynamic_retention(dir.path(), {5, 6}, {5}).compactable.empty());
  EXPECT_EQ(plan_dynamic_retention(dir.path(), {2, 6, 7}, {2}).compactable, (std::vector<std::int64_t>{2}));
  const DynamicPrune p = prune_dynamic_checkpoints(dir.path(), {2, 6, 7}, {2});
  EXPECT_EQ(p.compacted, (std::vector<std::string>{"dynamic-2.h5"}));
  EXPECT_EQ(p.removed, (std::vector<std::string>{"dynamic-1.h5", "dynamic-3.h5"}));
  EXPECT_EQ(list_dynamic_checkpoints(dir.path()), (std::vector<std::int64_t>{2, 4, 5, 6, 7}));
  EXPECT_EQ(read_dynamic_checkpoint(dir.file(2)).tables.at(0).kind, DynamicKind::kFull);
  for (const std::int64_t step : {2, 6, 7}) {
    const DynamicRestore r = restore_dynamic_table(dir.path(), "emb", step);
    EXPECT_EQ(r.step, step);
    expect_same_state(r.state, states.at(static_cast<std::size_t>(step)));
  }
  // Whole now: nothing more to compact.
  EXPECT_TRUE(prune_dynamic_checkpoints(dir.path(), {2, 6, 7}, {2}).compacted.empty());
}

// Retention plans every kept chain at every save: a settled file it verified before, unchanged
// since, is not read whole again, while any change to it (here a flipped byte) is seen.
TEST(DynamicRetention, ASettledFileIsVerifiedOnceUntilItChanges) {
  TempDir dir;
  Job job(false);
  save_steps(job, dir);
  using Steps = std::vector<std::int64_t>;
  const std::uint64_t start = detail::dynamic_header_verifications();
  DynamicRetention r = plan_dynamic_retention(dir.path(), {6, 7});
  EXPECT_EQ(r.needed, (Steps{4, 5, 6, 7}));
  // Just written: not settled, so read again at the next plan.
  const std::uint64_t fresh = detail::dynamic_header_verifications();
  EXPECT_EQ(fresh - start, 4u);
  r = plan_dynamic_retention(dir.path(), {6, 7});
  EXPECT_EQ(detail::dynamic_header_verifications() - fresh, 4u);
  // Settled (both times over 2 s old when verified): read once more, then remembered.
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  const std::uint64_t settled = detail::dynamic_header_verifications();
  r = plan_dynamic_retention(dir.path(), {6, 7});
  EXPECT_EQ(detail::dynamic_header_verifications() - settled, 4u);
  const std::uint64_t remembered = detail::dynamic_header_verifications();
  r = plan_dynamic_retention(dir.path(), {6, 7});
  EXPECT_EQ(detail::dynamic_header_verifications(), remembered);
  EXPECT_EQ(r.needed, (Steps{4, 5, 6, 7}));
  EXPECT_EQ(r.unneeded, (Steps{1, 2, 3}));
  EXPECT_TRUE(r.notes.empty());
  // A changed link is read again and found damaged: its chain keeps every older file.
  flip_byte(dir.file(5), 0.5);
  r = plan_dynamic_retention(dir.path(), {6, 7});
  EXPECT_EQ(detail::dynamic_header_verifications() - remembered, 1u);
  EXPECT_EQ(r.needed, (Steps{1, 2, 3, 4, 5, 6, 7}));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("dynamic-5.h5"), std::string::npos) << r.notes[0];
}

TEST(DynamicRetention, ABrokenChainKeepsEveryOlderFileForTheFallback) {
  TempDir dir;
  Job job(false);
  const std::vector<DynamicTableState> states = save_steps(job, dir);
  flip_byte(dir.file(5), 0.5);
  const DynamicRetention r = plan_dynamic_retention(dir.path(), {6, 7});
  EXPECT_EQ(r.needed, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(r.unneeded.empty());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("step 6"), std::string::npos) << r.notes[0];
  EXPECT_NE(r.notes[0].find("dynamic-5.h5"), std::string::npos) << r.notes[0];
  EXPECT_TRUE(prune_dynamic_checkpoints(dir.path(), {6, 7}).removed.empty());
  // What a restore at 6 falls back to is still there.
  const DynamicRestore back = restore_dynamic_table(dir.path(), "emb", 6);
  EXPECT_EQ(back.step, 4);
  expect_same_state(back.state, states.at(4));
}

// ---- hostile files -----------------------------------------------------------------------------------

class DynamicCheckpointSecurity : public ::testing::Test {
 protected:
  void SetUp() override {
    job_.run(300);
    good_ = job_.full();
    ASSERT_GT(good_.ids.size(), 10u);
  }
  // Writes `t` without the writer's checks: correct checksums around wrong contents.
  std::string craft(const DynamicTableState& t, std::int64_t step = 5, const std::string& counts_type = "u32") {
    detail::write_dynamic_file(dir_.file(step), step, {t}, /*validate=*/false, counts_type);
    return dir_.file(step);
  }
  void expect_refused(const std::string& path, const std::string& needle) {
    const std::string m = error_of(path);
    EXPECT_NE(m.find("dynamic checkpoint '" + path + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  TempDir dir_;
  Job job_{false};
  DynamicTableState good_;
};

TEST_F(DynamicCheckpointSecurity, DamagedBytesAnywhereAreRefused) {
  write_dynamic_checkpoint(dir_.path(), 5, {good_});
  const std::string path = dir_.file(5);
  const auto size = fs::file_size(path);
  std::vector<char> original(size);
  std::ifstream(path, std::ios::binary).read(original.data(), static_cast<std::streamsize>(size));
  for (double where : {0.001, 0.02, 0.1, 0.3, 0.5, 0.75, 0.9, 0.999}) {
    flip_byte(path, where);
    const std::string m = error_of(path);
    EXPECT_NE(m.find("mismatch"), std::string::npos) << where << ": " << m;
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(original.data(), static_cast<std::streamsize>(size));
  }
  EXPECT_EQ(error_of(path), "");
  fs::resize_file(path, size / 2);
  expect_refused(path, "truncated");
  fs::resize_file(path, 100);
  expect_refused(path, "truncated");
  fs::resize_file(path, 0);
  expect_refused(path, "integrity block");
}

TEST_F(DynamicCheckpointSecurity, WrongDimIsRefused) {
  DynamicTableState t = good_;
  t.dim = 3;  // values hold rows of 6: [2n, 3] against ids [n]
  expect_refused(craft(t), "values is [");
  t = good_;
  t.dim = 1 << 20;
  expect_refused(craft(t), "dim 1048576 is outside");
}

TEST_F(DynamicCheckpointSecurity, RowCountMismatchesAreRefused) {
  DynamicTableState t = good_;
  t.stamps.pop_back();
  expect_refused(craft(t), "stamps hold");
  t = good_;
  t.total_rows += 1;
  expect_refused(craft(t), "total_rows");
  t = good_;
  t.slots[1].resize(t.slots[1].size() - 6);
  expect_refused(craft(t), "slots/v is [");
}

// The update counts: a dataset of the wrong length or element type is one line naming the file and
// the dataset.
TEST_F(DynamicCheckpointSecurity, BadUpdateCountsAreRefused) {
  ASSERT_EQ(good_.update_counts.size(), good_.ids.size());
  EXPECT_EQ(error_of(craft(good_)), "");
  DynamicTableState t = good_;
  t.update_counts.pop_back();
  expect_refused(craft(t), "update_counts hold " + std::to_string(good_.ids.size() - 1) + " entries for");
  t = good_;
  t.update_counts.resize(2 * t.ids.size());  // read as [n] of i64
  expect_refused(craft(t, 5, "i64"), "dataset dynamic/emb/update_counts is not u32");
  expect_refused(craft(good_, 5, "f32"), "dataset dynamic/emb/update_counts is not u32");
  // The in-memory writer refuses a wrong length before writing.
  t = good_;
  t.update_counts.pop_back();
  EXPECT_THROW(write_dynamic_checkpoint(dir_.path(), 6, {t}), ConfigError);
}

TEST_F(DynamicCheckpointSecurity, IdsNotIncreasingAreRefused) {
  DynamicTableState t = good_;
  std::swap(t.ids[3], t.ids[4]);
  expect_refused(craft(t), "ids are not strictly increasing at row 4");
  t = good_;
  t.ids[5] = t.ids[4];
  expect_refused(craft(t), "ids are not strictly increasing");
}

TEST_F(DynamicCheckpointSecurity, BadDeltaLinksAndEvictedIdsAreRefused) {
  DynamicTableState d = good_;
  d.kind = DynamicKind::kDelta;
  d.parent_step = 5;  // not before the file's own step
  expect_refused(craft(d, 5), "parent_step 5 is not before");
  d.parent_step = 4;
  d.evicted_ids = {good_.ids[2]};  // also a row
  expect_refused(craft(d, 5), "both evicted and a row");
  d.evicted_ids = {9, 8};
  expect_refused(craft(d, 5), "evicted_ids are not strictly increasing");
}

TEST_F(DynamicCheckpointSecurity, BadSketchCellsAreRefused) {
  Job job(true);
  job.run(300);
  const DynamicTableState base = job.full();
  job.run(30);
  DynamicTableState d = job.delta(4, 1);
  ASSERT_TRUE(sparsify_sketch(d, base.sketch));
  ASSERT_GT(d.sketch_cells.size(), 1u);
  DynamicTableState t = d;
  std::swap(t.sketch_cells[0], t.sketch_cells[1]);
  expect_refused(craft(t), "sketch_cells are not strictly increasing");
  t = d;
  t.sketch_cells.back() = 4 * t.sketch_width;
  expect_refused(craft(t), "sketch_cells are not strictly increasing in [0, 4 x sketch_width)");
  t = d;
  t.sketch.pop_back();
  expect_refused(craft(t), "sketch_values hold");
  t = job.full();
  t.sketch_sparse = true;
  t.sketch_cells = {0};
  t.sketch = {1};
  expect_refused(craft(t), "only a delta of a table with a sketch may carry changed sketch cells");
  // The writer refuses them too.
  t = d;
  std::swap(t.sketch_cells[0], t.sketch_cells[1]);
  EXPECT_THROW(write_dynamic_checkpoint(dir_.path(), 9, {t}), ConfigError);
}

TEST_F(DynamicCheckpointSecurity, FilesThatAreNoDynamicCheckpointAreRefused) {
  const std::string text = dir_.path() + "/dynamic-1.h5";
  std::ofstream(text) << "hello, this is not HDF5 at all, nor a strata file\n";
  expect_refused(text, "no integrity block");
  const std::string fifo = dir_.path() + "/dynamic-2.h5";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(fifo, "FIFO");
  expect_refused(dir_.path() + "/dynamic-3.h5", "does not exist");
  EXPECT_EQ(list_dynamic_checkpoints(dir_.path()), (std::vector<std::int64_t>{1}));  // the FIFO is no candidate
}

}  // namespace
}  // namespace strata::checkpoint
