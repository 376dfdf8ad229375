// Anonymous memory straight from the kernel, aligned to 2 MiB, for the large arrays a parameter
// server reads at random (a dynamic table's index and row store, dynamic_table.cc): where the
// kernel has transparent huge pages, such memory can be backed by 2 MiB pages, so that one TLB
// entry covers 2 MiB instead of 4 KiB and a random access stops costing a page walk.
//
// Speed is the whole contract: every request for huge pages may be refused (THP set to `never`,
// no free 2 MiB block, a kernel before 6.1 for collapse()), and the memory then works the same on
// 4 KiB pages. Nothing here logs or throws for a refusal.
//
// Memory: a mapping takes physical memory only for the 4 KiB pages touched, until a 2 MiB block
// is backed by a huge page, which takes the whole block. So the two ways to get huge pages:
//   * Huge::kAtFault (madvise MADV_HUGEPAGE before any touch): each 2 MiB block gets a huge page at
//     its first touch. Only for memory the owner fills entirely (an index), since one byte
//     touched backs 2 MiB. The tail of a mapping that is not a whole 2 MiB block stays on 4 KiB
//     pages (the kernel maps huge pages only inside a mapping), so nothing beyond `size()` is
//     ever backed.
//   * collapse() of a block the owner has filled (a row store, which grows): the kernel copies its
//     4 KiB pages into one huge page (MADV_COLLAPSE, synchronous). A block half used is never
//     collapsed, so a small or growing store holds no more memory than on 4 KiB pages.
//
// Thread-safety: none; one owner. Move-only; the destructor unmaps and never throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::ps {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

class MappedMemory {
 public:
  enum class Huge {
    kNo,       // 4 KiB pages unless collapse() is asked
    kAtFault,  // huge pages at first touch (memory the owner fills entirely; see above)
  };

  MappedMemory() = default;
  // Maps `bytes` (> 0, rounded up to 4 KiB) of zero-filled memory at a 2 MiB boundary.
  // std::bad_alloc when the kernel refuses the mapping (as new[] would fail).
  MappedMemory(std::size_t bytes, Huge huge);
  ~MappedMemory();
  MappedMemory(MappedMemory&& other) noexcept;
  MappedMemory& operator=(MappedMemory&& other) noexcept;
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }  // bytes mapped (a multiple of 4 KiB); 0 when empty

  // Asks the kernel to back the 2 MiB blocks that lie wholly inside [offset, offset + bytes) with
  // huge pages now (MADV_COLLAPSE). True when it did; false when it refused or there is no such
  // block. The contents are unchanged either way.
  bool collapse(std::size_t offset, std::size_t bytes) noexcept;

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// A range of memory: start and bytes.
struct MemoryRange {
  const void* start;
  std::size_t bytes;
};
// Bytes that the kernel backs with huge pages now (AnonHugePages in /proc/self/smaps) in the
// mappings that overlap any of `ranges`, each mapping counted once; -1 when smaps cannot be read.
// The kernel merges neighbouring anonymous mappings into one, so this may include memory beside
// the ranges. Reads a file: for tests and benchmarks, never a hot path.
std::int64_t huge_page_bytes(const std::vector<MemoryRange>& ranges);

}  // namespace strata::ps
