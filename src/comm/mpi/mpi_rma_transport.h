// MPI RMA transport: one MPI_Win_allocate window per region, passive target for the window's whole
// life (MPI_Win_lock_all with MPI_MODE_NOCHECK), MPI_Get / MPI_Put / MPI_Accumulate(MPI_SUM) /
// MPI_Fetch_and_op, MPI_Win_flush for remote completion. Private to the comm layer.
//
// Why MPI_Win_allocate and not dynamic windows: with Open MPI 4.1, dynamic windows make accumulate
// and fetch-and-op wait for the target to enter MPI, while allocated windows on one node complete
// them through shared memory with the target busy (docs/PERFORMANCE.md, "Data-plane design").
// Across nodes accumulate and fetch-and-op still need the target inside MPI: that is why PS ranks
// run a service loop that keeps calling progress().
//
// When every rank of the communicator shares one node, regions are MPI_Win_allocate_shared windows
// and get / get_rows become plain copies from the peer's segment (MPI_Win_shared_query pointers);
// accumulate and the atomics still go through MPI so they stay atomic with each other.
#pragma once

#include <mpi.h>

#include "strata/comm/transport.h"

namespace strata::comm::mpi {

class MpiRmaTransport final : public Transport {
 public:
  // Collective over `comm`, which is dup'ed (the caller keeps ownership of its handle).
  explicit MpiRmaTransport(MPI_Comm comm);
  ~MpiRmaTransport() override;

  const char* name() const override { return "mpi"; }
  std::string describe() const override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Region> allocate_region(std::size_t local_bytes) override;
  void get(Region& region, int peer, std::uint64_t offset, void* dst, std::size_t bytes) override;
  const void* local_view(Region& region, int peer, std::uint64_t offset, std::size_t bytes) override;
  void release_view(Region& region, const void* view, std::size_t bytes) override;
  std::uint32_t* shared_word(Region& region, int peer, std::uint64_t offset) override;
  void put(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes) override;
  void accumulate(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t count,
                  ElemType type) override;
  void get_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_bytes,
                const std::vector<std::int64_t>& rows, void* dst) override;
  void accumulate_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_elems, ElemType type,
                       const std::vector<std::int64_t>& rows, const void* src) override;
  std::int64_t fetch_add(Region& region, int peer, std::uint64_t offset, std::int64_t value) override;
  std::int64_t atomic_read(Region& region, int peer, std::uint64_t offset) override;
  void flush(Region& region, int peer) override;
  void flush_all(Region& region) override;
  void sync_local(Region& region) override;
  void progress() override;

  MPI_Comm comm() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  bool shared_ = false;  // every rank on this node: shared windows with direct loads
  bool flush_after_get_ = false;  // large shared-window gets write their lines out of this core's caches
};

}  // namespace strata::comm::mpi
