// Runtime::bootstrap over a process group (strata/comm/group_runtime.h).
#include "strata/comm/group_runtime.h"

#include <cstring>
#include <string>
#include <vector>

#include "strata/common/error.h"

namespace strata::comm {

std::unique_ptr<Runtime> bootstrap_over(std::shared_ptr<Group> group, const Env& env, const BootstrapOptions& options) {
  if (!group) throw Error("comm::bootstrap_over: no group");
  Group& g = *group;
  const double timeout = options.timeout_s;
  const Runtime::Exchange exchange = [&g, timeout](const void* mine, int bytes, const std::string& what) {
    if (bytes < 0) throw Error(what + ": a record of " + std::to_string(bytes) + " bytes");
    std::vector<char> all(static_cast<std::size_t>(bytes) * static_cast<std::size_t>(g.size()));
    g.allgather(mine, static_cast<std::size_t>(bytes), all.data(), Deadline{timeout, what});
    return all;
  };
  const int rank = g.rank(), size = g.size();
  return Runtime::bootstrap(std::move(group), rank, size, env, options, exchange);
}

}  // namespace strata::comm
