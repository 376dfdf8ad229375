// Cases of comm::Group's contract (strata/comm/group.h), written once against the interface and
// run by the inproc tier (thread ranks, 1-5 of them) and by the mpi tier (the MpiGroup of a real
// job at its launched size). Each case runs on every rank of a group and asserts with gtest.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm/group.h"
#include "strata/common/error.h"

namespace strata::test {

inline comm::Deadline quick_deadline(const std::string& what) { return comm::Deadline{20, what}; }

inline void group_barrier_case(comm::Group& g) {
  for (int i = 0; i < 3; ++i) g.barrier(quick_deadline("barrier"));
}

// Sums in rank order, as a sequential loop would: the values chosen make a different order give
// different bits in float (1e8 + small terms).
inline void group_allreduce_case(comm::Group& g) {
  const int n = g.size(), r = g.rank();
  std::int64_t v[3] = {r + 1, 10 - r, r * r};
  g.allreduce(v, 3, comm::ElemType::kI64, comm::ReduceOp::kSum, quick_deadline("sum"));
  std::int64_t want0 = 0, want1 = 0, want2 = 0;
  for (int k = 0; k < n; ++k) {
    want0 += k + 1;
    want1 += 10 - k;
    want2 += k * k;
  }
  EXPECT_EQ(v[0], want0);
  EXPECT_EQ(v[1], want1);
  EXPECT_EQ(v[2], want2);
  EXPECT_EQ(g.allreduce(std::int64_t{r}, comm::ReduceOp::kMin, quick_deadline("min")), 0);
  EXPECT_EQ(g.allreduce(std::int64_t{r}, comm::ReduceOp::kMax, quick_deadline("max")), n - 1);
  EXPECT_EQ(g.allreduce(0.5 * r, comm::ReduceOp::kMax, quick_deadline("max f64")), 0.5 * (n - 1));
  float f = r == 0 ? 1e8f : 3.0f;
  g.allreduce(&f, 1, comm::ElemType::kF32, comm::ReduceOp::kSum, quick_deadline("sum f32"));
  float want_f = 1e8f;
  for (int k = 1; k < n; ++k) want_f += 3.0f;
  EXPECT_EQ(std::memcmp(&f, &want_f, sizeof f), 0) << f << " vs " << want_f;
}

inline void group_reduce_case(comm::Group& g) {
  for (int root = 0; root < g.size(); ++root) {
    double v = g.rank() + 1.0;
    g.reduce(&v, 1, comm::ElemType::kF64, comm::ReduceOp::kSum, root, quick_deadline("reduce"));
    const double total = g.size() * (g.size() + 1) / 2.0;
    EXPECT_EQ(v, g.rank() == root ? total : g.rank() + 1.0) << "root " << root;
  }
}

inline void group_gather_broadcast_case(comm::Group& g) {
  const int n = g.size(), r = g.rank();
  std::vector<std::int32_t> all(static_cast<std::size_t>(n), -1);
  const std::int32_t mine = 100 + r;
  g.allgather(&mine, sizeof mine, all.data(), quick_deadline("allgather"));
  for (int k = 0; k < n; ++k) EXPECT_EQ(all[static_cast<std::size_t>(k)], 100 + k);
  // Strings of different lengths, the empty one included.
  const auto strings = g.allgather_strings(std::string(static_cast<std::size_t>(r), 'a' + static_cast<char>(r)),
                                           quick_deadline("allgather_strings"));
  ASSERT_EQ(strings.size(), static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k)
    EXPECT_EQ(strings[static_cast<std::size_t>(k)], std::string(static_cast<std::size_t>(k), 'a' + static_cast<char>(k)));
  for (int root = 0; root < n; ++root) {
    std::uint64_t v = r == root ? 0xABCD0000u + static_cast<unsigned>(root) : 0;
    g.broadcast(&v, sizeof v, root, quick_deadline("broadcast"));
    EXPECT_EQ(v, 0xABCD0000u + static_cast<unsigned>(root));
  }
}

// Messages of one pair and tag arrive in order; tags do not mix; an empty message is a message.
inline void group_point_to_point_case(comm::Group& g) {
  const int n = g.size(), r = g.rank();
  if (n < 2) return;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int i = 0; i < 5; ++i) {
    const std::int64_t v = r * 1000 + i;
    g.send(next, 7, &v, sizeof v, quick_deadline("send"));
  }
  g.send(next, 8, nullptr, 0, quick_deadline("send empty"));
  const auto empty = g.recv(prev, 8, quick_deadline("recv empty"));
  EXPECT_TRUE(empty.empty());
  for (int i = 0; i < 5; ++i) {
    const auto m = g.recv(prev, 7, quick_deadline("recv"));
    ASSERT_EQ(m.size(), sizeof(std::int64_t));
    std::int64_t v = 0;
    std::memcpy(&v, m.data(), sizeof v);
    EXPECT_EQ(v, prev * 1000 + i);
  }
  EXPECT_FALSE(g.try_recv(prev, 7).has_value());
  g.barrier(quick_deadline("barrier after messages"));
}

// A rank that never arrives: the root names it, the others name the root, within the deadline.
inline void group_late_rank_case(comm::Group& g) {
  const int n = g.size(), r = g.rank();
  if (n < 3) return;
  const int absent = n - 1;
  const comm::Deadline d{0.3, "the test barrier"};
  if (r == absent) {
    // Stays away for longer than everyone's deadline, then leaves (the group is not used again).
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    g.barrier(d);
    ADD_FAILURE() << "rank " << r << ": the barrier completed without rank " << absent;
  } catch (const TimeoutError& e) {
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(took, 5.0);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the test barrier: "), std::string::npos) << msg;
    if (r == 0) {
      EXPECT_EQ(e.missing_ranks(), std::vector<int>{absent});
      EXPECT_NE(msg.find("rank " + std::to_string(absent) + " did not answer within 0.3 s"), std::string::npos) << msg;
    } else {
      EXPECT_EQ(e.missing_ranks(), std::vector<int>{0});
    }
  }
}

}  // namespace strata::test
