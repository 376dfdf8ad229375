// The parallel dynamic save (write_dynamic_checkpoint over a communicator, FORMAT.md 10.9) at 1,
// 2 and 3 ranks: every rank holds a disjoint shard of one table (Adagrad, update counts, an
// admission sketch whose sums saturate) and writes its own rows. Asserted on real files: the file
// reads back as exactly the union of the shards (rows, sketch, counters, clock); a delta written in
// parallel chains onto the parallel full save and restores bit-equal, whole and onto 1, 2 and 3
// shards; one rank writes a version-1 file whose content checksum is the serial writer's; a byte
// flipped in the last rank's rows is found; a rank that fails mid-write fails the save on every
// rank naming it, leaving no file and the previous state restorable; ranks that disagree on the
// tables get one ConfigError each.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/dynamic_glue.h"
#include "mpi/mpi_test.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/common/error.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::TestComm;

constexpr std::int64_t kDim = 16;
constexpr std::size_t kRows = 3000;
constexpr std::int64_t kWidth = 64;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Which of `size` ranks holds `id` (any disjoint split will do: the file does not depend on it).
int owner(std::int64_t id, int size) { return static_cast<int>(mix(static_cast<std::uint64_t>(id) + 17) % static_cast<std::uint64_t>(size)); }

// Rank r's shard of the full table at the first save: rows of the ids it owns, values a function
// of the id; counters, clock and sketch its own (cell 0 near the u16 limit on every rank, so the
// sum saturates from 2 ranks on).
DynamicTableState full_shard(int r, int size) {
  DynamicTableState t;
  t.name = "t";
  t.dim = kDim;
  t.optimizer = "adagrad";
  t.slot_names = {"accumulator"};
  t.slots.resize(1);
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i < kRows; ++i) ids.push_back(static_cast<std::int64_t>(mix(i * 7919 + 3)));
  std::sort(ids.begin(), ids.end());
  for (const auto id : ids) {
    if (owner(id, size) != r) continue;
    t.ids.push_back(id);
    for (std::int64_t k = 0; k < kDim; ++k) {
      t.values.push_back(static_cast<float>(static_cast<double>(mix(static_cast<std::uint64_t>(id) + k) % 1000) / 999.0 - 0.5));
      t.slots[0].push_back(static_cast<float>(k) * 0.25f + 0.1f);
    }
    t.stamps.push_back(static_cast<std::int64_t>(mix(static_cast<std::uint64_t>(id)) % 50));
    t.update_counts.push_back(static_cast<std::uint32_t>(mix(static_cast<std::uint64_t>(id) + 1) % 9));
  }
  t.total_rows = static_cast<std::int64_t>(t.ids.size());
  t.clock = 40 + r;
  t.sketch_width = kWidth;
  t.sketch.assign(4 * kWidth, 0);
  t.sketch[0] = 40000;
  for (std::size_t c = 1; c < t.sketch.size(); ++c) t.sketch[c] = static_cast<std::uint16_t>((c * 7 + static_cast<std::size_t>(r)) % 50);
  t.counters.admitted = 100 + r;
  t.counters.lookups = 1000 * (r + 1);
  t.counters.updates = 500 + r;
  t.counters.evicted_ttl = r;
  return t;
}

// Rank r's delta against its full shard: every 10th row changed, every 40th evicted, 5 new ids;
// two sketch cells changed (so rank 0 writes the changed-cells form).
DynamicTableState delta_shard(int r, int size, std::int64_t parent_step, std::uint32_t parent_checksum) {
  const DynamicTableState full = full_shard(r, size);
  DynamicTableState d = full;
  d.kind = DynamicKind::kDelta;
  d.ids.clear();
  d.values.clear();
  d.slots.assign(1, {});
  d.stamps.clear();
  d.update_counts.clear();
  std::vector<std::pair<std::int64_t, std::size_t>> rows;  // id, source row (npos: new)
  std::int64_t kept = 0;
  for (std::size_t i = 0; i < full.ids.size(); ++i) {
    if (i % 40 == 39) {
      d.evicted_ids.push_back(full.ids[i]);
      continue;
    }
    ++kept;
    if (i % 10 == 0) rows.push_back({full.ids[i], i});
  }
  std::int64_t added = 0;
  for (std::uint64_t x = 0; added < 5; ++x) {
    const auto id = static_cast<std::int64_t>(mix(x + 1000003 * static_cast<std::uint64_t>(r + 1)));
    if (owner(id, size) != r || std::binary_search(full.ids.begin(), full.ids.end(), id)) continue;
    rows.push_back({id, static_cast<std::size_t>(-1)});
    ++added;
  }
  std::sort(rows.begin(), rows.end());
  for (const auto& [id, src] : rows) {
    d.ids.push_back(id);
    for (std::int64_t k = 0; k < kDim; ++k) {
      const float v = src == static_cast<std::size_t>(-1) ? 0.125f * static_cast<float>(k)
                                                          : full.values[src * kDim + static_cast<std::size_t>(k)] + 1.0f;
      d.values.push_back(v);
      d.slots[0].push_back(v * 2.0f);
    }
    d.stamps.push_back(60);
    d.update_counts.push_back(src == static_cast<std::size_t>(-1) ? 1 : full.update_counts[src] + 1);
  }
  d.total_rows = kept + added;
  d.clock = 60 + r;
  d.sketch[5] = static_cast<std::uint16_t>(d.sketch[5] + 3);
  d.sketch[77] = static_cast<std::uint16_t>(d.sketch[77] + 1);
  d.counters.updates += 10;
  d.parent_step = parent_step;
  d.parent_checksum = parent_checksum;
  return d;
}

std::vector<DynamicTableState> all_shards(int size, bool delta, std::int64_t parent_step, std::uint32_t parent_checksum) {
  std::vector<DynamicTableState> out;
  for (int r = 0; r < size; ++r) out.push_back(delta ? delta_shard(r, size, parent_step, parent_checksum) : full_shard(r, size));
  return out;
}

// "" when `got` holds `want`'s rows and table state bit for bit, else the first difference.
std::string compare(const DynamicTableState& want, const DynamicTableState& got, bool table_state = true) {
  if (want.ids != got.ids) return "ids differ (" + std::to_string(want.ids.size()) + " vs " + std::to_string(got.ids.size()) + ")";
  if (want.stamps != got.stamps) return "stamps differ";
  if (want.update_counts != got.update_counts) return "update counts differ";
  if (want.values.size() != got.values.size() ||
      std::memcmp(want.values.data(), got.values.data(), 4 * want.values.size()) != 0)
    return "values differ";
  if (want.slots.size() != got.slots.size() || want.slots[0] != got.slots[0]) return "slots differ";
  if (!table_state) return "";
  if (want.sketch != got.sketch) return "sketch differs";
  if (!(want.counters == got.counters)) return "counters differ";
  if (want.clock != got.clock) return "clock differs";
  if (want.total_rows != got.total_rows) return "total_rows differ";
  return "";
}

std::string make_dir(const TestComm& comm, const std::string& tag) {
  const std::string dir =
      (fs::temp_directory_path() / ("strata_dynpar_" + tag + "_" + std::to_string(getppid()) + "_" + std::to_string(comm.size())))
          .string();
  if (comm.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(comm.get());
  return dir;
}

// Collective: whether `f` threw E on this rank, and its message.
template <typename E, typename F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.message();
  }
  return "";
}

TEST(DynamicParallelSave, ShardsWriteOneFileThatReadsAsTheirUnion) {
  TestComm comm;
  const int rank = comm.rank(), size = comm.size();
  const std::string dir = make_dir(comm, "union");
  const std::vector<DynamicTableState> fulls = all_shards(size, false, -1, 0);
  const DynamicTableState full_union = test::union_of_shards(fulls);
  const DynamicSaveResult saved = write_dynamic_checkpoint(comm.get(), dir, 10, {fulls[static_cast<std::size_t>(rank)]});
  ASSERT_EQ(saved.content_checksums.size(), 1u);
  // Every rank has the same result; rank 0 the whole sketch.
  std::uint32_t sum[2] = {saved.content_checksums[0], saved.content_checksums[0]};
  MPI_Allreduce(MPI_IN_PLACE, &sum[0], 1, MPI_UINT32_T, MPI_MIN, comm.get());
  MPI_Allreduce(MPI_IN_PLACE, &sum[1], 1, MPI_UINT32_T, MPI_MAX, comm.get());
  EXPECT_EQ(sum[0], sum[1]);
  if (rank == 0) {
    ASSERT_EQ(saved.sketches.size(), 1u);
    EXPECT_EQ(saved.sketches[0], full_union.sketch);
    EXPECT_EQ(full_union.sketch[0], size > 1 ? 65535 : 40000);  // saturated from 2 ranks on
  }

  // The delta, written in parallel against the parallel full save.
  const std::vector<DynamicTableState> deltas = all_shards(size, true, 10, saved.content_checksums[0]);
  DynamicParallelOptions options;
  if (rank == 0) options.parent_sketches = saved.sketches;
  const DynamicSaveResult delta = write_dynamic_checkpoint(comm.get(), dir, 20, {deltas[static_cast<std::size_t>(rank)]}, options);

  if (rank == 0) {
    const DynamicCheckpointFile file = read_dynamic_checkpoint(dir + "/" + dynamic_file_name(10));
    ASSERT_EQ(file.tables.size(), 1u);
    EXPECT_EQ(compare(full_union, file.tables[0]), "");
    EXPECT_EQ(file.tables[0].content_checksum, saved.content_checksums[0]);
    EXPECT_EQ(file.file_bytes, saved.file_bytes);
    // The delta carries the changed sketch cells only, and its chain restores the merged state.
    const DynamicCheckpointFile d = read_dynamic_checkpoint(dir + "/" + dynamic_file_name(20));
    EXPECT_TRUE(d.tables[0].sketch_sparse);
    EXPECT_EQ(d.tables[0].parent_checksum, saved.content_checksums[0]);
    EXPECT_EQ(d.tables[0].content_checksum, delta.content_checksums[0]);
    DynamicTableState delta_union = test::union_of_shards(deltas);
    const DynamicTableState want = merge_dynamic_delta(full_union, delta_union);
    const DynamicRestore r = restore_dynamic_table(dir, "t", 20);
    EXPECT_EQ(r.step, 20);
    EXPECT_EQ(r.warning, "");
    EXPECT_EQ(compare(want, r.state), "");
    // Onto 1, 2 and 3 shards (another PS count than the writers'): the same rows, split.
    for (const int k : {1, 2, 3}) {
      std::vector<DynamicTableState> parts;
      for (int s = 0; s < k; ++s) {
        DynamicRestore part = restore_dynamic_table(dir, "t", 20, [k, s](std::int64_t id) { return owner(id, k) == s; });
        for (const auto id : part.state.ids) EXPECT_EQ(owner(id, k), s);
        part.state.total_rows = static_cast<std::int64_t>(part.state.ids.size());
        parts.push_back(std::move(part.state));
      }
      EXPECT_EQ(compare(want, test::union_of_shards(parts), false), "") << "onto " << k;
    }
    if (size == 1) {
      // One rank writes the version-1 file the serial writer writes: the same content checksum.
      const std::string one = dir + "/serial";
      fs::create_directories(one);
      EXPECT_EQ(write_dynamic_checkpoint(one, 10, {full_union}).content_checksums, saved.content_checksums);
    } else {
      // A compacted copy (the serial writer: version 1, one run) restores the same state.
      const std::string copy = dir + "/compacted";
      fs::create_directories(copy);
      fs::copy_file(dir + "/" + dynamic_file_name(10), copy + "/" + dynamic_file_name(10));
      fs::copy_file(dir + "/" + dynamic_file_name(20), copy + "/" + dynamic_file_name(20));
      compact_dynamic_checkpoints(copy, std::nullopt, true);
      EXPECT_EQ(list_dynamic_checkpoints(copy), std::vector<std::int64_t>{20});
      EXPECT_EQ(compare(want, restore_dynamic_table(copy, "t", 20).state), "");
    }
  }
  MPI_Barrier(comm.get());

  // A byte flipped in the last rank's rows of the full file is found (and the chain falls back to nothing).
  if (rank == 0) {
    const std::string path = dir + "/" + dynamic_file_name(10);
    std::uint64_t at = 0;
    {
      const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      const hid_t v = H5Dopen2(f, "/dynamic/t/values", H5P_DEFAULT);
      at = H5Dget_offset(v);
      H5Dclose(v);
      H5Fclose(f);
    }
    const std::size_t before = full_union.ids.size() - fulls.back().ids.size();  // rows of the lower ranks
    at += (before + fulls.back().ids.size() / 2) * kDim * 4 + 3;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&byte, 1);
    f.close();
    const std::string why = thrown<Error>([&] { read_dynamic_checkpoint(path); });
    EXPECT_NE(why.find("dynamic/t/values"), std::string::npos) << why;
    EXPECT_THROW(restore_dynamic_table(dir, "t", 20), Error);
  }
  MPI_Barrier(comm.get());
  if (rank == 0 && std::getenv("STRATA_KEEP_TEST_FILES") == nullptr) fs::remove_all(dir);
}

TEST(DynamicParallelSave, ARankFailingMidWriteFailsTheSaveEverywhereAndCommitsNothing) {
  TestComm comm;
  const int rank = comm.rank(), size = comm.size();
  const std::string dir = make_dir(comm, "fail");
  const std::vector<DynamicTableState> fulls = all_shards(size, false, -1, 0);
  const DynamicSaveResult saved = write_dynamic_checkpoint(comm.get(), dir, 10, {fulls[static_cast<std::size_t>(rank)]});
  const std::vector<DynamicTableState> deltas = all_shards(size, true, 10, saved.content_checksums[0]);
  DynamicParallelOptions options;
  for (int r = 0; r < size; ++r) options.rank_names.push_back("writer " + std::to_string(r));
  const std::string last = std::to_string(size - 1);
  ::setenv("STRATA_TEST_DYNAMIC_WRITE_FAIL_RANK", last.c_str(), 1);
  const std::string why =
      thrown<Error>([&] { write_dynamic_checkpoint(comm.get(), dir, 20, {deltas[static_cast<std::size_t>(rank)]}, options); });
  ::unsetenv("STRATA_TEST_DYNAMIC_WRITE_FAIL_RANK");
  STRATA_EXPECT_ALL(comm.get(), why.find("writer " + last + ": writing") != std::string::npos);
  STRATA_EXPECT_ALL(comm.get(), why.find("injected write failure") != std::string::npos);
  if (rank == 0) {
    std::printf("[ message ] %s\n", why.c_str());
    EXPECT_FALSE(fs::exists(dir + "/" + dynamic_file_name(20)));
    EXPECT_FALSE(fs::exists(dir + "/" + dynamic_file_name(20) + ".tmp"));
    const DynamicRestore r = restore_dynamic_table(dir, "t");
    EXPECT_EQ(r.step, 10);
    EXPECT_EQ(compare(test::union_of_shards(fulls), r.state), "");
  }
  // Ranks that disagree on the tables: one ConfigError on every rank, nothing written.
  if (size > 1) {
    DynamicTableState mine = deltas[static_cast<std::size_t>(rank)];
    if (rank == size - 1) mine.parent_checksum ^= 1;
    const std::string bad = thrown<ConfigError>([&] { write_dynamic_checkpoint(comm.get(), dir, 30, {mine}, options); });
    STRATA_EXPECT_ALL(comm.get(), bad.find("different tables") != std::string::npos);
    if (rank == 0) {
      EXPECT_FALSE(fs::exists(dir + "/" + dynamic_file_name(30)));
    }
  }
  // Two ranks holding the same id (the shard map broken).
  if (size > 1) {
    DynamicTableState mine = fulls[static_cast<std::size_t>(rank)];
    if (rank == size - 1) {
      const std::int64_t twice = fulls[0].ids.at(0);
      const auto at = static_cast<std::size_t>(std::lower_bound(mine.ids.begin(), mine.ids.end(), twice) - mine.ids.begin());
      mine.ids.insert(mine.ids.begin() + static_cast<std::ptrdiff_t>(at), twice);
      mine.values.insert(mine.values.begin() + static_cast<std::ptrdiff_t>(at * kDim), kDim, 1.0f);
      mine.slots[0].insert(mine.slots[0].begin() + static_cast<std::ptrdiff_t>(at * kDim), kDim, 1.0f);
      mine.stamps.insert(mine.stamps.begin() + static_cast<std::ptrdiff_t>(at), 1);
      mine.update_counts.insert(mine.update_counts.begin() + static_cast<std::ptrdiff_t>(at), 1);
      mine.total_rows += 1;
    }
    // With the shard map (what the PS passes), the writer refuses it on every rank, naming the
    // rank and the id, before anything is written.
    DynamicParallelOptions checked = options;
    checked.owns = [rank, size](std::int64_t id) { return owner(id, size) == rank; };
    const std::string refused =
        thrown<ConfigError>([&] { write_dynamic_checkpoint(comm.get(), dir, 50, {mine}, checked); });
    STRATA_EXPECT_ALL(comm.get(), refused.find("writer " + last + ": dynamic table 't': id " +
                                               std::to_string(fulls[0].ids[0])) != std::string::npos &&
                                      refused.find("belongs to another rank's shard") != std::string::npos);
    if (rank == 0) {
      EXPECT_FALSE(fs::exists(dir + "/" + dynamic_file_name(50)));
      EXPECT_FALSE(fs::exists(dir + "/" + dynamic_file_name(50) + ".tmp"));
    }
    // Without it, the writer trusts the shards and the reader refuses the file.
    write_dynamic_checkpoint(comm.get(), dir, 50, {mine}, options);
    if (rank == 0) {
      const std::string why = thrown<Error>([&] { read_dynamic_checkpoint(dir + "/" + dynamic_file_name(50)); });
      EXPECT_NE(why.find("id " + std::to_string(fulls[0].ids[0]) + " is in two runs"), std::string::npos) << why;
      fs::remove(dir + "/" + dynamic_file_name(50));
    }
  }
  // An invalid shard on one rank (ids out of order): ConfigError everywhere naming it.
  {
    DynamicTableState mine = fulls[static_cast<std::size_t>(rank)];
    if (rank == size - 1 && mine.ids.size() > 1) std::swap(mine.ids[0], mine.ids[1]);
    const std::string bad = thrown<ConfigError>([&] { write_dynamic_checkpoint(comm.get(), dir, 40, {mine}, options); });
    STRATA_EXPECT_ALL(comm.get(), bad.find("writer " + last + ": dynamic table 't': ids are not strictly increasing") != std::string::npos);
  }
  MPI_Barrier(comm.get());
  if (rank == 0 && std::getenv("STRATA_KEEP_TEST_FILES") == nullptr) fs::remove_all(dir);
}

}  // namespace
}  // namespace strata::checkpoint
