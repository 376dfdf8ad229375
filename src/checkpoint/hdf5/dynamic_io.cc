// Dynamic-table checkpoint files (include/strata/checkpoint/dynamic.h, checkpoint/FORMAT.md
// section 10): writer, verifying reader, delta merge, chain restore with fallback, compaction.
//
// Why this shape:
//   * The integrity scheme is the dense checkpoints' (integrity.h): an HDF5 user block with the
//     whole-file CRC-32 and each dataset's byte range and CRC-32, verified with plain reads before
//     HDF5 parses a byte; so a damaged file never reaches HDF5, and every dataset's size is known
//     to lie inside the file before anything is allocated for it.
//   * Each table group has a content checksum: the CRC-32 of a canonical text of its attributes
//     and of its datasets' shapes and CRC-32s. A delta names its parent by (step, content
//     checksum), so a parent file replaced by another state (or a different table) breaks the
//     link visibly, while the link itself costs nothing to check (no data is read for it).
//   * A restore walks candidates newest first and takes the first whose whole chain is intact:
//     "the newest complete state", as the dense restore's corrupted-latest rule.
//   * The PS ranks' save is parallel (each rank writes its own rows, FORMAT.md 10.9): a rank's
//     rows stay one sorted run in the file, since putting them in global id order would mean
//     exchanging the rows; the reader merges the runs, so nothing downstream of a read sees them.
//     Every CRC-32 is combinable (crc32_combine), so the integrity block and content checksums
//     come from the ranks' own pieces without a copy of the data on any one rank.
#include "checkpoint/hdf5/dynamic_io.h"

#include <fcntl.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>

#include "checkpoint/hdf5/commit.h"
#include "checkpoint/hdf5/h5_util.h"
#include "checkpoint/hdf5/integrity.h"
#include "checkpoint/hdf5/save_ranks.h"
#include "strata/comm/mpi_group.h"

namespace strata::checkpoint {

using detail::H5Id;

bool DynamicTableCounters::operator==(const DynamicTableCounters& o) const {
  return admitted == o.admitted && lookups == o.lookups && updates == o.updates &&
         rejected_lookups == o.rejected_lookups && rejected_updates == o.rejected_updates &&
         rejected_full == o.rejected_full && evicted_ttl == o.evicted_ttl && evicted_capacity == o.evicted_capacity &&
         imported == o.imported;
}

const char* to_string(DynamicKind kind) { return kind == DynamicKind::kFull ? "full" : "delta"; }

std::string dynamic_file_name(std::int64_t global_step) { return "dynamic-" + std::to_string(global_step) + ".h5"; }

std::string dynamic_table_name(std::string_view variable) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (const char ch : variable) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.') {
      out.push_back(ch);
    } else {
      out.push_back('-');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  // "." and ".." are refused by the format; a variable named so is spelled with escapes.
  if (out == "." || out == "..") out = std::string(out.size() == 1 ? "-2e" : "-2e-2e");
  if (out.empty() || out.size() > 255)
    throw ConfigError("dynamic variable '" + std::string(variable) + "': its checkpoint table name '" + out +
                      "' must be 1 to 255 bytes (FORMAT.md 10.7)");
  return out;
}

const DynamicTableState* DynamicCheckpointFile::find(const std::string& name) const {
  for (const auto& t : tables)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

constexpr std::int64_t kMaxDim = 65536;
constexpr std::int64_t kMaxSketchWidth = std::int64_t{1} << 26;
constexpr int kSketchDepth = 4;

enum class Elem { kI64, kF32, kU16, kU32 };
std::size_t elem_size(Elem e) { return e == Elem::kU16 ? 2 : e == Elem::kF32 || e == Elem::kU32 ? 4 : 8; }
const char* elem_name(Elem e) {
  return e == Elem::kU16 ? "u16" : e == Elem::kU32 ? "u32" : e == Elem::kF32 ? "f32" : "i64";
}
bool elem_unsigned(Elem e) { return e == Elem::kU16 || e == Elem::kU32; }
hid_t elem_file_type(Elem e) {
  return e == Elem::kU16   ? H5T_STD_U16LE
         : e == Elem::kU32 ? H5T_STD_U32LE
         : e == Elem::kF32 ? H5T_IEEE_F32LE
                           : H5T_STD_I64LE;
}
hid_t elem_memory_type(Elem e) {
  return e == Elem::kU16   ? H5T_NATIVE_UINT16
         : e == Elem::kU32 ? H5T_NATIVE_UINT32
         : e == Elem::kF32 ? H5T_NATIVE_FLOAT
                           : H5T_NATIVE_INT64;
}

// The counters in their on-disk order (attributes counter_<name>, one text line).
struct CounterField {
  const char* name;
  std::int64_t DynamicTableCounters::*member;
};
constexpr CounterField kCounters[] = {
    {"admitted", &DynamicTableCounters::admitted},
    {"lookups", &DynamicTableCounters::lookups},
    {"updates", &DynamicTableCounters::updates},
    {"rejected_lookups", &DynamicTableCounters::rejected_lookups},
    {"rejected_updates", &DynamicTableCounters::rejected_updates},
    {"rejected_full", &DynamicTableCounters::rejected_full},
    {"evicted_ttl", &DynamicTableCounters::evicted_ttl},
    {"evicted_capacity", &DynamicTableCounters::evicted_capacity},
    {"imported", &DynamicTableCounters::imported},
};

std::string text_field(const std::string& s) { return std::to_string(s.size()) + ":" + s; }

std::string join(const std::vector<std::string>& v, char sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? std::string(1, sep) : "") + v[i];
  return out;
}

bool valid_name(const std::string& name, bool slot) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                    (!slot && (ch == '.' || ch == '-'));
    if (!ok) return false;
  }
  return true;
}

// One dataset of a table: its path inside the table group ("ids", "slots/m"), type and shape,
// and (when writing) the bytes in memory.
struct Dataset {
  std::string rel;
  Elem elem = Elem::kI64;
  std::vector<std::uint64_t> dims;
  const void* data = nullptr;
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};

std::string dims_text(const std::vector<std::uint64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string dataset_line(const Dataset& d) {
  return "dataset " + text_field(d.rel) + " " + elem_name(d.elem) + " " + dims_text(d.dims) + " checksum " +
         std::to_string(d.crc);
}

// The datasets a table has, by its kind and geometry (n rows, e evicted ids), and whether it keeps
// update counts (optional: files written before them have none). update_counts comes last.
// `runs` > 0: the table is stored as that many sorted runs (a parallel write, FORMAT.md 10.9) and has
// a row_runs dataset, placed before evicted_ids.
std::vector<Dataset> expected_datasets(const DynamicTableState& t, std::uint64_t n, std::uint64_t e, bool counts,
                                       std::uint64_t runs = 0) {
  const auto dim = static_cast<std::uint64_t>(t.dim);
  std::vector<Dataset> out;
  out.push_back({"ids", Elem::kI64, {n}, t.ids.data(), 0, 0});
  out.push_back({"values", Elem::kF32, {n, dim}, t.values.data(), 0, 0});
  out.push_back({"stamps", Elem::kI64, {n}, t.stamps.data(), 0, 0});
  for (std::size_t k = 0; k < t.slot_names.size(); ++k)
    out.push_back(
        {"slots/" + t.slot_names[k], Elem::kF32, {n, dim}, k < t.slots.size() ? t.slots[k].data() : nullptr, 0, 0});
  if (t.sketch_width > 0 && t.sketch_sparse) {
    const auto m = static_cast<std::uint64_t>(t.sketch_cells.size());
    out.push_back({"sketch_cells", Elem::kI64, {m}, t.sketch_cells.data(), 0, 0});
    out.push_back({"sketch_values", Elem::kU16, {m}, t.sketch.data(), 0, 0});
  } else if (t.sketch_width > 0) {
    out.push_back(
        {"sketch", Elem::kU16, {kSketchDepth, static_cast<std::uint64_t>(t.sketch_width)}, t.sketch.data(), 0, 0});
  }
  if (runs > 0) out.push_back({"row_runs", Elem::kI64, {runs, 2}, nullptr, 0, 0});
  if (t.kind == DynamicKind::kDelta) out.push_back({"evicted_ids", Elem::kI64, {e}, t.evicted_ids.data(), 0, 0});
  if (counts) out.push_back({"update_counts", Elem::kU32, {n}, t.update_counts.data(), 0, 0});
  for (auto& d : out) {
    d.bytes = elem_size(d.elem);
    for (auto x : d.dims) d.bytes *= x;
  }
  return out;
}

[[noreturn]] void bad_table(const DynamicTableState& t, const std::string& why) {
  throw ConfigError("dynamic table '" + t.name + "': " + why);
}

// Everything FORMAT.md 10.4 requires of a table, on the in-memory state.
void validate_table(const DynamicTableState& t) {
  if (!valid_name(t.name, false)) throw ConfigError("dynamic table name '" + t.name + "' is not [A-Za-z0-9_.-]{1,255}");
  if (t.dim < 1 || t.dim > kMaxDim) bad_table(t, "dim " + std::to_string(t.dim) + " is outside [1, 65536]");
  for (const auto& s : t.slot_names)
    if (!valid_name(s, true)) bad_table(t, "slot name '" + s + "' is not [A-Za-z0-9_]{1,255}");
  if (std::set<std::string>(t.slot_names.begin(), t.slot_names.end()).size() != t.slot_names.size())
    bad_table(t, "slot names repeat");
  const std::size_t n = t.ids.size();
  const auto dim = static_cast<std::size_t>(t.dim);
  if (t.values.size() != n * dim)
    bad_table(t, "values hold " + std::to_string(t.values.size()) + " floats for " + std::to_string(n) + " rows of " +
                     std::to_string(dim));
  if (t.slots.size() != t.slot_names.size())
    bad_table(
        t, std::to_string(t.slots.size()) + " slot arrays for " + std::to_string(t.slot_names.size()) + " slot names");
  for (std::size_t k = 0; k < t.slots.size(); ++k)
    if (t.slots[k].size() != n * dim)
      bad_table(t, "slot " + t.slot_names[k] + " holds " + std::to_string(t.slots[k].size()) + " floats");
  if (t.stamps.size() != n) bad_table(t, std::to_string(t.stamps.size()) + " stamps for " + std::to_string(n) + " ids");
  if (!t.update_counts.empty() && t.update_counts.size() != n)
    bad_table(t, std::to_string(t.update_counts.size()) + " update counts for " + std::to_string(n) +
                     " ids (none, or one per id)");
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && t.ids[i] <= t.ids[i - 1]) bad_table(t, "ids are not strictly increasing at row " + std::to_string(i));
    if (t.stamps[i] < 0) bad_table(t, "stamp of row " + std::to_string(i) + " is negative");
  }
  if (t.clock < 0) bad_table(t, "clock " + std::to_string(t.clock) + " is negative");
  if (t.sketch_width < 0 || t.sketch_width > kMaxSketchWidth)
    bad_table(t, "sketch_width " + std::to_string(t.sketch_width) + " is outside [0, 2^26]");
  if (t.sketch_sparse) {
    if (t.kind != DynamicKind::kDelta || t.sketch_width == 0)
      bad_table(t, "only a delta of a table with a sketch may carry changed sketch cells");
    if (t.sketch.size() != t.sketch_cells.size())
      bad_table(t, std::to_string(t.sketch.size()) + " sketch values for " + std::to_string(t.sketch_cells.size()) +
                       " cells");
    for (std::size_t i = 0; i < t.sketch_cells.size(); ++i)
      if (t.sketch_cells[i] < 0 || t.sketch_cells[i] >= kSketchDepth * t.sketch_width ||
          (i > 0 && t.sketch_cells[i] <= t.sketch_cells[i - 1]))
        bad_table(t, "sketch cells are not strictly increasing in [0, 4 x sketch_width) at " + std::to_string(i));
  } else if (t.sketch.size() != static_cast<std::size_t>(kSketchDepth * t.sketch_width)) {
    bad_table(
        t, "sketch holds " + std::to_string(t.sketch.size()) + " counters for width " + std::to_string(t.sketch_width));
  } else if (!t.sketch_cells.empty()) {
    bad_table(t, "sketch cells without sketch_sparse");
  }
  if (t.total_rows < 0) bad_table(t, "total_rows is negative");
  for (const auto& c : kCounters)
    if (t.counters.*c.member < 0) bad_table(t, std::string("counter ") + c.name + " is negative");
  if (t.kind == DynamicKind::kFull) {
    if (t.total_rows != static_cast<std::int64_t>(n))
      bad_table(t,
                "a full table has total_rows " + std::to_string(t.total_rows) + " but " + std::to_string(n) + " rows");
    if (!t.evicted_ids.empty()) bad_table(t, "a full table has evicted ids");
    if (t.parent_step != -1) bad_table(t, "a full table has a parent");
    return;
  }
  if (t.parent_step < 0)
    bad_table(t, "a delta needs its parent's step (parent_step " + std::to_string(t.parent_step) + ")");
  for (std::size_t i = 0, j = 0; i < t.evicted_ids.size(); ++i) {
    if (i > 0 && t.evicted_ids[i] <= t.evicted_ids[i - 1])
      bad_table(t, "evicted ids are not strictly increasing at " + std::to_string(i));
    while (j < n && t.ids[j] < t.evicted_ids[i]) ++j;
    if (j < n && t.ids[j] == t.evicted_ids[i])
      bad_table(t, "id " + std::to_string(t.evicted_ids[i]) + " is both evicted and a row");
  }
}

// The version a file is written as: 1 when every table is one sorted run (what every strata reads),
// 2 when the tables are stored as one sorted run per writing rank (row_runs, FORMAT.md 10.9).
constexpr int kOneRunVersion = 1;
constexpr int kRunsVersion = 2;
static_assert(kRunsVersion == kDynamicFormatVersion, "the newest version written is the newest read");

std::string root_manifest(std::int64_t global_step, const std::vector<const DynamicTableState*>& tables, int version) {
  std::string s = "strata dynamic checkpoint manifest 1\n";
  s += "dynamic_format_version " + std::to_string(version) + "\n";
  s += "global_step " + std::to_string(global_step) + "\n";
  s += "checksum_algorithm " + text_field("crc32") + "\n";
  for (const auto* t : tables) s += "table " + text_field(t->name) + " " + std::to_string(t->content_checksum) + "\n";
  return s;
}

// ---- raw verification (no HDF5) ----------------------------------------------------------------

void pread_all(int fd, void* out, std::uint64_t bytes, std::uint64_t at, const char* what) {
  std::uint64_t got = 0;
  auto* p = static_cast<unsigned char*>(out);
  while (got < bytes) {
    const ssize_t r = ::pread(fd, p + got, static_cast<std::size_t>(bytes - got), static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(std::string("cannot read ") + what + ": " +
                  (r < 0 ? std::strerror(errno) : "unexpected end of file"));
    got += static_cast<std::uint64_t>(r);
  }
}

// The whole-file CRC-32 and every dataset's CRC-32, before HDF5 sees the file. Returns the table.
detail::IntegrityBlock verify_raw(const std::string& path) {
  detail::Fd fd{detail::open_regular_file(path)};
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw Error("cannot stat: " + std::string(std::strerror(errno)));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  unsigned char header[detail::kIntegrityHeaderBytes] = {};
  const std::uint64_t n = std::min<std::uint64_t>(size, sizeof header);
  pread_all(fd.fd, header, n, 0, "the header");
  std::optional<detail::IntegrityBlock> head;
  try {
    head = detail::decode_integrity_header(header, n);
  } catch (const Error& e) {
    throw Error("damaged integrity block: " + e.message());
  }
  if (!head) throw ConfigError("not a strata dynamic checkpoint (no integrity block)");
  if (size != head->file_bytes)
    throw Error("the file has " + std::to_string(size) + " bytes, its integrity block says " +
                std::to_string(head->file_bytes) + " (" + (size < head->file_bytes ? "truncated" : "extended") +
                " after it was written)");
  std::string raw(static_cast<std::size_t>(head->block_bytes), '\0');
  pread_all(fd.fd, raw.data(), head->block_bytes, 0, "the integrity block");
  detail::IntegrityBlock block;
  std::vector<detail::Segment> segments;
  std::string table_error;
  try {
    block = detail::decode_integrity_block(raw);
    segments = detail::file_segments(block);
  } catch (const Error& e) {
    table_error = e.message();
    block = *head;
    block.regions.clear();
    segments.clear();
    if (block.block_bytes < block.file_bytes) segments.push_back({block.block_bytes, block.file_bytes, -1});
  }
  const auto crcs = detail::combine_segment_pieces(
      detail::scan_segments(fd.fd, path, block.block_bytes, block.file_bytes, segments), segments);
  std::string changed;
  for (std::size_t s = 0; s < segments.size() && changed.empty(); ++s)
    if (segments[s].region >= 0 && crcs[s] != block.regions[static_cast<std::size_t>(segments[s].region)].crc)
      changed = block.regions[static_cast<std::size_t>(segments[s].region)].path;
  if (detail::whole_file_crc(raw, segments, crcs) != head->file_crc)
    throw Error("file checksum mismatch: " + (changed.empty() ? std::string("damage outside the datasets' data")
                                                              : "the data of " + changed + " changed"));
  if (!table_error.empty()) throw Error("damaged integrity block: " + table_error);
  if (!changed.empty()) throw Error("checksum mismatch in " + changed);
  return block;
}

// ---- HDF5 reading ------------------------------------------------------------------------------

herr_t collect_links(hid_t, const char* name, const H5L_info_t* info, void* data) {
  auto* out = static_cast<std::vector<std::pair<std::string, bool>>*>(data);
  out->emplace_back(name, info->type == H5L_TYPE_HARD);
  return 0;
}

// The links directly in `group` (name, hard), at most `limit` of them.
std::vector<std::pair<std::string, bool>> links_of(hid_t group, std::size_t limit, const std::string& what) {
  H5G_info_t info;
  STRATA_CHECK_H5(H5Gget_info(group, &info));
  if (info.nlinks > limit)
    throw Error(what + " holds " + std::to_string(info.nlinks) + " links, the file has data for at most " +
                std::to_string(limit));
  std::vector<std::pair<std::string, bool>> out;
  STRATA_CHECK_H5(H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_links, &out));
  return out;
}

H5O_type_t object_type(hid_t loc, const std::string& name) {
  H5O_info_t info;
  if (H5Oget_info_by_name(loc, name.c_str(), &info, H5P_DEFAULT) < 0) return H5O_TYPE_UNKNOWN;
  return info.type;
}

// Opens dataset `d.rel` of the table group and checks it against the integrity block before a
// byte of it is read: a hard link to a contiguous, unfiltered dataset of the expected type and
// rank, stored in exactly the byte range the (verified) block lists, with the listed CRC-32.
// Fills d.dims and d.crc.
H5Id open_dataset(hid_t group, const std::string& group_path, Dataset& d, std::size_t rank,
                  const std::map<std::string, const detail::DataRegion*>& regions) {
  const std::string path = group_path + "/" + d.rel;
  const std::string what = "dataset " + path;
  const auto region = regions.find(path);
  if (region == regions.end()) throw Error(what + " is missing or not listed in the integrity block");
  H5Id dset(STRATA_CHECK_H5(H5Dopen2(group, d.rel.c_str(), H5P_DEFAULT)), H5Dclose);
  H5Id type(STRATA_CHECK_H5(H5Dget_type(dset.get())), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  const std::size_t size = H5Tget_size(type.get());
  const bool want_float = d.elem == Elem::kF32;
  const bool sign_ok =
      cls != H5T_INTEGER || H5Tget_sign(type.get()) == (elem_unsigned(d.elem) ? H5T_SGN_NONE : H5T_SGN_2);
  if (cls != (want_float ? H5T_FLOAT : H5T_INTEGER) || size != elem_size(d.elem) || !sign_ok)
    throw Error(what + " is not " + elem_name(d.elem));
  H5Id space(STRATA_CHECK_H5(H5Dget_space(dset.get())), H5Sclose);
  const int r = STRATA_CHECK_H5(H5Sget_simple_extent_ndims(space.get()));
  if (r != static_cast<int>(rank))
    throw Error(what + " has rank " + std::to_string(r) + ", expected " + std::to_string(rank));
  std::vector<hsize_t> dims(rank);
  STRATA_CHECK_H5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  d.dims.assign(dims.begin(), dims.end());
  std::uint64_t bytes = elem_size(d.elem);
  for (auto x : d.dims)
    if (__builtin_mul_overflow(bytes, x, &bytes))
      throw Error(what + " " + dims_text(d.dims) + " declares more than 2^64 bytes");
  d.bytes = bytes;
  const detail::DataRegion& reg = *region->second;
  if (bytes != reg.bytes)
    throw Error(what + " " + dims_text(d.dims) + " declares " + std::to_string(bytes) +
                " bytes, the integrity block lists " + std::to_string(reg.bytes));
  H5Id dcpl(STRATA_CHECK_H5(H5Dget_create_plist(dset.get())), H5Pclose);
  if (STRATA_CHECK_H5(H5Pget_nfilters(dcpl.get())) > 0 || H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS)
    throw Error(what + " is not contiguous and unfiltered");
  if (bytes > 0) {
    const haddr_t at = H5Dget_offset(dset.get());
    if (H5Dget_storage_size(dset.get()) != bytes || at == HADDR_UNDEF || static_cast<std::uint64_t>(at) != reg.offset)
      throw Error(what + " is not stored where the integrity block says");
  }
  d.crc = static_cast<std::uint32_t>(detail::read_attr_u64(dset.get(), "checksum"));
  if (d.crc != reg.crc) throw Error(what + ": its checksum attribute differs from the integrity block's");
  return dset;
}

template <typename T>
void read_into(hid_t dset, const Dataset& d, std::vector<T>& out) {
  out.resize(static_cast<std::size_t>(d.bytes / sizeof(T)));
  if (d.bytes > 0) STRATA_CHECK_H5(H5Dread(dset, elem_memory_type(d.elem), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()));
}

std::int64_t nonneg_attr(hid_t obj, const char* name, const std::string& what) {
  const std::int64_t v = detail::read_attr_i64(obj, name);
  if (v < 0) throw Error(what + ": attribute " + name + " = " + std::to_string(v) + " is negative");
  return v;
}

// The order that merges the sorted runs of `ids` (run r: its counts[r] consecutive entries) into one
// increasing sequence: empty when there is one run. Error naming `what` when a run is not strictly
// increasing; an id in two runs shows as a repeat in the merged order (checked by the caller).
std::vector<std::size_t> merge_order(const std::vector<std::int64_t>& ids, const std::vector<std::uint64_t>& counts,
                                     const std::string& what) {
  if (counts.size() <= 1) return {};
  std::vector<std::size_t> order(ids.size());
  std::size_t at = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    for (std::size_t i = at; i < at + counts[r]; ++i) {
      if (i > at && ids[i] <= ids[i - 1])
        throw Error(what + " are not strictly increasing inside run " + std::to_string(r) + " at " + std::to_string(i));
      order[i] = i;
    }
    // Merged pairwise as the runs come: each merge is linear, so k runs cost O(n k) at worst and
    // O(n log k) would need a heap; k is the writer's rank count, small next to n.
    if (r > 0)
      std::inplace_merge(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(at),
                         order.begin() + static_cast<std::ptrdiff_t>(at + counts[r]),
                         [&ids](std::size_t a, std::size_t b) { return ids[a] < ids[b]; });
    at += counts[r];
  }
  return order;
}

// `v` (rows of `width` elements) reordered so that row i is the old row order[i].
template <typename T>
void permute_rows(std::vector<T>& v, const std::vector<std::size_t>& order, std::size_t width) {
  if (order.empty() || v.empty()) return;
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    std::memcpy(out.data() + i * width, v.data() + order[i] * width, width * sizeof(T));
  v.swap(out);
}

DynamicTableState read_table(hid_t file, std::int64_t global_step, int version, const std::string& name,
                             bool with_data, const std::map<std::string, const detail::DataRegion*>& regions,
                             std::size_t& datasets_seen) {
  DynamicTableState t;
  t.name = name;
  const std::string gpath = "dynamic/" + name;
  const std::string what = "table " + name;
  H5Id group(STRATA_CHECK_H5(H5Gopen2(file, ("/" + gpath).c_str(), H5P_DEFAULT)), H5Gclose);
  const hid_t g = group.get();
  const std::string kind = detail::read_attr_string(g, "kind");
  if (kind == "full")
    t.kind = DynamicKind::kFull;
  else if (kind == "delta")
    t.kind = DynamicKind::kDelta;
  else
    throw Error(what + ": kind '" + kind + "' is neither full nor delta");
  t.dim = detail::read_attr_i64(g, "dim");
  if (t.dim < 1 || t.dim > kMaxDim) throw Error(what + ": dim " + std::to_string(t.dim) + " is outside [1, 65536]");
  t.optimizer = detail::read_attr_string(g, "optimizer");
  const std::string slots = detail::read_attr_string(g, "slot_names");
  for (std::size_t b = 0; !slots.empty();) {
    const std::size_t e = slots.find(',', b);
    t.slot_names.push_back(slots.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (!valid_name(t.slot_names.back(), true))
      throw Error(what + ": slot_names '" + slots + "' is not a list of slot names");
    if (e == std::string::npos) break;
    b = e + 1;
  }
  if (std::set<std::string>(t.slot_names.begin(), t.slot_names.end()).size() != t.slot_names.size())
    throw Error(what + ": slot_names '" + slots + "' repeats a slot");
  t.clock = nonneg_attr(g, "clock", what);
  t.sketch_width = nonneg_attr(g, "sketch_width", what);
  if (t.sketch_width > kMaxSketchWidth)
    throw Error(what + ": sketch_width " + std::to_string(t.sketch_width) + " is above 2^26");
  if (detail::has_attr(g, "sketch_form")) {
    const std::string form = detail::read_attr_string(g, "sketch_form");
    if (form != "cells") throw Error(what + ": sketch_form '" + form + "' is not 'cells'");
    if (t.kind != DynamicKind::kDelta || t.sketch_width == 0)
      throw Error(what + ": only a delta of a table with a sketch may carry changed sketch cells");
    t.sketch_sparse = true;
  }
  t.total_rows = nonneg_attr(g, "total_rows", what);
  for (const auto& c : kCounters)
    t.counters.*c.member = nonneg_attr(g, (std::string("counter_") + c.name).c_str(), what);
  if (t.kind == DynamicKind::kDelta) {
    t.parent_step = nonneg_attr(g, "parent_step", what);
    if (t.parent_step >= global_step)
      throw Error(what + ": parent_step " + std::to_string(t.parent_step) + " is not before this file's step " +
                  std::to_string(global_step));
    const std::uint64_t pc = detail::read_attr_u64(g, "parent_checksum");
    if (pc > 0xffffffffu) throw Error(what + ": parent_checksum " + std::to_string(pc) + " is not a CRC-32");
    t.parent_checksum = static_cast<std::uint32_t>(pc);
  } else if (detail::has_attr(g, "parent_step") || detail::has_attr(g, "parent_checksum")) {
    throw Error(what + ": a full table has a parent link");
  }
  const std::uint64_t stored = detail::read_attr_u64(g, "content_checksum");

  // The group holds exactly the datasets of its kind (hard links only), checked before any is
  // opened: nothing in it can point the reader at another object or file. update_counts is
  // optional (older files have none: every row's count reads as 0).
  std::set<std::string> expect, got;
  for (const auto& [link, hard] : links_of(g, regions.size() + 2, what)) {
    if (!hard) throw Error(what + ": '" + link + "' is not a hard link");
    got.insert(link);
  }
  const bool counts = got.count("update_counts") > 0;
  // row_runs: the table is stored as sorted runs, one per writing rank (FORMAT.md 10.9); version 2 only.
  const bool runs = got.count("row_runs") > 0;
  if (runs && version < 2) throw Error(what + ": row_runs in a file of dynamic_format_version " + std::to_string(version));
  std::vector<Dataset> ds = expected_datasets(t, 0, 0, counts, runs ? 1 : 0);
  for (const auto& d : ds)
    if (d.rel.rfind("slots/", 0) != 0) expect.insert(d.rel);
  if (!t.slot_names.empty()) expect.insert("slots");
  if (got != expect) {
    std::vector<std::string> e(expect.begin(), expect.end()), h(got.begin(), got.end());
    throw Error(what + ": the group holds {" + join(h, ',') + "}, a " + kind + " table has {" + join(e, ',') + "}");
  }
  if (!t.slot_names.empty()) {
    if (object_type(g, "slots") != H5O_TYPE_GROUP) throw Error(what + ": 'slots' is not a group");
    H5Id sg(STRATA_CHECK_H5(H5Gopen2(g, "slots", H5P_DEFAULT)), H5Gclose);
    std::set<std::string> have;
    for (const auto& [link, hard] : links_of(sg.get(), regions.size() + 2, what + " slots")) {
      if (!hard) throw Error(what + ": slots/" + link + " is not a hard link");
      have.insert(link);
    }
    if (have != std::set<std::string>(t.slot_names.begin(), t.slot_names.end()))
      throw Error(what + ": the slots group does not hold exactly the slots named by slot_names");
  }
  // The datasets, checked against the integrity block and each other before any is read.
  std::vector<H5Id> handles;
  for (auto& d : ds)
    handles.push_back(open_dataset(
        g, gpath, d,
        d.rel == "values" || d.rel == "sketch" || d.rel == "row_runs" || d.rel.rfind("slots/", 0) == 0 ? 2 : 1,
        regions));
  const std::uint64_t n = ds[0].dims[0];
  for (const auto& d : ds) {
    const bool rowwise = d.rel == "values" || d.rel.rfind("slots/", 0) == 0;
    if (rowwise && (d.dims[0] != n || d.dims[1] != static_cast<std::uint64_t>(t.dim)))
      throw Error(what + ": " + d.rel + " is " + dims_text(d.dims) + ", expected [" + std::to_string(n) + "," +
                  std::to_string(t.dim) + "] (ids hold " + std::to_string(n) + " rows, dim is " +
                  std::to_string(t.dim) + ")");
    if (d.rel == "stamps" && d.dims[0] != n)
      throw Error(what + ": stamps hold " + std::to_string(d.dims[0]) + " entries for " + std::to_string(n) + " ids");
    if (d.rel == "update_counts" && d.dims[0] != n)
      throw Error(what + ": update_counts hold " + std::to_string(d.dims[0]) + " entries for " + std::to_string(n) +
                  " ids");
    if (d.rel == "sketch" && (d.dims[0] != kSketchDepth || d.dims[1] != static_cast<std::uint64_t>(t.sketch_width)))
      throw Error(what + ": sketch is " + dims_text(d.dims) + ", expected [4," + std::to_string(t.sketch_width) + "]");
    if (d.rel == "sketch_values" && d.dims[0] != ds[3 + t.slot_names.size()].dims[0])
      throw Error(what + ": sketch_values hold " + std::to_string(d.dims[0]) + " counters for " +
                  std::to_string(ds[3 + t.slot_names.size()].dims[0]) + " sketch_cells");
    if (d.rel == "row_runs" && (d.dims[0] < 1 || d.dims[1] != 2))
      throw Error(what + ": row_runs is " + dims_text(d.dims) + ", expected [k,2] with k >= 1");
    if (d.rel == "sketch_cells" && d.dims[0] > static_cast<std::uint64_t>(kSketchDepth * t.sketch_width))
      throw Error(what + ": sketch_cells hold " + std::to_string(d.dims[0]) + " cells, more than the sketch's " +
                  std::to_string(kSketchDepth * t.sketch_width));
  }
  t.stored_rows = static_cast<std::int64_t>(n);
  if (t.kind == DynamicKind::kFull && static_cast<std::uint64_t>(t.total_rows) != n)
    throw Error(what + ": total_rows " + std::to_string(t.total_rows) + " but ids hold " + std::to_string(n) + " rows");
  datasets_seen += ds.size();

  // The content checksum covers the attributes above and every dataset's shape and CRC-32.
  std::vector<std::string> lines;
  for (const auto& d : ds) lines.push_back(dataset_line(d));
  const std::string text = detail::dynamic_table_text(t, lines);
  t.content_checksum = detail::crc32_update(0, text.data(), text.size());
  if (stored != t.content_checksum)
    throw Error(what + ": content checksum mismatch (stored " + std::to_string(stored) + ", computed " +
                std::to_string(t.content_checksum) + ")");

  // The data: bounded by the verified byte ranges, so every allocation is at most the file's size.
  const std::size_t evicted_at = ds.size() - (counts ? 2 : 1);  // evicted_ids, then update_counts
  // The runs (rows, evicted ids) per writing rank: they tile ids and evicted_ids in order.
  std::vector<std::uint64_t> row_counts, evicted_counts;
  if (runs) {
    const std::size_t at = evicted_at - (t.kind == DynamicKind::kDelta ? 1 : 0);
    std::vector<std::int64_t> pairs;
    read_into(handles[at].get(), ds[at], pairs);
    std::uint64_t rows = 0, evicted = 0;
    for (std::size_t r = 0; r + 1 < pairs.size(); r += 2) {
      if (pairs[r] < 0 || pairs[r + 1] < 0) throw Error(what + ": row_runs holds a negative count");
      row_counts.push_back(static_cast<std::uint64_t>(pairs[r]));
      evicted_counts.push_back(static_cast<std::uint64_t>(pairs[r + 1]));
      rows += row_counts.back();
      evicted += evicted_counts.back();
      if (rows > n) break;
    }
    const std::uint64_t e = t.kind == DynamicKind::kDelta ? ds[evicted_at].dims[0] : 0;
    if (rows != n || evicted != e)
      throw Error(what + ": row_runs add up to " + std::to_string(rows) + " rows and " + std::to_string(evicted) +
                  " evicted ids, the table holds " + std::to_string(n) + " and " + std::to_string(e));
  }
  if (t.kind == DynamicKind::kDelta) {
    read_into(handles[evicted_at].get(), ds[evicted_at], t.evicted_ids);
    const std::vector<std::size_t> order = merge_order(t.evicted_ids, evicted_counts, what + ": evicted_ids");
    permute_rows(t.evicted_ids, order, 1);
    for (std::size_t i = 1; i < t.evicted_ids.size(); ++i)
      if (!order.empty() && t.evicted_ids[i] == t.evicted_ids[i - 1])
        throw Error(what + ": evicted id " + std::to_string(t.evicted_ids[i]) + " is in two runs (two writers held it)");
    for (std::size_t i = 1; i < t.evicted_ids.size(); ++i)
      if (t.evicted_ids[i] <= t.evicted_ids[i - 1])
        throw Error(what + ": evicted_ids are not strictly increasing at " + std::to_string(i));
  }
  if (!with_data) return t;
  read_into(handles[0].get(), ds[0], t.ids);
  read_into(handles[1].get(), ds[1], t.values);
  read_into(handles[2].get(), ds[2], t.stamps);
  if (counts) read_into(handles.back().get(), ds.back(), t.update_counts);
  t.slots.resize(t.slot_names.size());
  for (std::size_t k = 0; k < t.slot_names.size(); ++k) read_into(handles[3 + k].get(), ds[3 + k], t.slots[k]);
  const std::size_t sk = 3 + t.slot_names.size();
  if (t.sketch_sparse) {
    read_into(handles[sk].get(), ds[sk], t.sketch_cells);
    read_into(handles[sk + 1].get(), ds[sk + 1], t.sketch);
    for (std::size_t i = 0; i < t.sketch_cells.size(); ++i)
      if (t.sketch_cells[i] < 0 || t.sketch_cells[i] >= kSketchDepth * t.sketch_width ||
          (i > 0 && t.sketch_cells[i] <= t.sketch_cells[i - 1]))
        throw Error(what + ": sketch_cells are not strictly increasing in [0, 4 x sketch_width) at " +
                    std::to_string(i));
  } else if (t.sketch_width > 0) {
    read_into(handles[sk].get(), ds[sk], t.sketch);
  }
  // Rows of several runs in id order: the state in memory is the same whoever wrote the file.
  const std::vector<std::size_t> order = merge_order(t.ids, row_counts, what + ": ids");
  const auto dim = static_cast<std::size_t>(t.dim);
  permute_rows(t.ids, order, 1);
  permute_rows(t.stamps, order, 1);
  permute_rows(t.update_counts, order, 1);
  permute_rows(t.values, order, dim);
  for (auto& slot : t.slots) permute_rows(slot, order, dim);
  for (std::size_t i = 0; i < t.ids.size(); ++i) {
    if (i > 0 && !order.empty() && t.ids[i] == t.ids[i - 1])
      throw Error(what + ": id " + std::to_string(t.ids[i]) + " is in two runs (two writers held it)");
    if (i > 0 && t.ids[i] <= t.ids[i - 1])
      throw Error(what + ": ids are not strictly increasing at row " + std::to_string(i) + " (" +
                  std::to_string(t.ids[i - 1]) + ", " + std::to_string(t.ids[i]) + ")");
    if (t.stamps[i] < 0) throw Error(what + ": stamp of row " + std::to_string(i) + " is negative");
  }
  for (std::size_t i = 0, j = 0; i < t.evicted_ids.size(); ++i) {
    while (j < t.ids.size() && t.ids[j] < t.evicted_ids[i]) ++j;
    if (j < t.ids.size() && t.ids[j] == t.evicted_ids[i])
      throw Error(what + ": id " + std::to_string(t.evicted_ids[i]) + " is both evicted and a row");
  }
  return t;
}

void unlink_quietly(const std::string& path) { ::unlink(path.c_str()); }

// ---- writing (one process or every rank of a communicator: the same calls, collective under mpio) --

void write_root(hid_t file, int version, std::int64_t global_step, const std::string& manifest) {
  detail::write_attr_i32(file, "dynamic_format_version", version);
  detail::write_attr_i64(file, "global_step", global_step);
  detail::write_attr_string(file, "checksum_algorithm", "crc32");
  detail::write_attr_u64(file, "metadata_checksum", detail::crc32_update(0, manifest.data(), manifest.size()));
  H5Id(STRATA_CHECK_H5(H5Gcreate2(file, "/dynamic", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
}

// Contiguous, never filled, allocated at creation (so the offset is known before any data is
// written, and a parallel write needs no collective allocation later).
H5Id dataset_creation() {
  H5Id dcpl(STRATA_CHECK_H5(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  STRATA_CHECK_H5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  STRATA_CHECK_H5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  STRATA_CHECK_H5(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  return dcpl;
}

// The group of table `t` (attributes of `t`, whose row data is not looked at) and its datasets
// `ds` at their full shapes with their checksum attributes; returns the datasets, in ds' order.
std::vector<H5Id> create_table(hid_t file, const DynamicTableState& t, std::uint32_t content_checksum,
                               const std::vector<Dataset>& ds, hid_t dcpl) {
  H5Id g(STRATA_CHECK_H5(H5Gcreate2(file, ("/dynamic/" + t.name).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
         H5Gclose);
  detail::write_attr_string(g.get(), "kind", to_string(t.kind));
  detail::write_attr_i64(g.get(), "dim", t.dim);
  detail::write_attr_string(g.get(), "optimizer", t.optimizer);
  detail::write_attr_string(g.get(), "slot_names", join(t.slot_names, ','));
  detail::write_attr_i64(g.get(), "clock", t.clock);
  detail::write_attr_i64(g.get(), "sketch_width", t.sketch_width);
  if (t.sketch_sparse) detail::write_attr_string(g.get(), "sketch_form", "cells");
  detail::write_attr_i64(g.get(), "total_rows", t.total_rows);
  for (const auto& c : kCounters)
    detail::write_attr_i64(g.get(), (std::string("counter_") + c.name).c_str(), t.counters.*c.member);
  if (t.kind == DynamicKind::kDelta) {
    detail::write_attr_i64(g.get(), "parent_step", t.parent_step);
    detail::write_attr_u64(g.get(), "parent_checksum", t.parent_checksum);
  }
  detail::write_attr_u64(g.get(), "content_checksum", content_checksum);
  if (!t.slot_names.empty())
    H5Id(STRATA_CHECK_H5(H5Gcreate2(g.get(), "slots", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
  std::vector<H5Id> out;
  for (const Dataset& d : ds) {
    std::vector<hsize_t> dims(d.dims.begin(), d.dims.end());
    H5Id space(STRATA_CHECK_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)), H5Sclose);
    out.emplace_back(STRATA_CHECK_H5(H5Dcreate2(g.get(), d.rel.c_str(), elem_file_type(d.elem), space.get(),
                                                H5P_DEFAULT, dcpl, H5P_DEFAULT)),
                     H5Dclose);
    detail::write_attr_u64(out.back().get(), "checksum", d.crc);
  }
  return out;
}

// Where dataset `d` (of table `t`) holds its data in the file: 0 for an empty one.
std::uint64_t data_offset(hid_t dset, const Dataset& d, const DynamicTableState& t) {
  if (d.bytes == 0) return 0;
  const haddr_t a = H5Dget_offset(dset);
  if (a == HADDR_UNDEF) throw Error("dataset " + d.rel + " of table " + t.name + " has no file space");
  return static_cast<std::uint64_t>(a);
}

}  // namespace

// ---- canonical text ----------------------------------------------------------------------------

std::string detail::dynamic_table_text(const DynamicTableState& t, std::vector<std::string> dataset_lines) {
  std::string s = "strata dynamic table 1\n";
  s += "name " + text_field(t.name) + "\n";
  s += std::string("kind ") + to_string(t.kind) + "\n";
  s += "dim " + std::to_string(t.dim) + "\n";
  s += "optimizer " + text_field(t.optimizer) + "\n";
  s += "slot_names " + text_field(join(t.slot_names, ',')) + "\n";
  s += "clock " + std::to_string(t.clock) + "\n";
  s += "sketch_width " + std::to_string(t.sketch_width) + "\n";
  if (t.sketch_sparse) s += "sketch_form cells\n";  // absent from whole-sketch tables' text
  s += "total_rows " + std::to_string(t.total_rows) + "\n";
  s += "counters";
  for (const auto& c : kCounters) s += " " + std::to_string(t.counters.*c.member);
  s += "\n";
  if (t.kind == DynamicKind::kDelta)
    s += "parent " + std::to_string(t.parent_step) + " " + std::to_string(t.parent_checksum) + "\n";
  std::sort(dataset_lines.begin(), dataset_lines.end());
  for (const auto& l : dataset_lines) s += l + "\n";
  return s;
}

// ---- writer ------------------------------------------------------------------------------------

DynamicSaveResult detail::write_dynamic_file(const std::string& final_path, std::int64_t global_step,
                                             const std::vector<DynamicTableState>& tables, bool validate,
                                             const std::string& counts_type) {
  if (global_step < 0)
    throw ConfigError("dynamic checkpoint: global step " + std::to_string(global_step) + " is negative");
  std::set<std::string> names;
  for (const auto& t : tables) {
    if (validate)
      validate_table(t);
    else if (!valid_name(t.name, false))
      throw ConfigError("dynamic table name '" + t.name + "' is not [A-Za-z0-9_.-]{1,255}");
    if (!names.insert(t.name).second) throw ConfigError("dynamic checkpoint: table '" + t.name + "' is given twice");
  }
  // Datasets, their CRC-32s from memory, and each table's content checksum.
  std::vector<std::vector<Dataset>> ds(tables.size());
  std::vector<DynamicTableState> heads(tables.size());  // attributes only, with content_checksum
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    const DynamicTableState& t = tables[i];
    ds[i] = expected_datasets(t, t.ids.size(), t.evicted_ids.size(), !t.update_counts.empty());
    if (!validate) {  // crafted: shapes from what the vectors hold
      for (auto& d : ds[i]) {
        std::uint64_t floats = 0;
        if (d.rel == "values")
          floats = t.values.size();
        else if (d.rel.rfind("slots/", 0) == 0) {
          const auto k = static_cast<std::size_t>(&d - &ds[i][3]);
          floats = k < t.slots.size() ? t.slots[k].size() : 0;
        } else if (d.rel == "stamps")
          d.dims = {t.stamps.size()};
        else if (d.rel == "update_counts") {
          d.elem = counts_type == "i64" ? Elem::kI64
                   : counts_type == "f32" ? Elem::kF32
                   : counts_type == "u16" ? Elem::kU16
                                          : Elem::kU32;
          d.dims = {t.update_counts.size() * sizeof(std::uint32_t) / elem_size(d.elem)};
        }
        if (d.rel == "values" || d.rel.rfind("slots/", 0) == 0)
          d.dims = {floats / static_cast<std::uint64_t>(t.dim), static_cast<std::uint64_t>(t.dim)};
        if (d.rel == "sketch") d.dims = {kSketchDepth, t.sketch.size() / kSketchDepth};
        if (d.rel == "sketch_cells") d.dims = {t.sketch_cells.size()};
        if (d.rel == "sketch_values") d.dims = {t.sketch.size()};
        d.bytes = elem_size(d.elem);
        for (auto x : d.dims) d.bytes *= x;
      }
    }
    std::vector<std::string> lines;
    for (auto& d : ds[i]) {
      d.crc = d.bytes == 0 ? 0 : detail::crc32_update(0, d.data, static_cast<std::size_t>(d.bytes));
      lines.push_back(dataset_line(d));
      paths.push_back("dynamic/" + t.name + "/" + d.rel);
    }
    const std::string text = dynamic_table_text(t, lines);
    heads[i].name = t.name;
    heads[i].content_checksum = detail::crc32_update(0, text.data(), text.size());
  }
  std::vector<const DynamicTableState*> sorted;
  for (const auto& h : heads) sorted.push_back(&h);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  const std::string manifest = root_manifest(global_step, sorted, kOneRunVersion);

  const std::string tmp = final_path + ".tmp";
  const std::uint64_t block_bytes = detail::integrity_block_bytes(paths);
  detail::IntegrityBlock block;
  block.block_bytes = block_bytes;
  block.global_step = global_step;
  DynamicSaveResult result;
  result.path = final_path;
  try {
    {
      detail::QuietErrors quiet;
      H5Id fcpl(STRATA_CHECK_H5(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
      STRATA_CHECK_H5(H5Pset_userblock(fcpl.get(), block_bytes));
      H5Id file(STRATA_CHECK_H5(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT)), H5Fclose);
      write_root(file.get(), kOneRunVersion, global_step, manifest);
      const H5Id dcpl = dataset_creation();
      for (std::size_t i = 0; i < tables.size(); ++i) {
        const DynamicTableState& t = tables[i];
        std::vector<H5Id> dsets = create_table(file.get(), t, heads[i].content_checksum, ds[i], dcpl.get());
        for (std::size_t k = 0; k < ds[i].size(); ++k) {
          const Dataset& d = ds[i][k];
          if (d.bytes > 0)
            STRATA_CHECK_H5(H5Dwrite(dsets[k].get(), elem_memory_type(d.elem), H5S_ALL, H5S_ALL, H5P_DEFAULT, d.data));
          block.regions.push_back({"dynamic/" + t.name + "/" + d.rel, data_offset(dsets[k].get(), d, t), d.bytes, d.crc});
        }
      }
      if (file.close() < 0) throw Hdf5Error("closing the file failed: " + detail::take_h5_error());
    }
    std::sort(block.regions.begin(), block.regions.end(),
              [](const detail::DataRegion& a, const detail::DataRegion& b) { return a.path < b.path; });
    // Read back: every dataset's bytes on disk must be the bytes in memory.
    detail::Fd fd{::open(tmp.c_str(), O_RDWR | O_CLOEXEC)};
    if (fd.fd < 0) throw Error("cannot reopen: " + std::string(std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0) throw Error("cannot stat: " + std::string(std::strerror(errno)));
    block.file_bytes = static_cast<std::uint64_t>(st.st_size);
    const std::vector<detail::Segment> segments = detail::file_segments(block);
    const std::vector<std::uint32_t> crcs = detail::combine_segment_pieces(
        detail::scan_segments(fd.fd, tmp, block_bytes, block.file_bytes, segments), segments);
    for (std::size_t s = 0; s < segments.size(); ++s) {
      if (segments[s].region < 0) continue;
      const detail::DataRegion& r = block.regions[static_cast<std::size_t>(segments[s].region)];
      if (crcs[s] != r.crc) throw Error("read-back: " + r.path + " does not hold the values it was given");
    }
    block.file_crc = detail::whole_file_crc(detail::encode_integrity_block(block), segments, crcs);
    const std::string encoded = detail::encode_integrity_block(block);
    if (::pwrite(fd.fd, encoded.data(), encoded.size(), 0) != static_cast<ssize_t>(encoded.size()))
      throw Error("writing the integrity block failed: " + std::string(std::strerror(errno)));
    detail::durable_rename(tmp, final_path);
  } catch (const Error& e) {
    unlink_quietly(tmp);
    throw Error("dynamic checkpoint '" + final_path + "': save failed: " + e.message());
  }
  result.file_bytes = block.file_bytes;
  for (const auto& h : heads) result.content_checksums.push_back(h.content_checksum);
  return result;
}

DynamicSaveResult write_dynamic_checkpoint(const std::string& dir, std::int64_t global_step,
                                           const std::vector<DynamicTableState>& tables) {
  return detail::write_dynamic_file(dir + "/" + dynamic_file_name(global_step), global_step, tables, true);
}

// ---- parallel writer (every rank of a communicator writes its own rows) ------------------------

namespace {

using detail::SaveRanks;

// Collective: the message of the lowest rank whose `local` is non-empty, on every rank ("" when
// none), naming that rank by `names` (its rank of the save when `names` lacks it).
std::string first_error(SaveRanks& comm, const std::string& local, const std::vector<std::string>& names) {
  const auto [first, message] = comm.first_error(local);
  if (first < 0) return {};
  const std::string who = static_cast<std::size_t>(first) < names.size()
                              ? names[static_cast<std::size_t>(first)]
                              : "rank " + std::to_string(first) + " of " + std::to_string(comm.size());
  return who + ": " + message;
}

template <typename E>
void agree_or_throw(SaveRanks& comm, const std::string& local, const std::vector<std::string>& names) {
  const std::string message = first_error(comm, local, names);
  if (!message.empty()) throw E(message);
}

// What one rank writes of one dataset: rows [first, first + count) of its first dimension.
struct Piece {
  std::uint64_t first = 0, count = 0;
  const void* data = nullptr;
  std::uint64_t bytes = 0;
};

// The description of a table every rank must agree on (not its rows or counters).
std::string table_shape_text(const DynamicTableState& t, bool counts) {
  return t.name + "|" + to_string(t.kind) + "|" + std::to_string(t.dim) + "|" + t.optimizer + "|" +
         join(t.slot_names, ',') + "|" + std::to_string(t.sketch_width) + "|" + std::to_string(t.parent_step) + "|" +
         std::to_string(t.parent_checksum) + "|" + (counts ? "counts" : "") + "\n";
}

// "" when `owns` accepts every id of `t` (its rows and its evicted ids), else what is wrong.
std::string foreign_id(const DynamicTableState& t, const std::function<bool(std::int64_t)>& owns) {
  for (std::size_t i = 0; i < t.ids.size(); ++i)
    if (!owns(t.ids[i]))
      return "dynamic table '" + t.name + "': id " + std::to_string(t.ids[i]) + " (row " + std::to_string(i) +
             ") belongs to another rank's shard";
  for (const std::int64_t id : t.evicted_ids)
    if (!owns(id))
      return "dynamic table '" + t.name + "': evicted id " + std::to_string(id) + " belongs to another rank's shard";
  return "";
}

}  // namespace

DynamicSaveResult write_dynamic_checkpoint(MPI_Comm comm, const std::string& dir, std::int64_t global_step,
                                           const std::vector<DynamicTableState>& shards,
                                           const DynamicParallelOptions& options) {
  return write_dynamic_checkpoint(*comm::make_mpi_group(comm), dir, global_step, shards, options);
}

DynamicSaveResult write_dynamic_checkpoint(comm::Group& group, const std::string& dir, std::int64_t global_step,
                                           const std::vector<DynamicTableState>& shards,
                                           const DynamicParallelOptions& options) {
  SaveRanks comm(group, options.timeout_s, "dynamic checkpoint save");
  const int rank = comm.rank(), size = comm.size();
  const auto& names = options.rank_names;
  const std::string final_path = dir + "/" + dynamic_file_name(global_step);
  const std::string tmp = final_path + ".tmp";
  const std::string failed = "dynamic checkpoint '" + final_path + "': save failed: ";

  // ---- 1. every shard valid, and every rank holding the same tables -----------------------------
  std::string local;
  if (global_step < 0) local = "global step " + std::to_string(global_step) + " is negative";
  std::set<std::string> seen;
  std::vector<std::uint8_t> has_counts(shards.size(), 0);
  for (std::size_t i = 0; i < shards.size() && local.empty(); ++i) {
    const DynamicTableState& t = shards[i];
    try {
      validate_table(t);
      if (t.sketch_sparse) bad_table(t, "a shard carries its whole sketch (sketch_sparse is for the file's table)");
    } catch (const ConfigError& e) {
      local = e.message();
    }
    if (local.empty() && !seen.insert(t.name).second) local = "table '" + t.name + "' is given twice";
    if (local.empty() && options.owns) local = foreign_id(t, options.owns);
    has_counts[i] = t.update_counts.empty() ? 0 : 1;
  }
  // The MPI-IO hints of the open in step 4, refused before anything is written.
  std::vector<MpiIoHint> hints;
  if (local.empty()) {
    try {
      hints = detail::process_mpiio_hints();
    } catch (const ConfigError& e) {
      local = e.message();
    }
  }
  agree_or_throw<ConfigError>(comm, local, names);
  agree_or_throw<ConfigError>(comm,
                              comm.same_on_every_rank(format_mpiio_hints(hints))
                                  ? ""
                                  : std::string(kMpiIoHintsVar) + " differs between the ranks of the save",
                              names);
  comm.allreduce(has_counts, SaveRanks::Op::kMax);
  std::string shape;
  for (std::size_t i = 0; i < shards.size(); ++i) shape += table_shape_text(shards[i], has_counts[i] != 0);
  const bool same = comm.same_on_every_rank(shape);
  agree_or_throw<ConfigError>(comm,
                              same ? "" : "the ranks hold different tables (names, kinds, dims, slots, sketch widths or "
                                          "parent links differ)",
                              names);

  // ---- 2. the runs, the tables' totals, and the whole sketches (on rank 0) -------------------------
  const std::size_t nt = shards.size();
  std::vector<std::int64_t> counts_mine(2 * nt);
  for (std::size_t i = 0; i < nt; ++i) {
    counts_mine[2 * i] = static_cast<std::int64_t>(shards[i].ids.size());
    counts_mine[2 * i + 1] = static_cast<std::int64_t>(shards[i].evicted_ids.size());
  }
  const std::vector<std::int64_t> counts_all = comm.allgather(counts_mine);
  const auto run = [&](std::size_t table, int r, int which) {
    return static_cast<std::uint64_t>(counts_all[static_cast<std::size_t>(r) * 2 * nt + 2 * table + which]);
  };
  constexpr std::size_t kSums = 1 + std::size(kCounters);  // total_rows, counters
  std::vector<std::int64_t> sums(nt * kSums), clocks(nt);
  for (std::size_t i = 0; i < nt; ++i) {
    sums[i * kSums] = shards[i].total_rows;
    for (std::size_t c = 0; c < std::size(kCounters); ++c) sums[i * kSums + 1 + c] = shards[i].counters.*kCounters[c].member;
    clocks[i] = shards[i].clock;
  }
  comm.allreduce(sums, SaveRanks::Op::kSum);
  comm.allreduce(clocks, SaveRanks::Op::kMax);
  // heads: the file's tables without rows (rank 0: with the whole or changed sketch).
  std::vector<DynamicTableState> heads(nt);
  DynamicSaveResult result;
  result.path = final_path;
  if (rank == 0) result.sketches.resize(nt);
  for (std::size_t i = 0; i < nt; ++i) {
    const DynamicTableState& t = shards[i];
    DynamicTableState& h = heads[i];
    h.name = t.name;
    h.kind = t.kind;
    h.dim = t.dim;
    h.optimizer = t.optimizer;
    h.slot_names = t.slot_names;
    h.sketch_width = t.sketch_width;
    h.parent_step = t.parent_step;
    h.parent_checksum = t.parent_checksum;
    h.clock = clocks[i];
    h.total_rows = sums[i * kSums];
    for (std::size_t c = 0; c < std::size(kCounters); ++c) h.counters.*kCounters[c].member = sums[i * kSums + 1 + c];
    // Sketches add cell by cell, saturating at 65535 (as the shards' union does): summed in 32
    // bits, which cannot overflow for fewer than 65537 ranks.
    std::vector<std::uint32_t> sum(t.sketch.begin(), t.sketch.end());
    comm.reduce_to_root(sum, SaveRanks::Op::kSum);
    if (rank != 0) sum.clear();
    std::vector<std::int64_t> form{0, 0};  // sparse, cells
    if (rank == 0) {
      h.sketch.resize(sum.size());
      for (std::size_t c = 0; c < sum.size(); ++c) h.sketch[c] = static_cast<std::uint16_t>(std::min<std::uint32_t>(sum[c], 0xffff));
      result.sketches[i] = h.sketch;
      if (h.kind == DynamicKind::kDelta && i < options.parent_sketches.size())
        sparsify_sketch(h, options.parent_sketches[i]);
      form[0] = h.sketch_sparse ? 1 : 0;
      form[1] = static_cast<std::int64_t>(h.sketch_cells.size());
    }
    comm.broadcast(form, 0);
    if (rank != 0) {
      h.sketch_sparse = form[0] != 0;
      h.sketch_cells.assign(static_cast<std::size_t>(form[1]), 0);  // shapes only: rank 0 writes them
      h.sketch.assign(h.sketch_sparse ? static_cast<std::size_t>(form[1]) : t.sketch.size(), 0);
    }
  }

  // ---- 3. datasets at their full shapes, this rank's pieces, and their CRC-32s ----------------------
  // Rows and evicted ids: rank r's at the sum of the lower ranks' counts. The sketch and row_runs:
  // rank 0's alone.
  const bool runs = size > 1;
  std::vector<std::vector<Dataset>> ds(nt);
  std::vector<std::vector<Piece>> pieces(nt);
  std::vector<std::vector<std::int64_t>> run_tables(nt);
  std::vector<std::vector<std::uint32_t>> zero_counts(nt);  // a rank whose rows have no counts writes 0s
  std::vector<std::uint64_t> crc_mine;  // (crc, bytes) per dataset of every table, in order
  for (std::size_t i = 0; i < nt; ++i) {
    const DynamicTableState& t = shards[i];
    std::uint64_t n = 0, e = 0, row_at = 0, evicted_at = 0;
    for (int r = 0; r < size; ++r) {
      if (r == rank) {
        row_at = n;
        evicted_at = e;
      }
      n += run(i, r, 0);
      e += run(i, r, 1);
      run_tables[i].push_back(static_cast<std::int64_t>(run(i, r, 0)));
      run_tables[i].push_back(static_cast<std::int64_t>(run(i, r, 1)));
    }
    const bool counts = has_counts[i] != 0;
    if (counts && t.update_counts.empty()) zero_counts[i].assign(t.ids.size(), 0);
    DynamicTableState shape = heads[i];  // for expected_datasets: dims from totals, data from the shard
    ds[i] = expected_datasets(shape, n, e, counts, runs ? static_cast<std::uint64_t>(size) : 0);
    const auto dim = static_cast<std::uint64_t>(t.dim);
    const std::uint64_t mine_rows = t.ids.size(), mine_evicted = t.evicted_ids.size();
    for (std::size_t k = 0; k < ds[i].size(); ++k) {
      Dataset& d = ds[i][k];
      Piece p;
      if (d.rel == "ids") p = {row_at, mine_rows, t.ids.data(), 8 * mine_rows};
      else if (d.rel == "values") p = {row_at, mine_rows, t.values.data(), 4 * mine_rows * dim};
      else if (d.rel == "stamps") p = {row_at, mine_rows, t.stamps.data(), 8 * mine_rows};
      else if (d.rel == "update_counts")
        p = {row_at, mine_rows, t.update_counts.empty() ? zero_counts[i].data() : t.update_counts.data(), 4 * mine_rows};
      else if (d.rel.rfind("slots/", 0) == 0) p = {row_at, mine_rows, t.slots[k - 3].data(), 4 * mine_rows * dim};
      else if (d.rel == "evicted_ids") p = {evicted_at, mine_evicted, t.evicted_ids.data(), 8 * mine_evicted};
      else if (rank == 0 && d.rel == "row_runs") p = {0, d.dims[0], run_tables[i].data(), d.bytes};
      else if (rank == 0 && (d.rel == "sketch" || d.rel == "sketch_values")) p = {0, d.dims[0], heads[i].sketch.data(), d.bytes};
      else if (rank == 0 && d.rel == "sketch_cells") p = {0, d.dims[0], heads[i].sketch_cells.data(), d.bytes};
      pieces[i].push_back(p);
      crc_mine.push_back(p.bytes == 0 ? 0 : detail::crc32_update(0, p.data, static_cast<std::size_t>(p.bytes)));
      crc_mine.push_back(p.bytes);
    }
  }
  const std::vector<std::uint64_t> crc_all = comm.allgather(crc_mine);
  std::vector<std::string> paths;
  for (std::size_t i = 0, at = 0; i < nt; ++i) {
    std::vector<std::string> lines;
    for (auto& d : ds[i]) {
      std::uint32_t crc = 0;
      std::uint64_t bytes = 0;
      for (int r = 0; r < size; ++r) {
        const std::size_t x = static_cast<std::size_t>(r) * crc_mine.size() + at;
        crc = detail::crc32_combine(crc, static_cast<std::uint32_t>(crc_all[x]), crc_all[x + 1]);
        bytes += crc_all[x + 1];
      }
      if (bytes != d.bytes)  // the ranks' pieces must tile the dataset; they do unless a rank lied
        throw Error(failed + "the ranks' pieces of dynamic/" + heads[i].name + "/" + d.rel + " hold " +
                    std::to_string(bytes) + " bytes, the dataset " + std::to_string(d.bytes));
      d.crc = crc;
      lines.push_back(dataset_line(d));
      paths.push_back("dynamic/" + heads[i].name + "/" + d.rel);
      at += 2;
    }
    const std::string text = detail::dynamic_table_text(heads[i], lines);
    heads[i].content_checksum = detail::crc32_update(0, text.data(), text.size());
    result.content_checksums.push_back(heads[i].content_checksum);
  }
  std::vector<const DynamicTableState*> sorted;
  for (const auto& h : heads) sorted.push_back(&h);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  const int version = runs ? kRunsVersion : kOneRunVersion;
  const std::string manifest = root_manifest(global_step, sorted, version);
  const std::uint64_t block_bytes = detail::integrity_block_bytes(paths);
  detail::IntegrityBlock block;
  block.block_bytes = block_bytes;
  block.global_step = global_step;

  try {
    // ---- 4. HDF5: the file's metadata, then each rank's rows, independently ----------------------
    {
      // The HDF5 lock, where this rank writes a file: without MPI-IO only rank 0 does, and the
      // others (threads of its process) must not wait for the lock it holds across the agreements.
      std::optional<detail::QuietErrors> quiet;
      if (comm.parallel() || rank == 0) quiet.emplace();
      H5Id file, dxpl;
      std::vector<std::vector<H5Id>> dsets(nt);  // closed before `file` (declared after it)
      std::vector<std::uint64_t> offsets;  // of every dataset, in table and dataset order
      try {
        // Parallel: every rank's file; otherwise rank 0's alone (the others' stays empty).
        file = comm.create_file(tmp, block_bytes, hints);
        if (file.get() >= 0) {
          write_root(file.get(), version, global_step, manifest);
          const H5Id dcpl = dataset_creation();
          for (std::size_t i = 0; i < nt; ++i) {
            dsets[i] = create_table(file.get(), heads[i], heads[i].content_checksum, ds[i], dcpl.get());
            for (std::size_t k = 0; k < ds[i].size(); ++k)
              offsets.push_back(data_offset(dsets[i][k].get(), ds[i][k], heads[i]));
          }
          dxpl = comm.piece_transfer();
        }
      } catch (const Error& e) {
        local = "creating " + tmp + " failed: " + e.message();
      }
      agree_or_throw<Error>(comm, local, names);
      offsets.resize(paths.size());
      if (!comm.parallel()) comm.broadcast(offsets, 0);  // the read-back's ranges below need them
      for (std::size_t i = 0, at = 0; i < nt; ++i)
        for (std::size_t k = 0; k < ds[i].size(); ++k, ++at)
          block.regions.push_back({paths[at], offsets[at], ds[i][k].bytes, ds[i][k].crc});

      // What this rank writes: its own pieces, and without MPI-IO on rank 0 every rank's (each
      // sends its own, described by (table, dataset, first, count, bytes) and followed by their
      // bytes, in one message).
      struct Write {
        std::size_t table, dataset;
        Piece piece;
      };
      std::vector<Write> writes;
      for (std::size_t i = 0; i < nt; ++i)
        for (std::size_t k = 0; k < ds[i].size(); ++k)
          if (pieces[i][k].bytes > 0) writes.push_back({i, k, pieces[i][k]});
      std::vector<std::string> blobs;
      std::string wrote;
      if (!comm.parallel()) {
        std::string blob;
        for (const Write& w : writes) {
          const std::uint64_t head[5] = {w.table, w.dataset, w.piece.first, w.piece.count, w.piece.bytes};
          blob.append(reinterpret_cast<const char*>(head), sizeof head);
          blob.append(static_cast<const char*>(w.piece.data), static_cast<std::size_t>(w.piece.bytes));
        }
        blobs = comm.gather_blobs(rank == 0 ? std::string() : std::move(blob));
        if (rank != 0) writes.clear();
        for (std::size_t r = 1; r < blobs.size() && wrote.empty(); ++r) {
          // Read only within the message and the dataset it names (rows within its dimension).
          const std::string& b = blobs[r];
          for (std::size_t at = 0; at < b.size();) {
            std::uint64_t head[5];
            if (b.size() - at < sizeof head) {
              wrote = "rank " + std::to_string(r) + " sent a torn piece";
              break;
            }
            std::memcpy(head, b.data() + at, sizeof head);
            at += sizeof head;
            const bool fits = head[0] < nt && head[1] < ds[head[0]].size() &&
                              head[2] <= ds[head[0]][head[1]].dims[0] &&
                              head[3] <= ds[head[0]][head[1]].dims[0] - head[2] && head[4] <= b.size() - at &&
                              head[4] <= ds[head[0]][head[1]].bytes;
            if (!fits) {
              wrote = "rank " + std::to_string(r) + " sent a piece that does not fit its dataset";
              break;
            }
            writes.push_back({head[0], head[1], Piece{head[2], head[3], b.data() + at, head[4]}});
            at += head[4];
          }
        }
      }
      try {
        // Test hook (STRATA_TEST_DYNAMIC_WRITE_FAIL_RANK=r): rank r of the save fails its write as
        // a full disk would, after the file was created, so a test sees one rank fail mid-write.
        // Anything but a whole non-negative number fails the save naming the variable (never a
        // silent rank 0, as atoi's 0 for garbage would be).
        if (const char* fail = std::getenv("STRATA_TEST_DYNAMIC_WRITE_FAIL_RANK"); fail != nullptr && *fail != 0) {
          char* end = nullptr;
          errno = 0;
          const long r = std::strtol(fail, &end, 10);
          if (errno != 0 || end == fail || *end != 0 || r < 0)
            throw ConfigError("STRATA_TEST_DYNAMIC_WRITE_FAIL_RANK='" + std::string(fail) + "' is not a rank number");
          if (r == rank) throw Error("injected write failure (test hook)");
        }
        for (std::size_t x = 0; x < writes.size() && wrote.empty(); ++x) {
          const Write& w = writes[x];
          const Dataset& d = ds[w.table][w.dataset];
          const Piece& p = w.piece;
          std::vector<hsize_t> start(d.dims.size(), 0), count(d.dims.begin(), d.dims.end());
          start[0] = p.first;
          count[0] = p.count;
          const hid_t dset = dsets[w.table][w.dataset].get();
          H5Id fspace(STRATA_CHECK_H5(H5Dget_space(dset)), H5Sclose);
          STRATA_CHECK_H5(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
          H5Id mspace(STRATA_CHECK_H5(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)), H5Sclose);
          if (H5Dwrite(dset, elem_memory_type(d.elem), mspace.get(), fspace.get(), dxpl.get(), p.data) < 0)
            throw Error("writing its rows of dynamic/" + heads[w.table].name + "/" + d.rel + " failed: " +
                        detail::take_h5_error());
        }
      } catch (const Error& e) {
        wrote = "writing " + tmp + " failed: " + e.message();
      }
      // Every rank closes (collective), whatever its writes did.
      const std::string write_error = first_error(comm, wrote, names);
      for (auto& v : dsets) v.clear();
      const herr_t closed = file.close();
      if (!write_error.empty()) throw Error(write_error);
      agree_or_throw<Error>(comm, closed < 0 ? "closing " + tmp + " failed: " + detail::take_h5_error() : "", names);
    }

    // ---- 5. read-back: each rank CRCs an equal share of the file; rank 0 checks and seals it -------
    std::uint64_t file_bytes = 0;
    if (rank == 0) {
      struct stat st {};
      if (::stat(tmp.c_str(), &st) != 0) local = "stat '" + tmp + "' failed: " + std::strerror(errno);
      file_bytes = static_cast<std::uint64_t>(st.st_size);
    }
    agree_or_throw<Error>(comm, local, names);
    {
      std::vector<std::uint64_t> b{file_bytes};
      comm.broadcast(b, 0);
      file_bytes = b[0];
    }
    block.file_bytes = file_bytes;
    std::sort(block.regions.begin(), block.regions.end(),
              [](const detail::DataRegion& a, const detail::DataRegion& b) { return a.path < b.path; });
    std::vector<detail::Segment> segments;
    std::vector<std::uint64_t> got_mine;  // (segment, begin, end, crc) per piece
    try {
      segments = detail::file_segments(block);
      const std::uint64_t span = file_bytes - block_bytes;
      const auto share = [&](int r) { return block_bytes + span * static_cast<std::uint64_t>(r) / static_cast<std::uint64_t>(size); };
      if (share(rank + 1) > share(rank)) {
        detail::Fd fd{detail::open_regular_file(tmp)};
        for (const auto& p : detail::scan_segments(fd.fd, tmp, share(rank), share(rank + 1), segments))
          got_mine.insert(got_mine.end(), {p.segment, p.begin, p.end, p.crc});
      }
    } catch (const Error& e) {
      local = "reading back " + tmp + " failed: " + e.message();
    }
    agree_or_throw<Error>(comm, local, names);
    const std::vector<std::uint64_t> got = comm.gather(got_mine);
    if (rank == 0) {
      try {
        std::vector<detail::SegmentPiece> pieces_back;
        for (std::size_t x = 0; x + 3 < got.size(); x += 4)
          pieces_back.push_back({got[x], got[x + 1], got[x + 2], static_cast<std::uint32_t>(got[x + 3])});
        const std::vector<std::uint32_t> crcs = detail::combine_segment_pieces(std::move(pieces_back), segments);
        for (std::size_t sg = 0; sg < segments.size(); ++sg) {
          if (segments[sg].region < 0) continue;
          const detail::DataRegion& r = block.regions[static_cast<std::size_t>(segments[sg].region)];
          if (crcs[sg] != r.crc) throw Error("read-back: " + r.path + " does not hold the values it was given");
        }
        block.file_crc = detail::whole_file_crc(detail::encode_integrity_block(block), segments, crcs);
        const std::string encoded = detail::encode_integrity_block(block);
        detail::Fd fd{::open(tmp.c_str(), O_WRONLY | O_CLOEXEC)};
        if (fd.fd < 0) throw Error("cannot reopen: " + std::string(std::strerror(errno)));
        if (::pwrite(fd.fd, encoded.data(), encoded.size(), 0) != static_cast<ssize_t>(encoded.size()))
          throw Error("writing the integrity block failed: " + std::string(std::strerror(errno)));
        // ---- 6. publish: fsync, rename, fsync the directory ------------------------------------------
        detail::durable_rename(tmp, final_path);
      } catch (const Error& e) {
        local = e.message();
      }
    }
    agree_or_throw<Error>(comm, local, names);
  } catch (const Error& e) {
    if (rank == 0) unlink_quietly(tmp);
    throw Error(failed + e.message());
  }
  result.file_bytes = block.file_bytes;
  return result;
}

// ---- reader ------------------------------------------------------------------------------------

DynamicCheckpointFile read_dynamic_checkpoint(const std::string& path, bool with_data) {
  detail::QuietErrors quiet;
  DynamicCheckpointFile out;
  out.path = path;
  const std::string prefix = "dynamic checkpoint '" + path + "': ";
  try {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw ConfigError("does not exist");
    const detail::IntegrityBlock block = verify_raw(path);
    out.file_bytes = block.file_bytes;
    std::map<std::string, const detail::DataRegion*> regions;
    for (const auto& r : block.regions) regions[r.path] = &r;
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) throw Hdf5Error("HDF5 cannot open it: " + detail::take_h5_error());
    H5Id file(f, H5Fclose);
    if (!detail::has_attr(f, "dynamic_format_version"))
      throw ConfigError("not a dynamic checkpoint (no dynamic_format_version attribute)");
    const std::int64_t version = detail::read_attr_i64(f, "dynamic_format_version");
    if (version < 1 || version > kDynamicFormatVersion)
      throw ConfigError("has dynamic_format_version " + std::to_string(version) + "; this strata reads 1 to " +
                        std::to_string(kDynamicFormatVersion));
    out.global_step = detail::read_attr_i64(f, "global_step");
    if (out.global_step != block.global_step)
      throw Error("the integrity block is for global step " + std::to_string(block.global_step) +
                  ", the global_step attribute says " + std::to_string(out.global_step));
    if (detail::read_attr_string(f, "checksum_algorithm") != "crc32") throw Error("checksum_algorithm is not crc32");
    if (object_type(f, "dynamic") != H5O_TYPE_GROUP) throw Error("no /dynamic group");
    H5Id top(STRATA_CHECK_H5(H5Gopen2(f, "/dynamic", H5P_DEFAULT)), H5Gclose);
    std::size_t seen = 0;
    for (const auto& [name, hard] : links_of(top.get(), block.regions.size(), "/dynamic")) {
      if (!hard || !valid_name(name, false) || object_type(top.get(), name) != H5O_TYPE_GROUP)
        throw Error("/dynamic/" + name + " is not a table group");
      out.tables.push_back(read_table(f, out.global_step, static_cast<int>(version), name, with_data, regions, seen));
    }
    if (seen != block.regions.size())
      throw Error("the integrity block lists " + std::to_string(block.regions.size()) + " datasets, the tables have " +
                  std::to_string(seen));
    std::vector<const DynamicTableState*> sorted;
    for (const auto& t : out.tables) sorted.push_back(&t);
    const std::string manifest = root_manifest(out.global_step, sorted, static_cast<int>(version));
    const std::uint64_t stored = detail::read_attr_u64(f, "metadata_checksum");
    if (stored != detail::crc32_update(0, manifest.data(), manifest.size()))
      throw Error("metadata checksum mismatch (a root attribute or the table list is not what was written)");
  } catch (const ConfigError& e) {
    throw ConfigError(prefix + e.message());
  } catch (const Hdf5Error& e) {
    throw Hdf5Error(prefix + e.message());
  } catch (const Error& e) {
    throw Error(prefix + e.message());
  }
  return out;
}

// ---- merge, chains, compaction -----------------------------------------------------------------

namespace {

DynamicTableState filtered(DynamicTableState t, const std::function<bool(std::int64_t)>& keep) {
  if (!keep) return t;
  const auto dim = static_cast<std::size_t>(t.dim);
  std::size_t w = 0;
  for (std::size_t i = 0; i < t.ids.size(); ++i) {
    if (!keep(t.ids[i])) continue;
    if (w != i) {
      t.ids[w] = t.ids[i];
      t.stamps[w] = t.stamps[i];
      if (!t.update_counts.empty()) t.update_counts[w] = t.update_counts[i];
      std::copy_n(t.values.begin() + static_cast<std::ptrdiff_t>(i * dim), dim,
                  t.values.begin() + static_cast<std::ptrdiff_t>(w * dim));
      for (auto& s : t.slots)
        std::copy_n(s.begin() + static_cast<std::ptrdiff_t>(i * dim), dim,
                    s.begin() + static_cast<std::ptrdiff_t>(w * dim));
    }
    ++w;
  }
  t.ids.resize(w);
  t.stamps.resize(w);
  if (!t.update_counts.empty()) t.update_counts.resize(w);
  t.values.resize(w * dim);
  for (auto& s : t.slots) s.resize(w * dim);
  return t;
}

DynamicTableState merge(const DynamicTableState& base, const DynamicTableState& delta, bool check_rows) {
  const std::string what = "dynamic table '" + delta.name + "': ";
  if (base.kind != DynamicKind::kFull || delta.kind != DynamicKind::kDelta)
    throw Error(what + "merge needs a full base and a delta");
  if (base.name != delta.name || base.dim != delta.dim || base.optimizer != delta.optimizer ||
      base.slot_names != delta.slot_names)
    throw Error(what + "the delta's name, dim, optimizer or slots differ from its base's");
  const auto dim = static_cast<std::size_t>(base.dim);
  DynamicTableState out;
  out.name = base.name;
  out.dim = base.dim;
  out.optimizer = base.optimizer;
  out.slot_names = base.slot_names;
  out.slots.resize(base.slots.size());
  // Counts when either side has them; rows of a side without them (an older file) count 0.
  const bool counts = !base.update_counts.empty() || !delta.update_counts.empty();
  auto take = [&](const DynamicTableState& from, std::size_t i) {
    out.ids.push_back(from.ids[i]);
    out.stamps.push_back(from.stamps[i]);
    if (counts) out.update_counts.push_back(from.update_counts.empty() ? 0 : from.update_counts.at(i));
    out.values.insert(out.values.end(), from.values.begin() + static_cast<std::ptrdiff_t>(i * dim),
                      from.values.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
    for (std::size_t k = 0; k < out.slots.size(); ++k)
      out.slots[k].insert(out.slots[k].end(), from.slots[k].begin() + static_cast<std::ptrdiff_t>(i * dim),
                          from.slots[k].begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
  };
  std::size_t i = 0, j = 0, e = 0;
  while (i < base.ids.size() || j < delta.ids.size()) {
    if (j == delta.ids.size() || (i < base.ids.size() && base.ids[i] < delta.ids[j])) {
      const std::int64_t id = base.ids[i];
      while (e < delta.evicted_ids.size() && delta.evicted_ids[e] < id) ++e;
      if (!(e < delta.evicted_ids.size() && delta.evicted_ids[e] == id)) take(base, i);
      ++i;
    } else {
      if (i < base.ids.size() && base.ids[i] == delta.ids[j]) ++i;  // replaced
      take(delta, j++);
    }
  }
  out.clock = delta.clock;
  out.sketch_width = delta.sketch_width;
  if (delta.sketch_sparse) {
    // The parent's whole sketch with the delta's changed counters.
    if (base.sketch.size() != static_cast<std::size_t>(kSketchDepth * delta.sketch_width) ||
        delta.sketch.size() != delta.sketch_cells.size())
      throw Error(what + "the delta's sketch cells do not fit its base's sketch (" + std::to_string(base.sketch.size()) +
                  " counters, the delta's width is " + std::to_string(delta.sketch_width) + ")");
    out.sketch = base.sketch;
    for (std::size_t c = 0; c < delta.sketch_cells.size(); ++c) {
      const std::int64_t cell = delta.sketch_cells[c];
      if (cell < 0 || static_cast<std::size_t>(cell) >= out.sketch.size())
        throw Error(what + "sketch cell " + std::to_string(cell) + " is outside the sketch");
      out.sketch[static_cast<std::size_t>(cell)] = delta.sketch[c];
    }
  } else {
    out.sketch = delta.sketch;
  }
  out.counters = delta.counters;
  out.total_rows = static_cast<std::int64_t>(out.ids.size());
  if (check_rows && out.total_rows != delta.total_rows)
    throw Error(what + "base and delta give " + std::to_string(out.total_rows) + " rows, the delta says " +
                std::to_string(delta.total_rows) + " (the delta does not belong to this base)");
  return out;
}

bool is_regular(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

bool sparsify_sketch(DynamicTableState& delta, const std::vector<std::uint16_t>& parent_sketch) {
  if (delta.kind != DynamicKind::kDelta || delta.sketch_sparse || delta.sketch_width == 0 ||
      parent_sketch.size() != delta.sketch.size())
    return false;
  std::vector<std::int64_t> cells;
  std::vector<std::uint16_t> values;
  // 10 bytes per changed counter (index and value) against 2 per counter for the whole sketch.
  const std::size_t limit = delta.sketch.size() / 5;
  for (std::size_t c = 0; c < delta.sketch.size(); ++c) {
    if (delta.sketch[c] == parent_sketch[c]) continue;
    if (cells.size() >= limit) return false;
    cells.push_back(static_cast<std::int64_t>(c));
    values.push_back(delta.sketch[c]);
  }
  delta.sketch_cells = std::move(cells);
  delta.sketch = std::move(values);
  delta.sketch_sparse = true;
  return true;
}

DynamicTableState merge_dynamic_delta(const DynamicTableState& base, const DynamicTableState& delta) {
  return merge(base, delta, true);
}

std::vector<std::int64_t> list_dynamic_checkpoints(const std::string& dir) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 12 || name.compare(0, 8, "dynamic-") != 0 || name.compare(name.size() - 3, 3, ".h5") != 0)
      continue;
    const std::string digits = name.substr(8, name.size() - 11);
    if (digits.empty() || digits.size() > 18 || (digits.size() > 1 && digits[0] == '0') ||
        !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      continue;
    if (!is_regular(entry.path().string())) continue;
    steps.push_back(std::stoll(digits));
  }
  if (ec) throw Error("dynamic checkpoints: cannot list '" + dir + "': " + ec.message());
  std::sort(steps.begin(), steps.end());
  return steps;
}

namespace {

// What stat(2) says of a file, to the nanosecond: while all of it is unchanged, so is the file,
// provided the file had settled before it was verified (see VerifiedHeaders).
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
  bool operator==(const FileIdentity& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns;
  }
};

std::optional<FileIdentity> identity_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  auto ns = [](const timespec& t) { return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; };
  return FileIdentity{st.st_dev, st.st_ino, st.st_size, ns(st.st_mtim), ns(st.st_ctim)};
}

std::int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::atomic<std::uint64_t> g_header_verifications{0};

// Headers of dynamic files verified by this process, kept across calls: retention plans the
// chains of every kept step at every save, and reading each kept file whole each time would make a
// save cost the whole retained history. Thread-safe (a mutex).
//
// An entry is used only while the file's identity (device, inode, size, mtime, ctime) is the one
// seen around its verification. A rewrite in place within one timestamp tick of the write before
// it could keep that identity, so a file is remembered only when both its times were at least
// kSettledNs older than the moment its verification began: any change after that moment stamps a
// later time, which differs. A fresh file is therefore read whole at each plan until it settles.
// Failures are never remembered. A restore still verifies every byte it reads.
class VerifiedHeaders {
 public:
  static VerifiedHeaders& instance() {
    static VerifiedHeaders headers;
    return headers;
  }

  std::pair<std::optional<DynamicCheckpointFile>, std::string> header(const std::string& path) {
    const std::optional<FileIdentity> before = identity_of(path);
    if (before) {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = entries_.find(path);
      if (it != entries_.end() && it->second.first == *before) return {it->second.second, ""};
    }
    const std::int64_t started = wall_clock_ns();
    std::pair<std::optional<DynamicCheckpointFile>, std::string> out;
    g_header_verifications.fetch_add(1, std::memory_order_relaxed);
    try {
      out.first = read_dynamic_checkpoint(path, false);
    } catch (const Error& e) {
      out.second = e.message();
      return out;
    }
    const std::optional<FileIdentity> after = identity_of(path);
    std::lock_guard<std::mutex> lock(mutex_);
    if (before && after && *before == *after && std::max(after->mtime_ns, after->ctime_ns) + kSettledNs <= started) {
      if (entries_.size() >= kMaxEntries) entries_.clear();
      entries_[path] = {*after, *out.first};
    } else {
      entries_.erase(path);
    }
    return out;
  }

 private:
  static constexpr std::int64_t kSettledNs = 2'000'000'000;  // above any common filesystem's tick
  static constexpr std::size_t kMaxEntries = 4096;
  std::mutex mutex_;
  std::map<std::string, std::pair<FileIdentity, DynamicCheckpointFile>> entries_;
};

// The verified headers of the dynamic files of one directory, each looked up at most once per
// plan (VerifiedHeaders reads a file whole, to verify its CRC-32s, only when it has not seen it
// settled and unchanged before).
class HeaderCache {
 public:
  explicit HeaderCache(std::string dir) : dir_(std::move(dir)), steps_(list_dynamic_checkpoints(dir_)) {}
  const std::string& dir() const { return dir_; }
  const std::vector<std::int64_t>& steps() const { return steps_; }
  std::string path(std::int64_t step) const { return dir_ + "/" + dynamic_file_name(step); }
  // The file's header (tables without data), or why it cannot be read.
  const std::pair<std::optional<DynamicCheckpointFile>, std::string>& header(std::int64_t step) {
    auto it = headers_.find(step);
    if (it != headers_.end()) return it->second;
    auto& slot = headers_[step];
    slot = VerifiedHeaders::instance().header(path(step));
    return slot;
  }

 private:
  std::string dir_;
  std::vector<std::int64_t> steps_;
  std::map<std::int64_t, std::pair<std::optional<DynamicCheckpointFile>, std::string>> headers_;
};

// The chains of one table built from a directory's headers (the rules of FORMAT.md 10.5).
class ChainWalker {
 public:
  ChainWalker(std::string dir, std::string name)
      : own_(std::make_unique<HeaderCache>(std::move(dir))), cache_(own_.get()), name_(std::move(name)) {}
  // Shares `cache` (which must outlive this walker) with other walkers of the same directory.
  ChainWalker(HeaderCache& cache, std::string name) : cache_(&cache), name_(std::move(name)) {}
  const std::vector<std::int64_t>& steps() const { return cache_->steps(); }

  // The chain of the table from `candidate` down to a full base (newest first), or why not.
  std::vector<std::int64_t> chain(std::int64_t candidate, std::string& failure) {
    std::vector<std::int64_t> out;
    std::int64_t step = candidate, child = -1;
    std::optional<std::uint32_t> want;
    for (;;) {
      if (!std::binary_search(steps().begin(), steps().end(), step)) {
        failure = dynamic_file_name(child) + " links to " + dynamic_file_name(step) + ", which is missing";
        return {};
      }
      const auto& h = cache_->header(step);
      if (!h.first) {
        failure = h.second;
        return {};
      }
      const DynamicTableState* t = h.first->find(name_);
      if (t == nullptr) {
        failure = dynamic_file_name(step) + " has no table '" + name_ + "'";
        return {};
      }
      if (want && t->content_checksum != *want) {
        failure = dynamic_file_name(child) + " links to a parent with content checksum " + std::to_string(*want) +
                  ", " + dynamic_file_name(step) + " holds " + std::to_string(t->content_checksum);
        return {};
      }
      out.push_back(step);
      if (t->kind == DynamicKind::kFull) return out;
      want = t->parent_checksum;
      child = step;
      step = t->parent_step;
    }
  }

  std::string path(std::int64_t step) const { return cache_->path(step); }

  std::string warning(std::int64_t step, std::size_t files, const std::vector<std::string>& skipped) const {
    if (skipped.empty()) return "";
    return "dynamic table '" + name_ + "': restored step " + std::to_string(step) + " (" + std::to_string(files) +
           " file(s)), the newest complete state; skipped: " + join(skipped, ';');
  }

  [[noreturn]] void none(std::optional<std::int64_t> at_step, const std::vector<std::string>& skipped) const {
    if (skipped.empty())
      throw ConfigError("dynamic table '" + name_ + "': no dynamic checkpoint in '" + cache_->dir() + "'" +
                        (at_step ? " at or before step " + std::to_string(*at_step) : std::string()));
    throw Error("dynamic table '" + name_ + "': no complete state in '" + cache_->dir() + "': " + join(skipped, ';'));
  }

 private:
  std::unique_ptr<HeaderCache> own_;
  HeaderCache* cache_;
  std::string name_;
};

}  // namespace

std::uint64_t detail::dynamic_header_verifications() {
  return g_header_verifications.load(std::memory_order_relaxed);
}

DynamicRestorePlan plan_dynamic_restore(const std::string& dir, const std::string& name,
                                        std::optional<std::int64_t> at_step) {
  ChainWalker walker(dir, name);
  std::vector<std::string> skipped;
  for (auto c = walker.steps().rbegin(); c != walker.steps().rend(); ++c) {
    if (at_step && *c > *at_step) continue;
    std::string failure;
    const std::vector<std::int64_t> chain = walker.chain(*c, failure);
    if (chain.empty()) {
      skipped.push_back("step " + std::to_string(*c) + ": " + failure);
      continue;
    }
    DynamicRestorePlan plan;
    plan.step = *c;
    for (auto s = chain.rbegin(); s != chain.rend(); ++s) plan.chain.push_back(walker.path(*s));
    plan.warning = walker.warning(*c, chain.size(), skipped);
    return plan;
  }
  walker.none(at_step, skipped);
}

DynamicRestore restore_dynamic_table(const std::string& dir, const std::string& name,
                                     std::optional<std::int64_t> at_step,
                                     const std::function<bool(std::int64_t)>& keep) {
  ChainWalker walker(dir, name);
  std::vector<std::string> skipped;
  for (auto c = walker.steps().rbegin(); c != walker.steps().rend(); ++c) {
    if (at_step && *c > *at_step) continue;
    std::string failure;
    const std::vector<std::int64_t> chain = walker.chain(*c, failure);
    if (chain.empty()) {
      skipped.push_back("step " + std::to_string(*c) + ": " + failure);
      continue;
    }
    // Intact: read the data, base first, and merge forward (the data's own checks may still fail).
    DynamicRestore r;
    try {
      DynamicTableState state;
      for (auto s = chain.rbegin(); s != chain.rend(); ++s) {
        const DynamicCheckpointFile f = read_dynamic_checkpoint(walker.path(*s), true);
        const DynamicTableState* t = f.find(name);
        if (t == nullptr) throw Error(dynamic_file_name(*s) + " has no table '" + name + "'");
        state = s == chain.rbegin() ? filtered(*t, keep) : merge(state, filtered(*t, keep), !keep);
        r.chain.push_back(f.path);
      }
      state.parent_step = -1;
      state.parent_checksum = 0;
      state.evicted_ids.clear();
      state.kind = DynamicKind::kFull;
      state.stored_rows = static_cast<std::int64_t>(state.ids.size());
      r.state = std::move(state);
    } catch (const Error& e) {
      skipped.push_back("step " + std::to_string(*c) + ": " + e.message());
      continue;
    }
    r.step = *c;
    r.warning = walker.warning(*c, chain.size(), skipped);
    return r;
  }
  walker.none(at_step, skipped);
}

DynamicRetention plan_dynamic_retention(const std::string& dir, const std::vector<std::int64_t>& kept_steps,
                                        const std::vector<std::int64_t>& compact_steps) {
  HeaderCache cache(dir);
  const std::vector<std::int64_t>& steps = cache.steps();
  std::set<std::int64_t> needed;
  DynamicRetention out;
  if (kept_steps.empty()) {
    out.needed = steps;  // nothing is kept, so nothing tells which files are unneeded
    return out;
  }
  const std::int64_t newest_kept = *std::max_element(kept_steps.begin(), kept_steps.end());
  // Files newer than every kept step belong to a save that is not committed (or another writer's):
  // not retention's to judge.
  for (const std::int64_t step : steps)
    if (step > newest_kept) needed.insert(step);
  std::set<std::int64_t> kept(kept_steps.begin(), kept_steps.end());
  std::map<std::int64_t, std::set<std::int64_t>> chains;  // kept step whose chains are intact -> their files
  for (const std::int64_t at : kept) {
    // The newest file at or before the kept step: the state a restore at `at` starts from.
    const auto it = std::upper_bound(steps.begin(), steps.end(), at);
    if (it == steps.begin()) continue;  // no tables saved at or before it
    const std::int64_t head = *std::prev(it);
    needed.insert(head);
    std::string broken;
    std::set<std::int64_t> files{head};
    const auto& h = cache.header(head);
    if (!h.first) {
      broken = h.second;
    } else {
      for (const auto& t : h.first->tables) {
        ChainWalker walker(cache, t.name);
        std::string failure;
        const std::vector<std::int64_t> chain = walker.chain(head, failure);
        if (chain.empty()) {
          broken = failure;
          break;
        }
        files.insert(chain.begin(), chain.end());
      }
    }
    if (!broken.empty()) {
      // A restore at `at` falls back to some older state (FORMAT.md 10.5): keep every candidate.
      for (auto s = steps.begin(); s != it; ++s) needed.insert(*s);
      out.notes.push_back("step " + std::to_string(at) + ": " + dynamic_file_name(head) +
                          " has no intact chain (" + broken + "); every older dynamic file is kept");
      continue;
    }
    needed.insert(files.begin(), files.end());
    if (head == at) chains[at] = std::move(files);
  }
  // Compaction candidates: a delta no other kept step's chain runs through (its content may then
  // change) whose rewriting as a full state frees at least one older file.
  for (const std::int64_t c : std::set<std::int64_t>(compact_steps.begin(), compact_steps.end())) {
    const auto mine = chains.find(c);
    if (mine == chains.end() || mine->second.size() < 2) continue;
    bool pinned = false, frees = false;
    for (const auto& [other, files] : chains) pinned = pinned || (other != c && files.count(c) > 0);
    for (const std::int64_t a : mine->second) {
      if (a == c) continue;
      bool used = false;
      for (const auto& [other, files] : chains) used = used || (other != c && files.count(a) > 0);
      frees = frees || !used;
    }
    if (!pinned && frees) out.compactable.push_back(c);
  }
  for (const std::int64_t step : steps) (needed.count(step) ? out.needed : out.unneeded).push_back(step);
  return out;
}

DynamicPrune prune_dynamic_checkpoints(const std::string& dir, const std::vector<std::int64_t>& kept_steps,
                                       const std::vector<std::int64_t>& compact_steps) {
  DynamicPrune out;
  out.plan = plan_dynamic_retention(dir, kept_steps, compact_steps);
  if (!out.plan.compactable.empty()) {
    // Each rewritten whole (atomically, by rename), then the plan again: its older links are
    // unneeded now. A crash in between leaves them, and the next prune removes them.
    for (const std::int64_t step : out.plan.compactable) {
      const DynamicCheckpointFile head = read_dynamic_checkpoint(dir + "/" + dynamic_file_name(step), false);
      std::vector<DynamicTableState> full;
      for (const auto& t : head.tables) {
        DynamicRestore r = restore_dynamic_table(dir, t.name, step);
        if (r.step != step) throw Error(r.warning);
        full.push_back(std::move(r.state));
      }
      write_dynamic_checkpoint(dir, step, full);
      out.compacted.push_back(dynamic_file_name(step));
    }
    std::vector<std::string> notes = std::move(out.plan.notes);
    out.plan = plan_dynamic_retention(dir, kept_steps);
    out.plan.notes = std::move(notes);
  }
  for (const std::int64_t step : out.plan.unneeded) {
    const std::string name = dynamic_file_name(step);
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno != ENOENT) out.not_removed.push_back(name + ": " + std::strerror(errno));
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      out.not_removed.push_back(name + ": it is " + detail::file_kind(st.st_mode) + ", not a regular file");
      continue;
    }
    // unlink(2) never follows a link and never removes a directory, should the name change
    // between the lstat and here.
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      out.not_removed.push_back(name + ": " + std::strerror(errno));
      continue;
    }
    out.removed.push_back(name);
  }
  return out;
}

DynamicSaveResult compact_dynamic_checkpoints(const std::string& dir, std::optional<std::int64_t> at_step,
                                              bool remove_ancestors) {
  const std::vector<std::int64_t> steps = list_dynamic_checkpoints(dir);
  if (steps.empty()) throw ConfigError("dynamic checkpoints: nothing to compact in '" + dir + "'");
  const std::int64_t step = at_step.value_or(steps.back());
  if (step != steps.back())
    throw ConfigError("dynamic checkpoints: compaction rewrites only the newest file (" +
                      dynamic_file_name(steps.back()) + "); newer deltas link to the content of " +
                      dynamic_file_name(step));
  const DynamicCheckpointFile head = read_dynamic_checkpoint(dir + "/" + dynamic_file_name(step), false);
  std::vector<DynamicTableState> full;
  std::set<std::string> ancestors;
  for (const auto& t : head.tables) {
    DynamicRestore r = restore_dynamic_table(dir, t.name, step);
    if (r.step != step) throw Error(r.warning);
    full.push_back(std::move(r.state));
    ancestors.insert(r.chain.begin(), r.chain.end() - 1);
  }
  DynamicSaveResult result = write_dynamic_checkpoint(dir, step, full);
  if (remove_ancestors)
    for (const auto& path : ancestors)
      if (is_regular(path)) unlink_quietly(path);
  return result;
}

}  // namespace strata::checkpoint
