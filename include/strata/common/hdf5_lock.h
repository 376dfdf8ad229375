// The process's lock around HDF5. Debian's parallel HDF5 is built without its thread-safety
// option, so no two threads may be inside the library at once; in-process ranks (threads of one
// process, strata/comm/group.h) read and write checkpoints and datasets concurrently. Every strata
// function that calls HDF5 holds this lock for as long as it holds HDF5 identifiers (the
// checkpoint and data layers take it with their HDF5 error silencer). Recursive: a function that
// holds it may call another that takes it.
#pragma once

#include <mutex>

namespace strata {

std::recursive_mutex& hdf5_mutex();

}  // namespace strata
