// The MPI implementation of comm::Group (strata/comm/group.h): point-to-point messages are
// MPI_Isend / MPI_Iprobe + MPI_Recv of MPI_BYTE on the communicator, every wait polled against its
// deadline by comm::wait_until. For the runtime and tools that hold an MPI communicator; the layers
// above comm/ see only Group.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "strata/cluster/runtime.h"
#include "strata/comm/group.h"

namespace strata::comm {

// A Group over `comm` (borrowed: it must outlive the group; the caller frees it). Ranks and size
// are the communicator's.
std::unique_ptr<Group> make_mpi_group(MPI_Comm comm);
// The communicator of a group made by make_mpi_group, MPI_COMM_NULL for any other group.
MPI_Comm mpi_comm(const Group& group);

// The groups of a bootstrapped runtime: an MPI runtime's communicators (Communicators in
// strata/cluster/runtime.h), or the groups of a runtime bootstrapped over a process group
// (strata/comm/group_runtime.h); a member is null where this rank is not in that group (ps on a
// worker, say). The runtime must outlive them.
struct RuntimeGroups {
  std::shared_ptr<Group> runtime;  // every rank of the job
  std::shared_ptr<Group> role;     // the ranks with this rank's role
  std::shared_ptr<Group> ps;       // the PS ranks
  std::shared_ptr<Group> workers;  // chief + workers
  // The runtime rank of each member of ps / workers, in that group's rank order (empty where this
  // rank is not a member): for naming a member in messages.
  std::vector<int> ps_ranks;
  std::vector<int> worker_ranks;
};
RuntimeGroups groups_of(const Runtime& runtime);
// Its runtime group alone, and its workers' group (null on a rank that is not a worker).
std::shared_ptr<Group> runtime_group(const Runtime& runtime);
std::shared_ptr<Group> workers_group(const Runtime& runtime);

}  // namespace strata::comm
