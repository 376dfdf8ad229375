#include "comm/mpi/mpi_rma_transport.h"

#include <algorithm>
#include <cstdint>
#include <climits>
#include <cstring>
#include <exception>

#include "comm/quiet_barrier.h"
#include "strata/common/env.h"
#include "strata/common/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace strata::comm::mpi {
namespace {

// MPI counts are ints: transfers above this are split into chunks.
constexpr std::size_t kMaxChunk = std::size_t{1} << 30;

MPI_Datatype mpi_type(ElemType type) {
  switch (type) {
    case ElemType::kF32: return MPI_FLOAT;
    case ElemType::kF64: return MPI_DOUBLE;
    case ElemType::kI64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

class MpiRegion final : public Region {
 public:
  // `shared`: every rank of `comm` is on this node, so the window is allocated with
  // MPI_Win_allocate_shared and each peer's memory is also reachable through a plain pointer.
  MpiRegion(MPI_Comm comm, std::size_t local_bytes, bool shared) : comm_(comm), local_bytes_(local_bytes) {
    int size = 0;
    STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));
    // Hints: accumulates need no ordering between them (they are sums), and every rank uses byte
    // displacements, which lets osc skip per-target displacement lookups. Shared windows may place
    // each rank's segment on its own pages (and its own NUMA node).
    MPI_Info info;
    STRATA_CHECK_MPI(MPI_Info_create(&info));
    MPI_Info_set(info, "accumulate_ordering", "none");
    MPI_Info_set(info, "same_disp_unit", "true");
    if (shared) MPI_Info_set(info, "alloc_shared_noncontig", "true");
    int rc = shared ? MPI_Win_allocate_shared(static_cast<MPI_Aint>(local_bytes), 1, info, comm, &base_, &win_)
                    : MPI_Win_allocate(static_cast<MPI_Aint>(local_bytes), 1, info, comm, &base_, &win_);
    MPI_Info_free(&info);
    STRATA_CHECK_MPI(rc);
    STRATA_CHECK_MPI(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
    if (local_bytes > 0) std::memset(base_, 0, local_bytes);
    unsigned long long mine = local_bytes;
    sizes_.resize(size);
    STRATA_CHECK_MPI(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, sizes_.data(), 1, MPI_UNSIGNED_LONG_LONG, comm));
    if (shared) {
      peer_base_.resize(size, nullptr);
      for (int p = 0; p < size; ++p) {
        MPI_Aint bytes = 0;
        int disp = 0;
        void* ptr = nullptr;
        STRATA_CHECK_MPI(MPI_Win_shared_query(win_, p, &bytes, &disp, &ptr));
        peer_base_[p] = static_cast<char*>(ptr);
      }
    }
    // Zero-fill must be visible before anyone reads: the barrier orders it, lock_all opens the
    // passive-target epoch for the window's whole life.
    STRATA_CHECK_MPI(MPI_Barrier(comm));
    STRATA_CHECK_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
  }

  bool shared() const { return !peer_base_.empty(); }
  // Direct pointer to `peer`'s segment (shared windows only; nullptr for an empty segment).
  char* peer_base(int peer) const { return shared() ? peer_base_[peer] : nullptr; }

  ~MpiRegion() override {
    // Collective; never throws (a failing MPI here leaves nothing to recover). While an exception
    // unwinds, the peers are not freeing with us: a collective MPI_Win_free would wait forever, so
    // the window is left to the job's abort.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || win_ == MPI_WIN_NULL || std::uncaught_exceptions() > 0) return;
    // Every rank arrives here first without spinning (MPI_Win_free's own barrier spins): the
    // transport's communicator outlives its regions.
    quiet_barrier(comm_);
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
  }

  void* local_base() override { return base_; }
  std::size_t local_bytes() const override { return local_bytes_; }
  std::size_t bytes_of(int peer) const override { return static_cast<std::size_t>(sizes_.at(peer)); }
  MPI_Win win() const { return win_; }

  void check_range(int peer, std::uint64_t offset, std::size_t bytes, const char* op) const {
    if (peer < 0 || peer >= static_cast<int>(sizes_.size()))
      throw Error(std::string(op) + ": peer " + std::to_string(peer) + " is not a rank of the transport (size " +
                  std::to_string(sizes_.size()) + ")");
    if (offset + bytes > sizes_[peer] || offset + bytes < offset)
      throw Error(std::string(op) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                  ") are outside rank " + std::to_string(peer) + "'s region of " + std::to_string(sizes_[peer]) +
                  " bytes");
  }

 private:
  MPI_Comm comm_;  // the owning transport's own duplicate: not owned; freed after its regions
  std::size_t local_bytes_;
  void* base_ = nullptr;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<unsigned long long> sizes_;
  std::vector<char*> peer_base_;
};

MpiRegion& as_mpi(Region& region) { return static_cast<MpiRegion&>(region); }

// An indexed datatype selecting `rows` blocks of `block` elements of `base`, displacements in
// units of blocks. Caller frees it.
MPI_Datatype rows_type(const std::vector<std::int64_t>& rows, int block, MPI_Datatype base) {
  std::vector<int> displs(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] > INT_MAX / std::max(block, 1))
      throw Error("row index " + std::to_string(rows[i]) + " is out of the range an MPI datatype can address");
    displs[i] = static_cast<int>(rows[i]) * block;
  }
  MPI_Datatype type;
  STRATA_CHECK_MPI(MPI_Type_create_indexed_block(static_cast<int>(rows.size()), block, displs.data(), base, &type));
  STRATA_CHECK_MPI(MPI_Type_commit(&type));
  return type;
}

// A copy out of a peer's shared segment leaves its lines in this core's caches, shared with the
// owner's. The owner of a variable (a PS) then writes every one of them at its next apply, and each
// such store must first take the line back from this core: in async training that stalls the PS's
// apply whenever it falls just after a worker's pull, which happens for whole runs at a time (the
// two fall into step). Flushing the lines right after the copy (CLFLUSHOPT, where the CPU has it:
// written back if dirty and dropped from every cache) lets the owner's next writes find no other
// copy to take back; it then reads them from memory, which costs it less than taking every line
// back (docs/PERFORMANCE.md, "Against PyTorch on the same cores: flushed pulls").
// Large copies only; STRATA_SHM_FLUSH=0 turns it off.
constexpr std::size_t kFlushAfterGetBytes = 64 * 1024;

#if defined(__x86_64__) && defined(__GNUC__)
bool cpu_has_clflushopt() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (b & (1u << 23)) != 0;
}

__attribute__((target("clflushopt"))) void flush_lines(const char* p, std::size_t bytes) {
  const auto first = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{63};
  const auto end = reinterpret_cast<std::uintptr_t>(p) + bytes;
  for (std::uintptr_t line = first; line < end; line += 64) _mm_clflushopt(reinterpret_cast<void*>(line));
  _mm_sfence();
}
#else
bool cpu_has_clflushopt() { return false; }
void flush_lines(const char*, std::size_t) {}
#endif

}  // namespace

MpiRmaTransport::MpiRmaTransport(MPI_Comm comm) {
  STRATA_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  STRATA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  STRATA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  STRATA_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  // All ranks on one node: regions become shared-memory windows with a direct-load fast path.
  // STRATA_MPI_SHARED=0 turns it off (to compare, or to rule it out).
  MPI_Comm node = MPI_COMM_NULL;
  STRATA_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  shared_ = node_size == size_ && Env::from_process().get_bool("STRATA_MPI_SHARED", true);
  flush_after_get_ = shared_ && cpu_has_clflushopt() && Env::from_process().get_bool("STRATA_SHM_FLUSH", true);
}

MpiRmaTransport::~MpiRmaTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL && std::uncaught_exceptions() == 0) MPI_Comm_free(&comm_);
}

std::string MpiRmaTransport::describe() const {
  return shared_ ? "one node: shared memory (MPI shared windows, direct copies)"
                 : "MPI RMA windows (one-sided MPI_Get / MPI_Accumulate / MPI_Fetch_and_op)";
}

std::unique_ptr<Region> MpiRmaTransport::allocate_region(std::size_t local_bytes) {
  return std::make_unique<MpiRegion>(comm_, local_bytes, shared_);
}

void MpiRmaTransport::get(Region& region, int peer, std::uint64_t offset, void* dst, std::size_t bytes) {
  auto& r = as_mpi(region);
  r.check_range(peer, offset, bytes, "get");
  auto* out = static_cast<char*>(dst);
  if (r.shared()) {
    if (bytes == 0) return;
    const char* src = r.peer_base(peer);
    // Same node: a plain copy is the get (a reader may see a concurrent update half done, which
    // the async model allows; the atomics still go through MPI).
    std::memcpy(out, src + offset, bytes);
    if (flush_after_get_ && bytes >= kFlushAfterGetBytes) flush_lines(src + offset, bytes);
    return;
  }
  for (std::size_t done = 0; done < bytes;) {
    int n = static_cast<int>(std::min(kMaxChunk, bytes - done));
    STRATA_CHECK_MPI(MPI_Get(out + done, n, MPI_BYTE, peer, static_cast<MPI_Aint>(offset + done), n, MPI_BYTE, r.win()));
    done += n;
  }
}

const void* MpiRmaTransport::local_view(Region& region, int peer, std::uint64_t offset, std::size_t bytes) {
  auto& r = as_mpi(region);
  if (!r.shared()) return nullptr;
  r.check_range(peer, offset, bytes, "local_view");
  return r.peer_base(peer) + offset;
}

std::uint32_t* MpiRmaTransport::shared_word(Region& region, int peer, std::uint64_t offset) {
  auto& r = as_mpi(region);
  if (!r.shared()) return nullptr;
  r.check_range(peer, offset, sizeof(std::uint32_t), "shared_word");
  if (offset % alignof(std::uint32_t) != 0) throw Error("shared_word: offset " + std::to_string(offset) + " is not 4-byte aligned");
  return reinterpret_cast<std::uint32_t*>(r.peer_base(peer) + offset);
}

void MpiRmaTransport::release_view(Region& region, const void* view, std::size_t bytes) {
  if (as_mpi(region).shared() && flush_after_get_ && bytes >= kFlushAfterGetBytes)
    flush_lines(static_cast<const char*>(view), bytes);
}

void MpiRmaTransport::put(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes) {
  auto& r = as_mpi(region);
  r.check_range(peer, offset, bytes, "put");
  const auto* in = static_cast<const char*>(src);
  for (std::size_t done = 0; done < bytes;) {
    int n = static_cast<int>(std::min(kMaxChunk, bytes - done));
    STRATA_CHECK_MPI(MPI_Put(in + done, n, MPI_BYTE, peer, static_cast<MPI_Aint>(offset + done), n, MPI_BYTE, r.win()));
    done += n;
  }
}

void MpiRmaTransport::accumulate(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t count,
                                 ElemType type) {
  auto& r = as_mpi(region);
  const std::size_t esize = elem_size(type);
  r.check_range(peer, offset, count * esize, "accumulate");
  const auto* in = static_cast<const char*>(src);
  const std::size_t max_elems = kMaxChunk / esize;
  for (std::size_t done = 0; done < count;) {
    int n = static_cast<int>(std::min(max_elems, count - done));
    STRATA_CHECK_MPI(MPI_Accumulate(in + done * esize, n, mpi_type(type), peer,
                                    static_cast<MPI_Aint>(offset + done * esize), n, mpi_type(type), MPI_SUM, r.win()));
    done += n;
  }
}

void MpiRmaTransport::get_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_bytes,
                               const std::vector<std::int64_t>& rows, void* dst) {
  if (rows.empty()) return;
  auto& r = as_mpi(region);
  const std::int64_t max_row = *std::max_element(rows.begin(), rows.end());
  r.check_range(peer, offset, static_cast<std::size_t>(max_row + 1) * row_bytes, "get_rows");
  if (r.shared()) {
    const char* src = r.peer_base(peer) + offset;
    auto* out = static_cast<char*>(dst);
    // Random rows of a large table are latency-bound (one cache/TLB miss per row): prefetch a few
    // rows ahead so the misses overlap instead of queueing one after another.
    constexpr std::size_t kAhead = 16;
    auto prefetch_row = [&](std::size_t i) {
      const char* p = src + static_cast<std::uint64_t>(rows[i]) * row_bytes;
      for (std::size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(p + b, 0, 0);
    };
    for (std::size_t i = 0; i < std::min(kAhead, rows.size()); ++i) prefetch_row(i);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (i + kAhead < rows.size()) prefetch_row(i + kAhead);
      std::memcpy(out + i * row_bytes, src + static_cast<std::uint64_t>(rows[i]) * row_bytes, row_bytes);
    }
    return;
  }
  if (row_bytes > INT_MAX) throw Error("get_rows: row of " + std::to_string(row_bytes) + " bytes is too large");
  // One MPI_Get with an indexed target datatype: the rows travel as one operation.
  MPI_Datatype target = rows_type(rows, static_cast<int>(row_bytes), MPI_BYTE);
  int rc = MPI_Get(dst, static_cast<int>(rows.size() * row_bytes), MPI_BYTE, peer, static_cast<MPI_Aint>(offset), 1,
                   target, r.win());
  MPI_Type_free(&target);
  STRATA_CHECK_MPI(rc);
}

void MpiRmaTransport::accumulate_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_elems,
                                      ElemType type, const std::vector<std::int64_t>& rows, const void* src) {
  if (rows.empty()) return;
  auto& r = as_mpi(region);
  const std::int64_t max_row = *std::max_element(rows.begin(), rows.end());
  r.check_range(peer, offset, static_cast<std::size_t>(max_row + 1) * row_elems * elem_size(type), "accumulate_rows");
  if (row_elems > INT_MAX) throw Error("accumulate_rows: row of " + std::to_string(row_elems) + " elements is too large");
  MPI_Datatype target = rows_type(rows, static_cast<int>(row_elems), mpi_type(type));
  int rc = MPI_Accumulate(src, static_cast<int>(rows.size() * row_elems), mpi_type(type), peer,
                          static_cast<MPI_Aint>(offset), 1, target, MPI_SUM, r.win());
  MPI_Type_free(&target);
  STRATA_CHECK_MPI(rc);
}

std::int64_t MpiRmaTransport::fetch_add(Region& region, int peer, std::uint64_t offset, std::int64_t value) {
  auto& r = as_mpi(region);
  r.check_range(peer, offset, 8, "fetch_add");
  std::int64_t old = 0;
  STRATA_CHECK_MPI(MPI_Fetch_and_op(&value, &old, MPI_INT64_T, peer, static_cast<MPI_Aint>(offset), MPI_SUM, r.win()));
  STRATA_CHECK_MPI(MPI_Win_flush(peer, r.win()));
  return old;
}

std::int64_t MpiRmaTransport::atomic_read(Region& region, int peer, std::uint64_t offset) {
  auto& r = as_mpi(region);
  r.check_range(peer, offset, 8, "atomic_read");
  std::int64_t value = 0, unused = 0;
  STRATA_CHECK_MPI(MPI_Fetch_and_op(&unused, &value, MPI_INT64_T, peer, static_cast<MPI_Aint>(offset), MPI_NO_OP, r.win()));
  STRATA_CHECK_MPI(MPI_Win_flush(peer, r.win()));
  return value;
}

void MpiRmaTransport::flush(Region& region, int peer) {
  auto& r = as_mpi(region);
  STRATA_CHECK_MPI(MPI_Win_flush(peer, r.win()));
  // Direct loads and stores are ordered by a memory barrier, as the unified model prescribes.
  if (r.shared()) STRATA_CHECK_MPI(MPI_Win_sync(r.win()));
}

void MpiRmaTransport::flush_all(Region& region) {
  auto& r = as_mpi(region);
  STRATA_CHECK_MPI(MPI_Win_flush_all(r.win()));
  if (r.shared()) STRATA_CHECK_MPI(MPI_Win_sync(r.win()));
}

void MpiRmaTransport::sync_local(Region& region) { STRATA_CHECK_MPI(MPI_Win_sync(as_mpi(region).win())); }

void MpiRmaTransport::progress() {
  // MPI_Iprobe enters the progress engine without consuming anything.
  int flag = 0;
  STRATA_CHECK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE));
}

}  // namespace strata::comm::mpi
