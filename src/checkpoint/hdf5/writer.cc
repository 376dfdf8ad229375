// save(): the collective checkpoint write. The protocol, narrated once (all ranks of `comm` run
// the same steps in the same order; every step marked [agree] ends with the same verdict on every
// rank, so a bad request throws ConfigError everywhere instead of leaving peers in a collective):
//
//  1. [agree] Local validation of the request: names, shapes, shards inside their variable,
//     slot pointers present.
//  2. [agree] The variable list is identical on every rank (FNV-1a 64 of its serialisation,
//     allreduce MIN == MAX).
//  3. [agree] Each rank CRC-32s every piece it holds (one piece = one shard of one dataset, a
//     contiguous row range) and gathers (dataset, row_begin, row_end, crc) to rank 0. Rank 0 checks
//     that the pieces of each dataset tile [0, rows) exactly, combines the CRCs in row order with
//     crc32_combine into the CRC-32 of the full dataset, creates the directory, and broadcasts the
//     checksums and the creation time. So checksums come from the in-memory values, not from a
//     re-read, and no rank reads or gathers values of another rank.
//  4. Parallel HDF5 (mpio driver, collective metadata): create <dir>/ckpt-<step>.h5.tmp, root
//     attributes, and every dataset at its FULL shape with its `checksum` attribute; then each
//     rank writes its pieces with collective transfers. Each dataset sees the same number of
//     H5Dwrite calls on every rank (the max piece count over ranks); a rank with fewer pieces
//     writes an empty selection. H5Fclose (collective) flushes everything.
//  5. [agree] Rank 0 commits: fsync(tmp), rename to ckpt-<step>.h5, fsync(dir), then replaces
//     checkpoint.json the same way, then deletes files dropped by max_to_keep. The verdict is
//     broadcast, so every rank returns after the commit (or throws the same error).
// HDF5 failures inside step 4 are not agreed: a rank that throws there leaves its peers in a
// collective; the error model (STYLE.md section 4) turns that into MPI_Abort of the job. Either way
// nothing committed is touched before step 5.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <thread>
#include <set>

#include "checkpoint/hdf5/commit.h"
#include "checkpoint/hdf5/h5_util.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/common/error.h"

namespace strata::checkpoint {
namespace {

using detail::H5Id;

// Collective: throws ConfigError on every rank when `local_error` is non-empty on any rank, with
// the message of the lowest such rank.
void agree(MPI_Comm comm, const std::string& local_error) {
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  int mine = local_error.empty() ? size : rank;
  int first = size;
  STRATA_CHECK_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == size) return;
  std::string message = local_error;
  int len = static_cast<int>(message.size());
  STRATA_CHECK_MPI(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  message.resize(len);
  STRATA_CHECK_MPI(MPI_Bcast(message.data(), len, MPI_CHAR, first, comm));
  throw ConfigError(message + (first == rank ? "" : " (reported by rank " + std::to_string(first) + ")"));
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
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
  const auto& vars = request.variables;

  // ---- 1. local validation ----------------------------------------------------------------
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < vars.size(); ++i) index.emplace(vars[i].name, i);
  agree(comm, validate_locally(request, index));

  // ---- 2. identical variable lists ----------------------------------------------------------
  std::uint64_t h = hash_variables(vars), lo = 0, hi = 0;
  STRATA_CHECK_MPI(MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, comm));
  STRATA_CHECK_MPI(MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, comm));
  agree(comm, lo == hi ? "" : "checkpoint: the variable lists passed to save() differ between ranks");

  std::vector<DatasetRef> datasets;
  std::vector<std::size_t> first_dataset(vars.size());
  for (std::size_t i = 0; i < vars.size(); ++i) {
    first_dataset[i] = datasets.size();
    datasets.push_back({i, "", detail::variable_path(vars[i].name)});
    for (const auto& s : vars[i].slots) datasets.push_back({i, s, detail::slot_path(vars[i].name, s)});
  }

  // ---- 3. per-piece CRCs, coverage check and combination on rank 0 -------------------------
  struct Piece {
    std::size_t dataset;
    const ShardData* shard;
    const void* data;
  };
  std::vector<Piece> pieces;
  std::vector<std::int64_t> packed;  // (dataset, row_begin, row_end, crc) per piece
  std::vector<int> pieces_per_var(vars.size(), 0);
  for (const auto& s : request.shards) {
    if (s.row_end == s.row_begin) continue;
    std::size_t vi = index.at(s.variable);
    ++pieces_per_var[vi];
    std::int64_t bytes = (s.row_end - s.row_begin) * detail::row_bytes(vars[vi]);
    for (std::size_t k = 0; k <= vars[vi].slots.size(); ++k) {
      std::size_t d = first_dataset[vi] + k;
      const void* data = k == 0 ? s.values : s.slots.at(vars[vi].slots[k - 1]);
      pieces.push_back({d, &s, data});
      std::uint32_t crc = detail::crc32_update(0, data, static_cast<std::size_t>(bytes));
      packed.insert(packed.end(), {static_cast<std::int64_t>(d), s.row_begin, s.row_end,
                                   static_cast<std::int64_t>(crc)});
    }
  }
  int count = static_cast<int>(packed.size());
  std::vector<int> counts(size), displs(size);
  STRATA_CHECK_MPI(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm));
  std::vector<std::int64_t> all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += counts[r];
    }
    all.resize(total);
  }
  STRATA_CHECK_MPI(MPI_Gatherv(packed.data(), count, MPI_INT64_T, all.data(), counts.data(),
                               displs.data(), MPI_INT64_T, 0, comm));

  // payload: checksums per dataset, then created_unix.
  std::vector<std::uint64_t> checksums(datasets.size() + 1, 0);
  std::string error;
  const std::string final_path = (std::filesystem::path(dir) / detail::checkpoint_file_name(global_step)).string();
  const std::string tmp_path = final_path + ".tmp";
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
    if (error.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) error = "checkpoint: cannot create directory '" + dir + "': " + ec.message();
    }
  }
  agree(comm, error);
  STRATA_CHECK_MPI(MPI_Bcast(checksums.data(), static_cast<int>(checksums.size()), MPI_UINT64_T, 0, comm));
  const auto created_unix = static_cast<std::int64_t>(checksums.back());

  std::vector<int> max_pieces(vars.size(), 0);
  if (!vars.empty())
    STRATA_CHECK_MPI(MPI_Allreduce(pieces_per_var.data(), max_pieces.data(), static_cast<int>(vars.size()),
                                   MPI_INT, MPI_MAX, comm));

  // ---- 4. parallel HDF5 write --------------------------------------------------------------
  {
    detail::QuietErrors quiet;
    H5Id fapl(STRATA_CHECK_H5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
    STRATA_CHECK_H5(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL));
    STRATA_CHECK_H5(H5Pset_all_coll_metadata_ops(fapl.get(), true));
    STRATA_CHECK_H5(H5Pset_coll_metadata_write(fapl.get(), true));
    H5Id file(STRATA_CHECK_H5(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get())), H5Fclose);

    detail::write_attr_i32(file.get(), "format_version", kFormatVersion);
    detail::write_attr_i64(file.get(), "global_step", global_step);
    detail::write_attr_u64(file.get(), "variable_sequence_hash", attributes.variable_sequence_hash);
    detail::write_attr_string(file.get(), "optimizer", attributes.optimizer);
    detail::write_attr_string(file.get(), "training_position",
                              attributes.training_position_json.empty() ? "{}" : attributes.training_position_json);
    detail::write_attr_i64(file.get(), "created_unix", created_unix);
    detail::write_attr_string(file.get(), "checksum_algorithm", "crc32");

    H5Id lcpl(STRATA_CHECK_H5(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
    STRATA_CHECK_H5(H5Pset_create_intermediate_group(lcpl.get(), 1));
    H5Id(STRATA_CHECK_H5(H5Gcreate2(file.get(), "/variables", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    H5Id(STRATA_CHECK_H5(H5Gcreate2(file.get(), "/slots", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
    H5Id dcpl(STRATA_CHECK_H5(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
    STRATA_CHECK_H5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
    STRATA_CHECK_H5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
    STRATA_CHECK_H5(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
    H5Id dxpl(STRATA_CHECK_H5(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
    STRATA_CHECK_H5(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE));

    for (std::size_t d = 0; d < datasets.size(); ++d) {
      const auto& v = vars[datasets[d].var];
      std::vector<hsize_t> dims(v.shape.begin(), v.shape.end());
      H5Id space(STRATA_CHECK_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)), H5Sclose);
      H5Id dset(STRATA_CHECK_H5(H5Dcreate2(file.get(), datasets[d].path.c_str(), detail::file_type(v.dtype),
                                           space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT)),
                H5Dclose);
      detail::write_attr_u64(dset.get(), "checksum", checksums[d]);
      if (datasets[d].slot.empty() && v.optimizer_step != 0)
        detail::write_attr_i64(dset.get(), "optimizer_step", v.optimizer_step);

      // This rank's pieces of dataset d, padded with empty writes to the max count over ranks.
      std::vector<const Piece*> mine;
      for (const auto& p : pieces)
        if (p.dataset == d) mine.push_back(&p);
      for (int k = 0; k < max_pieces[datasets[d].var]; ++k) {
        H5Id fspace(STRATA_CHECK_H5(H5Dget_space(dset.get())), H5Sclose);
        static const char kDummy = 0;
        if (k < static_cast<int>(mine.size())) {
          const Piece& p = *mine[k];
          std::vector<hsize_t> start(dims.size(), 0), count_dims = dims;
          start[0] = static_cast<hsize_t>(p.shard->row_begin);
          count_dims[0] = static_cast<hsize_t>(p.shard->row_end - p.shard->row_begin);
          STRATA_CHECK_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr,
                                              count_dims.data(), nullptr));
          H5Id mspace(STRATA_CHECK_H5(H5Screate_simple(static_cast<int>(dims.size()), count_dims.data(), nullptr)),
                      H5Sclose);
          STRATA_CHECK_H5(H5Dwrite(dset.get(), detail::memory_type(v.dtype), mspace.get(), fspace.get(),
                                   dxpl.get(), p.data));
        } else {
          STRATA_CHECK_H5(H5Sselect_none(fspace.get()));
          hsize_t one = 1;
          H5Id mspace(STRATA_CHECK_H5(H5Screate_simple(1, &one, nullptr)), H5Sclose);
          STRATA_CHECK_H5(H5Sselect_none(mspace.get()));
          STRATA_CHECK_H5(H5Dwrite(dset.get(), detail::memory_type(v.dtype), mspace.get(), fspace.get(),
                                   dxpl.get(), &kDummy));
        }
      }
    }
    // Test hook (STRATA_TEST_SAVE_DELAY_S): hold the save open with its data written but the file
    // not yet closed or committed, so a test can kill a rank in the middle of a save reliably.
    if (const char* delay = std::getenv("STRATA_TEST_SAVE_DELAY_S"))
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(delay)));
    STRATA_CHECK_H5(file.close());
  }

  // ---- 5. commit on rank 0 -------------------------------------------------------------------
  error.clear();
  if (rank == 0) {
    try {
      detail::durable_rename(tmp_path, final_path);
      auto entries = detail::read_pointer(dir);
      const std::string name = detail::checkpoint_file_name(global_step);
      entries.erase(std::remove_if(entries.begin(), entries.end(),
                                   [&](const CheckpointEntry& e) { return e.file == name; }),
                    entries.end());
      entries.push_back({name, global_step, created_unix});
      std::vector<CheckpointEntry> dropped = apply_retention(entries, options);
      detail::write_pointer(dir, entries);
      for (const auto& e : dropped) {
        std::error_code ec;
        std::filesystem::remove(std::filesystem::path(dir) / e.file, ec);
      }
    } catch (const Error& e) {
      error = e.message();
    }
  }
  agree(comm, error);
  return final_path;
}

}  // namespace strata::checkpoint
