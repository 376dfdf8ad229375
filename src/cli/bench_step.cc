#include "cli/bench_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <vector>

#include "cli/commands.h"
#include "model/gemm.h"
#include "nn/kernels.h"
#include "strata/common/error.h"
#include "strata/model/model.h"
#include "strata/nn/builtin.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
using model::detail::GemmBackend;
using model::detail::GemmCall;
using model::detail::Transpose;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A synthetic batch shaped like the model's training data (pixels in [0, 1], ids in the vocab).
struct Batch {
  std::vector<float> dense;
  std::vector<std::int64_t> ids;
  std::vector<std::int32_t> labels;
  model::Inputs inputs;
  Batch(const model::ModelConfig& c, int size) {
    std::mt19937_64 gen(2026);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    std::uniform_int_distribution<std::int64_t> id(0, std::max<std::int64_t>(c.vocab, 1) - 1);
    dense.resize(static_cast<std::size_t>(size) * c.input_dim);
    for (float& x : dense) x = pixel(gen);
    ids.resize(static_cast<std::size_t>(size) * c.num_fields);
    for (auto& i : ids) i = id(gen);
    labels.resize(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) labels[i] = static_cast<std::int32_t>(gen() % static_cast<std::uint64_t>(c.num_classes));
    inputs.size = size;
    inputs.dense = dense.empty() ? nullptr : dense.data();
    inputs.dense_dim = c.input_dim;
    inputs.sparse_ids = ids.empty() ? nullptr : ids.data();
    inputs.num_fields = c.num_fields;
    inputs.labels = labels.data();
  }
};

// Operands for replaying recorded products: random values, sized for each call's leading dims.
struct Replay {
  struct Buffers {
    std::vector<float> a, b, c;
  };
  std::vector<GemmCall> calls;
  std::vector<Buffers> buffers;
  explicit Replay(std::vector<GemmCall> recorded) : calls(std::move(recorded)) {
    // The layer graph's products are C = op(A) op(B) or C += op(A) op(B): alpha 1, beta 0 or 1.
    for (const GemmCall& g : calls)
      STRATA_CHECK(g.alpha == 1.0f && (g.beta == 0.0f || g.beta == 1.0f), "bench --op step: a recorded product with alpha ",
                   g.alpha, " and beta ", g.beta, " that the layer graph's gemm() cannot replay");
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto filled = [&](int rows, int ld) {
      std::vector<float> v(static_cast<std::size_t>(std::max(rows, 1)) * static_cast<std::size_t>(ld));
      for (float& x : v) x = u(gen);
      return v;
    };
    for (const GemmCall& g : calls) {
      Buffers bufs;
      bufs.a = filled(g.ta == Transpose::kYes ? g.k : g.m, g.lda);
      bufs.b = filled(g.tb == Transpose::kYes ? g.n : g.k, g.ldb);
      bufs.c = filled(g.m, g.ldc);
      buffers.push_back(std::move(bufs));
    }
  }
  // Through the layer graph's gemm(), the step's own path: the checked library for BLIS and
  // OpenBLAS, and for Eigen the graph's allocation-free kernel (model::detail::sgemm's Eigen
  // expression allocates its packing buffers on every call, which the step never does).
  void run_once() {
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const GemmCall& g = calls[i];
      Buffers& bufs = buffers[i];
      nn::detail::gemm(g.ta == Transpose::kYes, g.tb == Transpose::kYes, g.m, g.n, g.k, bufs.a.data(), g.lda,
                       bufs.b.data(), g.ldb, g.beta != 0.0f, bufs.c.data(), g.ldc);
    }
  }
};

// Gradient elements farther from the reference than 1e-3 of the variable's largest |reference|.
std::int64_t count_wrong(const model::Grads& got, const model::Grads& ref, double* worst) {
  std::int64_t wrong = 0;
  auto compare = [&](const std::vector<float>& g, const std::vector<float>& r) {
    if (g.size() != r.size()) return static_cast<std::int64_t>(std::max(g.size(), r.size()));
    double scale = 0;
    for (float x : r) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double err = std::fabs(static_cast<double>(g[i]) - r[i]);
      if (scale > 0) *worst = std::max(*worst, err / scale);
      bad += !(err <= 1e-3 * scale);
    }
    return bad;
  };
  for (const auto& [name, r] : ref.dense) {
    const auto it = got.dense.find(name);
    wrong += it == got.dense.end() ? static_cast<std::int64_t>(r.value.size()) : compare(it->second.value, r.value);
  }
  for (const auto& [name, r] : ref.sparse) {
    const auto it = got.sparse.find(name);
    if (it == got.sparse.end() || it->second.rows != r.rows) wrong += static_cast<std::int64_t>(r.values.size());
    else wrong += compare(it->second.values, r.values);
  }
  return wrong;
}

struct Row {
  std::string backend, library;
  double step_us = 0, gemm_us = 0;
  std::int64_t wrong = 0;
  double worst = 0;  // largest error / variable scale
};

std::string shape_text(const GemmCall& g) {
  std::ostringstream os;
  os << (g.ta == Transpose::kYes ? 'T' : 'N') << (g.tb == Transpose::kYes ? 'T' : 'N') << ' ' << g.m << 'x' << g.n
     << 'x' << g.k;
  return os.str();
}

}  // namespace

int run_step_bench(const StepBenchConfig& cfg) {
  model::ModelConfig mc;
  mc.name = cfg.model;
  if (cfg.model == "wide_deep") {
    // The shape of `strata train --data synthetic-sparse`: 8 fields, 100,000 ids, 4 dense features.
    mc.input_dim = 4;
    mc.num_classes = 2;
    mc.num_fields = 8;
    mc.vocab = 100000;
  } else if (cfg.model != "mlp" && cfg.model != "softmax") {
    throw ConfigError("--model: '" + cfg.model + "' is not one of mlp, softmax, wide_deep");
  }
  // The process default (STRATA_GEMM, ConfigError when bad) is what training would use.
  model::set_multiplying_threads(1);  // the step runs on one thread, as a worker with one replica
  const GemmBackend process_default = model::detail::current_gemm_backend();
  const model::ModelConfig resolved = model::resolve_model_config(mc);
  const std::unique_ptr<nn::GraphModel> net = nn::make_builtin_model(resolved);
  const model::Params params = nn::init_local_params(*net);
  const Batch batch(resolved, cfg.batch);

  // The products one step makes, and the double-precision reference of the step.
  std::vector<GemmCall> calls;
  model::Grads ref_grads;
  double ref_loss = 0;
  {
    model::detail::ScopedGemmBackend reference(GemmBackend::kReference);
    model::detail::GemmRecorder recorder;
    ref_loss = net->step(params, batch.inputs, &ref_grads).loss;
    calls = recorder.calls();
  }
  double flops = 0;
  for (const GemmCall& g : calls) flops += g.flops();

  std::vector<GemmBackend> backends{GemmBackend::kEigen};
  for (GemmBackend b : {GemmBackend::kBlis, GemmBackend::kOpenBlas})
    if (model::detail::gemm_backend_built(b)) backends.push_back(b);
  std::vector<Row> rows;
  for (GemmBackend b : backends) {
    model::detail::ScopedGemmBackend scoped(b);
    Row row;
    row.backend = model::detail::gemm_backend_id(b);
    model::Grads grads;
    double loss = 0;
    for (int i = 0; i < cfg.warmup; ++i) loss = net->step(params, batch.inputs, &grads).loss;
    // After the warm-up (the first product of each shape runs the library's check), so the name
    // says whether it is still in use.
    row.library = model::detail::gemm_backend_name(model::detail::current_gemm_backend());
    auto start = Clock::now();
    for (int i = 0; i < cfg.iters; ++i) loss = net->step(params, batch.inputs, &grads).loss;
    row.step_us = seconds_since(start) * 1e6 / cfg.iters;
    row.wrong = count_wrong(grads, ref_grads, &row.worst);
    if (!(std::fabs(loss - ref_loss) <= 1e-4 * std::max(1.0, std::fabs(ref_loss)))) ++row.wrong;

    Replay replay(calls);
    for (int i = 0; i < cfg.warmup; ++i) replay.run_once();
    start = Clock::now();
    for (int i = 0; i < cfg.iters; ++i) replay.run_once();
    row.gemm_us = seconds_since(start) * 1e6 / cfg.iters;
    rows.push_back(row);
  }
  double best_gemm = 0;
  for (const Row& r : rows) best_gemm = std::max(best_gemm, flops / (r.gemm_us * 1e3));

  std::ostringstream os;
  os << "# strata bench: op step, " << net->describe() << ", batch " << cfg.batch << ", one thread, warmup "
     << cfg.warmup << ", iters " << cfg.iters << "\n";
  os << "# training uses: " << model::detail::gemm_backend_name(process_default)
     << " (STRATA_GEMM auto|blis|openblas|eigen)";
  for (GemmBackend b : {GemmBackend::kBlis, GemmBackend::kOpenBlas})
    if (model::detail::gemm_backend_disabled(b))
      os << "; " << model::detail::gemm_backend_id(b) << " is off in this process (a failed check or BLIS_ARCH_TYPE)";
  os << "\n";
  os << "# products per step: " << calls.size() << ", " << std::fixed << std::setprecision(1) << flops / 1e6
     << " MFLOP (exactly those the step makes):";
  for (const GemmCall& g : calls) os << ' ' << shape_text(g);
  os << "\n# gemm: the same products back to back, same backend, same run; vs_gemm = step / gemm GFLOP/s; vs_best = "
        "step / fastest backend's gemm GFLOP/s; #wrong: gradient elements off the double-accumulated step by more "
        "than 1e-3 of their variable's largest (max_err: the largest such ratio)\n";
  os << std::left << std::setw(10) << "backend" << std::setw(30) << "library" << std::right << std::setw(10)
     << "time_us" << std::setw(9) << "gflops" << std::setw(10) << "gemm_us" << std::setw(12) << "gemm_gflops"
     << std::setw(9) << "vs_gemm" << std::setw(9) << "vs_best" << std::setw(8) << "#wrong" << std::setw(10)
     << "max_err" << "\n";
  std::int64_t total_wrong = 0;
  nlohmann::json json_rows = nlohmann::json::array();
  for (const Row& r : rows) {
    const double gflops = flops / (r.step_us * 1e3), gemm_gflops = flops / (r.gemm_us * 1e3);
    const double vs_gemm = gflops / gemm_gflops, vs_best = gflops / best_gemm;
    os << std::left << std::setw(10) << r.backend << std::setw(30) << r.library << std::right << std::fixed
       << std::setprecision(1) << std::setw(10) << r.step_us << std::setw(9) << gflops << std::setw(10) << r.gemm_us
       << std::setw(12) << gemm_gflops << std::setprecision(2) << std::setw(9) << vs_gemm << std::setw(9) << vs_best
       << std::setw(8) << r.wrong << std::scientific << std::setprecision(1) << std::setw(10) << r.worst << "\n";
    total_wrong += r.wrong;
    json_rows.push_back({{"op", "step"},
                         {"model", cfg.model},
                         {"batch", cfg.batch},
                         {"backend", r.backend},
                         {"library", r.library},
                         {"products", calls.size()},
                         {"flop_per_step", flops},
                         {"time_us", r.step_us},
                         {"gflops", gflops},
                         {"gemm_time_us", r.gemm_us},
                         {"gemm_gflops", gemm_gflops},
                         {"vs_gemm", vs_gemm},
                         {"vs_best", vs_best},
                         {"wrong", r.wrong},
                         {"max_err", r.worst}});
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
