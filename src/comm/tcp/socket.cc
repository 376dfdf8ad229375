#include "comm/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>

#include "strata/common/error.h"

namespace strata::comm::tcp {
namespace {

std::string ip_str(std::uint32_t ip) {
  in_addr a{};
  a.s_addr = htonl(ip);
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

// Large messages are handed to the kernel in pieces of this size, one sendmsg each: between
// nodes, pieces of a few hundred KiB send a large reply much faster than one sendmsg, 512 KiB the
// most steadily, and much smaller pieces slow mid-size messages (docs/PERFORMANCE.md, "512 KiB
// send pieces"). ZeroMQ (ps-lite) also writes big messages in pieces. The likely cause of the
// difference: one huge sendmsg keeps the socket locked while it copies, so the ACKs that open the
// window wait in the socket's backlog and the window opens in bursts; returning to user space
// between pieces lets them be processed.
constexpr std::size_t kSendPieceBytes = std::size_t{512} << 10;

struct Interface {
  std::string name;
  std::uint32_t ip = 0;
  bool loopback = false;
};

std::vector<Interface> ipv4_interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    Interface itf;
    itf.name = i->ifa_name;
    itf.ip = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    itf.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(itf);
  }
  freeifaddrs(list);
  return out;
}

// One entry of an include list: an interface name, or a.b.c.d/n.
bool matches(const Interface& itf, const std::string& entry) {
  auto slash = entry.find('/');
  if (slash == std::string::npos) return itf.name == entry;
  in_addr net{};
  if (inet_pton(AF_INET, entry.substr(0, slash).c_str(), &net) != 1) return false;
  int bits = 0;
  try {
    bits = std::stoi(entry.substr(slash + 1));
  } catch (...) {
    return false;
  }
  if (bits < 0 || bits > 32) return false;
  const std::uint32_t mask = bits == 0 ? 0 : ~std::uint32_t{0} << (32 - bits);
  return (itf.ip & mask) == (ntohl(net.s_addr) & mask);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  return out;
}

void set_timeouts(int fd) {
  // Blocking calls return at least once a second so the deadline loop can check the clock.
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

[[noreturn]] void closed(int peer_rank, const std::string& what) {
  throw PeerFailure(peer_rank, what + ": the connection to rank " + std::to_string(peer_rank) +
                                   " was closed (that rank ended or failed)");
}

[[noreturn]] void timed_out(int peer_rank, const std::string& what) {
  throw TimeoutError(what + ": rank " + std::to_string(peer_rank) + " did not answer before the deadline "
                         "(--timeout / STRATA_TIMEOUT_S)",
                     {peer_rank});
}

}  // namespace

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string Endpoint::str() const { return ip_str(ip) + ":" + std::to_string(port); }

std::uint32_t choose_local_address(const Env& env, std::string* why) {
  const auto interfaces = ipv4_interfaces();
  auto pick_from_list = [&](const std::string& var) -> std::optional<std::uint32_t> {
    const std::string list = env.get_string(var, "");
    if (list.empty()) return std::nullopt;
    for (const auto& entry : split_list(list))
      for (const auto& itf : interfaces)
        if (matches(itf, entry)) {
          if (why) *why = itf.name + " " + ip_str(itf.ip) + " (" + var + "=" + list + ")";
          return itf.ip;
        }
    throw ConfigError(var + "=" + list + " matches no IPv4 interface of this host");
  };
  if (auto ip = pick_from_list("STRATA_TCP_IF")) return *ip;
  if (auto ip = pick_from_list("OMPI_MCA_btl_tcp_if_include")) return *ip;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* res = nullptr;
    if (getaddrinfo(host, nullptr, &hints, &res) == 0) {
      for (addrinfo* r = res; r; r = r->ai_next) {
        const std::uint32_t ip = ntohl(reinterpret_cast<sockaddr_in*>(r->ai_addr)->sin_addr.s_addr);
        for (const auto& itf : interfaces)
          if (itf.ip == ip && !itf.loopback) {
            freeaddrinfo(res);
            if (why) *why = itf.name + " " + ip_str(ip) + " (the address of host name " + host + ")";
            return ip;
          }
      }
      freeaddrinfo(res);
    }
  }
  for (const auto& itf : interfaces)
    if (!itf.loopback) {
      if (why) *why = itf.name + " " + ip_str(itf.ip) + " (first interface that is up)";
      return itf.ip;
    }
  if (why) *why = "lo 127.0.0.1 (no other interface is up)";
  return INADDR_LOOPBACK;
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  set_timeouts(fd);
}

Socket listen_on(std::uint32_t ip, Endpoint* bound) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) throw Error(sys_error("socket"));
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(ip);
  addr.sin_port = 0;
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw Error(sys_error("bind to " + ip_str(ip)));
  if (::listen(s.fd(), 128) != 0) throw Error(sys_error("listen"));
  socklen_t len = sizeof addr;
  if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) throw Error(sys_error("getsockname"));
  bound->ip = ip;
  bound->port = ntohs(addr.sin_port);
  return s;
}

Socket connect_to(const Endpoint& to, Deadline deadline, const std::string& who, std::uint32_t from_ip) {
  while (true) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) throw Error(sys_error("socket"));
    if (from_ip != 0) {
      sockaddr_in src{};
      src.sin_family = AF_INET;
      src.sin_addr.s_addr = htonl(from_ip);
      if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&src), sizeof src) != 0)
        throw Error(sys_error("binding the source address " + ip_str(from_ip) + " to connect to " + who));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(to.ip);
    addr.sin_port = htons(to.port);
    int rc = ::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at - Clock::now()).count();
      pollfd p{s.fd(), POLLOUT, 0};
      int n = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 0, 1000)));
      if (n == 0) {
        if (deadline.passed())
          throw TimeoutError("connecting to " + who + " at " + to.str() + " timed out (--timeout / STRATA_TIMEOUT_S)", {});
        continue;
      }
      socklen_t len = sizeof err;
      getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) {
      int flags = fcntl(s.fd(), F_GETFL);
      fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK);
      tune(s.fd());
      return s;
    }
    // A refused connection is retried until the deadline: the peer may still be starting.
    if ((err == ECONNREFUSED || err == EAGAIN || err == ETIMEDOUT) && !deadline.passed()) {
      ::usleep(10000);
      continue;
    }
    throw Error("cannot connect to " + who + " at " + to.str() + ": " + std::strerror(err) +
                " (is the address reachable from this node? STRATA_TCP_IF selects the interface)");
  }
}

Socket accept_from(const Socket& listener, Deadline deadline) {
  while (true) {
    Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (s.valid()) {
      set_blocking(s.fd(), true);  // Linux: the accepted socket does not inherit O_NONBLOCK; stated anyway
      tune(s.fd());
      return s;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      throw Error(sys_error("accept"));
    if (deadline.passed()) throw TimeoutError("waiting for a connection timed out (--timeout / STRATA_TIMEOUT_S)", {});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at - Clock::now()).count();
    pollfd p{listener.fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 1, 1000)));
  }
}

Socket try_accept(const Socket& listener, Endpoint* from, int* error) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  Socket s(::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!s.valid()) {
    *error = (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) ? 0 : errno;
    return s;
  }
  *error = 0;
  from->ip = addr.sin_family == AF_INET ? ntohl(addr.sin_addr.s_addr) : 0;
  from->port = addr.sin_family == AF_INET ? ntohs(addr.sin_port) : 0;
  int one = 1;
  setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

void set_blocking(int fd, bool blocking) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK));
}

void send_all(int fd, const void* data, std::size_t bytes, Deadline deadline, int peer_rank, const std::string& what) {
  sendv_all(fd, {iovec{const_cast<void*>(data), bytes}}, deadline, peer_rank, what);
}

void sendv_all(int fd, std::vector<iovec> iov, Deadline deadline, int peer_rank, const std::string& what) {
  sendv_all_or_wait(fd, std::move(iov), deadline, peer_rank, what, nullptr);
}

void sendv_all_or_wait(int fd, std::vector<iovec> iov, Deadline deadline, int peer_rank, const std::string& what,
                       const std::function<void()>& blocked) {
  std::size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    // At most kSendPieceBytes per sendmsg: the last iovec taken is cut short for this call (a
    // copy of it, so `iov` keeps the full length for the next round).
    std::size_t count = 0, total = 0;
    iovec last{};
    while (first + count < iov.size() && count < IOV_MAX && total < kSendPieceBytes) {
      last = iov[first + count];
      total += last.iov_len;
      ++count;
    }
    std::vector<iovec> cut;
    const iovec* vec = iov.data() + first;
    if (total > kSendPieceBytes) {
      cut.assign(iov.begin() + static_cast<long>(first), iov.begin() + static_cast<long>(first + count));
      cut.back().iov_len = last.iov_len - (total - kSendPieceBytes);
      vec = cut.data();
    }
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(vec);
    msg.msg_iovlen = count;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | (blocked ? MSG_DONTWAIT : 0));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (deadline.passed()) timed_out(peer_rank, what);
        if (blocked) blocked();
        continue;
      }
      if (errno == EPIPE || errno == ECONNRESET) closed(peer_rank, what);
      throw Error(sys_error(what + ": send to rank " + std::to_string(peer_rank)));
    }
    auto left = static_cast<std::size_t>(n);
    while (left > 0 && first < iov.size()) {
      const std::size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
}

bool recv_all_or_eof(int fd, void* data, std::size_t bytes, Deadline deadline, int peer_rank, const std::string& what) {
  auto* p = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::recv(fd, p + got, bytes - got, MSG_WAITALL);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      if (got == 0) return false;
      closed(peer_rank, what);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (deadline.passed()) timed_out(peer_rank, what);
      continue;
    }
    if (errno == ECONNRESET) closed(peer_rank, what);
    throw Error(sys_error(what + ": receive from rank " + std::to_string(peer_rank)));
  }
  return true;
}

void recv_all(int fd, void* data, std::size_t bytes, Deadline deadline, int peer_rank, const std::string& what) {
  if (bytes > 0 && !recv_all_or_eof(fd, data, bytes, deadline, peer_rank, what)) closed(peer_rank, what);
}

}  // namespace strata::comm::tcp
