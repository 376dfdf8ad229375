// Helpers of the multi-rank test seam shared by both tiers (rank_test.h).
#include "common/rank_test.h"

#include <algorithm>
#include <cstring>

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

std::vector<double> sum_among(comm::Group& group, const std::vector<int>& members, const std::vector<double>& values,
                              double timeout_s) {
  constexpr int kTag = 31001;
  const int me = group.rank();
  if (std::find(members.begin(), members.end(), me) == members.end())
    throw Error("sum_among: rank " + std::to_string(me) + " is not a member");
  const int root = members.front();
  const comm::Deadline deadline{timeout_s, "sum among " + std::to_string(members.size()) + " ranks"};
  const std::size_t bytes = values.size() * sizeof(double);
  std::vector<double> sum = values;
  if (me == root) {
    for (int r : members) {
      if (r == root) continue;
      const std::vector<std::byte> theirs = group.recv(r, kTag, deadline);
      if (theirs.size() != bytes)
        throw Error("sum_among: rank " + std::to_string(r) + " sent " + std::to_string(theirs.size()) +
                    " bytes, expected " + std::to_string(bytes));
      std::vector<double> v(values.size());
      std::memcpy(v.data(), theirs.data(), bytes);
      for (std::size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
    }
    for (int r : members)
      if (r != root) group.send(r, kTag, sum.data(), bytes, deadline);
  } else {
    group.send(root, kTag, values.data(), bytes, deadline);
    const std::vector<std::byte> got = group.recv(root, kTag, deadline);
    if (got.size() != bytes) throw Error("sum_among: the root's sum has the wrong size");
    std::memcpy(sum.data(), got.data(), bytes);
  }
  return sum;
}

std::vector<int> worker_ranks(const Runtime& runtime) {
  std::vector<int> out;
  for (const auto& info : runtime.ranks())
    if (info.task.type == "chief" || info.task.type == "master" || info.task.type == "worker") out.push_back(info.rank);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace strata::testing
