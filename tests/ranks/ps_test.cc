// Parameter servers end to end under mpirun (1 PS + workers, or 2 PS at 4+ ranks): exact sums of
// concurrent SGD pushes, sync-mode stateful optimizers bit-for-bit equal to a single-process
// reference, sparse pushes with repeated rows, partitioned pulls, the global step, the staleness
// bound, and the errors (creation-order mismatch, unknown variable, wrong sizes, bad rows, arena cap).
// The data-plane tests (PsTransport, SyncOptimizer) run over every compiled transport; their names
// end in it (.../mpi, .../ucx). The same cases run in the inproc tier on 2-5 thread ranks over the
// in-process transport (tests/common/rank_test.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/rank_test.h"
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

VariableSpec var(const std::string& name, Shape shape, Partitioner part = Partitioner::none(),
                 Initializer init = Initializer::zeros()) {
  VariableSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.init = init;
  s.partitioner = part;
  return s;
}

// Options of a sync job with `optimizer` over `transport` (the default transport when empty).
PsOptions sync_options(const std::string& optimizer, const std::string& transport = "") {
  PsOptions options;
  options.optimizer = OptimizerConfig::parse(optimizer);
  if (!transport.empty()) options.transport = transport;
  options.consistency = ConsistencyConfig::parse("sync");
  return options;
}

// Exact-in-float gradient of worker w at step t, element i.
float grad_of(int w, int t, std::size_t i) {
  return static_cast<float>((static_cast<int>(i % 5) - 2)) * 0.25f * static_cast<float>(w + 1) +
         static_cast<float>(t % 3) * 0.125f;
}

#define SKIP_WITHOUT_WORKERS(comm) \
  if ((comm).size() < 2) GTEST_SKIP() << "needs a PS and a worker"

class PsTransport : public ::testing::TestWithParam<std::string> {};
STRATA_RANK_SUITE(Compiled, PsTransport, ::testing::ValuesIn(testing::tier_transports()),
                  [](const auto& info) { return info.param; });

STRATA_RANK_TEST_P(PsTransport, ConcurrentSgdPushesSumExactly) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.transport = GetParam();
  options.optimizer = OptimizerConfig::parse("sgd:lr=0.5");
  std::vector<VariableSpec> specs = {var("dense/kernel", {64, 3}, Partitioner::fixed_shards(3)),
                                     var("dense/bias", {3})};
  auto ps = ParameterServers::materialize(*job.runtime, options, specs);
  const int K = 10;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    std::vector<float> g(64 * 3), b(3);
    for (int k = 0; k < K; ++k) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_of(ps.client->worker_index(), 0, i);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = grad_of(ps.client->worker_index(), 0, i);
      ps.client->push("dense/kernel", g.data(), g.size() * 4);
      ps.client->push("dense/bias", b.data(), b.size() * 4);
    }
    ps.client->done();
  }
  // Progressing barriers: over UCX on TCP a PS must keep answering while workers still pull.
  ps.endpoint().barrier();
  bool ok = true;
  if (!ps.is_ps()) {
    std::vector<float> got(64 * 3);
    ps.client->pull("dense/kernel", got.data(), got.size() * 4);
    for (std::size_t i = 0; i < got.size(); ++i) {
      float expected = 0;
      for (int w = 0; w < job.workers; ++w) expected += grad_of(w, 0, i);
      expected *= -0.5f * K;
      ok = ok && got[i] == expected;
    }
  }
  ps.endpoint().barrier();
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// Single-process reference: the same initial values, the mean of every worker's gradient (summed
// in worker order, divided by the worker count), one optimizer step per round.
std::vector<float> reference(const OptimizerConfig& config, const Initializer& init, const Shape& shape, int workers,
                             int steps) {
  const std::size_t n = static_cast<std::size_t>(num_elements(shape));
  std::vector<float> values(n);
  fill(init, DType::kF32, shape, 0, shape[0], values.data());
  const int nslots = num_slots(config.kind);
  std::vector<std::vector<float>> slots(nslots, std::vector<float>(n));
  std::vector<float*> slot_ptrs;
  for (int k = 0; k < nslots; ++k) {
    std::fill(slots[k].begin(), slots[k].end(), static_cast<float>(slot_initial_value(config, k)));
    slot_ptrs.push_back(slots[k].data());
  }
  for (int t = 0; t < steps; ++t) {
    std::vector<float> mean(n, 0.0f);
    for (int w = 0; w < workers; ++w)
      for (std::size_t i = 0; i < n; ++i) mean[i] += grad_of(w, t, i);
    for (auto& x : mean) x /= static_cast<float>(workers);
    apply_dense(config, t + 1, values.data(), slot_ptrs.data(), mean.data(), n);
  }
  return values;
}

// (optimizer, transport)
class SyncOptimizer : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};
STRATA_RANK_SUITE(Optimizers, SyncOptimizer,
                  ::testing::Combine(::testing::Values("sgd:lr=0.5", "momentum:lr=0.1,momentum=0.9", "adagrad:lr=0.1",
                                                       "adam:lr=0.01", "rmsprop:lr=0.01", "ftrl:lr=0.1,l1=0.001"),
                                     ::testing::ValuesIn(testing::tier_transports())),
                  [](const auto& info) {
                    const std::string& opt = std::get<0>(info.param);
                    return opt.substr(0, opt.find(':')) + "_" + std::get<1>(info.param);
                  });

STRATA_RANK_TEST_P(SyncOptimizer, MatchesSingleProcessReferenceBitForBit) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  const PsOptions options = sync_options(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const Shape shape = {10, 7};
  const Initializer init = Initializer::uniform(-1.0, 1.0, 42);
  // Partitioned over 2 shards: each shard's optimizer step count must follow the rounds.
  auto ps = ParameterServers::materialize(*job.runtime, options, {var("w", shape, Partitioner::fixed_shards(2), init)});
  const int steps = 6;
  bool ok = true;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    std::vector<float> g(70), got(70);
    for (int t = 0; t < steps; ++t) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_of(ps.client->worker_index(), t, i);
      ps.client->push("w", g.data(), g.size() * 4);
      // The next pull waits until this worker's sync rounds are applied: everyone sees the same values.
    }
    ps.client->pull("w", got.data(), got.size() * 4);
    std::vector<float> want = reference(options.optimizer, init, shape, job.workers, steps);
    ok = std::memcmp(got.data(), want.data(), got.size() * 4) == 0;
    ps.client->done();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}


// Sync pulls in place (PsClient::PullTarget::in_place): a variable held in one shard by a PS on
// this node is read where the PS keeps it, with the bits a copy would give (and the
// single-process reference's) after every round; a partitioned variable and every async pull are
// copied. Which transports give a view: mpi's shared windows and tcp's co-located peers; tcp's
// network path (STRATA_TCP_FORCE_REMOTE) and ucx give none.
class PullInPlace : public ::testing::TestWithParam<std::string> {};
STRATA_RANK_SUITE(Transports, PullInPlace, ::testing::ValuesIn(testing::tier_transports()),
                  [](const auto& info) { return info.param; });

STRATA_RANK_TEST_P(PullInPlace, SyncReadsOneShardVariablesWhereThePsKeepsThem) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  const std::string transport = GetParam();
  const char* remote = std::getenv("STRATA_TCP_FORCE_REMOTE");
  const char* shared = std::getenv("STRATA_MPI_SHARED");
  // Views need the PS on this rank's node: required only when every rank shares one node (not
  // between emulated nodes, where a worker on the PS's node may still get one).
  const std::vector<int> nodes = testing::node_of_every_rank(comm);
  const bool one_node = std::count(nodes.begin(), nodes.end(), nodes[0]) == comm.size();
  const bool views_expected = one_node && ((transport == "mpi" && !(shared && std::string(shared) == "0")) ||
                                           (transport == "tcp" && !(remote && std::string(remote) == "1")));
  const bool views_allowed = views_expected || !one_node;
  for (const char* mode : {"sync", "async"}) {
    Job job = start(comm);
    PsOptions options;
    options.optimizer = OptimizerConfig::parse("adam:lr=0.01");
    options.transport = transport;
    options.consistency = ConsistencyConfig::parse(mode);
    const Shape shape = {10, 7};
    const Initializer init = Initializer::uniform(-1.0, 1.0, 42);
    auto ps = ParameterServers::materialize(
        *job.runtime, options,
        {var("whole", shape, Partitioner::none(), init), var("split", shape, Partitioner::fixed_shards(2), init)});
    const bool sync = std::string(mode) == "sync";
    bool ok = true;
    std::string why;
    if (ps.is_ps()) {
      ps.server->serve();
    } else {
      const int steps = 4;
      std::vector<float> g(70), whole(70, -7.0f), split(70), copy(70);
      for (int t = 0; t < steps; ++t) {
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_of(ps.client->worker_index(), t, i);
        ps.client->push("whole", g.data(), g.size() * 4);
        ps.client->push("split", g.data(), g.size() * 4);
        const void* whole_view = reinterpret_cast<const void*>(1);
        const void* split_view = reinterpret_cast<const void*>(1);
        ps.client->pull_many({{"whole", whole.data(), 280, &whole_view}, {"split", split.data(), 280, &split_view}});
        ps.client->pull("whole", copy.data(), 280);
        const bool want_view = sync && views_expected;
        const bool view_ok = whole_view != nullptr ? sync && views_allowed : !want_view;
        if (!view_ok) {
          ok = false;
          why += std::string(mode) + " step " + std::to_string(t) + ": in-place view " +
                 (whole_view ? "given" : "not given") + "; ";
        }
        if (split_view != nullptr) {
          ok = false;
          why += "a partitioned variable was given a view; ";
        }
        const float* got = whole_view ? static_cast<const float*>(whole_view) : whole.data();
        // (Under async another worker's push may land between the two pulls: values not compared.)
        if (sync && (std::memcmp(got, copy.data(), 280) != 0 || std::memcmp(split.data(), copy.data(), 280) != 0)) {
          ok = false;
          why += std::string(mode) + " step " + std::to_string(t) + ": in-place or pulled values differ from a copy; ";
        }
        if (whole_view && whole[0] != -7.0f) {
          ok = false;
          why += "the destination of an in-place pull was written; ";
        }
      }
      if (sync) {
        const std::vector<float> want = reference(options.optimizer, init, shape, job.workers, steps);
        if (std::memcmp(copy.data(), want.data(), 280) != 0) {
          ok = false;
          why += "sync values differ from the single-process reference; ";
        }
      }
      ps.client->done();
    }
    EXPECT_TRUE(ok) << why;
    STRATA_EXPECT_ALL(comm.get(), ok);
  }
}


// --ps-threads: a sync round's shard large enough to be split over the PS's apply team (2 x 2^15
// elements and more: the mean of the workers' gradients and the update, fused, apply_mean_team)
// gets exactly the bits of the single-threaded reference.
STRATA_RANK_TEST(ParameterServers, ApplyThreadsGiveTheSameBits) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.optimizer = OptimizerConfig::parse("adam:lr=0.01");
  options.consistency = ConsistencyConfig::parse("sync");
  options.apply_threads = 3;
  const Shape shape = {512, 161};  // 82,432 elements: 2 parts of the team, not on a 1,024 boundary
  const Initializer init = Initializer::uniform(-1.0, 1.0, 7);
  auto ps = ParameterServers::materialize(*job.runtime, options, {var("big", shape, Partitioner::none(), init)});
  const int steps = 3;
  bool ok = true;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    const std::size_t n = static_cast<std::size_t>(num_elements(shape));
    std::vector<float> g(n), got(n);
    for (int t = 0; t < steps; ++t) {
      for (std::size_t i = 0; i < n; ++i) g[i] = grad_of(ps.client->worker_index(), t, i);
      ps.client->push("big", g.data(), n * 4);
    }
    ps.client->pull("big", got.data(), n * 4);
    std::vector<float> want = reference(options.optimizer, init, shape, job.workers, steps);
    ok = std::memcmp(got.data(), want.data(), n * 4) == 0;
    // The team did split every round (a lost split would pass the bit check alone); the
    // variable lives on one of the PS ranks.
    ps.client->wait_applied();
    std::int64_t split = 0, most = 0;
    for (const auto& st : ps.client->ps_stats()) {
      split += st.split_updates;
      most = std::max(most, st.max_threads);
    }
    ok = ok && split == steps && most == 2;
    ps.client->done();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST(ParameterServers, AsyncStatefulOptimizerAppliesEveryPush) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.optimizer = OptimizerConfig::parse("adagrad:lr=0.1");
  auto ps = ParameterServers::materialize(*job.runtime, options, {var("v", {5, 2}, Partitioner::fixed_shards(2))});
  const int K = 15;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    std::vector<float> g(10, 1.0f);
    for (int k = 0; k < K; ++k) ps.client->push("v", g.data(), g.size() * 4);
    ps.client->done();
  }
  const std::int64_t applied = ps.server ? ps.server->applied_updates() : 0;
  const std::int64_t total = comm.group().allreduce(applied, comm::ReduceOp::kSum, comm::Deadline{60, "applied updates"});
  // Every worker's K pushes reached both shards.
  STRATA_EXPECT_ALL(comm.get(), total == static_cast<std::int64_t>(job.workers) * K * 2);
}

// Async stateful pushes of a shard of 512 KiB or more are streamed in 256 KiB chunks that the PS
// applies as they arrive (arena_layout.cc decides which shards stream, ps_server.cc applies
// them), from the inbox in its service loop or, where the transport hands chunks over (tcp
// between nodes), on the transport's thread: the result
// must be the bits of applying each whole gradient in order, including the last, shorter chunk,
// with an apply team present (a chunk is below its split size, so one thread applies each), and the
// optimizer step shared by every chunk of a push. Only worker 0 pushes, so the order is defined.
STRATA_RANK_TEST_P(PsTransport, StreamedPushesMatchTheReferenceBitForBit) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.optimizer = OptimizerConfig::parse("adam:lr=0.01");
  options.transport = GetParam();
  options.apply_threads = 2;
  const Shape shape = {1000, 700};  // 2.8 MB: 10 chunks of 65536 floats and one of 44640
  const Initializer init = Initializer::uniform(-1.0, 1.0, 11);
  auto ps = ParameterServers::materialize(*job.runtime, options, {var("big", shape, Partitioner::none(), init)});
  const int steps = 4;
  bool ok = true;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    if (ps.client->worker_index() == 0) {
      const std::size_t n = static_cast<std::size_t>(num_elements(shape));
      std::vector<float> g(n), got(n);
      for (int t = 0; t < steps; ++t) {
        for (std::size_t i = 0; i < n; ++i) g[i] = grad_of(0, t, i);
        ps.client->push("big", g.data(), n * 4);
      }
      ps.client->wait_applied();
      ps.client->pull("big", got.data(), n * 4);
      std::vector<float> want = reference(options.optimizer, init, shape, 1, steps);
      ok = std::memcmp(got.data(), want.data(), n * 4) == 0;
      std::int64_t updates = 0;
      for (const auto& st : ps.client->ps_stats()) updates += st.updates;
      ok = ok && updates == steps;
    }
    ps.client->done();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// Every worker streams pushes into the same shard at once (2 PS: the shard is split, so each PS
// takes chunks from every worker). Momentum 0 with lr 1 makes each update var -= g exactly for
// integer gradients, so the result is the same whatever the interleaving, as long as each chunk is
// applied exactly once and no two applications of an element overlap (the service loop and the
// transport's thread share the optimizer state under one lock).
STRATA_RANK_TEST_P(PsTransport, ConcurrentStreamedPushesEachApplyOnce) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.optimizer = OptimizerConfig::parse("momentum:lr=1,momentum=0");
  options.transport = GetParam();
  const Shape shape = {600, 1000};  // 2.4 MB, split over the PS ranks: each part is streamed
  const std::size_t n = static_cast<std::size_t>(num_elements(shape));
  auto ps = ParameterServers::materialize(*job.runtime, options,
                                          {var("w", shape, Partitioner::fixed_shards(2), Initializer::constant(0.0))});
  const int steps = 5;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    std::vector<float> g(n);
    const int w = ps.client->worker_index();
    for (int t = 0; t < steps; ++t) {
      for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((w + 1) * (t + 1) + static_cast<int>(i % 5));
      ps.client->push("w", g.data(), n * 4);
    }
    ps.client->wait_applied();
  }
  // Read while the PS still serves (UCX over TCP needs its progress for a large get).
  bool ok = true;
  if (!ps.is_ps()) {
    // every worker's pushes are applied
    testing::barrier_among(comm.group(), testing::worker_ranks(*job.runtime), 60);
    std::vector<float> got(n);
    ps.client->pull("w", got.data(), n * 4);
    const int workers = ps.endpoint().num_workers();
    const int sum_w = workers * (workers + 1) / 2, sum_t = steps * (steps + 1) / 2;
    for (std::size_t i = 0; i < n; ++i)
      ok = ok && got[i] == -static_cast<float>(sum_w * sum_t + workers * steps * static_cast<int>(i % 5));
    std::int64_t updates = 0;
    for (const auto& st : ps.client->ps_stats()) updates += st.updates;
    // Each push is one update on every PS holding a part of the shard.
    ok = ok && updates == static_cast<std::int64_t>(workers) * steps * static_cast<std::int64_t>(ps.endpoint().shard_map().shards().size());
    ps.client->done();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST_P(PsTransport, SparseRowsWithRepeatsAndPartitionedPulls) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.transport = GetParam();
  options.optimizer = OptimizerConfig::parse("sgd:lr=0.5");
  auto ps = ParameterServers::materialize(*job.runtime, options,
                                          {var("embedding", {100, 4}, Partitioner::fixed_shards(3))});
  // Distinct values that stay exact under the updates below.
  std::vector<float> initial(400);
  for (std::size_t i = 0; i < initial.size(); ++i) initial[i] = static_cast<float>(i);
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    if (ps.client->worker_index() == 0) ps.client->assign("embedding", initial.data(), initial.size() * 4);
    testing::barrier_among(comm.group(), testing::worker_ranks(*job.runtime), 60);
    const std::vector<std::int64_t> rows = {5, 99, 5, 0, 50, 33, 34};  // 33|34 straddle shards 0|1
    std::vector<float> g(rows.size() * 4, 1.0f);
    ps.client->push_rows("embedding", rows, g.data(), g.size() * 4);
    ps.client->done();
  }
  ps.endpoint().barrier();
  bool ok = true;
  if (!ps.is_ps()) {
    std::vector<float> dense(400);
    ps.client->pull("embedding", dense.data(), dense.size() * 4);
    const float w = static_cast<float>(job.workers);
    for (int r = 0; r < 100; ++r) {
      float times = (r == 5) ? 2 : (r == 99 || r == 0 || r == 50 || r == 33 || r == 34) ? 1 : 0;
      for (int c = 0; c < 4; ++c) ok = ok && dense[r * 4 + c] == initial[r * 4 + c] - 0.5f * times * w;
    }
    // Rows in any order, with duplicates, agree with the dense pull.
    std::vector<std::int64_t> ask = {99, 0, 34, 33, 34, 66, 67};
    std::vector<float> rows(ask.size() * 4);
    ps.client->pull_rows("embedding", ask, rows.data(), rows.size() * 4);
    for (std::size_t i = 0; i < ask.size(); ++i)
      ok = ok && std::memcmp(&rows[i * 4], &dense[ask[i] * 4], 16) == 0;
  }
  ps.endpoint().barrier();
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST_P(PsTransport, GlobalStepCountsEveryIncrement) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.transport = GetParam();
  auto ps = ParameterServers::materialize(*job.runtime, options, {var("x", {1})});
  const int K = 25;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    for (int k = 0; k < K; ++k) ps.client->increment_global_step();
    ps.client->done();
  }
  ps.endpoint().barrier();
  const bool ok = ps.is_ps() || ps.client->global_step() == static_cast<std::int64_t>(job.workers) * K;
  ps.endpoint().barrier();
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// Wake words (src/ps/wake_word.h): where a PS's arena is in memory this node shares (mpi's shared
// windows when the whole job is on one node, tcp's co-located peers), a sync worker that waits
// for a round sleeps on its word and the PS's ring ends the sleep, and the PS, idle, sleeps on its
// own word until a co-located worker's push rings it. Worker 0 pushes 5 ms late every step, so
// the other workers wait for every round and the PS for every push of worker 0. Where no word is
// mapped (tcp's network path, ucx, peers on other nodes) nobody sleeps on one. What each rank
// expects follows from the job's layout over nodes (the cluster tier runs this across nodes).
STRATA_RANK_TEST_P(PsTransport, CoLocatedWaitsEndWhenTheWriterRings) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  const PsOptions options = sync_options("adam:lr=0.01", GetParam());
  // Two shards: with 2 PS each serves one, so each waits for worker 0's pushes.
  auto ps = ParameterServers::materialize(*job.runtime, options, {var("w", {64, 2}, Partitioner::fixed_shards(2))});
  const int steps = 12;
  // Every rank's node (the world rank of its node's first rank) and role (-1: PS, else its worker index).
  const int n = comm.size();
  const std::vector<int> node_of = testing::node_of_every_rank(comm);
  const int node_size = static_cast<int>(std::count(node_of.begin(), node_of.end(), node_of[static_cast<std::size_t>(comm.rank())]));
  std::vector<int> role_of(static_cast<std::size_t>(n));
  const int role = ps.is_ps() ? -1 : ps.client->worker_index();
  comm.group().allgather(&role, sizeof role, role_of.data(), comm::Deadline{60, "roles"});
  const bool one_node = node_size == n;
  // In-process ranks share every word; mpi's shared windows on one node; tcp's co-located peers.
  const bool words = GetParam() == "inproc" ? true
                     : GetParam() == "mpi"  ? one_node
                                            : GetParam() == "tcp" && std::getenv("STRATA_TCP_FORCE_REMOTE") == nullptr;
  const int me = comm.rank();
  bool any_ps_here = false, every_ps_here = true;
  int worker0 = -1;
  for (int r = 0; r < n; ++r) {
    const bool here = node_of[static_cast<std::size_t>(r)] == node_of[static_cast<std::size_t>(me)];
    if (role_of[static_cast<std::size_t>(r)] == -1) {
      any_ps_here |= here;
      every_ps_here &= here;
    }
    if (role_of[static_cast<std::size_t>(r)] == 0) worker0 = r;
  }
  const bool worker0_here = node_of[static_cast<std::size_t>(worker0)] == node_of[static_cast<std::size_t>(me)];
  // A PS maps its own word when some peer shares its node; a worker its words on the PS ranks of its node.
  const bool expect_mapped = words && (ps.is_ps() ? node_size > 1 : any_ps_here);
  // Rung every step: a PS by worker 0 on its node, a worker other than 0 by every PS on its node.
  const bool expect_rings = words && (ps.is_ps() ? worker0_here : role != 0 && every_ps_here);

  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    std::vector<float> g(128, 0.5f), got(128);
    for (int t = 0; t < steps; ++t) {
      if (ps.client->worker_index() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ps.client->push("w", g.data(), g.size() * 4);
      ps.client->pull("w", got.data(), got.size() * 4);
    }
    ps.client->done();
  }
  const auto counts = ParameterServersTestPeer::wake_counts(ps.is_ps() ? static_cast<PsEndpoint&>(*ps.server)
                                                                       : static_cast<PsEndpoint&>(*ps.client));
  bool ok = true;
  std::string why;
  if (counts.mapped != expect_mapped) {
    ok = false;
    why = "wake word mapped: " + std::to_string(counts.mapped) + ", expected " + std::to_string(expect_mapped);
  } else if (!counts.mapped && counts.sleeps != 0) {
    ok = false;
    why = std::to_string(counts.sleeps) + " sleeps on an unmapped word";
  } else if (expect_rings && counts.rung < steps / 2) {
    ok = false;
    why = "only " + std::to_string(counts.rung) + " of " + std::to_string(counts.sleeps) + " sleeps ended by a ring";
  }
  EXPECT_TRUE(ok) << "rank " << me << ": " << why;
  STRATA_EXPECT_ALL(comm.get(), ok);
}


STRATA_RANK_TEST(ParameterServers, StalenessBoundIsNeverExceeded) {
  TestComm comm;
  if (comm.size() < 3) GTEST_SKIP() << "needs 2 workers";
  Job job = start(comm);
  PsOptions options;
  options.consistency = ConsistencyConfig::parse("staleness:1");
  options.timeout_s = 60;
  auto ps = ParameterServers::materialize(*job.runtime, options, {var("x", {4})});
  std::int64_t observed = 0, worst = 0;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    std::vector<float> g(4, 1.0f);
    for (int step = 0; step < 30; ++step) {
      // Worker 0 is slow: the others would run ahead without the bound.
      if (ps.client->worker_index() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      ps.client->push("x", g.data(), 16);
      const std::int64_t clock = ps.client->end_step();
      // Checked independently of end_step's own (cached, sampled) reads, after every step.
      worst = std::max(worst, clock - ps.client->slowest_clock());
    }
    observed = ps.client->max_observed_staleness();
    ps.client->done();
  }
  STRATA_EXPECT_ALL(comm.get(), observed <= 1 && worst <= 1);
  // The slow worker held the others back at the bound at least once (the test can fail).
  const std::int64_t job_worst = comm.group().allreduce(worst, comm::ReduceOp::kMax, comm::Deadline{60, "staleness"});
  EXPECT_EQ(job_worst, 1);
}

STRATA_RANK_TEST(ParameterServers, PlacementIsIdenticalOnEveryRank) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  std::vector<VariableSpec> specs = {var("a", {30, 4}, Partitioner::fixed_shards(4)), var("b", {7}),
                                     var("c", {1000, 8}, Partitioner::max_shard_bytes(8192)), var("d", {2, 2})};
  auto ps = ParameterServers::materialize(*job.runtime, PsOptions{}, specs);
  // Every rank (PS ranks included, which never saw `specs`) must hold the same shard -> PS map.
  std::string mine;
  for (const auto& sh : ps.endpoint().shard_map().shards())
    mine += sh.name + "@" + std::to_string(sh.ps) + "[" + std::to_string(sh.row_begin) + "," +
            std::to_string(sh.row_end) + ");";
  auto all = comm.group().allgather_strings(mine, comm::Deadline{30, "placement test"});
  bool same = true;
  for (const auto& other : all) same = same && other == all[0];
  STRATA_EXPECT_ALL(comm.get(), same);
  STRATA_EXPECT_ALL(comm.get(), mine.find("a/part_3@") != std::string::npos);
  if (ps.is_ps())
    ps.server->serve();
  else
    ps.client->done();
}

STRATA_RANK_TEST(ParameterServers, DifferentCreationOrderOnOneWorkerIsNamed) {
  TestComm comm;
  if (comm.size() < 3) GTEST_SKIP() << "needs 2 workers";
  Job job = start(comm);
  std::vector<VariableSpec> specs = {var("a", {3}), var("b", {4, 2}), var("c", {5})};
  const bool odd = comm.rank() == comm.size() - 1;
  if (odd) std::swap(specs[1], specs[2]);  // a dict iterated in another order
  std::string error;
  try {
    auto ps = ParameterServers::materialize(*job.runtime, PsOptions{}, specs);
  } catch (const ConfigError& e) {
    error = e.message();
  }
  const std::string who = "worker " + std::to_string(job.workers - 1) + " (rank " + std::to_string(comm.size() - 1) + ")";
  STRATA_EXPECT_ALL(comm.get(), error.find("variable creation differs") != std::string::npos);
  STRATA_EXPECT_ALL(comm.get(), error.find(who) != std::string::npos);
  STRATA_EXPECT_ALL(comm.get(), error.find("variable #1") != std::string::npos);
}

STRATA_RANK_TEST(ParameterServers, BadRequestsAreClearLocalErrors) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  auto ps = ParameterServers::materialize(*job.runtime, PsOptions{},
                                          {var("emb", {10, 2}, Partitioner::fixed_shards(2))});
  std::vector<std::string> errors;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    auto capture = [&](auto fn) {
      try {
        fn();
        errors.push_back("");
      } catch (const Error& e) {
        errors.push_back(e.message());
      }
    };
    std::vector<float> buf(20);
    capture([&] { ps.client->pull("nope", buf.data(), 80); });
    capture([&] { ps.client->push("emb", buf.data(), 40); });
    capture([&] { ps.client->push_rows("emb", {3, 10}, buf.data(), 16); });
    ps.client->done();
  }
  bool ok = ps.is_ps() || (errors.size() == 3 && errors[0].find("unknown variable 'nope'") != std::string::npos &&
                            errors[1].find("40 bytes given, but [10,2] f32 has 80") != std::string::npos &&
                            errors[2].find("row 10 is out of range [0, 10)") != std::string::npos);
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST(ParameterServers, ArenaAboveTheCapIsRefusedEverywhere) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.max_arena_bytes = 1 << 20;
  std::string error;
  try {
    auto ps = ParameterServers::materialize(*job.runtime, options, {var("huge", {1 << 20, 4})});
  } catch (const ConfigError& e) {
    error = e.message();
  }
  STRATA_EXPECT_ALL(comm.get(), error.find("cannot place the variables: ps:0 needs an arena of") != std::string::npos);
}

// Per-variable optimizers (VariableSpec::optimizer) in one sync job: a variable on the job's Adam,
// one on its own FTRL (partitioned over 2 shards) and one on its own Adagrad each end with exactly
// the bits of the single-process reference of their own optimizer.
class MixedOptimizers : public ::testing::TestWithParam<std::string> {};
STRATA_RANK_SUITE(Compiled, MixedOptimizers, ::testing::ValuesIn(testing::tier_transports()),
                  [](const auto& info) { return info.param; });

STRATA_RANK_TEST_P(MixedOptimizers, EachVariableMatchesItsOwnReferenceBitForBit) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  const PsOptions options = sync_options("adam:lr=0.01", GetParam());
  const Initializer init = Initializer::uniform(-1.0, 1.0, 42);
  VariableSpec a = var("job_adam", {10, 7}, Partitioner::fixed_shards(2), init);
  VariableSpec f = var("own_ftrl", {6, 5}, Partitioner::fixed_shards(2), init);
  f.optimizer = OptimizerConfig::parse("ftrl:lr=0.1,l1=0.001,l2=0.01");
  VariableSpec g = var("own_adagrad", {9}, Partitioner::none(), init);
  g.optimizer = OptimizerConfig::parse("adagrad:lr=0.1");
  auto ps = ParameterServers::materialize(*job.runtime, options, {a, f, g});
  const int steps = 5;
  bool ok = true;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    for (const VariableSpec* v : {&a, &f, &g}) {
      const std::size_t n = static_cast<std::size_t>(num_elements(v->shape));
      std::vector<float> grad(n), got(n);
      for (int t = 0; t < steps; ++t) {
        for (std::size_t i = 0; i < n; ++i) grad[i] = grad_of(ps.client->worker_index(), t, i);
        ps.client->push(v->name, grad.data(), n * 4);
      }
      ps.client->pull(v->name, got.data(), n * 4);
      const std::vector<float> want =
          reference(effective_optimizer(*v, options.optimizer), init, v->shape, job.workers, steps);
      const bool same = std::memcmp(got.data(), want.data(), n * 4) == 0;
      if (!same) ADD_FAILURE() << v->name << " differs from its reference";
      ok = ok && same;
    }
    ps.client->done();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}


// A job on async SGD (pushes as remote accumulates) with one variable on its own Adagrad: the
// pushes go through the PS, which applies each variable's optimizer. Only worker 0 pushes, so the
// order is defined and both variables match their references bit for bit.
STRATA_RANK_TEST(ParameterServers, AsyncSgdJobWithOneOwnOptimizer) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  Job job = start(comm);
  PsOptions options;
  options.optimizer = OptimizerConfig::parse("sgd:lr=0.5");
  const Initializer init = Initializer::uniform(-1.0, 1.0, 9);
  VariableSpec s = var("sgd", {8, 3}, Partitioner::none(), init);
  VariableSpec g = var("adagrad", {4, 6}, Partitioner::fixed_shards(2), init);
  g.optimizer = OptimizerConfig::parse("adagrad:lr=0.1");
  auto ps = ParameterServers::materialize(*job.runtime, options, {s, g});
  const int steps = 4;
  bool ok = true;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    if (ps.client->worker_index() == 0) {
      for (const VariableSpec* v : {&s, &g}) {
        const std::size_t n = static_cast<std::size_t>(num_elements(v->shape));
        std::vector<float> grad(n), got(n);
        for (int t = 0; t < steps; ++t) {
          for (std::size_t i = 0; i < n; ++i) grad[i] = grad_of(0, t, i);
          ps.client->push(v->name, grad.data(), n * 4);
        }
        ps.client->wait_applied();
        ps.client->pull(v->name, got.data(), n * 4);
        const std::vector<float> want = reference(effective_optimizer(*v, options.optimizer), init, v->shape, 1, steps);
        const bool same = std::memcmp(got.data(), want.data(), n * 4) == 0;
        if (!same) ADD_FAILURE() << v->name << " differs from its reference";
        ok = ok && same;
      }
    }
    ps.client->done();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// Workers that disagree on a variable's optimizer fail the creation check naming it.
STRATA_RANK_TEST(ParameterServers, DifferentOptimizerOnOneWorkerIsNamed) {
  TestComm comm;
  if (comm.size() < 3) GTEST_SKIP() << "needs 2 workers";
  Job job = start(comm);
  std::vector<VariableSpec> specs = {var("a", {3}), var("wide/w", {4, 2})};
  specs[1].optimizer = OptimizerConfig::parse("ftrl:lr=0.1");
  if (comm.rank() == comm.size() - 1) specs[1].optimizer = OptimizerConfig::parse("ftrl:lr=0.2");
  std::string error;
  try {
    auto ps = ParameterServers::materialize(*job.runtime, PsOptions{}, specs);
  } catch (const ConfigError& e) {
    error = e.message();
  }
  STRATA_EXPECT_ALL(comm.get(), error.find("variable creation differs") != std::string::npos);
  STRATA_EXPECT_ALL(comm.get(), error.find("'wide/w'") != std::string::npos);
  STRATA_EXPECT_ALL(comm.get(), error.find("lr=0.2") != std::string::npos);
}

}  // namespace
}  // namespace strata::ps
