// The network baseline of `strata bench`: raw TCP request/response between two ranks with blocking
// sockets (TCP_NODELAY), the reference that every row between nodes is compared with (vs_link),
// as single-thread memcpy is within a node (vs_memcpy).
#pragma once

#include <mpi.h>

#include <cstdint>

namespace strata::cli {

struct LinkTimes {
  double pull_us = 0;  // one 8-byte request answered with `bytes` bytes
  double push_us = 0;  // one `bytes`-byte message answered with an 8-byte ack
  double mpi_pull_us = 0;  // the pull shape with MPI_Send/MPI_Recv (Open MPI's own TCP path between
                           // nodes): the reference the ps-lite figures were taken against
                           // (docs/PERFORMANCE.md, "Between nodes")
};

// Collective over `comm` (every rank calls it with the same arguments): `server` listens on the
// address the tcp transport would use (comm/tcp/socket.h), `client` connects and times -w warm-up
// and -n timed round trips of each kind, then the pull shape over MPI point-to-point. The times
// (microseconds per round trip) are returned on every rank. Socket waits are bounded by
// `timeout_s`.
LinkTimes measure_link(MPI_Comm comm, int server, int client, std::uint64_t bytes, int warmup, int iters,
                       double timeout_s);

}  // namespace strata::cli
