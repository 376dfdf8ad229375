// Unit tests of per-variable optimizers (VariableSpec::optimizer): each shard's slots laid out for
// its own optimizer, a layout without them unchanged, the creation check's canonical form and JSON
// covering the optimizer, and an update through one variable's own optimizer bit-equal to the
// single-optimizer path for that variable.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ps/arena_layout.h"
#include "strata/common/error.h"
#include "strata/ps/optimizer.h"
#include "strata/ps/parameter_servers.h"
#include "strata/ps/shard_map.h"
#include "strata/ps/variable.h"

namespace strata::ps {
namespace {

VariableSpec var(const std::string& name, Shape shape, Partitioner partitioner = Partitioner::none()) {
  VariableSpec spec;
  spec.name = name;
  spec.shape = std::move(shape);
  spec.init = Initializer::uniform(-1, 1, 3);
  spec.partitioner = partitioner;
  return spec;
}

VariableSpec with(VariableSpec spec, const std::string& optimizer) {
  spec.optimizer = OptimizerConfig::parse(optimizer);
  return spec;
}

TEST(PerVariableOptimizer, EachShardGetsItsOwnOptimizersSlots) {
  // Job Adam (2 slots); "lin" FTRL (2), "dnn" Adagrad (1), "plain" SGD (0), "rest" the job's.
  const std::vector<VariableSpec> specs = {with(var("lin", {10, 4}, Partitioner::fixed_shards(2)), "ftrl:lr=0.1"),
                                           with(var("dnn", {6, 3}), "adagrad:lr=0.05"),
                                           with(var("plain", {5}), "sgd:lr=0.5"), var("rest", {7, 2})};
  const ShardMap map = ShardMap::build(specs, 1, PlacementPolicy::kRoundRobin);
  const ArenaLayout layout = ArenaLayout::build(map, 2, 1, OptimizerKind::kAdam, PushPath{true, true});
  ASSERT_EQ(map.shards().size(), 5u);
  const int want_slots[] = {2, 2, 1, 0, 2};
  for (std::size_t s = 0; s < map.shards().size(); ++s) {
    const Shard& sh = map.shards()[s];
    const ShardLayout& l = layout.shard(s);
    // The slots end where the next piece (the inboxes) begins, rounded up to the arena alignment.
    const std::uint64_t slot_end = l.slots + static_cast<std::uint64_t>(want_slots[s]) * sh.bytes;
    EXPECT_GE(l.inboxes, slot_end) << sh.name;
    EXPECT_LT(l.inboxes - slot_end, kArenaAlign) << sh.name;
  }
}

TEST(PerVariableOptimizer, LayoutWithoutOwnOptimizersIsUnchangedAndJobsOwnIsTheSameAsNone) {
  // A variable whose own optimizer has the job's kind is laid out exactly as one without.
  const std::vector<VariableSpec> plain = {var("a", {10, 4}, Partitioner::fixed_shards(2)), var("b", {33})};
  std::vector<VariableSpec> same = plain;
  same[1] = with(same[1], "adam:lr=0.5");
  const ShardMap m1 = ShardMap::build(plain, 2, PlacementPolicy::kRoundRobin);
  const ShardMap m2 = ShardMap::build(same, 2, PlacementPolicy::kRoundRobin);
  const ArenaLayout l1 = ArenaLayout::build(m1, 3, 2, OptimizerKind::kAdam, PushPath{true, false});
  const ArenaLayout l2 = ArenaLayout::build(m2, 3, 2, OptimizerKind::kAdam, PushPath{true, false});
  ASSERT_EQ(m1.shards().size(), m2.shards().size());
  for (std::size_t s = 0; s < m1.shards().size(); ++s) {
    EXPECT_EQ(l1.shard(s).values, l2.shard(s).values);
    EXPECT_EQ(l1.shard(s).slots, l2.shard(s).slots);
    EXPECT_EQ(l1.shard(s).inboxes, l2.shard(s).inboxes);
  }
  for (int p = 0; p < 2; ++p) EXPECT_EQ(l1.arena_bytes(p), l2.arena_bytes(p));
  // Under a job SGD the same variable with its own Adam takes 2 slots more of its bytes.
  const ArenaLayout sgd_plain = ArenaLayout::build(m1, 3, 2, OptimizerKind::kSgd, PushPath{true, false});
  const ArenaLayout sgd_own = ArenaLayout::build(m2, 3, 2, OptimizerKind::kSgd, PushPath{true, false});
  const int pb = m1.shards()[2].ps;
  EXPECT_GE(sgd_own.arena_bytes(pb), sgd_plain.arena_bytes(pb) + 2 * m1.shards()[2].bytes);
  // And the sequence hash of a list without own optimizers does not depend on the new field.
  EXPECT_EQ(sequence_hash(plain), sequence_hash(std::vector<VariableSpec>(plain)));
  EXPECT_NE(sequence_hash(plain), sequence_hash(same));
}

TEST(PerVariableOptimizer, CreationCheckAndJsonCoverTheOptimizer) {
  const std::vector<VariableSpec> a = {var("x", {3}), with(var("lin", {4, 2}), "ftrl:lr=0.1,l1=0.01")};
  std::vector<VariableSpec> b = a;
  b[1].optimizer->l1 = 0.02;
  const std::string diff = describe_difference(a, b);
  EXPECT_NE(diff.find("variable #1"), std::string::npos) << diff;
  EXPECT_NE(diff.find("l1=0.01"), std::string::npos) << diff;
  EXPECT_NE(diff.find("l1=0.02"), std::string::npos) << diff;
  EXPECT_NE(sequence_hash(a), sequence_hash(b));
  // Unset vs set is a difference too.
  std::vector<VariableSpec> c = a;
  c[1].optimizer.reset();
  EXPECT_FALSE(describe_difference(a, c).empty());

  // JSON round trip: the optimizer comes back with every field; without one, no member is written.
  const std::string text = specs_to_json(a);
  EXPECT_EQ(text.find("optimizer"), text.rfind("optimizer"));  // only the one variable has it
  const std::vector<VariableSpec> back = specs_from_json(text);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_FALSE(back[0].optimizer.has_value());
  ASSERT_TRUE(back[1].optimizer.has_value());
  EXPECT_EQ(to_string(*back[1].optimizer), to_string(*a[1].optimizer));
  EXPECT_EQ(describe_difference(a, back), "");
  EXPECT_EQ(specs_to_json(c).find("optimizer"), std::string::npos);
}

TEST(PerVariableOptimizer, BadOwnOptimizerIsAConfigErrorNamingTheVariable) {
  VariableSpec v = var("wide/w", {4});
  v.optimizer = OptimizerConfig::defaults(OptimizerKind::kFtrl);
  v.optimizer->l1 = -1;
  try {
    v.validate();
    FAIL() << "a negative l1 was accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("wide/w"), std::string::npos) << m;
    EXPECT_NE(m.find("optimizer"), std::string::npos) << m;
    EXPECT_NE(m.find("l1"), std::string::npos) << m;
  }
  // A malformed optimizer in the chief's JSON list is refused naming the variable.
  const std::string bad = R"([{"name":"v","shape":[2],"dtype":"f32","init":{"kind":0,"value":0,"minval":0,"maxval":1,)"
                          R"("mean":0,"stddev":1,"seed":0},"trainable":true,"partitioner":{"kind":0,"shards":1,)"
                          R"("max_partitions":1,"min_slice_bytes":1,"max_bytes":0,"max_shards":0},)"
                          R"("colocate_with":"","optimizer":"ftrl:l9=1"}])";
  try {
    (void)specs_from_json(bad);
    FAIL() << "a bad optimizer was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("'v'"), std::string::npos) << e.message();
  }
}

TEST(PerVariableOptimizer, EffectiveOptimizerIsTheVariablesOwnElseTheJobs) {
  const OptimizerConfig job = OptimizerConfig::parse("adam:lr=0.01");
  const VariableSpec plain = var("p", {3});
  const VariableSpec own = with(var("o", {3}), "ftrl:lr=0.2,l2=0.5");
  EXPECT_EQ(to_string(effective_optimizer(plain, job)), to_string(job));
  EXPECT_EQ(effective_optimizer(own, job).kind, OptimizerKind::kFtrl);
  EXPECT_EQ(effective_optimizer(own, job).l2, 0.5);
}

// Two variables updated in one process, each through its own optimizer and slots: every bit equals
// running that optimizer alone on that variable (what a job whose only optimizer it is would do).
TEST(PerVariableOptimizer, UpdatesAreBitEqualToTheSingleOptimizerPath) {
  const OptimizerConfig ftrl = OptimizerConfig::parse("ftrl:lr=0.1,l1=0.001,l2=0.01");
  const OptimizerConfig adagrad = OptimizerConfig::parse("adagrad:lr=0.05");
  const std::size_t n = 37;
  auto run = [n](const OptimizerConfig& c, int steps, std::uint64_t seed) {
    std::vector<float> w(n);
    fill(Initializer::uniform(-1, 1, seed), DType::kF32, {static_cast<std::int64_t>(n)}, 0, static_cast<std::int64_t>(n), w.data());
    std::vector<std::vector<float>> slots(static_cast<std::size_t>(num_slots(c.kind)), std::vector<float>(n));
    std::vector<float*> ptrs;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      std::fill(slots[k].begin(), slots[k].end(), static_cast<float>(slot_initial_value(c, static_cast<int>(k))));
      ptrs.push_back(slots[k].data());
    }
    std::vector<float> g(n);
    for (int t = 1; t <= steps; ++t) {
      for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(static_cast<int>((i * 7 + t) % 11) - 5) * 0.0625f;
      apply_dense_reference(c, t, w.data(), ptrs.data(), g.data(), n);
    }
    return w;
  };
  // The mixed job through the PS's code path: ArenaLayout-like per-variable slot counts.
  const std::vector<VariableSpec> specs = {with(var("lin", {static_cast<std::int64_t>(n)}), to_string(ftrl)),
                                           with(var("dnn", {static_cast<std::int64_t>(n)}), to_string(adagrad))};
  const OptimizerConfig job = OptimizerConfig::parse("sgd:lr=1");
  std::vector<std::vector<float>> got;
  for (std::size_t v = 0; v < specs.size(); ++v) {
    const OptimizerConfig& c = effective_optimizer(specs[v], job);
    std::vector<float> w(n);
    fill(Initializer::uniform(-1, 1, 11 + v), DType::kF32, {static_cast<std::int64_t>(n)}, 0, static_cast<std::int64_t>(n), w.data());
    std::vector<std::vector<float>> slots(static_cast<std::size_t>(num_slots(c.kind)), std::vector<float>(n));
    std::vector<float*> ptrs;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      std::fill(slots[k].begin(), slots[k].end(), static_cast<float>(slot_initial_value(c, static_cast<int>(k))));
      ptrs.push_back(slots[k].data());
    }
    std::vector<float> g(n);
    for (int t = 1; t <= 5; ++t) {
      for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(static_cast<int>((i * 7 + t) % 11) - 5) * 0.0625f;
      apply_dense(c, t, w.data(), ptrs.data(), g.data(), n);  // the vectorised path the PS uses
    }
    got.push_back(w);
  }
  const std::vector<float> want_lin = run(ftrl, 5, 11), want_dnn = run(adagrad, 5, 12);
  EXPECT_EQ(std::memcmp(got[0].data(), want_lin.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(got[1].data(), want_dnn.data(), n * 4), 0);
  // And the two differ from the job's SGD on the same data (the override took effect).
  EXPECT_NE(std::memcmp(got[0].data(), run(job, 5, 11).data(), n * 4), 0);
}

}  // namespace
}  // namespace strata::ps
