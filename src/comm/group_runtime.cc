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
  std::unique_ptr<Runtime> rt = Runtime::bootstrap(std::move(group), rank, size, env, options, exchange);
  // The role groups, coloured and keyed as Runtime::bootstrap splits its communicators: ps 0,
  // chief + workers 1, evaluator 2; the chief first, then tasks in index order.
  const Role role = rt->role();
  const int color = role == Role::kPs ? 0 : (role == Role::kEvaluator ? 2 : 1);
  const int key = role == Role::kChief ? 0 : rt->task().index + 1;
  rt->set_role_group(g.split(color, key, Deadline{timeout, "bootstrap (groups by role)"}));
  return rt;
}

}  // namespace strata::comm
