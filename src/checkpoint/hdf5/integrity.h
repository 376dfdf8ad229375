// Private: what makes a version-2 checkpoint impossible to read silently wrong (FORMAT.md
// sections 3 and 4). No HDF5 and no MPI in here, so the reader can judge a file before HDF5
// parses a byte of it, and the writer can use the same code on every rank.
//
//  * The integrity block: the file's HDF5 user block (bytes [0, block_bytes), which HDF5 and
//    every HDF5 tool skip) holds a header, the whole-file CRC-32 and a table of the byte range
//    and CRC-32 of every dataset's raw data. The whole-file CRC-32 covers every byte of the file,
//    the block itself included, with its own 4 bytes read as zero.
//  * The manifest: a canonical text serialisation of every attribute and of the variable table a
//    restore uses; its CRC-32 is the root attribute `metadata_checksum`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::checkpoint::detail {

inline constexpr char kIntegrityMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'K'};
inline constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
inline constexpr std::uint32_t kIntegrityLayout = 1;     // version of the block's own layout
inline constexpr std::uint64_t kIntegrityHeaderBytes = 48;
inline constexpr std::uint64_t kFileCrcOffset = 12;      // 4 bytes, little-endian
inline constexpr std::uint64_t kMinBlockBytes = 512;     // HDF5: a power of two >= 512

// One dataset's raw data inside the file (contiguous layout, no filters).
struct DataRegion {
  std::string path;           // "variables/dense/kernel", "slots/dense/kernel/m"
  std::uint64_t offset = 0;   // absolute file offset (0 when bytes == 0)
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;      // CRC-32 of the bytes (from the writer's memory)
};

struct IntegrityBlock {
  std::uint32_t file_crc = 0;
  std::uint64_t file_bytes = 0;
  std::uint64_t block_bytes = 0;
  std::int64_t global_step = 0;
  std::vector<DataRegion> regions;  // in manifest order (sorted by path)
};

// The user-block size for these dataset paths: the smallest power of two >= 512 that holds the
// header and the table.
std::uint64_t integrity_block_bytes(const std::vector<std::string>& dataset_paths);

// Exactly block.block_bytes bytes: header, table, zero padding; the CRC field holds block.file_crc.
std::string encode_integrity_block(const IntegrityBlock& block);

// The header fields only (first kIntegrityHeaderBytes bytes). nullopt when the magic is absent.
// Throws strata::Error naming the inconsistency when the magic is there but the header is not
// plausible (unknown layout, block size not a power of two, ...).
std::optional<IntegrityBlock> decode_integrity_header(const unsigned char* header, std::uint64_t n);
// Header and table from the whole block; throws strata::Error when they are inconsistent.
IntegrityBlock decode_integrity_block(const std::string& bytes);

// A contiguous piece of the file in the scan order: [begin, end), and the table index of the
// dataset whose data it is (-1 for everything else: the block, HDF5 metadata, free space).
struct Segment {
  std::uint64_t begin = 0, end = 0;
  int region = -1;
};
// [block_bytes, file_bytes) cut at every region boundary; throws strata::Error when the regions
// overlap or fall outside it (a damaged table).
std::vector<Segment> file_segments(const IntegrityBlock& block);

// CRC-32 of one segment's intersection with a scanned range.
struct SegmentPiece {
  std::uint64_t segment = 0;
  std::uint64_t begin = 0, end = 0;
  std::uint32_t crc = 0;
};
// Reads [begin, end) of `fd` (pread, bounded buffers, the CRC of one buffer overlapping the read
// of the next) and returns the CRC-32 of its intersection with every segment it touches. Throws
// strata::Error with errno's text, or when the file is shorter than `end`.
std::vector<SegmentPiece> scan_segments(int fd, const std::string& path, std::uint64_t begin, std::uint64_t end,
                                        const std::vector<Segment>& segments);
// Per-segment CRC-32 from pieces that must tile every segment exactly (any order); throws
// strata::Error otherwise.
std::vector<std::uint32_t> combine_segment_pieces(std::vector<SegmentPiece> pieces,
                                                  const std::vector<Segment>& segments);
// The whole-file CRC-32 from the encoded block (its CRC field taken as zero) and the segment CRCs.
std::uint32_t whole_file_crc(const std::string& encoded_block, const std::vector<Segment>& segments,
                             const std::vector<std::uint32_t>& segment_crcs);

// ---- files that may be anything ---------------------------------------------------------------

// "a FIFO", "a directory", "a symbolic link", ... for messages; "a regular file" for S_ISREG.
const char* file_kind(unsigned mode);
// Opens `path` read-only without blocking (a FIFO or a device in place of a checkpoint must not
// hang a reader; O_NONBLOCK changes nothing for regular files) and checks with fstat that it is a
// regular file. Symbolic links are followed (callers that must refuse them check with lstat
// first, as verify_entry() does). Returns the descriptor; throws ConfigError "is not a regular
// file (a FIFO)" or Error with errno's text.
int open_regular_file(const std::string& path);

// An open file descriptor (-1: none), closed on scope exit.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int descriptor) : fd(descriptor) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
};

// ---- manifest ----------------------------------------------------------------------------------

struct ManifestDataset {
  std::string path;   // "variables/..." or "slots/..."
  std::string dtype;  // "f32", "f64", "i64"
  std::vector<std::int64_t> shape;
  std::uint64_t checksum = 0;
  std::optional<std::int64_t> optimizer_step;  // variables: the attribute (0 when absent); slots: none
};
struct Manifest {
  std::int64_t format_version = 0;
  std::int64_t global_step = 0;
  std::uint64_t variable_sequence_hash = 0;
  std::string optimizer;
  std::string training_position;
  std::int64_t created_unix = 0;
  std::string checksum_algorithm;
  std::vector<ManifestDataset> datasets;  // any order; serialised sorted by path
};
// The canonical serialisation (FORMAT.md section 4) and its CRC-32.
std::string manifest_text(const Manifest& manifest);
std::uint32_t manifest_checksum(const Manifest& manifest);

}  // namespace strata::checkpoint::detail
