// Unit tests of the PS region's layout (src/ps/arena_layout.h): the control block's words where
// its comment says, every shard's pieces inside its PS's arena without overlapping, inboxes and
// chunk counters only where pushes need them, and a layout that cannot fit refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ps/arena_layout.h"
#include "strata/common/error.h"
#include "strata/ps/shard_map.h"
#include "strata/ps/variable.h"

namespace strata::ps {
namespace {

VariableSpec var(const std::string& name, Shape shape, DType dtype = DType::kF32,
                 Partitioner partitioner = Partitioner::none(), bool trainable = true) {
  VariableSpec spec;
  spec.name = name;
  spec.shape = std::move(shape);
  spec.dtype = dtype;
  spec.init = dtype == DType::kI64 ? Initializer::zeros() : Initializer::glorot_uniform(1);
  spec.partitioner = partitioner;
  spec.trainable = trainable;
  return spec;
}

struct Piece {
  std::uint64_t begin = 0, end = 0;
  std::string what;
};

// Every piece of every shard on PS p, plus the control block, sorted by offset.
std::vector<Piece> pieces_on(const ShardMap& map, const ArenaLayout& layout, int p, int workers, int slots) {
  std::vector<Piece> out = {{0, layout.control_bytes(), "control"}};
  for (std::size_t s = 0; s < map.shards().size(); ++s) {
    const Shard& sh = map.shards()[s];
    if (sh.ps != p) continue;
    const ShardLayout& l = layout.shard(s);
    const auto w = static_cast<std::uint64_t>(workers);
    out.push_back({l.values, l.values + sh.bytes, sh.name + " values"});
    if (l.slots != 0) out.push_back({l.slots, l.slots + static_cast<std::uint64_t>(slots) * sh.bytes, sh.name + " slots"});
    if (l.inboxes != 0) {
      out.push_back({l.inboxes, l.inboxes + w * l.inbox_bytes, sh.name + " inboxes"});
      out.push_back({l.doorbells, l.doorbells + 8 * w, sh.name + " doorbells"});
      out.push_back({l.acks, l.acks + 8 * w, sh.name + " acks"});
    }
    if (l.chunks != 0) out.push_back({l.chunks, l.chunks + 8 * w, sh.name + " chunks"});
  }
  std::sort(out.begin(), out.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  return out;
}

TEST(ArenaLayout, ControlBlockWordsAreWhereTheMapSays) {
  const ShardMap map = ShardMap::build({var("w", {4, 4})}, 1, PlacementPolicy::kRoundRobin);
  const ArenaLayout layout = ArenaLayout::build(map, 3, 1, OptimizerKind::kSgd, PushPath{});
  EXPECT_EQ(layout.clock(0), 128u);
  EXPECT_EQ(layout.clock(2), 144u);
  EXPECT_EQ(layout.positions(), 152u);  // after the 3 clocks
  EXPECT_EQ(layout.position(1), 152u + 32u);
  EXPECT_EQ(layout.stats(), 152u + 3 * 32u);
  EXPECT_EQ(layout.control_bytes(), 320u);  // stats end at 288, rounded up to 64
  EXPECT_EQ(layout.shard(0).values, layout.control_bytes());
  // The save-protocol words sit between the done counter and the clocks.
  EXPECT_LT(control::kSaveStatus + 8, control::kClocks);
}

TEST(ArenaLayout, PiecesAreAlignedInsideTheArenaAndDisjoint) {
  const std::vector<VariableSpec> specs = {
      var("emb", {1000, 64}, DType::kF32, Partitioner::fixed_shards(3)), var("bias", {7}),
      var("big", {1024, 256}),  // 1 MiB: streamed under async
      var("counts", {5}, DType::kI64, Partitioner::none(), false), var("frozen", {9, 2}, DType::kF64, Partitioner::none(), false)};
  const int num_ps = 2, workers = 3;
  const ShardMap map = ShardMap::build(specs, num_ps, PlacementPolicy::kRoundRobin);
  const ArenaLayout layout = ArenaLayout::build(map, workers, num_ps, OptimizerKind::kAdam, PushPath{true, false});
  for (int p = 0; p < num_ps; ++p) {
    const auto pieces = pieces_on(map, layout, p, workers, num_slots(OptimizerKind::kAdam));
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_EQ(pieces[i].begin % kArenaAlign, 0u) << pieces[i].what;
      EXPECT_LE(pieces[i].end, layout.arena_bytes(p)) << pieces[i].what;
      if (i > 0) {
        EXPECT_LE(pieces[i - 1].end, pieces[i].begin) << pieces[i - 1].what << " overlaps " << pieces[i].what;
      }
    }
  }
  for (std::size_t s = 0; s < map.shards().size(); ++s) {
    const Shard& sh = map.shards()[s];
    const ShardLayout& l = layout.shard(s);
    const bool takes = takes_gradients(map, sh);
    EXPECT_EQ(l.inboxes != 0, takes) << sh.name;
    EXPECT_EQ(l.slots != 0, takes) << sh.name;
    EXPECT_EQ(l.chunks != 0, sh.name == "big") << sh.name;
    if (takes) {
      // Header: the row count and up to `rows` row ids, then the payload on a 64-byte boundary.
      const auto rows = static_cast<std::uint64_t>(std::max<std::int64_t>(1, sh.row_end - sh.row_begin));
      EXPECT_GE(l.payload, 8 + 8 * rows) << sh.name;
      EXPECT_EQ(l.payload % kArenaAlign, 0u) << sh.name;
      EXPECT_GE(l.inbox_bytes, l.payload + sh.bytes) << sh.name;
      EXPECT_EQ(l.inbox(2), l.inboxes + 2 * l.inbox_bytes);
      EXPECT_EQ(l.ack(2), l.acks + 16);
    }
  }
}

TEST(ArenaLayout, InboxesOnlyWhenPushesGoThroughThePsAndNoStreamingUnderSync) {
  const std::vector<VariableSpec> specs = {var("big", {1024, 256})};
  const ShardMap map = ShardMap::build(specs, 1, PlacementPolicy::kRoundRobin);
  const ArenaLayout accumulate = ArenaLayout::build(map, 2, 1, OptimizerKind::kSgd, PushPath{false, false});
  EXPECT_EQ(accumulate.shard(0).inboxes, 0u);
  EXPECT_EQ(accumulate.shard(0).chunks, 0u);
  const ArenaLayout sync = ArenaLayout::build(map, 2, 1, OptimizerKind::kSgd, PushPath{true, true});
  EXPECT_NE(sync.shard(0).inboxes, 0u);
  EXPECT_EQ(sync.shard(0).chunks, 0u);
  const ArenaLayout streamed = ArenaLayout::build(map, 2, 1, OptimizerKind::kAdagrad, PushPath{true, false});
  EXPECT_NE(streamed.shard(0).chunks, 0u);
  EXPECT_EQ(streamed.shard(0).chunk_bytes, kStreamChunkBytes);
  // Below two chunks a push goes whole.
  const ShardMap small = ShardMap::build({var("w", {511, 256})}, 1, PlacementPolicy::kRoundRobin);
  EXPECT_EQ(ArenaLayout::build(small, 2, 1, OptimizerKind::kAdagrad, PushPath{true, false}).shard(0).chunks, 0u);
}

TEST(ArenaLayout, AnArenaBeyond64BitsIsAConfigErrorNamingTheShard) {
  // 2^61 bytes of values fit, and Adam's two slots; eight workers' inboxes (2^61 bytes each) do not.
  const ShardMap map = ShardMap::build({var("huge", {std::int64_t{1} << 29, std::int64_t{1} << 29}, DType::kF64)}, 1,
                                       PlacementPolicy::kRoundRobin);
  try {
    (void)ArenaLayout::build(map, 8, 1, OptimizerKind::kAdam, PushPath{true, false});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("ps:0's arena would exceed 2^64 bytes at 'huge'"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace strata::ps
