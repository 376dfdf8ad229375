// Checkpoint files (format: checkpoint/FORMAT.md, version 1).
//
// Writing is COLLECTIVE over the PS ranks: every rank describes the rows it holds (SaveRequest) and
// calls save() with the same directory, step, variable list and attributes; parallel HDF5 creates
// every dataset at its full logical shape and each rank writes its own hyperslabs (no gather of
// values through one rank). Rank 0 then commits the file atomically (see save() and FORMAT.md
// section "Commit protocol"), and every rank returns only after the commit.
//
// Reading is INDEPENDENT: CheckpointReader opens a committed file read-only with HDF5's sec2
// driver and makes no MPI calls, so each PS rank can read its own row range whenever it
// materialises a shard (lazy restore), and tools can read files in processes without MPI.
//
// Thread-safety: the Debian HDF5 build is not thread-safe; call everything here from one thread
// per process (the PS service thread or the main thread), never concurrently.
// This header does not include hdf5.h.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace strata::checkpoint {

inline constexpr int kFormatVersion = 1;

// Element types of checkpoint datasets, stored little-endian (H5T_IEEE_F32LE, H5T_IEEE_F64LE,
// H5T_STD_I64LE). Mirrors strata::ps::DType enumerator for enumerator; this layer does not depend
// on the PS layer, the glue code converts.
enum class DType { kF32, kF64, kI64 };
std::size_t dtype_size(DType dtype);  // 4, 8, 8
const char* to_string(DType dtype);   // "f32", "f64", "i64"

// A variable known to every rank: same list, same order, on every rank of the save.
// shape has rank >= 1; it is the FULL logical shape (axis 0 is the partitioned axis).
struct VariableMeta {
  std::string name;                // e.g. "dense/kernel"; '/' separates nested HDF5 groups
  std::vector<std::int64_t> shape;
  DType dtype = DType::kF32;
  std::vector<std::string> slots;  // optimizer slot names ("m", "v", "accumulator"), same shape/dtype
  // Optimizer updates applied to the variable (Adam's bias-correction step t); 0 when none or
  // unknown. Stored as the dataset attribute `optimizer_step`.
  std::int64_t optimizer_step = 0;
};

// Rows [row_begin, row_end) of one variable held by this rank, row-major, contiguous.
// `slots` maps each slot name of the variable to the same rows of that slot. Pointers are
// borrowed for the duration of save() only.
struct ShardData {
  std::string variable;
  std::int64_t row_begin = 0;
  std::int64_t row_end = 0;
  const void* values = nullptr;
  std::map<std::string, const void*> slots;
};

// What THIS rank contributes to a save. `variables` must be identical on every rank; `shards`
// holds only this rank's rows (possibly none). Over all ranks the shards of each variable must
// cover rows [0, shape[0]) exactly once, otherwise save() throws ConfigError on every rank.
struct SaveRequest {
  std::vector<VariableMeta> variables;
  std::vector<ShardData> shards;
};

// Root attributes supplied by the caller (identical on every rank). format_version, global_step,
// created_unix and checksum_algorithm are written by save() itself.
struct Attributes {
  std::uint64_t variable_sequence_hash = 0;
  std::string optimizer;               // e.g. "adam"
  std::string training_position_json;  // {"epoch": .., "workers": [{"worker":0,"epoch":..,"offset":..}]}
};

struct SaveOptions {
  int max_to_keep = 0;  // > 0: after the commit, delete the oldest committed files beyond this many
  // > 0: a checkpoint that max_to_keep would delete is kept instead (marked "preserved" in
  // checkpoint.json, not counted by max_to_keep) when it was created at least this many hours after
  // the newest preserved one; the first checkpoint evicted is always preserved. TF's
  // CheckpointManager(keep_checkpoint_every_n_hours) behaves alike (its reference is its start).
  double keep_every_n_hours = 0;
};

// COLLECTIVE over `comm` (all ranks, same arguments except request.shards). Writes
// <dir>/ckpt-<global_step>.h5 and updates <dir>/checkpoint.json; creates `dir` if needed. Returns
// the committed file's path on every rank, after the commit. Throws ConfigError (same on every
// rank) for inconsistent requests: variable lists that differ between ranks, rows not covered or
// covered twice, shard of an unknown variable, missing slot pointers. Throws Hdf5Error for HDF5
// failures (with the HDF5 error stack's innermost message); after such a failure the previous
// committed checkpoint and checkpoint.json are untouched.
std::string save(MPI_Comm comm, const std::string& dir, std::int64_t global_step,
                 const SaveRequest& request, const Attributes& attributes,
                 const SaveOptions& options = {});

// A dataset that failed verification: its path inside the file ("variables/dense/kernel",
// "slots/dense/kernel/m") and why (checksum mismatch, unreadable, missing attribute).
struct BadDataset {
  std::string path;
  std::string reason;
};

// Read-only view of one committed checkpoint file. Independent (no MPI calls); the file stays
// open until destruction. Not copyable; movable.
class CheckpointReader {
 public:
  // Throws ConfigError when the file does not exist or is not a strata checkpoint of a supported
  // format_version; Hdf5Error when HDF5 cannot open it (e.g. truncated).
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const;
  int format_version() const;
  std::int64_t global_step() const;
  std::uint64_t variable_sequence_hash() const;
  std::string optimizer() const;
  std::string training_position_json() const;
  std::int64_t created_unix() const;

  // All variables under /variables, sorted by name, with their slots.
  const std::vector<VariableMeta>& variables() const;
  const VariableMeta* find(const std::string& name) const;  // nullptr when absent

  // ConfigError naming the variable when it is absent or its shape/dtype differs.
  void check_compatible(const std::string& name, const std::vector<std::int64_t>& shape,
                        DType dtype) const;

  // Reads rows [row_begin, row_end) of a variable (or of one of its slots) into `out`, row-major,
  // (row_end - row_begin) * row_elements * dtype_size bytes. ConfigError for an unknown name or
  // a row range outside [0, shape[0]).
  void read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end,
                 void* out) const;
  void read_slot_rows(const std::string& name, const std::string& slot, std::int64_t row_begin,
                      std::int64_t row_end, void* out) const;

  // Recomputes every dataset's checksum (reads the whole file in bounded blocks); empty when all
  // match.
  std::vector<BadDataset> verify() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One entry of checkpoint.json.
struct CheckpointEntry {
  std::string file;  // file name relative to the directory, "ckpt-<step>.h5"
  std::int64_t global_step = 0;
  std::int64_t created_unix = 0;
  bool preserved = false;  // kept by keep_every_n_hours, outside max_to_keep
};

// Committed checkpoints listed in <dir>/checkpoint.json, oldest first. Empty when the directory
// has no checkpoint.json; ConfigError when the directory does not exist or the file is malformed.
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir);

struct LatestCheckpoint {
  std::string path;                  // full path of the newest checkpoint that verified
  std::int64_t global_step = 0;
  std::vector<std::string> skipped;  // newer entries that failed verification, with the reason
};

// The newest entry of checkpoint.json whose file opens and verifies; newer entries that fail are
// skipped with a WARN log line each (and listed in `skipped`). nullopt when there is no valid
// checkpoint. Independent (no MPI); reads every candidate file completely to verify it.
std::optional<LatestCheckpoint> latest_checkpoint(const std::string& dir);

}  // namespace strata::checkpoint
