// Unit tests of the dynamic variables' single-process parts: the spec's checks, its exact JSON
// form (how the chief's list reaches the PS ranks) and what a hostile list gets, and the arena
// layout of the request areas (after every shard, not overlapping, and absent without dynamic
// variables). The data plane itself runs under mpirun and on thread ranks (tests/ranks/ps_dynamic_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ps/arena_layout.h"
#include "strata/common/error.h"
#include "strata/ps/parameter_servers.h"

namespace strata::ps {
namespace {

DynamicVariableSpec dyn(const std::string& name, std::int64_t dim = 16, std::int64_t max_ids = 4096) {
  DynamicVariableSpec s;
  s.name = name;
  s.dim = dim;
  s.max_ids = max_ids;
  return s;
}

VariableSpec var(const std::string& name, Shape shape) {
  VariableSpec spec;
  spec.name = name;
  spec.shape = std::move(shape);
  spec.init = Initializer::uniform(-1, 1, 3);
  return spec;
}

std::string config_error(const DynamicVariableSpec& s) {
  try {
    s.validate();
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "";
}

TEST(DynamicVariableSpec, ValidateNamesTheFieldAndValue) {
  EXPECT_EQ(config_error(dyn("user/emb")), "");
  EXPECT_EQ(config_error(dyn("e", 16, 0)), "dynamic variable 'e': max_ids = 0 is out of range [1, 2^20]");
  EXPECT_EQ(config_error(dyn("e", 16, (1 << 20) + 1)),
            "dynamic variable 'e': max_ids = 1048577 is out of range [1, 2^20]");
  DynamicVariableSpec s = dyn("e");
  s.ttl = -1;
  EXPECT_EQ(config_error(s), "dynamic variable 'e': ttl = -1 is out of range [0, 2^31] (0: no ttl)");
  EXPECT_NE(config_error(dyn("e", 0)).find("dynamic variable 'e': dynamic table: dim = 0 is out of range"),
            std::string::npos);
  s = dyn("e");
  s.init = Initializer::glorot_uniform(1);
  EXPECT_NE(config_error(s).find("needs the fans of a fixed shape"), std::string::npos);
  s = dyn("e");
  s.capacity = 0;
  EXPECT_NE(config_error(s).find("capacity = 0"), std::string::npos);
  EXPECT_THROW(dyn("a//b").validate(), ConfigError);
}

TEST(DynamicVariableSpec, JsonRoundTripsEveryField) {
  DynamicVariableSpec a = dyn("user/emb", 8, 100);
  a.init = Initializer::truncated_normal(0.25, 0.1, 77);
  a.admit_after = 3;
  a.capacity = 12345;
  a.ttl = 99;
  DynamicVariableSpec b = dyn("item/emb", 4, 1);
  b.init = Initializer::uniform(-0.1, 0.30000000000000004, (std::uint64_t{1} << 63) + 5);
  const auto back = dynamic_specs_from_json(dynamic_specs_to_json({a, b}));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(dynamic_specs_to_json(back), dynamic_specs_to_json({a, b}));
  EXPECT_EQ(back[0].name, "user/emb");
  EXPECT_EQ(back[0].admit_after, 3);
  EXPECT_EQ(back[0].capacity, 12345);
  EXPECT_EQ(back[0].ttl, 99);
  EXPECT_EQ(back[0].max_ids, 100);
  EXPECT_EQ(back[0].init.kind, Initializer::Kind::kTruncatedNormal);
  EXPECT_EQ(back[1].init.maxval, 0.30000000000000004);
  EXPECT_EQ(back[1].init.seed, (std::uint64_t{1} << 63) + 5);
  EXPECT_TRUE(dynamic_specs_from_json("[]").empty());
}

TEST(DynamicVariableSpecSecurity, HostileListsAreOneError) {
  const std::string good = dynamic_specs_to_json({dyn("e", 4, 8)});
  auto error_of = [](const std::string& text) -> std::string {
    try {
      dynamic_specs_from_json(text);
    } catch (const Error& e) {
      return e.message();
    }
    return "";
  };
  EXPECT_NE(error_of("{").find("malformed dynamic variable list"), std::string::npos);
  EXPECT_NE(error_of("{}").find("not a JSON array"), std::string::npos);
  EXPECT_NE(error_of("[{}]").find("malformed dynamic variable list"), std::string::npos);
  std::string bad = good;
  bad.replace(bad.find("\"dim\":4"), 7, "\"dim\":-4");
  EXPECT_NE(error_of(bad).find("dim = -4"), std::string::npos);
  bad = good;
  bad.replace(bad.find("\"max_ids\":8"), 11, "\"max_ids\":99999999999");
  EXPECT_NE(error_of(bad).find("max_ids = 99999999999 is out of range"), std::string::npos);
  bad = good;
  bad.replace(bad.find("\"kind\":"), 8, "\"kind\":9");
  EXPECT_NE(error_of(bad).find("initializer kind 9"), std::string::npos);
  bad = good;
  bad.replace(bad.find("\"dim\":4"), 7, "\"dim\":\"x\"");
  EXPECT_NE(error_of(bad).find("malformed dynamic variable list"), std::string::npos);
}

TEST(ArenaLayout, WithoutDynamicVariablesTheLayoutIsUnchanged) {
  const ShardMap map = ShardMap::build({var("w", {40, 4}), var("b", {4})}, 2, PlacementPolicy::kRoundRobin);
  const ArenaLayout plain = ArenaLayout::build(map, 3, 2, OptimizerKind::kAdam, PushPath{true, false});
  const ArenaLayout none = ArenaLayout::build(map, 3, 2, OptimizerKind::kAdam, PushPath{true, false}, {});
  const ArenaLayout with = ArenaLayout::build(map, 3, 2, OptimizerKind::kAdam, PushPath{true, false}, {dyn("e", 5, 10)});
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(plain.arena_bytes(p), none.arena_bytes(p));
    EXPECT_GT(with.arena_bytes(p), plain.arena_bytes(p));
  }
  for (std::size_t s = 0; s < map.shards().size(); ++s) {
    EXPECT_EQ(plain.shard(s).values, with.shard(s).values);
    EXPECT_EQ(plain.shard(s).inboxes, with.shard(s).inboxes);
    EXPECT_EQ(plain.shard(s).acks, with.shard(s).acks);
  }
}

TEST(ArenaLayout, DynamicRequestAreasFollowTheShardsWithoutOverlap) {
  const ShardMap map = ShardMap::build({var("w", {40, 4}), var("b", {4})}, 2, PlacementPolicy::kRoundRobin);
  const int workers = 3;
  const std::vector<DynamicVariableSpec> dynamic = {dyn("e", 5, 10), dyn("f", 16, 4096)};
  const ArenaLayout base = ArenaLayout::build(map, workers, 2, OptimizerKind::kSgd, PushPath{});
  const ArenaLayout layout = ArenaLayout::build(map, workers, 2, OptimizerKind::kSgd, PushPath{}, dynamic);
  for (int p = 0; p < 2; ++p) {
    std::uint64_t end = base.arena_bytes(p);
    for (std::size_t d = 0; d < dynamic.size(); ++d) {
      const DynamicLayout& l = layout.dynamic(d, p);
      EXPECT_EQ(l.requests % kArenaAlign, 0u);
      EXPECT_GE(l.requests, end);
      EXPECT_EQ(l.ids, dynamic_header::kBytes);
      EXPECT_GE(l.rows, l.ids + 8 * static_cast<std::uint64_t>(dynamic[d].max_ids));
      EXPECT_EQ(l.rows % kArenaAlign, 0u);
      EXPECT_GE(l.request_bytes, l.rows + 4 * static_cast<std::uint64_t>(dynamic[d].max_ids * dynamic[d].dim));
      EXPECT_EQ(l.request(2), l.requests + 2 * l.request_bytes);
      EXPECT_GE(l.doorbells, l.request(workers));
      EXPECT_GE(l.acks, l.doorbell(workers));
      end = l.ack(workers);
    }
    EXPECT_LE(end, layout.arena_bytes(p));
  }
}

TEST(ArenaLayoutSecurity, AnAbsurdRequestAreaIsAConfigError) {
  const ShardMap map = ShardMap::build({var("w", {4})}, 1, PlacementPolicy::kRoundRobin);
  DynamicVariableSpec huge = dyn("e", 65536, DynamicVariableSpec::kMaxIds);
  // 2^20 ids x 2^18 bytes per row = 2^38 bytes per worker: fits 2^64 until the worker count is absurd.
  EXPECT_THROW(ArenaLayout::build(map, 1 << 30, 1, OptimizerKind::kSgd, PushPath{}, {huge}), ConfigError);
}

}  // namespace
}  // namespace strata::ps
