// A Runtime over a process group instead of an MPI communicator: the bootstrap protocol of
// strata/cluster/runtime.h (resolution, the two exchanges with deadlines that name late ranks, the
// same checks and the same ConfigError on every rank) over Group collectives. For ranks that are
// not an MPI job: the in-process group (comm::InprocWorld), where the inproc test tier runs the
// PS protocol, the strategy and the training loop as thread ranks.
#pragma once

#include <memory>

#include "strata/cluster/runtime.h"
#include "strata/comm/group.h"

namespace strata::comm {

// Collective over `group`. The runtime keeps the group (Runtime::group()); its comms() are all
// MPI_COMM_NULL. The rank context of log lines is the caller's (a thread rank sets its own with
// ScopedRankContext).
std::unique_ptr<Runtime> bootstrap_over(std::shared_ptr<Group> group, const Env& env, const BootstrapOptions& options);

}  // namespace strata::comm
