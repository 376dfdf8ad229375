// Dynamic variables end to end under mpirun (1 PS + workers at 3 ranks, 2 PS at 4 or more), over
// every compiled transport (test names end in it; the tcp ones also run with every rank its own
// node): sync rounds bit-equal to one DynamicTable fed the same batches in worker order, async
// updates that lose nothing (exact per-row sums), batches split over several requests, every
// int64 id usable, malformed request words refused by the PS naming the writer, and the errors.
// The same cases run in the inproc tier on 3 and 4 thread ranks (tests/common/rank_test.h).
#define STRATA_INPROC_RANKS 3, 4
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/rank_test.h"
#include "ps/dynamic_table.h"
#include "ps/test_peer.h"
#include "strata/cluster/runtime.h"
#include "strata/comm/transport.h"
#include "strata/common/error.h"
#include "strata/ps/parameter_servers.h"

namespace strata::ps {
namespace {

using testing::TestComm;

struct Job {
  std::unique_ptr<Runtime> runtime;
  int num_ps = 1;
  int workers = 0;
};

Job start(TestComm& comm) {
  Job job;
  job.num_ps = comm.size() >= 4 ? 2 : 1;
  BootstrapOptions options;
  options.resolve.resolver = cluster::ResolverKind::kMpi;
  options.resolve.num_ps = job.num_ps;
  options.timeout_s = 30;
  job.runtime = testing::bootstrap_runtime(comm, Env(), options);
  job.workers = comm.size() - job.num_ps;
  return job;
}

DynamicVariableSpec dyn(const std::string& name, std::int64_t dim, std::int64_t max_ids,
                        Initializer init = Initializer::uniform(-0.5, 0.5, 11)) {
  DynamicVariableSpec s;
  s.name = name;
  s.dim = dim;
  s.max_ids = max_ids;
  s.init = init;
  return s;
}

// Whether ranks a and b of `comm` share a node. Collective.
bool same_host(TestComm& comm, int a, int b) {
  const std::vector<int> node_of = testing::node_of_every_rank(comm);
  return node_of[static_cast<std::size_t>(a)] == node_of[static_cast<std::size_t>(b)];
}

// Sums `values` over the group's ranks, the result on every rank.
void sum_all(TestComm& comm, std::vector<double>& values) {
  comm.group().allreduce(values.data(), values.size(), comm::ElemType::kF64, comm::ReduceOp::kSum,
                         comm::Deadline{60, "test sums"});
}
double sum_all(TestComm& comm, double value) {
  return comm.group().allreduce(value, comm::ReduceOp::kSum, comm::Deadline{60, "test sums"});
}

// A small pool of ids spread over the whole int64 range, extremes included.
std::vector<std::int64_t> id_pool(std::size_t n) {
  std::vector<std::int64_t> pool = {std::numeric_limits<std::int64_t>::min(), -1, 0,
                                    std::numeric_limits<std::int64_t>::max()};
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  while (pool.size() < n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    pool.push_back(static_cast<std::int64_t>(x ^ (x >> 29)));
  }
  return pool;
}

// Worker w's batch at step t: `n` draws from the pool (with repeats).
std::vector<std::int64_t> batch(const std::vector<std::int64_t>& pool, int w, int t, std::size_t n) {
  std::vector<std::int64_t> out(n);
  std::uint64_t x = 0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(w * 1000 + t + 1);
  for (auto& id : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = pool[(x >> 33) % pool.size()];
  }
  return out;
}

std::vector<float> grads_of(int w, int t, std::size_t n, std::int64_t dim) {
  std::vector<float> g(n * static_cast<std::size_t>(dim));
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(w) * 3 + static_cast<std::size_t>(t)) % 11) - 5) * 0.0625f +
           0.01f * static_cast<float>(w + 1);
  return g;
}

#define SKIP_WITHOUT_TWO_WORKERS(comm) \
  if ((comm).size() < 3) GTEST_SKIP() << "needs a PS and two workers"

// (transport, admit_after, capacity per PS; 0: the default, never reached)
class DynamicSync : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};
STRATA_RANK_SUITE(Compiled, DynamicSync,
                         ::testing::Combine(::testing::ValuesIn(testing::tier_transports()),
                                            ::testing::Values(0, 2), ::testing::Values(0, 200)),
                         [](const auto& info) {
                           return "admit" + std::to_string(std::get<1>(info.param)) + "_cap" +
                                  std::to_string(std::get<2>(info.param)) + "_" + std::get<0>(info.param);
                         });

// The reference: one DynamicTable per PS (capacity is per PS), each id in its PS's table.
struct ShardedReference {
  std::vector<std::unique_ptr<DynamicTable>> tables;
  ShardedReference(const DynamicTableConfig& config, int num_ps) {
    for (int p = 0; p < num_ps; ++p) tables.push_back(std::make_unique<DynamicTable>(config));
  }
  DynamicTable& of(std::int64_t id) { return *tables[static_cast<std::size_t>(shard_of(id, static_cast<int>(tables.size())))]; }
  // A client's lookup: each distinct id once, the rows scattered back in the batch's order.
  void lookup(const std::vector<std::int64_t>& ids, float* out, DynamicTable::LookupMode mode) {
    const auto dim = static_cast<std::size_t>(tables[0]->dim());
    std::set<std::int64_t> done;
    std::vector<float> row(dim);
    std::map<std::int64_t, std::vector<float>> rows;
    for (auto id : ids) {
      if (!done.insert(id).second) continue;
      of(id).lookup(&id, 1, row.data(), mode);
      rows[id] = row;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) std::memcpy(out + i * dim, rows[ids[i]].data(), 4 * dim);
  }
  // A worker's update: each PS gets its ids in the batch's order (duplicates summed by the table
  // in that order, as the client sums them).
  void apply(const std::vector<std::int64_t>& ids, const std::vector<float>& g, std::int64_t step) {
    const auto dim = static_cast<std::size_t>(tables[0]->dim());
    for (std::size_t p = 0; p < tables.size(); ++p) {
      std::vector<std::int64_t> mine;
      std::vector<float> mine_g;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (static_cast<std::size_t>(shard_of(ids[i], static_cast<int>(tables.size()))) != p) continue;
        mine.push_back(ids[i]);
        mine_g.insert(mine_g.end(), g.begin() + static_cast<std::ptrdiff_t>(i * dim),
                      g.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
      }
      tables[p]->apply(mine.data(), mine.size(), mine_g.data(), step);
    }
  }
  void end_round() {
    for (auto& t : tables) t->end_round();
  }
};

// Sync: every step each worker looks up its batch, then updates it; a PS applies a round's batches
// in worker order and then ends the round. The reference is one DynamicTable per PS (with rounds,
// as the PS's) fed, each step, every worker's lookup and then every worker's update in worker
// order: with rounds the order in which the workers' lookups reach a PS changes nothing, so every
// lookup and the final rows are bit-equal, admission and capacity eviction included. Batches of
// 300 draws over 12-id requests: split.
// The body of the sync tests: `steps` steps of `n` draws per worker over a pool of `pool_size`
// ids, requests of at most `max_ids` ids, the PS's table on `ps_threads` threads. With
// `want_split`, every PS must have split some of its table's batches over its threads. Step t
// (from 0) updates with step first_step + t.
void run_sync_case(const std::string& transport, int admit_after, int capacity, int ps_threads, std::int64_t max_ids,
                   std::size_t n, std::size_t pool_size, bool want_split, std::int64_t first_step = 1) {
  TestComm comm;
  Job job = start(comm);
  PsOptions options;
  options.transport = transport;
  options.optimizer = OptimizerConfig::parse("adagrad:lr=0.1");
  options.consistency = ConsistencyConfig::parse("sync");
  options.apply_threads = ps_threads;
  DynamicVariableSpec spec = dyn("user/emb", 5, max_ids);
  spec.admit_after = admit_after;
  if (capacity > 0) spec.capacity = capacity;
  auto ps = ParameterServers::materialize(*job.runtime, options, {}, {spec});
  // With a capacity: more ids than a round touches, so rows not updated lately are evicted.
  const std::vector<std::int64_t> pool = id_pool(pool_size);
  const int steps = 5;
  bool ok = true;
  std::string first_diff;
  if (ps.is_ps()) {
    ps.server->serve();
    if (want_split && ps.server->dynamic_stats("user/emb").split_batches == 0) {
      ok = false;
      first_diff = "no batch split over the PS's threads";
    }
  } else {
    DynamicTableConfig config;
    config.dim = spec.dim;
    config.init = spec.init;
    config.optimizer = options.optimizer;
    config.capacity = spec.capacity;
    config.admit_after = spec.admit_after;
    config.round_boundaries = true;
    ShardedReference ref(config, job.num_ps);
    const int me = ps.client->worker_index();
    for (int t = 0; t < steps; ++t) {
      std::vector<std::vector<float>> ref_rows(static_cast<std::size_t>(job.workers));
      for (int w = 0; w < job.workers; ++w) {
        const auto ids = batch(pool, w, t, n);
        ref_rows[static_cast<std::size_t>(w)].resize(n * 5);
        ref.lookup(ids, ref_rows[static_cast<std::size_t>(w)].data(), DynamicTable::LookupMode::kTrain);
      }
      const auto ids = batch(pool, me, t, n);
      std::vector<float> got(n * 5);
      ps.client->lookup_dynamic("user/emb", ids.data(), n, got.data());
      if (std::memcmp(got.data(), ref_rows[static_cast<std::size_t>(me)].data(), got.size() * 4) != 0) {
        ok = false;
        if (first_diff.empty()) first_diff = "lookup at step " + std::to_string(t);
      }
      for (int w = 0; w < job.workers; ++w) ref.apply(batch(pool, w, t, n), grads_of(w, t, n, 5), first_step + t);
      ref.end_round();
      const auto g = grads_of(me, t, n, 5);
      ps.client->update_dynamic("user/emb", ids.data(), n, g.data(), first_step + t);
    }
    // The final rows of every id of the pool (inference: nothing created).
    std::vector<float> got(pool.size() * 5), want(pool.size() * 5);
    ps.client->lookup_dynamic("user/emb", pool.data(), pool.size(), got.data(), DynamicLookup::kInference);
    ref.lookup(pool, want.data(), DynamicTable::LookupMode::kInference);
    if (std::memcmp(got.data(), want.data(), got.size() * 4) != 0) {
      ok = false;
      first_diff += " final rows";
    }
    // Something was trained: not every final row is its initial value or zeros.
    std::size_t nonzero = 0;
    for (float v : got) nonzero += v != 0.0f;
    ok = ok && nonzero > got.size() / 2;
    // With a capacity, rows were evicted and every PS holds at most its capacity plus what the
    // last round updated (rows updated in the current round are never evicted).
    if (capacity > 0) {
      std::int64_t evicted = 0;
      for (auto& table : ref.tables) evicted += table->stats().evicted_capacity;
      ok = ok && evicted > 0;
      if (evicted == 0) first_diff += " nothing evicted";
    }
    ps.client->done();
  }
  ps.endpoint().barrier();
  EXPECT_TRUE(ok) << first_diff;
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST_P(DynamicSync, MatchesOneTableBitForBit) {
  TestComm comm;
  SKIP_WITHOUT_TWO_WORKERS(comm);
  const int capacity = std::get<2>(GetParam());
  // With a capacity the steps cross 2^32 (and the tables' stamp base moves), which capacity
  // eviction, ordered by the rows' stamps, must survive bit for bit.
  run_sync_case(std::get<0>(GetParam()), std::get<1>(GetParam()), capacity, 1, 12, 300, capacity > 0 ? 600 : 160,
                false, capacity > 0 ? (std::int64_t{1} << 32) - 3 : 1);
}

// The same with requests large enough for the PS to split its table's lookups and updates over two
// threads (--ps-threads 2): still bit-equal to one table per PS on one thread.
STRATA_RANK_TEST_P(DynamicSync, SplitOverThePsThreadsMatchesOneTableBitForBit) {
  TestComm comm;
  SKIP_WITHOUT_TWO_WORKERS(comm);
  const int capacity = std::get<2>(GetParam());
  run_sync_case(std::get<0>(GetParam()), std::get<1>(GetParam()), capacity > 0 ? 7000 : 0, 2, 16384, 12000,
                capacity > 0 ? 26000 : 20000, true);
}


class DynamicTransport : public ::testing::TestWithParam<std::string> {};
STRATA_RANK_SUITE(Compiled, DynamicTransport, ::testing::ValuesIn(testing::tier_transports()),
                         [](const auto& info) { return info.param; });

// Async SGD with lr 1 on zero rows and gradients of 1: a row ends at minus the number of times it
// was listed in any worker's batch, exactly (small integers in float), if and only if no update
// was lost or doubled. Every worker draws its batches from the same pool, with repeats inside a
// batch, so both workers push the same ids concurrently (to 2 PS at 4 ranks). Each row's update
// count (DynamicTable's per-row counter, read from every PS's table) equals the number of batches
// that named its id, and the PS's table-wide update counters add up to the distinct ids of every
// batch.
STRATA_RANK_TEST_P(DynamicTransport, AsyncUpdatesAreNeverLost) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  Job job = start(comm);
  // The workers agree among themselves that all updates are in before reading (the PS ranks keep
  // serving meanwhile).
  const std::vector<int> workers = testing::worker_ranks(*job.runtime);
  PsOptions options;
  options.transport = GetParam();
  options.optimizer = OptimizerConfig::parse("sgd:lr=1");
  auto ps = ParameterServers::materialize(*job.runtime, options, {}, {dyn("item/emb", 3, 50, Initializer::zeros())});
  const std::vector<std::int64_t> pool = id_pool(200);
  const int steps = 40;
  const std::size_t n = 257;
  std::vector<double> count(pool.size(), 0.0);  // times each pool id was listed, this rank
  std::vector<double> named(pool.size(), 0.0);  // batches that named each pool id, this rank
  double distinct_updates = 0;                  // distinct ids per batch, summed, this rank
  std::map<std::int64_t, std::size_t> where;
  for (std::size_t i = 0; i < pool.size(); ++i) where[pool[i]] = i;
  std::vector<std::int64_t> listed;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    const int me = ps.client->worker_index();
    for (int t = 0; t < steps; ++t) {
      const auto ids = batch(pool, me + 100, t, n);
      std::vector<float> ones(n * 3, 1.0f);
      ps.client->update_dynamic("item/emb", ids.data(), n, ones.data(), t + 1);
      for (auto id : ids) count[where[id]] += 1;
      const std::set<std::int64_t> distinct(ids.begin(), ids.end());
      for (auto id : distinct) named[where[id]] += 1;
      distinct_updates += static_cast<double>(distinct.size());
    }
  }
  bool ok = true;
  if (ps.client) {
    count = testing::sum_among(comm.group(), workers, count, 60);
    std::vector<float> got(pool.size() * 3);
    ps.client->lookup_dynamic("item/emb", pool.data(), pool.size(), got.data(), DynamicLookup::kInference);
    for (std::size_t i = 0; i < pool.size(); ++i)
      for (int c = 0; c < 3; ++c) ok = ok && got[i * 3 + static_cast<std::size_t>(c)] == static_cast<float>(-count[i]);
    ps.client->done();
  }
  ps.endpoint().barrier();
  distinct_updates = sum_all(comm, distinct_updates);
  double updates = 0;
  if (ps.server) updates = static_cast<double>(ps.server->dynamic_stats("item/emb").updates);
  ps.endpoint().barrier();
  updates = sum_all(comm, updates);
  // Per-row update counts: every PS checks each of its rows against the batches that named the id
  // (summed over the workers), and the rows of all PS together are exactly the ids pushed.
  sum_all(comm, named);
  bool counts_ok = true;
  std::string first_bad;
  double rows_held = 0;
  if (ps.server) {
    const DynamicTableSnapshot snap = ParameterServersTestPeer::export_dynamic(*ps.server, "item/emb");
    counts_ok = snap.update_counts.size() == snap.ids.size();
    for (std::size_t i = 0; i < snap.ids.size() && counts_ok; ++i) {
      const auto at = where.find(snap.ids[i]);
      counts_ok = at != where.end() && static_cast<double>(snap.update_counts[i]) == named[at->second];
      if (!counts_ok)
        first_bad = "id " + std::to_string(snap.ids[i]) + ": count " + std::to_string(snap.update_counts[i]) +
                    ", expected " + (at == where.end() ? std::string("no row") : std::to_string(static_cast<long long>(named[at->second])));
    }
    rows_held = static_cast<double>(snap.ids.size());
  }
  rows_held = sum_all(comm, rows_held);
  const auto ids_pushed = static_cast<double>(std::count_if(named.begin(), named.end(), [](double c) { return c > 0; }));
  EXPECT_TRUE(counts_ok) << first_bad;
  EXPECT_EQ(rows_held, ids_pushed);
  STRATA_EXPECT_ALL(comm.get(), ok);
  STRATA_EXPECT_ALL(comm.get(), updates == distinct_updates);
  STRATA_EXPECT_ALL(comm.get(), counts_ok);
  STRATA_EXPECT_ALL(comm.get(), rows_held == ids_pushed);
}

// A lookup returns the rows in the caller's order, duplicates included, each row the initializer's
// for its id (row_seed), whichever PS holds it; ids of a batch larger than a request go in several.
// Calls of shrinking and growing sizes follow (the client reuses its grouping buffers across calls:
// nothing of an earlier batch may leak into a later one).
STRATA_RANK_TEST_P(DynamicTransport, LookupScattersRowsInCallerOrder) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  Job job = start(comm);
  PsOptions options;
  options.transport = GetParam();
  options.optimizer = OptimizerConfig::parse("adam:lr=0.01");
  const DynamicVariableSpec spec = dyn("q/emb", 16, 7);
  auto ps = ParameterServers::materialize(*job.runtime, options, {}, {spec});
  bool ok = true;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    const std::vector<std::int64_t> pool = id_pool(40);
    std::vector<std::int64_t> ids;
    for (int r = 0; r < 3; ++r)
      for (std::size_t i = 0; i < pool.size(); ++i) ids.push_back(pool[(i * 13 + static_cast<std::size_t>(r)) % pool.size()]);
    auto check = [&](const std::vector<std::int64_t>& batch) {
      std::vector<float> got(batch.size() * 16, -9.0f);
      ps.client->lookup_dynamic("q/emb", batch.data(), batch.size(), got.data());
      for (std::size_t i = 0; i < batch.size(); ++i) {
        std::vector<float> want(16);
        Initializer init = spec.init;
        init.seed = row_seed(spec.init.seed, batch[i]);
        fill(init, DType::kF32, {1, 16}, 0, 1, want.data());
        ok = ok && std::memcmp(want.data(), got.data() + i * 16, 64) == 0;
      }
    };
    check(ids);
    check({pool[5]});                               // one id
    check({pool[7], pool[7], pool[7], pool[3]});    // a few, repeated
    check(std::vector<std::int64_t>(ids.rbegin(), ids.rend()));  // the large batch again, reversed
    check({pool[39], pool[0]});
    ok = ok && ps.client->dynamic_dim("q/emb") == 16;
    ps.client->done();
  }
  ps.endpoint().barrier();
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// Misuse on the worker side is one Error naming the variable; nothing reaches the PS.
STRATA_RANK_TEST_P(DynamicTransport, BadCallsAreErrors) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  Job job = start(comm);
  PsOptions options;
  options.transport = GetParam();
  auto ps = ParameterServers::materialize(*job.runtime, options, {}, {dyn("e", 4, 8)});
  bool ok = true;
  if (ps.is_ps()) {
    ps.server->serve();
    ok = ps.server->dynamic_stats("e").requests == 0;
    try {
      ps.server->dynamic_stats("nope");
      ok = false;
    } catch (const Error& e) {
      ok = ok && std::string(e.what()).find("unknown dynamic variable 'nope'") != std::string::npos;
    }
  } else {
    auto expect_error = [&](const std::function<void()>& f, const std::string& want) {
      try {
        f();
        ok = false;
      } catch (const Error& e) {
        ok = ok && std::string(e.what()).find(want) != std::string::npos;
      }
    };
    std::int64_t id = 5;
    float g[4] = {1, 2, 3, 4};
    expect_error([&] { ps.client->lookup_dynamic("nope", &id, 1, g); }, "unknown dynamic variable 'nope'");
    expect_error([&] { ps.client->update_dynamic("e", &id, 1, g, 0); }, "update_dynamic 'e': step 0 is out of range");
    expect_error([&] { ps.client->update_dynamic("e", &id, 1, g, (std::int64_t{1} << 62) + 1); },
                 "update_dynamic 'e': step 4611686018427387905 is out of range [1, 2^62]");
    expect_error([&] { ps.client->update_dynamic("e", nullptr, 1, g, 1); }, "null ids or grads");
    expect_error([&] { ps.client->lookup_dynamic("e", &id, 1, nullptr); }, "null ids or out");
    ps.client->done();
  }
  ps.endpoint().barrier();
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// A malformed request (written raw, as a hostile worker would) makes the PS's serve() throw one
// Error naming the writer, the variable and the value, before it touches its table.
STRATA_RANK_TEST_P(DynamicTransport, MalformedRequestsAreRefused) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  using Peer = ParameterServersTestPeer;
  struct Case {
    std::vector<std::int64_t> header;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{9, 1, 0, 0}, "wrote an id count of 9 in its request 1 for dynamic variable 'e' to ps:0 (at most 8 ids per request)"},
      {{-1, 1, 0, 0}, "wrote an id count of -1 in its request 1"},
      {{1, 4, 0, 0}, "wrote a request kind of 4 in its request 1"},
      {{1, 3, 0, 1}, "wrote an update step of 0 in its request 1"},
      {{1, 3, (std::int64_t{1} << 62) + 1, 1}, "wrote an update step of 4611686018427387905 in its request 1 for dynamic "
                                               "variable 'e' to ps:0 (steps are in [1, 2^62])"},
      {{1, 3, 2, 7}, "wrote a last-of-batch flag of 7 in its request 1"},
      {{}, "rang its doorbell for dynamic variable 'e' on ps:0 to 2 after 0 of its requests were served"},
  };
  for (const Case& c : cases) {
    Job job = start(comm);
    PsOptions options;
    options.transport = GetParam();
    auto ps = ParameterServers::materialize(*job.runtime, options, {}, {dyn("e", 4, 8)});
    std::string error;
    bool untouched = true;
    if (ps.is_ps()) {
      try {
        ps.server->serve();
      } catch (const Error& e) {
        error = e.message();
      }
      if (job.num_ps == 1) untouched = ps.server->dynamic_stats("e").requests == 0 && ps.server->dynamic_stats("e").rows == 0;
    } else {
      if (ps.client->worker_index() == 0) {
        const Peer::DynamicWords words = Peer::dynamic_words(*ps.client, "e", 0);
        if (!c.header.empty()) {
          Peer::put(*ps.client, words.rank, words.request, c.header.data(), c.header.size() * 8);
          Peer::fetch_add(*ps.client, words.rank, words.doorbell, 1);
        } else {
          Peer::fetch_add(*ps.client, words.rank, words.doorbell, 2);
        }
      }
      ps.client->done();
    }
    ps.endpoint().barrier();
    const bool is_ps0 = ps.server && ps.server->ps_index() == 0;
    if (is_ps0) {
      EXPECT_NE(error.find(c.want), std::string::npos) << error;
    }
    STRATA_EXPECT_ALL(comm.get(), !is_ps0 || (error.find("worker:0 (rank ") == 0 && error.find(c.want) != std::string::npos));
    STRATA_EXPECT_ALL(comm.get(), untouched);
  }
}

// Between nodes over tcp a request is one put_notify that the PS serves on its transport's
// thread: a message shorter or longer than its header says is refused there, and serve() throws
// it naming the writer. (Elsewhere the message lands in the area and its length is not visible.)
STRATA_RANK_TEST_P(DynamicTransport, MessagesOfTheWrongLengthAreRefused) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  // ps:0 is rank 0 and worker:0 rank num_ps (the MPI resolver); they talk over the network when
  // every rank is its own node (STRATA_TCP_FORCE_REMOTE) or when they run on different hosts
  // (tests/cluster/dynamic_data_plane_test.sh places them so).
  const char* forced = std::getenv("STRATA_TCP_FORCE_REMOTE");
  const int worker0 = comm.size() >= 4 ? 2 : 1;
  const bool remote = (forced && std::string(forced) == "1") || !same_host(comm, 0, worker0);
  if (GetParam() != "tcp" || !remote)
    GTEST_SKIP() << "only the tcp transport between nodes hands requests over as messages";
  using Peer = ParameterServersTestPeer;
  struct Case {
    std::vector<std::int64_t> message;
    std::string want;
  };
  std::vector<std::int64_t> update = {2, 3, 5, 1, 0, 0, 0, 0, 11, 12};  // 2 ids, no gradient rows
  std::vector<std::int64_t> lookup = {1, 1, 0, 0, 0, 0, 0, 0};          // 1 id said, none sent
  const std::vector<Case> cases = {
      {lookup, "sent a request of 64 bytes for dynamic variable 'e' to ps:0 whose header says 1 ids (72 bytes)"},
      {update, "sent a request of 80 bytes for dynamic variable 'e' to ps:0 whose header says 2 ids (112 bytes)"},
  };
  for (const Case& c : cases) {
    Job job = start(comm);
    PsOptions options;
    options.transport = GetParam();
    auto ps = ParameterServers::materialize(*job.runtime, options, {}, {dyn("e", 4, 8)});
    std::string error;
    if (ps.is_ps()) {
      try {
        ps.server->serve();
      } catch (const Error& e) {
        error = e.message();
      }
    } else {
      if (ps.client->worker_index() == 0) {
        const Peer::DynamicWords words = Peer::dynamic_words(*ps.client, "e", 0);
        Peer::put_notify(*ps.client, words.rank, words.request, c.message.data(), c.message.size() * 8, words.doorbell);
      }
      ps.client->done();
    }
    ps.endpoint().barrier();
    const bool is_ps0 = ps.server && ps.server->ps_index() == 0;
    if (is_ps0) {
      EXPECT_NE(error.find(c.want), std::string::npos) << error;
    }
    STRATA_EXPECT_ALL(comm.get(), !is_ps0 || (error.find("worker:0 (rank ") == 0 && error.find(c.want) != std::string::npos));
  }
}


// Dynamic variable lists that differ between workers, or a bad spec, are one ConfigError on every
// rank before anything is allocated.
STRATA_RANK_TEST(DynamicVariables, MismatchAndBadSpecsAreConfigErrors) {
  TestComm comm;
  SKIP_WITHOUT_TWO_WORKERS(comm);
  auto expect_config_error = [&](const std::function<std::vector<DynamicVariableSpec>(int rank)>& specs_of,
                                 const std::vector<VariableSpec>& dense, const std::string& want) {
    Job job = start(comm);
    std::string error;
    try {
      auto ps = ParameterServers::materialize(*job.runtime, PsOptions(), dense, specs_of(comm.rank()));
    } catch (const ConfigError& e) {
      error = e.message();
    }
    EXPECT_NE(error.find(want), std::string::npos) << error;
    STRATA_EXPECT_ALL(comm.get(), error.find(want) != std::string::npos);
  };
  expect_config_error([&](int rank) { return std::vector<DynamicVariableSpec>{dyn("e", rank == comm.size() - 1 ? 8 : 4, 8)}; },
                      {}, "dynamic variables differ from worker 0");
  expect_config_error([&](int) { return std::vector<DynamicVariableSpec>{dyn("e", 0, 8)}; }, {},
                      "dynamic table: dim = 0");
  expect_config_error([&](int) { return std::vector<DynamicVariableSpec>{dyn("e", 4, 0)}; }, {},
                      "dynamic variable 'e': max_ids = 0 is out of range");
  expect_config_error([&](int) { return std::vector<DynamicVariableSpec>{dyn("e", 4, 8), dyn("e", 4, 8)}; }, {},
                      "dynamic variable 'e' is declared twice");
  VariableSpec dense;
  dense.name = "e";
  dense.shape = {4};
  expect_config_error([&](int) { return std::vector<DynamicVariableSpec>{dyn("e", 4, 8)}; }, {dense},
                      "dynamic variable 'e' has the name of a variable");
}

}  // namespace
}  // namespace strata::ps
