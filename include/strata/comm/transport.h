// The data-plane transport: one-sided access to memory regions that every rank of a communicator
// exposes. Two implementations sit behind it: MPI RMA (MPI_Win_allocate windows under a job-long
// MPI_Win_lock_all) and UCX (ucp_mem_map'd regions); the PS logic never sees which.
//
// Completion semantics (UCX / ps-lite vocabulary):
//   put / get / accumulate start an operation and return on LOCAL completion of the call: for put
//   and accumulate the source buffer may be reused; for get the destination is valid only after
//   flush(region, peer) (or flush_all).
//   flush(region, peer) gives REMOTE completion of every operation this rank issued to `peer` on
//   that region; flush_all does it for every peer.
//   fetch_add and compare_swap are blocking and atomic with respect to each other and to
//   accumulate on the same region (they use the same atomicity domain).
//   A region's owner reads its own memory through local_base() after sync_local(), which makes
//   completed remote writes visible (MPI_Win_sync under the unified memory model).
// Threading: one thread per rank drives a given Transport at a time (callers serialise).
// Collectives: allocate_region and a Region's destruction are collective over the transport's
// communicator; every rank calls them in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace strata::comm {

enum class ElemType { kF32, kF64, kI64 };
// Bytes of one element; throws Error for a value that is none of the enumerators.
std::size_t elem_size(ElemType type);
const char* to_string(ElemType type);

// Memory registered with a transport: `local_bytes()` on this rank, addressed by byte offsets by
// every rank. Destroying it is collective.
class Region {
 public:
  virtual ~Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  virtual void* local_base() = 0;
  virtual std::size_t local_bytes() const = 0;
  // Bytes exposed by `peer` (known to every rank after allocation).
  virtual std::size_t bytes_of(int peer) const = 0;

 protected:
  Region() = default;
};

// A contiguous byte range in a peer's region.
struct RemoteRef {
  int peer = -1;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = 0;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual const char* name() const = 0;
  // What carries the traffic, in words (for the startup line), e.g. "1 node: shared memory".
  virtual std::string describe() const { return name(); }
  // Why this transport was chosen (`--transport auto` records its probes here; empty when forced).
  const std::string& why() const { return why_; }
  void set_why(std::string why) { why_ = std::move(why); }
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Collective: every rank exposes `local_bytes` (0 allowed), zero-filled.
  virtual std::unique_ptr<Region> allocate_region(std::size_t local_bytes) = 0;

  virtual void get(Region& region, int peer, std::uint64_t offset, void* dst, std::size_t bytes) = 0;
  virtual void put(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes) = 0;
  // Element-wise atomic sum of `count` elements of `type` into the peer's memory at `offset`.
  virtual void accumulate(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t count,
                          ElemType type) = 0;
  // Gathers `rows.size()` rows of `row_bytes` each, row r starting at offset + rows[r] * row_bytes in
  // the peer's region, into dst (densely packed, in the order given). Valid after flush.
  virtual void get_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_bytes,
                        const std::vector<std::int64_t>& rows, void* dst) = 0;
  // Atomic sum of packed rows (row_elems elements of `type` each) into the given rows. Duplicate
  // row indices are the caller's to combine first (MPI leaves overlapping targets in one
  // datatype undefined).
  virtual void accumulate_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_elems,
                               ElemType type, const std::vector<std::int64_t>& rows, const void* src) = 0;

  // A put announced piece by piece: writes `bytes` from `src` to the peer's region at `offset` as
  // consecutive pieces of `piece_bytes` (the last may be shorter) and, once each piece's bytes are
  // in place there, adds 1 to the int64 counter at `counter_offset` of the same region (an atomic
  // sum, like accumulate). An owner that reads the counter as k with acquire ordering (after
  // sync_local) may read the first k pieces, while later ones are still on their way: how a PS
  // applies a streamed push as it arrives. Completion as put: returns once `src` may be reused,
  // remotely complete after flush. With `readback` non-null it also reads the int64 at
  // `readback_offset` into *readback as a get issued after the put would (valid after flush; on an
  // ordered peer it sees the put's effects): a PS's ack word, read without a request of its own.
  // The default issues put, a flush unless ordered_to(peer), and a one-element accumulate per
  // piece, then the get; a transport that serves writes itself (tcp) sends one request, bumps the
  // counter as it receives, and answers it with the read-back word.
  virtual void put_notify(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes,
                          std::size_t piece_bytes, std::uint64_t counter_offset, std::int64_t* readback,
                          std::uint64_t readback_offset);
  // put_notify with a read-back (non-null `readback`), then a get of `get_bytes` at `get_offset` of
  // the same region into `dst`, issued after it: a request and its answer (a PS's rows) in one.
  // Both are valid after flush(peer); on an ordered peer the get sees the put's effects, those of a
  // consumer of its pieces (consume_notified) included, and no later write changes the answer.
  // The default is put_notify and get (with a flush between and after unless ordered_to(peer): the
  // answer is then in when the call returns); tcp between nodes sends one request, and the answer
  // leaves the peer's transport thread as soon as the consumer handled the put, with no second
  // request to wait for.
  virtual void put_notify_get(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes,
                              std::size_t piece_bytes, std::uint64_t counter_offset, std::int64_t* readback,
                              std::uint64_t readback_offset, std::uint64_t get_offset, void* dst,
                              std::size_t get_bytes);

  // Receives the pieces of put_notify calls that other ranks make to this rank's `region` with
  // counter `counter_offset`: on a transport that serves remote writes from its own thread (tcp
  // between nodes), each such piece is handed to `handler(offset, data, bytes)` on that thread
  // instead of being stored at `offset` and counted (neither the region bytes nor the counter
  // change; the handler owns the piece). `data` is valid for the call only. The handler runs
  // concurrently with this rank's other threads: the caller synchronises. A put_notify is remotely
  // complete (flush) only once the handler returned for each of its pieces. Pieces that do not pass
  // the transport's own thread (a co-located peer through shared memory, or a transport without
  // one) are stored and counted as usual. Returns false when this transport never hands pieces
  // over. Register before any peer may send such a put (e.g. before the barrier that publishes the
  // region) and for the region's lifetime; an empty handler unregisters. Not collective.
  using PieceHandler = std::function<void(std::uint64_t offset, const void* data, std::size_t bytes)>;
  virtual bool consume_notified(Region& region, std::uint64_t counter_offset, PieceHandler handler) {
    (void)region;
    (void)counter_offset;
    (void)handler;
    return false;
  }

  // Where this rank can load `bytes` of `peer`'s region at `offset` directly (a peer on this node
  // whose memory is mapped here), else nullptr. A load through it is a get without the copy: it
  // sees what a get issued at that moment would see, ordered only as a get is (the caller orders
  // it against the peer's writes with acks and atomics, as it would a get). Valid for the region's
  // lifetime. Not collective; no communication.
  virtual const void* local_view(Region& region, int peer, std::uint64_t offset, std::size_t bytes) {
    (void)region;
    (void)peer;
    (void)offset;
    (void)bytes;
    return nullptr;
  }

  // Done reading a local_view range for now: a transport that keeps a co-located owner's writes
  // cheap (mpi's shared windows with STRATA_SHM_FLUSH, as after a large get) writes those lines out
  // of this core's caches, so the owner's next writes find no other copy. The view stays valid.
  virtual void release_view(Region& region, const void* view, std::size_t bytes) {
    (void)region;
    (void)view;
    (void)bytes;
  }

  // A 4-byte word of `peer`'s region at `offset` (4-byte aligned) that this rank may load, store
  // and futex-wait on directly, or nullptr: `peer` is this rank or a co-located peer whose segment
  // is mapped here in memory shared between the processes. For sleep/wake handshakes between
  // co-located ranks only (the ps layer's wake words); data moves through get/put. Valid for the
  // region's lifetime. Not collective; no communication.
  virtual std::uint32_t* shared_word(Region& region, int peer, std::uint64_t offset) {
    (void)region;
    (void)peer;
    (void)offset;
    return nullptr;
  }

  // Blocking atomics on 8-byte integers; remote completion included.
  virtual std::int64_t fetch_add(Region& region, int peer, std::uint64_t offset, std::int64_t value) = 0;
  virtual std::int64_t atomic_read(Region& region, int peer, std::uint64_t offset) = 0;

  virtual void flush(Region& region, int peer) = 0;
  virtual void flush_all(Region& region) = 0;
  // Makes remote writes into this rank's own region visible to local loads (and local stores
  // visible to remote readers).
  virtual void sync_local(Region& region) = 0;
  // Drives the progress engine (a PS service loop calls it while idle). Thread contract: it may be
  // called from another thread while the owning thread makes no call on this transport at all
  // (a PS keeps answering peers from a helper thread during a blocking collective such as a
  // checkpoint save); never concurrently with other calls on the same transport.
  virtual void progress() = 0;
  // True when operations this rank issues to `peer` take effect there in issue order (a put is
  // applied before an accumulate issued after it), so a caller may skip the flush that would
  // otherwise order them. False unless the transport guarantees it (MPI and UCX do not).
  virtual bool ordered_to(int peer) const {
    (void)peer;
    return false;
  }

 protected:
  Transport() = default;

 private:
  std::string why_;
};

// Transports compiled into this build, e.g. {"mpi", "tcp", "ucx"} ("auto" chooses among them).
std::vector<std::string> compiled_transports();

}  // namespace strata::comm
