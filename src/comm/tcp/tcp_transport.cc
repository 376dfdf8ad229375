// The "tcp" transport (see tcp_transport.h for the design and why).
//
// Deadlock freedom of the request protocol: a server thread only ever sends replies to requests a
// client made, and a client receives every reply it is owed before it sends anything but a get
// request (drain), or, for a put_notify with a read-back, receives them as they arrive whenever
// its send would wait (send_ahead), so no client is blocked sending a large payload while a server
// is blocked sending it a reply it does not read. Get requests are 40 bytes and never fill a
// socket buffer.
#include "comm/tcp/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <memory>

#include "comm/quiet_barrier.h"
#include "comm/tcp/handshake.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"

namespace strata::comm::tcp {
namespace {

enum Op : std::uint32_t { kGet = 1, kPut, kAcc, kGetRows, kAccRows, kFetchAdd, kRead, kFlush, kPutNotify, kPutNotifyGet };
// Unauthenticated connections held at once; a new one beyond this evicts the oldest (a legitimate
// client's handshake takes one round trip, and a client that is dropped connects again).
constexpr std::size_t kMaxPending = 64;
constexpr double kHandshakeTimeoutS = 5;
constexpr std::uint64_t kAccPieceBytes = 256 << 10;     // a served accumulate is summed in pieces of this
constexpr std::uint64_t kNoReadback = ~std::uint64_t{0};  // put_notify without a read-back word
constexpr std::uint64_t kGatherPieceBytes = 64 << 10;   // served rows are gathered and sent in pieces of this
static_assert(sizeof(TcpTransport::Request) == 32, "wire format");

std::string rank_str(int r) { return "rank " + std::to_string(r); }

bool valid_type(std::uint64_t t) { return t <= static_cast<std::uint64_t>(ElemType::kI64); }

// `offset + bytes <= limit` without wrapping.
bool fits(std::uint64_t offset, std::uint64_t bytes, std::uint64_t limit) {
  return offset <= limit && bytes <= limit - offset;
}

// One warning line per refused connection, at most kBurst in a row and then one per kEveryS
// seconds with the count of those not shown: a flood of strangers cannot flood the job's log.
class RefusalLog {
 public:
  explicit RefusalLog(int rank) : rank_(rank) {}
  void refused(const Endpoint& from, const std::string& why) {
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(kBurst, tokens_ + since / kEveryS);
    last_ = now;
    if (tokens_ < 1) {
      ++hidden_;
      return;
    }
    tokens_ -= 1;
    std::cerr << "strata: [rank " << rank_ << "] warning: tcp transport refused a connection from " << from.str()
              << ": " << why;
    if (hidden_ > 0) std::cerr << " (" << hidden_ << " more refused since the last such line)";
    std::cerr << std::endl;
    hidden_ = 0;
  }

 private:
  static constexpr double kBurst = 5, kEveryS = 10;
  int rank_;
  double tokens_ = kBurst;
  Clock::time_point last_ = Clock::now();
  std::uint64_t hidden_ = 0;
};

// handle(): the request names a region this rank destroyed while an exception unwound.
struct AbandonedRegion {};

}  // namespace

std::string TcpTransport::check_request(const Request& req, std::uint64_t region_bytes) {
  const std::uint64_t off = req.offset;
  switch (req.op) {
    case kFlush:
      return "";
    case kGet:
    case kPut:
    case kPutNotify:
    case kPutNotifyGet:
      if (!fits(off, req.a, region_bytes)) break;
      if ((req.op == kPutNotify || req.op == kPutNotifyGet) && (req.b % 8 != 0 || !fits(req.b, 8, region_bytes)))
        return "put_notify counter offset " + std::to_string(req.b) + " is unaligned or outside the region";
      return "";
    case kAcc: {
      if (!valid_type(req.b)) return "element type " + std::to_string(req.b) + " does not exist";
      const std::uint64_t esize = elem_size(static_cast<ElemType>(req.b));
      if (off % esize != 0 || req.a % esize != 0) return "accumulate not aligned to its element type";
      if (!fits(off, req.a, region_bytes)) break;
      return "";
    }
    case kGetRows:
      if (req.a == 0 || req.a > region_bytes) return "row size " + std::to_string(req.a) + " bytes";
      if (req.b == 0 || req.b > kMaxRowsPerRequest) return "row count " + std::to_string(req.b);
      if (off > region_bytes) break;
      return "";
    case kAccRows: {
      const std::uint64_t n = req.b & ((std::uint64_t{1} << 56) - 1);
      const std::uint64_t type = req.b >> 56;
      if (!valid_type(type)) return "element type " + std::to_string(type) + " does not exist";
      if (n == 0 || n > kMaxRowsPerRequest) return "row count " + std::to_string(n);
      const std::uint64_t esize = elem_size(static_cast<ElemType>(type));
      if (req.a == 0 || req.a > region_bytes / esize) return "row of " + std::to_string(req.a) + " elements";
      if (off % esize != 0 || off > region_bytes) break;
      // n rows of payload: bounded by n <= 2^26 and a row <= the region, and checked for wrap.
      if (req.a * esize > (std::uint64_t{1} << 62) / n) return "payload size overflows";
      return "";
    }
    case kFetchAdd:
    case kRead:
      if (off % 8 != 0) return "atomic offset " + std::to_string(off) + " is not aligned to int64";
      if (!fits(off, 8, region_bytes)) break;
      return "";
    default:
      return "unknown op " + std::to_string(req.op);
  }
  return "bytes [" + std::to_string(off) + ", +" + std::to_string(req.a) + ") are outside the region of " +
         std::to_string(region_bytes) + " bytes";
}

// A region: the node window (shared memory within the node) plus its size on every rank.
class TcpRegion final : public Region {
 public:
  TcpRegion(TcpTransport& t, std::size_t local_bytes) : t_(t), inner_(t.local_->allocate_region(local_bytes)) {
    // Registered with the server thread before the allgather: once any rank is past it, requests
    // for this region may arrive.
    {
      std::lock_guard<std::mutex> lock(t.regions_mu_);
      id_ = t.next_region_++;
      t.regions_.resize(id_ + 1, nullptr);
      t.regions_[id_] = this;
    }
    unsigned long long mine = local_bytes;
    sizes_.resize(t.size_);
    STRATA_CHECK_MPI(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, sizes_.data(), 1, MPI_UNSIGNED_LONG_LONG, t.comm_));
  }

  ~TcpRegion() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Unwinding (an error) or after MPI_Finalize, the peers are not freeing with us: no flush, no
    // barrier, and a peer's request for this region may still arrive.
    const bool with_peers = !finalized && std::uncaught_exceptions() == 0;
    if (with_peers) {
      try {
        // Everything sent to the peers is applied before anyone frees: then no request for this
        // region is in flight when the server thread forgets it.
        for (int p = 0; p < t_.size_; ++p)
          if (t_.peers_[p].sock.valid()) t_.flush_remote(p);
        quiet_barrier(t_.comm_);
      } catch (const std::exception& e) {
        STRATA_LOG(ERROR) << "tcp transport: freeing a region: " << e.what();
      }
    }
    {
      // Waits for a request the server thread is serving (it may be for this region); later ones
      // find no region and are refused. Never frees a region the server thread is using.
      std::lock_guard<std::mutex> serving(t_.serving_mu_);
      std::lock_guard<std::mutex> lock(t_.regions_mu_);
      t_.regions_[id_] = nullptr;
      if (!with_peers) {
        if (t_.abandoned_.size() <= id_) t_.abandoned_.resize(id_ + 1, false);
        t_.abandoned_[id_] = true;
      }
    }
    inner_.reset();  // collective over the node
  }

  void* local_base() override { return inner_->local_base(); }
  std::size_t local_bytes() const override { return inner_->local_bytes(); }
  std::size_t bytes_of(int peer) const override { return static_cast<std::size_t>(sizes_.at(peer)); }
  Region& inner() { return *inner_; }
  std::uint32_t id() const { return id_; }

  void set_handler(std::uint64_t counter, Transport::PieceHandler handler) {
    std::lock_guard<std::mutex> lock(handlers_mu_);
    if (handler)
      handlers_[counter] = std::move(handler);
    else
      handlers_.erase(counter);
  }
  // Server thread: hands one piece to the handler of `counter`; false when none is registered.
  // The lock is held during the call, so unregistering waits for a running handler.
  bool hand_over(std::uint64_t counter, std::uint64_t offset, const void* data, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(handlers_mu_);
    auto it = handlers_.find(counter);
    if (it == handlers_.end()) return false;
    it->second(offset, data, bytes);
    return true;
  }
  bool has_handler(std::uint64_t counter) {
    std::lock_guard<std::mutex> lock(handlers_mu_);
    return handlers_.count(counter) != 0;
  }

  // Served requests are checked against local_bytes(): the server may see a request before this
  // rank's allgather of the sizes has returned.
  void check_local(std::uint64_t offset, std::uint64_t bytes, const char* op) {
    if (offset + bytes > local_bytes() || offset + bytes < offset)
      throw Error(std::string(op) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                  ") are outside this rank's region of " + std::to_string(local_bytes()) + " bytes");
  }

  void check_range(int peer, std::uint64_t offset, std::uint64_t bytes, const char* op) const {
    if (peer < 0 || peer >= static_cast<int>(sizes_.size()))
      throw Error(std::string(op) + ": peer " + std::to_string(peer) + " is not a rank of the transport (size " +
                  std::to_string(sizes_.size()) + ")");
    if (offset + bytes > sizes_[peer] || offset + bytes < offset)
      throw Error(std::string(op) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                  ") are outside " + rank_str(peer) + "'s region of " + std::to_string(sizes_[peer]) + " bytes");
  }

 private:
  TcpTransport& t_;
  std::unique_ptr<Region> inner_;
  std::vector<unsigned long long> sizes_;
  std::uint32_t id_ = 0;
  std::mutex handlers_mu_;
  std::map<std::uint64_t, Transport::PieceHandler> handlers_;  // counter offset -> consumer (consume_notified)
};

namespace {
TcpRegion& as_tcp(Region& region) { return static_cast<TcpRegion&>(region); }
}  // namespace

TcpTransport::TcpTransport(MPI_Comm comm) {
  STRATA_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  STRATA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  STRATA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  STRATA_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    throw ConfigError("the tcp transport needs MPI_THREAD_MULTIPLE (its server thread applies updates through MPI)");
  const Env env = Env::from_process();
  timeout_s_ = timeout_from_env(env);

  // Node membership: a node is identified by the lowest world rank on it.
  // STRATA_TCP_FORCE_REMOTE=1 makes every rank its own "node", so the TCP path serves even
  // co-located ranks: how the single-host test tiers exercise it.
  if (env.get_bool("STRATA_TCP_FORCE_REMOTE", false))
    STRATA_CHECK_MPI(MPI_Comm_split(comm_, rank_, 0, &node_comm_));
  else
    STRATA_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm_));
  int leader = rank_;
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node_comm_));
  std::vector<int> leaders(size_);
  STRATA_CHECK_MPI(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm_));
  node_rank_.assign(size_, -1);
  int next = 0;
  for (int p = 0; p < size_; ++p) {
    if (leaders[p] == p) ++num_nodes_;
    if (leaders[p] == leader) node_rank_[p] = next++;  // split_type keyed by rank keeps rank order
  }
  --num_nodes_;  // counted every leader, starting from 1
  local_ = std::make_unique<mpi::MpiRmaTransport>(node_comm_);

  // The server: listen on the chosen interface, publish the endpoint.
  Endpoint mine;
  listener_ = listen_on(choose_local_address(env, &address_why_), &mine);
  STRATA_LOG(DEBUG) << "tcp transport: rank " << rank_ << " serves on " << mine.str() << " via " << address_why_;
  endpoints_.resize(size_);
  unsigned long long packed = (static_cast<unsigned long long>(mine.ip) << 16) | mine.port;
  std::vector<unsigned long long> all(size_);
  STRATA_CHECK_MPI(MPI_Allgather(&packed, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, comm_));
  for (int p = 0; p < size_; ++p) {
    endpoints_[p].ip = static_cast<std::uint32_t>(all[p] >> 16);
    endpoints_[p].port = static_cast<std::uint16_t>(all[p] & 0xffff);
  }
  peers_.resize(size_);
  // Drawn by rank 0 and shared over MPI before anyone can connect (the server thread starts
  // below, and clients connect only after the constructor, which every rank leaves after the
  // allgather above).
  secret_ = std::make_unique<JobSecret>(JobSecret::share(comm_));
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw Error("tcp transport: pipe2 failed");
  server_ = std::thread([this] { serve(); });
}

TcpTransport::~TcpTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  const bool collective = !finalized && std::uncaught_exceptions() == 0;
  if (collective) {
    try {
      for (int p = 0; p < size_; ++p)
        if (peers_[p].sock.valid()) flush_remote(p);
    } catch (const std::exception& e) {
      STRATA_LOG(ERROR) << "tcp transport: final flush: " << e.what();
    }
    quiet_barrier(comm_);  // nobody sends us requests after this
  }
  stop_.store(true);
  char c = 1;
  if (::write(wake_[1], &c, 1) < 0) {
  }
  if (server_.joinable()) server_.join();
  ::close(wake_[0]);
  ::close(wake_[1]);
  peers_.clear();
  local_.reset();
  if (collective) {
    MPI_Comm_free(&node_comm_);
    MPI_Comm_free(&comm_);
  }
}

std::string TcpTransport::describe() const {
  return std::to_string(num_nodes_) + " node(s): intra-node shared memory (MPI shared window), inter-node TCP " +
         "served by each rank's thread via " + address_why_;
}

std::unique_ptr<Region> TcpTransport::allocate_region(std::size_t local_bytes) {
  return std::make_unique<TcpRegion>(*this, local_bytes);
}

// ---- client side ----------------------------------------------------------------------------

TcpTransport::Peer& TcpTransport::connect(int peer) {
  Peer& p = peers_[peer];
  if (p.sock.valid()) return p;
  const Deadline deadline = Deadline::in(timeout_s_);
  // A server may drop a handshake (too many unauthenticated connections at once, a slow
  // handshake on a loaded node): connect again until the deadline. A wrong proof is never retried.
  while (true) {
    Socket s = connect_to(endpoints_[peer], deadline, rank_str(peer), endpoints_[rank_].ip);
    try {
      client_handshake(s.fd(), *secret_, Purpose::kDataPlane, rank_, peer, deadline);
      p.sock = std::move(s);
      return p;
    } catch (const PeerFailure&) {
      if (deadline.passed())
        throw TimeoutError("tcp transport: " + rank_str(peer) + " at " + endpoints_[peer].str() +
                               " kept closing the connection during the handshake (--timeout / STRATA_TIMEOUT_S)",
                           {peer});
      ::usleep(20000);
    }
  }
}

void TcpTransport::drain(int peer) {
  Peer& p = peers_[peer];
  if (!p.owes()) {
    p.gets.clear();
    p.head = 0;
    return;
  }
  const Deadline deadline = Deadline::in(timeout_s_);
  for (; p.head < p.gets.size(); ++p.head, p.got = 0) {
    const Pending& g = p.gets[p.head];
    recv_all(p.sock.fd(), static_cast<char*>(g.dst) + p.got, g.bytes - p.got, deadline, peer, "get reply");
  }
  p.gets.clear();
  p.head = 0;
}

void TcpTransport::receive_some(int peer) {
  Peer& p = peers_[peer];
  while (p.owes()) {
    const Pending& g = p.gets[p.head];
    const ssize_t n = ::recv(p.sock.fd(), static_cast<char*>(g.dst) + p.got, g.bytes - p.got, MSG_DONTWAIT);
    if (n > 0) {
      p.got += static_cast<std::size_t>(n);
      if (p.got == g.bytes) {
        ++p.head;
        p.got = 0;
      }
      continue;
    }
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      throw PeerFailure(peer, "get reply: the connection to " + rank_str(peer) +
                                  " was closed (that rank ended or failed)");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    throw Error("get reply: receive from " + rank_str(peer) + ": " + std::strerror(errno));
  }
  p.gets.clear();
  p.head = 0;
}

void TcpTransport::await_writable(int peer, const Deadline& deadline, const char* what) {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int q = 0; q < size_; ++q) {
    const bool target = q == peer;
    if (!target && !peers_[q].owes()) continue;
    const short events = static_cast<short>((target ? POLLOUT : 0) | (peers_[q].owes() ? POLLIN : 0));
    fds.push_back(pollfd{peers_[q].sock.fd(), events, 0});
    who.push_back(q);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at - Clock::now()).count();
  const int ms = static_cast<int>(std::clamp<long long>(left, 0, 1000));
  const int rc = ::poll(fds.data(), fds.size(), ms);
  if (rc < 0 && errno != EINTR) throw Error(std::string(what) + ": poll: " + std::strerror(errno));
  if (rc == 0 && deadline.passed())
    throw TimeoutError(std::string(what) + ": " + rank_str(peer) + " took no more bytes before the deadline "
                           "(--timeout / STRATA_TIMEOUT_S)",
                       {peer});
  for (std::size_t i = 0; i < fds.size() && rc > 0; ++i)
    if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && peers_[who[i]].owes()) receive_some(who[i]);
}

void TcpTransport::send_request(int peer, const Request& req, std::vector<iovec> payload, const char* what) {
  if (req.op != kGet)
    for (int q = 0; q < size_; ++q) drain(q);
  Peer& p = connect(peer);
  payload.insert(payload.begin(), iovec{const_cast<Request*>(&req), sizeof req});
  sendv_all(p.sock.fd(), std::move(payload), Deadline::in(timeout_s_), peer, what);
}

void TcpTransport::send_ahead(int peer, const Request& req, std::vector<iovec> payload, const char* what) {
  Peer& p = connect(peer);
  payload.insert(payload.begin(), iovec{const_cast<Request*>(&req), sizeof req});
  const Deadline deadline = Deadline::in(timeout_s_);
  sendv_all_or_wait(p.sock.fd(), std::move(payload), deadline, peer, what,
                    [&] { await_writable(peer, deadline, what); });
}

std::uint64_t TcpTransport::round_trip(int peer, const Request& req, const char* what) {
  send_request(peer, req, {}, what);
  std::uint64_t reply = 0;
  recv_all(peers_[peer].sock.fd(), &reply, sizeof reply, Deadline::in(timeout_s_), peer, what);
  peers_[peer].writes_unacked = false;
  return reply;
}

void TcpTransport::flush_remote(int peer) {
  drain(peer);
  if (!peers_[peer].writes_unacked) return;
  Request req;
  req.op = kFlush;
  round_trip(peer, req, "flush");
}

void TcpTransport::get(Region& region, int peer, std::uint64_t offset, void* dst, std::size_t bytes) {
  auto& r = as_tcp(region);
  r.check_range(peer, offset, bytes, "get");
  if (same_node(peer)) return local_->get(r.inner(), node_rank_[peer], offset, dst, bytes);
  if (bytes == 0) return;
  Request req;
  req.op = kGet;
  req.region = r.id();
  req.offset = offset;
  req.a = bytes;
  send_request(peer, req, {}, "get");
  peers_[peer].gets.push_back({dst, bytes});
  peers_[peer].writes_unacked = false;  // its reply follows every earlier write's effect
}

const void* TcpTransport::local_view(Region& region, int peer, std::uint64_t offset, std::size_t bytes) {
  auto& r = as_tcp(region);
  r.check_range(peer, offset, bytes, "local_view");
  return same_node(peer) ? local_->local_view(r.inner(), node_rank_[peer], offset, bytes) : nullptr;
}

std::uint32_t* TcpTransport::shared_word(Region& region, int peer, std::uint64_t offset) {
  auto& r = as_tcp(region);
  r.check_range(peer, offset, sizeof(std::uint32_t), "shared_word");
  // A rank alone on its node (or every rank its own node, STRATA_TCP_FORCE_REMOTE) has nobody to share a word with.
  return same_node(peer) && local_->size() > 1 ? local_->shared_word(r.inner(), node_rank_[peer], offset) : nullptr;
}

void TcpTransport::release_view(Region& region, const void* view, std::size_t bytes) {
  // Views exist only for co-located peers, served by the node-local transport.
  local_->release_view(as_tcp(region).inner(), view, bytes);
}

void TcpTransport::put(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes) {
  auto& r = as_tcp(region);
  r.check_range(peer, offset, bytes, "put");
  if (same_node(peer)) return local_->put(r.inner(), node_rank_[peer], offset, src, bytes);
  if (bytes == 0) return;
  Request req;
  req.op = kPut;
  req.region = r.id();
  req.offset = offset;
  req.a = bytes;
  send_request(peer, req, {iovec{const_cast<void*>(src), bytes}}, "put");
  peers_[peer].writes_unacked = true;
}

void TcpTransport::accumulate(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t count,
                              ElemType type) {
  auto& r = as_tcp(region);
  const std::size_t bytes = count * elem_size(type);
  r.check_range(peer, offset, bytes, "accumulate");
  if (same_node(peer)) return local_->accumulate(r.inner(), node_rank_[peer], offset, src, count, type);
  if (count == 0) return;
  if (offset % elem_size(type) != 0)
    throw Error("accumulate: offset " + std::to_string(offset) + " is not aligned to " + to_string(type));
  Request req;
  req.op = kAcc;
  req.region = r.id();
  req.offset = offset;
  req.a = bytes;
  req.b = static_cast<std::uint64_t>(type);
  send_request(peer, req, {iovec{const_cast<void*>(src), bytes}}, "accumulate");
  peers_[peer].writes_unacked = true;
}

void TcpTransport::get_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_bytes,
                            const std::vector<std::int64_t>& rows, void* dst) {
  if (rows.empty()) return;
  auto& r = as_tcp(region);
  const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end());
  if (*lo < 0) throw Error("get_rows: row index " + std::to_string(*lo) + " is negative");
  if (rows.size() > kMaxRowsPerRequest)
    throw Error("get_rows: " + std::to_string(rows.size()) + " rows in one request, more than " +
                std::to_string(kMaxRowsPerRequest));
  r.check_range(peer, offset, static_cast<std::uint64_t>(*hi + 1) * row_bytes, "get_rows");
  if (same_node(peer)) return local_->get_rows(r.inner(), node_rank_[peer], offset, row_bytes, rows, dst);
  Request req;
  req.op = kGetRows;
  req.region = r.id();
  req.offset = offset;
  req.a = row_bytes;
  req.b = rows.size();
  send_request(peer, req, {iovec{const_cast<std::int64_t*>(rows.data()), rows.size() * 8}}, "get_rows");
  peers_[peer].gets.push_back({dst, rows.size() * row_bytes});
  peers_[peer].writes_unacked = false;  // its reply follows every earlier write's effect
}

void TcpTransport::accumulate_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_elems,
                                   ElemType type, const std::vector<std::int64_t>& rows, const void* src) {
  if (rows.empty()) return;
  auto& r = as_tcp(region);
  const std::size_t row_bytes = row_elems * elem_size(type);
  const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end());
  if (*lo < 0) throw Error("accumulate_rows: row index " + std::to_string(*lo) + " is negative");
  if (rows.size() > kMaxRowsPerRequest)
    throw Error("accumulate_rows: " + std::to_string(rows.size()) + " rows in one request, more than " +
                std::to_string(kMaxRowsPerRequest));
  r.check_range(peer, offset, static_cast<std::uint64_t>(*hi + 1) * row_bytes, "accumulate_rows");
  if (same_node(peer)) return local_->accumulate_rows(r.inner(), node_rank_[peer], offset, row_elems, type, rows, src);
  Request req;
  req.op = kAccRows;
  req.region = r.id();
  req.offset = offset;
  req.a = row_elems;
  req.b = rows.size() | (static_cast<std::uint64_t>(type) << 56);
  send_request(peer, req,
               {iovec{const_cast<std::int64_t*>(rows.data()), rows.size() * 8},
                iovec{const_cast<void*>(src), rows.size() * row_bytes}},
               "accumulate_rows");
  peers_[peer].writes_unacked = true;
}

void TcpTransport::put_notify(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes,
                              std::size_t piece_bytes, std::uint64_t counter_offset, std::int64_t* readback,
                              std::uint64_t readback_offset) {
  auto& r = as_tcp(region);
  if (piece_bytes == 0) throw Error("put_notify: piece_bytes is 0");
  r.check_range(peer, offset, bytes, "put_notify");
  r.check_range(peer, counter_offset, 8, "put_notify (counter)");
  if (counter_offset % 8 != 0)
    throw Error("put_notify: counter offset " + std::to_string(counter_offset) + " is not aligned to int64");
  if (readback) r.check_range(peer, readback_offset, 8, "put_notify (read-back)");
  if (same_node(peer) || bytes == 0)
    return Transport::put_notify(region, peer, offset, src, bytes, piece_bytes, counter_offset, readback,
                                 readback_offset);
  Request req;
  req.op = kPutNotify;
  req.region = r.id();
  req.offset = offset;
  req.a = bytes;
  req.b = counter_offset;
  // Payload: piece size, read-back offset (kNoReadback: no reply), then the bytes. The two words
  // are sent before send_request returns.
  const std::uint64_t words[2] = {piece_bytes, readback ? readback_offset : kNoReadback};
  std::vector<iovec> payload{iovec{const_cast<std::uint64_t*>(words), sizeof words},
                             iovec{const_cast<void*>(src), bytes}};
  if (!readback) {
    send_request(peer, req, std::move(payload), "put_notify");
    peers_[peer].writes_unacked = true;
    return;
  }
  // The read-back is answered once every piece took effect, so it proves this write done: the
  // request may go out while earlier replies are still owed (a client can keep several requests
  // in flight to a PS that serves them on arrival; send_ahead keeps it free of deadlock).
  send_ahead(peer, req, std::move(payload), "put_notify");
  peers_[peer].gets.push_back({readback, sizeof *readback});
  peers_[peer].writes_unacked = false;
}

void TcpTransport::put_notify_get(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes,
                                  std::size_t piece_bytes, std::uint64_t counter_offset, std::int64_t* readback,
                                  std::uint64_t readback_offset, std::uint64_t get_offset, void* dst,
                                  std::size_t get_bytes) {
  auto& r = as_tcp(region);
  if (!readback) throw Error("put_notify_get: no read-back word");
  if (piece_bytes == 0) throw Error("put_notify_get: piece_bytes is 0");
  r.check_range(peer, offset, bytes, "put_notify_get");
  r.check_range(peer, counter_offset, 8, "put_notify_get (counter)");
  if (counter_offset % 8 != 0)
    throw Error("put_notify_get: counter offset " + std::to_string(counter_offset) + " is not aligned to int64");
  r.check_range(peer, readback_offset, 8, "put_notify_get (read-back)");
  r.check_range(peer, get_offset, get_bytes, "put_notify_get (get)");
  if (same_node(peer) || bytes == 0)
    return Transport::put_notify_get(region, peer, offset, src, bytes, piece_bytes, counter_offset, readback,
                                     readback_offset, get_offset, dst, get_bytes);
  Request req;
  req.op = kPutNotifyGet;
  req.region = r.id();
  req.offset = offset;
  req.a = bytes;
  req.b = counter_offset;
  // Payload: piece size, read-back offset, get offset, get size, then the bytes.
  const std::uint64_t words[4] = {piece_bytes, readback_offset, get_offset, get_bytes};
  send_ahead(peer, req,
             {iovec{const_cast<std::uint64_t*>(words), sizeof words}, iovec{const_cast<void*>(src), bytes}},
             "put_notify_get");
  peers_[peer].gets.push_back({readback, sizeof *readback});
  if (get_bytes > 0) peers_[peer].gets.push_back({dst, get_bytes});
  peers_[peer].writes_unacked = false;  // the answer follows the put's effects
}

bool TcpTransport::consume_notified(Region& region, std::uint64_t counter_offset, PieceHandler handler) {
  as_tcp(region).set_handler(counter_offset, std::move(handler));
  return true;
}

std::int64_t TcpTransport::fetch_add(Region& region, int peer, std::uint64_t offset, std::int64_t value) {
  auto& r = as_tcp(region);
  r.check_range(peer, offset, 8, "fetch_add");
  if (same_node(peer)) return local_->fetch_add(r.inner(), node_rank_[peer], offset, value);
  Request req;
  req.op = kFetchAdd;
  req.region = r.id();
  req.offset = offset;
  req.a = static_cast<std::uint64_t>(value);
  return static_cast<std::int64_t>(round_trip(peer, req, "fetch_add"));
}

std::int64_t TcpTransport::atomic_read(Region& region, int peer, std::uint64_t offset) {
  auto& r = as_tcp(region);
  r.check_range(peer, offset, 8, "atomic_read");
  if (same_node(peer)) return local_->atomic_read(r.inner(), node_rank_[peer], offset);
  Request req;
  req.op = kRead;
  req.region = r.id();
  req.offset = offset;
  return static_cast<std::int64_t>(round_trip(peer, req, "atomic_read"));
}

void TcpTransport::flush(Region& region, int peer) {
  auto& r = as_tcp(region);
  if (same_node(peer)) return local_->flush(r.inner(), node_rank_[peer]);
  flush_remote(peer);
}

void TcpTransport::flush_all(Region& region) {
  local_->flush_all(as_tcp(region).inner());
  for (int p = 0; p < size_; ++p)
    if (!same_node(p) && peers_[p].sock.valid()) flush_remote(p);
}

void TcpTransport::sync_local(Region& region) {
  local_->sync_local(as_tcp(region).inner());
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the server thread's stores
}

void TcpTransport::progress() {
  // Remote requests are served by the server thread; the node window may want progress, and
  // replies already here are taken in (a server never waits long to send them).
  // The client side belongs to the rank's own thread; a handler on the server thread that calls
  // progress (a PS applying a push it was handed) must not touch it.
  local_->progress();
  if (std::this_thread::get_id() == server_.get_id()) return;
  for (int p = 0; p < size_; ++p)
    if (peers_[p].owes()) receive_some(p);
}

// ---- server thread ----------------------------------------------------------------------------

TcpRegion* TcpTransport::region_by_id(std::uint32_t id) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  return id < regions_.size() ? regions_[id] : nullptr;
}

bool TcpTransport::region_abandoned(std::uint32_t id) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  return id < abandoned_.size() && abandoned_[id];
}

bool TcpTransport::handle(int fd, int from) {
  Request req;
  if (!recv_all_or_eof(fd, &req, sizeof req, Deadline::in(timeout_s_), from, "request")) return false;
  const Deadline deadline = Deadline::in(timeout_s_);
  if (req.op == kFlush) {
    const std::uint64_t ok = 0;
    send_all(fd, &ok, sizeof ok, deadline, from, "flush reply");
    return true;
  }
  // Held while the request is served: a region is never freed under it (~TcpRegion).
  std::lock_guard<std::mutex> serving(serving_mu_);
  TcpRegion* r = region_by_id(req.region);
  if (!r && region_abandoned(req.region)) throw AbandonedRegion();
  if (!r) throw Error("request " + std::to_string(req.op) + " from " + rank_str(from) + " for region " +
                      std::to_string(req.region) + ", which does not exist here");
  // Everything in the header is checked before it is used or allocated for; row indices are
  // checked below as they arrive. The peer proved the job's secret, so a bad request is a bug in
  // strata: it ends the job naming the rank (serve()).
  const std::uint64_t region_bytes = r->local_bytes();
  if (std::string bad = check_request(req, region_bytes); !bad.empty())
    throw Error("malformed request " + std::to_string(req.op) + " from " + rank_str(from) + " for region " +
                std::to_string(req.region) + ": " + bad);
  // A row index is valid when its whole row lies inside the region after the table's offset.
  auto check_rows = [&](const std::vector<std::int64_t>& rows, std::uint64_t row_bytes, const char* what) {
    const std::uint64_t max_rows = (region_bytes - req.offset) / row_bytes;
    for (const std::int64_t row : rows)
      if (row < 0 || static_cast<std::uint64_t>(row) >= max_rows)
        throw Error(std::string(what) + " from " + rank_str(from) + ": row index " + std::to_string(row) +
                    " is outside the " + std::to_string(max_rows) + " rows the region holds there");
  };
  char* base = static_cast<char*>(r->local_base());
  const int self = node_rank_[rank_];
  static thread_local std::vector<char> staging;
  switch (req.op) {
    case kGet:
      r->check_local(req.offset, req.a, "get (served)");
      send_all(fd, base + req.offset, req.a, deadline, from, "get reply");
      break;
    case kPut:
      r->check_local(req.offset, req.a, "put (served)");
      recv_all(fd, base + req.offset, req.a, deadline, from, "put payload");
      std::atomic_thread_fence(std::memory_order_seq_cst);
      break;
    case kPutNotify:
    case kPutNotifyGet: {
      // piece size, read-back offset (kNoReadback: none), and for kPutNotifyGet the get's offset and size
      std::uint64_t words[4] = {0, 0, 0, 0};
      const bool with_get = req.op == kPutNotifyGet;
      recv_all(fd, words, with_get ? 32 : 16, deadline, from, "put_notify piece size");
      const std::uint64_t piece = words[0];
      r->check_local(req.offset, req.a, "put_notify (served)");
      r->check_local(req.b, 8, "put_notify counter (served)");
      if (words[1] != kNoReadback || with_get) r->check_local(words[1], 8, "put_notify read-back (served)");
      if (with_get) r->check_local(words[2], words[3], "put_notify_get get (served)");
      if (piece == 0 || req.b % 8 != 0) throw Error("put_notify from " + rank_str(from) + ": bad piece size or counter");
      // Answered once every piece took effect (handed over or stored and counted): the read-back
      // word, and the get's bytes behind it in the same send.
      auto answer = [&] {
        if (words[1] == kNoReadback && !with_get) return;
        const std::int64_t v = local_->atomic_read(r->inner(), self, words[1]);
        if (!with_get) {
          send_all(fd, &v, sizeof v, deadline, from, "put_notify read-back");
        } else {
          std::atomic_thread_fence(std::memory_order_seq_cst);  // the consumer's stores, on this thread
          sendv_all(fd, {iovec{const_cast<std::int64_t*>(&v), sizeof v}, iovec{base + words[2], words[3]}}, deadline,
                    from, "put_notify_get reply");
        }
      };
      const std::int64_t one = 1;
      // Pieces with a consumer are received into a buffer that fits in cache and handed over
      // from there: the consumer reads them while they are hot, and a receive into cache holds
      // the socket's lock for less time than one into cold memory (arriving packets wait in the
      // backlog meanwhile), which docs/PERFORMANCE.md shows is the faster way to receive 16 MiB
      // between nodes.
      if (r->has_handler(req.b)) {
        staging.resize(std::min(piece, req.a));
        for (std::uint64_t done = 0; done < req.a; done += piece) {
          const std::uint64_t len = std::min(piece, req.a - done);
          recv_all(fd, staging.data(), len, deadline, from, "put_notify payload");
          if (!r->hand_over(req.b, req.offset + done, staging.data(), len))
            throw Error("put_notify from " + rank_str(from) + ": the consumer of counter " + std::to_string(req.b) +
                        " went away during a put");
        }
        answer();
        break;
      }
      for (std::uint64_t done = 0; done < req.a; done += piece) {
        const std::uint64_t len = std::min(piece, req.a - done);
        recv_all(fd, base + req.offset + done, len, deadline, from, "put_notify payload");
        // The piece's bytes are stored before the count that publishes them (the owner loads the
        // counter with acquire ordering after sync_local).
        std::atomic_thread_fence(std::memory_order_seq_cst);
        local_->accumulate(r->inner(), self, req.b, &one, 1, ElemType::kI64);
        local_->flush(r->inner(), self);
      }
      answer();
      break;
    }
    case kAcc: {
      // Piece by piece: while one piece is summed into the region the kernel keeps receiving the
      // next into the socket buffer, so the sum overlaps the transfer instead of following it.
      r->check_local(req.offset, req.a, "accumulate (served)");
      const auto type = static_cast<ElemType>(req.b);
      const std::uint64_t esize = elem_size(type);
      const std::uint64_t piece = kAccPieceBytes / esize * esize;
      staging.resize(std::min<std::uint64_t>(req.a, piece));
      for (std::uint64_t done = 0; done < req.a; done += piece) {
        const std::uint64_t len = std::min(piece, req.a - done);
        recv_all(fd, staging.data(), len, deadline, from, "accumulate payload");
        local_->accumulate(r->inner(), self, req.offset + done, staging.data(), len / esize, type);
      }
      local_->flush(r->inner(), self);
      break;
    }
    case kGetRows: {
      std::vector<std::int64_t> rows(req.b);
      recv_all(fd, rows.data(), rows.size() * 8, deadline, from, "get_rows indices");
      const std::uint64_t row_bytes = req.a;
      check_rows(rows, row_bytes, "get_rows");
      // Random rows of a large table are bound by memory latency (a cache and TLB miss each):
      // gathered with prefetching a few rows ahead, piece by piece, each piece sent while the
      // kernel still moves the previous one.
      const char* table = base + req.offset;
      const std::size_t per_piece = std::max<std::size_t>(1, kGatherPieceBytes / std::max<std::uint64_t>(1, row_bytes));
      staging.resize(std::min(rows.size(), per_piece) * row_bytes);
      constexpr std::size_t kAhead = 16;
      auto prefetch = [&](std::size_t i) {
        const char* p = table + static_cast<std::uint64_t>(rows[i]) * row_bytes;
        for (std::uint64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(p + b, 0, 0);
      };
      for (std::size_t i = 0; i < std::min(kAhead, rows.size()); ++i) prefetch(i);
      for (std::size_t first = 0; first < rows.size(); first += per_piece) {
        const std::size_t n = std::min(per_piece, rows.size() - first);
        for (std::size_t i = 0; i < n; ++i) {
          if (first + i + kAhead < rows.size()) prefetch(first + i + kAhead);
          std::memcpy(staging.data() + i * row_bytes, table + static_cast<std::uint64_t>(rows[first + i]) * row_bytes,
                      row_bytes);
        }
        send_all(fd, staging.data(), n * row_bytes, deadline, from, "get_rows reply");
      }
      break;
    }
    case kAccRows: {
      const std::uint64_t n = req.b & ((std::uint64_t{1} << 56) - 1);
      const auto type = static_cast<ElemType>(req.b >> 56);
      std::vector<std::int64_t> rows(n);
      recv_all(fd, rows.data(), n * 8, deadline, from, "accumulate_rows indices");
      check_rows(rows, req.a * elem_size(type), "accumulate_rows");
      staging.resize(n * req.a * elem_size(type));
      recv_all(fd, staging.data(), staging.size(), deadline, from, "accumulate_rows payload");
      local_->accumulate_rows(r->inner(), self, req.offset, req.a, type, rows, staging.data());
      local_->flush(r->inner(), self);
      break;
    }
    case kFetchAdd: {
      const std::int64_t old = local_->fetch_add(r->inner(), self, req.offset, static_cast<std::int64_t>(req.a));
      send_all(fd, &old, sizeof old, deadline, from, "fetch_add reply");
      break;
    }
    case kRead: {
      const std::int64_t v = local_->atomic_read(r->inner(), self, req.offset);
      send_all(fd, &v, sizeof v, deadline, from, "atomic_read reply");
      break;
    }
    default:
      throw Error("unknown request " + std::to_string(req.op) + " from " + rank_str(from));
  }
  return true;
}

double TcpTransport::handshake_timeout_s() const { return std::min(timeout_s_, kHandshakeTimeoutS); }

void TcpTransport::serve() {
  struct Conn {  // an authenticated connection from rank `from`
    Socket sock;
    int from;
  };
  struct Pending {  // a connection still in its handshake: non-blocking, never waited on
    Socket sock;
    Endpoint from;
    Clock::time_point deadline;
    ServerHandshake hs;
    std::string buf;  // the part of the next message received so far
  };
  std::vector<Conn> conns;
  std::vector<Conn> parked;  // open, never read again (AbandonedRegion)
  std::vector<std::unique_ptr<Pending>> pending;  // oldest first
  std::vector<pollfd> fds;
  RefusalLog refusals(rank_);
  const auto handshake_window = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(handshake_timeout_s()));

  // Reads what a pending connection has; returns false when it must be closed (why in *why).
  auto advance = [&](Pending& p, std::string* why) {
    while (true) {
      char chunk[128];
      const std::size_t want = p.hs.wants() - p.buf.size();
      const ssize_t n = ::recv(p.sock.fd(), chunk, std::min(want, sizeof chunk), 0);
      if (n == 0) {
        *why = p.buf.empty() && p.hs.wants() == sizeof(Hello) ? "closed without a word"
                                                              : "closed during the handshake";
        return false;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        *why = std::string("receive failed: ") + std::strerror(errno);
        return false;
      }
      p.buf.append(chunk, static_cast<std::size_t>(n));
      if (p.buf.size() < p.hs.wants()) continue;
      ServerHandshake::Step step = p.hs.on_message(p.buf.data(), p.buf.size());
      p.buf.clear();
      if (!step.refused.empty()) {
        *why = step.refused;
        return false;
      }
      if (step.proven) {
        const int claimed = p.hs.claimed_rank();
        if (p.from.ip != endpoints_[claimed].ip) {
          *why = "it proved the secret as " + rank_str(claimed) + " but connects from " + p.from.str() +
                 ", not from that rank's address " + endpoints_[claimed].str();
          return false;
        }
        for (const auto& c : conns)
          if (c.from == claimed) {
            *why = rank_str(claimed) + " already has a connection";
            return false;
          }
        step.reply.assign(reinterpret_cast<const char*>(&kAcceptWord), sizeof kAcceptWord);
      }
      // Replies are at most 64 bytes on a fresh connection: they fit in the socket buffer, and a
      // peer that does not read them is not waited for.
      if (!step.reply.empty() &&
          ::send(p.sock.fd(), step.reply.data(), step.reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
              static_cast<ssize_t>(step.reply.size())) {
        *why = "it does not take the handshake's reply";
        return false;
      }
      if (step.proven) return true;
    }
  };

  try {
    while (!stop_.load()) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listener_.fd(), POLLIN, 0});
      for (const auto& c : conns) fds.push_back({c.sock.fd(), POLLIN, 0});
      for (const auto& p : pending) fds.push_back({p->sock.fd(), POLLIN, 0});
      // Sleeps in the kernel until a request arrives (no core spent while idle), or until the
      // oldest handshake's deadline.
      int wait_ms = -1;
      if (!pending.empty()) {
        Clock::time_point first = pending.front()->deadline;
        for (const auto& p : pending) first = std::min(first, p->deadline);
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(first - Clock::now()).count();
        wait_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, 1000));
      }
      if (::poll(fds.data(), fds.size(), wait_ms) < 0) {
        if (errno == EINTR) continue;
        throw Error("poll failed");
      }
      if (fds[0].revents) break;

      std::vector<std::size_t> gone;
      for (std::size_t i = 0; i < conns.size(); ++i) {
        if (!fds[2 + i].revents) continue;
        Conn& c = conns[i];
        bool open = true;
        try {
          open = handle(c.sock.fd(), c.from);
        } catch (const PeerFailure&) {
          open = false;  // the client died mid-request: its own job failure reports it
        } catch (const AbandonedRegion&) {
          // A request for a region this rank dropped while failing: this rank's own error ends
          // the job and names the cause. Neither served nor refused (a closed connection or an
          // abort here would have the peer or this thread report first, hiding that cause): the
          // connection stays open and unread, and the peer waits within its deadline.
          parked.push_back(std::move(c));
          open = false;
        }
        if (!open) gone.push_back(i);
      }
      for (auto it = gone.rbegin(); it != gone.rend(); ++it) conns.erase(conns.begin() + static_cast<long>(*it));

      // Handshakes: advance those with bytes, admit the proven, drop the refused and the late.
      const auto now = Clock::now();
      const std::size_t first_pending = 2 + conns.size() + gone.size();
      std::vector<std::unique_ptr<Pending>> still;
      for (std::size_t i = 0; i < pending.size(); ++i) {
        Pending& p = *pending[i];
        std::string why;
        bool keep = true;
        if (fds[first_pending + i].revents) keep = advance(p, &why);
        if (keep && p.hs.wants() == 0) {
          set_blocking(p.sock.fd(), true);
          tune(p.sock.fd());
          conns.push_back({std::move(p.sock), p.hs.claimed_rank()});
          continue;
        }
        if (keep && now > p.deadline) {
          keep = false;
          why = "no handshake within " + std::to_string(static_cast<int>(handshake_timeout_s())) + " s";
        }
        if (keep)
          still.push_back(std::move(pending[i]));
        else
          refusals.refused(p.from, why);
      }
      pending.swap(still);

      if (fds[1].revents & POLLIN) {
        // Every connection waiting in the backlog is taken now: a stranger's never waits for the
        // next poll, and none of them is read here.
        while (true) {
          Endpoint from;
          int err = 0;
          Socket s = try_accept(listener_, &from, &err);
          if (!s.valid()) {
            if (err != 0) refusals.refused(Endpoint{}, std::string("accept failed: ") + std::strerror(err));
            break;
          }
          if (pending.size() >= kMaxPending) {
            refusals.refused(pending.front()->from, "too many unauthenticated connections at once (" +
                                                        std::to_string(kMaxPending) + "); the oldest is dropped");
            pending.erase(pending.begin());
          }
          pending.push_back(std::make_unique<Pending>(Pending{std::move(s), from, Clock::now() + handshake_window,
                                                              ServerHandshake(*secret_, Purpose::kDataPlane, size_, rank_),
                                                              {}}));
        }
      }
    }
  } catch (const std::exception& e) {
    // A served request failed on our side or an authenticated peer sent what strata never sends:
    // a bug or memory corruption; the job cannot go on consistently, so it ends here with the
    // reason (fail-stop, docs/RELIABILITY.md).
    std::cerr << "strata: [rank " << rank_ << "] tcp transport server: " << e.what() << std::endl;
    MPI_Abort(comm_, 1);
  }
}

}  // namespace strata::comm::tcp
