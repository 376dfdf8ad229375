// Test-side names for the copy between the PS layer's table snapshots (src/ps/dynamic_table.h) and
// the checkpoint layer's DynamicTableState (include/strata/checkpoint/dynamic.h). The copy itself
// lives in the ps layer (src/ps/dynamic_checkpoint.h), which the PS ranks' saves use.
#pragma once

#include "ps/dynamic_checkpoint.h"

namespace strata::test {

using ps::delta_state;
using ps::full_state;
using ps::to_counters;
using ps::to_snapshot;

inline checkpoint::DynamicTableState union_of_shards(const std::vector<checkpoint::DynamicTableState>& shards) {
  return ps::union_of_shards(shards);
}

}  // namespace strata::test
