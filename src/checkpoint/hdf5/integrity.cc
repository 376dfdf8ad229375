// Integrity block, file scans and the manifest (see integrity.h and FORMAT.md sections 3-4).
#include "checkpoint/hdf5/integrity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <tuple>

#include "checkpoint/hdf5/h5_util.h"
#include "strata/common/error.h"

namespace strata::checkpoint::detail {
namespace {

void put_u32(std::string& out, std::uint64_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(std::string& out, std::uint64_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

constexpr std::uint64_t kEntryFixedBytes = 24;  // offset, bytes, crc, path length
constexpr std::uint64_t kMaxBlockBytes = 1ull << 30;
constexpr std::uint64_t kScanChunk = 8ull << 20;

bool power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// pread exactly n bytes at `offset`, or throw.
void read_exactly(int fd, const std::string& path, unsigned char* out, std::uint64_t n, std::uint64_t offset) {
  while (n > 0) {
    ssize_t got = ::pread(fd, out, static_cast<std::size_t>(std::min<std::uint64_t>(n, 1ull << 30)),
                          static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot read '" + path + "' at offset " + std::to_string(offset) + ": " + std::strerror(errno));
    }
    if (got == 0)
      throw Error("'" + path + "' ends at offset " + std::to_string(offset) + ", before the bytes it should hold");
    out += got;
    offset += static_cast<std::uint64_t>(got);
    n -= static_cast<std::uint64_t>(got);
  }
}

}  // namespace

std::uint64_t integrity_block_bytes(const std::vector<std::string>& dataset_paths) {
  std::uint64_t need = kIntegrityHeaderBytes;
  for (const auto& p : dataset_paths) need += kEntryFixedBytes + p.size();
  std::uint64_t bytes = kMinBlockBytes;
  while (bytes < need) bytes *= 2;
  return bytes;
}

std::string encode_integrity_block(const IntegrityBlock& block) {
  std::string out(static_cast<std::size_t>(block.block_bytes), '\0');
  std::memcpy(out.data(), kIntegrityMagic, 8);
  put_u32(out, 8, kIntegrityLayout);
  put_u32(out, kFileCrcOffset, block.file_crc);
  put_u64(out, 16, block.file_bytes);
  put_u64(out, 24, block.block_bytes);
  put_u64(out, 32, static_cast<std::uint64_t>(block.global_step));
  put_u32(out, 40, static_cast<std::uint32_t>(block.regions.size()));
  std::uint64_t at = kIntegrityHeaderBytes;
  for (const auto& r : block.regions) {
    if (at + kEntryFixedBytes + r.path.size() > out.size())
      throw Error("checkpoint: integrity block of " + std::to_string(block.block_bytes) + " bytes is too small");
    put_u64(out, at, r.offset);
    put_u64(out, at + 8, r.bytes);
    put_u32(out, at + 16, r.crc);
    put_u32(out, at + 20, static_cast<std::uint32_t>(r.path.size()));
    std::memcpy(out.data() + at + kEntryFixedBytes, r.path.data(), r.path.size());
    at += kEntryFixedBytes + r.path.size();
  }
  return out;
}

std::optional<IntegrityBlock> decode_integrity_header(const unsigned char* header, std::uint64_t n) {
  if (n < 8 || std::memcmp(header, kIntegrityMagic, 8) != 0) return std::nullopt;
  if (n < kIntegrityHeaderBytes) throw Error("integrity block cut short (file of " + std::to_string(n) + " bytes)");
  const std::uint32_t layout = get_u32(header + 8);
  if (layout != kIntegrityLayout)
    throw Error("integrity block layout " + std::to_string(layout) + " is unknown (this strata reads " +
                std::to_string(kIntegrityLayout) + ")");
  IntegrityBlock b;
  b.file_crc = get_u32(header + kFileCrcOffset);
  b.file_bytes = get_u64(header + 16);
  b.block_bytes = get_u64(header + 24);
  b.global_step = static_cast<std::int64_t>(get_u64(header + 32));
  const std::uint32_t count = get_u32(header + 40);
  if (!power_of_two(b.block_bytes) || b.block_bytes < kMinBlockBytes || b.block_bytes > kMaxBlockBytes)
    throw Error("integrity block size " + std::to_string(b.block_bytes) + " is not a power of two in [512, 1 GiB]");
  if (b.file_bytes < b.block_bytes)
    throw Error("integrity block says the file has " + std::to_string(b.file_bytes) + " bytes, less than the block");
  if (kIntegrityHeaderBytes + count * kEntryFixedBytes > b.block_bytes)
    throw Error("integrity block lists " + std::to_string(count) + " datasets, more than it can hold");
  if (get_u32(header + 44) != 0) throw Error("integrity block header: reserved field is not zero");
  b.regions.resize(count);
  return b;
}

IntegrityBlock decode_integrity_block(const std::string& bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  auto header = decode_integrity_header(p, bytes.size());
  if (!header) throw Error("no integrity block (magic missing)");
  IntegrityBlock b = std::move(*header);
  if (bytes.size() != b.block_bytes) throw Error("integrity block is cut short");
  std::uint64_t at = kIntegrityHeaderBytes;
  for (auto& r : b.regions) {
    if (at + kEntryFixedBytes > b.block_bytes) throw Error("integrity block table runs past the block");
    r.offset = get_u64(p + at);
    r.bytes = get_u64(p + at + 8);
    r.crc = get_u32(p + at + 16);
    const std::uint64_t len = get_u32(p + at + 20);
    if (at + kEntryFixedBytes + len > b.block_bytes) throw Error("integrity block table runs past the block");
    r.path.assign(bytes.data() + at + kEntryFixedBytes, static_cast<std::size_t>(len));
    at += kEntryFixedBytes + len;
  }
  return b;
}

std::vector<Segment> file_segments(const IntegrityBlock& block) {
  std::vector<std::pair<std::uint64_t, int>> order;  // (offset, region) of non-empty regions
  for (std::size_t i = 0; i < block.regions.size(); ++i)
    if (block.regions[i].bytes > 0) order.emplace_back(block.regions[i].offset, static_cast<int>(i));
  std::sort(order.begin(), order.end());
  std::vector<Segment> out;
  std::uint64_t next = block.block_bytes;
  for (const auto& [offset, i] : order) {
    const DataRegion& r = block.regions[static_cast<std::size_t>(i)];
    if (offset < next || r.bytes > block.file_bytes || offset > block.file_bytes - r.bytes)
      throw Error("the table places the data of " + r.path + " (offset " + std::to_string(offset) + ", " +
                  std::to_string(r.bytes) + " bytes) over other data or outside the file");
    if (offset > next) out.push_back({next, offset, -1});
    out.push_back({offset, offset + r.bytes, i});
    next = offset + r.bytes;
  }
  if (next < block.file_bytes) out.push_back({next, block.file_bytes, -1});
  return out;
}

std::vector<SegmentPiece> scan_segments(int fd, const std::string& path, std::uint64_t begin, std::uint64_t end,
                                        const std::vector<Segment>& segments) {
  std::vector<SegmentPiece> out;
  if (begin >= end) return out;
  auto first = std::upper_bound(segments.begin(), segments.end(), begin,
                                [](std::uint64_t pos, const Segment& s) { return pos < s.end; });
  if (first == segments.end() || first->begin > begin || segments.back().end < end)
    throw Error("scan of '" + path + "': range [" + std::to_string(begin) + "," + std::to_string(end) +
                ") is not covered by the file's segments");
  SegmentPiece cur{static_cast<std::uint64_t>(first - segments.begin()), begin, begin, 0};
  // Runs on at most one helper thread at a time, in file order.
  auto consume = [&](const unsigned char* p, std::uint64_t pos, std::uint64_t n) {
    while (n > 0) {
      const Segment& s = segments[static_cast<std::size_t>(cur.segment)];
      const std::uint64_t take = std::min(n, s.end - pos);
      cur.crc = crc32_update(cur.crc, p, static_cast<std::size_t>(take));
      pos += take;
      p += take;
      n -= take;
      cur.end = pos;
      if (pos == s.end) {
        out.push_back(cur);
        cur = {cur.segment + 1, pos, pos, 0};
      }
    }
  };
  std::vector<unsigned char> buffers[2];
  if (end - begin <= kScanChunk) {
    buffers[0].resize(static_cast<std::size_t>(end - begin));
    read_exactly(fd, path, buffers[0].data(), end - begin, begin);
    consume(buffers[0].data(), begin, end - begin);
  } else {
    // The CRC of chunk k (about as fast as the read) runs on a helper thread while this thread
    // reads chunk k + 1.
    std::future<void> pending;
    int which = 0;
    for (std::uint64_t pos = begin; pos < end;) {
      const std::uint64_t n = std::min(kScanChunk, end - pos);
      std::vector<unsigned char>& buf = buffers[which];
      buf.resize(static_cast<std::size_t>(n));
      try {
        read_exactly(fd, path, buf.data(), n, pos);
      } catch (...) {
        if (pending.valid()) pending.wait();
        throw;
      }
      if (pending.valid()) pending.get();
      pending = std::async(std::launch::async, [&consume, &buf, pos, n] { consume(buf.data(), pos, n); });
      which ^= 1;
      pos += n;
    }
    pending.get();
  }
  if (cur.end > cur.begin) out.push_back(cur);
  return out;
}

std::vector<std::uint32_t> combine_segment_pieces(std::vector<SegmentPiece> pieces,
                                                  const std::vector<Segment>& segments) {
  std::sort(pieces.begin(), pieces.end(), [](const SegmentPiece& a, const SegmentPiece& b) {
    return std::tie(a.segment, a.begin) < std::tie(b.segment, b.begin);
  });
  std::vector<std::uint32_t> crcs(segments.size(), 0);
  std::size_t k = 0;
  for (std::size_t s = 0; s < segments.size(); ++s) {
    std::uint64_t next = segments[s].begin;
    std::uint32_t crc = 0;
    for (; k < pieces.size() && pieces[k].segment == s; ++k) {
      if (pieces[k].begin != next) throw Error("file scan pieces do not tile segment " + std::to_string(s));
      crc = crc32_combine(crc, pieces[k].crc, pieces[k].end - pieces[k].begin);
      next = pieces[k].end;
    }
    if (next != segments[s].end) throw Error("file scan pieces do not cover segment " + std::to_string(s));
    crcs[s] = crc;
  }
  if (k != pieces.size()) throw Error("file scan pieces name unknown segments");
  return crcs;
}

std::uint32_t whole_file_crc(const std::string& encoded_block, const std::vector<Segment>& segments,
                             const std::vector<std::uint32_t>& segment_crcs) {
  std::string zeroed = encoded_block;
  put_u32(zeroed, kFileCrcOffset, 0);
  std::uint32_t crc = crc32_update(0, zeroed.data(), zeroed.size());
  for (std::size_t s = 0; s < segments.size(); ++s)
    crc = crc32_combine(crc, segment_crcs[s], segments[s].end - segments[s].begin);
  return crc;
}

const char* file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symbolic link";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    default: return "not a file";
  }
}

Fd::~Fd() {
  if (fd >= 0) ::close(fd);
}

int open_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open: " + std::string(std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error("cannot stat: " + std::string(std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError(std::string("is not a regular file (") + file_kind(st.st_mode) + ")");
  }
  return fd;
}

// ---- manifest ----------------------------------------------------------------------------------

std::string manifest_text(const Manifest& m) {
  auto str = [](const std::string& s) { return std::to_string(s.size()) + ":" + s; };
  std::string out = "strata checkpoint manifest 1\n";
  out += "format_version " + std::to_string(m.format_version) + "\n";
  out += "global_step " + std::to_string(m.global_step) + "\n";
  out += "variable_sequence_hash " + std::to_string(m.variable_sequence_hash) + "\n";
  out += "optimizer " + str(m.optimizer) + "\n";
  out += "training_position " + str(m.training_position) + "\n";
  out += "created_unix " + std::to_string(m.created_unix) + "\n";
  out += "checksum_algorithm " + str(m.checksum_algorithm) + "\n";
  std::vector<const ManifestDataset*> sorted;
  for (const auto& d : m.datasets) sorted.push_back(&d);
  std::sort(sorted.begin(), sorted.end(), [](const ManifestDataset* a, const ManifestDataset* b) { return a->path < b->path; });
  for (const ManifestDataset* d : sorted) {
    out += "dataset " + str(d->path) + " " + d->dtype + " [";
    for (std::size_t i = 0; i < d->shape.size(); ++i) out += (i ? "," : "") + std::to_string(d->shape[i]);
    out += "] checksum " + std::to_string(d->checksum);
    if (d->optimizer_step) out += " optimizer_step " + std::to_string(*d->optimizer_step);
    out += "\n";
  }
  return out;
}

std::uint32_t manifest_checksum(const Manifest& m) {
  const std::string text = manifest_text(m);
  return crc32_update(0, text.data(), text.size());
}

}  // namespace strata::checkpoint::detail
