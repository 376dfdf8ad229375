// Private: the atomic commit steps and the checkpoint.json pointer (FORMAT.md "Commit protocol").
// All functions here are local (no MPI); save() runs them on rank 0 only.
#pragma once

#include <string>
#include <vector>

#include "strata/checkpoint/checkpoint.h"

namespace strata::checkpoint::detail {

inline constexpr const char* kPointerFile = "checkpoint.json";

std::string checkpoint_file_name(std::int64_t global_step);  // "ckpt-<step>.h5"

// fsync(tmp); rename(tmp, final); fsync(directory of final). Throws strata::Error with errno text.
void durable_rename(const std::string& tmp, const std::string& final_path);

// Reads <dir>/checkpoint.json as read_checkpoint_list() documents (empty when absent).
CheckpointList read_pointer(const std::string& dir);

// "" when `name` is "ckpt-<global_step>.h5" with the step in decimal digits, else why not.
std::string check_entry_name(const std::string& name, std::int64_t global_step);

// Deepest nesting of arrays and objects in JSON text (brackets inside strings do not count);
// text that is not JSON gives some number, never an error. Checked before parsing, so neither
// the parser nor a recursive dump or destructor ever sees more than kMaxJsonDepth levels.
std::size_t json_nesting_depth(const std::string& text);

// Retention: unlinks <dir>/<entry.file> only when the name is valid and lstat says it is a
// regular file (never follows a symbolic link, never a directory). "" when removed or absent,
// else why it was left in place.
std::string remove_entry_file(const std::string& dir, const CheckpointEntry& entry);

// Replaces <dir>/checkpoint.json atomically: write checkpoint.json.tmp, fsync, rename, fsync dir.
// `entries` oldest first; "latest" is the last entry.
void write_pointer(const std::string& dir, const std::vector<CheckpointEntry>& entries);

}  // namespace strata::checkpoint::detail
