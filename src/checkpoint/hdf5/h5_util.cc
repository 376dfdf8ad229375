// HDF5 helpers of the checkpoint backend (see h5_util.h).
#include "checkpoint/hdf5/h5_util.h"

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "strata/common/logging.h"

namespace strata::checkpoint {

std::size_t dtype_size(DType dtype) {
  return dtype == DType::kF32 ? 4 : 8;
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI64: return "i64";
  }
  return "?";
}

namespace detail {
namespace {

// H5E_WALK_UPWARD visits the innermost (most specific) error first.
herr_t collect_innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err != nullptr) {
    auto* text = static_cast<std::string*>(out);
    *text = err->desc ? err->desc : "";
    if (err->func_name) *text += std::string(" (in ") + err->func_name + ")";
  }
  return 0;
}

}  // namespace

std::string take_h5_error() {
  std::string innermost;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_innermost, &innermost);
  H5Eclear2(H5E_DEFAULT);
  return innermost;
}

void fail_h5(const char* expr, ::strata::detail::SourceLocation where) {
  std::string innermost = take_h5_error();
  std::string message = std::string(expr) + " failed";
  if (!innermost.empty()) message += ": " + innermost;
  throw Hdf5Error(message + " (" + ::strata::detail::short_path(where.file) + ":" +
                  std::to_string(where.line) + ")");
}

QuietErrors::QuietErrors() : lock_(hdf5_mutex()) {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}
QuietErrors::~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

hid_t file_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return H5T_IEEE_F32LE;
    case DType::kF64: return H5T_IEEE_F64LE;
    case DType::kI64: return H5T_STD_I64LE;
  }
  return -1;
}

hid_t memory_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return H5T_NATIVE_FLOAT;
    case DType::kF64: return H5T_NATIVE_DOUBLE;
    case DType::kI64: return H5T_NATIVE_INT64;
  }
  return -1;
}

DType dtype_of(hid_t type, const std::string& what) {
  H5T_class_t cls = H5Tget_class(type);
  std::size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT && size == 4) return DType::kF32;
  if (cls == H5T_FLOAT && size == 8) return DType::kF64;
  if (cls == H5T_INTEGER && size == 8 && H5Tget_sign(type) == H5T_SGN_2) return DType::kI64;
  throw ConfigError(what + ": unsupported dataset type (checkpoints hold f32, f64 or i64)");
}

void validate_name(const std::string& name, const char* what) {
  bool ok = !name.empty() && name.front() != '/' && name.back() != '/' &&
            name.find("//") == std::string::npos;
  std::size_t start = 0;
  while (ok && start <= name.size()) {
    std::size_t slash = name.find('/', start);
    std::string part = name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part == "." || part == "..") ok = false;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (!ok)
    throw ConfigError(std::string("checkpoint: invalid ") + what + " name '" + name +
                      "' (non-empty '/'-separated components, no leading/trailing '/', no '.' or '..')");
}

std::string variable_path(const std::string& name) { return "/variables/" + name; }
std::string slot_path(const std::string& name, const std::string& slot) {
  return "/slots/" + name + "/" + slot;
}

std::int64_t row_bytes(const VariableMeta& v) {
  std::int64_t n = static_cast<std::int64_t>(dtype_size(v.dtype));
  for (std::size_t i = 1; i < v.shape.size(); ++i) n *= v.shape[i];
  return n;
}

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (bytes > 0) {
    auto step = static_cast<uInt>(std::min<std::size_t>(bytes, 1u << 30));
    c = ::crc32(c, p, step);
    p += step;
    bytes -= step;
  }
  return static_cast<std::uint32_t>(c);
}

std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t bytes_b) {
  return static_cast<std::uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(bytes_b)));
}

namespace {

void write_scalar_attr(hid_t obj, const char* name, hid_t file_t, hid_t mem_t, const void* value) {
  H5Id space(STRATA_CHECK_H5(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(STRATA_CHECK_H5(H5Acreate2(obj, name, file_t, space.get(), H5P_DEFAULT, H5P_DEFAULT)),
            H5Aclose);
  STRATA_CHECK_H5(H5Awrite(attr.get(), mem_t, value));
}

}  // namespace

void write_attr_i64(hid_t obj, const char* name, std::int64_t value) {
  write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
void write_attr_u64(hid_t obj, const char* name, std::uint64_t value) {
  write_scalar_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}
void write_attr_i32(hid_t obj, const char* name, std::int32_t value) {
  write_scalar_attr(obj, name, H5T_STD_I32LE, H5T_NATIVE_INT32, &value);
}

void write_attr_string(hid_t obj, const char* name, const std::string& value) {
  H5Id type(STRATA_CHECK_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
  STRATA_CHECK_H5(H5Tset_size(type.get(), H5T_VARIABLE));
  STRATA_CHECK_H5(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  const char* data = value.c_str();
  write_scalar_attr(obj, name, type.get(), type.get(), &data);
}

bool has_attr(hid_t obj, const char* name) { return STRATA_CHECK_H5(H5Aexists(obj, name)) > 0; }

namespace {

// "root attribute 'format_version'", "attribute 'checksum' of variables/dense/kernel".
std::string attr_label(hid_t obj, const char* name) {
  char owner[512] = {};
  const ssize_t n = H5Iget_name(obj, owner, sizeof owner);
  H5Eclear2(H5E_DEFAULT);
  const std::string path = n > 1 ? std::string(owner) : "";
  if (path.empty() || path == "/") return std::string("root attribute '") + name + "'";
  return std::string("attribute '") + name + "' of " + (path[0] == '/' ? path.substr(1) : path);
}

std::string class_name(H5T_class_t cls) {
  switch (cls) {
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    case H5T_STRING: return "a string";
    case H5T_COMPOUND: return "a compound";
    case H5T_ARRAY: return "an HDF5 array type";
    case H5T_VLEN: return "a variable-length sequence";
    case H5T_ENUM: return "an enum";
    case H5T_REFERENCE: return "a reference";
    case H5T_OPAQUE: return "an opaque type";
    case H5T_BITFIELD: return "a bitfield";
    case H5T_TIME: return "a time";
    default: return "an unknown type";
  }
}

// An attribute opened for reading, after its dataspace was checked to be scalar and its type
// class to be `want`; `what` names the expectation in messages ("integer", "string"). Every
// read of a checkpoint attribute goes through here: an attribute of another shape would make
// H5Aread write more than one element into a buffer sized for one.
struct ScalarAttr {
  H5Id attr, type;
  std::string label;
};

ScalarAttr open_scalar_attr(hid_t obj, const char* name, H5T_class_t want, const char* what) {
  if (!has_attr(obj, name))
    throw ConfigError(std::string("checkpoint: missing attribute '") + name + "'");
  ScalarAttr a;
  a.label = attr_label(obj, name);
  a.attr = H5Id(STRATA_CHECK_H5(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  a.type = H5Id(STRATA_CHECK_H5(H5Aget_type(a.attr.get())), H5Tclose);
  H5Id space(STRATA_CHECK_H5(H5Aget_space(a.attr.get())), H5Sclose);
  const std::string expected = a.label + " must be a scalar " + what + ", ";
  const H5S_class_t shape = H5Sget_simple_extent_type(space.get());
  if (shape != H5S_SCALAR) {
    if (shape == H5S_NULL) throw Error(expected + "found an empty (null) dataspace");
    const int rank = STRATA_CHECK_H5(H5Sget_simple_extent_ndims(space.get()));
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
    if (rank > 0) STRATA_CHECK_H5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
    std::string extent = "[";
    for (std::size_t i = 0; i < dims.size(); ++i) extent += (i ? "," : "") + std::to_string(dims[i]);
    throw Error(expected + "found an array of shape " + extent + "]");
  }
  const H5T_class_t cls = H5Tget_class(a.type.get());
  if (cls != want) throw Error(expected + "found " + class_name(cls));
  return a;
}

// Integers of 1 to 8 bytes, converted by HDF5 into the native 8-byte type of `mem_t`.
void read_scalar_int(hid_t obj, const char* name, hid_t mem_t, void* out) {
  ScalarAttr a = open_scalar_attr(obj, name, H5T_INTEGER, "integer");
  const std::size_t size = H5Tget_size(a.type.get());
  if (size == 0 || size > 8)
    throw Error(a.label + " must be an integer of at most 8 bytes, found " + std::to_string(size) + " bytes");
  STRATA_CHECK_H5(H5Aread(a.attr.get(), mem_t, out));
}

}  // namespace

std::int64_t read_attr_i64(hid_t obj, const char* name) {
  std::int64_t v = 0;
  read_scalar_int(obj, name, H5T_NATIVE_INT64, &v);
  return v;
}
std::uint64_t read_attr_u64(hid_t obj, const char* name) {
  std::uint64_t v = 0;
  read_scalar_int(obj, name, H5T_NATIVE_UINT64, &v);
  return v;
}

std::string read_attr_string(hid_t obj, const char* name) {
  ScalarAttr a = open_scalar_attr(obj, name, H5T_STRING, "string");
  const std::string too_long = a.label + " is longer than the " + std::to_string(kMaxAttrStringBytes) + " bytes a checkpoint string may hold";
  if (STRATA_CHECK_H5(H5Tis_variable_str(a.type.get())) > 0) {
    H5Id mtype(STRATA_CHECK_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
    STRATA_CHECK_H5(H5Tset_size(mtype.get(), H5T_VARIABLE));
    STRATA_CHECK_H5(H5Tset_cset(mtype.get(), H5Tget_cset(a.type.get())));
    char* data = nullptr;  // one pointer: the dataspace is scalar (checked above)
    STRATA_CHECK_H5(H5Aread(a.attr.get(), mtype.get(), &data));
    const std::size_t length = data ? strnlen(data, kMaxAttrStringBytes + 1) : 0;
    std::string out = length <= kMaxAttrStringBytes && data ? std::string(data, length) : "";
    H5free_memory(data);
    if (length > kMaxAttrStringBytes) throw Error(too_long);
    return out;
  }
  // Fixed length: the stored size bounds the buffer, checked before allocating it.
  const std::size_t size = H5Tget_size(a.type.get());
  if (size == 0) throw Error(a.label + ": string type of size 0");
  if (size > kMaxAttrStringBytes) throw Error(too_long);
  std::string out(size, '\0');
  STRATA_CHECK_H5(H5Aread(a.attr.get(), a.type.get(), out.data()));
  out.resize(out.find('\0') == std::string::npos ? size : out.find('\0'));
  return out;
}

std::vector<MpiIoHint> process_mpiio_hints() {
  const char* text = std::getenv(kMpiIoHintsVar);
  return parse_mpiio_hints(text ? text : "", kMpiIoHintsVar);
}

bool same_on_every_rank(MPI_Comm comm, const std::string& text) {
  // The maximum of a value and of its complement: equal on every rank exactly when the maxima
  // are each other's complements.
  std::uint64_t sig[2] = {crc32_update(0, text.data(), text.size()) | (std::uint64_t{text.size()} << 32), 0};
  sig[1] = ~sig[0];
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, sig, 2, MPI_UINT64_T, MPI_MAX, comm));
  return sig[0] == ~sig[1];
}

MpiInfo::MpiInfo(const std::vector<MpiIoHint>& hints) {
  if (hints.empty()) return;
  STRATA_CHECK_MPI(MPI_Info_create(&info_));
  try {
    for (const auto& h : hints) STRATA_CHECK_MPI(MPI_Info_set(info_, h.key.c_str(), h.value.c_str()));
  } catch (...) {
    reset();  // a constructor that throws runs no destructor
    throw;
  }
}

H5Id create_parallel_file(const std::string& path, MPI_Comm comm, hsize_t userblock_bytes,
                          const std::vector<MpiIoHint>& hints) {
  const H5Id fapl(STRATA_CHECK_H5(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  {
    const MpiInfo info(hints);
    STRATA_CHECK_H5(H5Pset_fapl_mpio(fapl.get(), comm, info.get()));
  }
  STRATA_CHECK_H5(H5Pset_all_coll_metadata_ops(fapl.get(), true));
  STRATA_CHECK_H5(H5Pset_coll_metadata_write(fapl.get(), true));
  const H5Id fcpl(STRATA_CHECK_H5(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
  STRATA_CHECK_H5(H5Pset_userblock(fcpl.get(), userblock_bytes));
  H5Id file(STRATA_CHECK_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get())), H5Fclose);
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  // Lets a user see which hints a job's saves run with (STRATA_LOG_LEVEL=info).
  if (rank == 0 && !hints.empty()) {
    STRATA_LOG(INFO) << "checkpoint: " << path << " created with MPI-IO hints " << format_mpiio_hints(hints);
  }
  return file;
}

}  // namespace detail
}  // namespace strata::checkpoint
