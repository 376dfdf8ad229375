// The job's secret: 32 random bytes that only the job's ranks know, the key of every data-plane
// handshake (src/comm/tcp/handshake.h). Private to the comm layer.
//
// How it is made and shared (docs/SECURITY.md): rank 0 of the communicator draws it from the
// kernel (getrandom) and broadcasts it over MPI, the channel the launcher already set up between
// the job's ranks. It never appears in a file, the environment or a command line, and it is
// wiped from memory when the last copy goes away. A new secret is drawn for every communicator a
// transport is made on, so a restarted job (or a second transport) never reuses one.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace strata::comm {

class JobSecret {
 public:
  static constexpr std::size_t kBytes = 32;

  // Collective over `comm`: rank 0 draws the secret, every rank returns it. Throws Error when the
  // kernel gives no randomness or the broadcast fails.
  static JobSecret share(MPI_Comm comm);
  // A secret from given bytes (tests).
  static JobSecret from_bytes(const std::uint8_t (&bytes)[kBytes]);
  // Point to point over MPI, for a listener that only one rank may use (the bench's link
  // baseline): send_to / receive_from pair like MPI_Send / MPI_Recv on (comm, peer, tag).
  void send_to(MPI_Comm comm, int dest, int tag) const;
  static JobSecret receive_from(MPI_Comm comm, int source, int tag);
  // Fresh random bytes from the kernel, without sharing them.
  static JobSecret random();

  JobSecret(const JobSecret& other) : bytes_(other.bytes_) {}
  JobSecret& operator=(const JobSecret& other) {
    bytes_ = other.bytes_;
    return *this;
  }
  ~JobSecret();

  const std::uint8_t* data() const { return bytes_.data(); }

 private:
  JobSecret() = default;
  std::array<std::uint8_t, kBytes> bytes_{};
};

// Fills `out` with `bytes` random bytes from the kernel (getrandom). Throws Error on failure.
void kernel_random(void* out, std::size_t bytes);

}  // namespace strata::comm
