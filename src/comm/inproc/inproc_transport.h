// The in-process transport: the Transport interface (strata/comm/transport.h) between ranks that
// are threads of one process (comm::InprocWorld), for the inproc test tier. Every rank's region is
// plain memory of the process; a get or put is a copy, the atomics are the compiler's atomics on
// that memory, and every operation is complete when its call returns (flush only fences; no peer
// is ordered_to, see the .cc). allocate_region and a region's destruction are collective over the group, as on
// the other transports (an allgather of the bases; a barrier before the memory is freed).
//
// ThreadSanitizer: the copies and atomics on region memory model one-sided access, which the
// Transport contract orders only through its atomics and flushes (a pull may read weights that
// the owner is updating, as it does through an RDMA NIC). Those accesses are therefore not
// checked for races (the memory accesses are ignored, the atomics still synchronise): TSan checks
// the threads of each rank and the happens-before that the protocol's counters give, not the
// transport's stand-in for remote memory.
#pragma once

#include <memory>

#include "strata/comm/group.h"
#include "strata/comm/transport.h"

namespace strata::comm::inproc {

// Collective over `group`, whose ranks must all be threads of this process. The group must
// outlive the transport and its regions.
std::unique_ptr<Transport> make_inproc_transport(Group& group);

}  // namespace strata::comm::inproc
