// UCX transport (see ucx_transport.h for the overview).
//
// Accumulate protocol (floating point). UCP's AMOs are integer only, so an element-wise float sum
// needs either (a) an active message to the owner, applied by the owner inside its progress(), or
// (b) read-modify-write by the initiator under mutual exclusion. We use (b): every region carries
// kLocks lock words after its user bytes (one per cache line, zero at allocation), and byte range
// [k * kStripeBytes, (k + 1) * kStripeBytes) of a region is guarded by lock word k % kLocks.
// An accumulate splits its range at stripe boundaries and, stripe by stripe:
//   1. takes the stripe's lock with ucp_atomic_op_nbx(CSWAP 0 -> rank + 1), retrying with a bounded
//      backoff until the deadline (a timeout names the rank holding it);
//   2. adds its elements: in place through the ucp_rkey_ptr mapping when UCX has one (co-located
//      peer), else ucp_get_nbx into a staging buffer, add, ucp_put_nbx back, ucp_ep_flush_nbx;
//   3. releases the lock with ucp_atomic_op_nbx(SWAP 0), after the data is remotely complete.
// At most one lock is held at a time, so there is no lock-order deadlock. Concurrent accumulates
// into the same bytes from any number of ranks are serialised per stripe, hence exact; disjoint
// stripes proceed in parallel.
// Why not (a): an active message completes only when the owner calls into UCX. The PS service loop
// does, but the owner of a region is often inside a plain MPI_Barrier or computing (tests, the end
// of a PS run, any caller of the Transport interface), and UCP_MEM_MAP_ALLOCATE memory lets every
// other operation here complete without the owner (ucx_transport.h says why): a lock keeps accumulate
// one-sided too, like MPI_Accumulate on an osc-sm window. The cost is a lock round trip per
// stripe (sub-microsecond over shared memory) and, without direct access, two copies.
// int64 accumulates use UCP_ATOMIC_OP_ADD per element instead, so they are atomic with fetch_add
// on the same words as the Transport contract requires. Lock words and counters are only ever
// touched through UCP atomics, never through the direct mapping, so UCX keeps them in one atomicity
// domain whatever lane it picks.
#include "comm/ucx/ucx_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"

namespace strata::comm::ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kStripeBytes = std::uint64_t{256} << 10;  // bytes guarded by one lock
constexpr std::uint64_t kLocks = 64;                               // lock words per region
constexpr std::uint64_t kLockStride = 64;                          // one lock per cache line

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

std::string where(const char* file, int line) {
  return "(" + detail::short_path(file) + ":" + std::to_string(line) + ")";
}

[[noreturn]] void fail_ucs(ucs_status_t status, const std::string& what, const char* file, int line) {
  throw UcxError(static_cast<int>(status),
                 what + " failed: " + ucs_status_string(status) + " " + where(file, line));
}

#define STRATA_CHECK_UCS(expr)                                                            \
  do {                                                                                    \
    if (ucs_status_t strata_st_ = (expr); strata_st_ != UCS_OK)                           \
      ::strata::comm::ucx::fail_ucs(strata_st_, #expr, __FILE__, __LINE__);               \
  } while (0)

std::string to_peer(int peer) { return "rank " + std::to_string(peer); }

class Deadline {
 public:
  explicit Deadline(double seconds)
      : end_(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))) {}
  bool passed() const { return Clock::now() > end_; }

 private:
  Clock::time_point end_;
};

// Polling backoff for a wait whose progress calls find nothing to do: spin first (operations
// over shared memory complete in well under a microsecond), then yield, and only after a long
// quiet spell sleep briefly, so an oversubscribed node keeps its cores for the ranks doing work
// (2-core CI machines run 5 ranks) without slowing transfers that need our progress (TCP).
class Backoff {
 public:
  void pause() {
    ++n_;
    if (n_ < 256) return;
    if (n_ < 16384) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::min<int>(50, (n_ - 16384) / 256 + 1)));
  }

 private:
  int n_ = 0;
};

// d[i] += s[i], four 16-byte vectors (GCC/Clang vector extensions) per step: GCC's -O2 cost model
// leaves a plain loop of unknown trip count scalar. Element-wise, so the sums are the same bits as
// the scalar loop's.
template <typename T>
void add_into(char* dst, const char* src, std::uint64_t bytes) {
  typedef T Vec __attribute__((vector_size(16)));
  const std::uint64_t n = bytes / sizeof(T);
  constexpr std::uint64_t kPerVec = 16 / sizeof(T);
  std::uint64_t i = 0;
  auto load = [](const char* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  for (; i + 4 * kPerVec <= n; i += 4 * kPerVec) {
    char* d = dst + i * sizeof(T);
    const char* s = src + i * sizeof(T);
    const Vec r0 = load(d) + load(s), r1 = load(d + 16) + load(s + 16);
    const Vec r2 = load(d + 32) + load(s + 32), r3 = load(d + 48) + load(s + 48);
    std::memcpy(d, &r0, 16);
    std::memcpy(d + 16, &r1, 16);
    std::memcpy(d + 32, &r2, 16);
    std::memcpy(d + 48, &r3, 16);
  }
  for (; i < n; ++i) {
    T a, b;
    std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
    std::memcpy(&b, src + i * sizeof(T), sizeof(T));
    a += b;
    std::memcpy(dst + i * sizeof(T), &a, sizeof(T));
  }
}

void add_typed(char* dst, const char* src, std::uint64_t bytes, ElemType type) {
  switch (type) {
    case ElemType::kF32: add_into<float>(dst, src, bytes); return;
    case ElemType::kF64: add_into<double>(dst, src, bytes); return;
    case ElemType::kI64: add_into<std::int64_t>(dst, src, bytes); return;
  }
}

}  // namespace

// ---- regions ------------------------------------------------------------------------------------

// A region: this rank's mapping (UCP_MEM_MAP_ALLOCATE, zero-filled, plus the lock words) and, per
// peer, its size, base address, unpacked rkey and direct pointer (nullptr without one).
class UcxRegion final : public Region {
 public:
  struct Peer {
    std::uint64_t bytes = 0;   // user bytes the peer exposes
    std::uint64_t base = 0;    // remote virtual address of its mapping
    ucp_rkey_h rkey = nullptr;
    char* direct = nullptr;    // the peer's mapping in this process, if UCX offers one
  };

  // Collective over the transport's communicator.
  UcxRegion(UcxTransport& t, std::size_t local_bytes) : t_(t), local_bytes_(local_bytes) {
    const int n = t.size_;
    if (local_bytes_ > 0) {
      // User bytes, then kLocks lock words on their own cache lines.
      const std::uint64_t mapped = align_up(local_bytes_, kLockStride) + kLocks * kLockStride;
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      mp.address = nullptr;
      mp.length = mapped;
      mp.flags = UCP_MEM_MAP_ALLOCATE;
      STRATA_CHECK_UCS(ucp_mem_map(t.context_, &mp, &memh_));
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
      STRATA_CHECK_UCS(ucp_mem_query(memh_, &attr));
      base_ = static_cast<char*>(attr.address);
      std::memset(base_, 0, mapped);
    }
    // Exchange (bytes, base) and the packed rkeys.
    void* packed = nullptr;
    std::size_t packed_size = 0;
    if (memh_) STRATA_CHECK_UCS(ucp_rkey_pack(t.context_, memh_, &packed, &packed_size));
    std::uint64_t mine[2] = {local_bytes_, reinterpret_cast<std::uint64_t>(base_)};
    std::vector<std::uint64_t> info(2 * static_cast<std::size_t>(n));
    int my_len = static_cast<int>(packed_size);
    std::vector<int> lens(n), displs(n);
    int rc = MPI_Allgather(mine, 2, MPI_UINT64_T, info.data(), 2, MPI_UINT64_T, t.comm_);
    if (rc == MPI_SUCCESS) rc = MPI_Allgather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, t.comm_);
    std::vector<char> keys;
    if (rc == MPI_SUCCESS) {
      int total = 0;
      for (int p = 0; p < n; ++p) {
        displs[p] = total;
        total += lens[p];
      }
      keys.resize(std::max(total, 1));
      rc = MPI_Allgatherv(packed, my_len, MPI_BYTE, keys.data(), lens.data(), displs.data(), MPI_BYTE, t.comm_);
    }
    if (packed) ucp_rkey_buffer_release(packed);
    STRATA_CHECK_MPI(rc);
    peers_.resize(n);
    for (int p = 0; p < n; ++p) {
      Peer& peer = peers_[p];
      peer.bytes = info[2 * p];
      peer.base = info[2 * p + 1];
      if (peer.bytes == 0) continue;
      ucs_status_t st = ucp_ep_rkey_unpack(t.eps_[p], keys.data() + displs[p], &peer.rkey);
      if (st != UCS_OK) fail_ucs(st, "ucp_ep_rkey_unpack(rkey of " + to_peer(p) + ")", __FILE__, __LINE__);
      if (!t.direct_) continue;
      if (p == t.rank_) {
        peer.direct = base_;  // our own memory
        continue;
      }
      void* ptr = nullptr;
      if (ucp_rkey_ptr(peer.rkey, peer.base, &ptr) == UCS_OK) peer.direct = static_cast<char*>(ptr);
    }
    int direct_peers = 0;
    for (const auto& p : peers_) direct_peers += p.direct != nullptr;
    STRATA_LOG(DEBUG) << "ucx region of " << local_bytes_ << " bytes: direct access to " << direct_peers << " of "
                      << n << " ranks";
    // Zero-fill and keys are in place everywhere before anyone accesses a peer.
    t.progressing_barrier("region allocation");
  }

  ~UcxRegion() override {
    // Collective; never throws. While an exception unwinds, peers are not freeing with us and may
    // still access this memory: leave everything to the job's abort, as MpiRegion does.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || std::uncaught_exceptions() > 0) return;
    try {
      // Our own operations first, then wait until no peer can still be accessing our memory.
      t_.wait_gets(-1, "region release");
      t_.wait(ucp_worker_flush_nbx(t_.worker_, &no_param_), t_.rank_, "ucp_worker_flush_nbx (region release)");
      t_.progressing_barrier("region release");
    } catch (const std::exception& e) {
      STRATA_LOG(ERROR) << "releasing a UCX region failed: " << e.what();
      std::terminate();
    }
    for (auto& p : peers_)
      if (p.rkey) ucp_rkey_destroy(p.rkey);
    if (memh_) ucp_mem_unmap(t_.context_, memh_);
  }

  void* local_base() override { return local_bytes_ ? base_ : nullptr; }
  std::size_t local_bytes() const override { return local_bytes_; }
  std::size_t bytes_of(int peer) const override { return static_cast<std::size_t>(peers_.at(peer).bytes); }

  const Peer& peer(int p) const { return peers_[p]; }
  // Offset (in `p`'s mapping) of the lock word guarding stripe `stripe`.
  std::uint64_t lock_offset(int p, std::uint64_t stripe) const {
    return align_up(peers_[p].bytes, kLockStride) + (stripe % kLocks) * kLockStride;
  }

  void check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= static_cast<int>(peers_.size()))
      throw Error(std::string(op) + ": peer " + std::to_string(peer) + " is not a rank of the transport (size " +
                  std::to_string(peers_.size()) + ")");
  }
  void check_range(int peer, std::uint64_t offset, std::uint64_t bytes, const char* op) const {
    check_peer(peer, op);
    const std::uint64_t size = peers_[peer].bytes;
    if (offset + bytes > size || offset + bytes < offset)
      throw Error(std::string(op) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                  ") are outside rank " + std::to_string(peer) + "'s region of " + std::to_string(size) + " bytes");
  }

 private:
  UcxTransport& t_;
  std::size_t local_bytes_;
  ucp_mem_h memh_ = nullptr;
  char* base_ = nullptr;
  std::vector<Peer> peers_;
  ucp_request_param_t no_param_{};
};

namespace {
UcxRegion& as_ucx(Region& region) { return static_cast<UcxRegion&>(region); }
}  // namespace

struct UcxTransport::Piece {
  std::uint64_t offset = 0;  // in the peer's region
  std::uint64_t bytes = 0;
  const char* src = nullptr;
  std::uint64_t stripe() const { return offset / kStripeBytes; }
};

// ---- transport ----------------------------------------------------------------------------------

UcxTransport::UcxTransport(MPI_Comm comm) {
  STRATA_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  STRATA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  STRATA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  STRATA_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  const Env env = Env::from_process();
  timeout_s_ = timeout_from_env(env);
  direct_ = env.get_bool("STRATA_UCX_DIRECT", true);

  ucp_config_t* config = nullptr;
  STRATA_CHECK_UCS(ucp_config_read(nullptr, nullptr, &config));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64;
  params.estimated_num_eps = static_cast<std::size_t>(size_);
  ucs_status_t st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) fail_ucs(st, "ucp_init(RMA | AMO64)", __FILE__, __LINE__);

  // One worker driven by one thread at a time (Transport's threading contract): serialized mode,
  // so UCX takes no locks but tolerates the driving thread changing between calls.
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  STRATA_CHECK_UCS(ucp_worker_create(context_, &wp, &worker_));

  // Worker addresses: lengths, then the bytes.
  ucp_address_t* address = nullptr;
  std::size_t address_len = 0;
  STRATA_CHECK_UCS(ucp_worker_get_address(worker_, &address, &address_len));
  int my_len = static_cast<int>(address_len);
  std::vector<int> lens(size_), displs(size_);
  int rc = MPI_Allgather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_);
  std::vector<char> all;
  if (rc == MPI_SUCCESS) {
    int total = 0;
    for (int p = 0; p < size_; ++p) {
      displs[p] = total;
      total += lens[p];
    }
    all.resize(total);
    rc = MPI_Allgatherv(address, my_len, MPI_BYTE, all.data(), lens.data(), displs.data(), MPI_BYTE, comm_);
  }
  ucp_worker_release_address(worker_, address);
  STRATA_CHECK_MPI(rc);

  eps_.assign(size_, nullptr);
  unflushed_puts_.assign(size_, 0);
  gets_.resize(size_);
  for (int p = 0; p < size_; ++p) {
    gets_[p].owner = this;
    gets_[p].peer = p;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(all.data() + displs[p]);
    st = ucp_ep_create(worker_, &ep, &eps_[p]);
    if (st == UCS_ERR_UNREACHABLE) {
      // Every rank meets this at the same point (each connects to every peer), so it is reported
      // as a configuration error with the usual causes and fixes.
      const char* tls = std::getenv("UCX_TLS");
      throw ConfigError("--transport ucx: UCX cannot reach " + to_peer(p) + " (Destination is unreachable) with UCX_TLS=" +
                        (tls && *tls ? tls : "(unset)") +
                        ": no transport in it connects these ranks' nodes; include a network transport "
                        "(e.g. UCX_TLS=self,sm,tcp or rc); under srun --export a comma inside a value starts a "
                        "new variable (UCX_TLS=self,tcp becomes UCX_TLS=self), so export UCX_TLS before srun; or "
                        "use --transport auto");
    }
    if (st != UCS_OK) fail_ucs(st, "ucp_ep_create(" + to_peer(p) + ")", __FILE__, __LINE__);
  }
  // Wire-up completes once every endpoint is flushed while both sides progress; the progressing
  // barrier then keeps us answering peers that are still connecting to us.
  for (int p = 0; p < size_; ++p) flush_ep(p, "connection setup");
  progressing_barrier("connection setup");
  STRATA_LOG(DEBUG) << "ucx transport up: " << size_ << " ranks, direct access " << (direct_ ? "on" : "off");
}

UcxTransport::~UcxTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || std::uncaught_exceptions() > 0) return;  // the job is aborting: leave it to the abort
  try {
    wait_gets(-1, "transport shutdown");
    // Close every endpoint (flush mode: pending operations complete first), all at once, then
    // keep progressing until the peers closed theirs too.
    std::vector<ucs_status_ptr_t> closing;
    for (int p = 0; p < size_; ++p) {
      ucp_request_param_t cp{};
      cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      cp.flags = 0;
      closing.push_back(ucp_ep_close_nbx(eps_[p], &cp));
    }
    for (int p = 0; p < size_; ++p) wait(closing[p], p, "ucp_ep_close_nbx");
    progressing_barrier("transport shutdown");
  } catch (const std::exception& e) {
    STRATA_LOG(ERROR) << "shutting down the UCX transport failed: " << e.what();
    std::terminate();
  }
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
  MPI_Comm_free(&comm_);
}

std::string UcxTransport::describe() const {
  const char* tls = std::getenv("UCX_TLS");
  return std::string("UCX (UCP get/put/atomics; UCX_TLS=") + (tls && *tls ? tls : "all") + ")";
}

std::unique_ptr<Region> UcxTransport::allocate_region(std::size_t local_bytes) {
  return std::make_unique<UcxRegion>(*this, local_bytes);
}

// ---- waiting ------------------------------------------------------------------------------------

void UcxTransport::wait(ucs_status_ptr_t request, int peer, const char* what) {
  if (request == nullptr) return;  // completed in place
  if (UCS_PTR_IS_ERR(request)) fail_ucs(UCS_PTR_STATUS(request), std::string(what) + " with " + to_peer(peer), __FILE__, __LINE__);
  Deadline deadline(timeout_s_);
  Backoff backoff;
  ucs_status_t st;
  while ((st = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    const bool busy = ucp_worker_progress(worker_) != 0;
    if (deadline.passed()) {
      // The request is released by UCX when (if ever) it completes.
      ucp_request_free(request);
      log_endpoint(peer, what);
      throw TimeoutError(std::string("ucx: ") + what + " with " + to_peer(peer) + " did not complete within " +
                             std::to_string(timeout_s_) + " s (--timeout / STRATA_TIMEOUT_S)",
                         {peer});
    }
    if (!busy) backoff.pause();
  }
  ucp_request_free(request);
  if (st != UCS_OK) fail_ucs(st, std::string(what) + " with " + to_peer(peer), __FILE__, __LINE__);
}

void UcxTransport::log_endpoint(int peer, const char* what) const {
  // What UCX says of the endpoint an operation stalled on (its lanes and transports), for the
  // report of a timeout; UCX prints it only to a stream.
  char* text = nullptr;
  std::size_t length = 0;
  FILE* stream = open_memstream(&text, &length);
  if (stream == nullptr) return;
  if (peer >= 0 && static_cast<std::size_t>(peer) < eps_.size() && eps_[peer] != nullptr) ucp_ep_print_info(eps_[peer], stream);
  std::fclose(stream);
  STRATA_LOG(ERROR) << "ucx: " << what << " with " << to_peer(peer) << " stalled; its endpoint:\n"
                    << std::string(text, length);
  std::free(text);
}

void UcxTransport::get_done(void* request, ucs_status_t status, void* user_data) {
  auto* g = static_cast<PeerGets*>(user_data);
  --g->in_flight;
  --g->owner->total_gets_in_flight_;
  if (status != UCS_OK && g->status == UCS_OK) g->status = status;
  ucp_request_free(request);
}

void UcxTransport::wait_gets(int peer, const char* what) {
  auto pending = [&] { return peer < 0 ? total_gets_in_flight_ : gets_[peer].in_flight; };
  if (pending() > 0) {
    Deadline deadline(timeout_s_);
    Backoff backoff;
    while (pending() > 0) {
      const bool busy = ucp_worker_progress(worker_) != 0;
      if (deadline.passed()) {
        std::vector<int> late;
        for (const auto& g : gets_)
          if (g.in_flight > 0 && (peer < 0 || g.peer == peer)) late.push_back(g.peer);
        std::string names;
        for (int r : late) {
          names += (names.empty() ? "" : ",") + std::to_string(r);
          log_endpoint(r, what);
        }
        throw TimeoutError(std::string("ucx: ") + what + ": gets from rank(s) " + names +
                               " did not complete within " + std::to_string(timeout_s_) + " s (--timeout / STRATA_TIMEOUT_S)",
                           late);
      }
      if (!busy) backoff.pause();
    }
  }
  for (auto& g : gets_) {
    if ((peer >= 0 && g.peer != peer) || g.status == UCS_OK) continue;
    const ucs_status_t st = g.status;
    g.status = UCS_OK;
    fail_ucs(st, std::string("ucp_get_nbx from ") + to_peer(g.peer) + " (" + what + ")", __FILE__, __LINE__);
  }
}

void UcxTransport::flush_ep(int peer, const char* what) {
  ucp_request_param_t p{};
  wait(ucp_ep_flush_nbx(eps_[peer], &p), peer, what);
}

void UcxTransport::progressing_barrier(const char* what) {
  MPI_Request request;
  STRATA_CHECK_MPI(MPI_Ibarrier(comm_, &request));
  Deadline deadline(timeout_s_);
  Backoff backoff;
  int done = 0;
  while (true) {
    STRATA_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const bool busy = ucp_worker_progress(worker_) != 0;
    if (deadline.passed())
      throw TimeoutError(std::string("ucx: barrier (") + what + ") did not complete within " +
                             std::to_string(timeout_s_) + " s (--timeout / STRATA_TIMEOUT_S); some rank of the transport's " +
                             "communicator did not arrive",
                         {});
    if (!busy) backoff.pause();
  }
}

// ---- one-sided operations -----------------------------------------------------------------------

void UcxTransport::post_get(UcxRegion& r, int peer, std::uint64_t offset, void* dst, std::size_t bytes) {
  const auto& p = r.peer(peer);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransport::get_done;
  param.user_data = &gets_[peer];
  ucs_status_ptr_t req = ucp_get_nbx(eps_[peer], dst, bytes, p.base + offset, p.rkey, &param);
  if (req == nullptr) return;  // completed in place, no callback
  if (UCS_PTR_IS_ERR(req)) fail_ucs(UCS_PTR_STATUS(req), "ucp_get_nbx from " + to_peer(peer), __FILE__, __LINE__);
  ++gets_[peer].in_flight;
  ++total_gets_in_flight_;
}

void UcxTransport::get(Region& region, int peer, std::uint64_t offset, void* dst, std::size_t bytes) {
  auto& r = as_ucx(region);
  r.check_range(peer, offset, bytes, "get");
  if (bytes == 0) return;
  if (char* direct = r.peer(peer).direct) {
    // Co-located: a plain copy is the get (a concurrent update may be seen half done, which the
    // async model allows; atomics still go through UCP).
    std::memcpy(dst, direct + offset, bytes);
    return;
  }
  post_get(r, peer, offset, dst, bytes);
}

void UcxTransport::put(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes) {
  auto& r = as_ucx(region);
  r.check_range(peer, offset, bytes, "put");
  if (bytes == 0) return;
  const auto& p = r.peer(peer);
  if (p.direct) {
    std::memcpy(p.direct + offset, src, bytes);
    return;
  }
  ucp_request_param_t param{};
  // Local completion: the source may be reused once the request completes.
  wait(ucp_put_nbx(eps_[peer], src, bytes, p.base + offset, p.rkey, &param), peer, "ucp_put_nbx");
  unflushed_puts_[peer] = 1;
}

std::uint64_t UcxTransport::amo(UcxRegion& r, int peer, std::uint64_t offset, ucp_atomic_op_t op,
                                std::uint64_t operand, std::uint64_t swap, bool fetch, const char* what) {
  const auto& p = r.peer(peer);
  std::uint64_t value = operand;
  std::uint64_t reply = swap;  // CSWAP reads the new value from the reply buffer
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_contig(8);
  if (fetch) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    param.reply_buffer = &reply;
  }
  wait(ucp_atomic_op_nbx(eps_[peer], op, &value, 1, p.base + offset, p.rkey, &param), peer, what);
  return reply;
}

std::int64_t UcxTransport::fetch_add(Region& region, int peer, std::uint64_t offset, std::int64_t value) {
  auto& r = as_ucx(region);
  r.check_range(peer, offset, 8, "fetch_add");
  if (offset % 8 != 0) throw Error("fetch_add: offset " + std::to_string(offset) + " is not 8-byte aligned");
  return static_cast<std::int64_t>(
      amo(r, peer, offset, UCP_ATOMIC_OP_ADD, static_cast<std::uint64_t>(value), 0, true, "fetch_add"));
}

std::int64_t UcxTransport::atomic_read(Region& region, int peer, std::uint64_t offset) {
  auto& r = as_ucx(region);
  r.check_range(peer, offset, 8, "atomic_read");
  if (offset % 8 != 0) throw Error("atomic_read: offset " + std::to_string(offset) + " is not 8-byte aligned");
  // Fetch-and-add 0: a read in the same atomicity domain as fetch_add.
  return static_cast<std::int64_t>(amo(r, peer, offset, UCP_ATOMIC_OP_ADD, 0, 0, true, "atomic_read"));
}

// ---- accumulate ---------------------------------------------------------------------------------

void UcxTransport::lock_stripe(UcxRegion& r, int peer, std::uint64_t lock_offset) {
  const std::uint64_t me = static_cast<std::uint64_t>(rank_) + 1;
  Deadline deadline(timeout_s_);
  Backoff backoff;
  while (true) {
    const std::uint64_t holder = amo(r, peer, lock_offset, UCP_ATOMIC_OP_CSWAP, 0, me, true, "accumulate lock");
    if (holder == 0) break;
    STRATA_CHECK(holder != me, "accumulate lock on ", to_peer(peer), " is already held by this rank");
    if (deadline.passed()) {
      const int who = static_cast<int>(holder) - 1;
      throw TimeoutError("ucx accumulate: a stripe lock on " + to_peer(peer) + " stayed held by " + to_peer(who) +
                             " for more than " + std::to_string(timeout_s_) + " s (--timeout / STRATA_TIMEOUT_S)",
                         {peer, who});
    }
    ucp_worker_progress(worker_);
    backoff.pause();
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void UcxTransport::unlock_stripe(UcxRegion& r, int peer, std::uint64_t lock_offset) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const std::uint64_t me = static_cast<std::uint64_t>(rank_) + 1;
  const std::uint64_t was = amo(r, peer, lock_offset, UCP_ATOMIC_OP_SWAP, 0, 0, true, "accumulate unlock");
  STRATA_CHECK(was == me, "accumulate lock on ", to_peer(peer), " was held by ", was, " instead of this rank");
}

void UcxTransport::accumulate_pieces(UcxRegion& r, int peer, std::vector<Piece>& pieces, ElemType type) {
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.stripe() < b.stripe(); });
  char* direct = r.peer(peer).direct;
  for (std::size_t begin = 0; begin < pieces.size();) {
    std::size_t end = begin + 1;
    while (end < pieces.size() && pieces[end].stripe() == pieces[begin].stripe()) ++end;
    const std::uint64_t lock = r.lock_offset(peer, pieces[begin].stripe());
    lock_stripe(r, peer, lock);
    try {
      if (direct) {
        for (std::size_t i = begin; i < end; ++i) add_typed(direct + pieces[i].offset, pieces[i].src, pieces[i].bytes, type);
      } else {
        // Read the stripe's pieces, add, write back, remote completion, all under the lock. Rows
        // that overlap (the caller did not combine duplicates) go one batch each so no sum is lost.
        std::sort(pieces.begin() + static_cast<std::ptrdiff_t>(begin), pieces.begin() + static_cast<std::ptrdiff_t>(end),
                  [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
        std::size_t i = begin;
        while (i < end) {
          std::size_t j = i + 1;
          std::uint64_t top = pieces[i].offset + pieces[i].bytes;
          std::uint64_t total = pieces[i].bytes;
          while (j < end && pieces[j].offset >= top) {
            top = pieces[j].offset + pieces[j].bytes;
            total += pieces[j].bytes;
            ++j;
          }
          scratch_.resize(total);
          std::uint64_t at = 0;
          for (std::size_t k = i; k < j; ++k) {
            post_get(r, peer, pieces[k].offset, scratch_.data() + at, pieces[k].bytes);
            at += pieces[k].bytes;
          }
          wait_gets(peer, "accumulate read");
          at = 0;
          const auto& p = r.peer(peer);
          for (std::size_t k = i; k < j; ++k) {
            add_typed(scratch_.data() + at, pieces[k].src, pieces[k].bytes, type);
            ucp_request_param_t param{};
            wait(ucp_put_nbx(eps_[peer], scratch_.data() + at, pieces[k].bytes, p.base + pieces[k].offset, p.rkey,
                             &param),
                 peer, "accumulate write");
            at += pieces[k].bytes;
          }
          flush_ep(peer, "accumulate write");
          i = j;
        }
      }
    } catch (...) {
      // Best effort: do not leave the stripe locked for the other ranks.
      try {
        unlock_stripe(r, peer, lock);
      } catch (...) {
      }
      throw;
    }
    unlock_stripe(r, peer, lock);
    begin = end;
  }
}

void UcxTransport::accumulate_i64(UcxRegion& r, int peer, const std::vector<Piece>& pieces) {
  // One UCP_ATOMIC_OP_ADD per element (posted, no reply), then remote completion.
  for (const Piece& piece : pieces) {
    for (std::uint64_t b = 0; b < piece.bytes; b += 8) {
      std::int64_t v = 0;
      std::memcpy(&v, piece.src + b, 8);
      amo(r, peer, piece.offset + b, UCP_ATOMIC_OP_ADD, static_cast<std::uint64_t>(v), 0, false, "accumulate int64");
    }
  }
  flush_ep(peer, "accumulate int64");
}

void UcxTransport::accumulate(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t count,
                              ElemType type) {
  auto& r = as_ucx(region);
  const std::size_t esize = elem_size(type);
  r.check_range(peer, offset, count * esize, "accumulate");
  if (count == 0) return;
  if (offset % esize != 0)
    throw Error("accumulate: offset " + std::to_string(offset) + " is not aligned to " + to_string(type));
  // Split at stripe boundaries (multiples of kStripeBytes, so of every element size).
  std::vector<Piece> pieces;
  const auto* in = static_cast<const char*>(src);
  for (std::uint64_t at = offset, end = offset + count * esize; at < end;) {
    const std::uint64_t stop = std::min(end, (at / kStripeBytes + 1) * kStripeBytes);
    pieces.push_back({at, stop - at, in + (at - offset)});
    at = stop;
  }
  if (type == ElemType::kI64)
    accumulate_i64(r, peer, pieces);
  else
    accumulate_pieces(r, peer, pieces, type);
}

void UcxTransport::get_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_bytes,
                            const std::vector<std::int64_t>& rows, void* dst) {
  auto& r = as_ucx(region);
  r.check_peer(peer, "get_rows");
  if (rows.empty()) return;
  const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end());
  if (*lo < 0) throw Error("get_rows: row index " + std::to_string(*lo) + " is negative");
  r.check_range(peer, offset, static_cast<std::uint64_t>(*hi + 1) * row_bytes, "get_rows");
  if (row_bytes == 0) return;
  auto* out = static_cast<char*>(dst);
  if (const char* direct = r.peer(peer).direct) {
    const char* src = direct + offset;
    // Random rows of a large table are latency-bound (a cache/TLB miss per row): prefetch a few
    // rows ahead so the misses overlap.
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
  // One nonblocking get per run of consecutive rows; all complete at the caller's flush.
  for (std::size_t i = 0; i < rows.size();) {
    std::size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    post_get(r, peer, offset + static_cast<std::uint64_t>(rows[i]) * row_bytes, out + i * row_bytes,
             (j - i) * row_bytes);
    i = j;
  }
}

void UcxTransport::accumulate_rows(Region& region, int peer, std::uint64_t offset, std::size_t row_elems,
                                   ElemType type, const std::vector<std::int64_t>& rows, const void* src) {
  auto& r = as_ucx(region);
  r.check_peer(peer, "accumulate_rows");
  if (rows.empty()) return;
  const std::size_t esize = elem_size(type);
  const std::uint64_t row_bytes = row_elems * esize;
  const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end());
  if (*lo < 0) throw Error("accumulate_rows: row index " + std::to_string(*lo) + " is negative");
  r.check_range(peer, offset, static_cast<std::uint64_t>(*hi + 1) * row_bytes, "accumulate_rows");
  if (row_bytes == 0) return;
  if (offset % esize != 0)
    throw Error("accumulate_rows: offset " + std::to_string(offset) + " is not aligned to " + to_string(type));
  std::vector<Piece> pieces;
  pieces.reserve(rows.size());
  const auto* in = static_cast<const char*>(src);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint64_t begin = offset + static_cast<std::uint64_t>(rows[i]) * row_bytes;
    for (std::uint64_t at = begin, end = begin + row_bytes; at < end;) {
      const std::uint64_t stop = std::min(end, (at / kStripeBytes + 1) * kStripeBytes);
      pieces.push_back({at, stop - at, in + i * row_bytes + (at - begin)});
      at = stop;
    }
  }
  if (type == ElemType::kI64)
    accumulate_i64(r, peer, pieces);
  else
    accumulate_pieces(r, peer, pieces, type);
}

// ---- completion and progress --------------------------------------------------------------------

// Only puts through UCP need an endpoint flush for remote completion: a get is complete when its
// data arrived, a fetching atomic when its reply did, accumulate flushes before it returns, and
// direct stores need only the fence. Skipping the flush otherwise keeps a small pull at the cost
// of a memcpy (STRATA_UCX_DIRECT) instead of a memcpy plus a UCX flush.
void UcxTransport::flush(Region& region, int peer) {
  as_ucx(region).check_peer(peer, "flush");
  wait_gets(peer, "flush");
  if (unflushed_puts_[peer]) {
    flush_ep(peer, "ucp_ep_flush_nbx");
    unflushed_puts_[peer] = 0;
  }
  // Direct loads and stores are ordered by a full barrier.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void UcxTransport::flush_all(Region& region) {
  wait_gets(-1, "flush_all");
  if (std::find(unflushed_puts_.begin(), unflushed_puts_.end(), 1) != unflushed_puts_.end()) {
    ucp_request_param_t p{};
    wait(ucp_worker_flush_nbx(worker_, &p), rank_, "ucp_worker_flush_nbx");
    std::fill(unflushed_puts_.begin(), unflushed_puts_.end(), 0);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void UcxTransport::sync_local(Region& region) {
  // Progress lets transports that need the target (TCP, emulated atomics) land what peers sent;
  // the fence orders our loads after them.
  ucp_worker_progress(worker_);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void UcxTransport::progress() {
  // Drain what is ready, bounded so a steady stream of events cannot keep the caller here.
  for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
  }
}

}  // namespace strata::comm::ucx
