// Anonymous 2 MiB-aligned mappings and their huge pages (mapped_memory.h has the contract).
#include "ps/mapped_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <utility>

namespace strata::ps {
namespace {

constexpr std::size_t kSmallPage = 4096;
// MADV_COLLAPSE (Linux 6.1): glibc 2.36's <sys/mman.h> does not name it yet. An older kernel
// answers EINVAL, which collapse() reports as a refusal like any other.
constexpr int kMadvCollapse = 25;

std::size_t round_up(std::size_t x, std::size_t to) { return (x + to - 1) / to * to; }

}  // namespace

MappedMemory::MappedMemory(std::size_t bytes, Huge huge) {
  if (bytes == 0 || bytes > (std::size_t{1} << 62)) throw std::bad_alloc();
  const std::size_t size = round_up(bytes, kSmallPage);
  // Over-map by 2 MiB and unmap the ends, so the mapping starts on a 2 MiB boundary (a huge page
  // can only back an aligned block).
  const std::size_t span = size + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHugePageBytes - 1) & ~(std::uintptr_t{kHugePageBytes} - 1);
  const std::size_t head = aligned - start, tail = span - head - size;
  if (head > 0) munmap(raw, head);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  data_ = reinterpret_cast<std::byte*>(aligned);
  size_ = size;
  // A refusal (THP compiled out or `never`) leaves ordinary pages: the contract is speed only.
  if (huge == Huge::kAtFault) (void)madvise(data_, size_, MADV_HUGEPAGE);
}

MappedMemory::~MappedMemory() {
  if (data_) munmap(data_, size_);
}

MappedMemory::MappedMemory(MappedMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedMemory& MappedMemory::operator=(MappedMemory&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

bool MappedMemory::collapse(std::size_t offset, std::size_t bytes) noexcept {
  if (!data_ || offset >= size_) return false;
  const std::size_t end = offset + std::min(bytes, size_ - offset);
  const std::size_t first = round_up(offset, kHugePageBytes), last = end / kHugePageBytes * kHugePageBytes;
  if (last <= first) return false;
  return madvise(data_ + first, last - first, kMadvCollapse) == 0;
}

std::int64_t huge_page_bytes(const std::vector<MemoryRange>& ranges) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  std::int64_t total = 0;
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long long a = 0, b = 0;
    // A mapping's first line: "start-end perms offset dev inode [path]" (hex addresses); the lines
    // after it are "Field: value" until the next mapping.
    if (std::sscanf(line.c_str(), "%llx-%llx ", &a, &b) == 2 && line.find(':') > line.find(' ')) {
      inside = false;
      for (const MemoryRange& r : ranges) {
        const auto lo = reinterpret_cast<std::uintptr_t>(r.start);
        inside |= r.bytes > 0 && a < lo + r.bytes && lo < b;
      }
      continue;
    }
    long long kb = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %lld kB", &kb) == 1) total += kb * 1024;
  }
  return total;
}

}  // namespace strata::ps
