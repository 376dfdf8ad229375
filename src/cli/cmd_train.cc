// `strata train`: the main job. Trains a built-in model with ParameterServerStrategy under
// mpirun/srun: PS ranks serve the variables, every worker runs its own training loop over its
// shard of the data (asynchronous between workers by default), its replicas split each batch and
// all-reduce their gradients, which are pushed once per worker and step.
//
// Replicas (--devices auto|cpu|gpu, DESIGN.md section 4): GPU replicas, one per GPU the worker
// uses (choose_replica_gpus), run the dense models (mlp, softmax) with cuBLAS (GpuMlpReplica): each
// step the first replica pulls the weights once into a shared host buffer, every replica uploads
// it and runs forward/backward on its slice of the batch, one NCCL all-reduce (MEAN) reduces the
// flat gradient, the first replica stages it to host and pushes it. Otherwise --cpu-replicas
// threads run the Eigen model. Evaluation always runs on the chief's host.
//
// The chief prints a progress line every --log-every steps or --log-every-secs seconds, evaluates on
// the test set after every worker finished, and ends with one JSON summary line (DESIGN.md 7).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "strata/cluster/liveness.h"
#include "strata/cluster/runtime.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/parse.h"
#include "strata/common/signals.h"
#include "strata/common/trace.h"
#include "strata/data/dataset.h"
#include "strata/model/model.h"
#include "strata/replica/gpu.h"
#include "strata/strategy/parameter_server_strategy.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct TrainConfig {
  std::string model = "mlp";
  std::string data = "fashion-mnist";
  std::vector<int> hidden;
  int epochs = 0;              // 0: default for the model
  std::int64_t steps = -1;     // >= 0: stop after this many steps of this worker (0: none at all)
  int global_batch = 128;      // one worker step, split over its replicas
  std::string optimizer;       // "" = default for the model
  double lr = 0;               // 0 = optimizer default
  std::string consistency = "async";
  std::string transport = "auto";
  std::string placement = "round_robin";
  std::string shard = "auto";
  int cpu_replicas = 1;
  int ps_threads = 1;               // optimizer threads per PS rank
  std::uint64_t max_arena_bytes = 0;  // STRATA_PS_MAX_ARENA_BYTES (0: no cap)
  DevicePolicy devices = DevicePolicy::kAuto;
  int num_ps = -1;
  cluster::JobsSpec jobs;
  std::uint64_t seed = 1;
  int log_every = 100;
  double log_every_secs = 10;
  std::string metrics_path;
  std::string trace_path;
  bool profile = false;
  double timeout_s = 120;
  double stall_timeout_s = 10;      // liveness: a rank silent this long has stopped
  double progress_timeout_s = 120;  // liveness: a training worker frozen while others move (0: off)
  CheckpointOptions checkpoint;
  std::string restore;  // "" none, "latest" = the checkpoint dir's newest valid one, else a path
  bool expect_partial = false;
  std::int64_t restarts = 0;  // STRATA_RESTART_COUNT: relaunches of this job by its launcher (summary only)
};

// Examples [begin, end) of `all` as a dataset of their own.
data::Dataset take(const data::Dataset& all, std::int64_t begin, std::int64_t end) {
  data::Dataset out = all;
  out.size = end - begin;
  out.features.assign(all.features.begin() + begin * all.dense_dim, all.features.begin() + end * all.dense_dim);
  out.sparse_ids.assign(all.sparse_ids.begin() + begin * all.num_fields, all.sparse_ids.begin() + end * all.num_fields);
  out.labels.assign(all.labels.begin() + begin, all.labels.begin() + end);
  if (!all.file_of.empty()) out.file_of.assign(all.file_of.begin() + begin, all.file_of.begin() + end);
  return out;
}

// Loads the training and test sets named by --data.
struct Datasets {
  data::Dataset train, test;
};

Datasets load_data(const TrainConfig& cfg) {
  Datasets d;
  if (cfg.data == "fashion-mnist" || cfg.data.rfind("fashion-mnist:", 0) == 0) {
    std::string dir = cfg.data.size() > 14 ? cfg.data.substr(14) : "/usr/share/datasets/fashion-mnist";
    d.train = data::load_fashion_mnist(dir, true);
    d.test = data::load_fashion_mnist(dir, false);
  } else if (cfg.data == "synthetic-sparse") {
    // Same generator and seed on every rank: the planted signal is shared, the splits disjoint.
    // One generator call (same seed on every rank: the planted signal is shared), split 200k/20k.
    data::Dataset all = data::make_synthetic_sparse(220000, 8, 100000, 1.1, cfg.seed);
    d.train = take(all, 0, 200000);
    d.test = take(all, 200000, 220000);
  } else if (cfg.data.size() > 3 && cfg.data.substr(cfg.data.size() - 3) == ".h5") {
    d.train = data::load_hdf5(cfg.data);
    d.test = d.train;  // no separate test split in one file: evaluate on the training data
  } else {
    throw ConfigError("--data: '" + cfg.data +
                      "' is not fashion-mnist[:DIR], synthetic-sparse, or an .h5 file with images/labels datasets");
  }
  return d;
}

model::ModelConfig model_config(const TrainConfig& cfg, const data::Dataset& train) {
  model::ModelConfig m;
  m.name = cfg.model;
  m.input_dim = train.dense_dim;
  m.num_classes = train.num_classes;
  m.hidden = cfg.hidden;
  m.num_fields = train.num_fields;
  m.vocab = train.sparse_vocab;
  m.seed = cfg.seed;
  return m;
}

model::Inputs inputs_of(const data::Batch& b) {
  model::Inputs in;
  in.size = b.size;
  in.dense = b.features.empty() ? nullptr : b.features.data();
  in.dense_dim = b.dense_dim;
  in.sparse_ids = b.sparse_ids.empty() ? nullptr : b.sparse_ids.data();
  in.num_fields = b.num_fields;
  in.labels = b.labels.data();
  return in;
}

// Per-step time split, for --profile.
struct Profile {
  double pull = 0, compute = 0, push = 0, input = 0, total = 0;
  std::int64_t steps = 0;
};

// Update staleness of this worker's gradients: how many other workers' updates reached the PS
// between the global step read just before this step's pull and this step's own increment
// (the quantity docs/SCALING.md models: about W-1 for W equal workers in async mode). Only
// meaningful where the PS applies each push on arrival (async, staleness:N); under sync the
// PS applies a round's gradients together and the parameters read are never stale.
struct UpdateStaleness {
  std::int64_t sum = 0, count = 0, max = 0;
  void add(std::int64_t s) {
    sum += s;
    ++count;
    max = std::max(max, s);
  }
};

// Evaluates `model` on `ds` with the given parameters (chief, single thread).
double evaluate(const model::Model& model, ParameterServerStrategy& strategy, const std::vector<Variable>& vars,
                const data::Dataset& ds, double* loss_out) {
  model::Params params;
  for (const auto& v : vars) {
    model::DenseParam p;
    strategy.read(v, p.value);
    p.shape = v.shape();
    params.dense[v.name()] = std::move(p);
  }
  // Sparse tables are evaluated from full dense pulls: fine for the built-in sizes.
  for (const auto& name : model.sparse_variables()) {
    auto it = params.dense.find(name);
    model::SparseParam sp;
    sp.width = static_cast<int>(it->second.shape.size() > 1 ? it->second.shape[1] : 1);
    sp.values = std::move(it->second.value);
    for (std::int64_t r = 0; r < it->second.shape[0]; ++r) sp.rows.push_back(r);
    params.dense.erase(it);
    params.sparse[name] = std::move(sp);
  }
  std::vector<std::int64_t> all(static_cast<std::size_t>(ds.size));
  for (std::int64_t i = 0; i < ds.size; ++i) all[i] = i;
  data::BatchIterator it(ds, all, 1000, false, 2);
  data::Batch batch;
  std::int64_t correct = 0, seen = 0;
  double loss = 0;
  while (it.next(batch)) {
    std::int64_t c = 0;
    loss += model.train_step(params, inputs_of(batch), nullptr, &c) * batch.size;
    correct += c;
    seen += batch.size;
  }
  if (loss_out) *loss_out = seen ? loss / seen : 0;
  return seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0;
}

int train_in_session(const TrainConfig& cfg);

// MPI lives around the whole job; the status the job returns is also the one a rank exits with if
// MPI_Finalize never returns (strata/cluster/runtime.h).
int run_train(const TrainConfig& cfg, int* argc, char*** argv) {
  MpiSession mpi(argc, argv);
  const int status = train_in_session(cfg);
  mpi.set_exit_status(status);
  return status;
}

int train_in_session(const TrainConfig& cfg) {
  Env env = Env::from_process();
  auto t_start = Clock::now();
  BootstrapOptions boot;
  boot.timeout_s = cfg.timeout_s;
  if (cfg.num_ps >= 0) boot.resolve.num_ps = cfg.num_ps;
  boot.resolve.jobs = cfg.jobs;
  std::unique_ptr<Runtime> rt;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  try {
    rt = Runtime::bootstrap(MPI_COMM_WORLD, env, boot);
  } catch (const ConfigError& e) {
    if (world_rank == 0) std::fprintf(stderr, "strata train: error: %s\n", e.message().c_str());
    return kExitUsage;
  }
  // Heartbeats from here on: a stopped or frozen rank ends the job within seconds, named
  // (strata/cluster/liveness.h). Declared after the runtime, so it stops before the runtime goes.
  LivenessOptions live_opt;
  live_opt.stop_timeout_s = cfg.stall_timeout_s;
  live_opt.stall_timeout_s = cfg.progress_timeout_s;
  LivenessMonitor live(*rt, live_opt);
  liveness::set_phase(liveness::Phase::kRestore);

  // Every rank validates the configuration the same way, so a bad flag ends every rank cleanly.
  StrategyOptions sopt;
  std::unique_ptr<model::Model> net;
  Datasets sets;
  std::string config_error;
  // The replicas' devices first: a collective every rank completes before any rank can fail below
  // (the validation that follows only runs when it found nothing wrong).
  try {
    sopt.gpus = choose_replica_gpus(*rt, env, cfg.devices, cfg.timeout_s);
  } catch (const ConfigError& e) {
    config_error = e.message();
  }
  if (config_error.empty()) try {
    std::string opt =
        cfg.optimizer.empty() ? (cfg.model == "wide_deep" && cfg.lr == 0 ? "adagrad:lr=0.2" : cfg.model == "wide_deep" ? "adagrad" : "adam")
                              : cfg.optimizer;
    if (cfg.lr > 0) opt += (opt.find(':') == std::string::npos ? ":lr=" : ",lr=") + std::to_string(cfg.lr);
    sopt.ps.optimizer = ps::OptimizerConfig::parse(opt);
    sopt.ps.consistency = ps::ConsistencyConfig::parse(cfg.consistency);
    sopt.ps.placement = ps::parse_placement_policy(cfg.placement);
    sopt.ps.transport = cfg.transport;
    sopt.ps.timeout_s = cfg.timeout_s;
    sopt.ps.apply_threads = cfg.ps_threads;
    sopt.ps.max_arena_bytes = cfg.max_arena_bytes;
    sopt.cpu_replicas = cfg.cpu_replicas;
    if (rt->role() != Role::kPs) {
      // This worker's replicas: its GPUs, or the CPU threads.
      const int replicas = sopt.gpus.empty() ? cfg.cpu_replicas : static_cast<int>(sopt.gpus.size());
      data::InputContext ictx{1, 0, replicas};
      ictx.get_per_replica_batch_size(cfg.global_batch);
      sets = load_data(cfg);
    }
    // Workers build the model from the data's shape; PS ranks receive the chief's variable list.
    if (rt->role() != Role::kPs) net = model::make_model(model_config(cfg, sets.train));
  } catch (const ConfigError& e) {
    config_error = e.message();
  }
  // Agree on the verdict: the first rank's error, in one line, on every rank.
  std::vector<std::string> verdicts = allgather_strings(rt->comms().runtime(), config_error, cfg.timeout_s, "train config");
  for (std::size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r].empty()) continue;
    // One line for the job: the first rank that found a problem reports it.
    if (rt->rank() == static_cast<int>(r)) std::fprintf(stderr, "strata train: error: %s\n", verdicts[r].c_str());
    return kExitUsage;
  }

  ParameterServerStrategy strategy(*rt, sopt);
  std::vector<Variable> vars;
  try {
    strategy.set_checkpoint_options(cfg.checkpoint);
    if (!cfg.restore.empty()) {
      RestoreOptions ropt;
      ropt.expect_partial = cfg.expect_partial;
      strategy.restore(cfg.restore == "latest" ? cfg.checkpoint.directory : cfg.restore, ropt);
    }
    strategy.scope([&] {
      if (net)
        for (auto& spec : net->variables()) vars.push_back(strategy.create_variable(spec));
    });
  } catch (const ConfigError& e) {
    // Raised identically on every rank (restore verdicts are agreed before anything is allocated).
    if (rt->rank() == 0) std::fprintf(stderr, "strata train: error: %s\n", e.message().c_str());
    return kExitUsage;
  }
  std::unique_ptr<TraceWriter> trace;
  if (!cfg.trace_path.empty()) {
    std::string path = cfg.trace_path;
    if (rt->size() > 1) {
      auto dot = path.rfind(".json");
      path = (dot == std::string::npos ? path : path.substr(0, dot)) + ".rank" + std::to_string(rt->rank()) + ".json";
    }
    trace = std::make_unique<TraceWriter>(path, rt->rank(), rt->task().str());
  }
  if (strategy.is_ps()) {
    liveness::set_phase(liveness::Phase::kServe);
    const bool preempted = strategy.serve();
    if (strategy.save_error_stopped()) return kExitFailure;
    return preempted ? kExitPreempted : kExitOk;
  }

  // ---- worker ----
  const int workers = strategy.num_workers();
  const int replicas = strategy.num_replicas_in_sync();
  // Every worker's replicas ("gpu:0,1" or "cpu:K"), in worker order, for the startup line and the
  // summary (workers of one job may differ: --devices auto on a mix of GPU and CPU nodes).
  const std::vector<std::string> worker_devices =
      allgather_strings(rt->comms().workers(), strategy.devices(), cfg.timeout_s, "worker devices");
  std::string devices_kind = worker_devices.front().substr(0, 3);
  for (const auto& d : worker_devices)
    if (d.compare(0, 3, devices_kind) != 0) devices_kind = "mixed";
  if (strategy.is_chief()) {
    std::ostringstream line;
    line << "strata train: " << net->describe() << ", " << workers << " worker(s) + " << rt->count_role(Role::kPs)
         << " PS; replicas:";
    for (std::size_t w = 0; w < worker_devices.size(); ++w) {
      const std::string& d = worker_devices[w];
      const bool gpu = d.compare(0, 4, "gpu:") == 0;
      const std::string list = d.substr(4);
      const long count = gpu ? 1 + std::count(list.begin(), list.end(), ',') : std::stol(list);
      line << (w ? "," : "") << " worker " << w << " = " << count << (gpu ? " x GPU [" + list + "]" : " x CPU");
    }
    line << " (--devices " << to_string(cfg.devices) << ")";
    std::cout << line.str() << std::endl;
    std::cout << "strata train: transport " << strategy.parameter_servers().transport_description() << std::endl;
  }
  // GPU replicas: one dense model per GPU, on the replica's device and stream. Its flat buffers
  // follow the CPU model's variable order, which is checked here once (a mismatch would push every
  // gradient to the wrong variable).
  PerReplica<std::unique_ptr<replica::GpuMlpReplica>> gpu_models;
  if (strategy.uses_gpus()) {
    const model::ModelConfig& mc = net->config();
    const replica::GpuMlpReplica::Shape shape{mc.input_dim, mc.hidden, mc.num_classes};
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
    if (!same) throw Error("the GPU model's variables differ from the " + cfg.model + " model's");
  }
  const auto sparse_names = net->sparse_variables();
  auto is_sparse = [&](const std::string& n) {
    return std::find(sparse_names.begin(), sparse_names.end(), n) != sparse_names.end();
  };
  // Defaults measured on this 2-core machine with 1 PS + 2 workers (docs/PERFORMANCE.md): mlp 15
  // epochs gave 0.888 (async) / 0.890 (sync) / 0.879 (staleness:2) in ~30 s, so 20 leaves margin
  // above 0.88; softmax 15 ~ 0.84; wide_deep 3 on synthetic-sparse ~ 0.81 (chance 0.5).
  const int epochs = cfg.epochs > 0 ? cfg.epochs : (cfg.model == "wide_deep" ? 3 : 20);
  const data::AutoShard policy = data::parse_auto_shard(cfg.shard, "--shard");
  std::ofstream metrics;
  if (!cfg.metrics_path.empty() && strategy.is_chief()) {
    metrics.open(cfg.metrics_path);
    if (!metrics) throw ConfigError("--metrics: cannot create '" + cfg.metrics_path + "'");
  }

  Profile prof;
  UpdateStaleness staleness;
  const bool track_staleness = sopt.ps.consistency.mode != ps::Consistency::kSync;
  // Resume: this worker's position in the restored checkpoint (zeros when starting fresh).
  const ps::WorkerPosition resume = strategy.restored_position();
  ps::WorkerPosition position = resume;
  std::int64_t step = resume.step, examples = 0, global_step = strategy.global_step();
  if (strategy.restore_report() && strategy.is_chief())
    std::cout << "resuming at epoch " << (resume.epoch + 1) << ", step " << resume.step << ", global step "
              << global_step << std::endl;
  double last_loss = 0, window_loss = 0;
  std::int64_t window_correct = 0, window_examples = 0;
  auto t_train = Clock::now();
  auto t_log = Clock::now();
  std::int64_t log_examples = 0;
  bool stop = cfg.steps >= 0 && step >= cfg.steps;
  bool preempted = false;
  DistributeOptions dopt;
  dopt.global_batch = cfg.global_batch;
  dopt.seed = cfg.seed;
  DistributedDataset dist = strategy.distribute_dataset(sets.train, policy, dopt);
  // Every worker runs the same number of steps per epoch (the smallest shard's): under sync
  // consistency a worker that stopped early would leave the others waiting for its gradients.
  // Shard sizes do not change between epochs (only their order does), so this is agreed once, up
  // front: no collective inside the loop, where workers resumed from one checkpoint may sit in
  // different epochs (one just past an epoch's end, another still finishing it).
  dist.start_epoch(0);
  long long my_batches = data::BatchIterator::num_batches(dist.examples_this_epoch(), cfg.global_batch, true);
  long long epoch_batches = 0;
  STRATA_CHECK_MPI(MPI_Allreduce(&my_batches, &epoch_batches, 1, MPI_LONG_LONG, MPI_MIN, rt->comms().workers()));
  // Per-replica parameter and gradient buffers, reused every step (each replica touches its own).
  std::vector<model::Params> replica_params(replicas);
  std::vector<model::Grads> replica_grads(replicas);
  liveness::set_step(step);
  liveness::set_phase(liveness::Phase::kTrain);
  for (int epoch = static_cast<int>(resume.epoch); epoch < epochs && !stop; ++epoch) {
    const std::int64_t skip = epoch == resume.epoch ? resume.offset : 0;
    dist.start_epoch(epoch, skip);
    PerReplica<data::Batch> parts;
    for (long long b = skip / cfg.global_batch; b < epoch_batches && !stop; ++b) {
      auto t0 = Clock::now();
      if (!dist.next(parts)) break;
      prof.input += since(t0);
      data::Batch batch;
      batch.size = 0;
      for (const auto& p : parts) batch.size += p.size;
      PerReplica<double> losses(replicas);
      PerReplica<std::int64_t> corrects(replicas);
      std::vector<double> pull_s(replicas), compute_s(replicas), push_s(replicas);
      strategy.run([&](ReplicaContext& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        const model::Inputs in = inputs_of(parts[r]);
        TraceWriter::Span span_step(trace.get(), "step", r);
        // One atomic read per worker step (replica 0 only), against a step of milliseconds.
        const std::int64_t step_at_pull = (r == 0 && track_staleness) ? strategy.global_step() : 0;
        auto a = Clock::now();
        if (!gpu_models.empty()) {
          replica::GpuMlpReplica& m = *gpu_models[r];
          {
            TraceWriter::Span span(trace.get(), "pull", r);
            m.upload_params(ctx.read_all(vars), m.num_parameters());
          }
          auto b = Clock::now();
          {
            TraceWriter::Span span(trace.get(), "compute", r);
            const auto result = m.train_step(in.dense, in.labels, in.size);
            losses[r] = result.loss;
            corrects[r] = result.correct;
          }
          auto c = Clock::now();
          {
            TraceWriter::Span span(trace.get(), "all-reduce+push", r);
            ctx.apply_gradients_flat(vars, m.grads(), m.num_parameters());
            std::int64_t gs = ctx.increment_global_step();
            if (r == 0) global_step = gs;
            if (r == 0 && track_staleness) staleness.add(gs - 1 - step_at_pull);
          }
          auto d = Clock::now();
          pull_s[r] = std::chrono::duration<double>(b - a).count();
          compute_s[r] = std::chrono::duration<double>(c - b).count();
          push_s[r] = std::chrono::duration<double>(d - c).count();
          return;
        }
        // This replica's buffers from the previous step: pulling into them again costs no
        // allocation and no page faults (a fresh 1 MB vector per step made the MLP's pull several
        // times slower than the transport's own bandwidth).
        model::Params& params = replica_params[r];
        {
          TraceWriter::Span span(trace.get(), "pull", r);
          // The dense variables in one batch (one completion wait for all of them), then the
          // rows each replica needs.
          std::vector<Variable> dense;
          std::vector<std::vector<float>*> dense_out;
          for (const auto& v : vars) {
            if (is_sparse(v.name())) continue;
            model::DenseParam& p = params.dense[v.name()];
            p.shape = v.shape();
            dense.push_back(v);
            dense_out.push_back(&p.value);
          }
          ctx.read_many(dense, dense_out);
          for (const auto& v : vars) {
            if (!is_sparse(v.name())) continue;
            model::SparseParam& sp = params.sparse[v.name()];
            sp.rows = net->rows_needed(v.name(), in);
            sp.width = static_cast<int>(v.shape().size() > 1 ? v.shape()[1] : 1);
            ctx.read_rows(v, sp.rows, sp.values);
          }
        }
        auto b = Clock::now();
        model::Grads& grads = replica_grads[r];
        std::int64_t correct = 0;
        {
          TraceWriter::Span span(trace.get(), "compute", r);
          losses[r] = net->train_step(params, in, &grads, &correct);
        }
        corrects[r] = correct;
        auto c = Clock::now();
        {
          TraceWriter::Span span(trace.get(), "all-reduce+push", r);
          for (const auto& v : vars) {
            if (!v.trainable()) continue;
            if (is_sparse(v.name())) {
              auto& g = grads.sparse[v.name()];
              ctx.apply_sparse_gradient(v, g.rows, g.values);
            } else {
              ctx.apply_gradient(v, grads.dense[v.name()].value);
            }
          }
          std::int64_t gs = ctx.increment_global_step();
          if (r == 0) global_step = gs;
          if (r == 0 && track_staleness) staleness.add(gs - 1 - step_at_pull);
        }
        auto d = Clock::now();
        pull_s[r] = std::chrono::duration<double>(b - a).count();
        compute_s[r] = std::chrono::duration<double>(c - b).count();
        push_s[r] = std::chrono::duration<double>(d - c).count();
      });
      ++step;
      liveness::set_step(step);
      position = {epoch, (b + 1) * static_cast<std::int64_t>(cfg.global_batch), step};
      if (b + 1 == epoch_batches) position = {epoch + 1, 0, step};
      const StepOutcome outcome = strategy.end_step(position);
      if (outcome.stop && outcome.save_failed) {
        stop = true;  // PS 0 reported the failed save (--on-save-error stop)
        if (strategy.is_chief())
          std::cout << "checkpoint save failed at step " << step << ": stopping with status " << kExitFailure
                    << " (--on-save-error stop)" << std::endl;
      } else if (outcome.stop) {
        stop = preempted = true;
        if (strategy.is_chief())
          std::cout << "preempted (SIGTERM or SIGUSR1 reached " << (preemption_signal() ? "the chief" : "a rank")
                    << "): checkpoint saved at step " << step << ", stopping with status " << kExitPreempted
                    << std::endl;
      }
      examples += batch.size;
      double loss = 0;
      std::int64_t correct = 0;
      for (int r = 0; r < replicas; ++r) {
        loss += losses[r] * parts[r].size;
        correct += corrects[r];
      }
      last_loss = loss / std::max(1, batch.size);
      window_loss += loss;
      window_correct += correct;
      window_examples += batch.size;
      prof.pull += pull_s[0];
      prof.compute += compute_s[0];
      prof.push += push_s[0];
      prof.total += since(t0);
      ++prof.steps;
      if (cfg.steps >= 0 && step >= cfg.steps) stop = true;

      const bool log_now = (cfg.log_every > 0 && step % cfg.log_every == 0) ||
                           (cfg.log_every_secs > 0 && since(t_log) >= cfg.log_every_secs);
      if (log_now && strategy.is_chief()) {
        double dt = since(t_log);
        double eps = (examples - log_examples) / std::max(dt, 1e-9);
        std::ostringstream line;
        line << "step " << step << " global_step " << global_step << " epoch " << (epoch + 1) << "/" << epochs
             << std::fixed << std::setprecision(4) << " loss " << window_loss / std::max<std::int64_t>(1, window_examples)
             << " acc " << static_cast<double>(window_correct) / std::max<std::int64_t>(1, window_examples)
             << std::setprecision(0) << " examples/s " << eps << " staleness "
             << strategy.parameter_servers().max_observed_staleness();
        std::cout << line.str() << std::endl;
        if (metrics.is_open())
          metrics << nlohmann::json{{"step", step},
                                    {"global_step", global_step},
                                    {"epoch", epoch + 1},
                                    {"loss", window_loss / std::max<std::int64_t>(1, window_examples)},
                                    {"accuracy", static_cast<double>(window_correct) / std::max<std::int64_t>(1, window_examples)},
                                    {"examples_per_sec", eps},
                                    {"wall_s", since(t_start)}}
                         .dump()
                  << "\n"
                  << std::flush;
        t_log = Clock::now();
        log_examples = examples;
        window_loss = 0;
        window_correct = 0;
        window_examples = 0;
      }
    }
  }
  const double train_s = since(t_train);
  liveness::set_phase(liveness::Phase::kFinal);
  // The remaining saves and the final one, before any other wait on the workers: a worker waiting
  // elsewhere would never arrive at a save the chief requested.
  strategy.finish_training(position);

  // Every worker's pushes must be applied before the chief evaluates the final model (and reads
  // the PS statistics): each worker waits for its own acks, then all meet.
  // (No replica thread runs here: the PS client is this thread's alone.)
  strategy.parameter_servers().wait_applied();
  {
    MPI_Request request;
    STRATA_CHECK_MPI(MPI_Ibarrier(rt->comms().workers(), &request));
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg.timeout_s * 10));
    int done = 0;
    while (!done) {
      STRATA_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
      if (!done && Clock::now() > deadline) throw TimeoutError("workers did not all finish training", {});
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // Sum of every worker's throughput: the job's examples/s.
  double my_eps = examples / std::max(train_s, 1e-9), job_eps = 0;
  STRATA_CHECK_MPI(MPI_Allreduce(&my_eps, &job_eps, 1, MPI_DOUBLE, MPI_SUM, rt->comms().workers()));
  // Update staleness over every worker's steps: sums and counts add, maxima take the max.
  long long stale_sums[2] = {staleness.sum, staleness.count}, stale_tot[2] = {0, 0};
  long long stale_max = staleness.max, stale_job_max = 0;
  STRATA_CHECK_MPI(MPI_Allreduce(stale_sums, stale_tot, 2, MPI_LONG_LONG, MPI_SUM, rt->comms().workers()));
  STRATA_CHECK_MPI(MPI_Allreduce(&stale_max, &stale_job_max, 1, MPI_LONG_LONG, MPI_MAX, rt->comms().workers()));
  if (cfg.profile) {
    std::ostringstream p;
    p << std::fixed << std::setprecision(2) << "profile " << rt->task().str() << ": " << prof.steps
      << " steps, per step " << 1e3 * prof.total / std::max<std::int64_t>(1, prof.steps) << " ms = compute "
      << 1e3 * prof.compute / std::max<std::int64_t>(1, prof.steps) << " ms + pull "
      << 1e3 * prof.pull / std::max<std::int64_t>(1, prof.steps) << " ms + all-reduce/push "
      << 1e3 * prof.push / std::max<std::int64_t>(1, prof.steps) << " ms + input "
      << 1e3 * prof.input / std::max<std::int64_t>(1, prof.steps) << " ms; communication "
      << 100.0 * (prof.pull + prof.push) / std::max(prof.total, 1e-9) << "% of step time";
    if (track_staleness && staleness.count > 0)
      p << "; update staleness mean " << static_cast<double>(staleness.sum) / staleness.count << " max "
        << staleness.max;
    std::cout << p.str() << std::endl;
  }
  // Each PS's utilisation over the training time (every push is applied by now): the input
  // docs/SCALING.md needs to say how many PS ranks a job wants.
  std::vector<double> ps_busy;
  if (cfg.profile && strategy.is_chief()) {
    const auto stats = strategy.parameter_servers().ps_stats();
    for (std::size_t p = 0; p < stats.size(); ++p) {
      const auto& st = stats[p];
      ps_busy.push_back(st.busy_s / std::max(train_s, 1e-9));
      std::ostringstream line;
      line << std::fixed << std::setprecision(2) << "profile ps:" << p << ": busy " << st.busy_s << " s of the "
           << train_s << " s of training = " << 100.0 * ps_busy.back() << "%; " << st.updates << " updates of "
           << st.elements << " elements";
      if (st.busy_s > 0) line << ", " << 1e-6 * static_cast<double>(st.elements) / st.busy_s << " M elements/s";
      if (st.split_updates > 0)
        line << "; " << st.split_updates << " split over up to " << st.max_threads << " threads";
      if (st.updates == 0)
        line << (sopt.ps.optimizer.kind == ps::OptimizerKind::kSgd && sopt.ps.consistency.mode != ps::Consistency::kSync
                     ? " (async SGD pushes are MPI accumulates: no PS work)"
                     : " (no update reached this PS)");
      std::cout << line.str() << std::endl;
    }
  }
  if (strategy.is_chief()) {
    double test_loss = 0;
    double acc = evaluate(*net, strategy, vars, sets.test, &test_loss);
    nlohmann::ordered_json summary = {{"test_accuracy", acc},
                                      {"test_loss", test_loss},
                                      {"examples_per_sec", job_eps},
                                      {"global_step", strategy.global_step()},
                                      {"wall_s", since(t_start)},
                                      {"train_s", train_s},
                                      {"final_loss", last_loss},
                                      {"model", cfg.model},
                                      {"data", cfg.data},
                                      {"workers", workers},
                                      {"ps", rt->count_role(Role::kPs)},
                                      {"replicas_per_worker", replicas},
                                      {"devices", devices_kind},
                                      {"worker_devices", worker_devices},
                                      {"optimizer", ps::to_string(sopt.ps.optimizer)},
                                      {"consistency", sopt.ps.consistency.to_string()},
                                      {"epochs", epochs},
                                      {"steps", step}};
    if (track_staleness && stale_tot[1] > 0)
      summary["update_staleness"] = {{"mean", static_cast<double>(stale_tot[0]) / static_cast<double>(stale_tot[1])},
                                     {"max", stale_job_max}};
    if (!cfg.checkpoint.directory.empty()) {
      summary["checkpoint_dir"] = cfg.checkpoint.directory;
      summary["checkpoints_saved"] = strategy.parameter_servers().saves_completed();
      if (strategy.parameter_servers().save_failures() > 0)
        summary["checkpoint_save_failures"] = strategy.parameter_servers().save_failures();
      if (!strategy.final_checkpoint().empty()) summary["final_checkpoint"] = strategy.final_checkpoint();
      if (strategy.save_error_stopped()) summary["stopped_on_save_error"] = true;
    }
    if (strategy.restore_report()) summary["restored_from"] = strategy.restore_report()->path;
    if (preempted) summary["preempted"] = true;
    summary["restarts"] = cfg.restarts;
    if (cfg.profile) {
      summary["comm_fraction"] = (prof.pull + prof.push) / std::max(prof.total, 1e-9);
      summary["ps_busy_fraction"] = ps_busy;
    }
    std::cout << summary.dump() << std::endl;
  }
  strategy.finish(position);
  if (strategy.save_error_stopped()) return kExitFailure;
  return strategy.stopped() ? kExitPreempted : kExitOk;
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainFlags& f) {
  CLI::App* cmd = app.add_subcommand("train", "Train a built-in model with parameter servers (under mpirun/srun)");
  cmd->add_option("--model", f.model, "softmax|mlp|wide_deep (default mlp)");
  cmd->add_option("--data", f.data, "fashion-mnist[:DIR] | synthetic-sparse | FILE.h5 (default fashion-mnist)");
  cmd->add_option("--hidden", f.hidden, "hidden layer widths, e.g. 256,128");
  cmd->add_option("--epochs", f.epochs, "passes over each worker's shard (default: per model)");
  cmd->add_option("--steps", f.steps, "stop each worker after this many steps");
  cmd->add_option("--global-batch", f.global_batch, "examples per worker step, split over its replicas (default 128)");
  cmd->add_option("--optimizer", f.optimizer, "sgd|momentum|adagrad|adam|rmsprop[:key=value,...] (default adam)");
  cmd->add_option("--lr", f.lr, "learning rate (default: the optimizer's)");
  cmd->add_option("--consistency", f.consistency, "async|sync|staleness:N (default async)");
  cmd->add_option("--transport", f.transport, "auto|mpi|tcp|ucx (default STRATA_TRANSPORT or auto: shared memory within a node; between nodes MPI RMA where probed one-sided, else tcp)");
  cmd->add_option("--placement", f.placement, "round_robin|greedy (default round_robin)");
  cmd->add_option("--shard", f.shard, "auto|file|data|off input auto-shard policy (default auto)");
  cmd->add_option("--devices", f.devices,
                  "auto|cpu|gpu: replicas on the worker's GPUs (one per GPU) or CPU threads (default auto: GPUs "
                  "when the worker sees one; cpu when --cpu-replicas is given)");
  cmd->add_option("--cpu-replicas", f.cpu_replicas,
                  "CPU replicas per worker when it runs on CPU (default STRATA_CPU_REPLICAS or 1)");
  cmd->add_option("--ps-threads", f.ps_threads,
                  "threads each PS rank applies a stateful optimizer with (default STRATA_PS_THREADS or 1; "
                  "bit-identical results for any value)");
  cmd->add_option("--num-ps", f.num_ps, "MPI or Slurm: the first N ranks are PS (default STRATA_NUM_PS or 1)");
  cmd->add_option("--jobs", f.jobs, "Slurm/MPI roles in rank order, e.g. ps=1,worker=3 (default: --num-ps)");
  cmd->add_option("--seed", f.seed, "seed of initializers, shuffles and synthetic data (default 1)");
  cmd->add_option("--log-every", f.log_every, "progress line every N steps (default 100; 0 = off)");
  cmd->add_option("--log-every-secs", f.log_every_secs, "and/or every T seconds (default 10)");
  cmd->add_option("--metrics", f.metrics, "append progress records to FILE.jsonl (chief)");
  cmd->add_option("--trace", f.trace, "write a Chrome-trace timeline (FILE.json, one per rank)");
  cmd->add_flag("--profile", f.profile, "report each worker's split between compute and communication");
  cmd->add_option("--checkpoint-dir", f.checkpoint_dir, "save HDF5 checkpoints here (at the end, and as below)");
  cmd->add_option("--save-every-steps", f.save_every_steps, "also save every N global steps (default 0 = off)");
  cmd->add_option("--save-every-secs", f.save_every_secs, "also save every T seconds (default 0 = off)");
  cmd->add_option("--max-to-keep", f.max_to_keep, "keep the newest K checkpoints (default 5; 0 = all)");
  cmd->add_option("--keep-every-n-hours", f.keep_every_n_hours, "also keep one checkpoint per N hours (default 0 = off)");
  cmd->add_option("--on-save-error", f.on_save_error,
                  "stop|continue: after a failed checkpoint save (e.g. disk full) stop with status 1, or warn and "
                  "keep training (default STRATA_ON_SAVE_ERROR or stop); the previous checkpoint stays committed");
  cmd->add_option("--restore", f.restore, "latest (the --checkpoint-dir's newest valid checkpoint) | FILE.h5 | DIR");
  cmd->add_flag("--expect-partial", f.expect_partial, "do not report checkpoint variables the model does not use");
  cmd->add_option("--timeout", f.timeout, "seconds any wait may take before naming who is late (default 120)");
  cmd->add_option("--stall-timeout", f.stall_timeout,
                  "seconds without a heartbeat after which a rank counts as stopped and the job ends naming it "
                  "(default STRATA_STALL_TIMEOUT_S or 10)");
  return cmd;
}

int run_train_command(const TrainFlags& f, int* argc, char*** argv) {
  Env env = Env::from_process();
  TrainConfig cfg;
  if (!f.model.empty()) cfg.model = f.model;
  if (!f.data.empty()) cfg.data = f.data;
  if (!f.hidden.empty())
    for (const auto& h : split(f.hidden, ',')) cfg.hidden.push_back(parse_int(h, "--hidden", 1, 1 << 16));
  if (!f.epochs.empty()) cfg.epochs = parse_int(f.epochs, "--epochs", 1, 1 << 20);
  if (!f.steps.empty()) {
    cfg.steps = parse_int64(f.steps, "--steps");
    if (cfg.steps < 0) throw ConfigError("--steps must not be negative");
  }
  if (!f.global_batch.empty()) cfg.global_batch = parse_int(f.global_batch, "--global-batch", 1, 1 << 24);
  cfg.optimizer = f.optimizer;
  if (!f.lr.empty()) cfg.lr = parse_double(f.lr, "--lr");
  if (!f.lr.empty() && cfg.lr <= 0) throw ConfigError("--lr must be positive");
  if (!f.consistency.empty()) cfg.consistency = f.consistency;
  cfg.transport = f.transport.empty() ? env.get_string("STRATA_TRANSPORT", "auto") : f.transport;
  if (!f.placement.empty()) cfg.placement = f.placement;
  if (!f.shard.empty()) cfg.shard = f.shard;
  cfg.cpu_replicas = f.cpu_replicas.empty()
                         ? static_cast<int>(env.get_int("STRATA_CPU_REPLICAS", 1))
                         : parse_int(f.cpu_replicas, "--cpu-replicas", 1, 1024);
  if (cfg.cpu_replicas < 1) throw ConfigError("STRATA_CPU_REPLICAS must be at least 1");
  cfg.ps_threads = f.ps_threads.empty() ? static_cast<int>(env.get_int("STRATA_PS_THREADS", 1))
                                        : parse_int(f.ps_threads, "--ps-threads", 1, 1024);
  if (cfg.ps_threads < 1 || cfg.ps_threads > 1024) throw ConfigError("STRATA_PS_THREADS must be between 1 and 1024");
  {
    const std::int64_t cap = env.get_int("STRATA_PS_MAX_ARENA_BYTES", 0);
    if (cap < 0) throw ConfigError("STRATA_PS_MAX_ARENA_BYTES must not be negative");
    cfg.max_arena_bytes = static_cast<std::uint64_t>(cap);
  }
  // Default auto, except that an explicit --cpu-replicas asks for CPU replicas (a GPU machine would
  // otherwise ignore it); with an explicit --devices auto it is the count used where no GPU is.
  if (!f.devices.empty()) cfg.devices = parse_device_policy(f.devices, "--devices");
  else if (!f.cpu_replicas.empty()) cfg.devices = DevicePolicy::kCpu;
  if (!f.num_ps.empty()) cfg.num_ps = parse_int(f.num_ps, "--num-ps", 0, 1 << 20);
  else if (!env.has("STRATA_NUM_PS")) cfg.num_ps = 1;
  if (!f.jobs.empty()) cfg.jobs = cluster::parse_jobs_spec(f.jobs);
  if (!f.seed.empty()) cfg.seed = parse_uint64(f.seed, "--seed");
  if (!f.log_every.empty()) cfg.log_every = parse_int(f.log_every, "--log-every", 0, 1 << 30);
  if (!f.log_every_secs.empty()) cfg.log_every_secs = parse_double(f.log_every_secs, "--log-every-secs");
  cfg.metrics_path = f.metrics;
  cfg.trace_path = f.trace;
  cfg.profile = f.profile;
  if (!f.timeout.empty()) cfg.timeout_s = parse_double(f.timeout, "--timeout");
  cfg.stall_timeout_s = f.stall_timeout.empty() ? env.get_double("STRATA_STALL_TIMEOUT_S", 10.0)
                                                : parse_double(f.stall_timeout, "--stall-timeout");
  if (cfg.stall_timeout_s <= 0) throw ConfigError("--stall-timeout must be positive");
  cfg.progress_timeout_s = env.get_double("STRATA_PROGRESS_TIMEOUT_S", 120.0);
  if (cfg.progress_timeout_s < 0) throw ConfigError("STRATA_PROGRESS_TIMEOUT_S must not be negative");
  cfg.restarts = env.get_int("STRATA_RESTART_COUNT", 0);
  if (cfg.restarts < 0) throw ConfigError("STRATA_RESTART_COUNT must not be negative");
  if (cfg.timeout_s <= 0) throw ConfigError("--timeout must be positive");
  cfg.checkpoint.directory = f.checkpoint_dir;
  if (!f.save_every_steps.empty())
    cfg.checkpoint.save_every_steps = parse_int64(f.save_every_steps, "--save-every-steps");
  if (cfg.checkpoint.save_every_steps < 0) throw ConfigError("--save-every-steps must not be negative");
  if (!f.save_every_secs.empty()) cfg.checkpoint.save_every_secs = parse_double(f.save_every_secs, "--save-every-secs");
  if (cfg.checkpoint.save_every_secs < 0) throw ConfigError("--save-every-secs must not be negative");
  if (!f.max_to_keep.empty()) cfg.checkpoint.max_to_keep = parse_int(f.max_to_keep, "--max-to-keep", 0, 1 << 30);
  if (!f.keep_every_n_hours.empty())
    cfg.checkpoint.keep_every_n_hours = parse_double(f.keep_every_n_hours, "--keep-every-n-hours");
  if (cfg.checkpoint.keep_every_n_hours < 0) throw ConfigError("--keep-every-n-hours must not be negative");
  const bool saving_flags = !f.save_every_steps.empty() || !f.save_every_secs.empty() || !f.max_to_keep.empty() ||
                            !f.keep_every_n_hours.empty() || !f.on_save_error.empty();
  if (saving_flags && cfg.checkpoint.directory.empty())
    throw ConfigError(
        "--save-every-steps/--save-every-secs/--max-to-keep/--keep-every-n-hours/--on-save-error need --checkpoint-dir");
  {
    const std::string policy =
        f.on_save_error.empty() ? env.get_string("STRATA_ON_SAVE_ERROR", "stop") : f.on_save_error;
    const std::string what = f.on_save_error.empty() ? "STRATA_ON_SAVE_ERROR" : "--on-save-error";
    if (policy != "stop" && policy != "continue")
      throw ConfigError(what + ": '" + policy + "' is not stop or continue");
    cfg.checkpoint.stop_on_save_error = policy == "stop";
  }
  cfg.restore = f.restore;
  cfg.expect_partial = f.expect_partial;
  if (cfg.restore == "latest" && cfg.checkpoint.directory.empty())
    throw ConfigError("--restore latest needs --checkpoint-dir (or give --restore FILE.h5|DIR)");
  // Cheap checks before MPI starts, so a typo fails fast even outside mpirun.
  ps::ConsistencyConfig::parse(cfg.consistency);
  ps::parse_placement_policy(cfg.placement);
  data::parse_auto_shard(cfg.shard, "--shard");
  const auto& names = model::model_names();
  if (std::find(names.begin(), names.end(), cfg.model) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("--model: '" + cfg.model + "' is not one of " + known);
  }
  // GPU replicas run the dense models; wide_deep (sparse embeddings) runs on CPU replicas.
  if (cfg.model == "wide_deep") {
    if (cfg.devices == DevicePolicy::kGpu)
      throw ConfigError("--devices gpu: GPU replicas run the mlp and softmax models; wide_deep runs on CPU replicas "
                        "(--devices cpu)");
    cfg.devices = DevicePolicy::kCpu;
  }
  if (cfg.devices == DevicePolicy::kGpu && !f.cpu_replicas.empty())
    throw ConfigError("--cpu-replicas sets CPU replicas; with --devices gpu a worker runs one replica per GPU");
  return run_train(cfg, argc, argv);
}

}  // namespace strata::cli
