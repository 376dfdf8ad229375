// ShardMap construction, the creation-sequence hash and its human-readable diff.
//
// build() walks the specs once, in creation order:
//   1. validate the spec alone (VariableSpec::validate) and against the earlier ones (unique
//      name, colocation target earlier and unpartitioned);
//   2. split it into shards along axis 0 (TF's "div" split: earlier shards take the extra rows);
//   3. place each shard: colocated -> the target's PS; else round robin (one counter for all
//      placed objects) or greedy (least bytes so far, lowest index on ties);
//   4. record bytes per PS and the name -> shards index.
// The map is a pure function of its inputs, which is what lets every rank compute it alone.
#include "strata/ps/shard_map.h"

#include <algorithm>
#include <unordered_set>

#include "strata/common/error.h"

namespace strata::ps {
namespace {

std::string quoted(const std::string& name) { return "'" + name + "'"; }

// Shard count for hashing and messages. Unlike effective_num_shards() it never throws, so a diff
// between two sequences can still be described when one of them holds an invalid partitioner.
std::string parts_text(const VariableSpec& spec) {
  try {
    return std::to_string(effective_num_shards(spec));
  } catch (const ConfigError&) {
    return "invalid " + spec.partitioner.to_string();
  }
}

// "'dense/kernel' [784,10] f32", plus the fields the hash covers when they are not the default.
std::string describe(const VariableSpec& spec) {
  std::string s = quoted(spec.name) + " " + shape_to_string(spec.shape) + " " + to_string(spec.dtype);
  const std::string parts = parts_text(spec);
  if (parts != "1") s += " in " + parts + " parts";
  if (!spec.trainable) s += " non-trainable";
  if (!spec.colocate_with.empty()) s += " colocated with " + quoted(spec.colocate_with);
  if (spec.optimizer) s += " optimizer " + to_string(*spec.optimizer);
  return s;
}

// One canonical line per variable. The name is length-prefixed so that no character inside a
// name can fake a field boundary.
std::string canonical_line(const VariableSpec& spec) {
  return std::to_string(spec.name.size()) + ":" + spec.name + " " + shape_to_string(spec.shape) + " " +
         to_string(spec.dtype) + " parts=" + parts_text(spec) + " trainable=" + (spec.trainable ? "1" : "0") +
         " colocate=" + std::to_string(spec.colocate_with.size()) + ":" + spec.colocate_with +
         // Only when set: the hash of a sequence without per-variable optimizers is unchanged.
         (spec.optimizer ? " optimizer=" + to_string(*spec.optimizer) : std::string()) + "\n";
}

std::uint64_t fnv1a64(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a 64 offset basis
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;  // FNV 64 prime
  }
  return h;
}

}  // namespace

const char* to_string(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kRoundRobin: return "round_robin";
    case PlacementPolicy::kGreedy: return "greedy";
  }
  return "?";
}

PlacementPolicy parse_placement_policy(std::string_view text) {
  if (text == "round_robin") return PlacementPolicy::kRoundRobin;
  if (text == "greedy") return PlacementPolicy::kGreedy;
  throw ConfigError("placement: '" + std::string(text) + "' is not one of round_robin, greedy");
}

int effective_num_shards(const VariableSpec& spec) {
  // Colocated variables are never partitioned (TF V2 checks colocation before the partitioner).
  if (!spec.colocate_with.empty()) return 1;
  return spec.partitioner.num_shards(spec.shape, spec.dtype);
}

std::string canonical_sequence_text(const std::vector<VariableSpec>& specs) {
  std::string text;
  for (const VariableSpec& spec : specs) text += canonical_line(spec);
  return text;
}

std::uint64_t sequence_hash(const std::vector<VariableSpec>& specs) {
  return fnv1a64(canonical_sequence_text(specs));
}

std::string describe_difference(const std::vector<VariableSpec>& a, const std::vector<VariableSpec>& b) {
  const std::size_t common = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < common; ++i) {
    // Compare exactly what the hash covers, so "" here <=> equal hashes (barring collisions).
    if (canonical_line(a[i]) != canonical_line(b[i]))
      return "variable #" + std::to_string(i) + ": " + describe(a[i]) + " vs " + describe(b[i]);
  }
  if (a.size() == b.size()) return "";
  const bool first_longer = a.size() > b.size();
  const VariableSpec& extra = first_longer ? a[common] : b[common];
  return std::to_string(a.size()) + " variables vs " + std::to_string(b.size()) + ": variable #" +
         std::to_string(common) + " " + describe(extra) + " is only in the " +
         (first_longer ? "first" : "second");
}

ShardMap ShardMap::build(const std::vector<VariableSpec>& specs, int num_ps, PlacementPolicy policy) {
  if (num_ps < 1)
    throw ConfigError("placement needs at least one parameter server (num_ps = " + std::to_string(num_ps) + ")");

  ShardMap map;
  map.num_ps_ = num_ps;
  map.policy_ = policy;
  map.specs_ = specs;
  map.bytes_per_ps_.assign(static_cast<std::size_t>(num_ps), 0);
  map.index_.reserve(specs.size());

  // Every placed object's name (variables and shards): TF would refuse a second op with the same
  // name; for strata a collision would make two objects indistinguishable in messages and traces.
  std::unordered_set<std::string> object_names;
  std::int64_t round_robin = 0;  // replica_device_setter's counter: advanced once per placed object

  for (std::size_t v = 0; v < specs.size(); ++v) {
    const VariableSpec& spec = specs[v];
    spec.validate();
    const std::string who = "variable #" + std::to_string(v) + " " + quoted(spec.name) + ": ";
    if (map.index_.count(spec.name))
      throw ConfigError(who + "the name is already used by an earlier variable");

    // Colocation target: an earlier, unpartitioned variable. Its PS is final by now.
    int colocated_ps = -1;
    if (!spec.colocate_with.empty()) {
      auto it = map.index_.find(spec.colocate_with);
      if (it == map.index_.end()) {
        const bool later = std::any_of(specs.begin() + static_cast<std::ptrdiff_t>(v) + 1, specs.end(),
                                       [&](const VariableSpec& s) { return s.name == spec.colocate_with; });
        throw ConfigError(who + "colocate_with names " +
                          (later ? "a later variable " : "no known variable ") + quoted(spec.colocate_with) +
                          (later ? " (the target must be created first)" : ""));
      }
      if (it->second.num_shards != 1)
        throw ConfigError(who + "colocate_with names " + quoted(spec.colocate_with) + ", which is partitioned into " +
                          std::to_string(it->second.num_shards) + " shards");
      colocated_ps = map.shards_[it->second.first_shard].ps;
    }

    const int parts = effective_num_shards(spec);
    const std::int64_t rows = num_rows(spec.shape);
    const std::int64_t elements = num_elements(spec.shape);
    const std::int64_t row_elems = rows == 0 ? 0 : elements / rows;
    const std::size_t elem_bytes = dtype_size(spec.dtype);

    Entry entry{v, map.shards_.size(), static_cast<std::size_t>(parts)};
    for (int p = 0; p < parts; ++p) {
      Shard shard;
      shard.variable = spec.name;
      shard.name = parts > 1 ? spec.name + "/part_" + std::to_string(p) : spec.name;
      shard.part = p;
      shard.num_parts = parts;
      const RowRange r = shard_rows(rows, parts, p);
      shard.row_begin = r.begin;
      shard.row_end = r.end;
      shard.shape = spec.shape;
      if (!shard.shape.empty()) shard.shape[0] = r.end - r.begin;
      shard.bytes = static_cast<std::size_t>((r.end - r.begin) * row_elems) * elem_bytes;  // < 2^63: validate()

      if (!object_names.insert(shard.name).second)
        throw ConfigError(who + "its " + (parts > 1 ? "shard name " : "name ") + quoted(shard.name) +
                          " collides with another variable or shard");

      if (colocated_ps >= 0) {
        shard.ps = colocated_ps;  // no counter advance: the device setter is bypassed
      } else if (policy == PlacementPolicy::kRoundRobin) {
        shard.ps = static_cast<int>(round_robin % num_ps);
        ++round_robin;
      } else {
        // min_element returns the first minimum, i.e. the lowest index on ties.
        auto least = std::min_element(map.bytes_per_ps_.begin(), map.bytes_per_ps_.end());
        shard.ps = static_cast<int>(least - map.bytes_per_ps_.begin());
      }
      // Each variable is below 2^63 bytes (validate()); several on one PS may add up past 2^64.
      std::size_t& placed = map.bytes_per_ps_[static_cast<std::size_t>(shard.ps)];
      if (__builtin_add_overflow(placed, shard.bytes, &placed))
        throw ConfigError(who + "ps:" + std::to_string(shard.ps) + " would hold more than 2^64 bytes of variables");
      map.shards_.push_back(std::move(shard));
    }
    map.index_.emplace(spec.name, entry);
  }
  map.sequence_hash_ = ps::sequence_hash(specs);
  return map;
}

ShardRange ShardMap::shards_of(std::string_view variable) const {
  auto it = index_.find(std::string(variable));
  if (it == index_.end()) throw ConfigError("unknown variable '" + std::string(variable) + "'");
  return ShardRange(shards_.data() + it->second.first_shard, it->second.num_shards);
}

const VariableSpec* ShardMap::find(std::string_view variable) const {
  auto it = index_.find(std::string(variable));
  return it == index_.end() ? nullptr : &specs_[it->second.spec];
}

std::size_t ShardMap::bytes_on(int ps) const {
  STRATA_CHECK(ps >= 0 && ps < num_ps_, "ps ", ps, " outside [0, ", num_ps_, ")");
  return bytes_per_ps_[static_cast<std::size_t>(ps)];
}

}  // namespace strata::ps
