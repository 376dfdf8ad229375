// Save time and rank 0's peak memory of a dynamic-table checkpoint written by the PS ranks, the two
// ways strata has done it (docs/DYNAMIC.md "Parallel save" figures; a tool, no test):
//   gather:   every rank sends its shard to rank 0 (ps::send_state), which merges them by id
//             (ps::union_of_shards) and writes the file alone (write_dynamic_checkpoint)
//   parallel: every rank writes its own rows into the one file (write_dynamic_checkpoint over the
//             communicator, parallel HDF5)
// Usage (one mode per process, so that each run's peak memory is its own):
//   mpirun -np 2 strata_test_dynamic_save_bench --mode gather|parallel --rows 2000000 --dir DIR
// One table of `rows` rows of 16 floats + an Adagrad slot, split over the ranks by ps::shard_of.
// Prints one JSON line from rank 0: save_s (wall time from a barrier before the save to one after
// it, rename and directory fsync included), rank 0's peak resident memory before the save (its
// shard built) and after it (VmHWM, MiB), and the file's bytes. The file is removed afterwards.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ps/dynamic_checkpoint.h"
#include "ps/dynamic_table.h"
#include "strata/comm/mpi_group.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/common/error.h"

namespace {

double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  return -1;
}

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

int run(int argc, char** argv) {
  std::string mode = "parallel", dir = "/tmp";
  std::int64_t rows = 2000000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mode") mode = argv[i + 1];
    else if (flag == "--rows") rows = std::atoll(argv[i + 1]);
    else if (flag == "--dir") dir = argv[i + 1];
    else throw strata::ConfigError("dynamic_save_bench: unknown flag " + flag);
  }
  if (mode != "parallel" && mode != "gather") throw strata::ConfigError("dynamic_save_bench: --mode parallel|gather");
  if (rows < 1 || rows > (std::int64_t{1} << 30)) throw strata::ConfigError("dynamic_save_bench: --rows out of range");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);

  constexpr std::int64_t kDim = 16;
  strata::ps::DynamicTableSnapshot snap;
  snap.dim = kDim;
  snap.slots.resize(1);
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < rows; ++i) {
    const auto id = static_cast<std::int64_t>(mix(static_cast<std::uint64_t>(i) + 1));
    if (strata::ps::shard_of(id, size) == rank) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  const std::size_t n = ids.size();
  snap.values.resize(n * kDim);
  snap.slots[0].resize(n * kDim);
  for (std::size_t i = 0; i < n * kDim; ++i) {
    snap.values[i] = static_cast<float>(mix(i ^ 0x5555) % 1000) * 1e-3f;
    snap.slots[0][i] = 0.1f;
  }
  snap.stamps.assign(n, 7);
  snap.update_counts.assign(n, 3);
  snap.ids = std::move(ids);
  snap.clock = 7;
  strata::ps::DynamicTableConfig config;
  config.dim = kDim;
  config.optimizer = strata::ps::OptimizerConfig::parse("adagrad:lr=0.1");
  std::vector<strata::checkpoint::DynamicTableState> tables;
  tables.push_back(strata::ps::full_state("emb", config, std::move(snap)));
  strata::checkpoint::DynamicTableState& mine = tables[0];

  const double before = peak_rss_mib();
  MPI_Barrier(comm);
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t bytes = 0;
  if (mode == "parallel") {
    bytes = strata::checkpoint::write_dynamic_checkpoint(comm, dir, 1, tables).file_bytes;
  } else {
    const auto group = strata::comm::make_mpi_group(comm);
    strata::ps::PeerLink link;
    link.group = group.get();
    link.timeout_s = 600;
    link.what = "bench gather";
    if (rank != 0) {
      link.peer = link.blame = 0;
      strata::ps::send_state(mine, link);
    } else {
      std::vector<strata::checkpoint::DynamicTableState> shards;
      shards.push_back(std::move(mine));
      for (int p = 1; p < size; ++p) {
        link.peer = link.blame = p;
        auto t = strata::ps::recv_state(link, kDim, 1, 0);
        t.name = shards[0].name;
        t.kind = shards[0].kind;
        t.optimizer = shards[0].optimizer;
        t.slot_names = shards[0].slot_names;
        shards.push_back(std::move(t));
      }
      const auto u = strata::ps::union_of_shards(std::move(shards));
      bytes = strata::checkpoint::write_dynamic_checkpoint(dir, 1, {u}).file_bytes;
    }
  }
  MPI_Barrier(comm);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank == 0) {
    std::printf("{\"mode\":\"%s\",\"ranks\":%d,\"rows\":%lld,\"save_s\":%.3f,\"rank0_peak_mib_before\":%.1f,"
                "\"rank0_peak_mib\":%.1f,\"file_bytes\":%llu}\n",
                mode.c_str(), size, static_cast<long long>(rows), seconds, before, peak_rss_mib(),
                static_cast<unsigned long long>(bytes));
    std::remove((dir + "/" + strata::checkpoint::dynamic_file_name(1)).c_str());
  }
  MPI_Comm_free(&comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 1;
  try {
    rc = run(argc, argv);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "dynamic_save_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return rc;
}
