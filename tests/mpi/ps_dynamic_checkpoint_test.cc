// Dynamic tables in the PS checkpoint protocol under mpirun (5 ranks): a job of 2 (and one of 3)
// PS and 2 workers trains a dynamic variable and saves at its boundaries, every PS rank writing
// its own rows of each file (a full base, then deltas; one
// save whose dense part fails, whose tables file must go again); jobs of 1, 2 and 3 PS then
// restore at materialisation and hold exactly the live rows of the first job (ids, values, slots,
// stamps, bit for bit), each PS only its shard's ids; a damaged newest file falls back to the
// previous save. Also prints (and bounds) the bytes of a delta against the full save.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "mpi/mpi_test.h"
#include "ps/dynamic_checkpoint.h"
#include "ps/dynamic_table.h"
#include "ps/test_peer.h"
#include "strata/comm/mpi_group.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/cluster/runtime.h"
#include "strata/comm/transport.h"
#include "strata/common/error.h"
#include "strata/ps/parameter_servers.h"

namespace strata::ps {
namespace {

namespace fs = std::filesystem;
using testing::TestComm;

constexpr std::int64_t kDim = 16;
constexpr const char* kVar = "user/emb";
constexpr std::size_t kPool = 20000;

DynamicVariableSpec spec() {
  DynamicVariableSpec s;
  s.name = kVar;
  s.dim = kDim;
  s.max_ids = 2048;
  s.init = Initializer::uniform(-0.5, 0.5, 7);
  return s;
}

std::vector<std::int64_t> pool() {
  std::vector<std::int64_t> out(kPool);
  std::uint64_t x = 0x243F6A8885A308D3ull;
  for (auto& id : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<std::int64_t>(x ^ (x >> 31));
  }
  return out;
}

// Worker w's ids at step t: step 0 every id of its half of the pool (every row is created), later
// steps 400 distinct ids of it (with 2 workers, 4% of the rows a step).
std::vector<std::int64_t> ids_at(const std::vector<std::int64_t>& p, int w, int workers, int t) {
  std::vector<std::int64_t> out;
  for (std::size_t i = static_cast<std::size_t>(w); i < p.size(); i += static_cast<std::size_t>(workers)) out.push_back(p[i]);
  if (t == 0) return out;
  std::vector<std::int64_t> some;
  const std::size_t stride = out.size() / 400;
  for (std::size_t i = 0; i < 400; ++i) some.push_back(out[(i * stride + static_cast<std::size_t>(t) * 13) % out.size()]);
  return some;
}

// A sub-job of the first `n` ranks of `world` with `num_ps` PS ranks (the others wait).
struct SubJob {
  MPI_Comm comm = MPI_COMM_NULL;
  std::unique_ptr<Runtime> runtime;
  explicit SubJob(MPI_Comm world, int n, int num_ps) {
    int rank = 0;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_split(world, rank < n ? 0 : MPI_UNDEFINED, rank, &comm);
    if (comm == MPI_COMM_NULL) return;
    BootstrapOptions options;
    options.resolve.resolver = cluster::ResolverKind::kMpi;
    options.resolve.num_ps = num_ps;
    options.timeout_s = 60;
    runtime = Runtime::bootstrap(comm, Env(), options);
  }
  ~SubJob() {
    runtime.reset();
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  bool in() const { return comm != MPI_COMM_NULL; }
};

checkpoint::DynamicTableState empty_state() {
  checkpoint::DynamicTableState s;
  s.dim = kDim;
  s.slots.resize(1);  // adagrad
  return s;
}

// Collective over `world`: the union on rank 0 of every rank's rows (empty on ranks without any).
checkpoint::DynamicTableState gather_union(MPI_Comm world, const checkpoint::DynamicTableState& mine) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  const auto group = comm::make_mpi_group(world);
  PeerLink link;
  link.group = group.get();
  link.timeout_s = 60;
  link.what = "test gather";
  if (rank != 0) {
    link.peer = link.blame = 0;
    send_state(mine, link);
    return {};
  }
  std::vector<checkpoint::DynamicTableState> all{mine};
  for (int r = 1; r < size; ++r) {
    link.peer = link.blame = r;
    all.push_back(recv_state(link, kDim, 1, 0));
  }
  for (auto& s : all) {
    s.name = "t";
    s.kind = checkpoint::DynamicKind::kFull;
  }
  return union_of_shards(std::move(all));
}

// Every row of `b` equal to `a`'s, bit for bit: "" or the first difference.
std::string compare_rows(const checkpoint::DynamicTableState& a, const checkpoint::DynamicTableState& b) {
  if (a.ids != b.ids) return "ids differ (" + std::to_string(a.ids.size()) + " vs " + std::to_string(b.ids.size()) + ")";
  if (a.stamps != b.stamps) return "stamps differ";
  if (a.update_counts != b.update_counts) return "update counts differ";
  if (a.values.size() != b.values.size() || std::memcmp(a.values.data(), b.values.data(), 4 * a.values.size()) != 0)
    return "values differ";
  for (std::size_t k = 0; k < a.slots.size(); ++k)
    if (a.slots[k].size() != b.slots[k].size() ||
        std::memcmp(a.slots[k].data(), b.slots[k].data(), 4 * a.slots[k].size()) != 0)
      return "slot " + std::to_string(k) + " differs";
  return "";
}

std::string make_dir(MPI_Comm comm, const std::string& tag) { return ::strata::testing::shared_test_dir(comm, "strata_dynsave", tag); }

struct Restored {
  checkpoint::DynamicTableState rows;  // rank 0: the union over the PS ranks
  bool shard_ok = true;                // every PS holds only ids of its shard
  std::int64_t restored_step = -2;     // as PS 0 reports it (rank 0 after the gather)
};

// Collective over `world`: a job of `num_ps` PS + 2 workers restoring from `dir` at `step`.
Restored restore_job(MPI_Comm world, int num_ps, const std::string& dir, std::int64_t step,
                     const std::string& transport) {
  Restored out;
  checkpoint::DynamicTableState mine = empty_state();
  std::int64_t restored_step = -2;
  {
    SubJob job(world, num_ps + 2, num_ps);
    if (job.in()) {
      PsOptions options;
      options.optimizer = OptimizerConfig::parse("adagrad:lr=0.1");
      options.consistency = ConsistencyConfig::parse("sync");
      options.transport = transport;
      options.checkpoint.dynamic_restore_dir = dir;
      options.checkpoint.dynamic_restore_step = step;
      auto ps = ParameterServers::materialize(*job.runtime, options, {}, {spec()});
      if (ps.is_ps()) {
        DynamicTableSnapshot snap = ParameterServersTestPeer::export_dynamic(*ps.server, kVar);
        const int me = ps.server->ps_index();
        for (auto id : snap.ids) out.shard_ok = out.shard_ok && shard_of(id, num_ps) == me;
        if (me == 0) restored_step = ps.server->dynamic_stats(kVar).restored_step;
        DynamicTableConfig config;
        config.dim = kDim;
        config.optimizer = options.optimizer;
        mine = full_state("t", config, std::move(snap));
        ps.server->serve();
      } else {
        ps.client->done();
      }
      ps.endpoint().barrier();
    }
  }
  out.rows = gather_union(world, mine);
  MPI_Allreduce(MPI_IN_PLACE, &restored_step, 1, MPI_INT64_T, MPI_MAX, world);
  out.restored_step = restored_step;
  int ok = out.shard_ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world);
  out.shard_ok = ok != 0;
  return out;
}

// The number of sorted runs (writing PS ranks) of `table` in the file at `path` (FORMAT.md 10.9):
// 1 for a version-1 file.
std::int64_t runs_in(const std::string& path, const std::string& table) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return -1;
  std::int64_t runs = 1;
  const std::string name = "/dynamic/" + table + "/row_runs";
  if (H5Lexists(f, name.c_str(), H5P_DEFAULT) > 0) {
    const hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
    const hid_t space = H5Dget_space(d);
    hsize_t dims[2] = {0, 0};
    H5Sget_simple_extent_dims(space, dims, nullptr);
    runs = static_cast<std::int64_t>(dims[0]);
    H5Sclose(space);
    H5Dclose(d);
  }
  H5Fclose(f);
  return runs;
}

// A job of `save_ps` PS + 2 workers trains and saves (every PS rank writing its own rows of each
// file); jobs of 1, 2 and 3 PS restore it bit-equal; a damaged newest file falls back.
void save_and_restore(const TestComm& comm, int save_ps, const std::string& transport) {
  MPI_Comm world = comm.get();
  const std::string dir = make_dir(world, "chain" + std::to_string(save_ps) + "_" + transport);
  const std::vector<std::int64_t> p = pool();
  // Job A: 2 PS + 2 workers, sync Adagrad, 8 steps. The chief requests saves at the boundaries of
  // steps 0, 2 and 4 (sync: taken two rounds later, at steps 2, 4 and 6): a full base, a delta, a
  // save whose dense part fails (its tables file must go again), then the final save, a delta
  // linked past the failed one.
  std::vector<std::int64_t> saved_steps;  // global steps of the committed saves (chief)
  std::int64_t failed_step = -1;
  checkpoint::DynamicTableState live = empty_state();
  {
    SubJob job(world, save_ps + 2, save_ps);
    if (job.in()) {
      PsOptions options;
      options.optimizer = OptimizerConfig::parse("adagrad:lr=0.1");
      options.consistency = ConsistencyConfig::parse("sync");
      options.transport = transport;
      options.checkpoint.enabled = true;
      options.checkpoint.stop_on_save_error = false;
      options.checkpoint.dynamic_dir = dir;
      options.checkpoint.dynamic_full_every = 8;
      options.checkpoint.save = [](const SaveContext& ctx) {
        // The dense part of the checkpoint: this job has no dense variable; the third save fails
        // as a full disk would, after the tables were written.
        return ctx.save_number == 3 ? SaveStatus::kFailed : SaveStatus::kSaved;
      };
      auto ps = ParameterServers::materialize(*job.runtime, options, {}, {spec()});
      if (ps.is_ps()) {
        ps.server->serve();
        DynamicTableConfig config;
        config.dim = kDim;
        config.optimizer = options.optimizer;
        live = full_state("t", config, ParameterServersTestPeer::export_dynamic(*ps.server, kVar));
      } else {
        PsClient& c = *ps.client;
        const int me = c.worker_index();
        const std::set<int> save_after = {0, 2, 4};
        WorkerPosition pos;
        for (int t = 0; t < 8; ++t) {
          const auto ids = ids_at(p, me, 2, t);
          std::vector<float> rows(ids.size() * kDim), grads(ids.size() * kDim);
          c.lookup_dynamic(kVar, ids.data(), ids.size(), rows.data());
          for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = rows[i] * 0.25f + 0.01f * static_cast<float>(t + me);
          c.update_dynamic(kVar, ids.data(), ids.size(), grads.data(), t + 1);
          c.increment_global_step();
          c.end_step();
          pos.step = t + 1;
          const auto b = c.at_step_boundary(pos);
          if (me == 0 && b.saved) {
            if (b.failed) failed_step = c.global_step();
            else saved_steps.push_back(c.global_step());
          }
          // After joining: the save that lands here is no longer pending, so the next one posts.
          if (me == 0 && save_after.count(t)) c.request_save(false);
        }
        const auto b = c.finish_checkpoints(pos, {});
        if (me == 0 && b.saved && !b.failed && !b.skipped) saved_steps.push_back(c.global_step());
        c.done();
      }
      ps.endpoint().barrier();
    }
  }
  checkpoint::DynamicTableState live_union = gather_union(world, live);
  // The chief tells every rank the steps: committed saves, then the failed one.
  std::int64_t steps[4] = {-1, -1, -1, -1};
  if (!saved_steps.empty()) {
    EXPECT_EQ(saved_steps.size(), 3u);
    for (std::size_t i = 0; i < 3 && i < saved_steps.size(); ++i) steps[i] = saved_steps[i];
    steps[3] = failed_step;
  }
  MPI_Allreduce(MPI_IN_PLACE, steps, 4, MPI_INT64_T, MPI_MAX, world);
  const std::int64_t last = steps[2];
  ASSERT_GT(steps[3], steps[1]) << "the failing save did not fail";
  ASSERT_GT(steps[2], steps[3]);

  if (comm.rank() == 0) {
    // Files: full at the first save, deltas after; none for the failed save.
    EXPECT_EQ(checkpoint::list_dynamic_checkpoints(dir), (std::vector<std::int64_t>{steps[0], steps[1], steps[2]}));
    const auto full = checkpoint::read_dynamic_checkpoint(dir + "/" + checkpoint::dynamic_file_name(steps[0]), false);
    const auto delta = checkpoint::read_dynamic_checkpoint(dir + "/" + checkpoint::dynamic_file_name(steps[1]), false);
    const auto after_failed = checkpoint::read_dynamic_checkpoint(dir + "/" + checkpoint::dynamic_file_name(steps[2]), false);
    ASSERT_EQ(full.tables.size(), 1u);
    EXPECT_EQ(full.tables[0].name, "user-2femb");
    EXPECT_EQ(full.tables[0].kind, checkpoint::DynamicKind::kFull);
    EXPECT_EQ(full.tables[0].total_rows, static_cast<std::int64_t>(kPool));
    EXPECT_EQ(delta.tables[0].kind, checkpoint::DynamicKind::kDelta);
    EXPECT_EQ(delta.tables[0].parent_step, steps[0]);
    // The save after the failed one links past it, to the last committed save.
    EXPECT_EQ(after_failed.tables[0].parent_step, steps[1]);
    // Written by every PS rank: one sorted run each.
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(runs_in(dir + "/" + checkpoint::dynamic_file_name(steps[i]), "user-2femb"), save_ps) << "save " << i;
    // Bytes of a delta (2 steps of 400 ids per worker: at most 8% of the rows) against the full save.
    const double ratio = static_cast<double>(delta.file_bytes) / static_cast<double>(full.file_bytes);
    std::printf("[ figure ] dynamic save, %d PS, %zu rows of %lld floats (adagrad): full %llu bytes, delta with %lld "
                "rows changed (%.1f%%) %llu bytes, ratio %.3f\n",
                save_ps, kPool, static_cast<long long>(kDim), static_cast<unsigned long long>(full.file_bytes),
                static_cast<long long>(delta.tables[0].stored_rows),
                100.0 * static_cast<double>(delta.tables[0].stored_rows) / static_cast<double>(kPool),
                static_cast<unsigned long long>(delta.file_bytes), ratio);
    EXPECT_LE(delta.tables[0].stored_rows, static_cast<std::int64_t>(kPool / 10));
    EXPECT_LE(ratio, 0.2);
  }

  // A crash after a save's tables were committed but before its dense pointer: a tables file of a
  // later step that no checkpoint names. A restore at the committed step never uses it.
  if (comm.rank() == 0)
    fs::copy_file(dir + "/" + checkpoint::dynamic_file_name(steps[0]), dir + "/" + checkpoint::dynamic_file_name(last + 2));
  MPI_Barrier(world);
  // Restores of the last save onto 1, 2 and 3 PS: every live row, bit for bit.
  for (const int k : {1, 2, 3}) {
    Restored r = restore_job(world, k, dir, last, transport);
    EXPECT_TRUE(r.shard_ok) << k << " PS: a PS holds an id of another shard";
    EXPECT_EQ(r.restored_step, last) << k << " PS";
    if (comm.rank() == 0) {
      EXPECT_EQ(r.rows.ids.size(), kPool) << k << " PS";
      EXPECT_EQ(compare_rows(live_union, r.rows), "") << k << " PS";
    }
  }

  // A damaged newest file: the restore falls back to the previous save, whose chain is intact.
  if (comm.rank() == 0) {
    const std::string path = dir + "/" + checkpoint::dynamic_file_name(last);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(path) / 2));
    char byte = 0;
    f.read(&byte, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(path) / 2));
    byte = static_cast<char>(byte ^ 0x5a);
    f.write(&byte, 1);
  }
  MPI_Barrier(world);
  Restored r = restore_job(world, 2, dir, last, transport);
  EXPECT_EQ(r.restored_step, steps[1]);
  if (comm.rank() == 0) {
    const auto want = checkpoint::restore_dynamic_table(dir, "user-2femb", last);
    EXPECT_EQ(want.step, steps[1]);
    EXPECT_NE(want.warning, "");
    EXPECT_EQ(compare_rows(want.state, r.rows), "");
    // And that state is not the live one (the last steps changed rows).
    EXPECT_NE(compare_rows(live_union, r.rows), "");
  }
  MPI_Barrier(world);
  if (comm.rank() == 0 && std::getenv("STRATA_KEEP_TEST_FILES") == nullptr) fs::remove_all(dir);
}

class DynamicCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(DynamicCheckpoint, SaveAtTwoPsRestoreAtOneTwoThree) {
  TestComm comm;
  if (comm.size() < 5) GTEST_SKIP() << "needs 5 ranks (2 PS + 2 workers, then 3 PS + 2 workers)";
  save_and_restore(comm, 2, GetParam());
}

// Three PS ranks write each file together (over the first compiled transport: the save's
// communication is MPI-IO's whatever the data plane).
TEST(DynamicCheckpointThreePs, SaveAtThreePsRestoreAtOneTwoThree) {
  TestComm comm;
  if (comm.size() < 5) GTEST_SKIP() << "needs 5 ranks (3 PS + 2 workers)";
  save_and_restore(comm, 3, strata::comm::compiled_transports().at(0));
}

INSTANTIATE_TEST_SUITE_P(Compiled, DynamicCheckpoint, ::testing::ValuesIn(strata::comm::compiled_transports()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace strata::ps
