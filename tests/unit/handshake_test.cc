// The data plane's handshake and request checks as a stranger sees them: real proofs over a real
// socket pair, and bounded fuzz loops (random and mutated frames) over the server's handshake
// state machine and the request header check. Labels: unit, security.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "comm/job_secret.h"
#include "comm/tcp/handshake.h"
#include "comm/tcp/tcp_transport.h"
#include "strata/common/error.h"

namespace strata::comm::tcp {
namespace {

constexpr int kWorld = 8;
constexpr int kServerRank = 0;
constexpr int kClientRank = 3;

struct SocketPair {
  int fd[2] = {-1, -1};
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0); }
  ~SocketPair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};

// Runs the server's state machine over a blocking socket; returns "" when the client was proven,
// else the refusal.
std::string serve_one(int fd, const JobSecret& secret, Purpose purpose) {
  ServerHandshake hs(secret, purpose, kWorld, kServerRank);
  while (hs.wants() > 0) {
    std::string msg(hs.wants(), '\0');
    if (::recv(fd, msg.data(), msg.size(), MSG_WAITALL) != static_cast<ssize_t>(msg.size())) return "short read";
    ServerHandshake::Step step = hs.on_message(msg.data(), msg.size());
    if (!step.refused.empty()) return step.refused;
    if (step.proven) {
      EXPECT_EQ(hs.claimed_rank(), kClientRank);
      step.reply.assign(reinterpret_cast<const char*>(&kAcceptWord), sizeof kAcceptWord);
    }
    if (!step.reply.empty()) {
      EXPECT_EQ(::send(fd, step.reply.data(), step.reply.size(), 0), static_cast<ssize_t>(step.reply.size()));
    }
  }
  return "";
}

TEST(Handshake, TheSameSecretIsProvenBothWays) {
  const JobSecret secret = JobSecret::random();
  SocketPair sp;
  std::string refused = "not run";
  std::thread server([&] { refused = serve_one(sp.fd[0], secret, Purpose::kDataPlane); });
  EXPECT_NO_THROW(client_handshake(sp.fd[1], secret, Purpose::kDataPlane, kClientRank, kServerRank, Deadline::in(5)));
  server.join();
  EXPECT_EQ(refused, "");
}

TEST(Handshake, AClientWithAnotherSecretIsRefusedAndLearnsNothing) {
  const JobSecret job = JobSecret::random();
  const JobSecret stranger = JobSecret::random();
  SocketPair sp;
  std::string refused;
  std::thread server([&] {
    refused = serve_one(sp.fd[0], job, Purpose::kDataPlane);
    ::shutdown(sp.fd[0], SHUT_RDWR);  // what the transport does: close
  });
  // The stranger's client sees a server whose proof does not match its own key: an Error, never
  // a connection.
  EXPECT_THROW(client_handshake(sp.fd[1], stranger, Purpose::kDataPlane, kClientRank, kServerRank, Deadline::in(5)),
               Error);
  ::shutdown(sp.fd[1], SHUT_RDWR);
  server.join();
  EXPECT_NE(refused, "");
}

TEST(Handshake, AServerWithAnotherSecretIsRefusedByTheClient) {
  const JobSecret job = JobSecret::random();
  const JobSecret impostor = JobSecret::random();
  SocketPair sp;
  std::thread server([&] {
    serve_one(sp.fd[0], impostor, Purpose::kDataPlane);
    ::shutdown(sp.fd[0], SHUT_RDWR);
  });
  try {
    client_handshake(sp.fd[1], job, Purpose::kDataPlane, kClientRank, kServerRank, Deadline::in(5));
    ADD_FAILURE() << "an impostor server was accepted";
  } catch (const PeerFailure&) {
    ADD_FAILURE() << "the client must name a wrong proof, not a closed connection";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not prove the job's secret"), std::string::npos) << e.what();
  }
  ::shutdown(sp.fd[1], SHUT_RDWR);
  server.join();
}

TEST(Handshake, AProofForOnePurposeOrRankIsNoGoodForAnother) {
  const JobSecret secret = JobSecret::random();
  // A listener of another purpose refuses the Hello outright.
  ServerHandshake bench(secret, Purpose::kBenchLink, kWorld, kServerRank);
  Hello hello;
  hello.rank = kClientRank;
  hello.purpose = static_cast<std::uint32_t>(Purpose::kDataPlane);
  EXPECT_NE(bench.on_message(&hello, sizeof hello).refused, "");
  // A proof computed for the Hello of rank 3 does not admit a Hello that claims rank 4.
  ServerHandshake hs(secret, Purpose::kDataPlane, kWorld, kServerRank);
  hello.rank = 4;
  ServerHandshake::Step step = hs.on_message(&hello, sizeof hello);
  ASSERT_EQ(step.refused, "");
  Challenge c;
  std::memcpy(&c, step.reply.data(), sizeof c);
  Hello claimed3 = hello;
  claimed3.rank = kClientRank;
  Response r;
  client_proof(secret, claimed3, c.nonce, r.proof);
  step = hs.on_message(&r, sizeof r);
  EXPECT_FALSE(step.proven);
  EXPECT_NE(step.refused.find("did not prove"), std::string::npos) << step.refused;
  // Ranks outside the job, and the server's own, are refused at the Hello.
  for (std::uint32_t bad : {std::uint32_t{kServerRank}, std::uint32_t{kWorld}, std::uint32_t{0xffffffff}}) {
    ServerHandshake h(secret, Purpose::kDataPlane, kWorld, kServerRank);
    hello.rank = bad;
    EXPECT_NE(h.on_message(&hello, sizeof hello).refused, "") << bad;
  }
}

TEST(Handshake, EveryNonceIsFresh) {
  const JobSecret secret = JobSecret::random();
  Hello hello;
  hello.rank = kClientRank;
  hello.purpose = static_cast<std::uint32_t>(Purpose::kDataPlane);
  ServerHandshake a(secret, Purpose::kDataPlane, kWorld, kServerRank);
  ServerHandshake b(secret, Purpose::kDataPlane, kWorld, kServerRank);
  const std::string ra = a.on_message(&hello, sizeof hello).reply;
  const std::string rb = b.on_message(&hello, sizeof hello).reply;
  ASSERT_EQ(ra.size(), sizeof(Challenge));
  // Same Hello twice: different server nonces, so a response recorded on one connection is
  // refused on the other.
  EXPECT_NE(ra.substr(0, kNonceBytes), rb.substr(0, kNonceBytes));
  Challenge ca;
  std::memcpy(&ca, ra.data(), sizeof ca);
  Response recorded;
  client_proof(secret, hello, ca.nonce, recorded.proof);
  EXPECT_TRUE(a.on_message(&recorded, sizeof recorded).proven);
  EXPECT_FALSE(b.on_message(&recorded, sizeof recorded).proven);
}

// Bounded fuzz: 120,000 inputs to the server's state machine, random and mutated from a valid
// exchange. Without the secret nothing is ever proven; with it, only the exact response is.
TEST(Handshake, FuzzedFramesNeverProveAnythingWithoutTheSecret) {
  const JobSecret secret = JobSecret::random();
  std::mt19937_64 rng(20261126);
  auto byte = [&] { return static_cast<std::uint8_t>(rng()); };
  Hello valid;
  valid.rank = kClientRank;
  valid.purpose = static_cast<std::uint32_t>(Purpose::kDataPlane);
  int proven = 0, challenged = 0;
  for (int i = 0; i < 120000; ++i) {
    ServerHandshake hs(secret, Purpose::kDataPlane, kWorld, kServerRank);
    const int kind = i % 4;
    std::string first;
    if (kind == 0) {  // random bytes of a random length (also the wrong length)
      first.resize(rng() % 100);
      for (auto& c : first) c = static_cast<char>(byte());
    } else {  // a valid Hello with 1-4 bytes mutated
      first.assign(reinterpret_cast<const char*>(&valid), sizeof valid);
      for (int m = 0, n = 1 + static_cast<int>(rng() % 4); m < n && kind != 3; ++m)
        first[rng() % first.size()] = static_cast<char>(byte());
    }
    ServerHandshake::Step s = hs.on_message(first.data(), first.size());
    ASSERT_FALSE(s.proven);
    if (!s.refused.empty()) {
      ASSERT_EQ(hs.wants(), 0u);
      ASSERT_TRUE(s.reply.empty());
      continue;
    }
    ++challenged;
    ASSERT_EQ(s.reply.size(), sizeof(Challenge));
    // The second message: random, a mutated real proof, or (1 in 8) the real proof.
    Hello sent;
    std::memcpy(&sent, first.data(), sizeof sent);
    Challenge c;
    std::memcpy(&c, s.reply.data(), sizeof c);
    Response r;
    client_proof(secret, sent, c.nonce, r.proof);
    const bool genuine = rng() % 8 == 0;
    std::string second(reinterpret_cast<const char*>(&r), sizeof r);
    if (!genuine) {
      if (rng() % 2) {
        for (auto& ch : second) ch = static_cast<char>(byte());
      } else {
        const std::size_t at = rng() % second.size();
        second[at] = static_cast<char>(second[at] ^ (1 + rng() % 255));
      }
      if (rng() % 16 == 0) second.resize(rng() % 40);
    }
    ServerHandshake::Step t = hs.on_message(second.data(), second.size());
    ASSERT_EQ(t.proven, genuine) << "input " << i;
    proven += t.proven;
    // Nothing is accepted after the end.
    ASSERT_FALSE(hs.on_message(second.data(), second.size()).proven);
  }
  EXPECT_GT(challenged, 10000);  // the mutations reach the second stage often
  EXPECT_GT(proven, 1000);
}

// Bounded fuzz: 250,000 request headers, random and mutated from valid ones, against regions of a
// few sizes. Whatever check_request admits is inside the region, aligned, and of a bounded size.
TEST(RequestCheck, FuzzedHeadersAdmitOnlyWhatFitsTheRegion) {
  std::mt19937_64 rng(7);
  const std::uint64_t sizes[] = {0, 8, 4096, 802816, std::uint64_t{1} << 34};
  int admitted = 0;
  auto interesting = [&]() -> std::uint64_t {
    switch (rng() % 8) {
      case 0: return 0;
      case 1: return rng() % 64;
      case 2: return std::uint64_t{1} << (rng() % 64);
      case 3: return ~std::uint64_t{0} - rng() % 16;
      case 4: return rng() % 1000000;
      default: return rng();
    }
  };
  for (int i = 0; i < 250000; ++i) {
    const std::uint64_t region = sizes[rng() % 5];
    TcpTransport::Request req;
    req.op = static_cast<std::uint32_t>(rng() % 12);
    if (rng() % 10 == 0) req.op = static_cast<std::uint32_t>(rng());
    req.offset = interesting();
    req.a = interesting();
    req.b = rng() % 3 ? interesting() : (rng() % 4 | (static_cast<std::uint64_t>(rng() % 5) << 56));
    const std::string bad = TcpTransport::check_request(req, region);
    if (!bad.empty()) continue;
    ++admitted;
    auto within = [&](std::uint64_t off, std::uint64_t len) { return off <= region && len <= region - off; };
    switch (req.op) {
      case 1: case 2: case 9: case 10:  // get, put, put_notify, put_notify_get
        ASSERT_TRUE(within(req.offset, req.a)) << i;
        if (req.op == 9 || req.op == 10) {
          ASSERT_TRUE(req.b % 8 == 0 && within(req.b, 8)) << i;
        }
        break;
      case 3:  // accumulate
        ASSERT_LE(req.b, 2u);
        ASSERT_TRUE(within(req.offset, req.a)) << i;
        ASSERT_EQ(req.offset % elem_size(static_cast<ElemType>(req.b)), 0u);
        break;
      case 4:  // get_rows
        ASSERT_GT(req.a, 0u);
        ASSERT_LE(req.a, region);
        ASSERT_LE(req.b, TcpTransport::kMaxRowsPerRequest);
        ASSERT_LE(req.offset, region);
        break;
      case 5: {  // accumulate_rows
        const std::uint64_t n = req.b & ((std::uint64_t{1} << 56) - 1);
        ASSERT_LE(req.b >> 56, 2u);
        ASSERT_LE(n, TcpTransport::kMaxRowsPerRequest);
        const std::uint64_t es = elem_size(static_cast<ElemType>(req.b >> 56));
        ASSERT_LE(req.a * es, region);
        ASSERT_LE(req.offset, region);
        // The payload size the server allocates cannot wrap.
        ASSERT_LE(n * req.a * es / n, req.a * es);
        break;
      }
      case 6: case 7:  // fetch_add, read
        ASSERT_TRUE(within(req.offset, 8));
        ASSERT_EQ(req.offset % 8, 0u);
        break;
      case 8:  // flush
        break;
      default:
        FAIL() << "op " << req.op << " admitted";
    }
  }
  EXPECT_GT(admitted, 1000);
}

}  // namespace
}  // namespace strata::comm::tcp
