#include "comm/job_secret.h"

#include <openssl/crypto.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "strata/common/error.h"

namespace strata::comm {

void kernel_random(void* out, std::size_t bytes) {
  auto* p = static_cast<std::uint8_t*>(out);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(p + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(std::string("getrandom failed: ") + std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
}

JobSecret JobSecret::share(MPI_Comm comm) {
  JobSecret s;
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  if (rank == 0) kernel_random(s.bytes_.data(), kBytes);
  STRATA_CHECK_MPI(MPI_Bcast(s.bytes_.data(), static_cast<int>(kBytes), MPI_BYTE, 0, comm));
  return s;
}

JobSecret JobSecret::from_bytes(const std::uint8_t (&bytes)[kBytes]) {
  JobSecret s;
  std::memcpy(s.bytes_.data(), bytes, kBytes);
  return s;
}

void JobSecret::send_to(MPI_Comm comm, int dest, int tag) const {
  STRATA_CHECK_MPI(MPI_Send(bytes_.data(), static_cast<int>(kBytes), MPI_BYTE, dest, tag, comm));
}

JobSecret JobSecret::receive_from(MPI_Comm comm, int source, int tag) {
  JobSecret s;
  STRATA_CHECK_MPI(MPI_Recv(s.bytes_.data(), static_cast<int>(kBytes), MPI_BYTE, source, tag, comm, MPI_STATUS_IGNORE));
  return s;
}

JobSecret JobSecret::random() {
  JobSecret s;
  kernel_random(s.bytes_.data(), kBytes);
  return s;
}

JobSecret::~JobSecret() { OPENSSL_cleanse(bytes_.data(), kBytes); }

}  // namespace strata::comm
