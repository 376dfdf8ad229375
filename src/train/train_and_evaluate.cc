// train_and_evaluate: the training session of one process (strata/train/train_and_evaluate.h).
//
// Setup, collective over the whole job (every rank, every role):
//   1. bootstrap the runtime (cluster resolution and cross-checks) and start liveness heartbeats;
//   2. choose the replicas' devices, load the data and build the model where needed, and agree on
//      one verdict: the first rank's configuration error is reported in one line by that rank,
//      every rank returns status 2 (no rank is left waiting);
//   3. agree on the optimizer (the chief's, which may come from its model's defaults);
//   4. run the hooks' begin(), create the variables in scope (restoring lazily from a checkpoint)
//      and materialise them on the PS ranks.
// Then each role goes its own way: PS ranks serve, the evaluator watches model_dir (evaluator.cc),
// the workers run the loop below. A worker's step: pull the parameters (dense in one batch, the
// rows its batch needs of sparse ones), compute loss and gradients on each replica's slice, all-
// reduce them across the replicas and push once per worker, increment the global step, then pass
// the checkpoint boundary (strategy.end_step) and run the hooks. After the last step: the final
// checkpoint (before any other wait on the workers), the evaluator told where it is, every push
// applied, job-wide figures reduced over the workers, then the hooks' end() and strategy.finish().
#include "strata/train/train_and_evaluate.h"
#include "strata/train/metrics.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "strata/cluster/liveness.h"
#include "strata/comm/group.h"
#include "strata/comm/group_runtime.h"
#include "strata/comm/mpi_group.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/signals.h"
#include "strata/replica/gpu.h"
#include "train/evaluator.h"

namespace strata::train {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A model the caller owns, handed to the ModelFn overload.
class BorrowedModel : public Model {
 public:
  explicit BorrowedModel(Model& m) : m_(m) {}
  std::string describe() const override { return m_.describe(); }
  std::vector<ps::VariableSpec> variables() const override { return m_.variables(); }
  std::vector<std::string> sparse_variables() const override { return m_.sparse_variables(); }
  std::vector<ps::DynamicVariableSpec> dynamic_variables() const override { return m_.dynamic_variables(); }
  std::vector<std::int64_t> rows_needed(const std::string& var, const Inputs& in) const override {
    return m_.rows_needed(var, in);
  }
  StepResult step(const Params& p, const Inputs& in, Grads* g) const override { return m_.step(p, in, g); }
  std::string name() const override { return m_.name(); }
  std::string default_optimizer() const override { return m_.default_optimizer(); }
  double default_learning_rate() const override { return m_.default_learning_rate(); }
  int default_epochs() const override { return m_.default_epochs(); }

 private:
  Model& m_;
};

// The optimizer spec the job uses: the configured one, else the model's default, with the
// configured learning rate (else the model's) appended.
std::string optimizer_spec(const RunConfig& cfg, const Model* model) {
  std::string opt = !cfg.optimizer.empty() ? cfg.optimizer : model ? model->default_optimizer() : "";
  if (opt.empty()) return opt;
  const double lr = cfg.learning_rate > 0 ? cfg.learning_rate
                    : (cfg.optimizer.empty() && model) ? model->default_learning_rate()
                                                       : 0;
  if (lr > 0) opt += (opt.find(':') == std::string::npos ? ":lr=" : ",lr=") + std::to_string(lr);
  return opt;
}

// The parameters as they are on the PS now (cross-replica reads; sparse tables in full).
Params pull_params(const Model& model, ParameterServerStrategy& strategy, const std::vector<Variable>& vars) {
  Params params;
  for (const auto& v : vars) {
    model::DenseParam p;
    strategy.read(v, p.value);
    p.shape = v.shape();
    params.dense[v.name()] = std::move(p);
  }
  // Sparse tables are evaluated from full dense pulls: fine for the built-in sizes.
  for (const auto& name : model.sparse_variables()) {
    auto it = params.dense.find(name);
    if (it == params.dense.end()) continue;
    model::SparseParam sp;
    sp.width = static_cast<int>(it->second.shape.size() > 1 ? it->second.shape[1] : 1);
    sp.values = std::move(it->second.value);
    for (std::int64_t r = 0; r < it->second.shape[0]; ++r) sp.rows.push_back(r);
    params.dense.erase(it);
    params.sparse[name] = std::move(sp);
  }
  return params;
}

// The rows of the dynamic tables that evaluating `ds` (its first max_batches batches of 1000, as
// evaluate_params reads it) needs, added to `params`: read-only lookups (a missing row reads as
// zeros, nothing is counted or created), so an evaluation never changes the tables.
void add_dynamic_rows(const Model& model, ParameterServerStrategy& strategy, const std::vector<DynamicVariable>& dyn,
                      const data::Dataset& ds, std::int64_t max_batches, Params& params) {
  if (dyn.empty()) return;
  std::vector<std::string> names;
  for (const auto& v : dyn) names.push_back(v.name());
  std::vector<std::vector<std::int64_t>> ids = eval_rows_needed(model, names, ds, max_batches);
  for (std::size_t d = 0; d < dyn.size(); ++d) {
    model::SparseParam& sp = params.sparse[dyn[d].name()];
    sp.width = static_cast<int>(dyn[d].dim());
    sp.rows = std::move(ids[d]);
    strategy.lookup(dyn[d], sp.rows, sp.values, ps::DynamicLookup::kInference);
  }
}

// Dynamic-table statistics, gathered to the chief once the PS ranks stopped serving: each PS
// sends its counters of every dynamic variable (the job's list, declaration order) to the chief,
// which sums them and keeps each shard's. Point-to-point on the runtime communicator with a tag of
// its own; both waits poll against `timeout_s` and name the rank that did not answer.
constexpr int kDynamicStatsTag = 0x4459;  // "DY"
constexpr int kDynamicStatsFields = 8;

std::vector<long long> pack_dynamic_stats(const ps::PsServer& server) {
  std::vector<long long> out;
  for (const auto& spec : server.dynamic_variables()) {
    const ps::DynamicShardStats st = server.dynamic_stats(spec.name);
    const long long fields[kDynamicStatsFields] = {st.rows,          st.admitted,         st.evicted_ttl,
                                                   st.evicted_capacity, st.bytes,         st.rejected_lookups,
                                                   st.rejected_updates, st.rejected_full};
    out.insert(out.end(), fields, fields + kDynamicStatsFields);
  }
  return out;
}

void send_dynamic_stats(comm::Group& group, const Runtime& rt, const ps::PsServer& server, double timeout_s) {
  const std::vector<long long> mine = pack_dynamic_stats(server);
  group.send(rt.chief_rank(), kDynamicStatsTag, mine.data(), mine.size() * sizeof(long long),
             comm::Deadline{timeout_s, "sending the dynamic-table statistics to the chief"});
}

// The "dynamic" member of the summary: per variable, the sums over the PS ranks and "per_ps".
nlohmann::ordered_json gather_dynamic_stats(comm::Group& group, const Runtime& rt,
                                            const std::vector<DynamicVariable>& dyn, double timeout_s) {
  std::vector<std::pair<int, int>> ps;  // (PS index, rank)
  for (const auto& info : rt.ranks())
    if (info.task.type == "ps") ps.emplace_back(info.task.index, info.rank);
  std::sort(ps.begin(), ps.end());
  const std::size_t n = dyn.size() * kDynamicStatsFields;
  std::vector<std::vector<long long>> got(ps.size(), std::vector<long long>(n, 0));
  for (std::size_t p = 0; p < ps.size(); ++p) {
    const std::string what = "the dynamic-table statistics of ps:" + std::to_string(ps[p].first);
    const auto m = group.recv(ps[p].second, kDynamicStatsTag, comm::Deadline{timeout_s, what});
    if (m.size() != n * sizeof(long long))
      throw Error(what + ": " + std::to_string(m.size()) + " bytes, not " + std::to_string(n * sizeof(long long)));
    std::memcpy(got[p].data(), m.data(), m.size());
  }
  static const char* const kNames[kDynamicStatsFields] = {"rows",  "admitted",         "evicted_ttl",
                                                         "evicted_capacity", "bytes", "rejected_lookups",
                                                         "rejected_updates", "rejected_full"};
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (std::size_t d = 0; d < dyn.size(); ++d) {
    nlohmann::ordered_json per_ps = nlohmann::ordered_json::array();
    long long total[kDynamicStatsFields] = {};
    for (std::size_t p = 0; p < ps.size(); ++p) {
      nlohmann::ordered_json shard;
      const long long* f = got[p].data() + d * kDynamicStatsFields;
      for (int k = 0; k < kDynamicStatsFields; ++k) total[k] += f[k];
      shard["rows"] = f[0];
      shard["admitted"] = f[1];
      shard["evicted"] = f[2] + f[3];
      shard["bytes"] = f[4];
      per_ps.push_back(std::move(shard));
    }
    nlohmann::ordered_json v;
    v["dim"] = dyn[d].dim();
    v["rows"] = total[0];
    v["admitted"] = total[1];
    v["evicted"] = total[2] + total[3];
    v["bytes"] = total[4];
    for (int k = 2; k < kDynamicStatsFields; ++k)
      if (k != 4) v[kNames[k]] = total[k];
    v["per_ps"] = std::move(per_ps);
    out[dyn[d].name()] = std::move(v);
  }
  return out;
}

// The workers' meeting at the end of training. Workers finish at different times (async mode, a
// slower node), so the bound is --timeout without progress, never a multiple of it: the deadline
// moves on whenever a worker arrives or the job's global step moves (some worker still trains;
// `global_step` reads it from the PS, about twice a second). Worker 0 collects one token from
// every other worker, then releases them all; past the bound it names the workers that never
// arrived (task and host) and the others name worker 0. Collective over `workers`; the calling
// thread must own the PS client (no replica thread runs).
void final_barrier(comm::Group& workers, const std::vector<int>& runtime_rank_of, const Runtime& rt,
                   double timeout_s, const std::function<std::int64_t()>& global_step) {
  constexpr int kTag = 0x5346;  // "SF"
  const int me = workers.rank(), n = workers.size();
  if (n == 1) return;
  // Who worker r is, for the message: its rank in the runtime group indexes rt.ranks().
  auto describe = [&](int r) {
    const int out = r < static_cast<int>(runtime_rank_of.size()) ? runtime_rank_of[static_cast<std::size_t>(r)] : -1;
    if (out < 0 || out >= static_cast<int>(rt.ranks().size())) return "worker rank " + std::to_string(r);
    const RankInfo& info = rt.ranks()[static_cast<std::size_t>(out)];
    return "rank " + std::to_string(out) + " (" + info.task.str() + " on " + info.host + ")";
  };
  const char token = 1;
  std::vector<char> inbox(static_cast<std::size_t>(n), 0);
  // Worker 0, which can name the missing, gives up first; the others wait 5 s longer.
  const double limit = me == 0 ? timeout_s : timeout_s + 5;
  const comm::Deadline deadline{limit, "the workers' end-of-training barrier"};
  std::int64_t last_step = global_step();
  int arrived = 0, arrived_seen = 0;
  // The deadline restarts whenever a worker arrives or the global step moves.
  auto moved = [&] {
    const std::int64_t step = global_step();
    const bool any = step != last_step || arrived != arrived_seen;
    last_step = step;
    arrived_seen = arrived;
    return any;
  };
  auto wait = [&](const std::function<bool()>& done, bool collecting) {
    try {
      comm::wait_until(done, deadline, {}, moved);
    } catch (const TimeoutError&) {
      std::string missing;
      if (collecting) {
        for (int r = 1; r < n; ++r)
          if (!inbox[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + describe(r);
      } else {
        missing = describe(0);
      }
      throw TimeoutError("the workers' end-of-training barrier: no worker arrived and the global step (" +
                             std::to_string(last_step) + ") did not move for " + std::to_string(static_cast<int>(limit)) +
                             " s (--timeout / STRATA_TIMEOUT_S); still waiting for " + missing,
                         {});
    }
  };
  if (me == 0) {
    wait(
        [&] {
          for (int r = 1; r < n; ++r)
            if (!inbox[static_cast<std::size_t>(r)] && workers.try_recv(r, kTag)) {
              inbox[static_cast<std::size_t>(r)] = 1;
              ++arrived;
            }
          return arrived == n - 1;
        },
        true);
    for (int r = 1; r < n; ++r) workers.send(r, kTag, &token, 1, deadline);
  } else {
    workers.send(0, kTag, &token, 1, deadline);
    wait([&] { return workers.try_recv(0, kTag).has_value(); }, false);
  }
}

// Creates `dir` if needed and writes, syncs and removes a small file in it; ConfigError naming the
// directory and the system's reason otherwise.
void check_writable(const std::string& dir, int rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw ConfigError("--checkpoint-dir '" + dir + "' cannot be created: " + ec.message());
  const std::string probe = dir + "/.strata-write-check." + std::to_string(rank);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw ConfigError("--checkpoint-dir '" + dir + "' is not writable: " + std::strerror(errno));
  const char byte = 0;
  const bool ok = ::write(fd, &byte, 1) == 1 && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!ok) throw ConfigError("--checkpoint-dir '" + dir + "' is not writable: " + std::strerror(err));
}

TrainResult config_failure(const std::string& message, bool report) {
  TrainResult r;
  r.status = kStatusUsage;
  r.error = message;
  r.report_error = report;
  return r;
}

}  // namespace

double evaluate_params(const Model& model, const Params& params, const data::Dataset& ds, double* loss_out,
                       std::int64_t max_batches) {
  MetricsPass pass(model, false);
  pass.add(params, ds, max_batches);
  const EvalMetrics m = pass.result();
  if (loss_out) *loss_out = m.loss;
  return m.accuracy;
}

EvalMetrics evaluate_metrics(const Model& model, const Params& params, const data::Dataset& ds,
                             std::int64_t max_batches) {
  MetricsPass pass(model, true);
  pass.add(params, ds, max_batches);
  return pass.result();
}

TrainResult train_and_evaluate(Model& model, const RunConfig& config, const TrainSpec& train_spec,
                               const EvalSpec& eval_spec) {
  return train_and_evaluate([&model](const data::Dataset&) { return std::make_unique<BorrowedModel>(model); },
                            config, train_spec, eval_spec);
}

TrainResult train_and_evaluate(const ModelFn& make_model, const RunConfig& cfg, const TrainSpec& train_spec,
                               const EvalSpec& eval_spec) {
  // An MPI job's world, or the ranks of a process group (RunConfig::group).
  const MPI_Comm world = cfg.group ? MPI_COMM_NULL : job_world(cfg.world, "train_and_evaluate");
  Env env = Env::from_process();
  const double t_start = RunContext::clock_s();
  BootstrapOptions boot;
  boot.timeout_s = cfg.timeout_s;
  if (cfg.num_ps >= 0) boot.resolve.num_ps = cfg.num_ps;
  boot.resolve.jobs = cfg.jobs;
  const int world_rank = cfg.group ? cfg.group->rank() : rank_in(world);
  // Heartbeats from the start of the job, the bootstrap included: a stopped or frozen rank ends the
  // job within seconds, named (strata/cluster/liveness.h). Before the bootstrap has assigned roles
  // a rank is named by its host. Declared before the runtime, so it still watches while the
  // runtime frees its communicators at the end.
  LivenessOptions live_opt;
  live_opt.stop_timeout_s = cfg.stall_timeout_s;
  live_opt.stall_timeout_s = cfg.progress_timeout_s;
  live_opt.setup_timeout_s = cfg.timeout_s;
  std::optional<LivenessMonitor> live;
  if (!cfg.group) live.emplace(world, live_opt);
  std::unique_ptr<Runtime> rt;
  try {
    rt = cfg.group ? comm::bootstrap_over(cfg.group, env, boot) : Runtime::bootstrap(world, env, boot);
  } catch (const ConfigError& e) {
    return config_failure(e.message(), world_rank == 0);
  }
  if (live) live->name_ranks(*rt);
  liveness::set_phase(liveness::Phase::kRestore);
  // The process groups of the runtime's communicators: every exchange of this layer goes through
  // them, each wait bounded and naming who is late (strata/comm/group.h).
  const comm::RuntimeGroups groups = comm::groups_of(*rt);

  const Role role = rt->role();
  const bool trains = role == Role::kChief || role == Role::kWorker;
  const bool evaluator = role == Role::kEvaluator;
  TrainResult result;
  result.role = role;

  // Every rank validates the configuration the same way, so a bad flag ends every rank cleanly.
  StrategyOptions sopt;
  std::unique_ptr<Model> net;
  data::Dataset train_set;
  EvalData eval_set;  // the chief's and the evaluator's
  std::string config_error;
  // The replicas' devices first: a collective every rank completes before any rank can fail below
  // (the validation that follows only runs when it found nothing wrong).
  try {
    sopt.gpus = choose_replica_gpus(*rt, env, cfg.devices, cfg.timeout_s);
  } catch (const ConfigError& e) {
    config_error = e.message();
  }
  if (config_error.empty()) try {
      // The evaluator's needs are known to every rank (the cluster is the same everywhere).
      if (rt->count_role(Role::kEvaluator) > 0 && cfg.model_dir.empty())
        throw ConfigError("the job has an evaluator task but no model_dir (--checkpoint-dir): the evaluator "
                          "evaluates the checkpoints the job saves there");
      if (rt->count_role(Role::kEvaluator) > 0 && rt->count_role(Role::kChief) + rt->count_role(Role::kWorker) == 0)
        throw ConfigError("the job has an evaluator task but no chief or worker task: nothing would write the "
                          "checkpoints it evaluates");
      if (!cfg.optimizer.empty()) sopt.ps.optimizer = ps::OptimizerConfig::parse(optimizer_spec(cfg, nullptr));
      sopt.ps.consistency = ps::ConsistencyConfig::parse(cfg.consistency);
      sopt.ps.placement = ps::parse_placement_policy(cfg.placement);
      sopt.ps.transport = cfg.transport;
      sopt.ps.timeout_s = cfg.timeout_s;
      sopt.ps.apply_threads = cfg.ps_threads;
      sopt.ps.checkpoint.dynamic_full_every = cfg.dynamic_full_every;
      sopt.ps.max_arena_bytes = cfg.max_arena_bytes;
      sopt.cpu_replicas = cfg.cpu_replicas;
      if (role != Role::kPs) {
        // This worker's replicas: its GPUs, or the CPU threads.
        const int replicas = sopt.gpus.empty() ? cfg.cpu_replicas : static_cast<int>(sopt.gpus.size());
        data::InputContext ictx{1, 0, replicas};
        ictx.get_per_replica_batch_size(cfg.global_batch);
        if (!train_spec.input_fn) throw ConfigError("TrainSpec has no input_fn");
        train_set = train_spec.input_fn();
        // A batch larger than a worker's share of the data would train no step at all and end
        // "successfully" with an untrained model: say so before anything runs.
        const int trainers = rt->count_role(Role::kChief) + rt->count_role(Role::kWorker);
        // (A streamed input is counted when it is distributed; train_set is its sample.)
        if (!train_spec.stream.source && !evaluator && trainers > 0 && cfg.global_batch > train_set.size / trainers)
          throw ConfigError("--global-batch " + std::to_string(cfg.global_batch) +
                            " is larger than a worker's share of the training data (" +
                            std::to_string(train_set.size / trainers) + " of " + std::to_string(train_set.size) +
                            " examples over " + std::to_string(trainers) + " worker(s)): no step would run; use at most " +
                            std::to_string(train_set.size / trainers));
        if ((rt->is_chief() || evaluator) && eval_spec.stream) {
          // Open every file and read the first chunk now, so that a missing file or a malformed
          // start is a usage error before any training, not a failure after all of it (a bad row
          // further on is found when an evaluation reads it).
          data::Dataset first;
          if (!eval_spec.stream()(first) && evaluator) throw ConfigError("the evaluator's eval data is empty");
          eval_set = EvalData(eval_spec.stream);
        } else if (rt->is_chief() || evaluator) {
          eval_set = EvalData(eval_spec.input_fn ? eval_spec.input_fn() : train_set);
          if (evaluator && eval_set.set().size == 0) throw ConfigError("the evaluator's eval data is empty");
        }
        // Workers (and the evaluator) build the model from the data's shape; PS ranks receive the
        // chief's variable list.
        net = make_model(train_set);
        if (!net) throw ConfigError("the model function returned no model");
        // Checked here, with every rank's verdict, not when the evaluator starts (the trainers may
        // be saving by then).
        if (eval_spec.best_metric == "auc" && net->prediction_kind() != PredictionKind::kBinaryProbability)
          throw ConfigError("--eval-best-metric auc: the model is not a binary classifier (AUC needs one); use "
                            "accuracy or loss");
        if (cfg.optimizer.empty()) sopt.ps.optimizer = ps::OptimizerConfig::parse(optimizer_spec(cfg, net.get()));
      }
      // The ranks that write checkpoints (the PS ranks, and the chief's checkpoint.json) really
      // write a file there now, so an unusable directory is a usage error before the first step,
      // not a failure at the first save (possibly after all the training).
      if (!cfg.model_dir.empty() && (role == Role::kPs || rt->is_chief())) check_writable(cfg.model_dir, rt->rank());
    } catch (const ConfigError& e) {
      config_error = e.message();
    }
  // Agree on the verdict: the first rank's error, in one line, on every rank.
  std::vector<std::string> verdicts =
      groups.runtime->allgather_strings(config_error, comm::Deadline{cfg.timeout_s, "train config"});
  for (std::size_t r = 0; r < verdicts.size(); ++r)
    if (!verdicts[r].empty()) return config_failure(verdicts[r], rt->rank() == static_cast<int>(r));
  // The optimizer is the chief's (its model's default when none is configured): the PS ranks
  // apply it without a model of their own.
  {
    const std::string mine = rt->is_chief() && net ? optimizer_spec(cfg, net.get()) : std::string();
    for (const auto& s : groups.runtime->allgather_strings(mine, comm::Deadline{cfg.timeout_s, "optimizer"}))
      if (!s.empty()) sopt.ps.optimizer = ps::OptimizerConfig::parse(s);
  }

  ParameterServerStrategy strategy(*rt, sopt);
  RunContext ctx;
  ctx.config = &cfg;
  ctx.runtime = rt.get();
  ctx.strategy = &strategy;
  ctx.strategy_options = sopt;
  ctx.model = net.get();
  ctx.role = role;
  ctx.is_chief = rt->is_chief();
  ctx.start_time = t_start;
  ctx.max_steps = train_spec.max_steps;
  ctx.model_label = net ? net->name() : std::string();
  ctx.data_label = train_spec.data_name;
  HookList hooks = default_hooks(cfg, train_spec);
  for (const auto& h : train_spec.hooks)
    if (h) hooks.push_back(h);
  for (auto& h : hooks) h->begin(ctx);

  std::vector<Variable>& vars = ctx.variables;
  try {
    strategy.set_checkpoint_options(cfg.checkpoint_options());
    if (!cfg.restore.empty()) {
      RestoreOptions ropt;
      ropt.expect_partial = cfg.expect_partial;
      ropt.allow_unverified = cfg.allow_unverified_restore;
      strategy.restore(cfg.restore == "latest" ? cfg.model_dir : cfg.restore, ropt);
    }
    strategy.scope([&] {
      if (trains) {
        for (auto& spec : net->variables()) vars.push_back(strategy.create_variable(spec));
        for (auto& spec : net->dynamic_variables())
          ctx.dynamic_variables.push_back(strategy.create_dynamic_variable(spec));
      }
    });
  } catch (const ConfigError& e) {
    // Raised identically on every rank (restore verdicts are agreed before anything is allocated).
    return config_failure(e.message(), rt->rank() == 0);
  }
  if (strategy.is_ps()) {
    liveness::set_phase(liveness::Phase::kServe);
    const bool preempted = strategy.serve();
    // The chief's summary carries every PS's dynamic-table counters (the chief waits for them).
    if (!strategy.ps_server().dynamic_variables().empty())
      send_dynamic_stats(*groups.runtime, *rt, strategy.ps_server(), cfg.timeout_s);
    result.status = strategy.save_error_stopped() ? kStatusFailure : preempted ? kStatusPreempted : kStatusOk;
    return result;
  }
  if (evaluator) {
    liveness::set_phase(liveness::Phase::kEvaluate);
    // A sidecar (TF runs it on a machine of its own): where it shares cores with trainers, its
    // evaluations must not slow the training. Linux keeps the nice value per thread, so only this
    // thread (and none of the liveness monitor's heartbeats) runs at the lower priority.
    if (cfg.evaluator_nice > 0 &&
        setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), getpriority(PRIO_PROCESS, 0) + cfg.evaluator_nice) != 0) {
      STRATA_LOG(WARN) << "evaluator: could not lower its priority by " << cfg.evaluator_nice << ": " << std::strerror(errno);
    }
    // The evaluator multiplies on this one thread: STRATA_GEMM=auto resolves as for a worker of one
    // CPU replica, so its figures are bit for bit those of such a chief's final evaluation.
    model::set_multiplying_threads(1);
    EvaluatorOptions eo;
    eo.model_dir = cfg.model_dir;
    eo.eval_spec = eval_spec;
    eo.group = groups.runtime.get();
    eo.chief_rank = rt->chief_rank();
    const EvaluatorOutcome out = run_evaluator(*net, eval_set, eo);
    result.status = out.status;
    result.final_checkpoint = out.final_checkpoint;
    result.checkpoints_evaluated = out.evaluated;
    return result;
  }

  // ---- worker ----
  const int replicas = strategy.num_replicas_in_sync();
  // Every worker's replicas ("gpu:0,1" or "cpu:K"), in worker order, for the startup line and the
  // summary (workers of one job may differ: --devices auto on a mix of GPU and CPU nodes).
  ctx.worker_devices = groups.workers->allgather_strings(strategy.devices(), comm::Deadline{cfg.timeout_s, "worker devices"});
  ctx.devices_kind = ctx.worker_devices.front().substr(0, 3);
  for (const auto& d : ctx.worker_devices)
    if (d.compare(0, 3, ctx.devices_kind) != 0) ctx.devices_kind = "mixed";
  // GPU replicas: one dense model per GPU, on the replica's device and stream. Its flat buffers
  // follow the CPU model's variable order, which is checked here once (a mismatch would push every
  // gradient to the wrong variable). Only dense stacks (Model::dense_stack_shape: the built-in
  // mlp and softmax, a DNNClassifier over numeric columns without dropout) have a GPU
  // implementation.
  PerReplica<std::unique_ptr<replica::GpuMlpReplica>> gpu_models;
  // CPU replicas multiply on `replicas` threads at once (STRATA_GEMM=auto's choice depends on it).
  if (!strategy.uses_gpus()) model::set_multiplying_threads(replicas);
  if (strategy.uses_gpus()) {
    DenseStackShape stack;
    if (!net->dense_stack_shape(&stack))
      throw ConfigError("GPU replicas run dense-stack models only (the built-in mlp and softmax, or a DNNClassifier "
                        "over numeric columns without dropout); the " + ctx.model_label +
                        " model is not one (use --devices cpu)");
    const replica::GpuMlpReplica::Shape shape{stack.input_dim, stack.hidden, stack.num_classes};
    for (int r = 0; r < replicas; ++r)
      gpu_models.push_back(std::make_unique<replica::GpuMlpReplica>(strategy.device_group(), r, shape));
    const auto& gv = gpu_models.front()->variables();
    std::size_t offset = 0;
    bool same = gv.size() == vars.size();
    for (std::size_t i = 0; same && i < vars.size(); ++i) {
      same = gv[i].name == vars[i].name() && gv[i].shape == vars[i].shape() && gv[i].offset == offset &&
             static_cast<std::int64_t>(gv[i].size) == vars[i].num_elements();
      offset += gv[i].size;
    }
    if (!same) throw Error("the GPU model's variables differ from the " + ctx.model_label + " model's");
  }
  const auto sparse_names = net->sparse_variables();
  auto is_sparse = [&](const std::string& n) {
    return std::find(sparse_names.begin(), sparse_names.end(), n) != sparse_names.end();
  };
  const int epochs = train_spec.epochs > 0 ? train_spec.epochs : net->default_epochs();
  ctx.epochs = epochs;
  const data::AutoShard policy = data::parse_auto_shard(cfg.shard, "--shard");
  const std::vector<DynamicVariable>& dyn_vars = ctx.dynamic_variables;
  // The dense variables are pulled once per evaluation; the dynamic tables' rows per chunk (the
  // whole set in memory is one chunk), read-only.
  auto evaluate_job = [&](bool predictions) {
    Params p = pull_params(*net, strategy, vars);
    return evaluate_chunks(*net, eval_set, eval_spec.steps, predictions,
                           [&](const data::Dataset& chunk, std::int64_t batches_left) -> const Params& {
                             add_dynamic_rows(*net, strategy, dyn_vars, chunk, batches_left, p);
                             return p;
                           });
  };
  ctx.evaluate = [&](double* loss) {
    const EvalMetrics m = evaluate_job(false);
    if (loss) *loss = m.loss;
    return m.accuracy;
  };
  ctx.evaluate_all = [&] { return evaluate_job(true); };

  TrainSummary& summary = ctx.summary;
  summary.staleness_tracked = sopt.ps.consistency.mode != ps::Consistency::kSync;
  const bool track_staleness = summary.staleness_tracked;
  // Resume: this worker's position in the restored checkpoint (zeros when starting fresh).
  const ps::WorkerPosition resume = strategy.restored_position();
  ctx.resumed = strategy.restore_report().has_value();
  ctx.resumed_from = resume;
  ctx.position = resume;
  ctx.step = resume.step;
  ctx.global_step = strategy.global_step();
  ctx.epoch = static_cast<int>(resume.epoch);
  for (auto& h : hooks) h->after_create_session(ctx);

  std::int64_t& step = ctx.step;
  std::int64_t examples = 0, log_examples = 0;
  double window_loss = 0;
  std::int64_t window_correct = 0, window_examples = 0;
  auto t_train = Clock::now();
  auto t_log = Clock::now();
  DistributeOptions dopt;
  dopt.global_batch = cfg.global_batch;
  dopt.seed = cfg.seed;
  const bool streaming = static_cast<bool>(train_spec.stream.source);
  DistributedDataset dist = streaming ? strategy.distribute_stream(train_spec.stream, dopt)
                                      : strategy.distribute_dataset(train_set, policy, dopt);
  // Every worker runs the same number of steps per epoch (the smallest shard's): under sync
  // consistency a worker that stopped early would leave the others waiting for its gradients.
  // Shard sizes do not change between epochs (only their order does), so this is agreed once, up
  // front: no collective inside the loop, where workers resumed from one checkpoint may sit in
  // different epochs (one just past an epoch's end, another still finishing it).
  if (!streaming) dist.start_epoch(0);  // (a stream counted its share when distributed)
  long long my_batches = data::BatchIterator::num_batches(dist.examples_this_epoch(), cfg.global_batch, true);
  // Bounded like the exchange of devices above: every worker got here from it without a wait.
  const long long epoch_batches = groups.workers->allreduce(
      std::int64_t{my_batches}, comm::ReduceOp::kMin, comm::Deadline{cfg.timeout_s, "the workers' steps per epoch"});
  if (epoch_batches == 0 && rt->is_chief()) {
    STRATA_LOG(WARN) << "no step per epoch: the smallest worker's share of the training data holds fewer than "
                     << "--global-batch " << cfg.global_batch << " examples (this worker's: "
                     << dist.examples_this_epoch() << ")";
  }
  // Per-replica parameter and gradient buffers, reused every step (each replica touches its own).
  std::vector<Params> replica_params(replicas);
  std::vector<Grads> replica_grads(replicas);
  TraceWriter* trace = ctx.trace;
  liveness::set_step(step);
  liveness::set_phase(liveness::Phase::kTrain);
  // Test hook (documented in the env table): RANK:SECONDS slows that world rank by SECONDS after
  // each of its steps, a worker alive but slow.
  const double step_delay = test_hook_delay(env, "STRATA_TEST_STEP_DELAY_RANK", rt->rank());
  // STRATA_PULL_IN_PLACE=1: sync pulls read in place where they can (ReplicaContext::read_many's
  // in-place form). Off by default: it does not beat the copy (docs/PERFORMANCE.md, "Issue 21 on
  // an AMD EPYC VM").
  const bool pull_in_place = env.get_bool("STRATA_PULL_IN_PLACE", false);
  for (int epoch = static_cast<int>(resume.epoch); epoch < epochs && !ctx.stop_requested(); ++epoch) {
    const std::int64_t skip = epoch == resume.epoch ? resume.offset : 0;
    ctx.epoch = epoch;
    dist.start_epoch(epoch, skip);
    PerReplica<data::Batch> parts;
    for (long long b = skip / cfg.global_batch; b < epoch_batches && !ctx.stop_requested(); ++b) {
      auto t0 = Clock::now();
      if (!dist.next(parts)) break;
      RunValues v;
      v.input_s = since(t0);
      for (auto& h : hooks) h->before_run(ctx);
      v.batch_size = 0;
      for (const auto& p : parts) v.batch_size += p.size;
      PerReplica<double> losses(replicas);
      PerReplica<std::int64_t> corrects(replicas);
      std::vector<double> pull_s(replicas), compute_s(replicas), push_s(replicas);
      std::int64_t global_step = ctx.global_step;
      strategy.run([&](ReplicaContext& rctx) {
        const int r = rctx.replica_id_in_sync_group();
        Inputs in = inputs_of(parts[r]);
        // Where this slice sits in the job's step, for per-example randomness (dropout) that
        // depends on neither the replica count nor the run.
        in.step = static_cast<std::int64_t>(epoch) * epoch_batches + b;
        in.first_example = static_cast<std::int64_t>(strategy.worker_index()) * cfg.global_batch;
        for (int q = 0; q < r; ++q) in.first_example += parts[q].size;
        TraceWriter::Span span_step(trace, "step", r);
        // One atomic read per worker step (replica 0 only), against a step of milliseconds.
        const std::int64_t step_at_pull = (r == 0 && track_staleness) ? strategy.global_step() : 0;
        auto a = Clock::now();
        auto count_staleness = [&](std::int64_t gs) {
          if (r == 0) global_step = gs;
          if (r == 0 && track_staleness) {
            const std::int64_t s = gs - 1 - step_at_pull;
            summary.staleness_sum += s;
            ++summary.staleness_count;
            summary.staleness_max = std::max(summary.staleness_max, s);
          }
        };
        if (!gpu_models.empty()) {
          replica::GpuMlpReplica& m = *gpu_models[r];
          {
            TraceWriter::Span span(trace, "pull", r);
            m.upload_params(rctx.read_all(vars), m.num_parameters());
          }
          auto bt = Clock::now();
          {
            TraceWriter::Span span(trace, "compute", r);
            const auto res = m.train_step(in.dense, in.labels, in.size);
            losses[r] = res.loss;
            corrects[r] = res.correct;
          }
          auto c = Clock::now();
          {
            TraceWriter::Span span(trace, "all-reduce+push", r);
            rctx.apply_gradients_flat(vars, m.grads(), m.num_parameters());
            count_staleness(rctx.increment_global_step());
          }
          auto d = Clock::now();
          pull_s[r] = std::chrono::duration<double>(bt - a).count();
          compute_s[r] = std::chrono::duration<double>(c - bt).count();
          push_s[r] = std::chrono::duration<double>(d - c).count();
          return;
        }
        // This replica's buffers from the previous step: pulling into them again costs no
        // allocation and no page faults, which a fresh vector per step would add to every pull
        // (docs/PERFORMANCE.md, "Training").
        Params& params = replica_params[r];
        {
          TraceWriter::Span span(trace, "pull", r);
          // The dense variables in one batch (one completion wait for all of them), then the
          // rows each replica needs.
          // With STRATA_PULL_IN_PLACE=1 under sync, variables a PS on this node holds in one
          // shard are read in place (no copy): they stay as they are until this worker's push
          // below, where they are released first.
          std::vector<Variable> dense;
          std::vector<std::vector<float>*> dense_out;
          std::vector<model::DenseParam*> dense_params;
          for (const auto& var : vars) {
            if (is_sparse(var.name())) continue;
            model::DenseParam& p = params.dense[var.name()];
            p.shape = var.shape();
            p.in_place = nullptr;
            dense.push_back(var);
            dense_out.push_back(&p.value);
            dense_params.push_back(&p);
          }
          if (pull_in_place) {
            std::vector<const float*> views;
            rctx.read_many(dense, dense_out, views);
            for (std::size_t i = 0; i < views.size(); ++i) dense_params[i]->in_place = views[i];
          } else {
            rctx.read_many(dense, dense_out);
          }
          for (const auto& var : vars) {
            if (!is_sparse(var.name())) continue;
            model::SparseParam& sp = params.sparse[var.name()];
            sp.rows = net->rows_needed(var.name(), in);
            sp.width = static_cast<int>(var.shape().size() > 1 ? var.shape()[1] : 1);
            rctx.read_rows(var, sp.rows, sp.values);
          }
          // Dynamic tables: the batch's ids, by id (admission counting and row creation on the PS).
          for (const DynamicVariable& dv : dyn_vars) {
            model::SparseParam& sp = params.sparse[dv.name()];
            sp.rows = net->rows_needed(dv.name(), in);
            sp.width = static_cast<int>(dv.dim());
            rctx.lookup(dv, sp.rows, sp.values);
          }
        }
        auto bt = Clock::now();
        Grads& grads = replica_grads[r];
        {
          TraceWriter::Span span(trace, "compute", r);
          const StepResult res = net->step(params, in, &grads);
          losses[r] = res.loss;
          corrects[r] = res.correct;
        }
        auto c = Clock::now();
        {
          TraceWriter::Span span(trace, "all-reduce+push", r);
          for (const auto& [name, p] : params.dense)
            if (p.in_place) rctx.release_in_place(p.in_place, p.size());
          for (const auto& var : vars) {
            if (!var.trainable()) continue;
            if (is_sparse(var.name())) {
              auto& g = grads.sparse[var.name()];
              rctx.apply_sparse_gradient(var, g.rows, g.values);
            } else {
              rctx.apply_gradient(var, grads.dense[var.name()].value);
            }
          }
          // Every worker updates every dynamic table once per step (sync rounds need each
          // worker's batch, empty or not); the optimizer step is the worker's step in the job
          // (1-based), the same on every worker.
          for (const DynamicVariable& dv : dyn_vars) {
            auto& g = grads.sparse[dv.name()];
            rctx.apply_dynamic_gradient(dv, g.rows, g.values, in.step + 1);
          }
          count_staleness(rctx.increment_global_step());
        }
        auto d = Clock::now();
        pull_s[r] = std::chrono::duration<double>(bt - a).count();
        compute_s[r] = std::chrono::duration<double>(c - bt).count();
        push_s[r] = std::chrono::duration<double>(d - c).count();
      });
      ++step;
      ctx.global_step = global_step;
      liveness::set_step(step);
      ctx.position = {epoch, (b + 1) * static_cast<std::int64_t>(cfg.global_batch), step};
      if (b + 1 == epoch_batches) ctx.position = {epoch + 1, 0, step};
      v.outcome = strategy.end_step(ctx.position);
      examples += v.batch_size;
      double loss = 0;
      std::int64_t correct = 0;
      for (int r = 0; r < replicas; ++r) {
        loss += losses[r] * parts[r].size;
        correct += corrects[r];
      }
      v.step = step;
      v.global_step = global_step;
      v.epoch = epoch;
      v.loss = loss / std::max(1, v.batch_size);
      v.correct = correct;
      summary.last_loss = v.loss;
      window_loss += loss;
      window_correct += correct;
      window_examples += v.batch_size;
      v.pull_s = pull_s[0];
      v.compute_s = compute_s[0];
      v.push_s = push_s[0];
      v.step_s = since(t0);
      v.log_step = (cfg.log_step_count_steps > 0 && step % cfg.log_step_count_steps == 0) ||
                   (cfg.log_step_count_secs > 0 && since(t_log) >= cfg.log_step_count_secs);
      if (v.log_step) {
        const double dt = since(t_log);
        v.window_examples_per_sec = (examples - log_examples) / std::max(dt, 1e-9);
        v.window_loss = window_loss / std::max<std::int64_t>(1, window_examples);
        v.window_accuracy = static_cast<double>(window_correct) / std::max<std::int64_t>(1, window_examples);
      }
      for (auto& h : hooks) h->after_run(ctx, v);
      if (step_delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(step_delay));
      if (v.log_step) {
        t_log = Clock::now();
        log_examples = examples;
        window_loss = 0;
        window_correct = 0;
        window_examples = 0;
      }
    }
  }
  summary.train_s = since(t_train);
  summary.examples = examples;
  liveness::set_phase(liveness::Phase::kFinal);
  // The remaining saves and the final one, before any other wait on the workers: a worker waiting
  // elsewhere would never arrive at a save the chief requested.
  strategy.finish_training(ctx.position);
  const int status = strategy.save_error_stopped() ? kStatusFailure
                     : strategy.stopped()          ? kStatusPreempted
                                                   : kStatusOk;
  // The evaluator tasks learn that training is over and which checkpoint is the final one.
  if (ctx.is_chief && rt->count_role(Role::kEvaluator) > 0)
    notify_evaluators(*rt, *groups.runtime, strategy.final_checkpoint(), status, cfg.timeout_s);

  // Every worker's pushes must be applied before the chief evaluates the final model (and reads
  // the PS statistics): each worker waits for its own acks, then all meet.
  // (No replica thread runs here: the PS client is this thread's alone.)
  strategy.ps_client().wait_applied();
  // Test hook (documented in the env table): RANK:SECONDS holds that world rank back before the
  // workers' final barrier, a worker alive but late.
  if (const double delay = test_hook_delay(env, "STRATA_TEST_FINAL_DELAY_RANK", rt->rank()); delay > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  final_barrier(*groups.workers, groups.worker_ranks, *rt, cfg.timeout_s,
                [&strategy] { return strategy.global_step(); });
  // The job's figures, right after the barrier: every worker is here.
  const comm::Deadline figures{cfg.timeout_s, "the job's figures over the workers"};
  // Sum of every worker's throughput: the job's examples/s.
  double my_eps = examples / std::max(summary.train_s, 1e-9);
  summary.job_examples_per_sec = groups.workers->allreduce(my_eps, comm::ReduceOp::kSum, figures);
  // Update staleness over every worker's steps: sums and counts add, maxima take the max.
  std::int64_t stale_tot[2] = {summary.staleness_sum, summary.staleness_count};
  groups.workers->allreduce(stale_tot, 2, comm::ElemType::kI64, comm::ReduceOp::kSum, figures);
  summary.job_staleness_max = groups.workers->allreduce(std::int64_t{summary.staleness_max}, comm::ReduceOp::kMax, figures);
  summary.job_staleness_sum = stale_tot[0];
  summary.job_staleness_count = stale_tot[1];
  if (!strategy.checkpoint_options().directory.empty()) {
    // Every worker's save pauses, for the chief's summary: the figure that shows whether a save
    // made one worker wait for another.
    const ps::PsClient::SavePauses mine = strategy.ps_client().save_pauses();
    const double local[2] = {mine.total_s, mine.max_s};
    std::vector<double> all(2 * static_cast<std::size_t>(strategy.num_workers()));
    groups.workers->allgather(local, sizeof local, all.data(), figures);
    for (std::size_t w = 0; w < all.size() / 2; ++w) {
      summary.save_pause_s.push_back(all[2 * w]);
      summary.save_pause_max_s.push_back(all[2 * w + 1]);
    }
  }
  for (auto& h : hooks) h->end(ctx);
  result.global_step = strategy.global_step();  // every worker's increments are done by now
  result.final_checkpoint = strategy.final_checkpoint();
  strategy.finish(ctx.position);
  if (ctx.is_chief && !dyn_vars.empty()) {
    auto line = nlohmann::ordered_json::parse(ctx.deferred_summary.empty() ? "{}" : ctx.deferred_summary);
    line["dynamic"] = gather_dynamic_stats(*groups.runtime, *rt, dyn_vars, cfg.timeout_s);
    if (!ctx.deferred_summary.empty()) std::cout << line.dump() << std::endl;
  }
  result.status = strategy.save_error_stopped() ? kStatusFailure : strategy.stopped() ? kStatusPreempted : kStatusOk;
  return result;
}

}  // namespace strata::train
