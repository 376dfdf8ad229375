// Checkpoints through ParameterServerStrategy under mpirun (2-4 ranks) and on 2-4 thread ranks in
// the inproc tier (tests/common/rank_test.h): saves at agreed step boundaries, lazy restore into
// another number of PS ranks and another partitioning (values and optimizer slots identical, value
// for value), dynamic tables restored onto another PS count, the restore report, and the errors a
// restore must give. Both tiers write the same
// files: parallel HDF5 under MPI, PS 0 writing every PS rank's rows in-process.
#define STRATA_INPROC_RANKS 2, 3, 4
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/rank_test.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/comm/mpi_group.h"
#include "strata/cluster/runtime.h"
#include "strata/common/error.h"
#include "strata/common/hdf5_lock.h"
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

// Collective: one fresh directory, the same path on every rank.
void barrier(TestComm& comm) { comm.group().barrier(comm::Deadline{60, "test barrier"}); }

std::string shared_temp_dir(TestComm& comm) {
  char buf[256] = {0};
  if (comm.rank() == 0) {
    std::string templ = (std::filesystem::temp_directory_path() / "strata-ckpt-XXXXXX").string();
    std::snprintf(buf, sizeof buf, "%s", templ.c_str());
    if (!mkdtemp(buf)) buf[0] = 0;
  }
  comm.group().broadcast(buf, sizeof buf, 0, comm::Deadline{60, "test temp dir"});
  return buf;
}

struct Model {
  Variable emb, w, scalar, counts;
};

// The test model; `emb_parts` partitions the embedding (1 = not partitioned); `emb_optimizer` and
// `w_optimizer` give those variables their own optimizers ("" = the job's).
Model declare(ParameterServerStrategy& strategy, int emb_parts, std::int64_t emb_rows = 37, bool with_w = true,
              bool with_extra = false, const std::string& emb_optimizer = "", const std::string& w_optimizer = "") {
  Model m;
  strategy.scope([&] {
    ps::VariableSpec emb;
    emb.name = "embedding/table";
    emb.shape = {emb_rows, 3};
    emb.init = ps::Initializer::uniform(-1, 1, 7);
    if (emb_parts > 1) emb.partitioner = ps::Partitioner::fixed_shards(emb_parts);
    if (!emb_optimizer.empty()) emb.optimizer = ps::OptimizerConfig::parse(emb_optimizer);
    m.emb = strategy.create_variable(emb);
    if (with_w) {
      ps::VariableSpec w;
      w.name = "dense/w";
      w.shape = {5};
      w.init = ps::Initializer::constant(0.25);
      if (!w_optimizer.empty()) w.optimizer = ps::OptimizerConfig::parse(w_optimizer);
      m.w = strategy.create_variable(w);
    }
    ps::VariableSpec scalar;
    scalar.name = "scale";
    scalar.shape = {};
    scalar.init = ps::Initializer::ones();
    m.scalar = strategy.create_variable(scalar);
    ps::VariableSpec counts;
    counts.name = "counts";
    counts.shape = {4};
    counts.dtype = ps::DType::kI64;
    counts.trainable = false;
    m.counts = strategy.create_variable(counts);
    if (with_extra) {
      ps::VariableSpec extra;
      extra.name = "extra";
      extra.shape = {2};
      extra.init = ps::Initializer::constant(3);
      strategy.create_variable(extra);
    }
  });
  return m;
}

StrategyOptions sync_adam() {
  StrategyOptions options;
  options.ps.optimizer = ps::OptimizerConfig::parse("adam:lr=0.1");
  options.ps.consistency = ps::ConsistencyConfig::parse("sync");  // reproducible: the mean of all workers
  options.ps.timeout_s = 60;
  return options;
}

// Trains `steps` deterministic steps on every worker (the PS ranks serve) and finishes, which takes
// the final save when checkpointing. Returns the position each worker reported last.
ps::WorkerPosition train(ParameterServerStrategy& strategy, const Model& m, int steps, int save_every = 0) {
  if (strategy.is_ps()) {
    strategy.serve();
    return {};
  }
  ps::WorkerPosition pos;
  if (strategy.is_chief()) {
    std::vector<std::int64_t> counts = {1, 2, 3, 40};
    strategy.ps_client().assign("counts", counts.data(), counts.size() * 8);
  }
  for (int s = 0; s < steps; ++s) {
    const float k = static_cast<float>(strategy.worker_index() + 1 + s);
    strategy.run([&](ReplicaContext& ctx) {
      std::vector<float> gw = {k, -k, 0.5f * k, 0, 1};
      ctx.apply_gradient(m.w, gw);
      std::vector<float> gs = {0.1f * k};
      ctx.apply_gradient(m.scalar, gs);
      std::vector<std::int64_t> rows = {s % 37, 36, (5 * s + 1) % 37};
      std::vector<float> gr(9);
      for (int i = 0; i < 9; ++i) gr[i] = k * static_cast<float>(i - 4);
      ctx.apply_sparse_gradient(m.emb, rows, gr);
      ctx.increment_global_step();
    });
    pos = {0, 16 * (s + 1), s + 1};
    strategy.end_step(pos);
    (void)save_every;
  }
  strategy.finish(pos);
  return pos;
}

// Values of every variable as the chief reads them, broadcast to every rank (bytes, in order).
std::vector<char> snapshot(TestComm& comm, ParameterServerStrategy& strategy, const Model& m) {
  std::vector<char> out;
  if (strategy.is_chief()) {
    for (const Variable* v : {&m.emb, &m.w, &m.scalar}) {
      std::vector<float> values;
      strategy.read(*v, values);
      const char* p = reinterpret_cast<const char*>(values.data());
      out.insert(out.end(), p, p + values.size() * sizeof(float));
    }
    std::vector<std::int64_t> counts(4);
    strategy.ps_client().pull("counts", counts.data(), 32);
    const char* p = reinterpret_cast<const char*>(counts.data());
    out.insert(out.end(), p, p + 32);
  }
  std::string chiefs;
  for (auto& s : comm.group().allgather_strings(std::string(out.begin(), out.end()), comm::Deadline{60, "snapshot"}))
    if (!s.empty()) chiefs = s;
  return std::vector<char>(chiefs.begin(), chiefs.end());
}

// Every dataset of two checkpoint files, compared byte for byte (values and slots).
std::string compare_files(const std::string& a, const std::string& b) {
  checkpoint::CheckpointReader ra(a), rb(b);
  if (ra.global_step() != rb.global_step()) return "global steps differ";
  if (ra.variables().size() != rb.variables().size()) return "variable counts differ";
  for (const auto& va : ra.variables()) {
    const auto* vb = rb.find(va.name);
    if (!vb || vb->shape != va.shape || vb->dtype != va.dtype || vb->slots != va.slots) return "meta of " + va.name;
    if (va.optimizer_step != vb->optimizer_step) return "optimizer_step of " + va.name;
    std::int64_t elems = 1;
    for (auto d : va.shape) elems *= d;
    const std::size_t bytes = static_cast<std::size_t>(elems) * checkpoint::dtype_size(va.dtype);
    std::vector<std::string> slots{""};
    slots.insert(slots.end(), va.slots.begin(), va.slots.end());
    for (const auto& slot : slots) {
      std::vector<char> x(bytes), y(bytes);
      ra.read_slot_rows(va.name, slot, 0, va.shape[0], x.data());
      rb.read_slot_rows(va.name, slot, 0, va.shape[0], y.data());
      if (x != y) return "values of " + va.name + (slot.empty() ? "" : "/" + slot);
    }
  }
  return "";
}

STRATA_RANK_TEST(CheckpointStrategy, RestoresIntoOtherPsCountAndPartitioningIdentically) {
  TestComm comm;
  if (comm.size() < 3) GTEST_SKIP() << "needs 1 PS + 2 workers to save, then 2+ PS to restore";
  const std::string dir = shared_temp_dir(comm);
  const std::string dir2 = dir + "/resharded";
  const int workers = 2;
  const int steps = 3;

  // Save: 1 PS, embedding not partitioned, a save every step plus the final one.
  std::vector<char> saved;
  ps::WorkerPosition last;
  {
    auto rt = start(comm, comm.size() - workers);
    StrategyOptions options = sync_adam();
    ParameterServerStrategy strategy(*rt, options);
    CheckpointOptions copt;
    copt.directory = dir;
    copt.save_every_steps = 1;
    copt.max_to_keep = 2;
    strategy.set_checkpoint_options(copt);
    Model m = declare(strategy, 1);
    last = train(strategy, m, steps);
    barrier(comm);
    saved = snapshot(comm, strategy, m);
  }
  auto entries = checkpoint::list_checkpoints(dir);
  bool ok = entries.size() == 2 && entries.back().global_step == steps * workers;

  // Restore on every rank but one as PS (np 3: 2 PS, np 4: 3 PS) with the embedding in 3 parts,
  // with no steps: the values read back, and the file saved again, equal the originals.
  {
    auto rt = start(comm, comm.size() - 1);
    StrategyOptions options = sync_adam();
    options.ps.placement = ps::PlacementPolicy::kGreedy;
    ParameterServerStrategy strategy(*rt, options);
    CheckpointOptions copt;
    copt.directory = dir2;
    strategy.set_checkpoint_options(copt);
    strategy.restore(dir);
    Model m = declare(strategy, 3);
    const auto& report = strategy.restore_report();
    ok = ok && report && report->global_step == steps * workers && report->restored.size() == 4 &&
         report->initialized.empty() && report->unused.empty() && report->fresh_slots.empty();
    ok = ok && strategy.ps_endpoint().shard_map().shards_of("embedding/table").size() == 3;
    if (!strategy.is_ps()) {
      // One worker now: the saving job had two, so it restarts at the oldest epoch's start.
      const auto pos = strategy.restored_position();
      ok = ok && report->positions.size() == 2 && report->positions[1].offset == last.offset && pos.offset == 0;
      ok = ok && strategy.global_step() == steps * workers;
    }
    if (strategy.is_ps())
      strategy.serve();
    else
      strategy.finish(strategy.restored_position());
    barrier(comm);
    ok = ok && snapshot(comm, strategy, m) == saved;
  }
  const std::string diff = compare_files(dir + "/ckpt-" + std::to_string(steps * workers) + ".h5",
                                         dir2 + "/ckpt-" + std::to_string(steps * workers) + ".h5");
  ok = ok && diff.empty();
  STRATA_EXPECT_ALL(comm.get(), ok);
  if (comm.rank() == 0 && !diff.empty()) ADD_FAILURE() << "resaved checkpoint differs: " << diff;
  barrier(comm);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

// Per-variable optimizers: each variable's slots are saved under its own optimizer's names (the
// embedding FTRL's, dense/w Adagrad's, the scalar the job's Adam's), a restore brings every value
// and slot back bit for bit (the file saved again is identical), and a restore that would give a
// variable another optimizer is refused naming it.
STRATA_RANK_TEST(CheckpointStrategy, PerVariableOptimizersRoundTripAndRefuseAnotherOptimizer) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  const std::string dir = shared_temp_dir(comm);
  const std::string dir2 = dir + "/again";
  const std::string ftrl = "ftrl:lr=0.1,l1=0.01,l2=0.001", adagrad = "adagrad:lr=0.1";
  const int steps = 3, workers = comm.size() - 1;
  std::vector<char> saved;
  {
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    CheckpointOptions copt;
    copt.directory = dir;
    strategy.set_checkpoint_options(copt);
    Model m = declare(strategy, 1, 37, true, false, ftrl, adagrad);
    train(strategy, m, steps);
    barrier(comm);
    saved = snapshot(comm, strategy, m);
  }
  const std::string file = dir + "/ckpt-" + std::to_string(steps * workers) + ".h5";
  bool ok = true;
  if (comm.rank() == 0) {
    checkpoint::CheckpointReader r(file);
    auto sorted = [](std::vector<std::string> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    ok = sorted(r.find("embedding/table")->slots) == std::vector<std::string>{"accumulator", "linear"} &&
         sorted(r.find("dense/w")->slots) == std::vector<std::string>{"accumulator"} &&
         sorted(r.find("scale")->slots) == std::vector<std::string>{"m", "v"};
  }
  // Restored with the same optimizers (2 PS where there are ranks for them): identical values, and
  // the file saved again identical, slots included.
  {
    auto rt = start(comm, comm.size() >= 3 ? 2 : 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    CheckpointOptions copt;
    copt.directory = dir2;
    strategy.set_checkpoint_options(copt);
    strategy.restore(dir);
    Model m = declare(strategy, 2, 37, true, false, ftrl, adagrad);
    const auto& report = strategy.restore_report();
    ok = ok && report && report->fresh_slots.empty() && report->restored.size() == 4;
    if (strategy.is_ps())
      strategy.serve();
    else
      strategy.finish(strategy.restored_position());
    barrier(comm);
    ok = ok && snapshot(comm, strategy, m) == saved;
  }
  std::string diff;
  if (comm.rank() == 0) {
    diff = compare_files(file, dir2 + "/ckpt-" + std::to_string(steps * workers) + ".h5");
    if (!diff.empty()) ADD_FAILURE() << "resaved checkpoint differs: " << diff;
  }
  ok = ok && diff.empty();
  // The embedding on Adagrad now: refused on every rank, naming it, before any allocation.
  {
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    strategy.restore(dir);
    std::string error;
    try {
      declare(strategy, 1, 37, true, false, adagrad, adagrad);
    } catch (const ConfigError& e) {
      error = e.message();
    }
    ok = ok && error.find("'embedding/table'") != std::string::npos && error.find("adagrad") != std::string::npos &&
         error.find("dense/w") == std::string::npos;
    if (comm.rank() == 0 && !ok) ADD_FAILURE() << "error: " << error;
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
  barrier(comm);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

STRATA_RANK_TEST(CheckpointStrategy, ReportsMissingAndUnusedVariablesAndRejectsShapeMismatch) {
  TestComm comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs a PS and a worker";
  const std::string dir = shared_temp_dir(comm);
  {
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    CheckpointOptions copt;
    copt.directory = dir;
    strategy.set_checkpoint_options(copt);
    Model m = declare(strategy, 1);
    train(strategy, m, 1);
  }
  bool ok = checkpoint::list_checkpoints(dir).size() == 1;

  // A model without dense/w and with a new variable: restored where possible, reported otherwise.
  {
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    strategy.restore(dir);
    Model m = declare(strategy, 1, 37, /*with_w=*/false, /*with_extra=*/true);
    const auto& r = strategy.restore_report();
    ok = ok && r && r->unused == std::vector<std::string>{"dense/w"} &&
         r->initialized == std::vector<std::string>{"extra"} && r->restored.size() == 3;
    if (strategy.is_chief()) {
      std::vector<float> extra(2);
      strategy.ps_client().pull("extra", extra.data(), 8);
      ok = ok && extra == std::vector<float>{3, 3};  // its initializer
    }
    if (strategy.is_ps())
      strategy.serve();
    else
      strategy.finish();
  }

  // A different shape is a ConfigError on every rank, naming the variable, before any allocation.
  {
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    strategy.restore(dir);
    std::string error;
    try {
      declare(strategy, 1, 36);
    } catch (const ConfigError& e) {
      error = e.message();
    }
    ok = ok && error.find("embedding/table") != std::string::npos && error.find("shape") != std::string::npos;
  }

  // A missing path is an error too; a directory without checkpoints is a fresh start.
  {
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    strategy.restore(dir + "/nonexistent");
    std::string error;
    try {
      declare(strategy, 1);
    } catch (const ConfigError& e) {
      error = e.message();
    }
    ok = ok && error.find("does not exist") != std::string::npos;
  }
  {
    const std::string empty = dir + "/empty";
    if (comm.rank() == 0) std::filesystem::create_directories(empty);
    barrier(comm);
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    strategy.restore(empty);
    Model m = declare(strategy, 1);
    ok = ok && !strategy.restore_report();
    if (strategy.is_chief()) ok = ok && strategy.global_step() == 0;
    if (strategy.is_ps())
      strategy.serve();
    else
      strategy.finish();
  }

  // A corrupted newest checkpoint: the previous valid one is restored and the skip reported.
  {
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    CheckpointOptions copt;
    copt.directory = dir;
    strategy.set_checkpoint_options(copt);
    strategy.restore(dir);
    Model m = declare(strategy, 1);
    train(strategy, m, 1);  // saves a second, newer checkpoint
  }
  auto entries = checkpoint::list_checkpoints(dir);
  ok = ok && entries.size() == 2;
  if (comm.rank() == 0 && entries.size() == 2) {
    // Flip bytes inside the newest file's embedding data (located with HDF5 itself): its checksum
    // no longer matches.
    const std::string newest = dir + "/" + entries.back().file;
    std::lock_guard<std::recursive_mutex> h5(hdf5_mutex());  // thread ranks share the process's HDF5
    hid_t file = H5Fopen(newest.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t dset = H5Dopen2(file, "/variables/embedding/table", H5P_DEFAULT);
    const haddr_t offset = H5Dget_offset(dset);
    H5Dclose(dset);
    H5Fclose(file);
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    for (std::streamoff off = 0; off < 16; ++off) {
      const auto at = static_cast<std::streamoff>(offset) + 8 * off;
      f.seekg(at);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(at);
      f.write(&c, 1);
    }
  }
  barrier(comm);
  {
    auto rt = start(comm, 1);
    ParameterServerStrategy strategy(*rt, sync_adam());
    strategy.restore(dir);
    Model m = declare(strategy, 1);
    const auto& r = strategy.restore_report();
    ok = ok && r && r->skipped.size() == 1 && entries.size() == 2 && r->global_step == entries.front().global_step;
    if (strategy.is_ps())
      strategy.serve();
    else
      strategy.finish();
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
  barrier(comm);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

// The chief's `values`, on every rank.
std::vector<float> from_chief(TestComm& comm, ParameterServerStrategy& strategy, const std::vector<float>& values) {
  const std::string mine = strategy.is_chief() ? std::string(reinterpret_cast<const char*>(values.data()),
                                                             values.size() * sizeof(float))
                                               : std::string();
  std::vector<float> out;
  for (const auto& s : comm.group().allgather_strings(mine, comm::Deadline{60, "the chief's values"}))
    if (!s.empty()) {
      out.resize(s.size() / sizeof(float));
      std::memcpy(out.data(), s.data(), s.size());
    }
  return out;
}

// Dynamic variables in checkpoints: the tables the PS ranks save together (one file, every PS its
// own rows) restore onto another number of PS ranks with every row as it was trained, and an
// unseen id still gets the initializer.
STRATA_RANK_TEST(CheckpointStrategy, DynamicTablesRestoreOntoAnotherPsCount) {
  TestComm comm;
  const std::string dir = shared_temp_dir(comm);
  const std::int64_t big = std::int64_t{1} << 40;
  const std::vector<std::int64_t> probe = {0, 1, 2, 100, 101, 102, big, -5, 77};
  const auto declare_emb = [](ParameterServerStrategy& strategy) {
    DynamicVariable emb;
    strategy.scope([&] {
      ps::DynamicVariableSpec d;
      d.name = "emb";
      d.dim = 2;
      d.init = ps::Initializer::zeros();
      emb = strategy.create_dynamic_variable(d);
    });
    return emb;
  };
  StrategyOptions options;
  options.ps.optimizer = ps::OptimizerConfig::parse("sgd:lr=1");
  options.ps.timeout_s = 60;
  const int steps = 3;
  // Save: 2 PS from 3 ranks on (one file, each PS its own rows), else 1; the other ranks workers.
  // Every update is a whole number, so the sums are exact in any order of the workers' pushes.
  const int save_ps = comm.size() >= 3 ? 2 : 1;
  std::vector<float> before;
  std::int64_t step = 0;
  {
    auto rt = start(comm, save_ps);
    ParameterServerStrategy strategy(*rt, options);
    CheckpointOptions copt;
    copt.directory = dir;
    strategy.set_checkpoint_options(copt);
    DynamicVariable emb = declare_emb(strategy);
    std::vector<float> got;
    if (strategy.is_ps()) {
      strategy.serve();
    } else {
      for (int s = 0; s < steps; ++s) {
        const float k = static_cast<float>(strategy.worker_index() + 1 + s);
        strategy.run([&](ReplicaContext& ctx) {
          std::vector<std::int64_t> ids = {s, 100 + s, big, -5};
          std::vector<float> grads = {k, -k, 2 * k, 0, -1, 1, 3, 4};
          ctx.apply_dynamic_gradient(emb, ids, grads, 1);
          ctx.increment_global_step();
        });
        strategy.end_step({0, 8 * (s + 1), s + 1});
      }
      comm::workers_group(*rt)->barrier(comm::Deadline{60, "workers' barrier"});
      strategy.lookup(emb, probe, got, ps::DynamicLookup::kInference);
      step = strategy.global_step();
      strategy.finish({0, 8 * steps, steps});
    }
    before = from_chief(comm, strategy, got);
    step = comm.group().allreduce(step, comm::ReduceOp::kMax, comm::Deadline{60, "global step"});
  }
  const int workers = comm.size() - save_ps;
  bool ok = step == steps * workers && before.size() == 2 * probe.size();
  ok = ok && std::filesystem::is_regular_file(dir + "/dynamic-" + std::to_string(step) + ".h5");
  // The unseen id 77 reads the initializer's zeros; id 0 holds worker 0's first step at least.
  ok = ok && before.size() == 18 && before[16] == 0 && before[17] == 0 && before[0] != 0;

  // Restore onto every rank but one as PS (1-3 PS) and read the same ids back.
  std::vector<float> after;
  {
    auto rt = start(comm, comm.size() - 1);
    ParameterServerStrategy strategy(*rt, options);
    strategy.restore(dir);
    DynamicVariable emb = declare_emb(strategy);
    std::vector<float> got;
    if (strategy.is_ps()) {
      strategy.serve();
    } else {
      ok = ok && strategy.global_step() == step;
      strategy.lookup(emb, probe, got, ps::DynamicLookup::kInference);
      strategy.finish(strategy.restored_position());
    }
    after = from_chief(comm, strategy, got);
  }
  ok = ok && after == before;
  STRATA_EXPECT_ALL(comm.get(), ok);
  barrier(comm);
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
