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


// Many collectives of every kind in a row, with roots that move: every rank sees the same
// results in the same order (no message of one collective is taken by another).
inline void group_mixed_sequence_case(comm::Group& g) {
  const int n = g.size(), r = g.rank();
  for (int i = 0; i < 60; ++i) {
    const int root = i % n;
    switch (i % 4) {
      case 0: {
        const std::int64_t sum = g.allreduce(std::int64_t{r + i}, comm::ReduceOp::kSum, quick_deadline("mixed sum"));
        EXPECT_EQ(sum, static_cast<std::int64_t>(n) * i + n * (n - 1) / 2) << "iteration " << i;
        break;
      }
      case 1: {
        std::int64_t v = r == root ? 1000 + i : -1;
        g.broadcast(&v, sizeof v, root, quick_deadline("mixed broadcast"));
        EXPECT_EQ(v, 1000 + i) << "iteration " << i;
        break;
      }
      case 2: {
        const auto all = g.allgather_strings(std::to_string(r * i), quick_deadline("mixed strings"));
        for (int k = 0; k < n; ++k) EXPECT_EQ(all[static_cast<std::size_t>(k)], std::to_string(k * i));
        break;
      }
      default: g.barrier(quick_deadline("mixed barrier"));
    }
  }
}

// Messages with different tags between the same pair are kept apart, whatever order they are
// received in; a large message arrives whole.
inline void group_tags_and_sizes_case(comm::Group& g) {
  const int n = g.size(), r = g.rank();
  if (n < 2) return;
  const int peer = r ^ 1;
  if (peer >= n) {
    g.barrier(quick_deadline("odd rank out"));
    return;
  }
  std::vector<std::uint8_t> big(1 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>((i * 7 + static_cast<std::size_t>(r)) & 0xff);
  for (int tag = 1; tag <= 3; ++tag) {
    const std::int32_t v = r * 10 + tag;
    g.send(peer, tag, &v, sizeof v, quick_deadline("tagged send"));
  }
  // A large send may wait for its receiver (MPI's rendezvous): the lower rank sends first.
  std::vector<std::byte> large;
  if (r < peer) {
    g.send(peer, 4, big.data(), big.size(), quick_deadline("large send"));
    large = g.recv(peer, 4, quick_deadline("large recv"));
  } else {
    large = g.recv(peer, 4, quick_deadline("large recv"));
    g.send(peer, 4, big.data(), big.size(), quick_deadline("large send"));
  }
  ASSERT_EQ(large.size(), big.size());
  bool same = true;
  for (std::size_t i = 0; i < large.size() && same; ++i)
    same = static_cast<std::uint8_t>(large[i]) == static_cast<std::uint8_t>((i * 7 + static_cast<std::size_t>(peer)) & 0xff);
  EXPECT_TRUE(same);
  for (int tag = 3; tag >= 1; --tag) {
    const auto m = g.recv(peer, tag, quick_deadline("tagged recv"));
    ASSERT_EQ(m.size(), sizeof(std::int32_t));
    std::int32_t v = 0;
    std::memcpy(&v, m.data(), sizeof v);
    EXPECT_EQ(v, peer * 10 + tag);
  }
  g.barrier(quick_deadline("after tags"));
}

// A reduction whose ranks disagree on the size is refused with the rank named, not misread.
inline void group_size_mismatch_case(comm::Group& g) {
  const int n = g.size(), r = g.rank();
  if (n < 2) return;
  std::int64_t v[2] = {1, 2};
  const std::size_t count = r == n - 1 ? 2 : 1;
  try {
    g.allreduce(v, count, comm::ElemType::kI64, comm::ReduceOp::kSum, comm::Deadline{0.5, "mismatched sum"});
    if (r == 0) ADD_FAILURE() << "rank 0 combined a reduction of mismatched sizes";
  } catch (const TimeoutError&) {
    // The others wait for rank 0's result, which never comes: named as rank 0.
    EXPECT_NE(r, 0);
  } catch (const Error& e) {
    EXPECT_EQ(r, 0);
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(n - 1) + " sent 16 bytes to a reduction of 8"),
              std::string::npos)
        << e.what();
  }
}

// split: even and odd ranks form two groups ranked by descending rank (the key), rank 3 joins
// none; each new group runs its own collectives and messages, the parent stays usable between
// and after, and a second split gets groups of its own.
inline void group_split_case(comm::Group& g) {
  const int n = g.size(), r = g.rank();
  const int color = r == 3 ? -1 : r % 2;
  auto sub = g.split(color, n - r, quick_deadline("split"));
  if (r == 3) {
    EXPECT_EQ(sub, nullptr);
  } else {
    ASSERT_NE(sub, nullptr);
    std::vector<int> members;  // my colour's ranks, by descending rank
    for (int k = n - 1; k >= 0; --k)
      if (k != 3 && k % 2 == color) members.push_back(k);
    EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
    EXPECT_EQ(members[static_cast<std::size_t>(sub->rank())], r);
    EXPECT_EQ(sub->allreduce(std::int64_t{r}, comm::ReduceOp::kSum, quick_deadline("sum in a split")),
              [&] {
                std::int64_t t = 0;
                for (int k : members) t += k;
                return t;
              }());
    if (sub->size() > 1) {
      const int next = (sub->rank() + 1) % sub->size(), prev = (sub->rank() + sub->size() - 1) % sub->size();
      sub->send(next, 7, &r, sizeof r, quick_deadline("ring in a split"));
      const auto got = sub->recv(prev, 7, quick_deadline("ring in a split"));
      int from = -1;
      ASSERT_EQ(got.size(), sizeof from);
      std::memcpy(&from, got.data(), sizeof from);
      EXPECT_EQ(from, members[static_cast<std::size_t>(prev)]);
    }
  }
  EXPECT_EQ(g.allreduce(std::int64_t{1}, comm::ReduceOp::kSum, quick_deadline("parent after split")), n);
  auto again = g.split(0, r, quick_deadline("second split"));
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->rank(), r);
  EXPECT_EQ(again->size(), n);
  again->barrier(quick_deadline("barrier in a second split"));
  if (sub) sub->barrier(quick_deadline("first split still works"));
}

}  // namespace strata::test
