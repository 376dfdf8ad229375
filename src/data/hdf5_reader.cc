// HDF5 reader: an images dataset [n, ...] of any numeric type and a labels dataset [n] of integers.
//
// The file is opened read-only with the default file access property list (sec2 driver). That
// driver performs no MPI calls, so the parallel Debian build of HDF5 works here in a process that
// never called MPI_Init (the unit tests run so). HDF5's automatic error printing is switched off
// for the duration of a load and restored afterwards; failures are reported as one ConfigError
// line that includes the innermost message of HDF5's error stack.
#include <hdf5.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "strata/common/error.h"
#include "strata/common/hdf5_lock.h"
#include "data/text_util.h"
#include "strata/data/dataset.h"

namespace strata::data {
namespace {

constexpr std::int32_t kMaxClasses = 1 << 24;

// Owns one HDF5 identifier; closing never throws (a failed close is only a leaked handle).
class H5Handle {
 public:
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Handle() {
    if (id_ >= 0) close_(id_);
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// Holds the process's HDF5 lock (strata/common/hdf5_lock.h) and silences HDF5's default error
// printer (it would print a multi-line stack to stderr for every expected failure, e.g. a missing
// dataset), restoring the previous handler on exit.
class QuietErrors {
 public:
  QuietErrors() : lock_(hdf5_mutex()) {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  std::lock_guard<std::recursive_mutex> lock_;
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

herr_t take_innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err != nullptr && err->desc != nullptr) *static_cast<std::string*>(out) = err->desc;
  return 0;
}

// The most specific message on HDF5's error stack (walking upward starts at the deepest frame).
std::string hdf5_message() {
  std::string message;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &message);
  H5Eclear2(H5E_DEFAULT);
  return message.empty() ? std::string() : " (HDF5: " + message + ")";
}

std::string shape_string(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

struct Array {
  std::vector<hsize_t> dims;
  H5T_class_t type_class = H5T_NO_CLASS;
};

// Opens a dataset and describes it; the caller reads it with the memory type it needs.
Array describe(const std::string& path, hid_t dataset, const std::string& name) {
  Array a;
  H5Handle space(H5Dget_space(dataset), H5Sclose);
  H5Handle type(H5Dget_type(dataset), H5Tclose);
  if (!space.valid() || !type.valid()) fail_file(path, "cannot query dataset '" + name + "'" + hdf5_message());
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) fail_file(path, "dataset '" + name + "' has no simple dataspace" + hdf5_message());
  a.dims.resize(static_cast<std::size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), a.dims.data(), nullptr);
  a.type_class = H5Tget_class(type.get());
  return a;
}

void read_all(const std::string& path, hid_t dataset, const std::string& name, hid_t memory_type, void* out) {
  if (H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    fail_file(path, "cannot read dataset '" + name + "'" + hdf5_message());
}

}  // namespace

Dataset load_hdf5(const std::string& path, const std::string& images_dataset, const std::string& labels_dataset) {
  if (!std::ifstream(path, std::ios::binary)) fail_file(path, "no such file or not readable");
  QuietErrors quiet;
  if (H5Fis_hdf5(path.c_str()) <= 0) fail_file(path, "not an HDF5 file");
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) fail_file(path, "cannot open read-only" + hdf5_message());

  H5Handle images(H5Dopen2(file.get(), images_dataset.c_str(), H5P_DEFAULT), H5Dclose);
  if (!images.valid()) fail_file(path, "has no dataset '" + images_dataset + "'");
  H5Handle labels(H5Dopen2(file.get(), labels_dataset.c_str(), H5P_DEFAULT), H5Dclose);
  if (!labels.valid()) fail_file(path, "has no dataset '" + labels_dataset + "'");

  const Array image_info = describe(path, images.get(), images_dataset);
  const Array label_info = describe(path, labels.get(), labels_dataset);
  if (image_info.type_class != H5T_INTEGER && image_info.type_class != H5T_FLOAT)
    fail_file(path, "dataset '" + images_dataset + "' is not numeric (integer or float)");
  if (image_info.dims.empty()) fail_file(path, "dataset '" + images_dataset + "' is a scalar, expected [n, ...]");
  if (label_info.type_class != H5T_INTEGER) fail_file(path, "dataset '" + labels_dataset + "' is not of an integer type");
  const bool labels_column = label_info.dims.size() == 2 && label_info.dims[1] == 1;
  if (label_info.dims.size() != 1 && !labels_column)
    fail_file(path, "dataset '" + labels_dataset + "' has shape " + shape_string(label_info.dims) + ", expected [n] or [n, 1]");
  if (image_info.dims[0] != label_info.dims[0])
    fail_file(path, "dataset '" + images_dataset + "' has " + std::to_string(image_info.dims[0]) + " rows but '" +
                   labels_dataset + "' has " + std::to_string(label_info.dims[0]));

  Dataset d;
  d.size = static_cast<std::int64_t>(image_info.dims[0]);
  std::uint64_t dense_dim = 1;
  for (std::size_t i = 1; i < image_info.dims.size(); ++i) dense_dim *= image_info.dims[i];
  if (dense_dim == 0 || dense_dim > (1u << 30))
    fail_file(path, "dataset '" + images_dataset + "' has an unusable shape " + shape_string(image_info.dims));
  d.dense_dim = static_cast<int>(dense_dim);
  d.features.resize(static_cast<std::size_t>(d.size) * dense_dim);
  d.labels.resize(static_cast<std::size_t>(d.size));
  // HDF5 converts any integer or float file type to the memory type on read.
  if (d.size > 0) {
    read_all(path, images.get(), images_dataset, H5T_NATIVE_FLOAT, d.features.data());
    read_all(path, labels.get(), labels_dataset, H5T_NATIVE_INT32, d.labels.data());
  }
  std::int32_t max_label = -1;
  for (std::size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] < 0)
      fail_file(path, "dataset '" + labels_dataset + "' has the negative label " + std::to_string(d.labels[i]) +
                     " at row " + std::to_string(i));
    // HDF5 clips out-of-range values when converting to int32; a huge label is a wrong dataset.
    if (d.labels[i] >= kMaxClasses)
      fail_file(path, "dataset '" + labels_dataset + "' has the label " + std::to_string(d.labels[i]) + " at row " +
                     std::to_string(i) + ", above the limit of " + std::to_string(kMaxClasses) + " classes");
    max_label = std::max(max_label, d.labels[i]);
  }
  d.num_classes = max_label + 1;
  d.files = {path};
  d.file_of.assign(static_cast<std::size_t>(d.size), 0);
  return d;
}

}  // namespace strata::data
