// The ps layer's glue between table snapshots and checkpoint states (src/ps/dynamic_checkpoint.h):
// the table names variables get in a file, and the merge of the PS ranks' shards into one table.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ps/dynamic_checkpoint.h"
#include "ps/dynamic_table.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/common/error.h"

namespace strata::ps {
namespace {

TEST(DynamicCheckpointGlue, TableNamesAreOneToOneAndValid) {
  EXPECT_EQ(table_name("user/emb"), "user-2femb");
  EXPECT_EQ(table_name("a-b"), "a-2db");
  EXPECT_EQ(table_name("plain_Name.v2"), "plain_Name.v2");
  EXPECT_EQ(table_name("."), "-2e");
  EXPECT_EQ(table_name(".."), "-2e-2e");
  EXPECT_EQ(table_name(std::string("x\xff y", 4)), "x-ff-20y");
  // Names that a lossy spelling would merge stay apart.
  const std::vector<std::string> names = {"a/b", "a-b", "a.b", "a_b", "a-2fb", "a--b", "a/-b", "a-/b"};
  std::set<std::string> spelled;
  for (const auto& n : names) {
    const std::string t = table_name(n);
    for (char c : t)
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-') << t;
    spelled.insert(t);
  }
  EXPECT_EQ(spelled.size(), names.size());
  EXPECT_EQ(table_name(std::string(255, 'a')).size(), 255u);
  EXPECT_THROW(table_name(std::string(86, '/')), ConfigError);  // 258 bytes spelled
  EXPECT_THROW(table_name(""), ConfigError);
}

// Two shards of one table, merged: rows by id, counters summed, clock the largest, sketches
// added (saturating), evicted ids merged; equal to the export of one table holding every row.
TEST(DynamicCheckpointGlue, UnionOfShardsIsTheWholeTable) {
  DynamicTableConfig config;
  config.dim = 3;
  config.admit_after = 0;
  DynamicTable whole(config), a(config), b(config);
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < 200; ++i) ids.push_back(i * 7919 - 500);
  std::vector<float> out(ids.size() * 3), grads(ids.size() * 3, 0.5f);
  whole.lookup(ids.data(), ids.size(), out.data());
  whole.apply(ids.data(), ids.size(), grads.data(), 5);
  for (DynamicTable* t : {&a, &b}) {
    std::vector<std::int64_t> mine;
    for (auto id : ids)
      if (shard_of(id, 2) == (t == &a ? 0 : 1)) mine.push_back(id);
    std::vector<float> o(mine.size() * 3), g(mine.size() * 3, 0.5f);
    t->lookup(mine.data(), mine.size(), o.data());
    t->apply(mine.data(), mine.size(), g.data(), 5);
  }
  auto sa = full_state("t", config, a.export_rows());
  auto sb = full_state("t", config, b.export_rows());
  const auto want = full_state("t", config, whole.export_rows());
  const auto u = union_of_shards({sb, sa});
  EXPECT_EQ(u.ids, want.ids);
  EXPECT_EQ(u.values, want.values);
  EXPECT_EQ(u.slots, want.slots);
  EXPECT_EQ(u.stamps, want.stamps);
  EXPECT_EQ(u.total_rows, want.total_rows);
  EXPECT_EQ(u.clock, want.clock);
  EXPECT_EQ(u.counters.updates, want.counters.updates);
  // An id on two shards is refused.
  auto dup = sa;
  dup.ids[0] = sb.ids[0];
  EXPECT_THROW(union_of_shards({dup, sb}), Error);
  // Shards of different widths are refused.
  auto narrow = sb;
  narrow.dim = 2;
  EXPECT_THROW(union_of_shards({sa, narrow}), Error);
}

// The start-up sweep (checkpoint::remove_orphaned_files) removes a killed dynamic save's .tmp and
// the tables file of a save whose dense part never committed (above the newest named step), and
// keeps every older tables file (a link of a named step's chain) and names that are no save's.
TEST(DynamicCheckpointGlue, StartUpSweepRemovesUncommittedTablesFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("strata_dynsave_sweep_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto touch = [&](const std::string& name) { std::ofstream(dir / name) << "x"; };
  for (const char* n : {"dynamic-4.h5", "dynamic-8.h5", "dynamic-12.h5", "dynamic-12.h5.tmp", "dynamic-16.h5",
                        "dynamic-016.h5", "dynamic-x.h5", "ckpt-8.h5"})
    touch(n);
  std::ofstream(dir / "checkpoint.json")
      << R"({"format_version": 2, "latest": "ckpt-8.h5", "checkpoints": [{"file": "ckpt-8.h5", "global_step": 8, "created_unix": 1}]})";
  const auto swept = checkpoint::remove_orphaned_files(dir.string(), "");
  EXPECT_EQ(swept.removed, (std::vector<std::string>{"dynamic-12.h5", "dynamic-12.h5.tmp", "dynamic-16.h5"}));
  for (const char* n : {"dynamic-4.h5", "dynamic-8.h5", "dynamic-016.h5", "dynamic-x.h5", "ckpt-8.h5"})
    EXPECT_TRUE(fs::exists(dir / n)) << n;
  // Without a readable checkpoint.json, complete files stay; a .tmp still goes.
  fs::remove(dir / "checkpoint.json");
  touch("dynamic-20.h5");
  touch("dynamic-20.h5.tmp");
  const auto again = checkpoint::remove_orphaned_files(dir.string(), "");
  EXPECT_EQ(again.removed, (std::vector<std::string>{"dynamic-20.h5.tmp"}));
  EXPECT_TRUE(fs::exists(dir / "dynamic-20.h5"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata::ps
