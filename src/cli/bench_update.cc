#include "cli/bench_update.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "cli/bench_json.h"
#include "cli/bench_link.h"
#include "cli/commands.h"
#include "strata/cluster/runtime.h"
#include "strata/common/error.h"
#include "strata/ps/parameter_servers.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct UpdateRow {
  std::uint64_t bytes = 0;
  double t_avg = 0, t_max = 0;  // microseconds per update, over workers
  double link = 0;              // GB/s of the raw TCP push at this size (between nodes only)
  std::int64_t wrong = 0;       // updates the PS applied minus updates the workers pushed
};

}  // namespace

int run_update_bench(const UpdateBenchConfig& cfg, const Runtime& rt) {
  MPI_Comm comm = rt.comms().runtime();
  const int rank = rt.rank();
  const int num_ps = rt.count_role(Role::kPs);
  const int workers = rt.size() - num_ps;
  if (num_ps < 1 || workers < 1) throw ConfigError("--op update needs at least one PS and one worker rank");
  // Worker 0's PS is PS 0 (one unpartitioned variable lives there); are they on different nodes?
  int leader = rank;
  {
    MPI_Comm node;
    STRATA_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node));
    MPI_Comm_free(&node);
  }
  std::vector<int> leaders(rt.size());
  STRATA_CHECK_MPI(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm));
  const bool remote = leaders[0] != leaders[num_ps];

  ps::PsOptions options;
  options.optimizer = ps::OptimizerConfig::parse(cfg.optimizer);
  options.transport = cfg.transport;
  options.timeout_s = cfg.timeout_s;
  options.apply_threads = cfg.ps_threads;
  std::vector<UpdateRow> rows;
  std::string transport;
  for (std::uint64_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= cfg.factor) {
    ps::VariableSpec spec;
    spec.name = "bench/w";
    spec.shape = {static_cast<std::int64_t>(bytes / sizeof(float))};
    spec.init = ps::Initializer::constant(0.5);
    auto servers = std::make_unique<ps::ParameterServers>(ps::ParameterServers::materialize(rt, options, {spec}));
    transport = servers->endpoint().transport_description();
    double mine = 0;
    std::int64_t applied = 0;
    if (ps::PsServer* server = servers->server.get()) {
      server->serve();
      applied = server->applied_updates();
    } else if (servers->client) {
      ps::PsClient& client = *servers->client;
      std::vector<float> grad(bytes / sizeof(float), 1e-3f);
      auto update = [&] {
        client.push(spec.name, grad.data(), bytes);
        client.wait_applied();
      };
      for (int i = 0; i < cfg.warmup; ++i) update();
      const auto t0 = Clock::now();
      for (int i = 0; i < cfg.iters; ++i) update();
      mine = std::chrono::duration<double>(Clock::now() - t0).count() * 1e6 / cfg.iters;
      client.done();
    }
    servers->endpoint().barrier();
    // SGD pushes are accumulates that never pass the service loop: count them as applied.
    const bool through_loop = options.optimizer.kind != ps::OptimizerKind::kSgd;
    double sum = 0, worst = 0;
    STRATA_CHECK_MPI(MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, comm));
    STRATA_CHECK_MPI(MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, comm));
    std::int64_t total_applied = 0;
    STRATA_CHECK_MPI(MPI_Allreduce(&applied, &total_applied, 1, MPI_INT64_T, MPI_SUM, comm));
    servers.reset();
    UpdateRow row;
    row.bytes = bytes;
    row.t_avg = sum / workers;
    row.t_max = worst;
    if (through_loop)
      row.wrong = std::llabs(total_applied - static_cast<std::int64_t>(cfg.warmup + cfg.iters) * workers);
    if (remote) {
      const LinkTimes lt = measure_link(comm, 0, num_ps, bytes, cfg.warmup, cfg.iters, cfg.timeout_s);
      row.link = static_cast<double>(bytes) / (lt.push_us * 1e3);
    }
    rows.push_back(row);
    if (cfg.factor == 1) break;
  }

  int status = kExitOk;
  if (rank == 0) {
    std::ostringstream os;
    os << "# strata bench: op update (push + optimizer applied on the PS + ack), optimizer " << cfg.optimizer << ", "
       << num_ps << " PS + " << workers << " worker(s), --ps-threads " << cfg.ps_threads << ", warmup " << cfg.warmup
       << ", iters " << cfg.iters << "\n";
    os << "# transport: " << transport << "\n";
    os << "# time_us: average over workers of one push that returns once the PS applied it; algbw = size / time_us"
       << (remote ? "; link: raw TCP push (size bytes, 8-byte ack) between the same ranks, same run" : "") << "\n";
    os << std::setw(12) << "size" << std::setw(12) << "time_us" << std::setw(10) << "algbw" << std::setw(8) << "#wrong"
       << std::setw(12) << "max_us";
    if (remote) os << std::setw(10) << "link" << std::setw(9) << "vs_link";
    os << "\n";
    nlohmann::json json_rows = nlohmann::json::array();
    std::int64_t wrong = 0;
    for (const auto& r : rows) {
      const double algbw = static_cast<double>(r.bytes) / (r.t_avg * 1e3);
      const double vs_link = r.link > 0 ? algbw / r.link : 0;
      os << std::setw(12) << r.bytes << std::fixed << std::setprecision(2) << std::setw(12) << r.t_avg << std::setw(10)
         << algbw << std::setw(8) << r.wrong << std::setw(12) << r.t_max;
      if (remote) os << std::setw(10) << r.link << std::setw(9) << vs_link;
      os << "\n";
      wrong += r.wrong;
      json_rows.push_back({{"op", "update"}, {"optimizer", cfg.optimizer}, {"bytes", r.bytes}, {"time_us", r.t_avg},
                           {"time_us_max", r.t_max}, {"algbw_GBps", algbw}, {"link_GBps", r.link},
                           {"vs_link", vs_link}, {"wrong", r.wrong}});
    }
    os << "# " << (wrong == 0 ? "every update applied exactly once" : std::to_string(wrong) + " update(s) missing or extra")
       << "\n";
    std::cout << os.str() << std::flush;
    if (wrong != 0) status = kExitFailure;
    if (!write_bench_rows(cfg.json_path, json_rows)) status = kExitFailure;
  }
  STRATA_CHECK_MPI(MPI_Bcast(&status, 1, MPI_INT, 0, comm));
  return status;
}

}  // namespace strata::cli
