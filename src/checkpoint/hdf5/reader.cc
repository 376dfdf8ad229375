// CheckpointReader: independent read-only access to a committed checkpoint (sec2 driver, no MPI
// calls), so each PS rank reads only its own rows when it materialises a shard; and
// verify_checkpoint(), the verdict on a file that may be damaged in any way.
//
// Opening a version-2 file (FORMAT.md sections 3-4): the integrity block's header must be intact and
// agree with the file's size; HDF5 opens the file; every attribute and the variable table are read
// and their manifest must match the root attribute metadata_checksum; the table of the integrity
// block must describe exactly the datasets HDF5 sees (offsets, sizes, checksums). Verifying a file
// first reads it raw (no HDF5) for the whole-file CRC-32 and each dataset's CRC-32, then opens it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <vector>

#include "checkpoint/hdf5/commit.h"
#include "checkpoint/hdf5/h5_util.h"
#include "checkpoint/hdf5/integrity.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/common/error.h"

namespace strata::checkpoint {

using detail::H5Id;

struct CheckpointReader::Impl {
  std::string path;
  H5Id file;
  int format_version = 0;
  std::int64_t global_step = 0;
  std::uint64_t variable_sequence_hash = 0;
  std::string optimizer;
  std::string training_position;
  std::int64_t created_unix = 0;
  std::vector<VariableMeta> variables;
  std::optional<detail::IntegrityBlock> block;  // format >= 2

  // Everything the constructor does, with messages that do not name the path (it adds it).
  void open();
};

namespace {

struct VisitState {
  std::vector<std::string> datasets;  // paths relative to the visited group
};

herr_t collect_datasets(hid_t, const char* name, const H5O_info_t* info, void* data) {
  if (info->type == H5O_TYPE_DATASET) static_cast<VisitState*>(data)->datasets.emplace_back(name);
  return 0;
}

herr_t collect_direct_datasets(hid_t group, const char* name, const H5L_info_t* link, void* data) {
  H5O_info_t info;
  if (link->type != H5L_TYPE_HARD) return 0;  // see link_exists
  if (H5Oget_info_by_name(group, name, &info, H5P_DEFAULT) >= 0 && info.type == H5O_TYPE_DATASET)
    static_cast<VisitState*>(data)->datasets.emplace_back(name);
  return 0;
}

// True when every component of `path` exists as a hard link. Soft and external links are
// treated as absent: a crafted file could otherwise point the reader at objects of another file.
bool link_exists(hid_t file, const std::string& path) {
  // H5Lexists needs every intermediate link to exist; check component by component.
  std::size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    std::string prefix = path.substr(0, pos);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    H5L_info_t info;
    if (H5Lget_info(file, prefix.c_str(), &info, H5P_DEFAULT) < 0 || info.type != H5L_TYPE_HARD) return false;
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

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// The bytes a dataset declares (elements x element size), checked before anything reads or
// allocates for it: they must fit in the file, and the file must store exactly that many bytes
// for it, as its layout implies (contiguous and compact: the declared bytes; chunked, unfiltered:
// every chunk, edge chunks whole). A dataset declared large but never written reads as fill
// values, terabytes of them without touching the file; this is where such a file is refused.
// `contiguous_only`: format 2, whose integrity block records one byte range per dataset.
std::uint64_t checked_dataset_bytes(hid_t dset, const std::string& path, const std::vector<hsize_t>& dims,
                                    DType dtype, std::uint64_t file_bytes, bool contiguous_only) {
  const std::string what = path.substr(1) + " " + shape_text(dims) + " " + to_string(dtype);
  std::uint64_t bytes = dtype_size(dtype);
  const bool empty = std::find(dims.begin(), dims.end(), hsize_t{0}) != dims.end();
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(std::numeric_limits<std::int64_t>::max()) ||
        (!empty && __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes)))
      throw Error(what + " declares more than 2^64 bytes");
  }
  if (empty) return 0;
  if (bytes > file_bytes)
    throw Error(what + " declares " + std::to_string(bytes) + " bytes, more than the whole file (" +
                std::to_string(file_bytes) + " bytes)");
  H5Id dcpl(STRATA_CHECK_H5(H5Dget_create_plist(dset)), H5Pclose);
  if (STRATA_CHECK_H5(H5Pget_nfilters(dcpl.get())) > 0)
    throw Error(what + " uses HDF5 filters (compression), which checkpoints never do");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  const std::uint64_t stored = H5Dget_storage_size(dset);
  std::uint64_t expected = bytes;
  if (layout == H5D_CONTIGUOUS) {
    // Unallocated data has no address (H5Dget_offset then reports HADDR_UNDEF shifted by the
    // user block), so the stored size decides first; then the bytes must lie inside the file.
    if (stored == 0)
      throw Error(what + " declares " + std::to_string(bytes) + " bytes of data, the file stores none of them");
    const haddr_t at = H5Dget_offset(dset);
    if (stored == bytes && (at == HADDR_UNDEF || at > file_bytes || bytes > file_bytes - at))
      throw Error(what + " declares " + std::to_string(bytes) + " bytes of data at offset " + std::to_string(at) +
                  ", outside the file (" + std::to_string(file_bytes) + " bytes)");
  } else if (layout == H5D_COMPACT && !contiguous_only) {
    // The data is in the object header; its size is the declared size (checked below).
  } else if (layout == H5D_CHUNKED && !contiguous_only) {
    std::vector<hsize_t> chunk(dims.size(), 0);
    if (STRATA_CHECK_H5(H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data())) !=
        static_cast<int>(chunk.size()))
      throw Error(what + ": its chunk rank differs from its rank");
    expected = dtype_size(dtype);
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (chunk[i] == 0) throw Error(what + ": chunk dimension 0");
      const std::uint64_t count = dims[i] / chunk[i] + (dims[i] % chunk[i] != 0);
      if (__builtin_mul_overflow(expected, static_cast<std::uint64_t>(chunk[i]), &expected) ||
          __builtin_mul_overflow(expected, count, &expected) || expected > file_bytes)
        throw Error(what + " in chunks of " + shape_text(chunk) + " declares more bytes than the whole file (" +
                    std::to_string(file_bytes) + " bytes)");
    }
  } else {
    throw Error(what + " has a storage layout checkpoints do not use (" +
                (contiguous_only ? "format 2 datasets are contiguous" : "not contiguous, chunked or compact") + ")");
  }
  if (stored != expected)
    throw Error(what + " declares " + std::to_string(expected) + " bytes of data, the file stores " +
                std::to_string(stored));
  return bytes;
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// What the first bytes of a file say it is.
struct Head {
  std::uint64_t size = 0;
  std::optional<detail::IntegrityBlock> block;  // set for format >= 2 (header fields only)
  bool hdf5_signature = false;                  // HDF5 superblock at offset 0 (format 1)
};

// Reads the head of `path` without HDF5. Throws ConfigError for a file that is no checkpoint at
// all, Error for a damaged integrity block header or a size that disagrees with it.
Head read_head(int fd, const std::string& path) {
  Head h;
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error("cannot stat: " + std::string(std::strerror(errno)));
  h.size = static_cast<std::uint64_t>(st.st_size);
  if (h.size == 0) throw ConfigError("not a strata checkpoint: the file is empty");
  unsigned char header[detail::kIntegrityHeaderBytes] = {};
  const std::uint64_t n = std::min<std::uint64_t>(h.size, sizeof header);
  std::uint64_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, header + got, static_cast<std::size_t>(n - got), static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error("cannot read: " + std::string(r < 0 ? std::strerror(errno) : "unexpected end of file"));
    got += static_cast<std::uint64_t>(r);
  }
  try {
    h.block = detail::decode_integrity_header(header, n);
  } catch (const Error& e) {
    throw Error("damaged integrity block: " + e.message());
  }
  if (h.block) {
    if (h.size != h.block->file_bytes)
      throw Error("the file has " + std::to_string(h.size) + " bytes, its integrity block says " +
                  std::to_string(h.block->file_bytes) + " (" + (h.size < h.block->file_bytes ? "truncated" : "extended") +
                  " after it was written)");
    return h;
  }
  h.hdf5_signature = n >= 8 && std::memcmp(header, detail::kHdf5Signature, 8) == 0;
  if (!h.hdf5_signature)
    throw ConfigError("not a strata checkpoint: it starts with neither a strata integrity block nor an HDF5 signature");
  return h;
}

// The raw integrity block (exactly block_bytes bytes from offset 0).
std::string read_raw_block(int fd, std::uint64_t block_bytes) {
  std::string raw(static_cast<std::size_t>(block_bytes), '\0');
  std::uint64_t got = 0;
  while (got < block_bytes) {
    ssize_t r = ::pread(fd, raw.data() + got, static_cast<std::size_t>(block_bytes - got), static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error("cannot read the integrity block: " + std::string(r < 0 ? std::strerror(errno) : "unexpected end of file"));
    got += static_cast<std::uint64_t>(r);
  }
  return raw;
}

std::string dataset_path(const VariableMeta& v, const std::string& slot) {
  return slot.empty() ? detail::variable_path(v.name) : detail::slot_path(v.name, slot);
}

}  // namespace

void CheckpointReader::Impl::open() {
  Impl& m = *this;
  const std::string& path = m.path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw ConfigError("does not exist");
  Head head;
  {
    detail::Fd fd{detail::open_regular_file(path)};
    head = read_head(fd.fd, path);
    if (head.block) {
      try {
        m.block = detail::decode_integrity_block(read_raw_block(fd.fd, head.block->block_bytes));
        detail::file_segments(*m.block);  // every byte range the table names lies inside the file
      } catch (const Error& e) {
        throw Error("damaged integrity block: " + e.message());
      }
    }
  }
  const std::uint64_t file_bytes = head.size;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw Hdf5Error("HDF5 cannot open it: " + detail::take_h5_error());
  m.file = H5Id(f, H5Fclose);
  if (!detail::has_attr(f, "format_version"))
    throw ConfigError("not a strata checkpoint (no format_version attribute)");
  m.format_version = static_cast<int>(detail::read_attr_i64(f, "format_version"));
  if (m.format_version < kOldestFormatVersion || m.format_version > kFormatVersion)
    throw ConfigError("has format_version " + std::to_string(m.format_version) + "; this strata reads versions " +
                      std::to_string(kOldestFormatVersion) + " to " + std::to_string(kFormatVersion));
  if ((m.format_version >= 2) != m.block.has_value())
    throw Error(m.block ? "has an integrity block but format_version " + std::to_string(m.format_version)
                        : "has format_version " + std::to_string(m.format_version) + " but no integrity block");
  m.global_step = detail::read_attr_i64(f, "global_step");
  m.variable_sequence_hash = detail::read_attr_u64(f, "variable_sequence_hash");
  m.optimizer = detail::read_attr_string(f, "optimizer");
  m.training_position = detail::read_attr_string(f, "training_position");
  // Consumers parse, print and compare it as JSON; nothing deeper than a sane document gets there.
  if (detail::json_nesting_depth(m.training_position) > kMaxJsonDepth)
    throw Error("root attribute 'training_position' nests JSON deeper than " + std::to_string(kMaxJsonDepth) +
                " levels");
  m.created_unix = detail::read_attr_i64(f, "created_unix");

  VisitState vars;
  if (link_exists(f, "/variables")) {
    H5Id group(STRATA_CHECK_H5(H5Gopen2(f, "/variables", H5P_DEFAULT)), H5Gclose);
    STRATA_CHECK_H5(H5Ovisit(group.get(), H5_INDEX_NAME, H5_ITER_INC, collect_datasets, &vars));
  }
  detail::Manifest manifest;
  struct Seen {
    std::uint64_t offset = 0, bytes = 0, checksum = 0;
  };
  std::map<std::string, Seen> seen;  // dataset path without the leading '/'
  auto describe = [&](hid_t dset, const std::string& dpath, const VariableMeta& meta, bool is_variable,
                      std::uint64_t bytes) {
    if (!m.block) return;
    detail::ManifestDataset md{dpath.substr(1), to_string(meta.dtype), meta.shape, 0, std::nullopt};
    md.checksum = detail::read_attr_u64(dset, "checksum");
    if (is_variable) md.optimizer_step = meta.optimizer_step;
    const haddr_t at = H5Dget_offset(dset);
    seen[md.path] = {bytes == 0 || at == HADDR_UNDEF ? 0 : static_cast<std::uint64_t>(at), bytes, md.checksum};
    manifest.datasets.push_back(std::move(md));
  };
  for (const auto& name : vars.datasets) {
    VariableMeta meta;
    meta.name = name;
    const std::string vpath = detail::variable_path(name);
    H5Id dset(STRATA_CHECK_H5(H5Dopen2(f, vpath.c_str(), H5P_DEFAULT)), H5Dclose);
    H5Id type(STRATA_CHECK_H5(H5Dget_type(dset.get())), H5Tclose);
    meta.dtype = detail::dtype_of(type.get(), "variable '" + name + "'");
    H5Id space(STRATA_CHECK_H5(H5Dget_space(dset.get())), H5Sclose);
    int rank = STRATA_CHECK_H5(H5Sget_simple_extent_ndims(space.get()));
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    STRATA_CHECK_H5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
    if (dims.empty()) throw Error("variable '" + name + "' has rank 0 (checkpoints hold rank >= 1)");
    const std::uint64_t bytes = checked_dataset_bytes(dset.get(), vpath, dims, meta.dtype, file_bytes, m.block.has_value());
    meta.shape.assign(dims.begin(), dims.end());
    if (detail::has_attr(dset.get(), "optimizer_step")) meta.optimizer_step = detail::read_attr_i64(dset.get(), "optimizer_step");
    std::string slots_group = "/slots/" + name;
    if (link_exists(f, slots_group)) {
      VisitState slots;
      H5Id group(STRATA_CHECK_H5(H5Gopen2(f, slots_group.c_str(), H5P_DEFAULT)), H5Gclose);
      STRATA_CHECK_H5(H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_direct_datasets, &slots));
      meta.slots = slots.datasets;
    }
    describe(dset.get(), vpath, meta, true, bytes);
    for (const auto& slot : meta.slots) {
      const std::string spath = detail::slot_path(name, slot);
      H5Id sd(STRATA_CHECK_H5(H5Dopen2(f, spath.c_str(), H5P_DEFAULT)), H5Dclose);
      H5Id stype(STRATA_CHECK_H5(H5Dget_type(sd.get())), H5Tclose);
      H5Id sspace(STRATA_CHECK_H5(H5Dget_space(sd.get())), H5Sclose);
      std::vector<hsize_t> sdims(static_cast<std::size_t>(STRATA_CHECK_H5(H5Sget_simple_extent_ndims(sspace.get()))));
      STRATA_CHECK_H5(H5Sget_simple_extent_dims(sspace.get(), sdims.data(), nullptr));
      if (detail::dtype_of(stype.get(), "slot '" + spath + "'") != meta.dtype || sdims != dims)
        throw Error("slot " + spath.substr(1) + " differs from its variable in shape or dtype");
      describe(sd.get(), spath, meta, false,
               checked_dataset_bytes(sd.get(), spath, sdims, meta.dtype, file_bytes, m.block.has_value()));
    }
    m.variables.push_back(std::move(meta));
  }
  std::sort(m.variables.begin(), m.variables.end(),
            [](const VariableMeta& a, const VariableMeta& b) { return a.name < b.name; });
  if (!m.block) return;

  // Format 2: the manifest of what was just read must be what the writer wrote, and the integrity
  // block's table must describe exactly these datasets.
  manifest.format_version = m.format_version;
  manifest.global_step = m.global_step;
  manifest.variable_sequence_hash = m.variable_sequence_hash;
  manifest.optimizer = m.optimizer;
  manifest.training_position = m.training_position;
  manifest.created_unix = m.created_unix;
  manifest.checksum_algorithm = detail::read_attr_string(f, "checksum_algorithm");
  const std::uint64_t stored = detail::read_attr_u64(f, "metadata_checksum");
  const std::uint32_t computed = detail::manifest_checksum(manifest);
  if (stored != computed)
    throw Error("metadata checksum mismatch: stored " + std::to_string(stored) + ", computed " +
                std::to_string(computed) + " (an attribute or the variable table is not what was written)");
  if (m.block->global_step != m.global_step)
    throw Error("the integrity block is for global step " + std::to_string(m.block->global_step) +
                ", the global_step attribute says " + std::to_string(m.global_step));
  if (m.block->regions.size() != seen.size())
    throw Error("the integrity block lists " + std::to_string(m.block->regions.size()) + " datasets, the file has " +
                std::to_string(seen.size()));
  for (const auto& r : m.block->regions) {
    auto it = seen.find(r.path);
    if (it == seen.end()) throw Error("the integrity block lists " + r.path + ", which the file does not have");
    if (it->second.offset != r.offset || it->second.bytes != r.bytes || it->second.checksum != r.crc)
      throw Error("the integrity block and the HDF5 metadata disagree about " + r.path);
  }
}

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  detail::QuietErrors quiet;
  impl_->path = path;
  const std::string prefix = "checkpoint '" + path + "': ";
  try {
    impl_->open();
  } catch (const ConfigError& e) {
    impl_.reset();  // its identifiers close while the HDF5 lock is held
    throw ConfigError(prefix + e.message());
  } catch (const Hdf5Error& e) {
    impl_.reset();
    throw Hdf5Error(prefix + e.message());
  } catch (const Error& e) {
    impl_.reset();
    throw Error(prefix + e.message());
  }
}

// The file closes under the HDF5 lock (strata/common/hdf5_lock.h).
CheckpointReader::~CheckpointReader() {
  if (!impl_) return;
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  impl_.reset();
}
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&& other) noexcept {
  if (this != &other) {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    impl_ = std::move(other.impl_);
  }
  return *this;
}

const std::string& CheckpointReader::path() const { return impl_->path; }
int CheckpointReader::format_version() const { return impl_->format_version; }
std::int64_t CheckpointReader::global_step() const { return impl_->global_step; }
std::uint64_t CheckpointReader::variable_sequence_hash() const { return impl_->variable_sequence_hash; }
std::string CheckpointReader::optimizer() const { return impl_->optimizer; }
std::string CheckpointReader::training_position_json() const { return impl_->training_position; }
std::int64_t CheckpointReader::created_unix() const { return impl_->created_unix; }

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
  if (impl_->block) {
    Verification v = verify_checkpoint(impl_->path);
    std::vector<BadDataset> bad;
    if (!v.error.empty()) bad.push_back({"(file)", v.error});
    bad.insert(bad.end(), v.bad.begin(), v.bad.end());
    return bad;
  }
  // Format 1: no whole-file checksum; recompute every dataset's CRC-32 through HDF5.
  detail::QuietErrors quiet;
  constexpr std::int64_t kBlockBytes = 16 << 20;
  std::vector<BadDataset> bad;
  std::vector<unsigned char> buffers[2];
  for (const auto& v : impl_->variables) {
    std::vector<std::string> slots{""};
    slots.insert(slots.end(), v.slots.begin(), v.slots.end());
    for (const auto& slot : slots) {
      std::string path = dataset_path(v, slot);
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
        // k + 1. Only this thread calls HDF5 (the library is not thread-safe).
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

std::string Verification::summary() const {
  if (!error.empty()) return error;
  if (!bad.empty())
    return std::to_string(bad.size()) + " of " + std::to_string(datasets) + " dataset(s) bad, first " + bad.front().path +
           ": " + bad.front().reason;
  return "ok";
}

Verification verify_checkpoint(const std::string& path, const VerifyOptions& options) {
  Verification v;
  v.path = path;
  const std::string prefix = "checkpoint '" + path + "': ";
  auto strip = [&](const std::string& message) {
    return message.compare(0, prefix.size(), prefix) == 0 ? message.substr(prefix.size()) : message;
  };
  try {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      v.error = "file is missing";
      v.structure_intact = false;
      return v;
    }
    detail::Fd fd{detail::open_regular_file(path)};
    const Head head = read_head(fd.fd, path);
    v.file_bytes = head.size;
    if (head.block) {
      // Format 2, before HDF5 sees a byte: the whole-file CRC-32 and each dataset's CRC-32, in
      // one pass over the file.
      const std::string raw = read_raw_block(fd.fd, head.block->block_bytes);
      detail::IntegrityBlock block = *head.block;
      std::vector<detail::Segment> segments;
      bool table_ok = true;
      std::string table_error;
      try {
        block = detail::decode_integrity_block(raw);
        segments = detail::file_segments(block);
      } catch (const Error& e) {
        // Damaged table: the whole-file CRC-32 alone says whether it was an accident (it will
        // fail); a table that is wrong under a matching CRC was written so, and fails below.
        table_ok = false;
        table_error = e.message();
        block.regions.clear();
        segments = {{block.block_bytes, block.file_bytes, -1}};
        if (block.block_bytes == block.file_bytes) segments.clear();
      }
      const auto crcs = detail::combine_segment_pieces(
          detail::scan_segments(fd.fd, path, block.block_bytes, block.file_bytes, segments), segments);
      v.file_checksum = true;
      v.file_crc = detail::whole_file_crc(raw, segments, crcs);
      v.datasets = block.regions.size();
      std::vector<std::string> changed;
      for (std::size_t s = 0; s < segments.size(); ++s) {
        if (segments[s].region < 0) continue;
        const detail::DataRegion& r = block.regions[static_cast<std::size_t>(segments[s].region)];
        if (crcs[s] != r.crc) {
          v.bad.push_back({r.path, "checksum mismatch: stored " + std::to_string(r.crc) + ", computed " +
                                       std::to_string(crcs[s])});
          changed.push_back(r.path);
        }
      }
      if (v.file_crc != head.block->file_crc) {
        // Would the file checksum match with every dataset's data as the table says? Then the
        // damage is confined to that data and everything else is as written.
        std::vector<std::uint32_t> as_written = crcs;
        for (std::size_t s = 0; s < segments.size(); ++s)
          if (segments[s].region >= 0) as_written[s] = block.regions[static_cast<std::size_t>(segments[s].region)].crc;
        v.structure_intact = table_ok && detail::whole_file_crc(raw, segments, as_written) == head.block->file_crc;
        v.error = "file checksum mismatch: stored " + hex32(head.block->file_crc) + ", computed " + hex32(v.file_crc) +
                  " over " + std::to_string(v.file_bytes) + " bytes; ";
        if (!table_ok)
          v.error += "the integrity block itself is damaged";
        else if (v.structure_intact)
          v.error += "the data of " + changed.front() + (changed.size() > 1 ? " and others" : "") +
                     " changed, everything else is intact";
        else
          v.error += std::string(changed.empty() ? "" : "the data of " + changed.front() + " changed and ") +
                     "the damage is outside the datasets' data (integrity block, HDF5 superblock, object headers, "
                     "attributes, B-trees or heaps)";
        return v;  // never hand a damaged file to HDF5
      }
      if (!table_ok) {
        v.error = "damaged integrity block: " + table_error;
        v.structure_intact = false;
        return v;
      }
      if (!v.bad.empty()) return v;
      CheckpointReader reader(path);
      v.format_version = reader.format_version();
      v.global_step = reader.global_step();
      v.ok = true;
      return v;
    }
    // Format 1: nothing can be checked before HDF5 parses the file, so only on request; then
    // every dataset's CRC-32 is recomputed through HDF5.
    if (!options.allow_unverified) {
      v.format_version = 1;
      v.structure_intact = false;
      v.error = "format 1 file (no integrity block: its metadata and HDF5 structure cannot be verified); "
                "refused unless unverified files are allowed (--allow-unverified)";
      return v;
    }
    CheckpointReader reader(path);
    v.format_version = reader.format_version();
    v.global_step = reader.global_step();
    for (const auto& var : reader.variables()) v.datasets += 1 + var.slots.size();
    v.bad = reader.verify();
  } catch (const std::exception& e) {
    const auto* se = dynamic_cast<const Error*>(&e);
    v.error = strip(se ? se->message() : std::string(e.what()));
    v.structure_intact = false;
    return v;
  }
  v.ok = v.error.empty() && v.bad.empty();
  return v;
}

}  // namespace strata::checkpoint
