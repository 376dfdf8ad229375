// Creating a transport by name ("auto", "mpi", "tcp", "ucx"): `--transport` / STRATA_TRANSPORT.
//
// "auto" (the default): when every rank shares one node, "mpi" (shared-memory windows). Across
// nodes it probes, collectively, whether the MPI library really offers one-sided communication on
// that network: an MPI_Win_allocate over the whole communicator, then a fetch-and-add from a rank
// on another node while the target sleeps outside MPI (true one-sided hardware completes it
// without the target; an emulation over TCP waits). Passing both: "mpi"; otherwise "tcp" (shared
// memory within each node, requests served by the owner's thread between nodes). The result's
// why() records the probes.
// A forced "mpi" across nodes whose MPI library cannot allocate a window there is a ConfigError
// naming the cause and the settings that fix it, on every rank.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "strata/comm/transport.h"

namespace strata::comm {

// Number of distinct nodes among the ranks of `comm` (collective).
int count_nodes(MPI_Comm comm);

// Collective over `comm`. Throws ConfigError for a name not compiled into this build, listing the
// names that are.
std::unique_ptr<Transport> create_transport(const std::string& name, MPI_Comm comm);
// The same over a process group (strata/comm/group.h): an MPI group's communicator as above; the
// in-process group gets the in-process transport ("auto" or "inproc"; any other name is a
// ConfigError, since those need an MPI job). The group must outlive the transport.
class Group;
std::unique_ptr<Transport> create_transport(const std::string& name, Group& group);

}  // namespace strata::comm
