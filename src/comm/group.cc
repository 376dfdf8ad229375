// The collectives of every Group, over its point-to-point messages (strata/comm/group.h): gather at
// the root, combine there, send the result to the others. The control plane of the layers above
// comm/ moves a few numbers or short strings per call, so the exchange through one rank costs
// nothing that matters, and it is what lets every wait name the ranks it is missing.

#include "strata/comm/group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "strata/common/error.h"

namespace strata::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  throw Error("comm::ReduceOp: unknown value " + std::to_string(static_cast<int>(op)));
}

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(double s) {
  std::string out = std::to_string(s);
  out.erase(out.find_last_not_of('0') + 1);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

}  // namespace

void throw_timeout(const Deadline& deadline, std::vector<int> missing) {
  const std::string who = missing.empty() ? "the peers" : describe_ranks(missing);
  throw TimeoutError(deadline.what + ": " + who + " did not answer within " +
                         seconds(deadline.timeout_s) + " s",
                     std::move(missing));
}

void wait_until(const std::function<bool()>& done, const Deadline& deadline,
                const std::function<std::vector<int>()>& late, const std::function<bool()>& progress) {
  if (done()) return;
  const auto bound = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline.timeout_s));
  const auto start = Clock::now();
  auto until = start + bound;
  auto next_look = start + std::chrono::milliseconds(500);
  std::chrono::microseconds step{50};
  while (!done()) {
    const auto now = Clock::now();
    if (progress && now >= next_look) {
      next_look = now + std::chrono::milliseconds(500);
      if (progress()) until = now + bound;
    }
    if (now > until) throw_timeout(deadline, late ? late() : std::vector<int>{});
    if (deadline.while_waiting) deadline.while_waiting();
    if (now - start < std::chrono::microseconds(50)) continue;
    std::this_thread::sleep_for(step);
    step = std::min(step * 2, std::chrono::microseconds(1000));
  }
}

void Group::wait(const std::function<bool()>& done, const Deadline& deadline,
                 const std::function<std::vector<int>()>& late) {
  wait_until(done, deadline, late);
}

std::vector<std::byte> Group::recv(int peer, int tag, const Deadline& deadline) {
  std::optional<std::vector<std::byte>> got;
  wait([&] { return (got = try_recv(peer, tag)).has_value(); }, deadline, [peer] { return std::vector<int>{peer}; });
  return std::move(*got);
}

std::vector<std::vector<std::byte>> Group::gather_at(int root, int tag, const void* mine, std::size_t bytes,
                                                     const Deadline& deadline) {
  const int n = size();
  if (rank() != root) {
    send(root, tag, mine, bytes, deadline);
    return {};
  }
  std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(n));
  std::vector<bool> have(static_cast<std::size_t>(n), false);
  got[static_cast<std::size_t>(root)].assign(static_cast<const std::byte*>(mine),
                                             static_cast<const std::byte*>(mine) + bytes);
  have[static_cast<std::size_t>(root)] = true;
  int missing = n - 1;
  wait(
      [&] {
        for (int r = 0; r < n && missing > 0; ++r) {
          if (have[static_cast<std::size_t>(r)]) continue;
          if (auto m = try_recv(r, tag)) {
            got[static_cast<std::size_t>(r)] = std::move(*m);
            have[static_cast<std::size_t>(r)] = true;
            --missing;
          }
        }
        return missing == 0;
      },
      deadline,
      [&] {
        std::vector<int> late;
        for (int r = 0; r < n; ++r)
          if (!have[static_cast<std::size_t>(r)]) late.push_back(r);
        return late;
      });
  return got;
}

void Group::scatter_same(int root, const void* data, std::size_t bytes, const Deadline& deadline) {
  for (int r = 0; r < size(); ++r)
    if (r != root) send(r, kCollectiveTag, data, bytes, deadline);
}

void Group::barrier(const Deadline& deadline) {
  const char token = 1;
  gather_at(0, kCollectiveTag, &token, 1, deadline);
  if (rank() == 0)
    scatter_same(0, &token, 1, deadline);
  else
    recv(0, kCollectiveTag, deadline);
}

namespace {

template <typename T>
void combine(T* acc, const T* in, std::size_t count, ReduceOp op) {
  for (std::size_t i = 0; i < count; ++i) {
    switch (op) {
      case ReduceOp::kSum: acc[i] += in[i]; break;
      case ReduceOp::kMin: acc[i] = std::min(acc[i], in[i]); break;
      case ReduceOp::kMax: acc[i] = std::max(acc[i], in[i]); break;
    }
  }
}

void combine_bytes(void* acc, const void* in, std::size_t count, ElemType type, ReduceOp op) {
  switch (type) {
    case ElemType::kF32: combine(static_cast<float*>(acc), static_cast<const float*>(in), count, op); return;
    case ElemType::kF64: combine(static_cast<double*>(acc), static_cast<const double*>(in), count, op); return;
    case ElemType::kI64:
      combine(static_cast<std::int64_t*>(acc), static_cast<const std::int64_t*>(in), count, op);
      return;
  }
  throw Error("comm::Group: unknown element type " + std::to_string(static_cast<int>(type)));
}

}  // namespace

void Group::reduce(void* data, std::size_t count, ElemType type, ReduceOp op, int root, const Deadline& deadline) {
  const std::size_t bytes = count * elem_size(type);
  auto got = gather_at(root, kCollectiveTag, data, bytes, deadline);
  if (rank() != root) return;
  // In rank order from rank 0's values, so every rank count gives the same sum bit for bit as a
  // sequential loop over ranks (floating-point sums depend on the order).
  std::vector<std::byte> acc = got[0];
  if (acc.size() != bytes) throw Error(deadline.what + ": rank 0 sent " + std::to_string(acc.size()) + " bytes, not " + std::to_string(bytes));
  for (int r = 1; r < size(); ++r) {
    const auto& m = got[static_cast<std::size_t>(r)];
    if (m.size() != bytes)
      throw Error(deadline.what + ": rank " + std::to_string(r) + " sent " + std::to_string(m.size()) +
                  " bytes to a reduction of " + std::to_string(bytes));
    combine_bytes(acc.data(), m.data(), count, type, op);
  }
  if (bytes > 0) std::memcpy(data, acc.data(), bytes);
}

void Group::allreduce(void* data, std::size_t count, ElemType type, ReduceOp op, const Deadline& deadline) {
  const std::size_t bytes = count * elem_size(type);
  reduce(data, count, type, op, 0, deadline);
  broadcast(data, bytes, 0, deadline);
}

void Group::allgather(const void* mine, std::size_t bytes, void* all, const Deadline& deadline) {
  auto got = gather_at(0, kCollectiveTag, mine, bytes, deadline);
  const std::size_t total = bytes * static_cast<std::size_t>(size());
  if (rank() == 0) {
    auto* out = static_cast<std::byte*>(all);
    for (int r = 0; r < size(); ++r) {
      const auto& m = got[static_cast<std::size_t>(r)];
      if (m.size() != bytes)
        throw Error(deadline.what + ": rank " + std::to_string(r) + " sent " + std::to_string(m.size()) +
                    " bytes to an allgather of " + std::to_string(bytes));
      if (bytes > 0) std::memcpy(out + static_cast<std::size_t>(r) * bytes, m.data(), bytes);
    }
  }
  broadcast(all, total, 0, deadline);
}

std::vector<std::string> Group::allgather_strings(const std::string& mine, const Deadline& deadline) {
  auto got = gather_at(0, kCollectiveTag, mine.data(), mine.size(), deadline);
  // Packed as [u64 length][bytes] per rank, sent whole from rank 0.
  std::vector<std::byte> packed;
  if (rank() == 0) {
    for (const auto& m : got) {
      const std::uint64_t n = m.size();
      const auto* p = reinterpret_cast<const std::byte*>(&n);
      packed.insert(packed.end(), p, p + sizeof n);
      packed.insert(packed.end(), m.begin(), m.end());
    }
    scatter_same(0, packed.data(), packed.size(), deadline);
  } else {
    packed = recv(0, kCollectiveTag, deadline);
  }
  std::vector<std::string> out;
  std::size_t at = 0;
  for (int r = 0; r < size(); ++r) {
    std::uint64_t n = 0;
    if (packed.size() - at < sizeof n) throw Error(deadline.what + ": a short reply from rank 0");
    std::memcpy(&n, packed.data() + at, sizeof n);
    at += sizeof n;
    if (packed.size() - at < n) throw Error(deadline.what + ": a short reply from rank 0");
    out.emplace_back(reinterpret_cast<const char*>(packed.data() + at), static_cast<std::size_t>(n));
    at += static_cast<std::size_t>(n);
  }
  return out;
}

void Group::broadcast(void* data, std::size_t bytes, int root, const Deadline& deadline) {
  if (rank() == root) {
    scatter_same(root, data, bytes, deadline);
    return;
  }
  auto m = recv(root, kCollectiveTag, deadline);
  if (m.size() != bytes)
    throw Error(deadline.what + ": rank " + std::to_string(root) + " broadcast " + std::to_string(m.size()) +
                " bytes, not " + std::to_string(bytes));
  if (bytes > 0) std::memcpy(data, m.data(), bytes);  // (an empty message's data() may be null)
}

std::int64_t Group::allreduce(std::int64_t value, ReduceOp op, const Deadline& deadline) {
  allreduce(&value, 1, ElemType::kI64, op, deadline);
  return value;
}

double Group::allreduce(double value, ReduceOp op, const Deadline& deadline) {
  allreduce(&value, 1, ElemType::kF64, op, deadline);
  return value;
}

}  // namespace strata::comm
