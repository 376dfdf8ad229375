// The 2 MiB-aligned anonymous mappings under the dynamic table's index and row store
// (src/ps/mapped_memory.h): alignment, zero fill, sizes, moves, and that a collapse the kernel
// accepts is seen in /proc/self/smaps as huge pages with the contents unchanged.
#include "ps/mapped_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <utility>

#include "ps/dynamic_table.h"

namespace strata::ps {
namespace {

bool thp_never() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return !std::getline(f, line) || line.find("[never]") != std::string::npos;
}

TEST(MappedMemory, AlignedZeroFilledRoundedToSmallPagesAndMovable) {
  for (const MappedMemory::Huge huge : {MappedMemory::Huge::kNo, MappedMemory::Huge::kAtFault}) {
    MappedMemory m(kHugePageBytes + 100, huge);
    ASSERT_NE(m.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m.data()) % kHugePageBytes, 0u);
    EXPECT_EQ(m.size(), kHugePageBytes + 4096);
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < m.size(); i += 512) nonzero += m.data()[i] != std::byte{0};
    EXPECT_EQ(nonzero, 0u);
    std::memset(m.data(), 0x5a, m.size());
    std::byte* at = m.data();
    MappedMemory moved(std::move(m));
    EXPECT_EQ(m.data(), nullptr);
    EXPECT_EQ(m.size(), 0u);
    EXPECT_EQ(moved.data(), at);
    EXPECT_EQ(moved.data()[kHugePageBytes + 4095], std::byte{0x5a});
    MappedMemory other(4096, MappedMemory::Huge::kNo);
    other = std::move(moved);
    EXPECT_EQ(other.data(), at);
    EXPECT_FALSE(other.collapse(kHugePageBytes, 4096));  // no whole 2 MiB block in the range
    EXPECT_FALSE(MappedMemory().collapse(0, kHugePageBytes));
  }
  EXPECT_THROW(MappedMemory(0, MappedMemory::Huge::kNo), std::bad_alloc);
  EXPECT_THROW(MappedMemory(~std::size_t{0}, MappedMemory::Huge::kNo), std::bad_alloc);
}

TEST(MappedMemory, ACollapseTheKernelAcceptsShowsAsHugePagesWithTheSameContents) {
  MappedMemory m(3 * kHugePageBytes, MappedMemory::Huge::kNo);
  auto* words = reinterpret_cast<std::uint32_t*>(m.data());
  const std::size_t n = m.size() / 4;
  for (std::size_t i = 0; i < n; ++i) words[i] = static_cast<std::uint32_t>(i * 2654435761u);
  const bool collapsed = m.collapse(0, m.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += words[i] != static_cast<std::uint32_t>(i * 2654435761u);
  EXPECT_EQ(wrong, 0u);
  const std::int64_t huge = huge_page_bytes({{m.data(), m.size()}});
  ASSERT_GE(huge, 0) << "/proc/self/smaps could not be read";
  if (!collapsed) GTEST_SKIP() << "the kernel refused MADV_COLLAPSE here (THP off, a kernel before 6.1, or no free 2 MiB block)";
  EXPECT_GE(huge, static_cast<std::int64_t>(3 * kHugePageBytes));
}

// A table past a few slabs holds huge pages wherever the kernel gives them: checked only when a
// collapse just succeeded, i.e. when this machine hands out huge pages now.
TEST(MappedMemory, ALargeDynamicTableHoldsHugePagesWhereTheKernelGivesThem) {
  if (thp_never()) GTEST_SKIP() << "transparent huge pages are off on this machine";
  MappedMemory probe(kHugePageBytes, MappedMemory::Huge::kNo);
  std::memset(probe.data(), 1, probe.size());
  if (!probe.collapse(0, probe.size())) GTEST_SKIP() << "the kernel refused MADV_COLLAPSE here";
  DynamicTableConfig c;
  c.dim = 16;
  DynamicTable t(c);
  std::vector<std::int64_t> ids(4096);
  std::vector<float> out(ids.size() * 16);
  for (std::int64_t b = 0; b < 16; ++b) {  // 65,536 rows of 144 bytes: 9 MiB, four full slabs
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = b * 4096 + static_cast<std::int64_t>(i);
    t.lookup(ids.data(), ids.size(), out.data());
  }
  EXPECT_GE(t.huge_page_bytes(), static_cast<std::int64_t>(4 * kHugePageBytes));
  DynamicTable small(c);
  small.lookup(ids.data(), 100, out.data());
  EXPECT_GE(small.huge_page_bytes(), 0);
  EXPECT_LT(small.stats().bytes, 64 * 1024) << "a small table holds its pages, not a slab";
}

}  // namespace
}  // namespace strata::ps
