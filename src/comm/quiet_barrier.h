// A barrier that waits without a busy loop; private to the communication layer.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace strata::comm {

// MPI_Barrier's semantics (collective over `comm`, no deadline) without its busy wait: Open MPI's
// blocking barrier spins (with sched_yield at best), and the ranks that wait in a region's or a
// transport's teardown may wait a long while (the workers, while the chief runs the final
// evaluation). On a core they share, a spinning waiter slows the very rank it waits for. This one
// polls for about 50 us, then sleeps in steps growing from 50 us to 1 ms between tests. Like the
// barrier it replaces it has no deadline: a rank that stopped is the liveness monitor's to report.
// Returns MPI's error code and never throws (destructors call it).
inline int quiet_barrier(MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  int rc = MPI_Ibarrier(comm, &request);
  if (rc != MPI_SUCCESS) return rc;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::microseconds step{50};
  while (true) {
    int done = 0;
    rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    if (std::chrono::steady_clock::now() - start < std::chrono::microseconds(50)) continue;
    std::this_thread::sleep_for(step);
    step = std::min(step * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace strata::comm
