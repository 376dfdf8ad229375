#include "comm/tcp/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

#include "strata/common/error.h"

namespace strata::comm::tcp {
namespace {

constexpr char kServerLabel[] = "strata tcp server v1";
constexpr char kClientLabel[] = "strata tcp client v1";

void proof(const JobSecret& secret, const char* label, const Hello& hello,
           const std::uint8_t (&server_nonce)[kNonceBytes], std::uint8_t (&out)[kProofBytes]) {
  // label | Hello | server nonce: fixed lengths, so the concatenation is unambiguous.
  std::uint8_t msg[sizeof kServerLabel + sizeof(Hello) + kNonceBytes];
  static_assert(sizeof kServerLabel == sizeof kClientLabel, "labels of equal length");
  std::memcpy(msg, label, sizeof kServerLabel);
  std::memcpy(msg + sizeof kServerLabel, &hello, sizeof hello);
  std::memcpy(msg + sizeof kServerLabel + sizeof hello, server_nonce, kNonceBytes);
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(JobSecret::kBytes), msg, sizeof msg, out, &len) ||
      len != kProofBytes)
    throw Error("HMAC-SHA256 failed (OpenSSL libcrypto)");
}

bool same_proof(const std::uint8_t (&a)[kProofBytes], const std::uint8_t (&b)[kProofBytes]) {
  return CRYPTO_memcmp(a, b, kProofBytes) == 0;  // constant time: no timing hint about the bytes
}

}  // namespace

void server_proof(const JobSecret& secret, const Hello& hello, const std::uint8_t (&server_nonce)[kNonceBytes],
                  std::uint8_t (&out)[kProofBytes]) {
  proof(secret, kServerLabel, hello, server_nonce, out);
}

void client_proof(const JobSecret& secret, const Hello& hello, const std::uint8_t (&server_nonce)[kNonceBytes],
                  std::uint8_t (&out)[kProofBytes]) {
  proof(secret, kClientLabel, hello, server_nonce, out);
}

ServerHandshake::ServerHandshake(const JobSecret& secret, Purpose purpose, int world_size, int self)
    : secret_(secret), purpose_(purpose), world_size_(world_size), self_(self) {}

std::size_t ServerHandshake::wants() const {
  switch (stage_) {
    case Stage::kHello: return sizeof(Hello);
    case Stage::kResponse: return sizeof(Response);
    case Stage::kDone: return 0;
  }
  return 0;
}

ServerHandshake::Step ServerHandshake::on_message(const void* msg, std::size_t bytes) {
  Step step;
  auto refuse = [&](std::string why) {
    stage_ = Stage::kDone;
    step.reply.clear();
    step.refused = std::move(why);
    return step;
  };
  if (stage_ == Stage::kDone) return refuse("message after the handshake ended");
  if (bytes != wants()) return refuse("a message of " + std::to_string(bytes) + " bytes where " +
                                      std::to_string(wants()) + " were expected");
  if (stage_ == Stage::kHello) {
    std::memcpy(&hello_, msg, sizeof hello_);
    if (hello_.magic != kHandshakeMagic) return refuse("not strata's protocol (bad magic)");
    if (hello_.version != kHandshakeVersion)
      return refuse("handshake version " + std::to_string(hello_.version) + ", this build speaks " +
                    std::to_string(kHandshakeVersion));
    if (hello_.purpose != static_cast<std::uint32_t>(purpose_))
      return refuse("a connection for purpose " + std::to_string(hello_.purpose) + " on this listener");
    if (hello_.rank >= static_cast<std::uint32_t>(world_size_) || static_cast<int>(hello_.rank) == self_)
      return refuse("it claims rank " + std::to_string(hello_.rank) + ", not a peer of this job");
    Challenge c;
    kernel_random(c.nonce, kNonceBytes);
    std::memcpy(server_nonce_, c.nonce, kNonceBytes);
    server_proof(secret_, hello_, server_nonce_, c.proof);
    step.reply.assign(reinterpret_cast<const char*>(&c), sizeof c);
    stage_ = Stage::kResponse;
    return step;
  }
  Response r;
  std::memcpy(&r, msg, sizeof r);
  std::uint8_t expected[kProofBytes];
  client_proof(secret_, hello_, server_nonce_, expected);
  const bool ok = same_proof(expected, r.proof);
  OPENSSL_cleanse(expected, sizeof expected);
  if (!ok) return refuse("it did not prove the job's secret (wrong proof)");
  stage_ = Stage::kDone;
  step.proven = true;
  return step;
}

void client_handshake(int fd, const JobSecret& secret, Purpose purpose, int self, int peer, Deadline deadline) {
  Hello hello;
  hello.rank = static_cast<std::uint32_t>(self);
  hello.purpose = static_cast<std::uint32_t>(purpose);
  kernel_random(hello.nonce, kNonceBytes);
  send_all(fd, &hello, sizeof hello, deadline, peer, "tcp handshake (hello)");
  Challenge c;
  recv_all(fd, &c, sizeof c, deadline, peer, "tcp handshake (challenge)");
  std::uint8_t expected[kProofBytes];
  server_proof(secret, hello, c.nonce, expected);
  const bool ok = same_proof(expected, c.proof);
  OPENSSL_cleanse(expected, sizeof expected);
  if (!ok)
    throw Error("the listener of rank " + std::to_string(peer) +
                " did not prove the job's secret: something other than that rank answers at its address "
                "(docs/SECURITY.md)");
  Response r;
  client_proof(secret, hello, c.nonce, r.proof);
  send_all(fd, &r, sizeof r, deadline, peer, "tcp handshake (response)");
  std::uint64_t word = 0;
  recv_all(fd, &word, sizeof word, deadline, peer, "tcp handshake (accept)");
  if (word != kAcceptWord)
    throw Error("rank " + std::to_string(peer) + " answered the handshake with an unknown word");
}

}  // namespace strata::comm::tcp
