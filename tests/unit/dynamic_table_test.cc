// The PS's dynamic embedding table (src/ps/dynamic_table.h): deterministic rows, the dense
// optimizers' bits, admission, TTL and capacity eviction with their counters, snapshots (also
// across shard counts), growth with colliding ids, the ids an index might reserve, memory per row,
// hostile arguments, and a randomized comparison with a std::unordered_map model.
#include "ps/dynamic_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <unordered_map>
#include <vector>

#include "ps/apply_team.h"
#include "strata/common/error.h"
#include "strata/ps/optimizer.h"
#include "strata/ps/variable.h"

namespace strata::ps {
namespace {

using Mode = DynamicTable::LookupMode;

DynamicTableConfig make_config(OptimizerKind kind = OptimizerKind::kAdagrad, std::int64_t dim = 8) {
  DynamicTableConfig c;
  c.dim = dim;
  c.init = Initializer::uniform(-0.5, 0.5, 42);
  c.optimizer = OptimizerConfig::defaults(kind);
  c.optimizer.learning_rate = 0.1;
  if (kind == OptimizerKind::kFtrl) {
    c.optimizer.l1 = 0.001;
    c.optimizer.l2 = 0.01;
    c.optimizer.l2_shrinkage = 0.001;
  }
  c.capacity = 1 << 20;
  return c;
}

// The row a fresh table must create for `id`: ps::fill with the row's own seed, computed here
// without the table.
std::vector<float> expected_init(const DynamicTableConfig& c, std::int64_t id) {
  Initializer init = c.init;
  init.seed = row_seed(c.init.seed, id);
  std::vector<float> row(static_cast<std::size_t>(c.dim));
  fill(init, DType::kF32, {1, c.dim}, 0, 1, row.data());
  return row;
}

std::vector<float> lookup(DynamicTable& t, const std::vector<std::int64_t>& ids, Mode mode = Mode::kTrain) {
  std::vector<float> out(ids.size() * static_cast<std::size_t>(t.dim()), -7.0f);
  t.lookup(ids.data(), ids.size(), out.data(), mode);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same_snapshot(const DynamicTableSnapshot& a, const DynamicTableSnapshot& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_TRUE(same_bits(a.values, b.values));
  ASSERT_EQ(a.slots.size(), b.slots.size());
  for (std::size_t k = 0; k < a.slots.size(); ++k) EXPECT_TRUE(same_bits(a.slots[k], b.slots[k])) << "slot " << k;
  EXPECT_EQ(a.stamps, b.stamps);
  EXPECT_EQ(a.update_counts, b.update_counts);
}

std::vector<float> random_grads(std::mt19937_64& gen, std::size_t n, std::int64_t dim) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> out(n * static_cast<std::size_t>(dim));
  for (float& x : out) x = g(gen);
  return out;
}

// ---- hashing and determinism ------------------------------------------------------------------

TEST(DynamicTable, RowsAreAFunctionOfSeedAndIdOnly) {
  const DynamicTableConfig c = make_config();
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < 500; ++i) ids.push_back(i * 7919 - 1000);
  std::vector<std::int64_t> reversed(ids.rbegin(), ids.rend());

  DynamicTable a(c), b(c);
  lookup(a, ids);
  lookup(b, reversed);
  // A third table holds only shard 1 of 3, as a PS would.
  DynamicTable shard(c);
  std::vector<std::int64_t> mine;
  for (std::int64_t id : ids)
    if (shard_of(id, 3) == 1) mine.push_back(id);
  ASSERT_FALSE(mine.empty());
  lookup(shard, mine);

  for (std::int64_t id : ids) {
    const std::vector<float> want = expected_init(c, id);
    EXPECT_TRUE(same_bits(lookup(a, {id}), want)) << id;
    EXPECT_TRUE(same_bits(lookup(b, {id}), want)) << id;
  }
  for (std::int64_t id : mine) EXPECT_TRUE(same_bits(lookup(shard, {id}), expected_init(c, id))) << id;
  EXPECT_EQ(a.size(), 500);
  EXPECT_EQ(a.stats().admitted, 500);
  // The values are the initializer's: inside [-0.5, 0.5), and not all the same.
  const std::vector<float> row = lookup(a, {ids[0]});
  for (float v : row) EXPECT_TRUE(v >= -0.5f && v < 0.5f) << v;
  EXPECT_FALSE(same_bits(lookup(a, {ids[0]}), lookup(a, {ids[1]})));
  // Another seed gives other rows.
  DynamicTableConfig other = c;
  other.init.seed = 43;
  DynamicTable d(other);
  EXPECT_FALSE(same_bits(lookup(d, {ids[0]}), row));
}

TEST(DynamicTable, ShardOfIsStableAndMovesFewIdsWhenShardsAreAdded) {
  std::vector<int> counts(4, 0);
  int moved = 0;
  for (std::int64_t id = -20000; id < 20000; ++id) {
    const int s4 = shard_of(id, 4);
    ASSERT_GE(s4, 0);
    ASSERT_LT(s4, 4);
    ++counts[static_cast<std::size_t>(s4)];
    EXPECT_EQ(shard_of(id, 1), 0);
    const int s5 = shard_of(id, 5);
    if (s5 != s4) {
      EXPECT_EQ(s5, 4) << "an id that moves goes to the new shard";
      ++moved;
    }
  }
  for (int n : counts) EXPECT_NEAR(n, 10000, 600);
  EXPECT_NEAR(moved, 40000 / 5, 800);
  EXPECT_EQ(shard_of(std::numeric_limits<std::int64_t>::min(), 7), shard_of(std::numeric_limits<std::int64_t>::min(), 7));
  EXPECT_THROW(shard_of(1, 0), Error);
}

// ---- optimizer bits ---------------------------------------------------------------------------

TEST(DynamicTable, ApplyRowsMatchesApplyDense) {
  std::mt19937_64 gen(5);
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                             OptimizerKind::kRmsProp, OptimizerKind::kFtrl}) {
    const OptimizerConfig cfg = make_config(kind).optimizer;
    for (std::size_t dim : {std::size_t{1}, std::size_t{16}, std::size_t{37}, std::size_t{1100}}) {
      const std::size_t stride = dim;
      std::vector<float> rec = random_grads(gen, 3, static_cast<std::int64_t>(dim));  // values + 2 slots
      for (std::size_t i = dim; i < rec.size(); ++i) rec[i] = std::abs(rec[i]);     // accumulators >= 0
      std::vector<float> dense = rec;
      const std::vector<float> g = random_grads(gen, 1, static_cast<std::int64_t>(dim));
      float* rows[] = {rec.data()};
      const float* grads[] = {g.data()};
      apply_rows(cfg, 3, rows, stride, dim, grads, 1);
      float* slots[] = {dense.data() + dim, dense.data() + 2 * dim};
      apply_dense(cfg, 3, dense.data(), slots, g.data(), dim);
      EXPECT_TRUE(same_bits(rec, dense)) << to_string(kind) << " dim " << dim;
    }
  }
  const OptimizerConfig sgd = make_config(OptimizerKind::kSgd).optimizer;
  EXPECT_THROW(apply_rows(sgd, 0, nullptr, 1, 1, nullptr, 0), Error);
  apply_rows(sgd, 1, nullptr, 1, 1, nullptr, 0);  // nothing to do
}

// A dense variable holding the table's rows, updated through apply_sparse_rows with the same
// batches (duplicates included), ends bit-identical to the table.
TEST(DynamicTable, ApplyMatchesTheDenseOptimizerBitForBit) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                             OptimizerKind::kRmsProp, OptimizerKind::kFtrl}) {
    const DynamicTableConfig c = make_config(kind, 16);
    DynamicTable table(c);
    std::vector<std::int64_t> ids;
    for (std::int64_t i = 0; i < 64; ++i) ids.push_back((i * 0x9E3779B97F4A7C15ll) ^ i);
    lookup(table, ids);
    // The dense copy: row k holds ids[k].
    const DynamicTableSnapshot start = table.export_rows();
    const std::size_t dim = 16, rows = ids.size();
    std::vector<float> var(rows * dim);
    std::vector<std::vector<float>> slots(start.slots.size(), std::vector<float>(rows * dim));
    std::map<std::int64_t, std::int64_t> row_of;
    for (std::size_t k = 0; k < rows; ++k) {
      const auto at = static_cast<std::size_t>(std::lower_bound(start.ids.begin(), start.ids.end(), ids[k]) - start.ids.begin());
      row_of[ids[k]] = static_cast<std::int64_t>(k);
      std::memcpy(&var[k * dim], &start.values[at * dim], dim * sizeof(float));
      for (std::size_t s = 0; s < slots.size(); ++s) std::memcpy(&slots[s][k * dim], &start.slots[s][at * dim], dim * sizeof(float));
    }
    std::mt19937_64 gen(11);
    std::uniform_int_distribution<std::size_t> pick(0, rows - 1);
    for (std::int64_t step = 1; step <= 6; ++step) {
      std::vector<std::int64_t> batch, dense_rows;
      for (int i = 0; i < 48; ++i) {  // 48 draws from 64 ids: duplicates certain
        batch.push_back(ids[pick(gen)]);
        dense_rows.push_back(row_of[batch.back()]);
      }
      const std::vector<float> g = random_grads(gen, batch.size(), 16);
      table.apply(batch.data(), batch.size(), g.data(), step);
      std::vector<float*> slot_ptrs;
      for (auto& s : slots) slot_ptrs.push_back(s.data());
      apply_sparse_rows(c.optimizer, step, var.data(), slot_ptrs.data(), dim, dense_rows.data(), g.data(), batch.size());
    }
    const DynamicTableSnapshot end = table.export_rows();
    int differing = 0;
    for (std::size_t k = 0; k < rows; ++k) {
      const auto at = static_cast<std::size_t>(std::lower_bound(end.ids.begin(), end.ids.end(), ids[k]) - end.ids.begin());
      differing += std::memcmp(&var[k * dim], &end.values[at * dim], dim * sizeof(float)) != 0;
      for (std::size_t s = 0; s < slots.size(); ++s)
        differing += std::memcmp(&slots[s][k * dim], &end.slots[s][at * dim], dim * sizeof(float)) != 0;
    }
    EXPECT_EQ(differing, 0) << to_string(kind);
    EXPECT_FALSE(same_bits(start.values, end.values)) << to_string(kind) << ": nothing was updated";
    EXPECT_EQ(table.stats().rejected_updates, 0);
  }
}

// ---- admission --------------------------------------------------------------------------------

TEST(DynamicTable, AdmissionAfterNSightings) {
  DynamicTableConfig c = make_config(OptimizerKind::kSgd, 4);
  c.admit_after = 3;
  DynamicTable t(c);
  const std::vector<float> zeros(4, 0.0f), g(4, 1.0f);
  const std::int64_t id = -123456789;
  EXPECT_TRUE(same_bits(lookup(t, {id}), zeros));  // seen once
  t.apply(&id, 1, g.data(), 1);                    // dropped: not admitted
  EXPECT_TRUE(same_bits(lookup(t, {id}, Mode::kInference), zeros));  // inference does not count
  EXPECT_EQ(t.size(), 0);
  EXPECT_TRUE(same_bits(lookup(t, {id}), zeros));  // seen twice
  EXPECT_EQ(t.size(), 0);
  EXPECT_TRUE(same_bits(lookup(t, {id}), expected_init(c, id)));  // third time: a row
  EXPECT_EQ(t.size(), 1);
  DynamicTableStats s = t.stats();
  EXPECT_EQ(s.rejected_lookups, 2);
  EXPECT_EQ(s.rejected_updates, 1);
  EXPECT_EQ(s.admitted, 1);
  EXPECT_EQ(s.lookups, 4);
  EXPECT_EQ(s.updates, 0);
  t.apply(&id, 1, g.data(), 2);
  EXPECT_EQ(t.stats().updates, 1);

  // Duplicates in one batch count as sightings each.
  const std::int64_t other = 77;
  const std::vector<float> three = lookup(t, {other, other, other});
  EXPECT_TRUE(same_bits(std::vector<float>(three.begin(), three.begin() + 8), std::vector<float>(8, 0.0f)));
  EXPECT_TRUE(same_bits(std::vector<float>(three.begin() + 8, three.end()), expected_init(c, other)));

  // An admitted id whose row was evicted comes back on its next update (its count stays >= N).
  EXPECT_EQ(t.evict_older_than(100, 10), 2);
  EXPECT_EQ(t.size(), 0);
  t.apply(&id, 1, g.data(), 101);
  EXPECT_EQ(t.size(), 1);
  std::vector<float> want = expected_init(c, id);
  for (float& v : want) v = v - 1.0f * static_cast<float>(c.optimizer.learning_rate);
  EXPECT_TRUE(same_bits(lookup(t, {id}), want));

  // Decay halves the counts: an id seen twice (count 2) drops to 1 and needs two more sightings.
  const std::int64_t late = 5;
  lookup(t, {late, late});
  t.decay_admission_counts();
  EXPECT_TRUE(same_bits(lookup(t, {late}), zeros));
  EXPECT_TRUE(same_bits(lookup(t, {late}), expected_init(c, late)));
}

TEST(DynamicTable, AdmitAfterZeroAndOneAdmitAtOnce) {
  for (std::int64_t n : {0, 1}) {
    DynamicTableConfig c = make_config(OptimizerKind::kSgd, 4);
    c.admit_after = n;
    DynamicTable t(c);
    const std::vector<float> g(4, 1.0f);
    const std::int64_t id = 9;
    t.apply(&id, 1, g.data(), 1);  // an update creates the row too
    EXPECT_EQ(t.size(), 1);
    EXPECT_EQ(t.stats().rejected_updates, 0);
  }
}

// ---- eviction ---------------------------------------------------------------------------------

TEST(DynamicTable, TtlEvictionRemovesRowsNotUpdatedForTSteps) {
  const DynamicTableConfig c = make_config(OptimizerKind::kSgd, 4);
  DynamicTable t(c);
  const std::vector<float> g(4, 0.5f);
  // id k updated last at step k (ids 1..10); id 100 only looked up (stamped at the clock then, 0).
  lookup(t, {100});
  for (std::int64_t k = 1; k <= 10; ++k) t.apply(&k, 1, g.data(), k);
  EXPECT_EQ(t.size(), 11);
  // global step 12, ttl 5: rows with stamp + 5 <= 12, i.e. stamps 0..7, go.
  EXPECT_EQ(t.evict_older_than(12, 5), 8);
  EXPECT_EQ(t.size(), 3);
  const DynamicTableSnapshot s = t.export_rows();
  EXPECT_EQ(s.ids, (std::vector<std::int64_t>{8, 9, 10}));
  EXPECT_EQ(s.stamps, (std::vector<std::int64_t>{8, 9, 10}));
  EXPECT_EQ(t.stats().evicted_ttl, 8);
  EXPECT_EQ(t.evict_older_than(12, 5), 0);
  // An evicted id comes back as a fresh row.
  EXPECT_TRUE(same_bits(lookup(t, {3}), expected_init(c, 3)));
  EXPECT_EQ(t.stats().admitted, 12);
  // The clock moved to 12: the re-created row is stamped 12.
  EXPECT_EQ(t.export_rows().stamps.front(), 12);
  EXPECT_THROW(t.evict_older_than(12, 0), Error);
  EXPECT_THROW(t.evict_older_than(-1, 5), Error);
  // The largest global step (a row's stamp holds 32 bits) with the largest ttl, then ttl 1.
  EXPECT_THROW(t.evict_older_than(std::numeric_limits<std::int64_t>::max(), 1), Error);
  EXPECT_EQ(t.evict_older_than(kMaxDynamicStep, std::numeric_limits<std::int64_t>::max()), 0);
  EXPECT_EQ(t.evict_older_than(kMaxDynamicStep, 1), 4);
}

TEST(DynamicTable, CapacityEvictsTheLeastRecentlyUpdatedRow) {
  DynamicTableConfig c = make_config(OptimizerKind::kAdam, 4);
  c.capacity = 8;
  DynamicTable t(c);
  const std::vector<float> g(4, 0.25f);
  // ids 1..8 updated at steps 1..8, then id 3 again at step 9: least recent are 1, 2, 4, 5...
  for (std::int64_t k = 1; k <= 8; ++k) t.apply(&k, 1, g.data(), k);
  const std::int64_t three = 3;
  t.apply(&three, 1, g.data(), 9);
  EXPECT_EQ(t.size(), 8);
  for (std::int64_t id : {101, 102, 103}) {
    t.apply(&id, 1, g.data(), 10);
    EXPECT_EQ(t.size(), 8);
  }
  EXPECT_EQ(t.export_rows().ids, (std::vector<std::int64_t>{3, 5, 6, 7, 8, 101, 102, 103}));
  EXPECT_EQ(t.stats().evicted_capacity, 3);
  // A row evicted and recreated starts over from its initial values and slots.
  const std::int64_t one = 1;
  t.apply(&one, 1, g.data(), 11);  // evicts 5
  DynamicTable fresh(c);
  fresh.apply(&one, 1, g.data(), 11);
  const DynamicTableSnapshot a = t.export_rows(), b = fresh.export_rows();
  EXPECT_TRUE(same_bits(std::vector<float>(a.values.begin(), a.values.begin() + 4), b.values));
  EXPECT_EQ(a.ids.front(), 1);
  EXPECT_EQ(std::count(a.ids.begin(), a.ids.end(), 5), 0);

  // Rows of the current step are never evicted to make room: a batch of 12 new ids at one step
  // keeps the first 8 and refuses 4.
  DynamicTable small(c);
  std::vector<std::int64_t> batch;
  for (std::int64_t i = 0; i < 12; ++i) batch.push_back(1000 + i);
  const std::vector<float> gg(batch.size() * 4, 1.0f);
  small.apply(batch.data(), batch.size(), gg.data(), 1);
  EXPECT_EQ(small.size(), 8);
  EXPECT_EQ(small.stats().rejected_full, 4);
  EXPECT_EQ(small.stats().updates, 8);
  // The next step may replace them: the four refused ids now take the place of the oldest four.
  small.apply(batch.data() + 8, 4, gg.data(), 2);
  EXPECT_EQ(small.size(), 8);
  EXPECT_EQ(small.stats().evicted_capacity, 4);
  // Same stamp: ties go by id, the four smallest.
  EXPECT_EQ(small.export_rows().ids, (std::vector<std::int64_t>{1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011}));
}

// Rounds (sync training): two workers' lookups of a step reach the table in either order; with
// admission and capacity eviction both orders must give every worker the same rows and leave the
// same table, equal to the order "worker 0, then worker 1". Without rounds they do not (checked,
// so that the test shows what rounds are for).
TEST(DynamicTable, RoundsMakeLookupOrderIrrelevantWithAdmissionAndCapacity) {
  auto run = [](bool rounds, bool swap_order, std::vector<std::vector<float>>* seen) {
    DynamicTableConfig c = make_config(OptimizerKind::kAdagrad, 4);
    c.capacity = 48;
    c.admit_after = 2;
    c.sketch_width = 64;
    c.round_boundaries = rounds;
    DynamicTable t(c);
    std::mt19937_64 gen(11);
    for (std::int64_t step = 1; step <= 30; ++step) {
      std::vector<std::int64_t> ids[2];
      for (auto& v : ids)
        for (int i = 0; i < 20; ++i) v.push_back(static_cast<std::int64_t>(gen() % 90) * 7919 - 3000);
      std::vector<float> out[2];
      for (int k = 0; k < 2; ++k) {
        const int w = swap_order ? 1 - k : k;
        out[w] = lookup(t, ids[w]);
      }
      seen->push_back(out[0]);
      seen->push_back(out[1]);
      for (int w = 0; w < 2; ++w) {
        const std::vector<float> g = random_grads(gen, ids[w].size(), 4);
        t.apply(ids[w].data(), ids[w].size(), g.data(), step);
      }
      t.end_round();
      if (rounds) {
        EXPECT_LE(t.size(), c.capacity) << "step " << step;
      }
    }
    return t.export_rows();
  };
  std::vector<std::vector<float>> a, b, c, d;
  const DynamicTableSnapshot in_order = run(true, false, &a), swapped = run(true, true, &b);
  expect_same_snapshot(in_order, swapped);
  EXPECT_EQ(in_order.sketch, swapped.sketch);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "lookup " << i;
  // Something was admitted, evicted and trained.
  EXPECT_GT(in_order.stats.evicted_capacity, 0);
  EXPECT_GT(in_order.stats.rejected_lookups, 0);
  EXPECT_GT(in_order.stats.updates, 100);
  // The same job without rounds depends on the order.
  const DynamicTableSnapshot plain = run(false, false, &c), plain_swapped = run(false, true, &d);
  EXPECT_FALSE(plain.ids == plain_swapped.ids && same_bits(plain.values, plain_swapped.values) && c == d);
}

TEST(DynamicTable, CapacityEvictionAtScaleKeepsTheNewestRows) {
  DynamicTableConfig c = make_config(OptimizerKind::kSgd, 2);
  c.capacity = 5000;
  DynamicTable t(c);
  std::vector<float> g(2 * 100, 0.1f);
  // 200 steps of 100 new ids each: 20000 ids through a 5000-row table.
  for (std::int64_t step = 1; step <= 200; ++step) {
    std::vector<std::int64_t> ids;
    for (std::int64_t i = 0; i < 100; ++i) ids.push_back(step * 1000 + i);
    t.apply(ids.data(), ids.size(), g.data(), step);
    ASSERT_LE(t.size(), 5000);
  }
  const DynamicTableSnapshot s = t.export_rows();
  ASSERT_EQ(s.ids.size(), 5000u);
  // The survivors are exactly the last 50 steps' ids.
  EXPECT_EQ(s.ids.front(), 151 * 1000);
  EXPECT_EQ(s.ids.back(), 200 * 1000 + 99);
  EXPECT_EQ(t.stats().evicted_capacity, 15000);
  EXPECT_EQ(t.stats().rejected_full, 0);
}

// ---- snapshots --------------------------------------------------------------------------------

TEST(DynamicTable, ExportImportRoundTripIsBitEqual) {
  DynamicTableConfig c = make_config(OptimizerKind::kFtrl, 8);
  c.admit_after = 2;
  c.sketch_width = 1 << 12;
  DynamicTable a(c);
  std::mt19937_64 gen(3);
  std::uniform_int_distribution<std::int64_t> pick(-3000, 3000);
  for (std::int64_t step = 1; step <= 30; ++step) {
    std::vector<std::int64_t> ids(64);
    for (auto& id : ids) id = pick(gen) * 1000003;
    lookup(a, ids);
    const std::vector<float> g = random_grads(gen, ids.size(), 8);
    a.apply(ids.data(), ids.size(), g.data(), step);
    if (step % 10 == 0) a.evict_older_than(step, 15);
  }
  const DynamicTableSnapshot snap = a.export_rows();
  ASSERT_GT(snap.ids.size(), 100u);
  EXPECT_TRUE(std::is_sorted(snap.ids.begin(), snap.ids.end()));
  EXPECT_EQ(snap.slots.size(), 2u);

  DynamicTable b(c);
  b.import_rows(snap);
  const DynamicTableSnapshot again = b.export_rows();
  expect_same_snapshot(snap, again);
  EXPECT_EQ(again.clock, snap.clock);
  EXPECT_EQ(again.sketch, snap.sketch);
  const DynamicTableStats sa = a.stats(), sb = b.stats();
  EXPECT_EQ(sb.rows, sa.rows);
  EXPECT_EQ(sb.admitted, sa.admitted);
  EXPECT_EQ(sb.lookups, sa.lookups);
  EXPECT_EQ(sb.updates, sa.updates);
  EXPECT_EQ(sb.rejected_lookups, sa.rejected_lookups);
  EXPECT_EQ(sb.rejected_updates, sa.rejected_updates);
  EXPECT_EQ(sb.evicted_ttl, sa.evicted_ttl);
  EXPECT_EQ(sb.imported, static_cast<std::int64_t>(snap.ids.size()));

  // The restored table behaves as the original from here on (admission counts included).
  std::vector<std::int64_t> ids(200);
  for (auto& id : ids) id = pick(gen) * 1000003;
  const std::vector<float> g = random_grads(gen, ids.size(), 8);
  EXPECT_TRUE(same_bits(lookup(a, ids), lookup(b, ids)));
  a.apply(ids.data(), ids.size(), g.data(), 31);
  b.apply(ids.data(), ids.size(), g.data(), 31);
  expect_same_snapshot(a.export_rows(), b.export_rows());
}

TEST(DynamicTable, ImportIntoADifferentShardCountGivesTheSameRows) {
  const DynamicTableConfig c = make_config(OptimizerKind::kAdam, 8);
  // Two "old" shards hold the ids of shard_of(id, 2).
  DynamicTable old0(c), old1(c), whole(c);
  std::mt19937_64 gen(8);
  std::uniform_int_distribution<std::int64_t> pick(std::numeric_limits<std::int64_t>::min(),
                                                   std::numeric_limits<std::int64_t>::max());
  std::vector<std::int64_t> universe(2000);
  for (auto& id : universe) id = pick(gen);
  std::uniform_int_distribution<std::size_t> draw(0, universe.size() - 1);
  for (std::int64_t step = 1; step <= 10; ++step) {
    std::vector<std::int64_t> ids(300), part[2];
    for (auto& id : ids) id = universe[draw(gen)];
    const std::vector<float> g = random_grads(gen, ids.size(), 8);
    std::vector<float> gpart[2];
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const int s = shard_of(ids[i], 2);
      part[s].push_back(ids[i]);
      gpart[s].insert(gpart[s].end(), g.begin() + static_cast<std::ptrdiff_t>(i * 8), g.begin() + static_cast<std::ptrdiff_t>(i * 8 + 8));
    }
    whole.apply(ids.data(), ids.size(), g.data(), step);
    old0.apply(part[0].data(), part[0].size(), gpart[0].data(), step);
    old1.apply(part[1].data(), part[1].size(), gpart[1].data(), step);
  }
  const DynamicTableSnapshot s0 = old0.export_rows(), s1 = old1.export_rows();
  // Three new shards each read both old snapshots and keep their own ids.
  std::vector<std::int64_t> all_ids;
  std::size_t total = 0;
  for (int s = 0; s < 3; ++s) {
    DynamicTable fresh(c);
    fresh.import_rows(s0, s, 3);
    fresh.import_rows(s1, s, 3);
    const DynamicTableSnapshot mine = fresh.export_rows();
    total += mine.ids.size();
    for (std::int64_t id : mine.ids) EXPECT_EQ(shard_of(id, 3), s);
    // Every row equals the single table's row for that id, values and slots.
    const DynamicTableSnapshot w = whole.export_rows();
    for (std::size_t i = 0; i < mine.ids.size(); ++i) {
      const auto at = static_cast<std::size_t>(std::lower_bound(w.ids.begin(), w.ids.end(), mine.ids[i]) - w.ids.begin());
      ASSERT_LT(at, w.ids.size());
      ASSERT_EQ(w.ids[at], mine.ids[i]);
      EXPECT_EQ(std::memcmp(&w.values[at * 8], &mine.values[i * 8], 8 * sizeof(float)), 0);
      for (std::size_t k = 0; k < 2; ++k) EXPECT_EQ(std::memcmp(&w.slots[k][at * 8], &mine.slots[k][i * 8], 8 * sizeof(float)), 0);
      EXPECT_EQ(w.stamps[at], mine.stamps[i]);
    }
    EXPECT_EQ(fresh.stats().admitted, 0) << "a reshard does not add the old shards' counters";
    EXPECT_EQ(fresh.stats().imported, static_cast<std::int64_t>(mine.ids.size()));
  }
  EXPECT_EQ(total, whole.export_rows().ids.size());
}

TEST(DynamicTable, ImportRejectsABadSnapshotAndChangesNothing) {
  const DynamicTableConfig c = make_config(OptimizerKind::kAdagrad, 4);
  DynamicTable src(c);
  lookup(src, {1, 2, 3});
  const DynamicTableSnapshot good = src.export_rows();
  DynamicTable t(c);
  lookup(t, {50});
  const DynamicTableSnapshot before = t.export_rows();
  auto rejects = [&](DynamicTableSnapshot s, const char* what) {
    EXPECT_THROW(t.import_rows(s), Error) << what;
    expect_same_snapshot(t.export_rows(), before);
  };
  DynamicTableSnapshot s = good;
  s.dim = 5;
  rejects(s, "dim");
  s = good;
  s.values.pop_back();
  rejects(s, "values size");
  s = good;
  s.slots.clear();
  rejects(s, "slot count");
  s = good;
  s.slots[0].push_back(1.0f);
  rejects(s, "slot size");
  s = good;
  s.stamps.pop_back();
  rejects(s, "stamps");
  s = good;
  std::swap(s.ids[0], s.ids[1]);
  rejects(s, "unsorted ids");
  s = good;
  s.ids[1] = s.ids[0];
  rejects(s, "duplicate ids");
  s = good;
  s.stamps[2] = -5;
  rejects(s, "negative stamp");
  s = good;
  s.clock = -1;
  rejects(s, "negative clock");
  s = good;
  s.sketch.assign(7, 1);
  s.sketch_width = 64;
  rejects(s, "sketch size");
  EXPECT_THROW(t.import_rows(good, 3, 3), Error);
  EXPECT_THROW(t.import_rows(good, 0, 0), Error);
  DynamicTableConfig tiny = c;
  tiny.capacity = 2;
  DynamicTable small(tiny);
  EXPECT_THROW(small.import_rows(good), Error);
  EXPECT_EQ(small.size(), 0);
}

// ---- hostile ids and sizes --------------------------------------------------------------------

TEST(DynamicTable, EveryInt64IsAnOrdinaryId) {
  const DynamicTableConfig c = make_config(OptimizerKind::kSgd, 4);
  DynamicTable t(c);
  const std::vector<std::int64_t> ids = {std::numeric_limits<std::int64_t>::min(),
                                         std::numeric_limits<std::int64_t>::max(),
                                         -1,
                                         0,
                                         1,
                                         0xffffffffll,
                                         -0x100000000ll,
                                         std::numeric_limits<std::int64_t>::min() + 1};
  lookup(t, ids);
  EXPECT_EQ(t.size(), static_cast<std::int64_t>(ids.size()));
  for (std::int64_t id : ids) EXPECT_TRUE(same_bits(lookup(t, {id}), expected_init(c, id))) << id;
  // Updates, eviction and re-creation of the extremes.
  const std::vector<float> g(ids.size() * 4, 1.0f);
  t.apply(ids.data(), 4, g.data(), 1);
  EXPECT_EQ(t.evict_older_than(5, 2), 8);
  EXPECT_EQ(t.size(), 0);
  lookup(t, ids);
  EXPECT_EQ(t.size(), 8);
  EXPECT_EQ(t.export_rows().ids.front(), std::numeric_limits<std::int64_t>::min());
}

TEST(DynamicTable, GrowthWithIdsCollidingInTheLowBits) {
  const DynamicTableConfig c = make_config(OptimizerKind::kSgd, 2);
  DynamicTable t(c);
  std::vector<std::int64_t> ids;
  for (std::int64_t k = 1; k <= 100000; ++k) ids.push_back(k << 32);       // equal low 32 bits
  for (std::int64_t k = 1; k <= 50000; ++k) ids.push_back(-(k << 44));     // equal low 44 bits
  for (std::int64_t k = 1; k <= 50000; ++k) ids.push_back((k << 20) | 7);  // equal low 20 bits
  for (std::size_t b = 0; b < ids.size(); b += 4096) {
    const std::size_t n = std::min<std::size_t>(4096, ids.size() - b);
    std::vector<float> out(n * 2);
    t.lookup(ids.data() + b, n, out.data());
  }
  ASSERT_EQ(t.size(), 200000);
  // Every id reads back its own row; a miss creates nothing in inference mode.
  int wrong = 0;
  for (std::size_t i = 0; i < ids.size(); i += 7) wrong += !same_bits(lookup(t, {ids[i]}, Mode::kInference), expected_init(c, ids[i]));
  EXPECT_EQ(wrong, 0);
  EXPECT_TRUE(same_bits(lookup(t, {3}, Mode::kInference), std::vector<float>(2, 0.0f)));
  EXPECT_EQ(t.size(), 200000);
  // Remove half by TTL (update the other half at a later step) and look the rest up again.
  std::vector<std::int64_t> keep;
  for (std::size_t i = 0; i < ids.size(); i += 2) keep.push_back(ids[i]);
  const std::vector<float> g(keep.size() * 2, 0.0f);
  t.apply(keep.data(), keep.size(), g.data(), 10);
  EXPECT_EQ(t.evict_older_than(10, 1), 100000);
  wrong = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::vector<float> got = lookup(t, {ids[i]}, Mode::kInference);
    wrong += i % 2 == 0 ? !same_bits(got, expected_init(c, ids[i])) : !same_bits(got, std::vector<float>(2, 0.0f));
  }
  EXPECT_EQ(wrong, 0);
}

TEST(DynamicTable, MemoryPerRowStaysUnderOneAndAHalfTimesItsValues) {
  // 16-float SGD rows (64 bytes, no slots) are the tightest case: overhead is id + stamp + index.
  DynamicTableConfig c = make_config(OptimizerKind::kSgd, 16);
  DynamicTable t(c);
  EXPECT_EQ(t.stats().row_bytes, 64);
  std::vector<std::int64_t> ids(1000);
  std::vector<float> out(ids.size() * 16);
  double worst = 0, best = 2;
  for (std::int64_t b = 0; b < 300; ++b) {
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = b * 1000 + static_cast<std::int64_t>(i);
    t.lookup(ids.data(), ids.size(), out.data());
    const DynamicTableStats s = t.stats();
    if (s.rows < 20000) continue;
    const double ratio = static_cast<double>(s.bytes) / static_cast<double>(s.rows) / 64.0;
    worst = std::max(worst, ratio);
    best = std::min(best, ratio);
  }
  EXPECT_GT(worst, 1.0);
  EXPECT_LE(worst, 1.5);
  std::printf("16-float sgd rows, 20k-300k rows: %.1f to %.1f bytes per row (%.3fx to %.3fx of 64)\n", best * 64,
              worst * 64, best, worst);
  // Adagrad rows carry one slot: 128 bytes, far under.
  DynamicTable a(make_config(OptimizerKind::kAdagrad, 16));
  for (std::int64_t b = 0; b < 50; ++b) {
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = b * 1000 + static_cast<std::int64_t>(i);
    a.lookup(ids.data(), ids.size(), out.data());
  }
  EXPECT_LE(static_cast<double>(a.stats().bytes) / 50000.0 / 128.0, 1.3);
}

TEST(DynamicTable, BadArgumentsGiveOneClearError) {
  auto config_error = [](DynamicTableConfig c) {
    try {
      DynamicTable t(c);
    } catch (const ConfigError& e) {
      return std::string(e.message());
    }
    return std::string();
  };
  DynamicTableConfig c = make_config();
  c.dim = 0;
  EXPECT_NE(config_error(c).find("dim = 0"), std::string::npos);
  c = make_config();
  c.capacity = 0;
  EXPECT_NE(config_error(c).find("capacity = 0"), std::string::npos);
  c = make_config();
  c.admit_after = 70000;
  EXPECT_NE(config_error(c).find("admit_after"), std::string::npos);
  c = make_config();
  c.admit_after = 2;
  c.sketch_width = 1000;
  EXPECT_NE(config_error(c).find("sketch_width"), std::string::npos);
  c = make_config();
  c.init = Initializer::glorot_uniform(1);
  EXPECT_NE(config_error(c).find("glorot"), std::string::npos);
  c = make_config();
  c.optimizer.learning_rate = -1;
  EXPECT_NE(config_error(c).find("learning_rate"), std::string::npos);

  DynamicTable t(make_config(OptimizerKind::kSgd, 4));
  float out[4];
  const std::int64_t id = 1;
  EXPECT_THROW(t.lookup(nullptr, 1, out), Error);
  EXPECT_THROW(t.lookup(&id, 1, nullptr), Error);
  t.lookup(nullptr, 0, nullptr);  // nothing to do
  EXPECT_THROW(t.lookup(&id, std::numeric_limits<std::size_t>::max() / 2, out), Error);  // n * dim wraps
  EXPECT_THROW(t.apply(&id, 1, out, 0), Error);
  EXPECT_THROW(t.apply(&id, 1, nullptr, 1), Error);
  EXPECT_THROW(t.apply(&id, std::numeric_limits<std::size_t>::max() / 8, out, 1), Error);
  EXPECT_EQ(t.size(), 0);
}

// ---- randomized model -------------------------------------------------------------------------

// The table's contract written as plainly as possible: a map from id to row, exact sighting
// counts, stamps, and apply_dense on each distinct row with its gradients summed in order.
struct Model {
  struct Row {
    std::vector<float> v, s0, s1;
    std::int64_t stamp = 0;
    std::uint32_t updates = 0;  // batches that updated the row since its creation
  };
  DynamicTableConfig c;
  std::unordered_map<std::int64_t, Row> rows;
  std::unordered_map<std::int64_t, std::int64_t> seen;
  std::int64_t clock = 0;
  DynamicTableStats stats;

  Row& create(std::int64_t id) {
    Row& r = rows[id];
    r.v = expected_init(c, id);
    const auto dim = static_cast<std::size_t>(c.dim);
    r.s0.assign(dim, num_slots(c.optimizer.kind) > 0 ? static_cast<float>(slot_initial_value(c.optimizer, 0)) : 0.0f);
    r.s1.assign(dim, num_slots(c.optimizer.kind) > 1 ? static_cast<float>(slot_initial_value(c.optimizer, 1)) : 0.0f);
    r.stamp = clock;
    ++stats.admitted;
    return r;
  }
  std::vector<float> lookup(const std::vector<std::int64_t>& ids) {
    std::vector<float> out;
    for (std::int64_t id : ids) {
      auto it = rows.find(id);
      if (it == rows.end()) {
        if (++seen[id] >= c.admit_after) {
          const Row& r = create(id);
          out.insert(out.end(), r.v.begin(), r.v.end());
          continue;
        }
        ++stats.rejected_lookups;
        out.insert(out.end(), static_cast<std::size_t>(c.dim), 0.0f);
        continue;
      }
      out.insert(out.end(), it->second.v.begin(), it->second.v.end());
    }
    stats.lookups += static_cast<std::int64_t>(ids.size());
    return out;
  }
  void apply(const std::vector<std::int64_t>& ids, const std::vector<float>& g, std::int64_t step) {
    clock = std::max(clock, step);
    const auto dim = static_cast<std::size_t>(c.dim);
    std::vector<std::int64_t> order;
    std::unordered_map<std::int64_t, std::vector<float>> sum;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::int64_t id = ids[i];
      if (!rows.count(id)) {
        if (seen[id] < c.admit_after) {
          ++stats.rejected_updates;
          continue;
        }
        create(id);
      }
      auto [it, fresh] = sum.emplace(id, std::vector<float>(g.begin() + static_cast<std::ptrdiff_t>(i * dim),
                                                            g.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim)));
      if (fresh) {
        order.push_back(id);
      } else {
        for (std::size_t k = 0; k < dim; ++k) it->second[k] += g[i * dim + k];
      }
    }
    for (std::int64_t id : order) {
      Row& r = rows[id];
      r.stamp = clock;
      ++r.updates;
      float* slots[] = {r.s0.data(), r.s1.data()};
      apply_dense(c.optimizer, step, r.v.data(), slots, sum[id].data(), dim);
    }
    stats.updates += static_cast<std::int64_t>(order.size());
  }
  std::int64_t evict(std::int64_t global_step, std::int64_t ttl) {
    clock = std::max(clock, global_step);
    std::int64_t removed = 0;
    for (auto it = rows.begin(); it != rows.end();) {
      if (it->second.stamp + ttl <= global_step) {
        it = rows.erase(it);
        ++removed;
      } else {
        ++it;
      }
    }
    stats.evicted_ttl += removed;
    return removed;
  }
};

// The stamp a table reports for a row last updated at `stamp` when its clock is `clock`, as
// dynamic_table.h states it: exact while the row is younger than 3 * 2^30 - 1 steps, else the
// table's base, the multiple of 2^30 at or below clock - (3 * 2^30 - 1).
std::int64_t reported_stamp(std::int64_t stamp, std::int64_t clock) {
  const std::int64_t keep = 3 * (std::int64_t{1} << 30) - 1;
  const std::int64_t base = clock <= keep ? 0 : (clock - keep) >> 30 << 30;
  return std::max(stamp, base);
}

// Random lookups (with admission), applies and TTL evictions, into the table and the model, then
// every row compared bit for bit. After each apply the step moves by `advance(gen)`; an eviction
// takes `ttl(gen)`.
void expect_table_matches_model(std::uint64_t seed, const std::function<std::int64_t(std::mt19937_64&)>& advance,
                                const std::function<std::int64_t(std::mt19937_64&)>& ttl) {
  DynamicTableConfig c = make_config(OptimizerKind::kAdam, 3);
  c.admit_after = 2;
  c.sketch_width = 1 << 20;  // wide: no id's four counters all collide, so counts are exact
  DynamicTable table(c);
  Model model{c, {}, {}, 0, {}};
  std::mt19937_64 gen(seed);
  // A few thousand distinct ids, some extreme, drawn with a skew so that rows see many updates.
  std::vector<std::int64_t> universe;
  for (int i = 0; i < 3000; ++i) universe.push_back(static_cast<std::int64_t>(gen()));
  universe.push_back(std::numeric_limits<std::int64_t>::min());
  universe.push_back(-1);
  universe.push_back(0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto draw = [&] {
    const double x = u(gen);
    return universe[static_cast<std::size_t>(x * x * x * static_cast<double>(universe.size()))];
  };
  std::int64_t step = 1;
  int mismatches = 0;
  for (int op = 0; op < 100000; ++op) {
    const double kind = u(gen);
    std::vector<std::int64_t> ids(1 + gen() % 6);
    for (auto& id : ids) id = draw();
    if (kind < 0.55) {
      const std::vector<float> got = lookup(table, ids);
      const std::vector<float> want = model.lookup(ids);
      mismatches += !same_bits(got, want);
    } else if (kind < 0.98) {
      const std::vector<float> g = random_grads(gen, ids.size(), c.dim);
      table.apply(ids.data(), ids.size(), g.data(), step);
      model.apply(ids, g, step);
      step += advance(gen);
    } else {
      const std::int64_t t = ttl(gen);
      EXPECT_EQ(table.evict_older_than(step, t), model.evict(step, t)) << "op " << op << ", step " << step << ", ttl " << t;
    }
    if (op % 5000 == 4999) {
      const DynamicTableSnapshot s = table.export_rows();
      ASSERT_EQ(s.ids.size(), model.rows.size()) << "op " << op;
      EXPECT_EQ(s.clock, model.clock);
      for (std::size_t i = 0; i < s.ids.size(); ++i) {
        const Model::Row& r = model.rows.at(s.ids[i]);
        mismatches += std::memcmp(&s.values[i * 3], r.v.data(), 3 * sizeof(float)) != 0;
        mismatches += std::memcmp(&s.slots[0][i * 3], r.s0.data(), 3 * sizeof(float)) != 0;
        mismatches += std::memcmp(&s.slots[1][i * 3], r.s1.data(), 3 * sizeof(float)) != 0;
        mismatches += s.stamps[i] != reported_stamp(r.stamp, model.clock);
        mismatches += s.update_counts[i] != r.updates;
        mismatches += table.update_count(s.ids[i]) != std::int64_t{r.updates};
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  const DynamicTableStats got = table.stats();
  EXPECT_EQ(got.rows, static_cast<std::int64_t>(model.rows.size()));
  EXPECT_EQ(got.admitted, model.stats.admitted);
  EXPECT_EQ(got.lookups, model.stats.lookups);
  EXPECT_EQ(got.updates, model.stats.updates);
  EXPECT_EQ(got.rejected_lookups, model.stats.rejected_lookups);
  EXPECT_EQ(got.rejected_updates, model.stats.rejected_updates);
  EXPECT_EQ(got.evicted_ttl, model.stats.evicted_ttl);
  EXPECT_GT(got.evicted_ttl, 0);
  EXPECT_GT(got.rejected_lookups, 0);
  EXPECT_GT(got.updates, 10000);
}

TEST(DynamicTable, RandomizedAgainstAnUnorderedMapModel) {
  expect_table_matches_model(
      2024, [](std::mt19937_64& gen) { return gen() % 4 == 0 ? 1 : 0; },
      [](std::mt19937_64& gen) { return 1 + static_cast<std::int64_t>(gen() % 200); });
}

// Steps far past 2^32 (jumps of up to 2^31 and, now and then, up to 2^34 steps, so the stamp base
// moves hundreds of times and rows go older than the stamps' exact range) with TTLs up to the
// largest a spec allows: every eviction removes exactly the model's rows, and every row's stamp is
// the one dynamic_table.h states.
TEST(DynamicTableStamps, StepsPast32BitsMatchTheModel) {
  expect_table_matches_model(
      77,
      [](std::mt19937_64& gen) -> std::int64_t {
        const std::uint64_t r = gen() % 200;
        if (r < 4) return static_cast<std::int64_t>((std::uint64_t{1} << 32) + gen() % (std::uint64_t{3} << 32));
        if (r < 10) return 1 + static_cast<std::int64_t>(gen() % (std::uint64_t{1} << 31));
        return r < 60 ? 1 : 0;
      },
      [](std::mt19937_64& gen) -> std::int64_t {
        if (gen() % 2 == 0) return 1 + static_cast<std::int64_t>(gen() % 200);
        return 1 + static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(DynamicVariableSpec::kMaxTtl));
      });
}

// A table large enough for its row store to span many 2 MiB slabs, on both of the row store's
// ways onto huge pages (slabs collapsed once full, and, past the memory budget, slabs huge from
// their first touch): every row it returns and every row it updates is the model's, bit for bit,
// and its memory stays within 1.5x of its values and slots the whole way.
TEST(DynamicTable, RowsAcrossHugePageSlabsMatchTheModelWithinTheMemoryBudget) {
  DynamicTableConfig c = make_config(OptimizerKind::kAdagrad, 16);
  DynamicTable table(c);
  Model model{c, {}, {}, 0, {}};
  constexpr std::int64_t kRows = 200000;
  constexpr std::size_t kBatch = 4096;
  std::mt19937_64 gen(77);
  std::vector<std::int64_t> ids(kBatch);
  int mismatches = 0;
  double worst = 0;
  for (std::int64_t begin = 0; begin < kRows; begin += static_cast<std::int64_t>(kBatch)) {
    for (std::size_t i = 0; i < kBatch; ++i) ids[i] = static_cast<std::int64_t>(dynamic_mix64(static_cast<std::uint64_t>(begin) + i));
    mismatches += !same_bits(lookup(table, ids), model.lookup(ids));
    const DynamicTableStats s = table.stats();
    if (s.rows >= 20000) worst = std::max(worst, static_cast<double>(s.bytes) / static_cast<double>(s.rows) / 128.0);
  }
  EXPECT_EQ(table.size(), static_cast<std::int64_t>(model.rows.size()));
  EXPECT_LE(worst, 1.5);
  std::printf("adagrad 16-float rows, 20k-%lld rows: at most %.3fx of their values and slots; %lld bytes on huge pages\n",
              static_cast<long long>(kRows), worst, static_cast<long long>(table.huge_page_bytes()));
  // Batches of scattered ids with repeats (duplicates summed in order), checked at the end.
  for (std::int64_t step = 1; step <= 24; ++step) {
    for (auto& id : ids) id = static_cast<std::int64_t>(dynamic_mix64(gen() % static_cast<std::uint64_t>(kRows / 2) * 2));
    const std::vector<float> g = random_grads(gen, ids.size(), c.dim);
    table.apply(ids.data(), ids.size(), g.data(), step);
    model.apply(ids, g, step);
    mismatches += !same_bits(lookup(table, ids), model.lookup(ids));
  }
  const DynamicTableSnapshot s = table.export_rows();
  ASSERT_EQ(s.ids.size(), model.rows.size());
  for (std::size_t i = 0; i < s.ids.size(); ++i) {
    const Model::Row& r = model.rows.at(s.ids[i]);
    mismatches += std::memcmp(&s.values[i * 16], r.v.data(), 16 * sizeof(float)) != 0;
    mismatches += std::memcmp(&s.slots[0][i * 16], r.s0.data(), 16 * sizeof(float)) != 0;
    mismatches += s.update_counts[i] != r.updates;
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- update counts -----------------------------------------------------------------------------

// A row counts the batches that updated it: once per batch however often the batch names the id,
// nothing for lookups, nothing for gradients dropped before admission; a row created again after
// an eviction starts from 0.
TEST(DynamicTableCounts, EachAppliedBatchCountsOncePerRow) {
  DynamicTableConfig c = make_config(OptimizerKind::kSgd, 4);
  c.admit_after = 2;
  DynamicTable t(c);
  const std::vector<std::int64_t> a = {7, -3, 7, 7, 11};  // 7 three times, 11 not admitted
  lookup(t, {7, -3, 7});                                   // 7 sighted twice: admitted at the second
  EXPECT_EQ(t.update_count(7), 0);                         // admitted at its second sighting, not updated
  EXPECT_EQ(t.update_count(-3), -1);                       // one sighting: no row
  lookup(t, {-3});
  EXPECT_EQ(t.update_count(-3), 0);
  std::vector<float> g(a.size() * 4, 1.0f);
  for (std::int64_t step = 1; step <= 5; ++step) t.apply(a.data(), a.size(), g.data(), step);
  EXPECT_EQ(t.update_count(7), 5);
  EXPECT_EQ(t.update_count(-3), 5);
  EXPECT_EQ(t.update_count(11), -1);
  EXPECT_EQ(t.stats().rejected_updates, 5);
  EXPECT_EQ(t.stats().updates, 10);
  // Lookups neither count nor reset.
  lookup(t, {7, 7, -3});
  lookup(t, {7}, Mode::kInference);
  EXPECT_EQ(t.update_count(7), 5);
  // Evicted and created again: a new row, counting from 0.
  EXPECT_EQ(t.evict_older_than(100, 10), 2);
  EXPECT_EQ(t.update_count(7), -1);
  t.apply(a.data(), 2, g.data(), 101);  // 7 and -3 are admitted already: rows again
  EXPECT_EQ(t.update_count(7), 1);
  EXPECT_EQ(t.update_count(-3), 1);
}

// The counts travel with export/import: a whole restore, a reshard from 2 shards onto 3, and a
// snapshot without counts (a checkpoint from before them) restores every count as 0.
TEST(DynamicTableCounts, SurviveExportImportAndReshard) {
  const DynamicTableConfig c = make_config(OptimizerKind::kAdagrad, 3);
  DynamicTable one(c);
  std::vector<std::unique_ptr<DynamicTable>> two;
  for (int s = 0; s < 2; ++s) two.push_back(std::make_unique<DynamicTable>(c));
  std::mt19937_64 gen(5);
  std::map<std::int64_t, std::uint32_t> want;
  for (std::int64_t step = 1; step <= 200; ++step) {
    std::vector<std::int64_t> ids(1 + gen() % 9);
    for (auto& id : ids) id = static_cast<std::int64_t>(gen() % 60) - 30;
    const std::vector<float> g = random_grads(gen, ids.size(), c.dim);
    one.apply(ids.data(), ids.size(), g.data(), step);
    for (int s = 0; s < 2; ++s) {  // each shard gets its ids of the batch, in the batch's order
      std::vector<std::int64_t> mine;
      std::vector<float> mg;
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (shard_of(ids[i], 2) == s) {
          mine.push_back(ids[i]);
          mg.insert(mg.end(), g.begin() + static_cast<std::ptrdiff_t>(i * 3), g.begin() + static_cast<std::ptrdiff_t>(i * 3 + 3));
        }
      two[static_cast<std::size_t>(s)]->apply(mine.data(), mine.size(), mg.data(), step);
    }
    for (auto id : std::set<std::int64_t>(ids.begin(), ids.end())) ++want[id];
  }
  const DynamicTableSnapshot whole = one.export_rows();
  ASSERT_EQ(whole.ids.size(), want.size());
  for (std::size_t i = 0; i < whole.ids.size(); ++i) EXPECT_EQ(whole.update_counts[i], want[whole.ids[i]]);
  // Whole restore.
  DynamicTable restored(c);
  restored.import_rows(whole);
  expect_same_snapshot(restored.export_rows(), whole);
  // 2 shards onto 3: every new shard reads both old snapshots.
  std::vector<DynamicTableSnapshot> old = {two[0]->export_rows(), two[1]->export_rows()};
  std::map<std::int64_t, std::int64_t> got;
  for (int s = 0; s < 3; ++s) {
    DynamicTable shard(c);
    for (const auto& snap : old) shard.import_rows(snap, s, 3);
    const DynamicTableSnapshot e = shard.export_rows();
    for (std::size_t i = 0; i < e.ids.size(); ++i) {
      got[e.ids[i]] = e.update_counts[i];
      EXPECT_EQ(shard.update_count(e.ids[i]), std::int64_t{e.update_counts[i]});
    }
  }
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, n] : want) EXPECT_EQ(got[id], std::int64_t{n}) << "id " << id;
  // No counts in the snapshot: every row restores with 0, values and stamps unchanged.
  DynamicTableSnapshot bare = whole;
  bare.update_counts.clear();
  DynamicTable zeros(c);
  zeros.import_rows(bare);
  const DynamicTableSnapshot z = zeros.export_rows();
  EXPECT_TRUE(same_bits(z.values, whole.values));
  EXPECT_EQ(z.update_counts, std::vector<std::uint32_t>(whole.ids.size(), 0));
  // A count array of the wrong length is refused, naming it.
  DynamicTableSnapshot short_counts = whole;
  short_counts.update_counts.pop_back();
  DynamicTable refused(c);
  try {
    refused.import_rows(short_counts);
    ADD_FAILURE() << "a short update_counts array was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("update counts for"), std::string::npos) << e.what();
  }
  EXPECT_EQ(refused.size(), 0);
}

// Steps are bounded by kMaxDynamicStep (2^62): the largest one works, one more is one clear Error
// (apply, evict_older_than, and a snapshot's clock or stamps), and nothing changes.
TEST(DynamicTableCounts, StepsBeyondTheLargestAreErrors) {
  DynamicTable t(make_config(OptimizerKind::kSgd, 2));
  const std::int64_t id = 9;
  const float g[2] = {1, 1};
  t.apply(&id, 1, g, kMaxDynamicStep);
  EXPECT_EQ(t.export_rows().stamps, (std::vector<std::int64_t>{kMaxDynamicStep}));
  EXPECT_EQ(t.evict_older_than(kMaxDynamicStep, 1), 0);
  auto expect_error = [](const std::function<void()>& f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no error, expected " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error([&] { t.apply(&id, 1, g, kMaxDynamicStep + 1); }, "step must be in [1, 4611686018427387904]");
  expect_error([&] { t.evict_older_than(kMaxDynamicStep + 1, 1); }, "global_step must be in [0, 4611686018427387904]");
  DynamicTableSnapshot s = t.export_rows();
  s.stamps[0] = kMaxDynamicStep + 1;
  DynamicTable u(make_config(OptimizerKind::kSgd, 2));
  expect_error([&] { u.import_rows(s); }, "stamp 4611686018427387905 of id 9 is outside [0, 4611686018427387904]");
  s.stamps[0] = 1;
  s.clock = kMaxDynamicStep + 1;
  expect_error([&] { u.import_rows(s); }, "clock 4611686018427387905 is outside");
  EXPECT_EQ(u.size(), 0);
  EXPECT_EQ(t.update_count(id), 1);
  // A count at its largest value stays there (saturates) instead of wrapping to 0.
  s = t.export_rows();
  s.update_counts[0] = std::numeric_limits<std::uint32_t>::max() - 1;
  u.import_rows(s);
  u.apply(&id, 1, g, 5);
  EXPECT_EQ(u.update_count(id), std::int64_t{std::numeric_limits<std::uint32_t>::max()});
  u.apply(&id, 1, g, 6);
  EXPECT_EQ(u.update_count(id), std::int64_t{std::numeric_limits<std::uint32_t>::max()});
}

// Past 2^32 steps, capacity eviction still takes the least recently updated row; rows older than
// the stamps' exact range (3 * 2^30 - 1 steps) report the base as their stamp and tie, by id.
TEST(DynamicTableStamps, CapacityEvictionPast32Bits) {
  DynamicTableConfig c = make_config(OptimizerKind::kSgd, 2);
  c.capacity = 4;
  DynamicTable t(c);
  const float g[2] = {1, 1};
  auto touch = [&](std::int64_t id, std::int64_t step) { t.apply(&id, 1, g, step); };
  touch(50, 1);
  touch(40, 2);  // after 50, but both will be older than the exact range: they tie, 40 goes first
  const std::int64_t far = std::int64_t{5} << 32;
  touch(60, far);
  touch(70, far + 1);
  EXPECT_EQ(t.export_rows().stamps, (std::vector<std::int64_t>{reported_stamp(1, far + 1), reported_stamp(1, far + 1),
                                                              far, far + 1}));
  // far + 1 = 20 * 2^30 + 1, less 3 * 2^30 - 1, rounded down to a multiple of 2^30.
  EXPECT_EQ(reported_stamp(1, far + 1), std::int64_t{17} << 30);
  // New rows at capacity: the two old rows go first, the smaller id first (they tie), then 60.
  auto ids_now = [&] { return t.export_rows().ids; };
  touch(80, far + 2);
  EXPECT_EQ(ids_now(), (std::vector<std::int64_t>{50, 60, 70, 80}));
  touch(90, far + 3);
  EXPECT_EQ(ids_now(), (std::vector<std::int64_t>{60, 70, 80, 90}));
  touch(100, far + 4);
  EXPECT_EQ(ids_now(), (std::vector<std::int64_t>{70, 80, 90, 100}));
  EXPECT_EQ(t.stats().evicted_capacity, 3);
  // Rows within the exact range keep their order across a move of the base (every 2^30 steps).
  touch(70, far + 5);
  touch(110, far + 6 + (std::int64_t{1} << 30));
  EXPECT_EQ(ids_now(), (std::vector<std::int64_t>{70, 90, 100, 110}));
}

// Past 2^32 steps an export imports bit for bit (into one table, and resharded over 3 and back),
// old rows included: the stamp base is a function of the clock alone.
TEST(DynamicTableStamps, ExportImportPast32BitsIsBitEqual) {
  DynamicTableConfig c = make_config(OptimizerKind::kAdam, 4);
  DynamicTable t(c);
  std::mt19937_64 gen(5);
  std::int64_t step = 1;
  for (int b = 0; b < 60; ++b) {
    std::vector<std::int64_t> ids(50);
    for (auto& id : ids) id = static_cast<std::int64_t>(gen() % 400);
    const std::vector<float> g = random_grads(gen, ids.size(), c.dim);
    t.apply(ids.data(), ids.size(), g.data(), step);
    step += b % 7 == 6 ? std::int64_t{3} << 30 : 1;  // past 2^32 by the end, some rows left behind
  }
  const DynamicTableSnapshot want = t.export_rows();
  ASSERT_GT(want.clock, std::int64_t{1} << 34);
  std::set<std::int64_t> distinct_stamps(want.stamps.begin(), want.stamps.end());
  EXPECT_GT(distinct_stamps.size(), 3u);
  EXPECT_EQ(*distinct_stamps.begin(), reported_stamp(0, want.clock));  // some rows are older than the exact range
  DynamicTable whole(c);
  whole.import_rows(want);
  expect_same_snapshot(whole.export_rows(), want);
  std::vector<std::unique_ptr<DynamicTable>> shards;
  for (int k = 0; k < 3; ++k) {
    shards.push_back(std::make_unique<DynamicTable>(c));
    shards.back()->import_rows(want, k, 3);
  }
  DynamicTable merged(c);
  for (const auto& sh : shards) merged.import_rows(sh->export_rows());
  DynamicTableSnapshot got = merged.export_rows();
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.stamps, want.stamps);
  EXPECT_EQ(got.clock, want.clock);
  EXPECT_TRUE(same_bits(got.values, want.values));
  // Stamps older than their clock's exact range (shards of a reshard whose clocks differ) read as
  // the base, and the largest ttl a spec allows still removes them all.
  DynamicTableSnapshot aged_snap = want;
  aged_snap.stamps.assign(want.stamps.size(), 1);
  DynamicTable aged(c);
  aged.import_rows(aged_snap);
  EXPECT_EQ(aged.export_rows().stamps, std::vector<std::int64_t>(want.ids.size(), reported_stamp(1, want.clock)));
  EXPECT_EQ(aged.evict_older_than(want.clock, DynamicVariableSpec::kMaxTtl), static_cast<std::int64_t>(want.ids.size()));
  // Evicting by ttl after the import removes the same rows as the original.
  const std::int64_t later = want.clock + 100;
  EXPECT_EQ(whole.evict_older_than(later, 150), t.evict_older_than(later, 150));
  expect_same_snapshot(whole.export_rows(), t.export_rows());
}

// ---- delta tracking ---------------------------------------------------------------------------

// Counters a delta carries (bytes and imported describe the table that holds them).
void expect_same_counters(const DynamicTableStats& a, const DynamicTableStats& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.admitted, b.admitted);
  EXPECT_EQ(a.lookups, b.lookups);
  EXPECT_EQ(a.updates, b.updates);
  EXPECT_EQ(a.rejected_lookups, b.rejected_lookups);
  EXPECT_EQ(a.rejected_updates, b.rejected_updates);
  EXPECT_EQ(a.rejected_full, b.rejected_full);
  EXPECT_EQ(a.evicted_ttl, b.evicted_ttl);
  EXPECT_EQ(a.evicted_capacity, b.evicted_capacity);
}

// One random operation on `t`: lookups that create rows, updates, TTL and capacity evictions.
void random_op(DynamicTable& t, std::mt19937_64& gen, std::int64_t& step, std::int64_t universe) {
  std::vector<std::int64_t> ids(1 + gen() % 8);
  for (auto& id : ids) id = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(universe)) * 7919 - 50000;
  const auto kind = gen() % 100;
  if (kind < 40) {
    lookup(t, ids);
  } else if (kind < 97) {
    const std::vector<float> g = random_grads(gen, ids.size(), t.dim());
    t.apply(ids.data(), ids.size(), g.data(), step);
    if (gen() % 3 == 0) ++step;
  } else {
    t.evict_older_than(step, 20 + static_cast<std::int64_t>(gen() % 200));
  }
}

TEST(DynamicTableDelta, BasePlusDeltasEqualsTheLiveTableBitForBit) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam}) {
    DynamicTableConfig c = make_config(kind, 5);
    c.capacity = 700;  // below the universe: capacity evictions happen too
    c.admit_after = 2;
    c.sketch_width = 1 << 12;
    DynamicTable live(c);
    std::mt19937_64 gen(77 + static_cast<int>(kind));
    std::int64_t step = 1;
    for (int op = 0; op < 3000; ++op) random_op(live, gen, step, 1000);
    const DynamicTableSnapshot base = live.export_rows();
    live.mark_saved();
    EXPECT_EQ(live.changed_rows(), 0);
    EXPECT_TRUE(live.export_delta().rows.ids.empty());
    DynamicTable restored(c);
    restored.import_rows(base);
    restored.mark_saved();
    std::size_t evicted = 0, partial = 0;
    for (int round = 0; round < 6; ++round) {
      for (int op = 0; op < 100; ++op) random_op(live, gen, step, 1000);
      const DynamicTableDelta d = live.export_delta();
      EXPECT_EQ(static_cast<std::int64_t>(d.rows.ids.size()), live.changed_rows());
      partial += d.rows.ids.size() < static_cast<std::size_t>(live.size());
      evicted += d.evicted_ids.size();
      live.mark_saved();
      restored.apply_delta(d);
      restored.mark_saved();
      const DynamicTableSnapshot want = live.export_rows(), got = restored.export_rows();
      expect_same_snapshot(got, want);
      EXPECT_EQ(got.clock, want.clock);
      EXPECT_EQ(got.sketch, want.sketch);
      expect_same_counters(got.stats, want.stats);
      // Every evicted id was a row of the previous state and is none now.
      for (std::int64_t id : d.evicted_ids) EXPECT_FALSE(std::binary_search(want.ids.begin(), want.ids.end(), id));
    }
    // The test saw real deltas: some smaller than the table, some with evictions.
    EXPECT_GT(partial, 0u);
    EXPECT_GT(evicted, 0u);
    EXPECT_EQ(restored.changed_rows(), 0);
  }
}

TEST(DynamicTableDelta, AnIdEvictedThenCreatedAgainIsChangedNotEvicted) {
  DynamicTableConfig c = make_config(OptimizerKind::kSgd, 2);
  DynamicTable t(c);
  lookup(t, {1, 2, 3});
  t.mark_saved();
  const std::vector<float> g(4, 1.0f);
  const std::vector<std::int64_t> two{2, 3};
  t.apply(two.data(), 2, g.data(), 10);  // 2 and 3 are fresh, 1 is stale
  EXPECT_EQ(t.evict_older_than(10, 5), 1);  // 1 goes
  lookup(t, {4});                           // created after the save, then evicted: no trace
  t.evict_older_than(30, 5);                // 2, 3 and 4 go
  lookup(t, {3});                           // 3 comes back
  const DynamicTableDelta d = t.export_delta();
  EXPECT_EQ(d.rows.ids, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(d.evicted_ids, (std::vector<std::int64_t>{1, 2}));
  t.mark_saved();
  EXPECT_TRUE(t.export_delta().evicted_ids.empty());
}

TEST(DynamicTableDelta, DeltasOntoAnotherShardCountGiveTheSameRows) {
  const DynamicTableConfig c = make_config(OptimizerKind::kAdagrad, 4);
  DynamicTable old0(c), old1(c);
  std::mt19937_64 gen(5);
  std::int64_t step = 1;
  // The old shards see only their own ids, as a 2-PS job routes them.
  auto route = [&](DynamicTable& target, int shard) {
    for (int op = 0; op < 800; ++op) {
      std::vector<std::int64_t> ids;
      while (ids.size() < 4) {
        const auto id = static_cast<std::int64_t>(gen() % 600);
        if (shard_of(id, 2) == shard) ids.push_back(id);
      }
      const std::vector<float> g = random_grads(gen, ids.size(), c.dim);
      target.apply(ids.data(), ids.size(), g.data(), step++);
      if (op % 200 == 199) target.evict_older_than(step, 150);
    }
  };
  route(old0, 0);
  route(old1, 1);
  std::vector<std::unique_ptr<DynamicTable>> fresh;
  for (int s = 0; s < 3; ++s) fresh.push_back(std::make_unique<DynamicTable>(c));
  const DynamicTableSnapshot b0 = old0.export_rows(), b1 = old1.export_rows();
  for (int s = 0; s < 3; ++s) {
    fresh[static_cast<std::size_t>(s)]->import_rows(b0, s, 3);
    fresh[static_cast<std::size_t>(s)]->import_rows(b1, s, 3);
  }
  old0.mark_saved();
  old1.mark_saved();
  route(old0, 0);
  route(old1, 1);
  const DynamicTableDelta d0 = old0.export_delta(), d1 = old1.export_delta();
  for (int s = 0; s < 3; ++s) {
    fresh[static_cast<std::size_t>(s)]->apply_delta(d0, s, 3);
    fresh[static_cast<std::size_t>(s)]->apply_delta(d1, s, 3);
  }
  std::map<std::int64_t, std::size_t> where;
  const DynamicTableSnapshot a0 = old0.export_rows(), a1 = old1.export_rows();
  std::size_t total = 0;
  for (int s = 0; s < 3; ++s) {
    const DynamicTableSnapshot got = fresh[static_cast<std::size_t>(s)]->export_rows();
    total += got.ids.size();
    for (std::size_t i = 0; i < got.ids.size(); ++i) {
      EXPECT_EQ(shard_of(got.ids[i], 3), s);
      const DynamicTableSnapshot& src = shard_of(got.ids[i], 2) == 0 ? a0 : a1;
      const auto it = std::lower_bound(src.ids.begin(), src.ids.end(), got.ids[i]);
      ASSERT_TRUE(it != src.ids.end() && *it == got.ids[i]) << got.ids[i];
      const auto j = static_cast<std::size_t>(it - src.ids.begin());
      EXPECT_EQ(std::memcmp(&got.values[i * 4], &src.values[j * 4], 4 * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(&got.slots[0][i * 4], &src.slots[0][j * 4], 4 * sizeof(float)), 0);
      EXPECT_EQ(got.stamps[i], src.stamps[j]);
    }
  }
  EXPECT_EQ(total, a0.ids.size() + a1.ids.size());
}

TEST(DynamicTableDelta, ABadDeltaChangesNothing) {
  const DynamicTableConfig c = make_config(OptimizerKind::kSgd, 2);
  DynamicTable t(c);
  lookup(t, {1, 2, 3, 4});
  t.mark_saved();
  lookup(t, {5});
  DynamicTableDelta d = t.export_delta();
  DynamicTable other(c);
  lookup(other, {1, 2});
  const DynamicTableSnapshot before = other.export_rows();
  DynamicTableDelta unsorted = d;
  unsorted.evicted_ids = {3, 2};
  EXPECT_THROW(other.apply_delta(unsorted), Error);
  DynamicTableDelta both = d;
  both.evicted_ids = {5};
  EXPECT_THROW(other.apply_delta(both), Error);
  expect_same_snapshot(other.export_rows(), before);
}

// ---- batches split over a team ----------------------------------------------------------------

struct SplitCase {
  const char* name;
  OptimizerKind optimizer;
  std::int64_t admit_after;
  std::int64_t capacity;
  bool rounds;
  std::int64_t first_step = 1;  // steps count up from here, one a batch ...
  std::int64_t jump = 0;        // ... and every 10th batch also jumps this far (0: never)
};

// The same batches into one table without a team and into tables split over 2 and 3 threads:
// every lookup returns the same bits, and the rows (values, slots, stamps, update counts) and the
// counters are equal after every few batches. The batches are large enough to split, carry
// duplicates within and across parts, ids never seen, ids not yet admitted, and (small capacity)
// creations that must evict, where a split lookup hands the batch back to one thread.
TEST(DynamicTableTeam, SplitBatchesEqualOneThreadBitForBit) {
  const SplitCase cases[] = {
      {"adagrad", OptimizerKind::kAdagrad, 0, 1 << 20, false},
      {"adam, admission", OptimizerKind::kAdam, 3, 1 << 20, false},
      {"sgd, admission, at capacity", OptimizerKind::kSgd, 2, 5000, false},
      {"ftrl, admission, capacity, rounds", OptimizerKind::kFtrl, 2, 4000, true},
      // The stamp base moves during the run (every 10th batch jumps 2^30 steps, from just below
      // 2^32) while the parts restamp rows concurrently.
      {"adagrad, capacity, steps past 2^32", OptimizerKind::kAdagrad, 0, 5000, false, (std::int64_t{1} << 32) - 40,
       std::int64_t{1} << 30},
  };
  for (const SplitCase& sc : cases) {
    SCOPED_TRACE(sc.name);
    DynamicTableConfig c = make_config(sc.optimizer, 16);
    c.admit_after = sc.admit_after;
    c.capacity = sc.capacity;
    c.round_boundaries = sc.rounds;
    ApplyTeam two(2), three(3);
    DynamicTable one(c), split2(c), split3(c);
    split2.use_team(&two);
    split3.use_team(&three);
    DynamicTable* tables[] = {&one, &split2, &split3};
    std::mt19937_64 gen(7);
    std::vector<std::int64_t> universe(16000);
    for (auto& id : universe) id = static_cast<std::int64_t>(gen());
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::int64_t step = sc.first_step;
    int mismatches = 0;
    for (int op = 0; op < 120; ++op) {
      std::vector<std::int64_t> ids(4096 + gen() % 4096);
      for (auto& id : ids) {
        const double x = u(gen);
        id = universe[static_cast<std::size_t>(x * x * static_cast<double>(universe.size()))];
      }
      const double kind = u(gen);
      if (kind < 0.45) {
        const Mode mode = gen() % 5 == 0 ? Mode::kInference : Mode::kTrain;
        const std::vector<float> want = lookup(one, ids, mode);
        mismatches += !same_bits(lookup(split2, ids, mode), want);
        mismatches += !same_bits(lookup(split3, ids, mode), want);
      } else {
        const std::vector<float> g = random_grads(gen, ids.size(), c.dim);
        for (DynamicTable* t : tables) t->apply(ids.data(), ids.size(), g.data(), step);
        if (sc.rounds) {
          const std::int64_t evicted = one.end_round();
          EXPECT_EQ(split2.end_round(), evicted);
          EXPECT_EQ(split3.end_round(), evicted);
        }
        ++step;
        if (sc.jump > 0 && op % 10 == 9) step += sc.jump;
      }
      if (op % 20 == 19) {
        const DynamicTableSnapshot want = one.export_rows();
        for (DynamicTable* t : {&split2, &split3}) {
          expect_same_snapshot(t->export_rows(), want);
          const DynamicTableStats a = one.stats(), b = t->stats();
          EXPECT_EQ(b.rows, a.rows);
          EXPECT_EQ(b.admitted, a.admitted);
          EXPECT_EQ(b.lookups, a.lookups);
          EXPECT_EQ(b.updates, a.updates);
          EXPECT_EQ(b.rejected_lookups, a.rejected_lookups);
          EXPECT_EQ(b.rejected_updates, a.rejected_updates);
          EXPECT_EQ(b.rejected_full, a.rejected_full);
          EXPECT_EQ(b.evicted_capacity, a.evicted_capacity);
          EXPECT_EQ(t->changed_rows(), one.changed_rows());
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(one.split_batches(), 0);
    EXPECT_GT(split2.split_batches(), 60);  // every apply and most lookups ran split
    EXPECT_GT(split3.split_batches(), 60);
    const DynamicTableStats st = one.stats();
    EXPECT_GT(st.updates, 10000);
    if (sc.admit_after > 1) {
      EXPECT_GT(st.rejected_lookups, 0);
    }
    if (sc.capacity < 10000) {
      EXPECT_GT(st.evicted_capacity, 0);
    }
  }
}

// A team's wait is bounded by its parts: a table whose team has more threads than a batch has
// parts (small batches) runs them on the caller alone, and results stay those of one thread.
TEST(DynamicTableTeam, SmallBatchesStayOnTheCaller) {
  DynamicTableConfig c = make_config(OptimizerKind::kAdagrad, 16);
  ApplyTeam four(4);
  DynamicTable one(c), split(c);
  split.use_team(&four);
  std::vector<std::int64_t> ids(4000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 7919);
  EXPECT_TRUE(same_bits(lookup(split, ids), lookup(one, ids)));
  EXPECT_EQ(split.split_batches(), 0);  // 4000 ids: fewer than two parts of 2048
  ids.resize(4096);
  for (std::size_t i = 4000; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 7919);
  EXPECT_TRUE(same_bits(lookup(split, ids), lookup(one, ids)));
  EXPECT_EQ(split.split_batches(), 1);
  expect_same_snapshot(split.export_rows(), one.export_rows());
}

}  // namespace
}  // namespace strata::ps
