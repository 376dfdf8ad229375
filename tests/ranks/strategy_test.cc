// ParameterServerStrategy under mpirun (1-3 ranks) and on 1-3 thread ranks in the inproc tier
// (tests/common/rank_test.h): TF's reduce/axis semantics, replica contexts over K CPU replicas,
// the scope/materialise lifecycle, gradients pushed once per worker as the mean over its replicas,
// input sharding over the workers, and dynamic variables.
#define STRATA_INPROC_RANKS 1, 2, 3
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "common/rank_test.h"
#include "strata/comm/mpi_group.h"
#include "strata/cluster/runtime.h"
#include "strata/common/error.h"
#include "strata/strategy/parameter_server_strategy.h"

namespace strata {
namespace {

using testing::TestComm;

std::unique_ptr<Runtime> start(TestComm& comm, int num_ps) {
  BootstrapOptions options;
  options.resolve.resolver = cluster::ResolverKind::kMpi;
  options.resolve.num_ps = num_ps;
  options.timeout_s = 30;
  return testing::bootstrap_runtime(comm, Env(), options);
}

Tensor tensor(std::vector<float> v, std::vector<std::int64_t> shape) { return Tensor{std::move(v), std::move(shape)}; }

STRATA_RANK_TEST(Strategy, ReduceFollowsTensorFlowAxisSemantics) {
  TestComm comm;
  auto rt = start(comm, 0);
  StrategyOptions options;
  options.cpu_replicas = 2;
  ParameterServerStrategy strategy(*rt, options);
  // Two replicas: a full batch of 2 rows and a partial batch of 1 row, 3 features.
  PerReplica<Tensor> batch = {tensor({1, 2, 3, 4, 5, 6}, {2, 3}), tensor({7, 8, 9}, {1, 3})};
  Tensor sum0 = strategy.reduce(ReduceOp::kSum, batch, 0);
  Tensor mean0 = strategy.reduce(ReduceOp::kMean, batch, 0);
  bool ok = sum0.shape == std::vector<std::int64_t>{3} && sum0.values == std::vector<float>{12, 15, 18};
  // MEAN along the batch axis divides by the 3 examples, not by the 2 replicas.
  ok = ok && mean0.values == std::vector<float>{4, 5, 6};
  // axis=None: element-wise across replicas.
  PerReplica<Tensor> same = {tensor({1, 2}, {2}), tensor({3, 6}, {2})};
  ok = ok && strategy.reduce(ReduceOp::kSum, same).values == std::vector<float>{4, 8};
  ok = ok && strategy.reduce(ReduceOp::kMean, same).values == std::vector<float>{2, 4};
  // axis=1 and negative axes.
  Tensor sum1 = strategy.reduce(ReduceOp::kSum, {tensor({1, 2, 3, 4}, {2, 2}), tensor({10, 20}, {2, 1})}, -1);
  ok = ok && sum1.shape == std::vector<std::int64_t>{2} && sum1.values == std::vector<float>{13, 27};
  std::string error;
  try {
    strategy.reduce(ReduceOp::kSum, batch);  // shapes differ with axis=None
  } catch (const Error& e) {
    error = e.message();
  }
  ok = ok && error.find("another shape") != std::string::npos;
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST(Strategy, RunGivesEachReplicaItsContext) {
  TestComm comm;
  auto rt = start(comm, 0);
  StrategyOptions options;
  options.cpu_replicas = 3;
  ParameterServerStrategy strategy(*rt, options);
  PerReplica<int> ids = strategy.run<int>([](ReplicaContext& ctx) { return ctx.replica_id_in_sync_group(); });
  PerReplica<std::vector<float>> reduced = strategy.run<std::vector<float>>([](ReplicaContext& ctx) {
    std::vector<float> v = {static_cast<float>(ctx.replica_id_in_sync_group() + 1), 1.0f};
    ctx.all_reduce(ReduceOp::kSum, v);
    return v;
  });
  bool ok = strategy.num_replicas_in_sync() == 3 && strategy.local_results(ids) == PerReplica<int>{0, 1, 2};
  for (const auto& v : reduced) ok = ok && v == std::vector<float>{6, 3};
  // An exception in one replica reaches the caller.
  std::string error;
  try {
    strategy.run([](ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 2) throw Error("replica two failed");
    });
  } catch (const Error& e) {
    error = e.message();
  }
  ok = ok && error == "replica two failed";
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST(Strategy, GradientsArePushedOncePerWorkerAsTheReplicaMean) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  auto rt = start(comm, 1);
  StrategyOptions options;
  options.cpu_replicas = 2;
  options.ps.optimizer = ps::OptimizerConfig::parse("sgd:lr=1");
  ParameterServerStrategy strategy(*rt, options);
  Variable w, emb;
  strategy.scope([&] {
    ps::VariableSpec spec;
    spec.name = "w";
    spec.shape = {4};
    w = strategy.create_variable(spec);
    strategy.scope([&] {  // nested scope: still one materialisation
      ps::VariableSpec table;
      table.name = "emb";
      table.shape = {10, 2};
      strategy.colocate_vars_with(w, [&] { emb = strategy.create_variable(table); });
    });
  });
  const int workers = comm.size() - 1;
  bool ok = true;
  if (strategy.is_ps()) {
    strategy.serve();
  } else {
    std::atomic<std::int64_t> last_step{0};
    strategy.run([&](ReplicaContext& ctx) {
      // Replica r contributes (r + 1) * [1, 2, 3, 4]; the mean over 2 replicas is 1.5 * [1..4].
      std::vector<float> g = {1, 2, 3, 4};
      for (auto& x : g) x *= static_cast<float>(ctx.replica_id_in_sync_group() + 1);
      ctx.apply_gradient(w, g);
      // Both replicas send row 3 (grad 2); replica 1 also row 7 (grad 4): pushed as the mean.
      std::vector<std::int64_t> rows = {3};
      std::vector<float> grads = {2, 2};
      if (ctx.replica_id_in_sync_group() == 1) {
        rows.push_back(7);
        grads.insert(grads.end(), {4, 4});
      }
      ctx.apply_sparse_gradient(emb, rows, grads);
      last_step = ctx.increment_global_step();
    });
    strategy.finish();
    ok = last_step >= 1;
  }
  comm.group().barrier(comm::Deadline{60, "test barrier"});
  if (!strategy.is_ps()) {
    std::vector<float> got;
    strategy.read(w, got);
    const float W = static_cast<float>(workers);
    ok = ok && got == std::vector<float>{-1.5f * W, -3.0f * W, -4.5f * W, -6.0f * W};
    std::vector<float> table;
    strategy.read(emb, table);
    ok = ok && table[6] == -2.0f * W && table[14] == -2.0f * W && table[0] == 0.0f;
    // The global step counts one increment per worker step, not per replica.
    ok = ok && strategy.global_step() == workers;
    // Colocation put the table on w's PS (the only one here) without splitting it.
    ok = ok && strategy.ps_endpoint().shard_map().shards_of("emb").size() == 1;
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

// A dataset whose only dense feature is the example's index, spread over 4 files.
data::Dataset indexed_dataset(std::int64_t n) {
  data::Dataset ds;
  ds.size = n;
  ds.dense_dim = 1;
  ds.num_classes = 2;
  ds.files = {"a", "b", "c", "d"};
  for (std::int64_t i = 0; i < n; ++i) {
    ds.features.push_back(static_cast<float>(i));
    ds.labels.push_back(static_cast<std::int32_t>(i % 2));
    ds.file_of.push_back(static_cast<std::int32_t>(i % 4));
  }
  return ds;
}

class Sharding : public ::testing::TestWithParam<data::AutoShard> {};
STRATA_RANK_SUITE(Policies, Sharding, ::testing::Values(data::AutoShard::kData, data::AutoShard::kFile),
                         [](const auto& info) { return std::string(data::to_string(info.param)); });

STRATA_RANK_TEST_P(Sharding, EveryExampleOncePerEpochAcrossWorkers) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  auto rt = start(comm, 1);
  StrategyOptions options;
  options.cpu_replicas = 2;
  ParameterServerStrategy strategy(*rt, options);
  strategy.scope([&] {});
  const std::int64_t n = 103;  // odd, not a multiple of the batch
  data::Dataset ds = indexed_dataset(n);
  bool ok = true;
  if (strategy.is_ps()) {
    strategy.serve();
  } else {
    DistributeOptions dopt;
    dopt.global_batch = 10;
    dopt.drop_remainder = false;
    DistributedDataset dist = strategy.distribute_dataset(ds, GetParam(), dopt);
    for (int epoch = 0; epoch < 2; ++epoch) {
      dist.start_epoch(epoch);
      std::vector<int> seen;
      PerReplica<data::Batch> parts;
      while (dist.next(parts)) {
        ok = ok && parts.size() == 2 && parts[0].size >= parts[1].size;
        for (const auto& p : parts)
          for (int i = 0; i < p.size; ++i) seen.push_back(static_cast<int>(p.features[i]));
      }
      // Gather every worker's ids of this epoch over the workers' group.
      const std::string mine(reinterpret_cast<const char*>(seen.data()), seen.size() * sizeof(int));
      std::vector<int> hits(n, 0);
      for (const std::string& theirs : comm::workers_group(*rt)->allgather_strings(mine, comm::Deadline{60, "ids seen"})) {
        std::vector<int> ids(theirs.size() / sizeof(int));
        std::memcpy(ids.data(), theirs.data(), ids.size() * sizeof(int));
        for (int id : ids) hits[id]++;
      }
      for (int h : hits) ok = ok && h == 1;
    }
    strategy.finish();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}


STRATA_RANK_TEST(Strategy, DatasetsFromFunctionSeeTheInputContext) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  auto rt = start(comm, 1);
  StrategyOptions options;
  options.cpu_replicas = 2;
  ParameterServerStrategy strategy(*rt, options);
  strategy.scope([&] {});
  bool ok = true;
  if (strategy.is_ps()) {
    strategy.serve();
  } else {
    data::InputContext seen_ctx;
    DistributeOptions dopt;
    dopt.global_batch = 4;
    auto dist = strategy.distribute_datasets_from_function(
        [&](const data::InputContext& ctx) {
          seen_ctx = ctx;
          return indexed_dataset(8);
        },
        dopt);
    ok = seen_ctx.num_input_pipelines == comm.size() - 1 && seen_ctx.input_pipeline_id == strategy.worker_index() &&
         seen_ctx.num_replicas_in_sync == 2 && seen_ctx.get_per_replica_batch_size(4) == 2;
    PerReplica<data::Batch> parts;
    int batches = 0;
    while (dist.next(parts)) ++batches;
    ok = ok && batches == 2;  // its own 8 examples, not sharded again
    std::string error;
    try {
      dopt.global_batch = 5;
      strategy.distribute_dataset(indexed_dataset(8), data::AutoShard::kData, dopt);
    } catch (const ConfigError& e) {
      error = e.message();
    }
    ok = ok && error.find("5") != std::string::npos;
    strategy.finish();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST(Strategy, DynamicVariablesAreLookedUpAndUpdatedById) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  const int num_ps = comm.size() >= 3 ? 2 : 1;
  auto rt = start(comm, num_ps);
  StrategyOptions options;
  options.cpu_replicas = 2;
  options.ps.optimizer = ps::OptimizerConfig::parse("sgd:lr=1");
  ParameterServerStrategy strategy(*rt, options);
  Variable w;
  DynamicVariable emb;
  std::string errors;
  strategy.scope([&] {
    ps::VariableSpec spec;
    spec.name = "w";
    spec.shape = {2};
    w = strategy.create_variable(spec);
    ps::DynamicVariableSpec d;
    d.name = "emb";
    d.dim = 2;
    d.init = ps::Initializer::zeros();
    emb = strategy.create_dynamic_variable(d);
    // A bad spec is refused when declared, naming the field; nothing is added.
    d.name = "bad";
    d.dim = 0;
    try {
      strategy.create_dynamic_variable(d);
    } catch (const ConfigError& e) {
      errors += e.message() + "|";
    }
  });
  bool ok = errors.find("dynamic variable 'bad'") != std::string::npos && strategy.dynamic_variables().size() == 1;
  const int workers = comm.size() - num_ps;
  const std::int64_t big = std::int64_t{1} << 40;
  if (strategy.is_ps()) {
    strategy.serve();
  } else {
    strategy.run([&](ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      std::vector<std::int64_t> ids = {1, big};
      std::vector<float> rows;
      ctx.lookup(emb, ids, rows);  // created from zeros
      if (rows != std::vector<float>(4, 0.0f)) throw Error("fresh rows are not the initializer's zeros");
      // Replica r sends (r + 1) for ids 1 and 2^40; replica 1 also 4 for id -7; pushed as the mean
      // over the 2 replicas: 1.5, 1.5 and 2 per worker.
      std::vector<float> grads(4, static_cast<float>(r + 1));
      if (r == 1) {
        ids.push_back(-7);
        grads.insert(grads.end(), {4, 4});
      }
      ctx.apply_dynamic_gradient(emb, ids, grads, 1);
    });
    // A gradient of the wrong size is refused before anything is sent.
    try {
      strategy.update(emb, {1, 2}, {1, 2, 3}, 1);
    } catch (const Error& e) {
      errors += e.message() + "|";
    }
    ok = ok && errors.find("3 gradient values for 2 id(s) of 2 floats") != std::string::npos;
    // Lookups are served by the PS service loop: read before finish(), once every worker's
    // update returned (each returns once applied).
    comm::workers_group(*rt)->barrier(comm::Deadline{60, "workers' barrier"});
    std::vector<float> got;
    strategy.lookup(emb, {-7, 1, big, 99}, got, ps::DynamicLookup::kInference);
    const float W = static_cast<float>(workers);
    ok = ok && got == std::vector<float>{-2 * W, -2 * W, -1.5f * W, -1.5f * W, -1.5f * W, -1.5f * W, 0, 0};
    strategy.finish();
  }
  comm.group().barrier(comm::Deadline{60, "test barrier"});
  std::int64_t rows = 0;
  if (strategy.is_ps()) {
    ok = ok && strategy.ps_server().dynamic_variables().size() == 1;
    rows = strategy.ps_server().dynamic_stats("emb").rows;
  }
  const std::int64_t total = comm.group().allreduce(rows, comm::ReduceOp::kSum, comm::Deadline{60, "rows"});
  ok = ok && total == 3;  // ids 1, 2^40 and -7 over every PS; the inference lookup of 99 made none
  STRATA_EXPECT_ALL(comm.get(), ok);
}

STRATA_RANK_TEST(Strategy, CreatingVariablesOutsideScopeIsAnError) {
  TestComm comm;
  auto rt = start(comm, 0);
  ParameterServerStrategy strategy(*rt, StrategyOptions{});
  std::string error;
  try {
    ps::VariableSpec spec;
    spec.name = "loose";
    spec.shape = {1};
    strategy.create_variable(spec);
  } catch (const Error& e) {
    error = e.message();
  }
  STRATA_EXPECT_ALL(comm.get(), error.find("outside strategy.scope()") != std::string::npos);
}

}  // namespace
}  // namespace strata
