// The "tcp" transport: shared memory within a node, TCP requests served by the owner between
// nodes. Private to the comm layer; src/comm/transport_registry.cc creates it (`--transport tcp`,
// and `--transport auto` when the MPI library offers no one-sided communication between the
// job's nodes).
//
// Within a node: an MpiRmaTransport over the node communicator, i.e. MPI_Win_allocate_shared
// windows read with plain copies and updated with MPI_Accumulate / MPI_Fetch_and_op (osc sm),
// exactly what `--transport mpi` does on one node.
// Between nodes: every rank runs one server thread that owns a listening socket and answers
// requests for its own regions: get, put, accumulate, rows, fetch-and-add, flush. The thread sleeps
// in poll() when idle, so it costs no core (on an oversubscribed node a spinning waiter keeps the
// kernel's softirq, which moves the packets, off the cores; tests/cluster/README.md, "mpirun"), and
// it answers while the owner computes, so no operation waits for the owner's progress. A pull is one request
// and one reply, the bytes sent straight from the region; a push is one message (header and
// gradient in one sendmsg), applied on arrival, and a flush is one round trip.
//
// Why not RMA emulated over TCP (osc ucx / UCX with UCX_TLS=tcp): both complete one-sided
// operations only when the target calls into the library, and UCX's float accumulate is five
// round trips (lock, get, put, flush, unlock), which leaves UCX over TCP far below raw TCP for
// pulls and further still for pushes (docs/PERFORMANCE.md, "Between nodes").
//
// Atomicity: the server applies accumulates and fetch-and-adds through the same node window (an
// MPI operation on its own segment), so they are atomic with those of co-located peers. This needs
// MPI_THREAD_MULTIPLE (strata initialises MPI with it) and relies on MpiRmaTransport keeping no
// mutable state of its own, so two threads may issue operations on it at once.
//
// Who gets in (docs/SECURITY.md): every connection passes the handshake of handshake.h (both ends
// prove the job's secret, shared over MPI when the transport is made) before a request is served;
// the server also checks that the claimed rank connects from the address it published and has no
// other connection. Handshakes run on the server thread without blocking it (many at once, each
// with a short deadline, at most kMaxPending at a time), so a stranger's connection, garbage or
// silence costs the job nothing but a warning line, rate-limited. Requests on an authenticated
// connection come from a rank of the job: one that fails check_request is a bug in strata and
// ends the job naming that rank (fail-stop), as any other inconsistency does.
//
// Completion: get data is valid after flush (pending replies are drained there); put and
// accumulate return once handed to the kernel and are remotely complete after flush (a FLUSH
// request answered after everything sent before it: one connection per ordered pair of ranks).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/job_secret.h"
#include "comm/mpi/mpi_rma_transport.h"
#include "comm/tcp/socket.h"
#include "strata/comm/transport.h"
#include "strata/common/env.h"

namespace strata::comm::tcp {

class TcpRegion;

class TcpTransport final : public Transport {
 public:
  // Collective over `comm` (dup'ed): splits the node communicator, starts the server thread,
  // allgathers every rank's endpoint. Connections to other nodes open on first use. Waits are
  // bounded by --timeout / STRATA_TIMEOUT_S (default 120 s).
  explicit TcpTransport(MPI_Comm comm);
  // Collective (a barrier, so no peer still sends us requests, then the server stops).
  ~TcpTransport() override;

  const char* name() const override { return "tcp"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // "N node(s); intra-node shared memory (MPI window), inter-node TCP via <interface>".
  std::string describe() const override;

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
  // One request: header, piece size and the bytes in one stream; the server receives the pieces
  // straight into the region and bumps the counter after each (through the node window, so the
  // sum is atomic with co-located peers'). 64 fewer requests per 16 MiB than put + accumulate.
  // The read-back word is the request's reply, sent once the last piece took effect: it travels
  // against the data, so it is not queued (and paced) behind the gradient the way a get request
  // sent after the put would be.
  void put_notify(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes,
                  std::size_t piece_bytes, std::uint64_t counter_offset, std::int64_t* readback,
                  std::uint64_t readback_offset) override;
  // One request (kPutNotifyGet): the server answers with the read-back word and the get's bytes in
  // one send as soon as the put took effect.
  void put_notify_get(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes,
                      std::size_t piece_bytes, std::uint64_t counter_offset, std::int64_t* readback,
                      std::uint64_t readback_offset, std::uint64_t get_offset, void* dst,
                      std::size_t get_bytes) override;
  // Pieces from peers on other nodes reach the handler on the server thread, received into a
  // buffer that stays in cache (a PS applies them there: one pass over the gradient instead of a
  // store into the inbox and a load by the service loop on another core).
  bool consume_notified(Region& region, std::uint64_t counter_offset, PieceHandler handler) override;
  std::int64_t fetch_add(Region& region, int peer, std::uint64_t offset, std::int64_t value) override;
  std::int64_t atomic_read(Region& region, int peer, std::uint64_t offset) override;
  void flush(Region& region, int peer) override;
  void flush_all(Region& region) override;
  void sync_local(Region& region) override;
  void progress() override;
  // Peers on other nodes: one connection per ordered pair of ranks, served in arrival order.
  // Co-located peers go through the node's MPI window, which does not order a put before an
  // accumulate.
  bool ordered_to(int peer) const override { return !same_node(peer); }

  int num_nodes() const { return num_nodes_; }
  bool same_node(int peer) const { return node_rank_[peer] >= 0; }

  // One request on the wire (fixed size, little-endian host layout: every node runs the same
  // build on the same architecture).
  struct Request {
    std::uint32_t op = 0;
    std::uint32_t region = 0;
    std::uint64_t offset = 0;
    std::uint64_t a = 0;  // bytes / row bytes / row elements / value
    std::uint64_t b = 0;  // element type / row count
  };
  // The most rows one get_rows / accumulate_rows request may carry (the server allocates for the
  // indices before it reads them, so the count is bounded before anything is allocated).
  static constexpr std::uint64_t kMaxRowsPerRequest = std::uint64_t{1} << 26;
  // Checks a request header against the served region's size (`region_bytes`): op, element type,
  // alignment, offsets and sizes without wrap-around, row counts. Empty when it may be served,
  // else what is wrong. Row indices, which follow the header, are checked as they arrive.
  static std::string check_request(const Request& req, std::uint64_t region_bytes);
  // This rank's published endpoint (tests probe it as a stranger would).
  Endpoint endpoint_of(int rank) const { return endpoints_.at(rank); }

 private:
  friend class TcpRegion;
  struct Pending {  // a get whose reply is still in the socket
    void* dst;
    std::size_t bytes;
  };
  struct Peer {  // client side of this rank's connection to one remote rank
    Socket sock;
    // Replies owed, in request order: gets[head] has its first `got` bytes received, those before
    // it are complete.
    std::vector<Pending> gets;
    std::size_t head = 0;
    std::size_t got = 0;
    // A write was sent after the last request whose reply is received or owed (that reply is sent
    // after the write took effect: one connection, served in order).
    bool writes_unacked = false;
    bool owes() const { return head < gets.size(); }
  };

  Peer& connect(int peer);
  // Receives every pending get reply from `peer`, in order.
  void drain(int peer);
  // Receives what has arrived of the replies `peer` owes, without waiting.
  void receive_some(int peer);
  // Waits (at most a second) until `peer`'s socket may take more bytes, receiving meanwhile the
  // replies any peer owes us as they arrive.
  void await_writable(int peer, const Deadline& deadline, const char* what);
  // Sends a request (and its payload pieces) to a remote peer, after draining its gets.
  void send_request(int peer, const Request& req, std::vector<iovec> payload, const char* what);
  // Sends a request without draining first: while the socket takes no more, replies owed by any
  // peer are received as they arrive (so this rank never waits to send while a server waits for it
  // to read). Used by put_notify with a read-back, whose own reply then proves its writes done.
  void send_ahead(int peer, const Request& req, std::vector<iovec> payload, const char* what);
  std::uint64_t round_trip(int peer, const Request& req, const char* what);
  void flush_remote(int peer);

  // ---- server thread ----
  void serve();
  // Handles one request from connection `c` (remote rank `from`). Returns false on a clean EOF.
  bool handle(int fd, int from);
  // A handshake slower than this is dropped (the client retries until its own deadline).
  double handshake_timeout_s() const;
  TcpRegion* region_by_id(std::uint32_t id);
  bool region_abandoned(std::uint32_t id);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 0, num_nodes_ = 1;
  std::vector<int> node_rank_;  // peer -> its rank in our node communicator, -1 when on another node
  std::unique_ptr<mpi::MpiRmaTransport> local_;
  std::vector<Endpoint> endpoints_;
  std::string address_why_;
  double timeout_s_ = kDefaultTimeoutS;
  std::unique_ptr<JobSecret> secret_;
  std::vector<Peer> peers_;

  Socket listener_;
  int wake_[2] = {-1, -1};  // self-pipe: the destructor wakes the server thread with it
  std::thread server_;
  std::atomic<bool> stop_{false};
  std::mutex regions_mu_;  // guards regions_ (allocation/destruction vs the server thread)
  // Held by the server thread while it serves a request that names a region, and by a region's
  // destruction while it unregisters: a region is never freed while a request uses it.
  std::mutex serving_mu_;
  std::vector<TcpRegion*> regions_;  // by region id; nullptr once destroyed
  // Region ids destroyed while an exception unwound (their peers did not free with us): a request
  // for one is expected, not a peer's bug (guarded by regions_mu_).
  std::vector<bool> abandoned_;
  std::uint32_t next_region_ = 0;
};

}  // namespace strata::comm::tcp
