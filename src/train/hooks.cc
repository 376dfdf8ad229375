// The built-in hooks: what `strata train` prints and writes, each in one place. The lines are the
// command-line contract (scripts and tests parse them): change them only by extending.
#include <cmath>
#include "strata/train/hooks.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/common/error.h"
#include "strata/common/signals.h"

namespace strata::train {

double RunContext::clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double RunContext::elapsed() const { return clock_s() - start_time; }

// ---- checkpoint saver, preemption, stop at step ----------------------------------------------

void CheckpointSaverHook::after_run(RunContext& ctx, const RunValues& v) {
  if (!(v.outcome.stop && v.outcome.save_failed)) return;
  ctx.request_stop();  // PS 0 reported the failed save (--on-save-error stop)
  ctx.summary.save_failed = true;
  if (ctx.is_chief)
    std::cout << "checkpoint save failed at step " << v.step << ": stopping with status " << kStatusFailure
              << " (--on-save-error stop)" << std::endl;
}

void PreemptionHook::after_run(RunContext& ctx, const RunValues& v) {
  if (!v.outcome.stop || v.outcome.save_failed) return;
  ctx.request_stop();
  ctx.summary.preempted = true;
  if (ctx.is_chief)
    std::cout << "preempted (SIGTERM or SIGUSR1 reached " << (preemption_signal() ? "the chief" : "a rank")
              << "): checkpoint saved at step " << v.step << ", stopping with status " << kExitPreempted << std::endl;
}

void StopAtStepHook::after_create_session(RunContext& ctx) {
  if (max_steps_ >= 0 && ctx.step >= max_steps_) ctx.request_stop();
}

void StopAtStepHook::after_run(RunContext& ctx, const RunValues& v) {
  if (max_steps_ >= 0 && v.step >= max_steps_) ctx.request_stop();
}

// ---- logging ----------------------------------------------------------------------------------

void LoggingHook::after_create_session(RunContext& ctx) {
  if (!ctx.is_chief) return;
  const Runtime& rt = *ctx.runtime;
  std::ostringstream line;
  line << "strata train: " << ctx.model->describe() << ", " << ctx.strategy->num_workers() << " worker(s) + "
       << rt.count_role(Role::kPs) << " PS; replicas:";
  for (std::size_t w = 0; w < ctx.worker_devices.size(); ++w) {
    const std::string& d = ctx.worker_devices[w];
    const bool gpu = d.compare(0, 4, "gpu:") == 0;
    const std::string list = d.substr(4);
    const long count = gpu ? 1 + std::count(list.begin(), list.end(), ',') : std::stol(list);
    line << (w ? "," : "") << " worker " << w << " = " << count << (gpu ? " x GPU [" + list + "]" : " x CPU");
  }
  line << " (--devices " << to_string(ctx.config->devices) << ")";
  std::cout << line.str() << std::endl;
  std::cout << "strata train: transport " << ctx.strategy->ps_endpoint().transport_description() << std::endl;
  if (ctx.resumed)
    std::cout << "resuming at epoch " << (ctx.resumed_from.epoch + 1) << ", step " << ctx.resumed_from.step
              << ", global step " << ctx.global_step << std::endl;
}

void LoggingHook::after_run(RunContext& ctx, const RunValues& v) {
  if (!v.log_step || !ctx.is_chief) return;
  std::ostringstream line;
  line << "step " << v.step << " global_step " << v.global_step << " epoch " << (v.epoch + 1) << "/" << ctx.epochs
       << std::fixed << std::setprecision(4) << " loss " << v.window_loss << " acc " << v.window_accuracy
       << std::setprecision(0) << " examples/s " << v.window_examples_per_sec << " staleness "
       << ctx.strategy->ps_client().max_observed_staleness();
  std::cout << line.str() << std::endl;
}

// ---- metrics JSONL ----------------------------------------------------------------------------

struct MetricsJsonlHook::File {
  std::ofstream out;
};

MetricsJsonlHook::MetricsJsonlHook(std::string path) : path_(std::move(path)) {}
MetricsJsonlHook::~MetricsJsonlHook() = default;

void MetricsJsonlHook::after_create_session(RunContext& ctx) {
  if (path_.empty() || !ctx.is_chief) return;
  file_ = std::make_unique<File>();
  file_->out.open(path_);
  if (!file_->out) throw ConfigError("--metrics: cannot create '" + path_ + "'");
}

void MetricsJsonlHook::after_run(RunContext& ctx, const RunValues& v) {
  if (!v.log_step || !file_) return;
  file_->out << nlohmann::json{{"step", v.step},
                               {"global_step", v.global_step},
                               {"epoch", v.epoch + 1},
                               {"loss", v.window_loss},
                               {"accuracy", v.window_accuracy},
                               {"examples_per_sec", v.window_examples_per_sec},
                               {"wall_s", ctx.elapsed()}}
                    .dump()
             << "\n"
             << std::flush;
}

// ---- trace ------------------------------------------------------------------------------------

TraceHook::~TraceHook() = default;

void TraceHook::begin(RunContext& ctx) {
  if (path_.empty()) return;
  std::string path = path_;
  if (ctx.runtime->size() > 1) {
    auto dot = path.rfind(".json");
    path = (dot == std::string::npos ? path : path.substr(0, dot)) + ".rank" +
           std::to_string(ctx.runtime->rank()) + ".json";
  }
  writer_ = std::make_unique<TraceWriter>(path, ctx.runtime->rank(), ctx.runtime->task().str());
  ctx.trace = writer_.get();
}

void TraceHook::end(RunContext&) {}

// ---- profiler ---------------------------------------------------------------------------------

void ProfilerHook::after_run(RunContext&, const RunValues& v) {
  pull_ += v.pull_s;
  compute_ += v.compute_s;
  push_ += v.push_s;
  input_ += v.input_s;
  total_ += v.step_s;
  ++steps_;
}

void ProfilerHook::end(RunContext& ctx) {
  const std::int64_t n = std::max<std::int64_t>(1, steps_);
  const TrainSummary& s = ctx.summary;
  std::ostringstream p;
  p << std::fixed << std::setprecision(2) << "profile " << ctx.runtime->task().str() << ": " << steps_
    << " steps, per step " << 1e3 * total_ / n << " ms = compute " << 1e3 * compute_ / n << " ms + pull "
    << 1e3 * pull_ / n << " ms + all-reduce/push " << 1e3 * push_ / n << " ms + input " << 1e3 * input_ / n
    << " ms; communication " << 100.0 * (pull_ + push_) / std::max(total_, 1e-9) << "% of step time";
  if (s.staleness_tracked && s.staleness_count > 0)
    p << "; update staleness mean " << static_cast<double>(s.staleness_sum) / s.staleness_count << " max "
      << s.staleness_max;
  if (!ctx.strategy->checkpoint_options().directory.empty()) {
    const ps::PsClient::SavePauses sp = ctx.strategy->ps_client().save_pauses();
    p << "; checkpoint saves paused this worker " << sp.total_s << " s in " << sp.saves << " save(s), longest "
      << 1e3 * sp.max_s << " ms";
  }
  std::cout << p.str() << std::endl;
  ctx.summary.comm_fraction = (pull_ + push_) / std::max(total_, 1e-9);
  // Each PS's utilisation over the training time (every push is applied by now): the input
  // docs/SCALING.md needs to say how many PS ranks a job wants.
  if (!ctx.is_chief) return;
  const double train_s = s.train_s;
  const auto stats = ctx.strategy->ps_client().ps_stats();
  const ps::PsOptions& po = ctx.strategy_options.ps;
  for (std::size_t q = 0; q < stats.size(); ++q) {
    const auto& st = stats[q];
    ctx.summary.ps_busy_fraction.push_back(st.busy_s / std::max(train_s, 1e-9));
    std::ostringstream line;
    line << std::fixed << std::setprecision(2) << "profile ps:" << q << ": busy " << st.busy_s << " s of the "
         << train_s << " s of training = " << 100.0 * ctx.summary.ps_busy_fraction.back() << "%; " << st.updates
         << " updates of " << st.elements << " elements";
    if (st.busy_s > 0) line << ", " << 1e-6 * static_cast<double>(st.elements) / st.busy_s << " M elements/s";
    if (st.split_updates > 0) line << "; " << st.split_updates << " split over up to " << st.max_threads << " threads";
    if (st.updates == 0)
      line << (po.optimizer.kind == ps::OptimizerKind::kSgd && po.consistency.mode != ps::Consistency::kSync
                   ? " (async SGD pushes are MPI accumulates: no PS work)"
                   : " (no update reached this PS)");
    std::cout << line.str() << std::endl;
  }
}

// ---- summary ----------------------------------------------------------------------------------

void SummaryHook::end(RunContext& ctx) {
  if (!ctx.is_chief) return;
  ParameterServerStrategy& strategy = *ctx.strategy;
  const TrainSummary& s = ctx.summary;
  const ps::PsOptions& po = ctx.strategy_options.ps;
  double test_loss = 0;
  double acc = 0;
  EvalMetrics metrics;
  if (ctx.evaluate_all) {
    metrics = ctx.evaluate_all();
    acc = metrics.accuracy;
    test_loss = metrics.loss;
  } else if (ctx.evaluate) {
    acc = ctx.evaluate(&test_loss);
  }
  nlohmann::ordered_json summary = {{"test_accuracy", acc},
                                    {"test_loss", test_loss},
                                    {"examples_per_sec", s.job_examples_per_sec},
                                    {"global_step", strategy.global_step()},
                                    {"wall_s", ctx.elapsed()},
                                    {"train_s", s.train_s},
                                    {"final_loss", s.last_loss},
                                    {"model", ctx.model_label},
                                    {"data", ctx.data_label},
                                    {"workers", strategy.num_workers()},
                                    {"ps", ctx.runtime->count_role(Role::kPs)},
                                    {"replicas_per_worker", strategy.num_replicas_in_sync()},
                                    {"devices", ctx.devices_kind},
                                    {"worker_devices", ctx.worker_devices},
                                    {"optimizer", ps::to_string(po.optimizer)},
                                    {"consistency", po.consistency.to_string()},
                                    {"epochs", ctx.epochs},
                                    {"steps", ctx.step}};
  // A binary classifier's AUC and friends, a regressor's errors (NaN, i.e. undefined, is left out:
  // JSON has no NaN).
  auto put = [&summary](const char* key, double v) {
    if (std::isfinite(v)) summary[key] = v;
  };
  put("auc", metrics.auc);
  put("log_loss", metrics.log_loss);
  put("precision", metrics.precision);
  put("recall", metrics.recall);
  put("mae", metrics.mae);
  put("mse", metrics.mse);
  if (s.staleness_tracked && s.job_staleness_count > 0)
    summary["update_staleness"] = {
        {"mean", static_cast<double>(s.job_staleness_sum) / static_cast<double>(s.job_staleness_count)},
        {"max", s.job_staleness_max}};
  const CheckpointOptions& co = strategy.checkpoint_options();
  if (!co.directory.empty()) {
    summary["checkpoint_dir"] = co.directory;
    summary["checkpoints_saved"] = strategy.ps_client().saves_completed();
    if (strategy.ps_endpoint().save_failures() > 0)
      summary["checkpoint_save_failures"] = strategy.ps_endpoint().save_failures();
    if (!strategy.final_checkpoint().empty()) summary["final_checkpoint"] = strategy.final_checkpoint();
    if (strategy.save_error_stopped()) summary["stopped_on_save_error"] = true;
    if (!s.save_pause_s.empty()) summary["save_pause_s"] = {{"total", s.save_pause_s}, {"max", s.save_pause_max_s}};
  }
  if (strategy.restore_report()) summary["restored_from"] = strategy.restore_report()->path;
  if (s.preempted) summary["preempted"] = true;
  if (s.comm_fraction >= 0) {
    summary["comm_fraction"] = s.comm_fraction;
    summary["ps_busy_fraction"] = s.ps_busy_fraction;
  }
  summary["restarts"] = ctx.config->restarts;
  if (!ctx.dynamic_variables.empty()) {
    ctx.deferred_summary = summary.dump();
    return;
  }
  std::cout << summary.dump() << std::endl;
}

// ---- the built-in list ------------------------------------------------------------------------

HookList default_hooks(const RunConfig& config, const TrainSpec& train_spec) {
  HookList hooks;
  hooks.push_back(std::make_shared<CheckpointSaverHook>());
  hooks.push_back(std::make_shared<PreemptionHook>());
  hooks.push_back(std::make_shared<StopAtStepHook>(train_spec.max_steps));
  hooks.push_back(std::make_shared<LoggingHook>());
  if (!config.metrics_path.empty()) hooks.push_back(std::make_shared<MetricsJsonlHook>(config.metrics_path));
  if (!config.trace_path.empty()) hooks.push_back(std::make_shared<TraceHook>(config.trace_path));
  if (config.profile) hooks.push_back(std::make_shared<ProfilerHook>());
  hooks.push_back(std::make_shared<SummaryHook>());
  return hooks;
}

}  // namespace strata::train
