// Blocking TCP sockets for the network data plane (src/comm/tcp) and its baseline
// (`strata bench --op link`). Private to the comm layer.
//
// Why blocking sockets: on an oversubscribed node the kernel's softirq that moves packets needs
// the cores, so a thread waiting for the network must sleep in the kernel instead of polling
// (a polling waiter delays the very packets it waits for; figures in tests/cluster/README.md,
// "mpirun"). Every receive and send is bounded by a deadline (SO_RCVTIMEO / SO_SNDTIMEO of at
// most one second, re-armed until the deadline), so no wait is unbounded.
//
// Thread-safety: a Socket is used by one thread at a time; the functions here keep no state.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/common/env.h"

namespace strata::comm::tcp {

using Clock = std::chrono::steady_clock;

// A moment after which a wait gives up.
struct Deadline {
  Clock::time_point at;
  static Deadline in(double seconds) {
    return {Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))};
  }
  bool passed() const { return Clock::now() > at; }
};

// Owns a file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// An IPv4 address and port, both in host byte order.
struct Endpoint {
  std::uint32_t ip = 0;
  std::uint16_t port = 0;
  std::string str() const;  // "10.0.0.1:4242"
};

// The IPv4 address this process offers to peers on other nodes. Chosen, first that applies:
//   STRATA_TCP_IF (interface names or CIDR subnets, comma-separated, like Open MPI's
//   btl_tcp_if_include); OMPI_MCA_btl_tcp_if_include (so strata's traffic follows MPI's when the
//   launcher restricted it); the interface the host name resolves to; the first non-loopback
//   interface that is up; loopback. `why` says which rule chose it.
std::uint32_t choose_local_address(const Env& env, std::string* why);

// A listening socket on `ip` (port 0: the kernel picks one); `*bound` gets the real endpoint. The
// socket is non-blocking, so an accept never waits for a peer that gave up in between.
Socket listen_on(std::uint32_t ip, Endpoint* bound);
// Connects (TCP_NODELAY, blocking afterwards); throws Error naming `who` and the endpoint after the
// deadline or on refusal. A non-zero `from_ip` binds the socket's source address first, so the
// server sees the address this rank published (the handshake checks it).
Socket connect_to(const Endpoint& to, Deadline deadline, const std::string& who, std::uint32_t from_ip = 0);
// Accepts one connection (TCP_NODELAY, blocking), waiting at most until `deadline`.
Socket accept_from(const Socket& listener, Deadline deadline);
// Accepts one pending connection without waiting: the socket is left non-blocking, `*from` gets
// the peer's address. Returns an invalid Socket when none is pending or accept failed (`*error`
// then holds errno, 0 when simply none was pending). Never throws for a peer's doing.
Socket try_accept(const Socket& listener, Endpoint* from, int* error);
// Switches a socket between blocking (with the bounded timeouts of tune()) and non-blocking.
void set_blocking(int fd, bool blocking);
// Socket options every data-plane socket gets: TCP_NODELAY and bounded blocking calls.
void tune(int fd);

// Sends / receives exactly `bytes` (or every iovec). Throw PeerFailure(peer_rank) when the peer
// closed the connection, TimeoutError naming `what` past the deadline, Error on other failures.
void send_all(int fd, const void* data, std::size_t bytes, Deadline deadline, int peer_rank, const std::string& what);
void sendv_all(int fd, std::vector<iovec> iov, Deadline deadline, int peer_rank, const std::string& what);
// Like sendv_all, but never waits in the kernel: whenever the socket takes no more bytes it calls
// `blocked()`, which waits (bounded, e.g. a poll of at most a second) until the socket may take
// more and may do other work meanwhile (the tcp transport receives replies it is owed there, so
// a send never waits on a peer that waits for us to read). Null `blocked`: sendv_all.
void sendv_all_or_wait(int fd, std::vector<iovec> iov, Deadline deadline, int peer_rank, const std::string& what,
                       const std::function<void()>& blocked);
void recv_all(int fd, void* data, std::size_t bytes, Deadline deadline, int peer_rank, const std::string& what);
// Like recv_all, but returns false (nothing read) when the peer closed the connection cleanly
// before the first byte: how a server notices a client that went away.
bool recv_all_or_eof(int fd, void* data, std::size_t bytes, Deadline deadline, int peer_rank, const std::string& what);

}  // namespace strata::comm::tcp
