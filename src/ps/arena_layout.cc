// The PS region's layout (arena_layout.h).
#include "ps/arena_layout.h"

#include <algorithm>
#include <string>

#include "ps/arena_checks.h"
#include "strata/common/error.h"

namespace strata::ps {

namespace {
std::uint64_t align_up(std::uint64_t x) { return (x + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }
}  // namespace

bool takes_gradients(const ShardMap& map, const Shard& shard) {
  const VariableSpec* spec = map.find(shard.variable);
  return spec->trainable && spec->dtype != DType::kI64;
}

std::uint64_t ArenaLayout::control_bytes() const { return align_up(worker_wake(workers_)); }

ArenaLayout ArenaLayout::build(const ShardMap& map, int num_workers, int num_ps, OptimizerKind optimizer, PushPath path,
                               const std::vector<DynamicVariableSpec>& dynamic) {
  ArenaLayout out;
  out.workers_ = num_workers;
  const auto workers = static_cast<std::uint64_t>(num_workers);
  out.arena_bytes_.assign(static_cast<std::size_t>(num_ps), out.control_bytes());
  out.shards_.resize(map.shards().size());
  for (std::size_t s = 0; s < map.shards().size(); ++s) {
    const Shard& sh = map.shards()[s];
    ShardLayout& l = out.shards_[s];
    std::uint64_t& top = out.arena_bytes_[static_cast<std::size_t>(sh.ps)];
    auto too_big = [&]() -> std::uint64_t {
      throw ConfigError("cannot place the variables: ps:" + std::to_string(sh.ps) + "'s arena would exceed 2^64 bytes at '" +
                        sh.name + "' (" + std::to_string(sh.bytes) + " bytes)");
    };
    // a + b rounded up to the alignment, or a ConfigError.
    auto grow = [&](std::uint64_t a, std::uint64_t b) {
      std::uint64_t sum = 0;
      return add_fits(a, b, &sum) && add_fits(sum, kArenaAlign - 1, &sum) ? align_up(a + b) : too_big();
    };
    auto times = [&](std::uint64_t a, std::uint64_t b) {
      std::uint64_t product = 0;
      return mul_fits(a, b, &product) ? product : too_big();
    };
    l.values = top;
    top = grow(top, sh.bytes);
    if (!takes_gradients(map, sh)) continue;
    // The variable's own optimizer's slots, else the job's (a job without per-variable
    // optimizers gets the layout it always had).
    const VariableSpec* spec = map.find(sh.variable);
    const int num_slots_here = ps::num_slots(spec->optimizer ? spec->optimizer->kind : optimizer);
    l.slots = top;
    top = grow(top, times(static_cast<std::uint64_t>(num_slots_here), sh.bytes));
    if (!path.inbox) continue;
    const std::uint64_t rows = static_cast<std::uint64_t>(std::max<std::int64_t>(1, sh.row_end - sh.row_begin));
    l.payload = grow(8, times(8, rows));
    l.inbox_bytes = grow(l.payload, sh.bytes);
    l.inboxes = top;
    top = grow(top, times(l.inbox_bytes, workers));
    l.doorbells = top;
    top = grow(top, 8 * workers);
    l.acks = top;
    top = grow(top, 8 * workers);
    // Streamed: async inbox pushes of dense shards of two chunks or more (ps_server.cc).
    if (!path.sync && sh.bytes >= 2 * kStreamChunkBytes) {
      l.chunk_bytes = kStreamChunkBytes;
      l.chunks = top;
      top = grow(top, 8 * workers);
    }
  }
  // Dynamic variables: on every PS, after its own shards (so the offsets differ per PS).
  out.num_ps_ = num_ps;
  for (const DynamicVariableSpec& spec : dynamic) {
    for (int p = 0; p < num_ps; ++p) {
      std::uint64_t& top = out.arena_bytes_[static_cast<std::size_t>(p)];
      auto too_big = [&]() -> std::uint64_t {
        throw ConfigError("cannot place dynamic variable '" + spec.name + "': ps:" + std::to_string(p) +
                          "'s arena would exceed 2^64 bytes");
      };
      auto grow = [&](std::uint64_t a, std::uint64_t b) {
        std::uint64_t sum = 0;
        return add_fits(a, b, &sum) && add_fits(sum, kArenaAlign - 1, &sum) ? align_up(a + b) : too_big();
      };
      auto times = [&](std::uint64_t a, std::uint64_t b) {
        std::uint64_t product = 0;
        return mul_fits(a, b, &product) ? product : too_big();
      };
      if (spec.max_ids < 1 || spec.dim < 1) too_big();  // validated before; a layout never sees them
      DynamicLayout l;
      l.max_ids = spec.max_ids;
      l.dim = spec.dim;
      const auto ids = static_cast<std::uint64_t>(spec.max_ids);
      l.ids = dynamic_header::kBytes;
      l.rows = grow(l.ids, times(8, ids));
      l.request_bytes = grow(l.rows, times(times(4, static_cast<std::uint64_t>(spec.dim)), ids));
      l.requests = top;
      top = grow(top, times(l.request_bytes, workers));
      l.doorbells = top;
      top = grow(top, 8 * workers);
      l.acks = top;
      top = grow(top, 8 * workers);
      out.dynamic_.push_back(l);
    }
  }
  return out;
}

}  // namespace strata::ps
