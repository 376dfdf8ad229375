// Transport semantics for every transport of the tier (the test names end in the transport:
// Compiled/TransportTest.X/mpi, .../ucx under mpirun at 1..5 ranks; .../inproc on 1, 2, 3 and 5
// thread ranks in the inproc tier, tests/common/rank_test.h): region sizes, zero-byte and big
// regions, put/get, element-wise atomic accumulate from every rank at once (float, double, int64,
// across the UCX transport's lock stripes), fetch_add uniqueness and its atomicity with int64
// accumulate, indexed rows, put_notify and its read-back, and bounds errors raised locally (no
// collective hang). Values are pure functions of (rank, index), so every rank can check what it
// reads. The tcp transport's own cases (its listeners against strangers) are in
// tests/mpi/transport_test.cc.
//
// Between phases the ranks meet in a barrier that keeps the transport progressing: over transports
// that need the target's help (UCX over TCP, ctest's ucx_tcp variant) a plain barrier on the
// target would starve the operations aimed at it.
#define STRATA_INPROC_RANKS 1, 2, 3, 5
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <vector>

#include "common/rank_test.h"
#include "strata/comm/registry.h"
#include "strata/common/error.h"

namespace strata {
namespace {

using testing::TestComm;

float value_of(int rank, std::size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i % 977)); }

class TransportTest : public ::testing::TestWithParam<std::string> {};
STRATA_RANK_SUITE(Compiled, TransportTest, ::testing::ValuesIn(testing::tier_transports()),
                  [](const auto& info) { return info.param; });

// Collective barrier that keeps `t` progressing; bounded, so a lost operation fails the test.
void barrier(TestComm& comm, comm::Transport& t) {
  comm.group().barrier(comm::Deadline{60, "progressing barrier", [&t] { t.progress(); }});
}

STRATA_RANK_TEST_P(TransportTest, RegionSizesAreKnownEverywhere) {
  TestComm comm;
  auto t = comm::create_transport(GetParam(), comm.group());
  // Odd sizes, and rank 1 exposes nothing.
  const std::size_t mine = comm.rank() == 1 ? 0 : 4097 + 8 * comm.rank();
  auto region = t->allocate_region(mine);
  bool ok = region->local_bytes() == mine;
  for (int p = 0; p < comm.size(); ++p) ok = ok && region->bytes_of(p) == (p == 1 ? 0 : 4097 + 8u * p);
  STRATA_EXPECT_ALL(comm.get(), ok);
  // Zero-filled at allocation.
  const auto* bytes = static_cast<const unsigned char*>(region->local_base());
  STRATA_EXPECT_ALL(comm.get(), std::all_of(bytes, bytes + mine, [](unsigned char b) { return b == 0; }));
}

STRATA_RANK_TEST_P(TransportTest, PutToNeighbourAndGetFromEveryone) {
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  auto t = comm::create_transport(GetParam(), comm.group());
  const std::size_t count = 1000;
  auto region = t->allocate_region(2 * count * sizeof(float));
  auto* mine = static_cast<float*>(region->local_base());
  for (std::size_t i = 0; i < count; ++i) mine[i] = value_of(me, i);
  t->sync_local(*region);
  barrier(comm, *t);

  // Put my pattern into the second half of my right neighbour's region.
  std::vector<float> src(count);
  for (std::size_t i = 0; i < count; ++i) src[i] = value_of(me, i) + 0.5f;
  t->put(*region, (me + 1) % n, count * sizeof(float), src.data(), count * sizeof(float));
  t->flush_all(*region);

  // Get everyone's first half.
  bool ok = true;
  std::vector<float> got(count);
  for (int p = 0; p < n; ++p) {
    t->get(*region, p, 0, got.data(), count * sizeof(float));
    t->flush(*region, p);
    for (std::size_t i = 0; i < count; ++i) ok = ok && got[i] == value_of(p, i);
  }
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), ok);

  t->sync_local(*region);
  const int left = (me + n - 1) % n;
  bool put_ok = true;
  for (std::size_t i = 0; i < count; ++i) put_ok = put_ok && mine[count + i] == value_of(left, i) + 0.5f;
  STRATA_EXPECT_ALL(comm.get(), put_ok);
}

STRATA_RANK_TEST_P(TransportTest, ConcurrentAccumulatesSumExactly) {
  TestComm comm;
  const int n = comm.size();
  auto t = comm::create_transport(GetParam(), comm.group());
  const std::size_t count = 4099;  // odd, not a multiple of any vector width
  auto region = t->allocate_region(comm.rank() == 0 ? count * sizeof(float) : 0);
  // Every rank adds (rank + 1) * (i % 7) three times into rank 0's tensor, all at once.
  std::vector<float> src(count);
  for (std::size_t i = 0; i < count; ++i) src[i] = static_cast<float>((comm.rank() + 1) * static_cast<int>(i % 7));
  for (int rep = 0; rep < 3; ++rep) t->accumulate(*region, 0, 0, src.data(), count, comm::ElemType::kF32);
  t->flush(*region, 0);
  barrier(comm, *t);
  bool ok = true;
  if (comm.rank() == 0) {
    t->sync_local(*region);
    const auto* sum = static_cast<const float*>(region->local_base());
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < count; ++i) ok = ok && sum[i] == 3.0f * ranks_sum * static_cast<float>(i % 7);
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST_P(TransportTest, FetchAddHandsOutEveryTicketOnce) {
  TestComm comm;
  const int n = comm.size();
  auto t = comm::create_transport(GetParam(), comm.group());
  auto region = t->allocate_region(comm.rank() == n - 1 ? 16 : 0);
  const int per_rank = 50;
  std::vector<std::int64_t> tickets;
  for (int i = 0; i < per_rank; ++i) tickets.push_back(t->fetch_add(*region, n - 1, 8, 1));
  barrier(comm, *t);
  std::vector<std::int64_t> all(static_cast<std::size_t>(per_rank) * n);
  comm.group().allgather(tickets.data(), tickets.size() * sizeof(std::int64_t), all.data(),
                         comm::Deadline{60, "tickets"});
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> expected(all.size());
  std::iota(expected.begin(), expected.end(), 0);
  STRATA_EXPECT_ALL(comm.get(), all == expected);
  barrier(comm, *t);
  const std::int64_t total = t->atomic_read(*region, n - 1, 8);
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), total == static_cast<std::int64_t>(per_rank) * n);
}

STRATA_RANK_TEST_P(TransportTest, IndexedRowsGetAndAccumulate) {
  TestComm comm;
  const int n = comm.size();
  auto t = comm::create_transport(GetParam(), comm.group());
  const std::size_t rows = 257, width = 5;
  auto region = t->allocate_region(comm.rank() == 0 ? rows * width * sizeof(float) : 0);
  if (comm.rank() == 0) {
    auto* table = static_cast<float*>(region->local_base());
    for (std::size_t i = 0; i < rows * width; ++i) table[i] = value_of(0, i);
    t->sync_local(*region);
  }
  barrier(comm, *t);
  // Unsorted rows, the last row included.
  std::vector<std::int64_t> ids = {256, 3, 17 + comm.rank(), 0, 100};
  std::vector<float> got(ids.size() * width);
  t->get_rows(*region, 0, 0, width * sizeof(float), ids, got.data());
  t->flush(*region, 0);
  bool ok = true;
  for (std::size_t r = 0; r < ids.size(); ++r)
    for (std::size_t c = 0; c < width; ++c) ok = ok && got[r * width + c] == value_of(0, ids[r] * width + c);
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), ok);

  // Every rank adds 1.0 to rows {5, 250} at once.
  std::vector<std::int64_t> add_ids = {250, 5};
  std::vector<float> ones(add_ids.size() * width, 1.0f);
  t->accumulate_rows(*region, 0, 0, width, comm::ElemType::kF32, add_ids, ones.data());
  t->flush(*region, 0);
  barrier(comm, *t);
  bool sum_ok = true;
  if (comm.rank() == 0) {
    t->sync_local(*region);
    const auto* table = static_cast<const float*>(region->local_base());
    for (std::size_t row : {std::size_t{5}, std::size_t{250}})
      for (std::size_t c = 0; c < width; ++c)
        sum_ok = sum_ok && table[row * width + c] == value_of(0, row * width + c) + static_cast<float>(n);
    sum_ok = sum_ok && table[6 * width] == value_of(0, 6 * width);  // untouched row
  }
  STRATA_EXPECT_ALL(comm.get(), sum_ok);
}

STRATA_RANK_TEST_P(TransportTest, ZeroByteRegionsEverywhere) {
  TestComm comm;
  auto t = comm::create_transport(GetParam(), comm.group());
  auto region = t->allocate_region(0);
  bool ok = region->local_bytes() == 0;
  for (int p = 0; p < comm.size(); ++p) ok = ok && region->bytes_of(p) == 0;
  // Empty operations are fine, a single byte is outside.
  char byte = 0;
  const int peer = (comm.rank() + 1) % comm.size();
  t->get(*region, peer, 0, &byte, 0);
  t->put(*region, peer, 0, &byte, 0);
  t->accumulate(*region, peer, 0, &byte, 0, comm::ElemType::kF32);
  t->get_rows(*region, peer, 0, 16, {}, &byte);
  t->flush(*region, peer);
  t->flush_all(*region);
  std::string message;
  try {
    t->get(*region, peer, 0, &byte, 1);
  } catch (const Error& e) {
    message = e.message();
  }
  ok = ok && message.find("region of 0 bytes") != std::string::npos;
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), ok);
  // A second region after an empty one, and regions freed in reverse order.
  auto second = t->allocate_region(comm.rank() == 0 ? 8 : 0);
  if (comm.rank() != 0) t->fetch_add(*second, 0, 0, 1);
  barrier(comm, *t);
  const std::int64_t count = t->atomic_read(*second, 0, 0);
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), count == comm.size() - 1);
}

// Every rank adds into every rank's tensor at once (in a rotated order), in float, double and
// int64, over a range that spans several of the UCX transport's 256 KiB lock stripes and starts
// and ends off a stripe boundary.
template <typename T>
void accumulate_all_to_all(const std::string& transport, comm::ElemType type, std::size_t kib) {
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  auto t = comm::create_transport(transport, comm.group());
  const std::size_t count = (kib << 10) / sizeof(T) + 3;
  const std::size_t skip = 5;                                           // elements before the range
  auto region = t->allocate_region((count + skip) * sizeof(T));
  std::vector<T> src(count);
  for (std::size_t i = 0; i < count; ++i) src[i] = static_cast<T>((me + 1) * static_cast<int>(i % 11));
  const int reps = 2;
  for (int rep = 0; rep < reps; ++rep)
    for (int k = 0; k < n; ++k) t->accumulate(*region, (me + k) % n, skip * sizeof(T), src.data(), count, type);
  t->flush_all(*region);
  barrier(comm, *t);
  t->sync_local(*region);
  const auto* sum = static_cast<const T*>(region->local_base());
  const T ranks_sum = static_cast<T>(n * (n + 1) / 2);
  bool ok = true;
  for (std::size_t i = 0; i < skip; ++i) ok = ok && sum[i] == T(0);
  for (std::size_t i = 0; i < count; ++i)
    ok = ok && sum[skip + i] == static_cast<T>(reps) * ranks_sum * static_cast<T>(i % 11);
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST_P(TransportTest, AllToAllAccumulatesAcrossStripesSumExactlyFloat) {
  accumulate_all_to_all<float>(GetParam(), comm::ElemType::kF32, 700);
}
STRATA_RANK_TEST_P(TransportTest, AllToAllAccumulatesAcrossStripesSumExactlyDouble) {
  accumulate_all_to_all<double>(GetParam(), comm::ElemType::kF64, 700);
}
STRATA_RANK_TEST_P(TransportTest, AllToAllAccumulatesAcrossStripesSumExactlyInt64) {
  // int64 goes element by element through atomics on UCX: a smaller range keeps the test quick.
  accumulate_all_to_all<std::int64_t>(GetParam(), comm::ElemType::kI64, 40);
}

STRATA_RANK_TEST_P(TransportTest, FetchAddFromAllRanksIsAtomicWithInt64Accumulate) {
  TestComm comm;
  const int n = comm.size();
  auto t = comm::create_transport(GetParam(), comm.group());
  const int words = 16, rounds = 20;
  auto region = t->allocate_region(comm.rank() == 0 ? words * 8 : 0);
  // Interleave, on the same words: fetch_add(+1) and an int64 accumulate of +2 on all words.
  std::vector<std::int64_t> twos(words, 2);
  std::int64_t last_seen = -1;
  bool monotone = true;
  for (int r = 0; r < rounds; ++r) {
    for (int w = 0; w < words; ++w) {
      const std::int64_t before = t->fetch_add(*region, 0, 8ull * w, 1);
      if (w == 0) {
        monotone = monotone && before > last_seen;
        last_seen = before;
      }
    }
    t->accumulate(*region, 0, 0, twos.data(), words, comm::ElemType::kI64);
  }
  t->flush(*region, 0);
  barrier(comm, *t);
  bool ok = true;
  for (int w = 0; w < words; ++w) ok = ok && t->atomic_read(*region, 0, 8ull * w) == 3ll * rounds * n;
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), monotone);
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST_P(TransportTest, RowsStraddlingStripesGetAndAccumulate) {
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  auto t = comm::create_transport(GetParam(), comm.group());
  // 20-byte rows: row 13107 straddles the 256 KiB stripe boundary (262144 / 20 = 13107.2).
  const std::size_t rows = 40000, width = 5, row_bytes = width * sizeof(float);
  const int owner = n - 1;
  auto region = t->allocate_region(me == owner ? rows * row_bytes : 0);
  if (me == owner) {
    auto* table = static_cast<float*>(region->local_base());
    for (std::size_t i = 0; i < rows * width; ++i) table[i] = static_cast<float>(i % 1021);
    t->sync_local(*region);
  }
  barrier(comm, *t);
  // Sorted, unsorted, consecutive runs and the straddling rows; the same set on every rank.
  std::vector<std::int64_t> ids = {13107, 13106, 13108, 0, 1, 2, 39999, 26214, 26215, 500, 7};
  std::vector<float> got(ids.size() * width);
  t->get_rows(*region, owner, 0, row_bytes, ids, got.data());
  t->flush(*region, owner);
  bool ok = true;
  for (std::size_t r = 0; r < ids.size(); ++r)
    for (std::size_t c = 0; c < width; ++c)
      ok = ok && got[r * width + c] == static_cast<float>((ids[r] * width + c) % 1021);
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), ok);
  // Every rank adds (rank + 1) * (column + 1) into those rows, three times, all at once.
  std::vector<float> add(ids.size() * width);
  for (std::size_t r = 0; r < ids.size(); ++r)
    for (std::size_t c = 0; c < width; ++c) add[r * width + c] = static_cast<float>((me + 1) * (c + 1));
  for (int rep = 0; rep < 3; ++rep) t->accumulate_rows(*region, owner, 0, width, comm::ElemType::kF32, ids, add.data());
  t->flush(*region, owner);
  barrier(comm, *t);
  bool sum_ok = true;
  if (me == owner) {
    t->sync_local(*region);
    const auto* table = static_cast<const float*>(region->local_base());
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    std::vector<bool> touched(rows, false);
    for (auto id : ids) touched[id] = true;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < width; ++c) {
        const float base = static_cast<float>((r * width + c) % 1021);
        const float want = touched[r] ? base + 3.0f * ranks_sum * static_cast<float>(c + 1) : base;
        sum_ok = sum_ok && table[r * width + c] == want;
      }
  }
  STRATA_EXPECT_ALL(comm.get(), sum_ok);
}

STRATA_RANK_TEST_P(TransportTest, BigRegionPutAndGetWhole) {
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  auto t = comm::create_transport(GetParam(), comm.group());
  // 96 MiB on rank 0 only (several ranks on a small CI node), written by the last rank with one put.
  const std::size_t count = (std::size_t{96} << 20) / sizeof(std::uint32_t);
  auto region = t->allocate_region(me == 0 ? count * sizeof(std::uint32_t) : 0);
  auto pattern = [](std::size_t i) { return static_cast<std::uint32_t>(i * 2654435761u); };
  if (me == n - 1) {
    std::vector<std::uint32_t> src(count);
    for (std::size_t i = 0; i < count; ++i) src[i] = pattern(i);
    t->put(*region, 0, 0, src.data(), src.size() * sizeof(std::uint32_t));
    t->flush(*region, 0);
  }
  barrier(comm, *t);
  std::vector<std::uint32_t> got(count, 0);
  t->get(*region, 0, 0, got.data(), got.size() * sizeof(std::uint32_t));
  t->flush(*region, 0);
  bool ok = true;
  for (std::size_t i = 0; i < count; ++i) ok = ok && got[i] == pattern(i);
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// put_notify: every rank writes a payload of 3.5 pieces into its own area on rank 0, twice. The
// counter of each rank ends at 2 x 4 pieces, the bytes are the second payload, and the read-back
// of the counter (a get ordered after the put) already sees all 4 pieces of each put.
STRATA_RANK_TEST_P(TransportTest, PutNotifyCountsEveryPieceAndReadsBackAfterIt) {
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  auto t = comm::create_transport(GetParam(), comm.group());
  const std::size_t piece = 1000, bytes = 3500, area = 4096;  // area: counter word + payload
  auto region = t->allocate_region(me == 0 ? area * static_cast<std::size_t>(n) : 0);
  barrier(comm, *t);
  const std::uint64_t mine = area * static_cast<std::uint64_t>(me);
  std::vector<unsigned char> src(bytes);
  std::int64_t readback[2] = {-1, -1};
  for (int rep = 0; rep < 2; ++rep) {
    for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>((me * 31 + rep * 7 + i) & 0xff);
    t->put_notify(*region, 0, mine + 8, src.data(), bytes, piece, mine, &readback[rep], mine);
    t->flush(*region, 0);
  }
  const bool read_ok = readback[0] == 4 && readback[1] == 8;
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), read_ok);
  bool ok = true;
  if (me == 0) {
    t->sync_local(*region);
    const auto* base = static_cast<const unsigned char*>(region->local_base());
    for (int p = 0; p < n; ++p) {
      std::int64_t count = 0;
      std::memcpy(&count, base + area * p, 8);
      ok = ok && count == 8;
      for (std::size_t i = 0; i < bytes; ++i)
        ok = ok && base[area * p + 8 + i] == static_cast<unsigned char>((p * 31 + 7 + i) & 0xff);
    }
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// consume_notified: rank 0 takes the pieces of every rank's put_notify. A transport that serves
// remote writes from its own thread (tcp between nodes, STRATA_TCP_FORCE_REMOTE here) hands each
// piece of a remote rank to the handler, in order, instead of storing and counting it, and answers
// the read-back only after the last piece's handler returned; every other piece (own rank,
// co-located ranks, transports that never hand over) is stored and counted as usual. Each rank's
// pieces take exactly one of the two paths.
STRATA_RANK_TEST_P(TransportTest, ConsumedPiecesReachTheHandlerBeforeTheReadBack) {
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  auto t = comm::create_transport(GetParam(), comm.group());
  const std::size_t piece = 1024, bytes = 5000, area = 8192;  // counter, done word, payload
  auto region = t->allocate_region(me == 0 ? area * static_cast<std::size_t>(n) : 0);
  struct Seen {
    int rank;
    std::uint64_t offset;
    std::size_t bytes;
    bool data_ok;
  };
  std::mutex mu;
  std::vector<Seen> seen;
  bool handing_over = false;
  if (me == 0) {
    for (int p = 0; p < n; ++p) {
      const std::uint64_t at = area * static_cast<std::uint64_t>(p);
      handing_over = t->consume_notified(*region, at, [&, p, at](std::uint64_t offset, const void* data, std::size_t len) {
        const auto* d = static_cast<const unsigned char*>(data);
        const std::uint64_t first = offset - (at + 16);
        bool data_ok = true;
        for (std::size_t i = 0; i < len; ++i)
          data_ok = data_ok && d[i] == static_cast<unsigned char>((p * 13 + first + i) & 0xff);
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back({p, offset, len, data_ok});
        // The last piece marks the put done: the read-back must see this word.
        if (offset + len == at + 16 + bytes)
          __atomic_store_n(reinterpret_cast<std::int64_t*>(static_cast<char*>(region->local_base()) + at + 8), 1,
                           __ATOMIC_RELEASE);
      }) || handing_over;
    }
  }
  barrier(comm, *t);
  const std::uint64_t mine = area * static_cast<std::uint64_t>(me);
  std::vector<unsigned char> src(bytes);
  for (std::size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>((me * 13 + i) & 0xff);
  std::int64_t done_word = -1;
  t->put_notify(*region, 0, mine + 16, src.data(), bytes, piece, mine, &done_word, mine + 8);
  t->flush(*region, 0);
  std::int64_t handed = 0;  // did rank 0 hand this rank's pieces over? (known to rank 0 only)
  barrier(comm, *t);
  bool ok = true;
  if (me == 0) {
    t->sync_local(*region);
    const auto* base = static_cast<const unsigned char*>(region->local_base());
    for (int p = 0; p < n; ++p) {
      std::int64_t count = 0;
      std::memcpy(&count, base + area * p, 8);
      std::vector<Seen> mine_seen;
      for (const Seen& s : seen)
        if (s.rank == p) mine_seen.push_back(s);
      if (mine_seen.empty()) {  // stored and counted
        ok = ok && count == 5;
        for (std::size_t i = 0; i < bytes; ++i)
          ok = ok && base[area * p + 16 + i] == static_cast<unsigned char>((p * 13 + i) & 0xff);
      } else {  // handed over: 5 pieces in order, nothing stored, nothing counted
        ok = ok && handing_over && count == 0 && mine_seen.size() == 5;
        for (std::size_t k = 0; k < mine_seen.size(); ++k)
          ok = ok && mine_seen[k].data_ok && mine_seen[k].offset == area * p + 16 + k * piece &&
               mine_seen[k].bytes == std::min(piece, bytes - k * piece);
        ok = ok && std::all_of(base + area * p + 16, base + area * p + 16 + bytes, [](unsigned char b) { return b == 0; });
      }
      if (!mine_seen.empty()) ++handed;
    }
    // With every rank its own node, every other rank's pieces must have been handed over.
    if (GetParam() == "tcp" && std::getenv("STRATA_TCP_FORCE_REMOTE")) ok = ok && handed == n - 1;
    for (int p = 0; p < n; ++p) t->consume_notified(*region, area * static_cast<std::uint64_t>(p), nullptr);
  }
  // The read-back comes after the put took effect: the handler's done word, or (stored path) the
  // word no one wrote.
  std::vector<std::int64_t> words(static_cast<std::size_t>(n));
  comm.group().allgather(&done_word, sizeof done_word, words.data(), comm::Deadline{60, "read-back words"});
  if (me == 0)
    for (int p = 0; p < n; ++p) {
      bool was_handed = false;
      for (const Seen& s : seen) was_handed = was_handed || s.rank == p;
      ok = ok && words[static_cast<std::size_t>(p)] == (was_handed ? 1 : 0);
    }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// put_notify_get: every rank posts 160 requests of 128 KiB to rank 0 without a flush between them,
// each writing its area and reading the area back: 20 MiB of answers owed per rank, far beyond
// any socket buffer, so a client that waited to send while rank 0's server waited to send it an
// answer would hang here (tcp receives the answers while its sends wait). Every answer is the
// payload of its own request (the get follows the put's effects) and every read-back counts the
// pieces up to its own request.
STRATA_RANK_TEST_P(TransportTest, PutNotifyGetsInFlightBeyondSocketBuffersAnswerInOrder) {
  TestComm comm;
  const int n = comm.size(), me = comm.rank();
  auto t = comm::create_transport(GetParam(), comm.group());
  constexpr std::size_t kRequests = 160, kBytes = 128 << 10, kArea = 8 + kBytes;  // counter word + payload
  auto region = t->allocate_region(me == 0 ? kArea * static_cast<std::size_t>(n) : 0);
  barrier(comm, *t);
  const std::uint64_t mine = kArea * static_cast<std::uint64_t>(me);
  auto byte_of = [&](std::size_t k, std::size_t i) { return static_cast<unsigned char>((me * 41 + k * 7 + i * 3) & 0xff); };
  std::vector<unsigned char> src(kBytes), answers(kRequests * kBytes, 0);
  std::vector<std::int64_t> readback(kRequests, -1);
  for (std::size_t k = 0; k < kRequests; ++k) {
    for (std::size_t i = 0; i < kBytes; ++i) src[i] = byte_of(k, i);
    t->put_notify_get(*region, 0, mine + 8, src.data(), kBytes, kBytes, mine, &readback[k], mine, mine + 8,
                      answers.data() + k * kBytes, kBytes);
  }
  t->flush(*region, 0);
  bool ok = true;
  for (std::size_t k = 0; k < kRequests; ++k) {
    ok = ok && readback[k] == static_cast<std::int64_t>(k + 1);
    for (std::size_t i = 0; i < kBytes; ++i) ok = ok && answers[k * kBytes + i] == byte_of(k, i);
  }
  // Misuse is a local error: no read-back word, or a get outside the peer's region.
  std::int64_t word = 0;
  bool refused = false;
  try {
    t->put_notify_get(*region, 0, mine + 8, src.data(), 8, 8, mine, nullptr, mine, mine, answers.data(), 8);
  } catch (const Error&) {
    refused = true;
  }
  ok = ok && refused;
  refused = false;
  try {
    t->put_notify_get(*region, 0, mine + 8, src.data(), 8, 8, mine, &word, mine, kArea * static_cast<std::uint64_t>(n),
                      answers.data(), 8);
  } catch (const Error&) {
    refused = true;
  }
  ok = ok && refused;
  barrier(comm, *t);
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST_P(TransportTest, OutOfRangeIsALocalErrorNamingThePeer) {
  TestComm comm;
  auto t = comm::create_transport(GetParam(), comm.group());
  auto region = t->allocate_region(64);
  float buf[32];
  std::string message;
  try {
    t->get(*region, 0, 48, buf, 32);  // [48, 80) of a 64-byte region
  } catch (const Error& e) {
    message = e.message();
  }
  STRATA_EXPECT_ALL(comm.get(), message.find("outside rank 0's region of 64 bytes") != std::string::npos);
  std::string bad_peer;
  try {
    t->put(*region, comm.size(), 0, buf, 4);
  } catch (const Error& e) {
    bad_peer = e.message();
  }
  STRATA_EXPECT_ALL(comm.get(), bad_peer.find("is not a rank of the transport") != std::string::npos);
  barrier(comm, *t);
}

}  // namespace
}  // namespace strata
