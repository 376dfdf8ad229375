// Checkpoint files (format: checkpoint/FORMAT.md, version 2; version 1 files are still read).
//
// Writing is COLLECTIVE over the PS ranks: every rank describes the rows it holds (SaveRequest) and
// calls save() with the same directory, step, variable list and attributes; parallel HDF5 creates
// every dataset at its full logical shape and each rank writes its own hyperslabs (no gather of
// values through one rank; ranks without MPI, in-process ranks, send theirs to rank 0, which writes
// the file). Rank 0 then commits the file atomically (see save() and FORMAT.md
// section "Commit protocol"), and every rank returns only after the commit.
//
// Reading is INDEPENDENT: CheckpointReader opens a committed file read-only with HDF5's sec2
// driver and makes no MPI calls, so each PS rank can read its own row range whenever it
// materialises a shard (lazy restore), and tools can read files in processes without MPI.
//
// Integrity (FORMAT.md sections 3-4): every byte of a version-2 file is covered by the whole-file
// CRC-32 in its integrity block (the HDF5 user block), checked with plain reads BEFORE HDF5 parses
// anything, so a damaged superblock, object header or B-tree is a verification failure rather than
// an HDF5 crash; every attribute a restore uses is covered again by the metadata checksum
// (`metadata_checksum`, checked whenever a file is opened) and every dataset by its CRC-32 from
// the writer's memory. verify_checkpoint() is the one verdict `strata ckpt verify` and restores use.
//
// Thread-safety: the Debian HDF5 build is not thread-safe, so every function here holds the
// process's HDF5 lock while it calls HDF5 (strata/common/hdf5_lock.h): in-process ranks may save and
// read concurrently; a CheckpointReader is used by one thread at a time.
// This header does not include hdf5.h.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/comm/group.h"
#include "strata/common/error.h"

namespace strata::checkpoint {

inline constexpr int kFormatVersion = 2;        // written by save()
inline constexpr int kOldestFormatVersion = 1;  // the oldest version CheckpointReader reads

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
  // The bound of each agreement of a save between ranks without an MPI communicator (in-process
  // ranks, comm::InprocWorld): TimeoutError naming the late ranks past it. A save over MPI waits in
  // MPI's collectives as parallel HDF5 does.
  double timeout_s = 600;
};

// A save that failed on every rank of the save alike for a reason outside the request (no space
// left, I/O error, an unwritable directory, data that read back differently): the message names
// the file and the system's reason. The .tmp file is removed; checkpoint.json and every committed
// file are as they were, so the caller may carry on (`strata train --on-save-error continue`).
class SaveError : public Error {
 public:
  using Error::Error;
};

// COLLECTIVE over `group` (all ranks, same arguments except request.shards). Writes
// <dir>/ckpt-<global_step>.h5 and updates <dir>/checkpoint.json; creates `dir` if needed. Returns
// the committed file's path on every rank, after the commit. Throws ConfigError (same on every
// rank) for inconsistent requests: variable lists that differ between ranks, rows not covered or
// covered twice, shard of an unknown variable, missing slot pointers. Throws SaveError (same on
// every rank) when writing, reading back or committing the file fails; the previous committed
// checkpoint and checkpoint.json are then untouched and no .tmp file is left behind. (A failure
// inside one of HDF5's own collective metadata operations on some ranks only cannot be agreed
// and still ends the job through the error model, strata/common/error.h: fail-stop.)
// Over an MPI group (comm::make_mpi_group) every rank writes its rows into the file with
// parallel HDF5; over in-process ranks rank 0 writes the file (the others send it their rows),
// byte for byte the file an MPI job of as many ranks writes.
std::string save(comm::Group& group, const std::string& dir, std::int64_t global_step,
                 const SaveRequest& request, const Attributes& attributes,
                 const SaveOptions& options = {});
// The same over the ranks of `comm`.
std::string save(MPI_Comm comm, const std::string& dir, std::int64_t global_step,
                 const SaveRequest& request, const Attributes& attributes,
                 const SaveOptions& options = {});

// A dataset that failed verification: its path inside the file ("variables/dense/kernel",
// "slots/dense/kernel/m") and why (checksum mismatch, unreadable, missing attribute). A problem
// of the file as a whole (file checksum, metadata checksum) has the path "(file)".
struct BadDataset {
  std::string path;
  std::string reason;
};

// Read-only view of one committed checkpoint file. Independent (no MPI calls); the file stays
// open until destruction. Not copyable; movable.
class CheckpointReader {
 public:
  // Throws ConfigError when the file does not exist or is not a strata checkpoint of a supported
  // format_version; Hdf5Error when HDF5 cannot open it (e.g. truncated). Every message names the
  // path. A version-2 file's integrity block header (size) and metadata checksum are checked here,
  // so every attribute and the variable table this object returns are the ones the writer wrote;
  // the data and the HDF5 structure are checked by verify() / verify_checkpoint(), which a caller
  // should run first when the file may be damaged (HDF5 parses the file here). Whatever the
  // version, every attribute is checked for type class and shape before it is read, and every
  // dataset's declared size against the bytes the file stores for it (Error naming the attribute
  // or dataset), so no later read goes beyond what the file holds.
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

  // Verifies the file as verify_checkpoint() does (reads the whole file in bounded blocks); empty
  // when everything matches.
  std::vector<BadDataset> verify() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The verdict on one checkpoint file: every check a restore relies on.
struct Verification {
  std::string path;
  bool ok = false;
  int format_version = 0;          // 0 when the file could not be identified
  std::int64_t global_step = -1;   // -1 when unknown
  std::size_t datasets = 0;        // datasets verified
  std::uint64_t file_bytes = 0;
  bool file_checksum = false;      // the whole-file CRC-32 was checked (format >= 2)
  std::uint32_t file_crc = 0;      // its value, when checked
  // Every byte outside the datasets' data is as written (format 1: not known, taken as true), so
  // HDF5 may open the file to inspect it even when a dataset's data changed.
  bool structure_intact = true;
  std::string error;               // a problem of the file as a whole ("" when none)
  std::vector<BadDataset> bad;     // datasets that failed
  // "ok", or the error / the first bad dataset with its reason (one line).
  std::string summary() const;
};

struct VerifyOptions {
  // Accept format 1 files. They have no integrity block, so nothing in them can be checked
  // before HDF5 parses the file, and their attributes and structure are not covered by any
  // checksum; by default they are refused before HDF5 opens them (`--allow-unverified`).
  bool allow_unverified = false;
};

// Verifies a checkpoint file without trusting any of it. `path` must be a regular file (a FIFO
// or device is refused without blocking; symbolic links are followed). Format 2: plain reads
// check the integrity block (its table must lie inside the file), the file size and the
// whole-file CRC-32 (and, in the same pass, each dataset's data against its CRC-32) before HDF5
// opens the file; then every attribute's type and shape, the metadata checksum, and every
// dataset's declared size against the bytes the file stores for it. Format 1: refused unless
// options.allow_unverified; then each dataset's CRC-32 through HDF5. A damaged or crafted file
// gives ok = false with the reason, never an exception, a crash or a hang. The work is bounded
// by the file's size: nothing declared larger than the file is read. Independent (no MPI).
Verification verify_checkpoint(const std::string& path, const VerifyOptions& options = {});

// One entry of checkpoint.json.
struct CheckpointEntry {
  std::string file;  // file name relative to the directory, "ckpt-<step>.h5"
  std::int64_t global_step = 0;
  std::int64_t created_unix = 0;
  bool preserved = false;  // kept by keep_every_n_hours, outside max_to_keep
};

// An entry of checkpoint.json that is not used: its file name is not `ckpt-<global_step>.h5`
// (digits only, no '/', so nothing outside the directory), or the entry is malformed.
struct RefusedEntry {
  std::string file;    // as written in checkpoint.json
  std::string reason;  // one line
};

struct CheckpointList {
  std::vector<CheckpointEntry> entries;  // valid names, oldest first
  std::vector<RefusedEntry> refused;     // in file order
};

// <dir>/checkpoint.json, read as untrusted input: it must be a regular file (not a symbolic link,
// FIFO, ...) of at most kMaxPointerBytes, JSON nested at most kMaxJsonDepth deep; each entry's
// file must be `ckpt-<global_step>.h5`, others are returned in `refused` and never opened or
// deleted. Empty when there is no checkpoint.json. ConfigError naming the file when the directory
// does not exist or the file is malformed, too large or too deep.
inline constexpr std::uint64_t kMaxPointerBytes = 64ull << 20;
inline constexpr std::size_t kMaxJsonDepth = 64;
CheckpointList read_checkpoint_list(const std::string& dir);

// The valid entries of read_checkpoint_list(dir), oldest first (refused ones left out silently;
// callers that report them use read_checkpoint_list).
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir);

// The verdict on one entry of <dir>/checkpoint.json: the entry's file must be a regular file in
// the directory (a symbolic link, FIFO, directory or device is refused without being opened;
// "file is missing" when absent), verify_checkpoint() must pass, and the file must hold the
// entry's global step. Never throws.
Verification verify_entry(const std::string& dir, const CheckpointEntry& entry, const VerifyOptions& options = {});

struct LatestCheckpoint {
  std::string path;                  // full path of the newest checkpoint that verified
  std::int64_t global_step = 0;
  std::vector<std::string> skipped;  // newer entries that failed verification, with the reason
};

// The newest entry of checkpoint.json that passes verify_entry(); newer entries that fail are
// skipped with a WARN log line each (and listed in `skipped`, "<path>: <reason>"), and every
// refused entry (read_checkpoint_list) gets a WARN line naming it. nullopt when there is no
// valid checkpoint. Independent (no MPI); reads every candidate file completely to verify it.
std::optional<LatestCheckpoint> latest_checkpoint(const std::string& dir, const VerifyOptions& options = {});

// What an interrupted save can leave in a checkpoint directory (FORMAT.md section 7): a
// `ckpt-<step>.h5.tmp` being written or abandoned, and a complete `ckpt-<step>.h5` that was renamed
// into place but never named by checkpoint.json (the writer died between the rename and the
// pointer's update). Neither is ever restored from: `--restore latest` follows checkpoint.json only.
struct UncommittedFile {
  std::string file;         // "ckpt-<step>.h5.tmp" or "ckpt-<step>.h5"
  std::uint64_t bytes = 0;
  bool complete = false;    // "ckpt-<step>.h5" that checkpoint.json does not name
};

// The uncommitted files of `dir`, sorted by name: regular files (lstat: a symbolic link, directory
// or FIFO of such a name is not strata's and is never listed) named exactly as save() names them
// (`ckpt-<step>.h5` with the step in canonical decimal, or that plus `.tmp`), where a complete one
// is named by no entry of checkpoint.json, valid or refused. Throws as read_checkpoint_list() does
// (a directory that does not exist, a malformed checkpoint.json). Local, no MPI.
std::vector<UncommittedFile> list_uncommitted_files(const std::string& dir);

// The lock file of a checkpoint directory (FORMAT.md section 7), never removed by strata.
inline constexpr const char* kLockFile = "checkpoint.lock";

struct OrphanCleanup {
  std::vector<std::string> removed;  // names removed, sorted
  std::vector<std::string> kept;     // uncommitted files left in place, sorted
  std::string why_kept;              // one line when `kept` is not empty
};

// Removes what interrupted saves left in `dir`: every `ckpt-<step>.h5.tmp` and `checkpoint.json.tmp`,
// and every complete but uncommitted `ckpt-<step>.h5` (list_uncommitted_files()) when
// checkpoint.json exists and reads cleanly (without it, nothing shows the directory is one strata
// commits into, so complete files are kept). Only regular files with exactly those names are
// removed; links are never followed; nothing else is touched. Likewise every `dynamic-<step>.h5.tmp`
// and, when checkpoint.json reads cleanly, every `dynamic-<step>.h5` above the newest step it names
// (FORMAT.md section 10.7: tables whose dense save never committed). `keep` (a path, may be empty) is a
// file this job restores from: never removed, whatever its name.
//
// Safe against other jobs: it runs only while it holds an exclusive flock(2) on <dir>/checkpoint.lock,
// taken without waiting, and every job that saves into `dir` holds a DirectoryClaim on that file
// for its whole life, so while another job (even one on a node that cannot be reached) holds the
// directory, or where the file system refuses locks, nothing is removed and `kept` / `why_kept`
// say so. Nothing when `dir` does not exist. Local, no MPI; call it on one rank before this job's
// first save into `dir` and before taking this process's DirectoryClaim (strata does at start-up,
// on PS 0). Never throws for a file it cannot remove (it is kept, with the reason).
OrphanCleanup remove_orphaned_files(const std::string& dir, const std::string& keep = "");

// A job's claim on a checkpoint directory: a shared flock(2) on <dir>/checkpoint.lock (created,
// with `dir`, when absent), held until destruction or the death of the process (kill -9 included),
// so that remove_orphaned_files() in another job never removes a file this job may be writing or
// committing. Held by the process that commits (PS 0). Not copyable; movable.
class DirectoryClaim {
 public:
  DirectoryClaim() = default;
  // Waits at most `timeout_s` for another job's remove_orphaned_files() to finish. Never throws:
  // when the claim cannot be taken (the file system refuses locks, the directory is not writable),
  // held() is false and why_not() says why; the job then runs unclaimed.
  DirectoryClaim(const std::string& dir, double timeout_s);
  ~DirectoryClaim();
  DirectoryClaim(DirectoryClaim&& other) noexcept;
  DirectoryClaim& operator=(DirectoryClaim&& other) noexcept;
  DirectoryClaim(const DirectoryClaim&) = delete;
  DirectoryClaim& operator=(const DirectoryClaim&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& why_not() const { return why_not_; }

 private:
  int fd_ = -1;
  std::string why_not_;
};

}  // namespace strata::checkpoint
