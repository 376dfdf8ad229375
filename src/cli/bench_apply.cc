#include "cli/bench_apply.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "cli/bench_checkpoint.h"
#include "cli/commands.h"
#include "ps/apply_team.h"
#include "strata/common/error.h"
#include "strata/ps/optimizer.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

// One variable's state: value, optimizer slots and a gradient, filled deterministically.
struct State {
  std::vector<float> var, grad;
  std::vector<std::vector<float>> slots;
  std::vector<float*> slot_ptrs;
  State(std::size_t n, const ps::OptimizerConfig& opt) : var(n), grad(n) {
    const int k = ps::num_slots(opt.kind);
    for (int s = 0; s < k; ++s) slots.emplace_back(n, static_cast<float>(ps::slot_initial_value(opt, s)));
    for (auto& s : slots) slot_ptrs.push_back(s.data());
    for (std::size_t i = 0; i < n; ++i) {
      var[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
      grad[i] = static_cast<float>((i * 7919) % 2001) * 1e-4f - 0.1f;
    }
  }
  // Elements of var and slots whose bits differ from `other`'s.
  std::int64_t differing(const State& other) const {
    std::int64_t wrong = 0;
    auto cmp = [&](const std::vector<float>& a, const std::vector<float>& b) {
      for (std::size_t i = 0; i < a.size(); ++i) wrong += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    };
    cmp(var, other.var);
    for (std::size_t s = 0; s < slots.size(); ++s) cmp(slots[s], other.slots[s]);
    return wrong;
  }
};

struct Row {
  std::uint64_t bytes = 0, count = 0;
  double t1_us = 0, tn_us = 0;
  std::int64_t wrong = 0;
};

}  // namespace

int run_apply_bench(const ApplyBenchConfig& cfg) {
  const ps::OptimizerConfig opt = ps::OptimizerConfig::parse(cfg.optimizer);
  if (ps::num_slots(opt.kind) == 0)
    throw ConfigError("--op apply measures the PS's stateful optimizers (momentum, adagrad, adam, rmsprop, ftrl); "
                      "sgd pushes are MPI accumulates, measured by --op push");
  // Bytes an update reads and writes per element: variable and slots read and written, gradient read.
  const double touched = 4.0 * (2 + 2 * ps::num_slots(opt.kind) + 1);
  // Three copies of the state (one thread, the team, the reference) of 2 + slots arrays each.
  const std::uint64_t need = 3ull * static_cast<std::uint64_t>(2 + ps::num_slots(opt.kind)) * cfg.max_bytes;
  const std::uint64_t avail = mem_available_bytes();
  if (avail > 0 && need > avail * 8 / 10)
    throw ConfigError("-e " + std::to_string(cfg.max_bytes >> 20) + " MiB needs about " + std::to_string(need >> 20) +
                      " MiB of memory for --op apply (three copies of the optimizer state); " +
                      std::to_string(avail >> 20) + " MiB are available");
  ps::ApplyTeam team(cfg.threads);
  std::vector<Row> rows;
  for (std::uint64_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= static_cast<std::uint64_t>(cfg.factor)) {
    const std::size_t n = bytes / sizeof(float);
    State one(n, opt), many(n, opt), ref(n, opt);
    double t1 = 0, tn = 0;
    for (int it = 0; it < cfg.warmup + cfg.iters; ++it) {
      const std::int64_t step = it + 1;
      auto a = Clock::now();
      ps::apply_dense_team<float>(nullptr, opt, step, one.var.data(), one.slot_ptrs.data(),
                                  static_cast<int>(one.slot_ptrs.size()), one.grad.data(), n, {});
      auto b = Clock::now();
      ps::apply_dense_team<float>(&team, opt, step, many.var.data(), many.slot_ptrs.data(),
                                  static_cast<int>(many.slot_ptrs.size()), many.grad.data(), n, {});
      auto c = Clock::now();
      ps::apply_dense_reference(opt, step, ref.var.data(), ref.slot_ptrs.data(), ref.grad.data(), n);
      if (it >= cfg.warmup) {
        t1 += std::chrono::duration<double, std::micro>(b - a).count();
        tn += std::chrono::duration<double, std::micro>(c - b).count();
      }
    }
    Row row;
    row.bytes = bytes;
    row.count = n;
    row.t1_us = t1 / cfg.iters;
    row.tn_us = tn / cfg.iters;
    row.wrong = one.differing(ref) + many.differing(ref);
    rows.push_back(row);
    if (cfg.factor == 1) break;
  }

  std::ostringstream os;
  os << "# strata bench: op apply, optimizer " << cfg.optimizer << ", 1 thread vs " << cfg.threads
     << " (--ps-threads), warmup " << cfg.warmup << ", iters " << cfg.iters << "\n";
  os << "# one update of an f32 variable of `size` bytes; Melem/s = elements updated per second (the U of "
        "docs/SCALING.md); state_GBps = " << touched << " bytes read+written per element / time; #wrong = elements "
        "of variable and slots not bit-identical to the scalar reference\n";
  os << std::setw(12) << "size" << std::setw(12) << "count" << std::setw(12) << "1t_us" << std::setw(10)
     << "1t_Melem" << std::setw(12) << "Nt_us" << std::setw(10) << "Nt_Melem" << std::setw(11) << "state_GBps"
     << std::setw(9) << "speedup" << std::setw(8) << "#wrong\n";
  std::int64_t total_wrong = 0;
  nlohmann::json json_rows = nlohmann::json::array();
  for (const auto& r : rows) {
    const double m1 = static_cast<double>(r.count) / r.t1_us, mn = static_cast<double>(r.count) / r.tn_us;
    const double state = touched * static_cast<double>(r.count) / (r.tn_us * 1e3);
    os << std::setw(12) << r.bytes << std::setw(12) << r.count << std::fixed << std::setprecision(1) << std::setw(12)
       << r.t1_us << std::setw(10) << m1 << std::setw(12) << r.tn_us << std::setw(10) << mn << std::setprecision(2)
       << std::setw(11) << state << std::setw(9) << r.t1_us / r.tn_us << std::setw(8) << r.wrong << "\n";
    total_wrong += r.wrong;
    json_rows.push_back({{"op", "apply"},
                         {"optimizer", cfg.optimizer},
                         {"bytes", r.bytes},
                         {"count", r.count},
                         {"threads", cfg.threads},
                         {"time_us_1thread", r.t1_us},
                         {"time_us", r.tn_us},
                         {"melem_per_s_1thread", m1},
                         {"melem_per_s", mn},
                         {"state_GBps", state},
                         {"wrong", r.wrong}});
  }
  os << "# " << (total_wrong == 0 ? "all results correct" : std::to_string(total_wrong) + " wrong element(s)") << "\n";
  std::cout << os.str() << std::flush;
  if (!cfg.json_path.empty()) {
    std::ofstream out(cfg.json_path);
    out << nlohmann::json{{"rows", json_rows}}.dump(2) << "\n";
    if (!out) throw ConfigError("--json: cannot write '" + cfg.json_path + "'");
  }
  return total_wrong == 0 ? kExitOk : kExitFailure;
}

}  // namespace strata::cli
