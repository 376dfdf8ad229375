// STRATA_MPIIO_HINTS under mpirun: a parallel HDF5 file created with hints carries them in its
// file access property list and in the MPI-IO handle the MPI library opened, and reads back
// correctly; save() and the parallel dynamic-table save take the variable from the environment,
// commit files that read back, and refuse a malformed value, or one that differs between ranks,
// with ConfigError on every rank before anything is written, leaving the committed checkpoint and
// checkpoint.json as they were. Every rank runs every collective.
//
// What this machine can show: the hints reach H5Pset_fapl_mpio and MPI_File_open. Whether the io
// component acts on them (striping on Lustre, collective buffering nodes) needs a cluster file
// system, which is not here.
#include <hdf5.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/hdf5/h5_util.h"
#include "mpi/mpi_test.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/checkpoint/mpiio_hints.h"
#include "strata/common/error.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::TestComm;
using detail::H5Id;

// The hints the tests give. Open MPI 4.1 keeps the info of MPI_File_open and hands a copy back from
// MPI_File_get_info whichever io component (ompio by default here, or romio321) opened the file,
// so every key is observable there; HDF5 1.10 keeps its own duplicate for H5Pget_fapl_mpio.
const char* const kHints = "romio_cb_write=enable,cb_buffer_size=1048576,striping_factor=4,striping_unit=1048576";

// Sets STRATA_MPIIO_HINTS in this process for one scope, restoring what was there.
class ScopedHints {
 public:
  explicit ScopedHints(const std::optional<std::string>& value) {
    if (const char* old = std::getenv(kMpiIoHintsVar)) old_ = old;
    if (value) ::setenv(kMpiIoHintsVar, value->c_str(), 1);
    else ::unsetenv(kMpiIoHintsVar);
  }
  ~ScopedHints() {
    if (old_) ::setenv(kMpiIoHintsVar, old_->c_str(), 1);
    else ::unsetenv(kMpiIoHintsVar);
  }
  ScopedHints(const ScopedHints&) = delete;
  ScopedHints& operator=(const ScopedHints&) = delete;

 private:
  std::optional<std::string> old_;
};

std::string make_dir(MPI_Comm comm, const std::string& tag) { return ::strata::testing::shared_test_dir(comm, "strata_mpiio", tag); }

void remove_dir(MPI_Comm comm, const std::string& dir) { ::strata::testing::remove_shared_test_dir(comm, dir); }

// The value of `key` in `info`, or nullopt.
std::optional<std::string> info_value(MPI_Info info, const char* key) {
  if (info == MPI_INFO_NULL) return std::nullopt;
  char value[MPI_MAX_INFO_VAL + 1] = {};
  int flag = 0;
  MPI_Info_get(info, key, MPI_MAX_INFO_VAL, value, &flag);
  if (!flag) return std::nullopt;
  return std::string(value);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Each rank's rows of a 2-column f32 variable of `rows` rows: rank r holds [r*rows/n, (r+1)*rows/n).
float value_at(std::int64_t row, std::int64_t col) { return static_cast<float>(row) * 0.5f + static_cast<float>(col) - 3.0f; }

TEST(MpiIoHints, ParallelFileCarriesTheHintsAndReadsBack) {
  TestComm c;
  const std::string dir = make_dir(c.get(), "plist");
  const std::string path = dir + "/hinted.h5";
  const std::vector<MpiIoHint> hints = parse_mpiio_hints(kHints);
  constexpr hsize_t kRows = 64, kCols = 2;
  bool fapl_ok = false, mpi_ok = false, written = false;
  {
    detail::QuietErrors quiet;
    H5Id file = detail::create_parallel_file(path, c.get(), 0, hints);

    // The file access property list HDF5 reports for the open file.
    {
      const H5Id fapl(H5Fget_access_plist(file.get()), H5Pclose);
      MPI_Comm comm = MPI_COMM_NULL;
      MPI_Info info = MPI_INFO_NULL;
      fapl_ok = fapl.get() >= 0 && H5Pget_fapl_mpio(fapl.get(), &comm, &info) >= 0;
      for (const auto& h : hints) fapl_ok = fapl_ok && info_value(info, h.key.c_str()) == h.value;
      if (info != MPI_INFO_NULL) MPI_Info_free(&info);
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }
    // The MPI-IO file handle under it: what MPI_File_open was given, as the MPI library reports it.
    {
      const H5Id fapl(H5Fget_access_plist(file.get()), H5Pclose);
      void* handle = nullptr;
      if (H5Fget_vfd_handle(file.get(), fapl.get(), &handle) >= 0 && handle != nullptr) {
        MPI_Info used = MPI_INFO_NULL;
        mpi_ok = MPI_File_get_info(*static_cast<MPI_File*>(handle), &used) == MPI_SUCCESS;
        for (const auto& h : hints) mpi_ok = mpi_ok && info_value(used, h.key.c_str()) == h.value;
        if (used != MPI_INFO_NULL) MPI_Info_free(&used);
      }
    }

    // Every rank writes its rows independently, as the checkpoint writers do; the dataset is
    // closed before the file (the mpio driver's files close only without open objects).
    {
      const int r = c.rank(), n = c.size();
      const hsize_t dims[2] = {kRows, kCols};
      const H5Id space(H5Screate_simple(2, dims, nullptr), H5Sclose);
      const H5Id dset(H5Dcreate2(file.get(), "/values", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      H5Dclose);
      const hsize_t begin = kRows * static_cast<hsize_t>(r) / static_cast<hsize_t>(n);
      const hsize_t end = kRows * static_cast<hsize_t>(r + 1) / static_cast<hsize_t>(n);
      std::vector<float> mine;
      for (hsize_t row = begin; row < end; ++row)
        for (hsize_t col = 0; col < kCols; ++col)
          mine.push_back(value_at(static_cast<std::int64_t>(row), static_cast<std::int64_t>(col)));
      const hsize_t start[2] = {begin, 0}, count[2] = {end - begin, kCols};
      const H5Id fspace(H5Dget_space(dset.get()), H5Sclose);
      const H5Id mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
      const H5Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
      written = dset.get() >= 0 && H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0 &&
                H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT) >= 0 &&
                H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), dxpl.get(), mine.data()) >= 0;
    }
    written = file.close() >= 0 && written;
  }
  STRATA_EXPECT_ALL(c.get(), fapl_ok);
  STRATA_EXPECT_ALL(c.get(), mpi_ok);
  STRATA_EXPECT_ALL(c.get(), written);

  // Read back without MPI-IO (the reader's way), every row.
  bool read_ok = false;
  {
    const H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    const H5Id dset(H5Dopen2(file.get(), "/values", H5P_DEFAULT), H5Dclose);
    std::vector<float> all(kRows * kCols, -1.0f);
    read_ok = H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()) >= 0;
    for (hsize_t row = 0; row < kRows && read_ok; ++row)
      for (hsize_t col = 0; col < kCols; ++col)
        read_ok = read_ok && all[row * kCols + col] == value_at(static_cast<std::int64_t>(row), static_cast<std::int64_t>(col));
  }
  STRATA_EXPECT_ALL(c.get(), read_ok);
  remove_dir(c.get(), dir);
}

TEST(MpiIoHints, NoHintsMeansTheLibraryDefaults) {
  // An unset variable passes MPI_INFO_NULL, as before the variable existed: none of the keys above
  // is in the property list.
  TestComm c;
  const std::string dir = make_dir(c.get(), "none");
  bool ok = false;
  {
    detail::QuietErrors quiet;
    H5Id file = detail::create_parallel_file(dir + "/plain.h5", c.get(), 0, {});
    const H5Id fapl(H5Fget_access_plist(file.get()), H5Pclose);
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Info info = MPI_INFO_NULL;
    ok = H5Pget_fapl_mpio(fapl.get(), &comm, &info) >= 0 && !info_value(info, "romio_cb_write") &&
         !info_value(info, "striping_factor");
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    ok = file.close() >= 0 && ok;
  }
  STRATA_EXPECT_ALL(c.get(), ok);
  remove_dir(c.get(), dir);
}

// A 2-column f32 variable, `rows` rows split evenly over the ranks, values offset by `bias`.
struct DenseRequest {
  std::vector<float> data;
  SaveRequest request;
  DenseRequest(const TestComm& c, std::int64_t rows, float bias) {
    const std::int64_t begin = rows * c.rank() / c.size(), end = rows * (c.rank() + 1) / c.size();
    for (std::int64_t row = begin; row < end; ++row)
      for (std::int64_t col = 0; col < 2; ++col) data.push_back(value_at(row, col) + bias);
    request.variables.push_back({"w", {rows, 2}, DType::kF32, {}, 0});
    request.shards.push_back({"w", begin, end, data.data(), {}});
  }
};

TEST(MpiIoHints, SaveWithHintsCommitsAFileThatReadsBack) {
  TestComm c;
  const std::string dir = make_dir(c.get(), "save");
  ScopedHints env(std::string(" romio_cb_write = enable , cb_buffer_size=1048576"));
  DenseRequest dense(c, 40, 0.0f);
  const std::string path = save(c.get(), dir, 7, dense.request, Attributes{});
  bool ok = true;
  try {
    CheckpointReader reader(path);
    std::vector<float> all(80);
    reader.read_rows("w", 0, 40, all.data());
    for (std::int64_t row = 0; row < 40; ++row)
      for (std::int64_t col = 0; col < 2; ++col) ok = ok && all[static_cast<std::size_t>(row * 2 + col)] == value_at(row, col);
    ok = ok && verify_checkpoint(path).ok;
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
    ok = false;
  }
  STRATA_EXPECT_ALL(c.get(), ok);
  remove_dir(c.get(), dir);
}

// Collective: the message of the ConfigError that `fn` threw on this rank ("" when none).
template <typename Fn>
std::string config_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.message();
  } catch (const Error& e) {
    return std::string("not a ConfigError: ") + e.what();
  }
  return "";
}

TEST(MpiIoHints, MalformedOrUnequalHintsFailTheSaveBeforeWriting) {
  TestComm c;
  const std::string dir = make_dir(c.get(), "bad");
  DenseRequest first(c, 40, 0.0f);
  std::string committed;
  {
    ScopedHints env(std::nullopt);
    committed = save(c.get(), dir, 5, first.request, Attributes{});
  }
  const std::string pointer_before = slurp(dir + "/checkpoint.json");
  const std::string file_before = slurp(committed);

  DenseRequest second(c, 40, 100.0f);
  struct Case {
    std::string value;      // rank 0's; the other ranks' too unless `others` is given
    std::optional<std::string> others;
    std::string expect;     // in the message, on every rank
  };
  const std::vector<Case> cases = {
      {"romio_cb_write=enable,cb_nodes", std::nullopt, "STRATA_MPIIO_HINTS: pair 2 'cb_nodes' has no '='"},
      {"=4", std::nullopt, "STRATA_MPIIO_HINTS: pair 1 '=4' has an empty key"},
      {"cb_nodes=1", std::string("cb_nodes=2"), "STRATA_MPIIO_HINTS differs between the ranks of the save"},
  };
  for (const auto& k : cases) {
    ScopedHints env(c.rank() == 0 || !k.others ? k.value : *k.others);
    const std::string message = config_error_of([&] { save(c.get(), dir, 9, second.request, Attributes{}); });
    STRATA_EXPECT_ALL(c.get(), message.find(k.expect) != std::string::npos);
    if (message.find(k.expect) == std::string::npos) ADD_FAILURE() << "'" << k.value << "': got '" << message << "'";
    MPI_Barrier(c.get());
    const bool untouched = !fs::exists(dir + "/ckpt-9.h5") && !fs::exists(dir + "/ckpt-9.h5.tmp") &&
                           slurp(dir + "/checkpoint.json") == pointer_before && slurp(committed) == file_before;
    STRATA_EXPECT_ALL(c.get(), untouched);
  }
  bool still_restores = false;
  try {
    const auto latest = latest_checkpoint(dir);
    still_restores = latest && latest->path == committed && latest->global_step == 5 && latest->skipped.empty();
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  STRATA_EXPECT_ALL(c.get(), still_restores);
  remove_dir(c.get(), dir);
}

// One rank's shard of a small dynamic table: ids r, r + n, r + 2n, ... (disjoint over the ranks).
DynamicTableState dynamic_shard(const TestComm& c) {
  DynamicTableState t;
  t.name = "emb";
  t.dim = 4;
  t.optimizer = "sgd";
  for (std::int64_t id = c.rank(); id < 30; id += c.size()) {
    t.ids.push_back(id);
    for (int k = 0; k < 4; ++k) t.values.push_back(static_cast<float>(id) + 0.25f * static_cast<float>(k));
    t.stamps.push_back(1);
  }
  t.total_rows = static_cast<std::int64_t>(t.ids.size());
  return t;
}

TEST(MpiIoHints, ParallelDynamicSaveWithHintsReadsBackAndBadHintsAreRefused) {
  TestComm c;
  const std::string dir = make_dir(c.get(), "dynamic");
  const std::vector<DynamicTableState> shards = {dynamic_shard(c)};
  {
    ScopedHints env{std::string(kHints)};
    const DynamicSaveResult saved = write_dynamic_checkpoint(c.get(), dir, 3, shards);
    bool ok = false;
    try {
      const DynamicCheckpointFile f = read_dynamic_checkpoint(saved.path);
      const DynamicTableState* t = f.find("emb");
      ok = t != nullptr && t->ids.size() == 30 && t->values.size() == 120;
      for (std::size_t i = 0; ok && i < t->ids.size(); ++i)
        ok = t->values[i * 4 + 1] == static_cast<float>(t->ids[i]) + 0.25f;
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
    STRATA_EXPECT_ALL(c.get(), ok);
  }
  {
    ScopedHints env(std::string("cb_nodes=1,,romio_cb_write=enable"));
    const std::string message = config_error_of([&] { write_dynamic_checkpoint(c.get(), dir, 4, shards); });
    STRATA_EXPECT_ALL(c.get(), message.find("STRATA_MPIIO_HINTS: pair 2 is empty") != std::string::npos);
    if (message.find("pair 2 is empty") == std::string::npos) ADD_FAILURE() << "got '" << message << "'";
    MPI_Barrier(c.get());
    STRATA_EXPECT_ALL(c.get(), !fs::exists(dir + "/dynamic-4.h5") && !fs::exists(dir + "/dynamic-4.h5.tmp"));
  }
  remove_dir(c.get(), dir);
}

}  // namespace
}  // namespace strata::checkpoint
