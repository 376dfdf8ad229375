// UCX transport: the Transport interface over UCP (one ucp_context + one ucp_worker per transport,
// an endpoint to every rank of the communicator, regions from ucp_mem_map(UCP_MEM_MAP_ALLOCATE)).
// Private to the comm layer; only src/comm/transport_registry.cc creates it.
//
// Why UCP_MEM_MAP_ALLOCATE: memory UCX allocates itself sits in a shared-memory segment that
// co-located peers map, so get / put / atomics complete without the target calling into UCX (fully
// one-sided), while user memory registered with ucp_mem_map makes every operation wait for the
// target's progress (docs/PERFORMANCE.md, "Data-plane design"). Across nodes (TCP, or IB without
// the target's progress for emulated atomics) the target must progress: PS ranks run a service
// loop that calls progress(), and barriers between data-plane phases must progress too (see
// cmd_bench.cc).
//
// Float accumulate: UCP has no floating-point AMO. See ucx_transport.cc for the striped-lock
// protocol that keeps concurrent accumulates exact, and why it was chosen over active messages.
//
// Direct access: when ucp_rkey_ptr maps a peer's region into this process (every co-located peer
// with shared-memory transports), get / put / get_rows / accumulate use plain loads and stores on
// that mapping instead of one UCP call per operation, as the MPI transport does with
// MPI_Win_shared_query. STRATA_UCX_DIRECT=0 turns it off (every access then goes through
// ucp_get_nbx / ucp_put_nbx), to compare or to rule it out. Atomics always go through UCP.
#pragma once

#include "strata/config.h"

#if !STRATA_HAVE_UCX
#error "built without UCX: src/comm/ucx is compiled only when STRATA_UCX_ENABLED"
#endif

#include <mpi.h>
#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "strata/common/env.h"
#include "strata/comm/transport.h"

namespace strata::comm::ucx {

class UcxRegion;

class UcxTransport final : public Transport {
 public:
  // Collective over `comm`, which is dup'ed (the caller keeps its handle). Creates the context and
  // worker, allgathers worker addresses, connects to every rank (itself included) and completes
  // wire-up before returning. Waits are bounded by --timeout / STRATA_TIMEOUT_S (default 120 s).
  explicit UcxTransport(MPI_Comm comm);
  // Collective. Every Region of this transport must be destroyed first.
  ~UcxTransport() override;

  const char* name() const override { return "ucx"; }
  std::string describe() const override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Region> allocate_region(std::size_t local_bytes) override;
  void get(Region& region, int peer, std::uint64_t offset, void* dst, std::size_t bytes) override;
  void put(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes) override;
  // Returns after the sum is remotely complete (stronger than the interface requires).
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

 private:
  friend class UcxRegion;
  struct Piece;  // one contiguous byte range of an accumulate (defined in the .cc)

  // Waits for `request` (the return of a *_nbx call) with progress; frees it. Throws UcxError on a
  // failed status and TimeoutError naming `peer` after the deadline.
  void wait(ucs_status_ptr_t request, int peer, const char* what);
  // Logs UCX's description of the endpoint to `peer` (a stalled operation's report).
  void log_endpoint(int peer, const char* what) const;
  // Waits until every get this rank issued to `peer` (-1: to anyone) has completed.
  void wait_gets(int peer, const char* what);
  // Remote completion of everything issued to `peer` (ucp_ep_flush_nbx).
  void flush_ep(int peer, const char* what);
  // Collective barrier that keeps this worker progressing (a plain MPI_Barrier could starve peers
  // whose operations need this rank's progress, e.g. wire-up or TCP).
  void progressing_barrier(const char* what);

  // Nonblocking get of one contiguous range; completion is counted per peer (wait_gets).
  void post_get(UcxRegion& r, int peer, std::uint64_t offset, void* dst, std::size_t bytes);
  std::uint64_t amo(UcxRegion& r, int peer, std::uint64_t offset, ucp_atomic_op_t op, std::uint64_t operand,
                    std::uint64_t swap, bool fetch, const char* what);
  void lock_stripe(UcxRegion& r, int peer, std::uint64_t lock_offset);
  void unlock_stripe(UcxRegion& r, int peer, std::uint64_t lock_offset);
  void accumulate_pieces(UcxRegion& r, int peer, std::vector<Piece>& pieces, ElemType type);
  void accumulate_i64(UcxRegion& r, int peer, const std::vector<Piece>& pieces);

  static void get_done(void* request, ucs_status_t status, void* user_data);

  // Per-peer bookkeeping of nonblocking gets. Completion callbacks run inside
  // ucp_worker_progress on the thread driving the transport; `owner` lets them reach the total.
  struct PeerGets {
    UcxTransport* owner = nullptr;
    int peer = -1;
    std::int64_t in_flight = 0;
    ucs_status_t status = UCS_OK;  // first failure a callback saw, reported by the next flush
  };

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  double timeout_s_ = kDefaultTimeoutS;
  bool direct_ = true;  // use ucp_rkey_ptr mappings where UCX offers them
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;  // one per rank of comm_, self included
  std::vector<PeerGets> gets_;  // sized once in the constructor: callbacks hold pointers into it
  std::vector<char> unflushed_puts_;  // per peer: a UCP put since the last flush of that peer
  std::int64_t total_gets_in_flight_ = 0;
  std::vector<char> scratch_;  // staging for accumulate without direct access
};

}  // namespace strata::comm::ucx
