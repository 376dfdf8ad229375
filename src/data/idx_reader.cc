// IDX reader (the MNIST file format) and the Fashion-MNIST loader.
//
// An IDX file is a big-endian header, magic = 0x0000 <type> <ndims>, then ndims uint32 sizes, then
// the row-major payload. Only the unsigned-byte type (0x08) is accepted: MNIST-style images
// (0x00000803, [n, rows, cols]) and labels (0x00000801, [n]). Files may be gzip-compressed; the
// whole file is decompressed into memory first (Fashion-MNIST train images: 47 MB), which keeps
// the parsing a bounds-checked walk over one buffer.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "strata/common/error.h"
#include "data/text_util.h"
#include "strata/data/dataset.h"

namespace strata::data {
namespace {

constexpr std::uint32_t kImagesMagic = 0x00000803;
constexpr std::uint32_t kLabelsMagic = 0x00000801;
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 40;

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

bool is_gzip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_file(path, std::string("cannot open: ") + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  in.read(reinterpret_cast<char*>(magic), 2);
  return in.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

std::vector<unsigned char> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_file(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail_file(path, "read error");
  return bytes;
}

// Decompresses a whole gzip file. gzread alone reports a truncated stream only through
// gzerror(), so the error state is checked after the last read, or truncation would pass as EOF.
std::vector<unsigned char> read_gzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) fail_file(path, std::string("cannot open: ") + std::strerror(errno));
  std::vector<unsigned char> bytes;
  std::vector<unsigned char> chunk(1 << 20);
  std::string problem;
  for (;;) {
    const int got = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (got > 0) bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
    int code = Z_OK;
    const char* message = gzerror(file, &code);
    if (got < 0 || (code != Z_OK && code != Z_STREAM_END)) {
      problem = std::string("corrupt or truncated gzip data (zlib: ") +
                (message != nullptr && *message != '\0' ? message : "unknown error") + ")";
      break;
    }
    if (got == 0) break;
  }
  gzclose(file);
  if (!problem.empty()) fail_file(path, problem);
  return bytes;
}

std::vector<unsigned char> read_file(const std::string& path) {
  return is_gzip(path) ? read_gzip(path) : read_raw(path);
}

std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<unsigned char> bytes;  // the whole decompressed file
  std::size_t payload_offset = 0;
};

// Reads one uint8 IDX file with the given magic and checks that its payload size matches the
// header exactly (short: truncated; long: not what the header says, so likely the wrong file).
IdxArray read_idx(const std::string& path, std::uint32_t expected_magic, const char* what) {
  IdxArray a;
  a.bytes = read_file(path);
  const std::size_t ndims = expected_magic & 0xFF;
  if (a.bytes.size() < 4) fail_file(path, "truncated: " + std::to_string(a.bytes.size()) + " bytes, no IDX header");
  const std::uint32_t magic = be32(a.bytes.data());
  if (magic != expected_magic)
    fail_file(path, "bad IDX magic " + hex32(magic) + ", expected " + hex32(expected_magic) + " (" + what + ")");
  a.payload_offset = 4 + 4 * ndims;
  if (a.bytes.size() < a.payload_offset)
    fail_file(path, "truncated: the IDX header needs " + std::to_string(a.payload_offset) + " bytes, the file has " +
                   std::to_string(a.bytes.size()));
  std::uint64_t count = 1;
  std::ostringstream shape;
  for (std::size_t d = 0; d < ndims; ++d) {
    const std::uint32_t dim = be32(a.bytes.data() + 4 + 4 * d);
    a.dims.push_back(dim);
    shape << (d ? " x " : "") << dim;
    // Bounded before multiplying so a corrupt header cannot overflow the element count.
    if (dim != 0 && count > kMaxElements / dim) fail_file(path, "implausible IDX shape " + shape.str() + " ...");
    count *= dim;
  }
  for (std::size_t d = 1; d < ndims; ++d)
    if (a.dims[d] == 0) fail_file(path, "IDX shape " + shape.str() + " has an empty dimension");
  const std::uint64_t payload = a.bytes.size() - a.payload_offset;
  if (payload < count)
    fail_file(path, "truncated: shape " + shape.str() + " needs " + std::to_string(count) + " bytes of data, the file has " +
                   std::to_string(payload));
  if (payload > count)
    fail_file(path, std::to_string(payload - count) + " bytes after the data of shape " + shape.str() +
                   " (not an IDX file of that shape)");
  return a;
}

bool exists(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return static_cast<bool>(in);
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path) {
  const IdxArray images = read_idx(images_path, kImagesMagic, "uint8 images [n, rows, cols]");
  const IdxArray labels = read_idx(labels_path, kLabelsMagic, "uint8 labels [n]");
  if (images.dims[0] != labels.dims[0])
    throw ConfigError(images_path + ": " + std::to_string(images.dims[0]) + " images but " + labels_path + " has " +
                      std::to_string(labels.dims[0]) + " labels");

  Dataset d;
  d.size = images.dims[0];
  d.dense_dim = static_cast<int>(images.dims[1] * images.dims[2]);
  if (static_cast<std::uint64_t>(d.dense_dim) != std::uint64_t{images.dims[1]} * images.dims[2])
    throw ConfigError(images_path + ": images of " + std::to_string(images.dims[1]) + " x " +
                      std::to_string(images.dims[2]) + " pixels are too large");
  d.features.resize(static_cast<std::size_t>(d.size) * static_cast<std::size_t>(d.dense_dim));
  const unsigned char* pixels = images.bytes.data() + images.payload_offset;
  for (std::size_t i = 0; i < d.features.size(); ++i) d.features[i] = static_cast<float>(pixels[i]) / 255.0f;

  d.labels.resize(static_cast<std::size_t>(d.size));
  const unsigned char* label_bytes = labels.bytes.data() + labels.payload_offset;
  int max_label = -1;
  for (std::size_t i = 0; i < d.labels.size(); ++i) {
    d.labels[i] = label_bytes[i];
    max_label = std::max(max_label, static_cast<int>(label_bytes[i]));
  }
  d.num_classes = max_label + 1;
  d.files = {images_path};
  d.file_of.assign(static_cast<std::size_t>(d.size), 0);
  return d;
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string images = prefix + "-images-idx3-ubyte.gz";
  const std::string labels = prefix + "-labels-idx1-ubyte.gz";
  for (const std::string& path : {images, labels})
    if (!exists(path))
      throw ConfigError("Fashion-MNIST file " + path +
                        " is missing: install the Debian package dataset-fashion-mnist (apt-get install "
                        "dataset-fashion-mnist) or pass the directory that holds it");
  Dataset d = load_idx(images, labels);
  const std::int64_t expected = train ? 60000 : 10000;
  if (d.size != expected)
    throw ConfigError(images + ": " + std::to_string(d.size) + " examples, Fashion-MNIST has " +
                      std::to_string(expected));
  if (d.dense_dim != 28 * 28) throw ConfigError(images + ": images are not 28 x 28 pixels");
  if (d.num_classes > 10) throw ConfigError(labels + ": a label is above 9");
  d.num_classes = 10;  // fixed by the dataset, even for a subset missing a class
  return d;
}

}  // namespace strata::data
