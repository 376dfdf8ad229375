// Private: the writer behind write_dynamic_checkpoint (include/strata/checkpoint/dynamic.h),
// exposed with its validation switch so that tests can craft files that are wrong in one way
// yet carry correct checksums (what a reader must still refuse).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/checkpoint/dynamic.h"

namespace strata::checkpoint::detail {

// Writes `tables` to `final_path` through `final_path`.tmp with the full commit sequence.
// `validate` false skips the checks of the tables (never the I/O checks): for tests only. Then
// `counts_type` ("u32", "i64", "f32" or "u16") is the element type the update_counts datasets are
// written as, their bytes reinterpreted (so a test can give a reader a counter of a wrong type).
DynamicSaveResult write_dynamic_file(const std::string& final_path, std::int64_t global_step,
                                     const std::vector<DynamicTableState>& tables, bool validate,
                                     const std::string& counts_type = "u32");

// The canonical text of one table (FORMAT.md 10.3) whose CRC-32 is its content_checksum.
// `dataset_lines` are "dataset <len>:<path> <dtype> [<dims>] checksum <crc>" lines, any order.
std::string dynamic_table_text(const DynamicTableState& table, std::vector<std::string> dataset_lines);

// How many dynamic files this process has read whole to verify a header for chain planning
// (retention, restore plans). Thread-safe. For tests: a settled file seen before is not read again.
std::uint64_t dynamic_header_verifications();

}  // namespace strata::checkpoint::detail
