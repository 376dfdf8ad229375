// CheckpointReader: independent read-only access to a committed checkpoint (sec2 driver, no MPI
// calls), so each PS rank reads only its own rows when it materialises a shard.
#include <algorithm>
#include <future>
#include <filesystem>
#include <vector>

#include "checkpoint/hdf5/h5_util.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/common/error.h"

namespace strata::checkpoint {

using detail::H5Id;

struct CheckpointReader::Impl {
  std::string path;
  H5Id file;
  int format_version = 0;
  std::int64_t global_step = 0;
  std::vector<VariableMeta> variables;
};

namespace {

struct VisitState {
  std::vector<std::string> datasets;  // paths relative to the visited group
};

herr_t collect_datasets(hid_t, const char* name, const H5O_info_t* info, void* data) {
  if (info->type == H5O_TYPE_DATASET) static_cast<VisitState*>(data)->datasets.emplace_back(name);
  return 0;
}

herr_t collect_direct_datasets(hid_t group, const char* name, const H5L_info_t*, void* data) {
  H5O_info_t info;
  if (H5Oget_info_by_name(group, name, &info, H5P_DEFAULT) >= 0 && info.type == H5O_TYPE_DATASET)
    static_cast<VisitState*>(data)->datasets.emplace_back(name);
  return 0;
}

bool link_exists(hid_t file, const std::string& path) {
  // H5Lexists needs every intermediate link to exist; check component by component.
  std::size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    std::string prefix = path.substr(0, pos);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

void read_block(hid_t dset, DType dtype, const std::vector<hsize_t>& dims, std::int64_t b,
                std::int64_t e, void* out) {
  if (e == b) return;
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = static_cast<hsize_t>(b);
  count[0] = static_cast<hsize_t>(e - b);
  H5Id fspace(STRATA_CHECK_H5(H5Dget_space(dset)), H5Sclose);
  STRATA_CHECK_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
  H5Id mspace(STRATA_CHECK_H5(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)), H5Sclose);
  STRATA_CHECK_H5(H5Dread(dset, detail::memory_type(dtype), mspace.get(), fspace.get(), H5P_DEFAULT, out));
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  detail::QuietErrors quiet;
  impl_->path = path;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError("checkpoint file '" + path + "' does not exist");
  impl_->file = H5Id(STRATA_CHECK_H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)), H5Fclose);
  hid_t f = impl_->file.get();
  if (!detail::has_attr(f, "format_version"))
    throw ConfigError("'" + path + "' is not a strata checkpoint (no format_version attribute)");
  impl_->format_version = static_cast<int>(detail::read_attr_i64(f, "format_version"));
  if (impl_->format_version != kFormatVersion)
    throw ConfigError("checkpoint '" + path + "' has format_version " + std::to_string(impl_->format_version) +
                      "; this strata reads version " + std::to_string(kFormatVersion));
  impl_->global_step = detail::read_attr_i64(f, "global_step");

  VisitState vars;
  if (link_exists(f, "/variables")) {
    H5Id group(STRATA_CHECK_H5(H5Gopen2(f, "/variables", H5P_DEFAULT)), H5Gclose);
    STRATA_CHECK_H5(H5Ovisit(group.get(), H5_INDEX_NAME, H5_ITER_INC, collect_datasets, &vars));
  }
  for (const auto& name : vars.datasets) {
    VariableMeta meta;
    meta.name = name;
    H5Id dset(STRATA_CHECK_H5(H5Dopen2(f, detail::variable_path(name).c_str(), H5P_DEFAULT)), H5Dclose);
    H5Id type(STRATA_CHECK_H5(H5Dget_type(dset.get())), H5Tclose);
    meta.dtype = detail::dtype_of(type.get(), "variable '" + name + "'");
    H5Id space(STRATA_CHECK_H5(H5Dget_space(dset.get())), H5Sclose);
    int rank = STRATA_CHECK_H5(H5Sget_simple_extent_ndims(space.get()));
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    STRATA_CHECK_H5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
    meta.shape.assign(dims.begin(), dims.end());
    if (detail::has_attr(dset.get(), "optimizer_step")) meta.optimizer_step = detail::read_attr_i64(dset.get(), "optimizer_step");
    std::string slots_group = "/slots/" + name;
    if (link_exists(f, slots_group)) {
      VisitState slots;
      H5Id group(STRATA_CHECK_H5(H5Gopen2(f, slots_group.c_str(), H5P_DEFAULT)), H5Gclose);
      STRATA_CHECK_H5(H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_direct_datasets, &slots));
      meta.slots = slots.datasets;
    }
    impl_->variables.push_back(std::move(meta));
  }
  std::sort(impl_->variables.begin(), impl_->variables.end(),
            [](const VariableMeta& a, const VariableMeta& b) { return a.name < b.name; });
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

const std::string& CheckpointReader::path() const { return impl_->path; }
int CheckpointReader::format_version() const { return impl_->format_version; }
std::int64_t CheckpointReader::global_step() const { return impl_->global_step; }
std::uint64_t CheckpointReader::variable_sequence_hash() const {
  detail::QuietErrors quiet;
  return detail::read_attr_u64(impl_->file.get(), "variable_sequence_hash");
}
std::string CheckpointReader::optimizer() const {
  detail::QuietErrors quiet;
  return detail::read_attr_string(impl_->file.get(), "optimizer");
}
std::string CheckpointReader::training_position_json() const {
  detail::QuietErrors quiet;
  return detail::read_attr_string(impl_->file.get(), "training_position");
}
std::int64_t CheckpointReader::created_unix() const {
  detail::QuietErrors quiet;
  return detail::read_attr_i64(impl_->file.get(), "created_unix");
}

const std::vector<VariableMeta>& CheckpointReader::variables() const { return impl_->variables; }

const VariableMeta* CheckpointReader::find(const std::string& name) const {
  for (const auto& v : impl_->variables)
    if (v.name == name) return &v;
  return nullptr;
}

namespace {
std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

void CheckpointReader::check_compatible(const std::string& name, const std::vector<std::int64_t>& shape,
                                        DType dtype) const {
  const VariableMeta* v = find(name);
  if (v == nullptr) throw ConfigError("variable '" + name + "' is not in checkpoint " + impl_->path);
  if (v->shape != shape)
    throw ConfigError("variable '" + name + "': checkpoint shape " + shape_string(v->shape) +
                      " != model shape " + shape_string(shape) + " (" + impl_->path + ")");
  if (v->dtype != dtype)
    throw ConfigError("variable '" + name + "': checkpoint dtype " + to_string(v->dtype) + " != model dtype " +
                      to_string(dtype) + " (" + impl_->path + ")");
}

void CheckpointReader::read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end,
                                 void* out) const {
  read_slot_rows(name, "", row_begin, row_end, out);
}

void CheckpointReader::read_slot_rows(const std::string& name, const std::string& slot, std::int64_t row_begin,
                                      std::int64_t row_end, void* out) const {
  detail::QuietErrors quiet;
  const VariableMeta* v = find(name);
  if (v == nullptr) throw ConfigError("variable '" + name + "' is not in checkpoint " + impl_->path);
  if (!slot.empty() && std::find(v->slots.begin(), v->slots.end(), slot) == v->slots.end())
    throw ConfigError("variable '" + name + "' has no slot '" + slot + "' in checkpoint " + impl_->path);
  if (row_begin < 0 || row_end < row_begin || row_end > v->shape[0])
    throw ConfigError("variable '" + name + "': rows [" + std::to_string(row_begin) + "," +
                      std::to_string(row_end) + ") outside [0," + std::to_string(v->shape[0]) + ")");
  std::string path = slot.empty() ? detail::variable_path(name) : detail::slot_path(name, slot);
  H5Id dset(STRATA_CHECK_H5(H5Dopen2(impl_->file.get(), path.c_str(), H5P_DEFAULT)), H5Dclose);
  std::vector<hsize_t> dims(v->shape.begin(), v->shape.end());
  read_block(dset.get(), v->dtype, dims, row_begin, row_end, out);
}

std::vector<BadDataset> CheckpointReader::verify() const {
  detail::QuietErrors quiet;
  constexpr std::int64_t kBlockBytes = 16 << 20;
  std::vector<BadDataset> bad;
  std::vector<unsigned char> buffers[2];
  for (const auto& v : impl_->variables) {
    std::vector<std::string> slots{""};
    slots.insert(slots.end(), v.slots.begin(), v.slots.end());
    for (const auto& slot : slots) {
      std::string path = slot.empty() ? detail::variable_path(v.name) : detail::slot_path(v.name, slot);
      try {
        H5Id dset(STRATA_CHECK_H5(H5Dopen2(impl_->file.get(), path.c_str(), H5P_DEFAULT)), H5Dclose);
        if (!detail::has_attr(dset.get(), "checksum")) {
          bad.push_back({path.substr(1), "no checksum attribute"});
          continue;
        }
        auto expected = detail::read_attr_u64(dset.get(), "checksum");
        std::int64_t row = detail::row_bytes(v);
        std::int64_t rows_per_block = std::max<std::int64_t>(1, kBlockBytes / std::max<std::int64_t>(row, 1));
        std::vector<hsize_t> dims(v.shape.begin(), v.shape.end());
        // Two buffers: the CRC of block k runs on a helper thread while this thread reads block
        // k + 1 (the CRC alone runs at about 2 GB/s, as fast as the read: overlapped, verification
        // takes about half as long). Only this thread calls HDF5 (the library is not thread-safe).
        std::uint32_t crc = 0;
        std::future<void> pending;
        int cur = 0;
        for (std::int64_t b = 0; b < v.shape[0]; b += rows_per_block) {
          std::int64_t e = std::min(v.shape[0], b + rows_per_block);
          std::vector<unsigned char>& buf = buffers[cur];
          buf.resize(static_cast<std::size_t>((e - b) * row));
          read_block(dset.get(), v.dtype, dims, b, e, buf.data());
          if (pending.valid()) pending.get();
          pending = std::async(std::launch::async, [&crc, &buf] { crc = detail::crc32_update(crc, buf.data(), buf.size()); });
          cur ^= 1;
        }
        if (pending.valid()) pending.get();
        if (crc != expected)
          bad.push_back({path.substr(1), "checksum mismatch: stored " + std::to_string(expected) + ", computed " +
                                             std::to_string(crc)});
      } catch (const Error& e) {
        bad.push_back({path.substr(1), e.message()});
      }
    }
  }
  return bad;
}

}  // namespace strata::checkpoint
