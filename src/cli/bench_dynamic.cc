// `strata bench --op dynamic`: the PS-side rates of a dynamic embedding table (bench_dynamic.h).
//
// Ids follow a Zipf law, as recommendation ids do: rank r in [0, rows) is drawn with probability
// about proportional to (r + 1)^-s (inversion of the continuous power law's CDF, then floor), and
// rank r maps to id mix64(r ^ kIdSalt) >> 24, a scattered id in a 2^40 space (so the hot ids are
// not small numbers next to each other). Ids, gradients and expected rows are computed outside the
// timed calls; only the table's own calls are timed.
#include "cli/bench_dynamic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "cli/bench_checkpoint.h"
#include "cli/bench_json.h"
#include "cli/bench_link.h"
#include "ps/apply_team.h"
#include "ps/dynamic_table.h"
#include "strata/cluster/resolve.h"
#include "strata/cluster/runtime.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"
#include "strata/ps/optimizer.h"
#include "strata/ps/parameter_servers.h"
#include "strata/ps/variable.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kIdSalt = 0x2545f4914f6cdd1dull;
constexpr std::uint64_t kDrawSalt = 0x9fb21c651e98df25ull;

std::int64_t id_of_rank(std::uint64_t rank) { return static_cast<std::int64_t>(ps::dynamic_mix64(rank ^ kIdSalt) >> 24); }

// Zipf ranks from a counter-based stream: draw k of `stream` is a pure function of (stream, k).
class ZipfDraws {
 public:
  ZipfDraws(std::int64_t support, double s) : support_(support), s_(s) {
    top_ = std::pow(static_cast<double>(support) + 1.0, 1.0 - s) - 1.0;
  }
  std::uint64_t rank(std::uint64_t stream, std::uint64_t k) const {
    const std::uint64_t bits = ps::dynamic_mix64(ps::dynamic_mix64(stream ^ kDrawSalt) + k);
    const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;
    const double x = std::pow(1.0 + u * top_, 1.0 / (1.0 - s_));  // in [1, support + 1)
    const auto r = static_cast<std::int64_t>(x) - 1;
    return static_cast<std::uint64_t>(std::clamp<std::int64_t>(r, 0, support_ - 1));
  }

 private:
  std::int64_t support_;
  double s_;
  double top_;
};

struct Phase {
  const char* name;
  std::int64_t ops = 0;
  double seconds = 0;      // wall clock of the table's calls
  double cpu_seconds = 0;  // this thread's CPU time in them: the rate per core on a busy machine too
  std::int64_t wrong = 0;
  double bytes_per_row = 0;
};

// A reference row of the update phase, updated with apply_dense outside the table.
struct RefRow {
  std::vector<float> v;
  std::vector<std::vector<float>> slots;
};

// Wall and CPU time of one call, added to a phase when `timed`. The CPU time is the process's: the
// table's calls run on this thread and, split (--ps-threads), on its team's, and nothing else runs.
class Timer {
 public:
  Timer() : wall_(Clock::now()), cpu_(process_cpu()) {}
  void add_to(Phase& p, std::int64_t ops, bool timed = true) const {
    const double wall = std::chrono::duration<double>(Clock::now() - wall_).count(), cpu = process_cpu() - cpu_;
    if (!timed) return;
    p.seconds += wall;
    p.cpu_seconds += cpu;
    p.ops += ops;
  }

 private:
  static double process_cpu() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  Clock::time_point wall_;
  double cpu_;
};

}  // namespace

int run_dynamic_bench(const DynamicBenchConfig& cfg) {
  ps::DynamicTableConfig tc;
  tc.dim = cfg.dim;
  tc.init = ps::Initializer::uniform(-0.05, 0.05, 2024);  // Keras Embedding's default range
  tc.optimizer = ps::OptimizerConfig::parse(cfg.optimizer);
  tc.capacity = cfg.rows;  // every id fits: the phases measure lookups and inserts, not eviction
  tc.validate();
  const auto dim = static_cast<std::size_t>(cfg.dim);
  const auto batch = static_cast<std::size_t>(cfg.batch);
  const int slots = ps::num_slots(tc.optimizer.kind);
  const std::uint64_t row_bytes = dim * sizeof(float) * static_cast<std::uint64_t>(1 + slots);
  // The table (record + index), at worst a reference copy of every row for the update check, and
  // a few batch-sized buffers (rows out, gradients, the table's sums).
  const std::uint64_t need = static_cast<std::uint64_t>(cfg.rows) * (row_bytes + 32) * 2 + batch * (8 + dim * 4) * 4;
  const std::uint64_t avail = mem_available_bytes();
  if (avail > 0 && need > avail * 8 / 10)
    throw ConfigError("--rows " + std::to_string(cfg.rows) + " with --row-elems " + std::to_string(cfg.dim) +
                      " needs about " + std::to_string(need >> 20) + " MiB of memory for --op dynamic; " +
                      std::to_string(avail >> 20) + " MiB are available");

  ps::DynamicTable table(tc);
  std::unique_ptr<ps::ApplyTeam> team;
  if (cfg.ps_threads > 1) {
    team = std::make_unique<ps::ApplyTeam>(cfg.ps_threads);
    table.use_team(team.get());
  }
  const ZipfDraws zipf(cfg.rows, cfg.zipf_s);
  std::vector<float> out(batch * dim), want(dim);
  ps::Initializer init = tc.init;
  auto expected_row = [&](std::int64_t id, float* row) {
    init.seed = ps::row_seed(tc.init.seed, id);
    ps::fill(init, ps::DType::kF32, {1, cfg.dim}, 0, 1, row);
  };
  // Rows of `got` (n rows) that differ from their ids' initial rows.
  auto wrong_initial = [&](const std::vector<std::int64_t>& ids, const float* got) {
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      expected_row(ids[i], want.data());
      wrong += std::memcmp(want.data(), got + i * dim, dim * sizeof(float)) != 0;
    }
    return wrong;
  };
  auto bytes_per_row = [&] {
    const ps::DynamicTableStats s = table.stats();
    return s.rows > 0 ? static_cast<double>(s.bytes) / static_cast<double>(s.rows) : 0.0;
  };

  // ---- insert: every id of the support once, hottest first ----
  Phase insert{"insert"};
  std::vector<std::int64_t> ids(batch);
  for (std::int64_t begin = 0; begin < cfg.rows; begin += cfg.batch) {
    const auto n = static_cast<std::size_t>(std::min<std::int64_t>(cfg.batch, cfg.rows - begin));
    ids.resize(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = id_of_rank(static_cast<std::uint64_t>(begin) + i);
    const Timer timer;
    table.lookup(ids.data(), n, out.data());
    timer.add_to(insert, static_cast<std::int64_t>(n));
    insert.wrong += wrong_initial(ids, out.data());
  }
  // Two ranks may share an id (40-bit ids): the table holds the distinct ones.
  insert.bytes_per_row = bytes_per_row();

  // ---- lookup: Zipf batches of present ids ----
  Phase lookup{"lookup"};
  ids.resize(batch);
  for (int b = 0; b < cfg.warmup + cfg.iters; ++b) {
    for (std::size_t i = 0; i < batch; ++i) ids[i] = id_of_rank(zipf.rank(1, static_cast<std::uint64_t>(b) * batch + i));
    const Timer timer;
    table.lookup(ids.data(), batch, out.data());
    timer.add_to(lookup, static_cast<std::int64_t>(batch), b >= cfg.warmup);
    lookup.wrong += wrong_initial(ids, out.data());
  }
  lookup.bytes_per_row = bytes_per_row();
  const std::int64_t admitted_before_updates = table.stats().admitted;

  // ---- update: Zipf batches of gradients through the optimizer, checked against apply_dense ----
  Phase update{"update"};
  std::unordered_map<std::int64_t, RefRow> ref;
  std::vector<float> grads(batch * dim);
  std::unordered_map<std::int64_t, std::vector<float>> sums;
  std::vector<std::int64_t> order;
  for (int b = 0; b < cfg.warmup + cfg.iters; ++b) {
    const std::int64_t step = b + 1;
    for (std::size_t i = 0; i < batch; ++i) ids[i] = id_of_rank(zipf.rank(2, static_cast<std::uint64_t>(b) * batch + i));
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const std::uint64_t bits = ps::dynamic_mix64(static_cast<std::uint64_t>(b) * grads.size() + i + 0x5eed);
      grads[i] = static_cast<float>(static_cast<double>(bits >> 40) * 0x1.0p-24 - 0.5) * 0.1f;
    }
    const Timer timer;
    table.apply(ids.data(), batch, grads.data(), step);
    timer.add_to(update, static_cast<std::int64_t>(batch), b >= cfg.warmup);
    // The reference: per distinct id, its gradients summed in order of appearance, one update.
    sums.clear();
    order.clear();
    for (std::size_t i = 0; i < batch; ++i) {
      auto [it, fresh] = sums.try_emplace(ids[i], grads.begin() + static_cast<std::ptrdiff_t>(i * dim),
                                          grads.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim));
      if (fresh) {
        order.push_back(ids[i]);
      } else {
        for (std::size_t k = 0; k < dim; ++k) it->second[k] += grads[i * dim + k];
      }
    }
    for (std::int64_t id : order) {
      auto [it, fresh] = ref.try_emplace(id);
      RefRow& r = it->second;
      if (fresh) {
        r.v.resize(dim);
        expected_row(id, r.v.data());
        for (int k = 0; k < slots; ++k) r.slots.emplace_back(dim, static_cast<float>(ps::slot_initial_value(tc.optimizer, k)));
      }
      std::vector<float*> slot_ptrs;
      for (auto& s : r.slots) slot_ptrs.push_back(s.data());
      ps::apply_dense(tc.optimizer, step, r.v.data(), slot_ptrs.data(), sums[id].data(), dim);
    }
  }
  {
    const ps::DynamicTableSnapshot snap = table.export_rows();
    for (std::size_t i = 0; i < snap.ids.size(); ++i) {
      auto it = ref.find(snap.ids[i]);
      if (it == ref.end()) continue;
      bool bad = std::memcmp(it->second.v.data(), &snap.values[i * dim], dim * sizeof(float)) != 0;
      for (int k = 0; k < slots; ++k)
        bad |= std::memcmp(it->second.slots[static_cast<std::size_t>(k)].data(),
                           &snap.slots[static_cast<std::size_t>(k)][i * dim], dim * sizeof(float)) != 0;
      update.wrong += bad;
    }
    // Every updated id must have a row, and the updates must not have created any (all present).
    std::int64_t present = 0;
    for (const auto& [id, r] : ref) present += std::binary_search(snap.ids.begin(), snap.ids.end(), id);
    update.wrong += static_cast<std::int64_t>(ref.size()) - present;
    update.wrong += table.stats().admitted - admitted_before_updates;
  }
  update.bytes_per_row = bytes_per_row();

  const ps::DynamicTableStats st = table.stats();
  std::ostringstream os;
  os << "# strata bench: op dynamic (PS-side dynamic embedding table, "
     << (cfg.ps_threads > 1 ? std::to_string(cfg.ps_threads) + " threads (--ps-threads)" : std::string("one thread"))
     << "), " << cfg.dim << "-float rows, optimizer "
     << cfg.optimizer << ", " << cfg.rows << " ids (Zipf s=" << cfg.zipf_s << ", 40-bit ids), batches of " << cfg.batch
     << ", warmup " << cfg.warmup << ", iters " << cfg.iters << "\n";
  os << "# insert: each id looked up once (rows created from the initializer); lookup: Zipf batches of present ids; "
        "update: Zipf batches of gradients (duplicates summed), step = batch number\n";
  os << "# Mops_s: million ids per second of the table's calls alone (wall clock); Mops_cpu: per second of the "
        "process's CPU time in them (every thread of the table); bytes_per_row: the table's memory / rows; vs_values: bytes_per_row / the "
     << row_bytes << " bytes of a row's values and slots\n";
  os << std::setw(10) << "operation" << std::setw(12) << "ops" << std::setw(10) << "time_s" << std::setw(11) << "Mops_s"
     << std::setw(8) << "#wrong" << std::setw(15) << "bytes_per_row" << std::setw(11) << "vs_values" << std::setw(10)
     << "Mops_cpu" << "\n";
  nlohmann::json json_rows = nlohmann::json::array();
  std::int64_t wrong = 0;
  for (const Phase* p : {&insert, &lookup, &update}) {
    const double ops_per_s = p->seconds > 0 ? static_cast<double>(p->ops) / p->seconds : 0.0;
    const double vs_values = p->bytes_per_row / static_cast<double>(row_bytes);
    const double ops_per_cpu_s = p->cpu_seconds > 0 ? static_cast<double>(p->ops) / p->cpu_seconds : 0.0;
    os << std::setw(10) << p->name << std::setw(12) << p->ops << std::fixed << std::setprecision(3) << std::setw(10)
       << p->seconds << std::setw(11) << ops_per_s / 1e6 << std::setw(8) << p->wrong << std::setprecision(1)
       << std::setw(15) << p->bytes_per_row << std::setprecision(3) << std::setw(11) << vs_values << std::setw(10)
       << ops_per_cpu_s / 1e6 << "\n";
    wrong += p->wrong;
    json_rows.push_back({{"op", "dynamic"},
                         {"operation", p->name},
                         {"ops", p->ops},
                         {"seconds", p->seconds},
                         {"ops_per_s", ops_per_s},
                         {"cpu_seconds", p->cpu_seconds},
                         {"ops_per_cpu_s", ops_per_cpu_s},
                         {"wrong", p->wrong},
                         {"bytes_per_row", p->bytes_per_row},
                         {"row_bytes", row_bytes},
                         {"vs_values", vs_values},
                         {"rows", st.rows},
                         {"dim", cfg.dim},
                         {"batch", cfg.batch},
                         {"optimizer", cfg.optimizer},
                         {"ps_threads", cfg.ps_threads},
                         {"zipf_s", cfg.zipf_s}});
  }
  os << "# table: " << st.rows << " rows, " << st.admitted << " admitted, " << st.updates << " row updates, "
     << (st.bytes >> 20) << " MiB\n";
  os << "# " << (wrong == 0 ? "all results correct" : std::to_string(wrong) + " wrong row(s)") << "\n";
  std::cout << os.str() << std::flush;
  int status = wrong == 0 ? kExitOk : kExitFailure;
  if (!write_bench_rows(cfg.json_path, json_rows)) status = kExitFailure;
  return status;
}

// ---- the data plane under mpirun ----------------------------------------------------------------

namespace {

struct PlanePhase {
  const char* name;
  std::int64_t ops = 0;    // ids, duplicates included, this worker (summed over workers below)
  std::int64_t calls = 0;  // timed calls
  std::int64_t distinct = 0;  // distinct ids of the timed calls (what crosses the network and the PS serves)
  double seconds = 0;      // wall clock of the timed calls
  std::int64_t wrong = 0;
  double link_us = 0;      // raw TCP round trip of the same bytes (between nodes)
  // Per side, what the wall clock hides on a shared machine: the calling worker thread's CPU time
  // in the timed calls (deduplication, packing, the kernel's sends and receives, the caller's
  // rows), and the PS threads' time in the table per request (summed over PS ranks; lookups and
  // updates only, see DynamicShardStats).
  double client_cpu_s = 0;
  double ps_table_s = 0;
  std::int64_t ps_requests = 0;
};

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int run_dynamic_plane_bench(const DynamicBenchConfig& cfg, int* argc, char*** argv) {
  MpiSession mpi(argc, argv);
  BootstrapOptions boot;
  boot.resolve.resolver = cluster::ResolverKind::kMpi;
  boot.resolve.num_ps = cfg.num_ps;
  boot.timeout_s = cfg.timeout_s;
  std::unique_ptr<Runtime> rt;
  try {
    rt = Runtime::bootstrap(MPI_COMM_WORLD, Env::from_process(), boot);
  } catch (const ConfigError& e) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_rank == 0) std::fprintf(stderr, "strata bench: error: %s\n", e.message().c_str());
    return kExitUsage;
  }
  MPI_Comm comm = rt->comms().runtime();
  const int rank = rt->rank();
  const int num_ps = rt->count_role(Role::kPs);
  const int workers = rt->size() - num_ps;
  if (num_ps < 1 || workers < 1) {
    if (rank == 0) std::fprintf(stderr, "strata bench: error: --op dynamic under mpirun needs a PS and a worker rank\n");
    return kExitUsage;
  }
  // Worker 0 (rank num_ps under the mpi resolver) and PS 0 (rank 0) on different nodes?
  bool remote = false;
  {
    MPI_Comm node;
    STRATA_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    int leader = rank;
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node));
    MPI_Comm_free(&node);
    std::vector<int> leaders(static_cast<std::size_t>(rt->size()));
    STRATA_CHECK_MPI(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm));
    remote = leaders[0] != leaders[static_cast<std::size_t>(num_ps)];
  }
  const bool is_worker = rt->role() == Role::kChief || rt->role() == Role::kWorker;
  MPI_Comm worker_comm = MPI_COMM_NULL;  // the workers' barrier between phases
  STRATA_CHECK_MPI(MPI_Comm_split(comm, is_worker ? 1 : MPI_UNDEFINED, rank, &worker_comm));

  ps::PsOptions options;
  options.transport = cfg.transport;
  options.timeout_s = cfg.timeout_s;
  options.apply_threads = cfg.ps_threads;
  ps::DynamicVariableSpec spec;
  spec.name = "bench/emb";
  spec.dim = cfg.dim;
  spec.init = ps::Initializer::uniform(-0.05, 0.05, 2024);
  spec.capacity = std::min<std::int64_t>(ps::DynamicTableConfig::kMaxCapacity, cfg.rows + 1);
  spec.max_ids = std::min<std::int64_t>(cfg.batch, ps::DynamicVariableSpec::kMaxIds);
  std::unique_ptr<ps::ParameterServers> servers;
  try {
    options.optimizer = ps::OptimizerConfig::parse(cfg.optimizer);
    servers = std::make_unique<ps::ParameterServers>(ps::ParameterServers::materialize(*rt, options, {}, {spec}));
  } catch (const ConfigError& e) {
    if (rank == 0) std::fprintf(stderr, "strata bench: error: %s\n", e.message().c_str());
    if (worker_comm != MPI_COMM_NULL) MPI_Comm_free(&worker_comm);
    return kExitUsage;
  }
  const std::string transport = servers->endpoint().transport_description();
  const auto dim = static_cast<std::size_t>(cfg.dim);
  const auto batch = static_cast<std::size_t>(cfg.batch);
  PlanePhase insert{"insert"}, lookup{"lookup"}, update{"update"};
  std::int64_t expected_updates = 0, ps_updates = 0, rejected = 0, ps_split = 0;
  if (ps::PsServer* server = servers->server.get()) {
    server->serve();
    const ps::DynamicShardStats st = server->dynamic_stats(spec.name);
    ps_updates = st.updates;
    rejected = st.rejected_lookups + st.rejected_updates + st.rejected_full;
    lookup.ps_table_s = st.lookup_s;
    lookup.ps_requests = st.lookup_requests;
    update.ps_table_s = st.update_s;
    update.ps_requests = st.update_requests;
    ps_split = st.split_batches;
  } else if (ps::PsClient* client = servers->client.get()) {
    const int me = client->worker_index();
    const ZipfDraws zipf(cfg.rows, cfg.zipf_s);
    std::vector<std::int64_t> ids(batch);
    std::vector<float> out(batch * dim), want(dim), grads(batch * dim);
    ps::Initializer init = spec.init;
    auto wrong_initial = [&](std::size_t n) {
      std::int64_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        init.seed = ps::row_seed(spec.init.seed, ids[i]);
        ps::fill(init, ps::DType::kF32, {1, cfg.dim}, 0, 1, want.data());
        wrong += std::memcmp(want.data(), out.data() + i * dim, dim * sizeof(float)) != 0;
      }
      return wrong;
    };
    std::vector<std::int64_t> sorted;
    auto timed = [&](PlanePhase& p, std::int64_t n, const auto& call) {
      const auto t0 = Clock::now();
      const double cpu0 = thread_cpu_s();
      call();
      p.client_cpu_s += thread_cpu_s() - cpu0;
      p.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      p.ops += n;
      ++p.calls;
      sorted.assign(ids.begin(), ids.begin() + n);
      std::sort(sorted.begin(), sorted.end());
      p.distinct += std::unique(sorted.begin(), sorted.end()) - sorted.begin();
    };
    // insert: this worker's share of the support, batch by batch
    std::int64_t k = 0;
    for (std::int64_t begin = 0; begin < cfg.rows; begin += cfg.batch, ++k) {
      if (k % workers != me) continue;
      const auto n = static_cast<std::size_t>(std::min<std::int64_t>(cfg.batch, cfg.rows - begin));
      for (std::size_t i = 0; i < n; ++i) ids[i] = id_of_rank(static_cast<std::uint64_t>(begin) + i);
      timed(insert, static_cast<std::int64_t>(n), [&] { client->lookup_dynamic(spec.name, ids.data(), n, out.data()); });
      insert.wrong += wrong_initial(n);
    }
    STRATA_CHECK_MPI(MPI_Barrier(worker_comm));
    // lookup: Zipf batches of present ids
    for (int b = 0; b < cfg.warmup + cfg.iters; ++b) {
      for (std::size_t i = 0; i < batch; ++i)
        ids[i] = id_of_rank(zipf.rank(1 + 1000 * static_cast<std::uint64_t>(me), static_cast<std::uint64_t>(b) * batch + i));
      if (b >= cfg.warmup)
        timed(lookup, cfg.batch, [&] { client->lookup_dynamic(spec.name, ids.data(), batch, out.data()); });
      else
        client->lookup_dynamic(spec.name, ids.data(), batch, out.data());
      lookup.wrong += wrong_initial(batch);
    }
    STRATA_CHECK_MPI(MPI_Barrier(worker_comm));
    // update: Zipf batches of gradients; every distinct id of a batch is one row update on its PS
    for (int b = 0; b < cfg.warmup + cfg.iters; ++b) {
      for (std::size_t i = 0; i < batch; ++i)
        ids[i] = id_of_rank(zipf.rank(2 + 1000 * static_cast<std::uint64_t>(me), static_cast<std::uint64_t>(b) * batch + i));
      for (std::size_t i = 0; i < grads.size(); ++i)
        grads[i] = static_cast<float>(static_cast<double>(ps::dynamic_mix64(static_cast<std::uint64_t>(b) * grads.size() + i) >> 40) * 0x1.0p-24 - 0.5) * 0.1f;
      if (b >= cfg.warmup)
        timed(update, cfg.batch, [&] { client->update_dynamic(spec.name, ids.data(), batch, grads.data(), b + 1); });
      else
        client->update_dynamic(spec.name, ids.data(), batch, grads.data(), b + 1);
      std::vector<std::int64_t> sorted(ids);
      std::sort(sorted.begin(), sorted.end());
      expected_updates += std::unique(sorted.begin(), sorted.end()) - sorted.begin();
    }
    client->done();
  }
  servers->endpoint().barrier();
  servers.reset();
  if (worker_comm != MPI_COMM_NULL) MPI_Comm_free(&worker_comm);
  // Sums over the workers (and the PS ranks' counters).
  for (PlanePhase* p : {&insert, &lookup, &update}) {
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &p->ops, 1, MPI_INT64_T, MPI_SUM, comm));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &p->calls, 1, MPI_INT64_T, MPI_SUM, comm));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &p->distinct, 1, MPI_INT64_T, MPI_SUM, comm));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &p->seconds, 1, MPI_DOUBLE, MPI_SUM, comm));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &p->wrong, 1, MPI_INT64_T, MPI_SUM, comm));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &p->client_cpu_s, 1, MPI_DOUBLE, MPI_SUM, comm));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &p->ps_table_s, 1, MPI_DOUBLE, MPI_SUM, comm));
    STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &p->ps_requests, 1, MPI_INT64_T, MPI_SUM, comm));
  }
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &expected_updates, 1, MPI_INT64_T, MPI_SUM, comm));
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &ps_updates, 1, MPI_INT64_T, MPI_SUM, comm));
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &rejected, 1, MPI_INT64_T, MPI_SUM, comm));
  STRATA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &ps_split, 1, MPI_INT64_T, MPI_SUM, comm));
  update.wrong += std::llabs(ps_updates - expected_updates) + rejected;
  const std::uint64_t row_bytes = batch * dim * sizeof(float);  // the rows one call carries
  if (remote) {
    const LinkTimes lt = measure_link(comm, 0, num_ps, row_bytes, cfg.warmup, cfg.iters, cfg.timeout_s);
    insert.link_us = lookup.link_us = lt.pull_us;
    update.link_us = lt.push_us;
  }

  int status = kExitOk;
  if (rank == 0) {
    std::ostringstream os;
    os << "# strata bench: op dynamic (data plane: lookups and updates by id), " << num_ps << " PS + " << workers
       << " worker(s), " << cfg.dim << "-float rows, optimizer " << cfg.optimizer << ", " << cfg.rows
       << " ids (Zipf s=" << cfg.zipf_s << "), batches of " << cfg.batch << ", warmup " << cfg.warmup << ", iters "
       << cfg.iters << "\n";
    os << "# transport: " << transport << "\n";
    os << "# time_us: one call of a batch (deduplicated, grouped per PS; a lookup returns with the rows, an update "
          "once applied), averaged over calls and workers; distinct: distinct ids per call; algbw: the batch's row bytes / "
          "time_us"
       << (remote ? "; link: raw TCP of the same bytes between the same ranks, same run (pull shape for lookups, "
                    "push shape for updates)"
                  : "")
       << "\n";
    os << std::setw(10) << "operation" << std::setw(12) << "ids" << std::setw(12) << "time_us" << std::setw(11)
       << "Mops_s" << std::setw(10) << "distinct" << std::setw(10) << "algbw" << std::setw(8) << "#wrong";
    if (remote) os << std::setw(10) << "link" << std::setw(9) << "vs_link";
    os << "\n";
    nlohmann::json json_rows = nlohmann::json::array();
    std::int64_t wrong = 0;
    for (const PlanePhase* p : {&insert, &lookup, &update}) {
      const double time_us = p->calls > 0 ? p->seconds * 1e6 / static_cast<double>(p->calls) : 0.0;
      // ids per second of the job: every worker's ids over the mean worker's time
      const double ops_per_s =
          p->seconds > 0 ? static_cast<double>(p->ops) / (p->seconds / static_cast<double>(workers)) : 0.0;
      const double algbw = time_us > 0 ? static_cast<double>(row_bytes) / (time_us * 1e3) : 0.0;
      const double link = p->link_us > 0 ? static_cast<double>(row_bytes) / (p->link_us * 1e3) : 0.0;
      const double vs_link = link > 0 ? algbw / link : 0.0;
      const double distinct = p->calls > 0 ? static_cast<double>(p->distinct) / static_cast<double>(p->calls) : 0.0;
      os << std::setw(10) << p->name << std::setw(12) << p->ops << std::fixed << std::setprecision(2) << std::setw(12)
         << time_us << std::setprecision(3) << std::setw(11) << ops_per_s / 1e6 << std::setprecision(0) << std::setw(10)
         << distinct << std::setprecision(2) << std::setw(10) << algbw << std::setw(8) << p->wrong;
      if (remote) os << std::setw(10) << link << std::setw(9) << vs_link;
      os << "\n";
      wrong += p->wrong;
      nlohmann::json row = {{"op", "dynamic"},
                           {"operation", p->name},
                           {"plane", true},
                           {"ops", p->ops},
                           {"time_us", time_us},
                           {"distinct_per_call", distinct},
                           {"ops_per_s", ops_per_s},
                           {"algbw_GBps", algbw},
                           {"bytes", row_bytes},
                           {"remote", remote},
                           {"wrong", p->wrong},
                           {"dim", cfg.dim},
                           {"batch", cfg.batch},
                           {"num_ps", num_ps},
                           {"workers", workers},
                           {"optimizer", cfg.optimizer},
                           {"ps_threads", cfg.ps_threads},
                           {"ps_split_batches", ps_split}};
      // The link is measured only between two hosts; elsewhere there is no figure to give.
      if (remote) {
        row["link_GBps"] = link;
        row["vs_link"] = vs_link;
      }
      if (p->calls > 0) row["client_cpu_us"] = p->client_cpu_s * 1e6 / static_cast<double>(p->calls);
      if (p->ps_requests > 0) row["ps_table_us"] = p->ps_table_s * 1e6 / static_cast<double>(p->ps_requests);
      json_rows.push_back(std::move(row));
    }
    // Per side (steadier than time_us on a shared machine, where the two sides' CPU time adds up).
    os << std::setprecision(1) << "# per side: lookup " << lookup.client_cpu_s * 1e6 / static_cast<double>(std::max<std::int64_t>(1, lookup.calls))
       << " us worker CPU per call, "
       << (lookup.ps_requests > 0 ? lookup.ps_table_s * 1e6 / static_cast<double>(lookup.ps_requests) : 0.0)
       << " us PS table per request; update " << update.client_cpu_s * 1e6 / static_cast<double>(std::max<std::int64_t>(1, update.calls))
       << " us worker CPU per call, "
       << (update.ps_requests > 0 ? update.ps_table_s * 1e6 / static_cast<double>(update.ps_requests) : 0.0)
       << " us PS table per request (warmup included); " << ps_split
       << " batches split over the PS's threads\n";
    os << "# " << (wrong == 0 ? "all results correct" : std::to_string(wrong) + " wrong row(s) or update(s)") << "\n";
    std::cout << os.str() << std::flush;
    if (wrong != 0) status = kExitFailure;
    if (!write_bench_rows(cfg.json_path, json_rows)) status = kExitFailure;
  }
  STRATA_CHECK_MPI(MPI_Bcast(&status, 1, MPI_INT, 0, comm));
  return status;
}

int run_dynamic_bench_command(const BenchFlags& f, int* argc, char*** argv) {
  DynamicBenchConfig cfg;
  const Env env = Env::from_process();
  const bool launched = cluster::launcher_size_hint(env) >= 2;
  if (!f.max_bytes.empty() || !f.factor.empty() || !f.dir.empty() || f.keep || !f.model.empty() || !f.batch.empty())
    throw ConfigError("--op dynamic: only --rows, --row-elems, -b (ids per batch), -w, -n, --optimizer, --ps-threads and "
                      "--json apply (and under mpirun --num-ps, --transport and --timeout)");
  if (!f.ps_threads.empty()) cfg.ps_threads = parse_int(f.ps_threads, "--ps-threads", 1, 1024);
  if (!launched && (!f.num_ps.empty() || !f.transport.empty() || !f.timeout.empty()))
    throw ConfigError("--op dynamic in one process: --num-ps, --transport and --timeout apply under mpirun only");
  if (!f.rows.empty()) {
    const std::uint64_t rows = parse_bytes(f.rows, "--rows");  // suffixes: 1M = 1048576 ids
    if (rows < 1 || rows > static_cast<std::uint64_t>(ps::DynamicTableConfig::kMaxCapacity))
      throw ConfigError("--rows: " + f.rows + " is outside [1, 2^31 - 1]");
    cfg.rows = static_cast<std::int64_t>(rows);
  }
  if (!f.row_elems.empty()) cfg.dim = parse_int(f.row_elems, "--row-elems", 1, 65536);
  if (!f.min_bytes.empty()) {
    const std::uint64_t b = parse_bytes(f.min_bytes, "-b (ids per batch)");
    if (b < 1 || b > (1u << 20)) throw ConfigError("-b (ids per batch): " + f.min_bytes + " is outside [1, 1M]");
    cfg.batch = static_cast<std::int64_t>(b);
  }
  if (!f.warmup.empty()) cfg.warmup = parse_int(f.warmup, "-w", 0, 1 << 20);
  if (!f.iters.empty()) cfg.iters = parse_int(f.iters, "-n", 1, 1 << 20);
  if (!f.optimizer.empty()) cfg.optimizer = f.optimizer;
  cfg.json_path = f.json;
  if (!launched) return run_dynamic_bench(cfg);
  if (!f.num_ps.empty()) cfg.num_ps = parse_int(f.num_ps, "--num-ps", 1, 1 << 20);
  cfg.transport = f.transport.empty() ? env.get_string("STRATA_TRANSPORT", "auto") : f.transport;
  cfg.timeout_s = resolve_timeout(f.timeout, env);
  if (f.rows.empty()) cfg.rows = std::int64_t{1} << 18;  // the support crosses the network once
  if (f.iters.empty()) cfg.iters = 64;
  return run_dynamic_plane_bench(cfg, argc, argv);
}

}  // namespace strata::cli
