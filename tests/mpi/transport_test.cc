// The transports under mpirun only: the tcp transport's listeners against strangers and a wrong
// secret, a region dropped by a failing rank, and the registry's names. The semantics every
// transport shares are tests/ranks/transport_test.cc (both tiers).
//
// Between phases the ranks meet in a barrier that keeps the transport progressing: over transports
// that need the target's help (UCX over TCP, ctest's ucx_tcp variant) a plain MPI_Barrier on the
// target would starve the operations aimed at it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "comm/job_secret.h"
#include "comm/tcp/handshake.h"
#include "comm/tcp/tcp_transport.h"
#include "mpi/mpi_test.h"
#include "strata/comm/registry.h"
#include "strata/common/error.h"

namespace strata {
namespace {

using testing::TestComm;

float value_of(int rank, std::size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i % 977)); }

class MpiTransportTest : public ::testing::TestWithParam<std::string> {};

// Collective barrier that keeps `t` progressing; bounded, so a lost operation fails the test.
void barrier(MPI_Comm comm, comm::Transport& t) {
  MPI_Request request;
  ASSERT_EQ(MPI_Ibarrier(comm, &request), MPI_SUCCESS);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    t.progress();
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "progressing barrier timed out";
      MPI_Abort(MPI_COMM_WORLD, 4);
    }
  }
}

// A rank that fails frees its regions while the exception unwinds, without its peers; a request
// for such a region that arrives next is neither served nor taken for a peer's bug: the failing
// rank's own error must be the one that ends the job, so its server thread does not abort the job
// over it (it did: "request ... for region N, which does not exist here" came first and hid the
// cause). The peer's request is left unanswered and fails within the peer's deadline, naming
// rank 0. tcp with STRATA_TCP_FORCE_REMOTE only (the request is served by rank 0's thread).
TEST_P(MpiTransportTest, ARegionDroppedWhileFailingIsNotAPeersBug) {
  if (GetParam() != "tcp" || !std::getenv("STRATA_TCP_FORCE_REMOTE")) GTEST_SKIP() << "tcp with STRATA_TCP_FORCE_REMOTE only";
  TestComm comm;
  ::setenv("STRATA_TIMEOUT_S", "2", 1);  // read once, by the transport's constructor
  auto t = comm::create_transport(GetParam(), comm.get());
  ::unsetenv("STRATA_TIMEOUT_S");
  auto region = t->allocate_region(64);
  barrier(comm.get(), *t);
  if (comm.rank() == 0) {
    try {
      auto doomed = std::move(region);
      throw Error("rank 0 fails");
    } catch (const Error&) {
    }
  }
  ASSERT_EQ(MPI_Barrier(comm.get()), MPI_SUCCESS);  // rank 0's region is gone from here on
  bool ok = true;
  if (comm.rank() == 1) {
    std::string message;
    try {
      t->fetch_add(*region, 0, 0, 1);
    } catch (const Error& e) {
      message = e.message();
    }
    ok = message.find("rank 0") != std::string::npos;
    if (!ok) ADD_FAILURE() << "rank 1's request should fail naming rank 0, got '" << message << "'";
  }
  // Rank 0 was not aborted by its own server thread: it is here to agree.
  STRATA_EXPECT_ALL(comm.get(), ok);
  // Freeing a region is collective; rank 0 has none left, so the others drop theirs as it did.
  if (comm.rank() != 0) {
    try {
      auto dropped = std::move(region);
      throw Error("rank 0 has no region left to free collectively");
    } catch (const Error&) {
    }
  }
}

// A stranger (a thread of each rank, probing its right neighbour's listener as another user's
// process could) sends garbage, scans, speaks the old hello and asks for the weights, runs the
// whole handshake with a key of its own, holds a connection idle and floods 100 connections,
// while the ranks put and get through the same listeners. Every transfer stays correct and the
// stranger never receives a byte beyond a handshake challenge (64 bytes). tcp with
// STRATA_TCP_FORCE_REMOTE only (every peer is served over TCP then).
TEST_P(MpiTransportTest, StrangersAreRefusedWhileTheDataPlaneGoesOn) {
  if (GetParam() != "tcp" || !std::getenv("STRATA_TCP_FORCE_REMOTE")) GTEST_SKIP() << "tcp with STRATA_TCP_FORCE_REMOTE only";
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  if (n < 2) GTEST_SKIP() << "needs a peer";
  comm::tcp::TcpTransport t(comm.get());
  const std::size_t count = 4096;
  auto region = t.allocate_region(2 * count * sizeof(float));
  auto* mine = static_cast<float*>(region->local_base());
  for (std::size_t i = 0; i < count; ++i) mine[i] = value_of(me, i);
  t.sync_local(*region);
  barrier(comm.get(), t);

  const comm::tcp::Endpoint target = t.endpoint_of((me + 1) % n);
  std::size_t leaked = 0, connections = 0;
  std::thread stranger([&] {
    auto open = [&]() {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(target.ip);
      addr.sin_port = htons(target.port);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ADD_FAILURE() << "connect failed";
      timeval tv{0, 300000};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ++connections;
      return fd;
    };
    // Reads what comes back until EOF or a quiet 0.3 s; counts what is beyond `allowed`.
    auto collect = [&](int fd, std::size_t allowed) {
      char buf[4096];
      std::size_t got = 0;
      for (ssize_t k; (k = ::recv(fd, buf, sizeof buf, 0)) > 0;) got += static_cast<std::size_t>(k);
      leaked += got > allowed ? got - allowed : 0;
      ::close(fd);
    };
    auto send_quietly = [](int fd, const void* p, std::size_t bytes) { (void)::send(fd, p, bytes, MSG_NOSIGNAL); };
    const int idle = open();
    for (int round = 0; round < 3; ++round) {
      int fd = open();  // garbage
      std::uint8_t junk[64];
      comm::kernel_random(junk, sizeof junk);
      send_quietly(fd, junk, sizeof junk);
      collect(fd, 0);
      ::close(open());  // a port scan
      fd = open();  // the pre-handshake hello, then a GET of the region
      const std::uint32_t old_hello[2] = {0x53545443, 0};
      comm::tcp::TcpTransport::Request get;
      get.op = 1;
      get.a = count * sizeof(float);
      send_quietly(fd, old_hello, sizeof old_hello);
      send_quietly(fd, &get, sizeof get);
      collect(fd, 0);
      fd = open();  // the whole handshake with a key of its own
      comm::tcp::Hello hello;
      hello.rank = static_cast<std::uint32_t>(me);
      hello.purpose = static_cast<std::uint32_t>(comm::tcp::Purpose::kDataPlane);
      send_quietly(fd, &hello, sizeof hello);
      comm::tcp::Response wrong;
      comm::kernel_random(wrong.proof, sizeof wrong.proof);
      send_quietly(fd, &wrong, sizeof wrong);
      send_quietly(fd, &get, sizeof get);
      collect(fd, sizeof(comm::tcp::Challenge));
    }
    std::vector<int> flood;
    for (int i = 0; i < 100; ++i) flood.push_back(open());
    for (int fd : flood) ::close(fd);
    collect(idle, 0);
  });

  // The job's own traffic through the same listeners meanwhile: 40 rounds of put to the right
  // neighbour and get from everyone, each checked.
  bool ok = true;
  std::vector<float> src(count), got(count);
  for (int round = 0; round < 40 && ok; ++round) {
    for (std::size_t i = 0; i < count; ++i) src[i] = value_of(me, i) + static_cast<float>(round);
    t.put(*region, (me + 1) % n, count * sizeof(float), src.data(), count * sizeof(float));
    t.flush_all(*region);
    for (int p = 0; p < n; ++p) {
      t.get(*region, p, 0, got.data(), count * sizeof(float));
      t.flush(*region, p);
      for (std::size_t i = 0; i < count; ++i) ok = ok && got[i] == value_of(p, i);
    }
  }
  stranger.join();
  barrier(comm.get(), t);
  t.sync_local(*region);
  const int left = (me + n - 1) % n;
  for (std::size_t i = 0; i < count; ++i) ok = ok && mine[count + i] == value_of(left, i) + 39.0f;
  STRATA_EXPECT_ALL(comm.get(), ok);
  STRATA_EXPECT_ALL(comm.get(), leaked == 0);
  STRATA_EXPECT_ALL(comm.get(), connections == 113);  // 1 idle + 3 x 4 probes + 100
}

// A rank whose listener answers with another job's secret is never trusted: the client's
// handshake names the rank and fails (here: a client holding a wrong secret, against a real
// listener, is refused, and learns that it was).
TEST_P(MpiTransportTest, AWrongSecretIsRefusedByARealListener) {
  if (GetParam() != "tcp" || !std::getenv("STRATA_TCP_FORCE_REMOTE")) GTEST_SKIP() << "tcp with STRATA_TCP_FORCE_REMOTE only";
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  if (n < 2) GTEST_SKIP() << "needs a peer";
  comm::tcp::TcpTransport t(comm.get());
  const comm::tcp::Endpoint target = t.endpoint_of((me + 1) % n);
  std::string error;
  try {
    comm::tcp::Socket s = comm::tcp::connect_to(target, comm::tcp::Deadline::in(10), "the neighbour");
    comm::tcp::client_handshake(s.fd(), comm::JobSecret::random(), comm::tcp::Purpose::kDataPlane, me, (me + 1) % n,
                                comm::tcp::Deadline::in(10));
  } catch (const Error& e) {
    error = e.what();
  }
  STRATA_EXPECT_ALL(comm.get(), error.find("did not prove the job's secret") != std::string::npos);
  barrier(comm.get(), t);
}

TEST(TransportRegistry, UnknownNameListsTheCompiledOnes) {
  TestComm comm;
  std::string message;
  try {
    comm::create_transport("carrier-pigeon", comm.get());
  } catch (const ConfigError& e) {
    message = e.message();
  }
  STRATA_EXPECT_ALL(comm.get(), message.find("unknown transport 'carrier-pigeon' (this build has: mpi") !=
                                    std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Compiled, MpiTransportTest, ::testing::ValuesIn(comm::compiled_transports()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata
