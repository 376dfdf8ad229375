// save(): the collective checkpoint write. The protocol, narrated once (all ranks of the save run
// the same steps in the same order; every step marked [agree] ends with the same verdict on every
// rank, so a bad request throws ConfigError and a failed write SaveError everywhere instead of
// leaving peers in a collective):
//
//  1. [agree] Local validation of the request: names, shapes, shards inside their variable,
//     slot pointers present; STRATA_MPIIO_HINTS parses, and is the same on every rank.
//  2. [agree] The variable list is identical on every rank (FNV-1a 64 of its serialisation,
//     allreduce MIN == MAX).
//  3. [agree] Each rank CRC-32s every piece it holds (one piece = one shard of one dataset, a
//     contiguous row range) and gathers (dataset, row_begin, row_end, crc) to rank 0. Rank 0 checks
//     that the pieces of each dataset tile [0, rows) exactly, combines the CRCs in row order with
//     crc32_combine into the CRC-32 of the full dataset, creates the directory, checks that the
//     file system has room for at least the file's data (else SaveError: "No space left on
//     device", before anything is written), and broadcasts the checksums and the creation time.
//     So checksums come from the in-memory values, not from a re-read, and no rank reads or
//     gathers values of another rank. Every rank then builds the same manifest (its CRC-32 is the
//     root attribute metadata_checksum) and sizes the integrity block (the HDF5 user block).
//  4. Parallel HDF5 (mpio driver, collective metadata): create <dir>/ckpt-<step>.h5.tmp with the
//     user block, root attributes, and every dataset at its FULL shape with its `checksum`
//     attribute, noting each dataset's data offset; [agree]. Then each rank writes its pieces with
//     INDEPENDENT transfers (each piece is one contiguous byte range of the file, so collective
//     buffering has nothing to merge, and a rank whose write fails, e.g. ENOSPC, is never left
//     behind in a collective); every rank closes the file (collective; flushes all data and
//     metadata) whatever its writes did; [agree] on the writes and the close. Ranks without an MPI
//     communicator (in-process ranks, save_ranks.h) do the same with rank 0 alone creating and
//     writing the file (sec2 driver): the others send it their pieces after the creation's [agree].
//  5. [agree] Read-back: the ranks split the file's bytes after the user block into equal ranges,
//     CRC-32 every intersection of their range with a dataset's data or the gaps between, and
//     gather the pieces to rank 0, which checks that every dataset's data reads back with the
//     CRC-32 of the values in memory, computes the whole-file CRC-32 and writes the integrity
//     block (FORMAT.md section 3) into the user block.
//  6. [agree] Rank 0 commits: fsync(tmp), rename to ckpt-<step>.h5, fsync(dir), then replaces
//     checkpoint.json the same way, then deletes files dropped by max_to_keep. The verdict is
//     broadcast, so every rank returns after the commit (or throws the same error).
// After a SaveError in steps 3-6 rank 0 removes the .tmp (and a renamed file checkpoint.json does
// not list); nothing committed is touched before step 6. HDF5 failures inside the collective
// metadata operations of step 4 on some ranks only cannot be agreed: the error model
// (strata/common/error.h; fail-stop, docs/RELIABILITY.md) turns them into MPI_Abort of the job.
#include <fcntl.h>
#include <mpi.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <set>

#include "checkpoint/hdf5/commit.h"
#include "checkpoint/hdf5/h5_util.h"
#include "checkpoint/hdf5/integrity.h"
#include "checkpoint/hdf5/save_ranks.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/comm/mpi_group.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"
#include "strata/common/logging.h"

namespace strata::checkpoint {
namespace {

using detail::H5Id;

using detail::SaveRanks;

// Collective: the message of the lowest rank whose `local_error` is non-empty, on every rank ("" when
// there is none).
std::string agreed_error(SaveRanks& ranks, const std::string& local_error) {
  const auto [first, message] = ranks.first_error(local_error);
  if (first < 0) return {};
  return message + (first == ranks.rank() ? "" : " (reported by rank " + std::to_string(first) + ")");
}

// Collective: throws E on every rank when `local_error` is non-empty on any rank, with the message
// of the lowest such rank.
template <typename E = ConfigError>
void agree(SaveRanks& ranks, const std::string& local_error) {
  std::string message = agreed_error(ranks, local_error);
  if (!message.empty()) throw E(message);
}

// Bytes the caller may still write on the file system of `dir` (root may use the reserved blocks);
// max() when it cannot be determined.
std::uint64_t available_bytes(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return std::numeric_limits<std::uint64_t>::max();
  const auto blocks = ::geteuid() == 0 ? st.f_bfree : st.f_bavail;
  return static_cast<std::uint64_t>(blocks) * static_cast<std::uint64_t>(st.f_frsize);
}

// The system's reason for a failed write: errno when it says something about I/O, else "No space
// left on device" when the file system has less room than the file needs, else "".
std::string write_failure_reason(int err, const std::string& dir, std::uint64_t file_bytes) {
  const std::uint64_t avail = available_bytes(dir);
  const std::string room = avail == std::numeric_limits<std::uint64_t>::max()
                               ? ""
                               : " (" + std::to_string(avail) + " bytes available in " + dir + ")";
  if (err == ENOSPC || err == EDQUOT) return std::strerror(err) + room;
  if (err == EIO || err == EROFS || err == EFBIG || err == EACCES || err == EPERM || err == ESTALE)
    return std::strerror(err);
  if (avail < file_bytes) return std::strerror(ENOSPC) + room;
  return "";
}

std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::uint64_t hash_variables(const std::vector<VariableMeta>& vars) {
  std::uint64_t h = 14695981039346656037ull;
  auto add_str = [&](const std::string& s) { h = fnv1a(h, s.c_str(), s.size() + 1); };
  for (const auto& v : vars) {
    add_str(v.name);
    auto d = static_cast<int>(v.dtype);
    h = fnv1a(h, &d, sizeof d);
    for (auto dim : v.shape) h = fnv1a(h, &dim, sizeof dim);
    add_str("|");
    for (const auto& s : v.slots) add_str(s);
    add_str("#");
  }
  return h;
}

// One dataset of the file: a variable (slot == "") or one of its slots.
struct DatasetRef {
  std::size_t var = 0;
  std::string slot;
  std::string path;
};

std::string validate_locally(const SaveRequest& req, const std::map<std::string, std::size_t>& index) {
  std::set<std::string> names;
  for (const auto& v : req.variables) {
    try {
      detail::validate_name(v.name, "variable");
      for (const auto& s : v.slots) {
        detail::validate_name(s, "slot");
        if (s.find('/') != std::string::npos)
          return "checkpoint: slot name '" + s + "' of variable '" + v.name + "' contains '/'";
      }
    } catch (const ConfigError& e) {
      return e.message();
    }
    if (!names.insert(v.name).second) return "checkpoint: variable '" + v.name + "' listed twice";
    if (v.shape.empty()) return "checkpoint: variable '" + v.name + "' has rank 0 (checkpoints need rank >= 1)";
    for (auto dim : v.shape)
      if (dim < 0) return "checkpoint: variable '" + v.name + "' has a negative dimension";
  }
  // A name that is a strict '/'-prefix of another would need to be both a dataset and a group.
  for (const auto& n : names) {
    auto next = names.upper_bound(n);
    if (next != names.end() && next->compare(0, n.size() + 1, n + "/") == 0)
      return "checkpoint: variable '" + n + "' is a group prefix of variable '" + *next + "'";
  }
  for (const auto& s : req.shards) {
    auto it = index.find(s.variable);
    if (it == index.end()) return "checkpoint: shard of unknown variable '" + s.variable + "'";
    const auto& v = req.variables[it->second];
    if (s.row_begin < 0 || s.row_end < s.row_begin || s.row_end > v.shape[0])
      return "checkpoint: shard rows [" + std::to_string(s.row_begin) + "," + std::to_string(s.row_end) +
             ") outside variable '" + v.name + "' with " + std::to_string(v.shape[0]) + " rows";
    if (s.row_end == s.row_begin) continue;
    if (s.values == nullptr) return "checkpoint: shard of '" + v.name + "' has no values pointer";
    for (const auto& slot : v.slots) {
      auto p = s.slots.find(slot);
      if (p == s.slots.end() || p->second == nullptr)
        return "checkpoint: shard of '" + v.name + "' lacks slot '" + slot + "'";
    }
    for (const auto& [slot, ptr] : s.slots) {
      (void)ptr;
      if (std::find(v.slots.begin(), v.slots.end(), slot) == v.slots.end())
        return "checkpoint: shard of '" + v.name + "' has undeclared slot '" + slot + "'";
    }
  }
  return {};
}

// Retention of the dynamic-<step>.h5 files beside the dense ones (FORMAT.md 10.8), run after the
// pointer naming only `kept` is committed: a file goes once no kept step's chain needs it. Every
// save runs it, so files left by a crash between the pointer and here go at the next save. The
// checkpoint is committed by now, so a failure here is a warning, never a failed save.
void prune_dynamic_files(const std::string& dir, const std::vector<CheckpointEntry>& kept) {
  std::vector<std::int64_t> steps, preserved;
  for (const auto& e : kept) {
    steps.push_back(e.global_step);
    if (e.preserved) preserved.push_back(e.global_step);
  }
  try {
    // A preserved step outlives the others: its tables are rewritten whole once no newer kept
    // step's chain runs through them, so that its chain's older links can go.
    const DynamicPrune pruned = prune_dynamic_checkpoints(dir, steps, preserved);
    for (const auto& note : pruned.plan.notes) STRATA_LOG(WARN) << "checkpoint: max_to_keep: dynamic tables: " << note;
    for (const auto& why : pruned.not_removed)
      STRATA_LOG(WARN) << "checkpoint: max_to_keep: not deleting " << dir << "/" << why;
  } catch (const Error& e) {
    STRATA_LOG(WARN) << "checkpoint: max_to_keep: dynamic tables of " << dir << " left in place: " << e.message();
  }
}

}  // namespace

// max_to_keep and keep_every_n_hours over the pointer's entries (oldest first, the new one last):
// returns the entries to delete and leaves the kept ones in `entries`.
std::vector<CheckpointEntry> apply_retention(std::vector<CheckpointEntry>& entries, const SaveOptions& options) {
  std::vector<CheckpointEntry> dropped;
  if (options.max_to_keep <= 0) return dropped;
  std::size_t managed = 0;
  for (const auto& e : entries) managed += e.preserved ? 0 : 1;
  // The reference time of keep_every_n_hours: the newest preserved entry. With none yet, the first
  // entry max_to_keep evicts is preserved (the pointer is the only state that survives restarts).
  std::int64_t reference = std::numeric_limits<std::int64_t>::min() / 2;
  for (const auto& e : entries)
    if (e.preserved) reference = e.created_unix;
  const auto period = static_cast<std::int64_t>(options.keep_every_n_hours * 3600.0);
  std::vector<CheckpointEntry> kept;
  for (auto& e : entries) {
    if (!e.preserved && managed > static_cast<std::size_t>(options.max_to_keep)) {
      --managed;
      if (options.keep_every_n_hours > 0 && e.created_unix - reference >= period) {
        e.preserved = true;
        reference = e.created_unix;
      } else {
        dropped.push_back(e);
        continue;
      }
    }
    kept.push_back(e);
  }
  entries = std::move(kept);
  return dropped;
}

std::string save(MPI_Comm comm, const std::string& dir, std::int64_t global_step,
                 const SaveRequest& request, const Attributes& attributes,
                 const SaveOptions& options) {
  return save(*comm::make_mpi_group(comm), dir, global_step, request, attributes, options);
}

std::string save(comm::Group& group, const std::string& dir, std::int64_t global_step,
                 const SaveRequest& request, const Attributes& attributes,
                 const SaveOptions& options) {
  SaveRanks comm(group, options.timeout_s, "checkpoint save");
  const int rank = comm.rank(), size = comm.size();
  const auto& vars = request.variables;

  // ---- 1. local validation ----------------------------------------------------------------
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < vars.size(); ++i) index.emplace(vars[i].name, i);
  agree(comm, validate_locally(request, index));
  // The MPI-IO hints of the open in step 4, refused here, before anything is written.
  std::vector<MpiIoHint> hints;
  std::string hint_error;
  try {
    hints = detail::process_mpiio_hints();
  } catch (const ConfigError& e) {
    hint_error = "checkpoint: " + e.message();
  }
  agree(comm, hint_error);
  agree(comm, comm.same_on_every_rank(format_mpiio_hints(hints))
                  ? ""
                  : std::string("checkpoint: ") + kMpiIoHintsVar + " differs between the ranks of the save");

  // ---- 2. identical variable lists ----------------------------------------------------------
  std::vector<std::uint64_t> lo{hash_variables(vars)}, hi = lo;
  comm.allreduce(lo, SaveRanks::Op::kMin);
  comm.allreduce(hi, SaveRanks::Op::kMax);
  agree(comm, lo == hi ? "" : "checkpoint: the variable lists passed to save() differ between ranks");

  std::vector<DatasetRef> datasets;
  std::vector<std::size_t> first_dataset(vars.size());
  for (std::size_t i = 0; i < vars.size(); ++i) {
    first_dataset[i] = datasets.size();
    datasets.push_back({i, "", detail::variable_path(vars[i].name)});
    for (const auto& s : vars[i].slots) datasets.push_back({i, s, detail::slot_path(vars[i].name, s)});
  }
  std::vector<std::uint64_t> dataset_bytes(datasets.size());
  std::uint64_t data_bytes = 0;
  for (std::size_t d = 0; d < datasets.size(); ++d) {
    const auto& v = vars[datasets[d].var];
    dataset_bytes[d] = static_cast<std::uint64_t>(v.shape[0] * detail::row_bytes(v));
    data_bytes += dataset_bytes[d];
  }

  // ---- 3. per-piece CRCs, coverage check and combination on rank 0 -------------------------
  struct Piece {
    std::size_t dataset;
    std::int64_t row_begin, row_end;
    const void* data;
  };
  std::vector<Piece> pieces;
  std::vector<std::int64_t> packed;  // (dataset, row_begin, row_end, crc) per piece
  for (const auto& s : request.shards) {
    if (s.row_end == s.row_begin) continue;
    std::size_t vi = index.at(s.variable);
    std::int64_t bytes = (s.row_end - s.row_begin) * detail::row_bytes(vars[vi]);
    for (std::size_t k = 0; k <= vars[vi].slots.size(); ++k) {
      std::size_t d = first_dataset[vi] + k;
      const void* data = k == 0 ? s.values : s.slots.at(vars[vi].slots[k - 1]);
      pieces.push_back({d, s.row_begin, s.row_end, data});
      std::uint32_t crc = detail::crc32_update(0, data, static_cast<std::size_t>(bytes));
      packed.insert(packed.end(), {static_cast<std::int64_t>(d), s.row_begin, s.row_end,
                                   static_cast<std::int64_t>(crc)});
    }
  }
  std::vector<std::int64_t> all = comm.gather(packed);

  // payload: checksums per dataset, then created_unix.
  std::vector<std::uint64_t> checksums(datasets.size() + 1, 0);
  std::string error;
  const std::string final_path = (std::filesystem::path(dir) / detail::checkpoint_file_name(global_step)).string();
  const std::string tmp_path = final_path + ".tmp";
  const std::string cannot = "checkpoint: cannot save " + final_path + ": ";
  if (rank == 0) {
    std::vector<std::vector<std::array<std::int64_t, 3>>> by_dataset(datasets.size());
    for (std::size_t i = 0; i + 3 < all.size(); i += 4)
      by_dataset[static_cast<std::size_t>(all[i])].push_back({all[i + 1], all[i + 2], all[i + 3]});
    for (std::size_t d = 0; d < datasets.size() && error.empty(); ++d) {
      auto& ps = by_dataset[d];
      std::sort(ps.begin(), ps.end());
      const auto& v = vars[datasets[d].var];
      std::int64_t next = 0;
      std::uint32_t crc = 0;
      for (const auto& p : ps) {
        if (p[0] != next) {
          error = "checkpoint: rows of variable '" + v.name + "' " +
                  (p[0] < next ? "are held by more than one rank (overlap at row " + std::to_string(p[0]) + ")"
                               : "[" + std::to_string(next) + "," + std::to_string(p[0]) + ") are held by no rank");
          break;
        }
        crc = detail::crc32_combine(crc, static_cast<std::uint32_t>(p[2]),
                                    static_cast<std::uint64_t>((p[1] - p[0]) * detail::row_bytes(v)));
        next = p[1];
      }
      if (error.empty() && next != v.shape[0])
        error = "checkpoint: rows [" + std::to_string(next) + "," + std::to_string(v.shape[0]) +
                ") of variable '" + v.name + "' are held by no rank";
      checksums[d] = crc;
    }
    checksums.back() = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  }
  agree(comm, error);

  std::vector<std::string> paths;  // "variables/..." as in the manifest and the integrity block
  for (const auto& d : datasets) paths.push_back(d.path.substr(1));
  const std::uint64_t block_bytes = detail::integrity_block_bytes(paths);
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      error = cannot + "cannot create directory '" + dir + "': " + ec.message();
    } else if (std::getenv("STRATA_TEST_SKIP_SPACE_CHECK") == nullptr) {
      // A lower bound of the file's size (its data, the integrity block and less HDF5 metadata than
      // it ever takes): less room than that fails for certain, so say so before writing anything.
      const std::uint64_t need = block_bytes + data_bytes + 4096 + 1024 * datasets.size();
      const std::uint64_t avail = available_bytes(dir);
      if (avail < need)
        error = cannot + std::strerror(ENOSPC) + " (the file needs at least " + std::to_string(need) + " bytes, " +
                std::to_string(avail) + " are available in " + dir + ")";
    }
  }
  agree<SaveError>(comm, error);
  comm.broadcast(checksums, 0);
  const auto created_unix = static_cast<std::int64_t>(checksums.back());
  const std::string position_json =
      attributes.training_position_json.empty() ? "{}" : attributes.training_position_json;

  detail::Manifest manifest;
  manifest.format_version = kFormatVersion;
  manifest.global_step = global_step;
  manifest.variable_sequence_hash = attributes.variable_sequence_hash;
  manifest.optimizer = attributes.optimizer;
  manifest.training_position = position_json;
  manifest.created_unix = created_unix;
  manifest.checksum_algorithm = "crc32";
  for (std::size_t d = 0; d < datasets.size(); ++d) {
    const auto& v = vars[datasets[d].var];
    detail::ManifestDataset md{paths[d], to_string(v.dtype), v.shape, checksums[d], std::nullopt};
    if (datasets[d].slot.empty()) md.optimizer_step = v.optimizer_step;
    manifest.datasets.push_back(std::move(md));
  }

  std::vector<std::uint64_t> offsets(datasets.size(), 0);
  try {
    // ---- 4. the HDF5 write ---------------------------------------------------------------------
    {
      // The HDF5 lock, where this rank writes a file: without MPI-IO only rank 0 does, and the
      // others (threads of its process) must not wait for the lock it holds across the agreements.
      std::optional<detail::QuietErrors> quiet;
      if (comm.parallel() || rank == 0) quiet.emplace();
      H5Id file, dxpl;
      std::vector<H5Id> dsets(datasets.size());  // closed before `file` (declared after it)
      std::string local;
      try {
        // Parallel: every rank's file; otherwise rank 0's alone (the others' stays empty).
        file = comm.create_file(tmp_path, block_bytes, hints);
        if (file.get() >= 0) {
          detail::write_attr_i32(file.get(), "format_version", kFormatVersion);
          detail::write_attr_i64(file.get(), "global_step", global_step);
          detail::write_attr_u64(file.get(), "variable_sequence_hash", attributes.variable_sequence_hash);
          detail::write_attr_string(file.get(), "optimizer", attributes.optimizer);
          detail::write_attr_string(file.get(), "training_position", position_json);
          detail::write_attr_i64(file.get(), "created_unix", created_unix);
          detail::write_attr_string(file.get(), "checksum_algorithm", "crc32");
          detail::write_attr_u64(file.get(), "metadata_checksum", detail::manifest_checksum(manifest));

          H5Id lcpl(STRATA_CHECK_H5(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
          STRATA_CHECK_H5(H5Pset_create_intermediate_group(lcpl.get(), 1));
          H5Id(STRATA_CHECK_H5(H5Gcreate2(file.get(), "/variables", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
          H5Id(STRATA_CHECK_H5(H5Gcreate2(file.get(), "/slots", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
          H5Id dcpl(STRATA_CHECK_H5(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
          STRATA_CHECK_H5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
          STRATA_CHECK_H5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
          STRATA_CHECK_H5(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
          dxpl = comm.piece_transfer();
          for (std::size_t d = 0; d < datasets.size(); ++d) {
            const auto& v = vars[datasets[d].var];
            std::vector<hsize_t> dims(v.shape.begin(), v.shape.end());
            H5Id space(STRATA_CHECK_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)), H5Sclose);
            dsets[d] = H5Id(STRATA_CHECK_H5(H5Dcreate2(file.get(), datasets[d].path.c_str(), detail::file_type(v.dtype),
                                                       space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT)),
                            H5Dclose);
            detail::write_attr_u64(dsets[d].get(), "checksum", checksums[d]);
            if (datasets[d].slot.empty() && v.optimizer_step != 0)
              detail::write_attr_i64(dsets[d].get(), "optimizer_step", v.optimizer_step);
            const haddr_t at = H5Dget_offset(dsets[d].get());
            if (dataset_bytes[d] > 0 && at == HADDR_UNDEF)
              throw Error("dataset " + datasets[d].path + " has no file space after creation");
            offsets[d] = dataset_bytes[d] > 0 ? static_cast<std::uint64_t>(at) : 0;
          }
          // Metadata on disk now, while the file system has room: if the data then fills it, the
          // close below rewrites blocks that exist instead of needing new ones.
          STRATA_CHECK_H5(H5Fflush(file.get(), H5F_SCOPE_GLOBAL));
        }
      } catch (const Error& e) {
        local = cannot + "creating " + tmp_path + " failed: " + e.message();
      }
      agree<SaveError>(comm, local);
      if (!comm.parallel()) comm.broadcast(offsets, 0);  // the read-back's ranges below need them

      // Without MPI-IO, rank 0 writes every rank's pieces: each sends its own, described by
      // (dataset, row_begin, row_end, bytes) and followed by their bytes, in one message.
      std::vector<std::string> blobs;
      if (!comm.parallel()) {
        std::string blob;
        for (const Piece& p : pieces) {
          const auto& v = vars[datasets[p.dataset].var];
          const std::int64_t head[4] = {static_cast<std::int64_t>(p.dataset), p.row_begin, p.row_end,
                                        (p.row_end - p.row_begin) * detail::row_bytes(v)};
          blob.append(reinterpret_cast<const char*>(head), sizeof head);
          blob.append(static_cast<const char*>(p.data), static_cast<std::size_t>(head[3]));
        }
        blobs = comm.gather_blobs(rank == 0 ? std::string() : std::move(blob));
        for (std::size_t r = 1; r < blobs.size() && local.empty(); ++r) {
          // The pieces were checked against the variables on their rank (step 3's coverage check
          // saw their rows); read here only within the message and the dataset they name.
          const std::string& b = blobs[r];
          std::size_t at = 0;
          while (at < b.size()) {
            std::int64_t head[4];
            if (b.size() - at < sizeof head) {
              local = cannot + "rank " + std::to_string(r) + " sent a torn piece";
              break;
            }
            std::memcpy(head, b.data() + at, sizeof head);
            at += sizeof head;
            if (head[0] < 0 || static_cast<std::size_t>(head[0]) >= datasets.size() || head[1] < 0 || head[2] < head[1] ||
                head[2] > vars[datasets[static_cast<std::size_t>(head[0])].var].shape[0] ||
                head[3] != (head[2] - head[1]) * detail::row_bytes(vars[datasets[static_cast<std::size_t>(head[0])].var]) ||
                static_cast<std::uint64_t>(head[3]) > b.size() - at) {
              local = cannot + "rank " + std::to_string(r) + " sent a piece that does not fit its dataset";
              break;
            }
            pieces.push_back({static_cast<std::size_t>(head[0]), head[1], head[2], b.data() + at});
            at += static_cast<std::size_t>(head[3]);
          }
        }
        if (rank != 0) pieces.clear();
      }

      // This rank's pieces (rank 0's: every rank's, without MPI-IO), independently: one contiguous
      // byte range each.
      try {
        for (std::size_t i = 0; i < pieces.size() && local.empty(); ++i) {
          const Piece& p = pieces[i];
          const auto& v = vars[datasets[p.dataset].var];
          std::vector<hsize_t> dims(v.shape.begin(), v.shape.end()), start(dims.size(), 0), count_dims = dims;
          start[0] = static_cast<hsize_t>(p.row_begin);
          count_dims[0] = static_cast<hsize_t>(p.row_end - p.row_begin);
          const hid_t dset = dsets[p.dataset].get();
          H5Id fspace(STRATA_CHECK_H5(H5Dget_space(dset)), H5Sclose);
          STRATA_CHECK_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count_dims.data(),
                                              nullptr));
          H5Id mspace(STRATA_CHECK_H5(H5Screate_simple(static_cast<int>(dims.size()), count_dims.data(), nullptr)),
                      H5Sclose);
          errno = 0;
          const herr_t rc = H5Dwrite(dset, detail::memory_type(v.dtype), mspace.get(), fspace.get(), dxpl.get(), p.data);
          const int err = errno;
          if (rc < 0) {
            std::string hdf5;
            try {
              detail::fail_h5("H5Dwrite", STRATA_HERE);
            } catch (const Error& e) {
              hdf5 = e.message();
            }
            const std::string reason = write_failure_reason(err, dir, block_bytes + data_bytes);
            local = cannot + "writing " + datasets[p.dataset].path.substr(1) + " into " + tmp_path + " failed" +
                    (reason.empty() ? "" : ": " + reason) + " [HDF5: " + hdf5 + "]";
            break;
          }
        }
      } catch (const Error& e) {
        local = cannot + "writing " + tmp_path + " failed: " + e.message();
      }
      // Test hook (STRATA_TEST_SAVE_DELAY_S): hold the save open with its data written but the file
      // not yet closed or committed, so a test can kill a rank in the middle of a save reliably.
      if (const char* delay = std::getenv("STRATA_TEST_SAVE_DELAY_S"))
        std::this_thread::sleep_for(std::chrono::duration<double>(clamp_seconds(std::atof(delay))));
      // Every rank closes (collective), whatever its writes did. After a failed write (a full disk,
      // typically) rank 0 first gives the data's space back: HDF5's close still writes metadata,
      // and a rank whose collective metadata write failed would leave the others waiting in it.
      const std::string write_error = agreed_error(comm, local);
      local.clear();
      if (!write_error.empty()) {
        if (rank == 0 && ::truncate(tmp_path.c_str(), 0) != 0) {
          // Nothing more to do: the close may fail too, and the .tmp is removed below.
        }
        comm.barrier();
      }
      dsets.clear();
      errno = 0;
      const herr_t closed = file.close();
      const int close_err = errno;
      if (!write_error.empty()) throw SaveError(write_error);
      if (closed < 0) {
        std::string hdf5;
        try {
          detail::fail_h5("H5Fclose", STRATA_HERE);
        } catch (const Error& e) {
          hdf5 = e.message();
        }
        const std::string reason = write_failure_reason(close_err, dir, block_bytes + data_bytes);
        local = cannot + "closing " + tmp_path + " failed" + (reason.empty() ? "" : ": " + reason) + " [HDF5: " +
                hdf5 + "]";
      }
      agree<SaveError>(comm, local);
    }

    // ---- 5. read-back CRCs and the integrity block ------------------------------------------
    std::uint64_t file_bytes = 0;
    if (rank == 0) {
      struct stat st {};
      if (::stat(tmp_path.c_str(), &st) != 0)
        error = cannot + "stat '" + tmp_path + "' failed: " + std::strerror(errno);
      else
        file_bytes = static_cast<std::uint64_t>(st.st_size);
    }
    agree<SaveError>(comm, error);
    {
      std::vector<std::uint64_t> b{file_bytes};
      comm.broadcast(b, 0);
      file_bytes = b[0];
    }
    detail::IntegrityBlock block;
    block.file_bytes = file_bytes;
    block.block_bytes = block_bytes;
    block.global_step = global_step;
    for (std::size_t d = 0; d < datasets.size(); ++d)
      block.regions.push_back({paths[d], offsets[d], dataset_bytes[d], static_cast<std::uint32_t>(checksums[d])});
    std::sort(block.regions.begin(), block.regions.end(),
              [](const detail::DataRegion& a, const detail::DataRegion& b) { return a.path < b.path; });
    std::vector<detail::Segment> segments;
    std::vector<std::int64_t> mine;  // (segment, begin, end, crc) per piece
    std::string local;
    try {
      segments = detail::file_segments(block);
      const std::uint64_t span = file_bytes - block_bytes;
      const std::uint64_t begin = block_bytes + span * static_cast<std::uint64_t>(rank) / static_cast<std::uint64_t>(size);
      const std::uint64_t end = block_bytes + span * static_cast<std::uint64_t>(rank + 1) / static_cast<std::uint64_t>(size);
      if (end > begin) {
        const int fd = ::open(tmp_path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw Error("open for reading failed: " + std::string(std::strerror(errno)));
        std::vector<detail::SegmentPiece> got;
        try {
          got = detail::scan_segments(fd, tmp_path, begin, end, segments);
        } catch (...) {
          ::close(fd);
          throw;
        }
        ::close(fd);
        for (const auto& p : got)
          mine.insert(mine.end(), {static_cast<std::int64_t>(p.segment), static_cast<std::int64_t>(p.begin),
                                   static_cast<std::int64_t>(p.end), static_cast<std::int64_t>(p.crc)});
      }
    } catch (const Error& e) {
      local = cannot + "reading back " + tmp_path + " failed: " + e.message();
    }
    agree<SaveError>(comm, local);
    std::vector<std::int64_t> got = comm.gather(mine);
    if (rank == 0) {
      try {
        std::vector<detail::SegmentPiece> read_back;
        for (std::size_t i = 0; i + 3 < got.size(); i += 4)
          read_back.push_back({static_cast<std::uint64_t>(got[i]), static_cast<std::uint64_t>(got[i + 1]),
                               static_cast<std::uint64_t>(got[i + 2]), static_cast<std::uint32_t>(got[i + 3])});
        const std::vector<std::uint32_t> crcs = detail::combine_segment_pieces(std::move(read_back), segments);
        for (std::size_t s = 0; s < segments.size() && error.empty(); ++s) {
          if (segments[s].region < 0) continue;
          const detail::DataRegion& r = block.regions[static_cast<std::size_t>(segments[s].region)];
          if (crcs[s] != r.crc)
            error = cannot + "read-back of " + tmp_path + ": " + r.path + " does not hold the values it was given (CRC-32 " +
                    std::to_string(crcs[s]) + " on disk, " + std::to_string(r.crc) + " in memory)";
        }
        if (error.empty()) {
          block.file_crc = detail::whole_file_crc(detail::encode_integrity_block(block), segments, crcs);
          const std::string encoded = detail::encode_integrity_block(block);
          const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CLOEXEC);
          if (fd < 0) throw Error("open for writing failed: " + std::string(std::strerror(errno)));
          const ssize_t wrote = ::pwrite(fd, encoded.data(), encoded.size(), 0);
          const int err = errno;
          ::close(fd);
          if (wrote != static_cast<ssize_t>(encoded.size()))
            throw Error("writing the integrity block failed: " +
                        std::string(wrote < 0 ? std::strerror(err) : "short write"));
        }
      } catch (const Error& e) {
        error = cannot + tmp_path + ": " + e.message();
      }
    }
    agree<SaveError>(comm, error);

    // ---- 6. commit on rank 0 -----------------------------------------------------------------
    if (rank == 0) {
      const std::string name = detail::checkpoint_file_name(global_step);
      bool pointer_read = false, listed = false;
      try {
        CheckpointList pointer = detail::read_pointer(dir);
        auto& entries = pointer.entries;
        pointer_read = true;
        // An entry that is no checkpoint name of this directory ("../x", "/etc/y") is dropped from
        // the pointer and its file never touched: retention deletes only ckpt-<step>.h5 here.
        for (const auto& r : pointer.refused)
          STRATA_LOG(WARN) << "checkpoint: dropping entry '" << r.file << "' of " << dir << "/" << detail::kPointerFile
                           << ": " << r.reason;
        for (const auto& e : entries) listed = listed || e.file == name;
        detail::durable_rename(tmp_path, final_path);
        // Test hook (STRATA_TEST_COMMIT_DELAY_S): hold the commit with the file renamed into place
        // but checkpoint.json not yet naming it, so a test can kill the PS at that point.
        if (const char* delay = std::getenv("STRATA_TEST_COMMIT_DELAY_S"))
          std::this_thread::sleep_for(std::chrono::duration<double>(clamp_seconds(std::atof(delay))));
        entries.erase(std::remove_if(entries.begin(), entries.end(),
                                     [&](const CheckpointEntry& e) { return e.file == name; }),
                      entries.end());
        entries.push_back({name, global_step, created_unix});
        std::vector<CheckpointEntry> dropped = apply_retention(entries, options);
        detail::write_pointer(dir, entries);
        for (const auto& e : dropped) {
          const std::string kept = detail::remove_entry_file(dir, e);
          if (!kept.empty()) {
            STRATA_LOG(WARN) << "checkpoint: max_to_keep: not deleting " << dir << "/" << e.file << ": " << kept;
          }
        }
        if (options.max_to_keep > 0) prune_dynamic_files(dir, entries);
      } catch (const Error& e) {
        error = cannot + "commit failed: " + e.message();
        std::error_code ec;
        std::filesystem::remove(std::filesystem::path(dir) / (std::string(detail::kPointerFile) + ".tmp"), ec);
        // A file of this name that checkpoint.json does not list is not committed (renamed just
        // now, or left by an earlier crash): remove it. One it lists was at most replaced by the
        // same step's new, complete file: keep it.
        if (pointer_read && !listed) std::filesystem::remove(final_path, ec);
      }
    }
    agree<SaveError>(comm, error);
  } catch (const SaveError&) {
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove(tmp_path, ec);
    }
    throw;
  }
  return final_path;
}

}  // namespace strata::checkpoint
