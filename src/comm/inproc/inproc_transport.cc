// The in-process transport (inproc_transport.h).
#include "comm/inproc/inproc_transport.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "strata/common/error.h"
#include "strata/common/logging.h"

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer's dynamic annotations (its runtime defines them): accesses between Begin and End
// on this thread are not recorded; synchronisation still is.
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

namespace strata::comm::inproc {
namespace {

// One-sided access to another rank's memory (see the header on ThreadSanitizer).
class RemoteAccess {
 public:
  RemoteAccess() {
#if defined(__SANITIZE_THREAD__)
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
#endif
  }
  ~RemoteAccess() {
#if defined(__SANITIZE_THREAD__)
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  }
  RemoteAccess(const RemoteAccess&) = delete;
  RemoteAccess& operator=(const RemoteAccess&) = delete;
};

constexpr std::size_t kAlign = 64;

template <typename T, typename Bits>
void atomic_add_float(void* at, T value) {
  static_assert(sizeof(T) == sizeof(Bits));
  auto* word = static_cast<Bits*>(at);
  Bits old_bits = __atomic_load_n(word, __ATOMIC_RELAXED);
  while (true) {
    T old_value;
    std::memcpy(&old_value, &old_bits, sizeof old_value);
    const T sum = old_value + value;
    Bits new_bits;
    std::memcpy(&new_bits, &sum, sizeof new_bits);
    if (__atomic_compare_exchange_n(word, &old_bits, new_bits, true, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) return;
  }
}

// Adds `count` elements of `type` from `src` into `dst`, each element atomically, with release
// ordering (what a peer that acquires a counter bumped after it relies on).
void atomic_accumulate(void* dst, const void* src, std::size_t count, ElemType type) {
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  switch (type) {
    case ElemType::kF32:
      for (std::size_t i = 0; i < count; ++i) {
        float v;
        std::memcpy(&v, in + 4 * i, 4);
        atomic_add_float<float, std::uint32_t>(out + 4 * i, v);
      }
      return;
    case ElemType::kF64:
      for (std::size_t i = 0; i < count; ++i) {
        double v;
        std::memcpy(&v, in + 8 * i, 8);
        atomic_add_float<double, std::uint64_t>(out + 8 * i, v);
      }
      return;
    case ElemType::kI64:
      for (std::size_t i = 0; i < count; ++i) {
        std::int64_t v;
        std::memcpy(&v, in + 8 * i, 8);
        __atomic_fetch_add(reinterpret_cast<std::int64_t*>(out + 8 * i), v, __ATOMIC_ACQ_REL);
      }
      return;
  }
  throw Error("accumulate: element type " + std::to_string(static_cast<int>(type)) + " does not exist");
}

class InprocRegion final : public Region {
 public:
  InprocRegion(Group& group, std::size_t local_bytes) : group_(group), local_bytes_(local_bytes) {
    // Every region is at least one cache line, aligned, zero-filled: a base that is never null and
    // never shares a line with another rank's region.
    const std::size_t alloc = std::max(kAlign, (local_bytes + kAlign - 1) / kAlign * kAlign);
    base_ = static_cast<char*>(std::aligned_alloc(kAlign, alloc));
    if (!base_) throw Error("in-process transport: cannot allocate a region of " + std::to_string(local_bytes) + " bytes");
    std::memset(base_, 0, alloc);
    struct Entry {
      std::uint64_t base;
      std::uint64_t bytes;
    };
    const Entry mine{reinterpret_cast<std::uintptr_t>(base_), local_bytes};
    std::vector<Entry> all(static_cast<std::size_t>(group.size()));
    try {
      group.allgather(&mine, sizeof mine, all.data(), Deadline{60, "in-process transport: allocating a region"});
    } catch (...) {
      std::free(base_);
      throw;
    }
    for (const Entry& e : all) {
      bases_.push_back(reinterpret_cast<char*>(static_cast<std::uintptr_t>(e.base)));
      sizes_.push_back(e.bytes);
    }
  }

  ~InprocRegion() override {
    // Collective: no peer may still reach this memory once it is freed. A peer that never comes
    // (it failed) leaves the memory allocated rather than freed under its feet.
    try {
      group_.barrier(Deadline{60, "in-process transport: freeing a region"});
      std::free(base_);
    } catch (const std::exception& e) {
      STRATA_LOG(WARN) << e.what() << "; its memory stays allocated";
    }
  }

  void* local_base() override { return base_; }
  std::size_t local_bytes() const override { return local_bytes_; }
  std::size_t bytes_of(int peer) const override { return static_cast<std::size_t>(sizes_.at(static_cast<std::size_t>(peer))); }

  // The address of `bytes` at `offset` of `peer`'s region, after checking that they lie inside it.
  char* at(int peer, std::uint64_t offset, std::size_t bytes, const char* op) const {
    if (peer < 0 || peer >= static_cast<int>(sizes_.size()))
      throw Error(std::string(op) + ": peer " + std::to_string(peer) + " is not a rank of the transport (size " +
                  std::to_string(sizes_.size()) + ")");
    const std::uint64_t size = sizes_[static_cast<std::size_t>(peer)];
    if (offset + bytes > size || offset + bytes < offset)
      throw Error(std::string(op) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                  ") are outside rank " + std::to_string(peer) + "'s region of " + std::to_string(size) + " bytes");
    return bases_[static_cast<std::size_t>(peer)] + offset;
  }

 private:
  Group& group_;
  std::size_t local_bytes_;
  char* base_ = nullptr;
  std::vector<char*> bases_;
  std::vector<std::uint64_t> sizes_;
};

InprocRegion& as_inproc(Region& region) { return static_cast<InprocRegion&>(region); }

void check_aligned(std::uint64_t offset, std::size_t align, const char* op) {
  if (offset % align != 0)
    throw Error(std::string(op) + ": offset " + std::to_string(offset) + " is not " + std::to_string(align) +
                "-byte aligned");
}

std::int64_t max_row_of(const std::vector<std::int64_t>& rows, const char* op) {
  const std::int64_t lo = *std::min_element(rows.begin(), rows.end());
  if (lo < 0) throw Error(std::string(op) + ": row index " + std::to_string(lo) + " is negative");
  return *std::max_element(rows.begin(), rows.end());
}

class InprocTransport final : public Transport {
 public:
  explicit InprocTransport(Group& group) : group_(group) {}

  const char* name() const override { return "inproc"; }
  std::string describe() const override {
    return "in-process: " + std::to_string(group_.size()) + " thread rank" + (group_.size() == 1 ? "" : "s");
  }
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }

  std::unique_ptr<Region> allocate_region(std::size_t local_bytes) override {
    return std::make_unique<InprocRegion>(group_, local_bytes);
  }

  void get(Region& region, int peer, std::uint64_t offset, void* dst, std::size_t bytes) override {
    const char* src = as_inproc(region).at(peer, offset, bytes, "get");
    RemoteAccess access;
    if (bytes) std::memcpy(dst, src, bytes);
  }

  void put(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes) override {
    char* dst = as_inproc(region).at(peer, offset, bytes, "put");
    RemoteAccess access;
    if (bytes) std::memcpy(dst, src, bytes);
    __atomic_thread_fence(__ATOMIC_RELEASE);
  }

  void accumulate(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t count,
                  ElemType type) override {
    const std::size_t esize = elem_size(type);
    char* dst = as_inproc(region).at(peer, offset, count * esize, "accumulate");
    check_aligned(offset, esize, "accumulate");
    RemoteAccess access;
    atomic_accumulate(dst, src, count, type);
  }

  void get_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_bytes,
                const std::vector<std::int64_t>& rows, void* dst) override {
    if (rows.empty()) return;
    auto& r = as_inproc(region);
    const std::int64_t max_row = max_row_of(rows, "get_rows");
    const char* src = r.at(peer, offset, static_cast<std::size_t>(max_row + 1) * row_bytes, "get_rows");
    auto* out = static_cast<char*>(dst);
    RemoteAccess access;
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::memcpy(out + i * row_bytes, src + static_cast<std::uint64_t>(rows[i]) * row_bytes, row_bytes);
  }

  void accumulate_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_elems, ElemType type,
                       const std::vector<std::int64_t>& rows, const void* src) override {
    if (rows.empty()) return;
    auto& r = as_inproc(region);
    const std::size_t esize = elem_size(type);
    const std::size_t row_bytes = row_elems * esize;
    const std::int64_t max_row = max_row_of(rows, "accumulate_rows");
    char* dst = r.at(peer, offset, static_cast<std::size_t>(max_row + 1) * row_bytes, "accumulate_rows");
    check_aligned(offset, esize, "accumulate_rows");
    const auto* in = static_cast<const char*>(src);
    RemoteAccess access;
    for (std::size_t i = 0; i < rows.size(); ++i)
      atomic_accumulate(dst + static_cast<std::uint64_t>(rows[i]) * row_bytes, in + i * row_bytes, row_elems, type);
  }

  std::uint32_t* shared_word(Region& region, int peer, std::uint64_t offset) override {
    char* p = as_inproc(region).at(peer, offset, sizeof(std::uint32_t), "shared_word");
    check_aligned(offset, alignof(std::uint32_t), "shared_word");
    return reinterpret_cast<std::uint32_t*>(p);
  }

  std::int64_t fetch_add(Region& region, int peer, std::uint64_t offset, std::int64_t value) override {
    char* p = as_inproc(region).at(peer, offset, 8, "fetch_add");
    check_aligned(offset, 8, "fetch_add");
    RemoteAccess access;
    return __atomic_fetch_add(reinterpret_cast<std::int64_t*>(p), value, __ATOMIC_ACQ_REL);
  }

  std::int64_t atomic_read(Region& region, int peer, std::uint64_t offset) override {
    char* p = as_inproc(region).at(peer, offset, 8, "atomic_read");
    check_aligned(offset, 8, "atomic_read");
    RemoteAccess access;
    return __atomic_load_n(reinterpret_cast<std::int64_t*>(p), __ATOMIC_ACQUIRE);
  }

  // Every operation completed in its call; a fence orders this thread's accesses for the caller.
  void flush(Region&, int) override { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
  void flush_all(Region&) override { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
  void sync_local(Region&) override { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
  void progress() override {}
  // Operations do take effect in issue order here, but an ordered peer also promises that a
  // put_notify_get's answer is read after a consumer of the put has handled it and changes no more
  // (strata/comm/transport.h): nothing serves requests in this transport, so no peer is ordered,
  // and callers flush and ring as they do over shared memory.
  bool ordered_to(int) const override { return false; }

 private:
  Group& group_;
};

}  // namespace

std::unique_ptr<Transport> make_inproc_transport(Group& group) {
  return std::make_unique<InprocTransport>(group);
}

}  // namespace strata::comm::inproc
