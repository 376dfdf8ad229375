#include "strata/common/hdf5_lock.h"

namespace strata {

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

}  // namespace strata
