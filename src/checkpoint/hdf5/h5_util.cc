// HDF5 helpers of the checkpoint backend (see h5_util.h).
#include "checkpoint/hdf5/h5_util.h"

#include <zlib.h>

#include <algorithm>

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

QuietErrors::QuietErrors() {
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

void read_scalar_attr(hid_t obj, const char* name, hid_t mem_t, void* out) {
  if (!has_attr(obj, name))
    throw ConfigError(std::string("checkpoint: missing attribute '") + name + "'");
  H5Id attr(STRATA_CHECK_H5(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  STRATA_CHECK_H5(H5Aread(attr.get(), mem_t, out));
}

}  // namespace

std::int64_t read_attr_i64(hid_t obj, const char* name) {
  std::int64_t v = 0;
  read_scalar_attr(obj, name, H5T_NATIVE_INT64, &v);
  return v;
}
std::uint64_t read_attr_u64(hid_t obj, const char* name) {
  std::uint64_t v = 0;
  read_scalar_attr(obj, name, H5T_NATIVE_UINT64, &v);
  return v;
}

std::string read_attr_string(hid_t obj, const char* name) {
  if (!has_attr(obj, name))
    throw ConfigError(std::string("checkpoint: missing attribute '") + name + "'");
  H5Id attr(STRATA_CHECK_H5(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  H5Id ftype(STRATA_CHECK_H5(H5Aget_type(attr.get())), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING)
    throw ConfigError(std::string("checkpoint: attribute '") + name + "' is not a string");
  if (STRATA_CHECK_H5(H5Tis_variable_str(ftype.get())) > 0) {
    H5Id mtype(STRATA_CHECK_H5(H5Tcopy(H5T_C_S1)), H5Tclose);
    STRATA_CHECK_H5(H5Tset_size(mtype.get(), H5T_VARIABLE));
    STRATA_CHECK_H5(H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get())));
    char* data = nullptr;
    STRATA_CHECK_H5(H5Aread(attr.get(), mtype.get(), &data));
    std::string out = data ? data : "";
    H5free_memory(data);
    return out;
  }
  std::size_t size = H5Tget_size(ftype.get());
  std::string out(size, '\0');
  STRATA_CHECK_H5(H5Aread(attr.get(), ftype.get(), out.data()));
  out.resize(out.find('\0') == std::string::npos ? size : out.find('\0'));
  return out;
}

}  // namespace detail
}  // namespace strata::checkpoint
