// Helpers of the multi-rank test seam shared by both tiers (rank_test.h).
#include "common/rank_test.h"

#include <algorithm>

#include "strata/common/error.h"

namespace strata::testing {

void barrier_among(comm::Group& group, const std::vector<int>& members, double timeout_s) {
  constexpr int kTag = 31000;  // below the group's own collective tag
  if (members.empty()) return;
  const int me = group.rank();
  if (std::find(members.begin(), members.end(), me) == members.end())
    throw Error("barrier_among: rank " + std::to_string(me) + " is not a member");
  const int root = members.front();
  const comm::Deadline deadline{timeout_s, "barrier among " + std::to_string(members.size()) + " ranks"};
  const char token = 1;
  if (me == root) {
    for (int r : members)
      if (r != root) group.recv(r, kTag, deadline);
    for (int r : members)
      if (r != root) group.send(r, kTag, &token, 1, deadline);
  } else {
    group.send(root, kTag, &token, 1, deadline);
    group.recv(root, kTag, deadline);
  }
}

std::vector<int> worker_ranks(const Runtime& runtime) {
  std::vector<int> out;
  for (const auto& info : runtime.ranks())
    if (info.task.type == "chief" || info.task.type == "master" || info.task.type == "worker") out.push_back(info.rank);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace strata::testing
