// Private helpers of the HDF5 checkpoint backend: identifier ownership, HDF5 error reporting,
// dtype mapping, dataset paths and the CRC-32 checksum (FORMAT.md "Checksums").
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "strata/checkpoint/checkpoint.h"
#include "strata/checkpoint/mpiio_hints.h"
#include "strata/common/error.h"
#include "strata/common/hdf5_lock.h"

namespace strata::checkpoint::detail {

// Throws Hdf5Error: "<expr> failed: <innermost HDF5 error message> (file:line)".
[[noreturn]] void fail_h5(const char* expr, ::strata::detail::SourceLocation where);
// The innermost message of the current HDF5 error stack ("file signature not found (in
// H5F__super_read)"), and clears the stack.
std::string take_h5_error();

// Owns one HDF5 identifier; closing never throws (a failed close only leaks a handle). Files are
// closed explicitly where the close result matters (save: the close flushes the data).
class H5Id {
 public:
  H5Id() = default;
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() { reset(); }
  H5Id(H5Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  // Closes now and reports the result (for H5Fclose, whose failure means lost data).
  herr_t close() {
    herr_t rc = id_ >= 0 ? close_(id_) : 0;
    id_ = -1;
    return rc;
  }
  void reset() {
    if (id_ >= 0) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// A stretch of HDF5 calls: holds the process's HDF5 lock (strata/common/hdf5_lock.h) and
// silences HDF5's automatic error printing (we report the stack ourselves), restoring it at the
// end. Declared before the HDF5 identifiers of a scope, so that they close while it holds.
class QuietErrors {
 public:
  QuietErrors();
  ~QuietErrors();
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  std::lock_guard<std::recursive_mutex> lock_;
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

hid_t file_type(DType dtype);    // little-endian on-disk type
hid_t memory_type(DType dtype);  // native type
// DType of a dataset's type; throws ConfigError naming `what` for anything else.
DType dtype_of(hid_t type, const std::string& what);

// "/variables/<name>" and "/slots/<name>/<slot>".
std::string variable_path(const std::string& name);
std::string slot_path(const std::string& name, const std::string& slot);
// ConfigError unless `name` is a valid '/'-separated variable name (FORMAT.md "Names").
void validate_name(const std::string& name, const char* what);

std::int64_t row_bytes(const VariableMeta& v);  // product(shape[1:]) * dtype_size

// Standard CRC-32 (zlib / IEEE 802.3, = Python zlib.crc32) helpers.
std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t bytes);
std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t bytes_b);

// Scalar attributes on an open object (file or dataset). Writes are collective under mpio.
void write_attr_i64(hid_t obj, const char* name, std::int64_t value);
void write_attr_u64(hid_t obj, const char* name, std::uint64_t value);
void write_attr_i32(hid_t obj, const char* name, std::int32_t value);
void write_attr_string(hid_t obj, const char* name, const std::string& value);  // VL UTF-8
bool has_attr(hid_t obj, const char* name);
// Reads of attributes from files that may have been crafted: each checks that the attribute is
// scalar (an array would overrun the one-element buffer), of the right type class (integer of at
// most 8 bytes, converted by HDF5; or string, fixed or variable length, at most
// kMaxAttrStringBytes) before reading. ConfigError when the attribute is missing; Error naming
// the attribute and what was found otherwise.
inline constexpr std::size_t kMaxAttrStringBytes = 16u << 20;
std::int64_t read_attr_i64(hid_t obj, const char* name);
std::uint64_t read_attr_u64(hid_t obj, const char* name);
std::string read_attr_string(hid_t obj, const char* name);

// Owns one MPI_Info (MPI_INFO_NULL when empty); freed on destruction. HDF5 keeps its own duplicate
// of an info it is given, so this may go as soon as the property list has been set.
class MpiInfo {
 public:
  MpiInfo() = default;
  // An info holding `hints` in order; MPI_INFO_NULL for none. Throws MpiError.
  explicit MpiInfo(const std::vector<MpiIoHint>& hints);
  ~MpiInfo() { reset(); }
  MpiInfo(MpiInfo&& o) noexcept : info_(o.info_) { o.info_ = MPI_INFO_NULL; }
  MpiInfo& operator=(MpiInfo&& o) noexcept {
    if (this != &o) {
      reset();
      info_ = o.info_;
      o.info_ = MPI_INFO_NULL;
    }
    return *this;
  }
  MpiInfo(const MpiInfo&) = delete;
  MpiInfo& operator=(const MpiInfo&) = delete;
  MPI_Info get() const { return info_; }
  void reset() {
    if (info_ != MPI_INFO_NULL) MPI_Info_free(&info_);
    info_ = MPI_INFO_NULL;
  }

 private:
  MPI_Info info_ = MPI_INFO_NULL;
};

// STRATA_MPIIO_HINTS of this process's environment, parsed (parse_mpiio_hints; ConfigError).
std::vector<MpiIoHint> process_mpiio_hints();
// COLLECTIVE over `comm`: whether every rank passed the same `text` (compared by length and
// CRC-32), so that a parallel open is not given different hints on different ranks.
bool same_on_every_rank(MPI_Comm comm, const std::string& text);

// Creates (truncating) `path` for a parallel write: COLLECTIVE over `comm`, MPI-IO with collective
// metadata reads and writes, `hints` on the MPI_Info of the open (STRATA_MPIIO_HINTS, parsed and
// agreed by the caller before anything is written; none: MPI_INFO_NULL, the library's defaults),
// and a user block of `userblock_bytes` in front of HDF5's data (the integrity block). Throws
// Hdf5Error; every rank of `comm` must call it with the same hints.
H5Id create_parallel_file(const std::string& path, MPI_Comm comm, hsize_t userblock_bytes,
                          const std::vector<MpiIoHint>& hints);

}  // namespace strata::checkpoint::detail

// Throws Hdf5Error when an HDF5 call returns a negative value (herr_t or hid_t).
#define STRATA_CHECK_H5(expr)                                                       \
  ([&]() {                                                                          \
    auto strata_h5_rc_ = (expr);                                                    \
    if (strata_h5_rc_ < 0) ::strata::checkpoint::detail::fail_h5(#expr, STRATA_HERE); \
    return strata_h5_rc_;                                                           \
  }())
