// The handshake every connection to a strata TCP listener must pass before a request is served:
// both ends prove that they know the job's secret (comm/job_secret.h), over fresh nonces from
// both sides, with HMAC-SHA256 from OpenSSL's libcrypto. Private to the comm layer.
//
// Wire (little-endian host layout, like the requests: every node runs the same build):
//   client -> server  Hello      48 B: magic, version, claimed rank, purpose, client nonce (32 B)
//   server -> client  Challenge  64 B: server nonce (32 B), server proof (32 B)
//   client -> server  Response   32 B: client proof
//   server -> client  Accept      8 B: kAcceptWord
// server proof = HMAC(secret, "strata tcp server v1" | Hello | server nonce)
// client proof = HMAC(secret, "strata tcp client v1" | Hello | server nonce)
// The labels differ, so neither proof can be replayed as the other; both nonces are fresh, so no
// proof seen on the wire is valid for another connection; the Hello binds the claimed rank and the
// purpose (one listener's proof is no good at another's). The server sends its proof before the
// client's arrives: what a stranger learns from it is an HMAC over a nonce the server chose, of
// no use without the key.
//
// What it does not do: encrypt. The bytes after the handshake travel in the clear, and an on-path
// attacker could take over an established connection (docs/SECURITY.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/job_secret.h"
#include "comm/tcp/socket.h"

namespace strata::comm::tcp {

// What a connection is for: part of the proof, and the server's "one connection per rank and
// purpose" rule.
enum class Purpose : std::uint32_t { kDataPlane = 1, kBenchLink = 2 };

inline constexpr std::uint32_t kHandshakeMagic = 0x32545453;  // "STT2"
inline constexpr std::uint32_t kHandshakeVersion = 1;
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kProofBytes = 32;
inline constexpr std::uint64_t kAcceptWord = 0x4b4f2d6174617274;  // "trata-OK"

struct Hello {
  std::uint32_t magic = kHandshakeMagic;
  std::uint32_t version = kHandshakeVersion;
  std::uint32_t rank = 0;
  std::uint32_t purpose = 0;
  std::uint8_t nonce[kNonceBytes] = {};
};
struct Challenge {
  std::uint8_t nonce[kNonceBytes] = {};
  std::uint8_t proof[kProofBytes] = {};
};
struct Response {
  std::uint8_t proof[kProofBytes] = {};
};
static_assert(sizeof(Hello) == 48 && sizeof(Challenge) == 64 && sizeof(Response) == 32, "wire format");

// The server's side of one connection, as a state machine over whole messages, so the serving
// thread can run many at once without blocking on any (and tests can feed it any bytes).
// Not thread-safe; one object per connection.
class ServerHandshake {
 public:
  // `world_size` and `self` bound the ranks a Hello may claim.
  ServerHandshake(const JobSecret& secret, Purpose purpose, int world_size, int self);

  // Bytes of the next message the server expects: 48 (Hello), then 32 (Response), then 0 (done).
  std::size_t wants() const;

  struct Step {
    std::string reply;     // bytes to send back now (may be empty)
    bool proven = false;   // the client proved the secret: the connection may be admitted
    std::string refused;   // non-empty: close the connection, this is why (for the warning line)
  };
  // Takes the next message: exactly wants() bytes (anything else is refused). After a refusal or
  // a proof, every further call is refused.
  Step on_message(const void* msg, std::size_t bytes);

  // The rank the client claimed (valid once a Hello was taken).
  int claimed_rank() const { return static_cast<int>(hello_.rank); }

 private:
  enum class Stage { kHello, kResponse, kDone };
  const JobSecret& secret_;
  Purpose purpose_;
  int world_size_, self_;
  Stage stage_ = Stage::kHello;
  Hello hello_;
  std::uint8_t server_nonce_[kNonceBytes] = {};
};

// The client's side, blocking with `deadline`: sends the Hello, checks the server's proof, sends
// its own, waits for the Accept word. Throws PeerFailure(peer) when the server closed the
// connection before accepting (it refused or evicted us: the caller may connect again), Error when
// the server's proof is wrong (whoever listens there does not know the job's secret: never
// retried), TimeoutError past the deadline.
void client_handshake(int fd, const JobSecret& secret, Purpose purpose, int self, int peer, Deadline deadline);

// The proofs (exposed for the tests).
void server_proof(const JobSecret& secret, const Hello& hello, const std::uint8_t (&server_nonce)[kNonceBytes],
                  std::uint8_t (&out)[kProofBytes]);
void client_proof(const JobSecret& secret, const Hello& hello, const std::uint8_t (&server_nonce)[kNonceBytes],
                  std::uint8_t (&out)[kProofBytes]);

}  // namespace strata::comm::tcp
