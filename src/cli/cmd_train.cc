// `strata train`: the main job, as a thin command over the training layer
// (strata/train/train_and_evaluate.h): flag parsing into a RunConfig, a TrainSpec and an EvalSpec
// for a built-in model (--model softmax|mlp|wide_deep) on the data --data names, and the one line
// that reports an agreed configuration error. Everything else (roles, the loop, checkpoints,
// progress lines, metrics, trace, profile, summary, the evaluator task) is the layer's.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "cli/commands.h"
#include "strata/cluster/runtime.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"
#include "strata/data/csv.h"
#include "strata/data/dataset.h"
#include "strata/data/feature_column.h"
#include "strata/model/model.h"
#include "strata/nn/builtin.h"
#include "strata/nn/model_spec.h"
#include "strata/train/train_and_evaluate.h"

namespace strata::cli {
namespace {

// Examples [begin, end) of `all` as a dataset of their own.
data::Dataset take(const data::Dataset& all, std::int64_t begin, std::int64_t end) {
  data::Dataset out = all;
  out.size = end - begin;
  out.features.assign(all.features.begin() + begin * all.dense_dim, all.features.begin() + end * all.dense_dim);
  out.sparse_ids.assign(all.sparse_ids.begin() + begin * all.num_fields, all.sparse_ids.begin() + end * all.num_fields);
  out.labels.assign(all.labels.begin() + begin, all.labels.begin() + end);
  if (!all.targets.empty()) out.targets.assign(all.targets.begin() + begin, all.targets.begin() + end);
  if (!all.file_of.empty()) out.file_of.assign(all.file_of.begin() + begin, all.file_of.begin() + end);
  return out;
}

// The training and test sets named by --data, loaded once per process on first use (the
// training layer asks for them on the ranks that need them).
struct Datasets {
  data::Dataset train, test;
  // --eval-data CSV files: read when the evaluation set is asked for (on the chief and the
  // evaluator only), not on every worker: other workers never evaluate, and a large evaluation
  // day read by every worker costs each of them its whole parse and its memory at start-up.
  std::function<data::Dataset()> read_test;
  data::FeatureLayout layout;  // CSV data under a model spec: where each feature column landed
  std::optional<data::FeatureTransform> transform;  // --streaming: the plan every batch is read with
};

// --streaming: rows read to plan the layout (and to build the model from), and per stream chunk.
constexpr std::int64_t kStreamChunkRows = 65536;
// --streaming: rows per chunk of the evaluation set (STRATA_EVAL_CHUNK_ROWS; whole evaluation
// batches of train::kEvalBatch).
constexpr std::int64_t kEvalChunkRows = 64 * train::kEvalBatch;

// "csv:A,B" -> {"A", "B"}; ConfigError naming `flag` for anything else.
std::vector<std::string> csv_files(const std::string& what, const std::string& flag) {
  if (what.rfind("csv:", 0) != 0 || what.size() == 4)
    throw ConfigError(flag + ": '" + what + "' is not csv:FILE[,FILE...] (a model spec reads CSV/TSV files)");
  std::vector<std::string> files;
  for (const auto& f : split(what.substr(4), ','))
    if (!f.empty()) files.push_back(f);
  if (files.empty()) throw ConfigError(flag + ": '" + what + "' names no file");
  return files;
}

// --eval-data's files through the training data's transform, with one line saying so (the ranks
// that evaluate read them; the line lets a user, and cli.model_spec, see which).
data::Dataset read_eval_csv(const data::FeatureTransform& transform, const std::vector<std::string>& files,
                            const data::CsvOptions& csv) {
  data::Dataset d = transform.apply(data::read_csv(files, csv));
  std::printf("strata train: evaluation data: %lld rows from %zu file(s)\n", static_cast<long long>(d.size), files.size());
  std::fflush(stdout);
  return d;
}

// The training and evaluation CSV files through the spec's feature columns: one transform, planned
// on the training table (every worker reads the same files, so every worker plans the same layout;
// the variable lists are checked across workers anyway), applied to both.
Datasets load_csv_data(const nn::ModelSpec& spec, const std::string& train, const std::string& eval) {
  Datasets d;
  const data::CsvTable table = data::read_csv(csv_files(train, "--data"), spec.csv);
  const data::FeatureTransform transform(nn::input_columns(spec.estimator), spec.label, table);
  d.train = transform.apply(table);
  d.layout = transform.layout();
  if (eval.empty()) {
    d.test = d.train;  // no evaluation data given: evaluate on the training data, as for one .h5 file
  } else {
    d.read_test = [transform, files = csv_files(eval, "--eval-data"), csv = spec.csv] {
      return read_eval_csv(transform, files, csv);
    };
  }
  return d;
}

// --streaming: the layout is planned on the first chunk of the training files (a sample, which
// also builds the model); the training batches are read later, a chunk at a time
// (streaming_input), and so is the evaluation set, at each evaluation (eval_stream).
Datasets load_csv_sample(const nn::ModelSpec& spec, const std::string& train) {
  Datasets d;
  data::CsvStream stream(csv_files(train, "--data"), spec.csv);
  data::CsvTable sample;
  if (!stream.next(sample, kStreamChunkRows)) throw ConfigError("--data " + train + ": the files hold no row");
  d.transform.emplace(nn::input_columns(spec.estimator), spec.label, sample);
  d.train = d.transform->apply(sample);
  d.layout = d.transform->layout();
  return d;
}

// --streaming's evaluation set: each pass reads the --eval-data files from the start, chunk_rows
// rows at a time, through the training sample's plan. The first pass (the chief's and the
// evaluator's check before training) also checks that every file can be opened and says what it
// reads, in one line.
train::EvalStreamFn eval_stream(std::function<const data::FeatureTransform&()> transform,
                                std::vector<std::string> files, data::CsvOptions csv, std::int64_t chunk_rows) {
  auto said = std::make_shared<bool>(false);
  return [transform = std::move(transform), files = std::move(files), csv = std::move(csv), said,
          chunk_rows]() -> train::ChunkReader {
    if (!*said) {
      for (const auto& f : files)
        if (!std::ifstream(f)) throw ConfigError("--eval-data: cannot open '" + f + "'");
      std::printf("strata train: evaluation data: streamed from %zu file(s), %lld rows at a time\n", files.size(),
                  static_cast<long long>(chunk_rows));
      std::fflush(stdout);
      *said = true;
    }
    auto stream = std::make_shared<data::CsvStream>(files, csv);
    // The reader keeps `transform` (and what it reads the plan from) alive, not a bare pointer.
    return [stream, transform, chunk_rows](data::Dataset& chunk) {
      data::CsvTable table;
      if (!stream->next(table, chunk_rows)) return false;
      chunk = transform().apply(table);
      return true;
    };
  };
}

Datasets load_data(const std::string& what, std::uint64_t seed);

// A model spec over a dense dataset (fashion-mnist[:DIR], FILE.h5): the spec's numeric columns
// take the images' features in order (data::dense_feature_layout), normalised as the columns say.
Datasets load_dense_data(const nn::ModelSpec& spec, const std::string& what, std::uint64_t seed) {
  Datasets d = load_data(what, seed);
  const std::vector<data::FeatureColumn> columns = nn::input_columns(spec.estimator);
  d.layout = data::dense_feature_layout(columns, spec.label, d.train, "--data " + what);
  data::normalize_dense(columns, d.layout, d.train, "--data " + what);
  data::normalize_dense(columns, d.layout, d.test, "--data " + what + " (its test split)");
  return d;
}

Datasets load_data(const std::string& what, std::uint64_t seed) {
  Datasets d;
  if (what == "fashion-mnist" || what.rfind("fashion-mnist:", 0) == 0) {
    std::string dir = what.size() > 14 ? what.substr(14) : "/usr/share/datasets/fashion-mnist";
    d.train = data::load_fashion_mnist(dir, true);
    d.test = data::load_fashion_mnist(dir, false);
  } else if (what == "synthetic-sparse") {
    // One generator call (same seed on every rank: the planted signal is shared), split 200k/20k.
    data::Dataset all = data::make_synthetic_sparse(220000, 8, 100000, 1.1, seed);
    d.train = take(all, 0, 200000);
    d.test = take(all, 200000, 220000);
  } else if (what.size() > 3 && what.substr(what.size() - 3) == ".h5") {
    d.train = data::load_hdf5(what);
    d.test = d.train;  // no separate test split in one file: evaluate on the training data
  } else {
    throw ConfigError("--data: '" + what +
                      "' is not fashion-mnist[:DIR], synthetic-sparse, or an .h5 file with images/labels datasets");
  }
  return d;
}

struct TrainCommand {
  train::RunConfig config;
  std::string model = "mlp";
  std::string data = "fashion-mnist";
  std::vector<int> hidden;
  int epochs = 0;           // 0: default for the model
  std::int64_t steps = -1;  // >= 0: stop after this many steps of this worker (0: none at all)
  std::shared_ptr<const nn::ModelSpec> spec;  // --model-spec: the model and the CSV layout
  std::string eval_data;                      // --eval-data
  bool streaming = false;                     // --streaming
  std::int64_t shuffle_buffer = 0;            // --shuffle-buffer (rows; streaming)
  std::int64_t eval_chunk_rows = kEvalChunkRows;  // STRATA_EVAL_CHUNK_ROWS (streaming)
  train::EvalSpec eval;     // steps, start delay, throttle, best metric (input_fn: run_train's)
};

int run_train(const TrainCommand& cmd, int* argc, char*** argv) {
  MpiSession mpi(argc, argv);
  auto sets = std::make_shared<std::unique_ptr<Datasets>>();
  // Each set is handed over once (moved, not copied: Fashion-MNIST's training set is 188 MB).
  auto load = [sets, what = cmd.data, eval = cmd.eval_data, spec = cmd.spec, seed = cmd.config.seed,
               streaming = cmd.streaming]() -> Datasets& {
    if (!*sets) {
      if (!spec) *sets = std::make_unique<Datasets>(load_data(what, seed));
      else if (streaming) *sets = std::make_unique<Datasets>(load_csv_sample(*spec, what));
      else if (what.rfind("csv:", 0) == 0) *sets = std::make_unique<Datasets>(load_csv_data(*spec, what, eval));
      else *sets = std::make_unique<Datasets>(load_dense_data(*spec, what, seed));
    }
    return **sets;
  };
  train::TrainSpec train_spec;
  train_spec.input_fn = [load] { return std::move(load().train); };
  train_spec.data_name = cmd.data;
  train_spec.max_steps = cmd.steps;
  train_spec.epochs = cmd.epochs;
  if (cmd.streaming) {
    // Each worker's share of the files (--shard), read a chunk at a time through the plan made on
    // the sample; the epoch's order from a shuffle buffer seeded with (seed, epoch).
    const std::vector<std::string> files = csv_files(cmd.data, "--data");
    const data::CsvOptions csv = cmd.spec->csv;
    const data::AutoShard policy = data::parse_auto_shard(cmd.config.shard, "--shard");
    const int batch = cmd.config.global_batch;
    const std::int64_t shuffle = cmd.shuffle_buffer;
    const std::uint64_t stream_seed = cmd.config.seed;
    train_spec.stream.examples = [files, csv, policy](const data::InputContext& ctx) {
      return data::csv_shard_rows(files, csv, policy, ctx.num_input_pipelines, ctx.input_pipeline_id, kStreamChunkRows);
    };
    // DATA sharding reads every file on every worker; its count need not: each file is counted by
    // one worker and the counts shared (ParameterServerStrategy::distribute_stream).
    train_spec.stream.shared_parts = [files, policy](const data::InputContext& ctx) -> std::int64_t {
      return data::csv_shards_by_line(files.size(), policy, ctx.num_input_pipelines)
                 ? static_cast<std::int64_t>(files.size())
                 : 0;
    };
    train_spec.stream.count_part = [files, csv](std::int64_t part) {
      return data::count_csv_rows({files.at(static_cast<std::size_t>(part))}, csv);
    };
    train_spec.stream.examples_of = [policy](const data::InputContext& ctx, const std::vector<std::int64_t>& rows) {
      return data::csv_shard_rows_of(rows, policy, ctx.num_input_pipelines, ctx.input_pipeline_id);
    };
    train_spec.stream.part_bytes = [files](std::int64_t part) -> std::uint64_t {
      std::error_code ec;
      const std::uintmax_t n = std::filesystem::file_size(files.at(static_cast<std::size_t>(part)), ec);
      return ec ? 0 : static_cast<std::uint64_t>(n);
    };
    train_spec.stream.source = [load, files, csv, policy, batch, shuffle, stream_seed](const data::InputContext& ctx,
                                                                                      int epoch) {
      return data::csv_batch_source(files, csv, *load().transform, batch, true, policy, ctx.num_input_pipelines,
                                    ctx.input_pipeline_id, kStreamChunkRows, shuffle,
                                    stream_seed * 1000003 + static_cast<std::uint64_t>(epoch));
    };
  }
  train::EvalSpec eval_spec;
  eval_spec.input_fn = [load] {
    Datasets& d = load();
    return d.read_test ? d.read_test() : std::move(d.test);
  };
  if (cmd.streaming)
    eval_spec.stream = eval_stream([load]() -> const data::FeatureTransform& { return *load().transform; },
                                   csv_files(cmd.eval_data, "--eval-data"), cmd.spec->csv, cmd.eval_chunk_rows);
  const std::string name = cmd.model;
  const std::vector<int> hidden = cmd.hidden;
  const std::uint64_t seed = cmd.config.seed;
  auto make_model = [name, hidden, seed, spec = cmd.spec, load](const data::Dataset& train) -> std::unique_ptr<train::Model> {
    if (spec) {
      nn::EstimatorConfig config = spec->estimator;
      if (config.seed == 0) config.seed = seed;
      return nn::make_estimator(config, load().layout);
    }
    return nn::make_builtin_model(name, hidden, seed, train);
  };
  eval_spec.steps = cmd.eval.steps;
  eval_spec.start_delay_secs = cmd.eval.start_delay_secs;
  eval_spec.throttle_secs = cmd.eval.throttle_secs;
  eval_spec.best_metric = cmd.eval.best_metric;
  const train::TrainResult result = train::train_and_evaluate(make_model, cmd.config, train_spec, eval_spec);
  if (!result.error.empty() && result.report_error)
    std::fprintf(stderr, "strata train: error: %s\n", result.error.c_str());
  // The job's status is also the one this rank exits with if MPI_Finalize never returns
  // (strata/cluster/runtime.h): 75 after preemption, 2 after a usage verdict.
  mpi.set_exit_status(result.status);
  return result.status;
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainFlags& f) {
  CLI::App* cmd = app.add_subcommand("train", "Train a built-in model with parameter servers (under mpirun/srun)");
  cmd->add_option("--model", f.model, "softmax|mlp|wide_deep (default mlp)");
  cmd->add_option("--model-spec", f.model_spec,
                  "a JSON model file: feature columns, a canned estimator and its parameters (docs/MODELS.md); "
                  "reads --data csv:FILE, or fashion-mnist[:DIR] / FILE.h5 for a spec of numeric columns");
  cmd->add_option("--data", f.data,
                  "fashion-mnist[:DIR] | synthetic-sparse | FILE.h5 | csv:FILE[,FILE...] with --model-spec "
                  "(default fashion-mnist)");
  cmd->add_flag("--streaming", f.streaming,
               "with --model-spec and --data csv:...: read the training and --eval-data files a chunk at a time, "
               "never whole (files larger than memory); the layout is planned on the training files' first 65536 "
               "rows; needs --eval-data");
  cmd->add_option("--shuffle-buffer", f.shuffle_buffer,
                  "with --streaming: rows in the shuffle buffer (TF's Dataset.shuffle; default 65536, 0 keeps "
                  "file order)");
  cmd->add_option("--eval-data", f.eval_data,
                  "with --model-spec: csv:FILE[,FILE...] to evaluate on (default: the training data)");
  cmd->add_option("--hidden", f.hidden, "hidden layer widths, e.g. 256,128");
  cmd->add_option("--epochs", f.epochs, "passes over each worker's shard (default: per model)");
  cmd->add_option("--steps", f.steps, "stop each worker after this many steps");
  cmd->add_option("--global-batch", f.global_batch, "examples per worker step, split over its replicas (default 128)");
  cmd->add_option("--optimizer", f.optimizer, "sgd|momentum|adagrad|adam|rmsprop|ftrl[:key=value,...] (default adam)");
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
                  "threads each PS rank applies a stateful optimizer and serves large dynamic-table calls with "
                  "(default STRATA_PS_THREADS or 1; bit-identical results for any value)");
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
  cmd->add_option("--dynamic-full-every", f.dynamic_full_every,
                  "dynamic variables: every Kth save writes their tables full, the others only the rows changed "
                  "since the previous save (default 8; 1 = always full)");
  cmd->add_option("--restore", f.restore, "latest (the --checkpoint-dir's newest valid checkpoint) | FILE.h5 | DIR");
  cmd->add_flag("--expect-partial", f.expect_partial, "do not report checkpoint variables the model does not use");
  cmd->add_flag("--allow-unverified", f.allow_unverified,
                "with --restore: accept format 1 checkpoints, which have no integrity block (refused by default)");
  cmd->add_option("--eval-steps", f.eval_steps,
                  "evaluate at most N batches of 1000 test examples (the chief's final evaluation and the "
                  "evaluator task; default 0 = all)");
  cmd->add_option("--eval-start-delay-secs", f.eval_start_delay_secs,
                  "evaluator task: wait this long before the first evaluation (default 0)");
  cmd->add_option("--eval-throttle-secs", f.eval_throttle_secs,
                  "evaluator task: at least this long between evaluations; the final checkpoint is always "
                  "evaluated (default 0)");
  cmd->add_option("--eval-best-metric", f.eval_best_metric,
                  "evaluator task: accuracy|loss|auc (a binary classifier's), which evaluation's checkpoint "
                  "<checkpoint-dir>/best/ keeps (default accuracy)");
  cmd->add_option("--timeout", f.timeout, "seconds each wait for another rank may take before naming who is late (default STRATA_TIMEOUT_S or 120)");
  cmd->add_option("--stall-timeout", f.stall_timeout,
                  "seconds without a heartbeat after which a rank counts as stopped and the job ends naming it "
                  "(default STRATA_STALL_TIMEOUT_S or 10)");
  cmd->footer(kDurationsFooter);
  return cmd;
}

int run_train_command(const TrainFlags& f, int* argc, char*** argv) {
  // The environment's defaults (RunConfig::from_environment), except for the variables whose flag
  // was given: a flag wins, and a malformed variable it overrides is never read.
  Env::Vars vars = Env::from_process().vars();
  if (!f.transport.empty()) vars.erase("STRATA_TRANSPORT");
  if (!f.cpu_replicas.empty()) vars.erase("STRATA_CPU_REPLICAS");
  if (!f.ps_threads.empty()) vars.erase("STRATA_PS_THREADS");
  if (!f.stall_timeout.empty()) vars.erase("STRATA_STALL_TIMEOUT_S");
  if (!f.timeout.empty()) vars.erase("STRATA_TIMEOUT_S");
  if (!f.on_save_error.empty()) vars.erase("STRATA_ON_SAVE_ERROR");
  const Env env(std::move(vars));
  TrainCommand cmd;
  train::RunConfig& cfg = cmd.config;
  cfg = train::RunConfig::from_environment(env);
  if (f.streaming) {
    cmd.eval_chunk_rows = env.get_int("STRATA_EVAL_CHUNK_ROWS", kEvalChunkRows);
    if (cmd.eval_chunk_rows < train::kEvalBatch || cmd.eval_chunk_rows > (std::int64_t{1} << 30) ||
        cmd.eval_chunk_rows % train::kEvalBatch != 0)
      throw ConfigError("STRATA_EVAL_CHUNK_ROWS: " + std::to_string(cmd.eval_chunk_rows) +
                        " rows; expected a multiple of " + std::to_string(train::kEvalBatch) +
                        " (the evaluation batch) from " + std::to_string(train::kEvalBatch) + " to 2^30");
  }
  if (!f.model.empty()) cmd.model = f.model;
  if (!f.data.empty()) cmd.data = f.data;
  if (!f.hidden.empty())
    for (const auto& h : split(f.hidden, ',')) cmd.hidden.push_back(parse_int(h, "--hidden", 1, 1 << 16));
  if (!f.epochs.empty()) cmd.epochs = parse_int(f.epochs, "--epochs", 1, 1 << 20);
  if (!f.steps.empty()) {
    cmd.steps = parse_int64(f.steps, "--steps");
    if (cmd.steps < 0) throw ConfigError("--steps must not be negative");
  }
  if (!f.global_batch.empty()) cfg.global_batch = parse_int(f.global_batch, "--global-batch", 1, 1 << 24);
  cfg.optimizer = f.optimizer;
  if (!f.lr.empty()) cfg.learning_rate = parse_double(f.lr, "--lr");
  if (!f.lr.empty() && cfg.learning_rate <= 0) throw ConfigError("--lr must be positive");
  if (!f.consistency.empty()) cfg.consistency = f.consistency;
  if (!f.transport.empty()) cfg.transport = f.transport;
  if (!f.placement.empty()) cfg.placement = f.placement;
  if (!f.shard.empty()) cfg.shard = f.shard;
  if (!f.cpu_replicas.empty()) cfg.cpu_replicas = parse_int(f.cpu_replicas, "--cpu-replicas", 1, 1024);
  if (!f.ps_threads.empty()) cfg.ps_threads = parse_int(f.ps_threads, "--ps-threads", 1, 1024);
  // Default auto, except that an explicit --cpu-replicas asks for CPU replicas (a GPU machine would
  // otherwise ignore it); with an explicit --devices auto it is the count used where no GPU is.
  if (!f.devices.empty()) cfg.devices = parse_device_policy(f.devices, "--devices");
  else if (!f.cpu_replicas.empty()) cfg.devices = DevicePolicy::kCpu;
  if (!f.num_ps.empty()) cfg.num_ps = parse_int(f.num_ps, "--num-ps", 0, 1 << 20);
  if (!f.jobs.empty()) cfg.jobs = cluster::parse_jobs_spec(f.jobs);
  if (!f.seed.empty()) cfg.seed = parse_uint64(f.seed, "--seed");
  if (!f.log_every.empty()) cfg.log_step_count_steps = parse_int(f.log_every, "--log-every", 0, 1 << 30);
  if (!f.log_every_secs.empty()) cfg.log_step_count_secs = parse_seconds(f.log_every_secs, "--log-every-secs");
  cfg.metrics_path = f.metrics;
  cfg.trace_path = f.trace;
  cfg.profile = f.profile;
  cfg.timeout_s = resolve_timeout(f.timeout, env);
  if (!f.stall_timeout.empty())
    cfg.stall_timeout_s = parse_seconds(f.stall_timeout, "--stall-timeout", ZeroSeconds::kRejected);
  cfg.model_dir = f.checkpoint_dir;
  if (!f.save_every_steps.empty()) cfg.save_checkpoints_steps = parse_int64(f.save_every_steps, "--save-every-steps");
  if (cfg.save_checkpoints_steps < 0) throw ConfigError("--save-every-steps must not be negative");
  if (!f.save_every_secs.empty()) cfg.save_checkpoints_secs = parse_seconds(f.save_every_secs, "--save-every-secs");
  if (!f.max_to_keep.empty()) cfg.keep_checkpoint_max = parse_int(f.max_to_keep, "--max-to-keep", 0, 1 << 30);
  if (!f.keep_every_n_hours.empty()) {
    // A retention age compared with file times, not a clock deadline: TensorFlow's default is
    // 10,000 hours, so the cap is in hours (kMaxKeepHours) rather than kMaxDurationS.
    const double hours = parse_double(f.keep_every_n_hours, "--keep-every-n-hours");
    if (hours < 0) throw ConfigError("--keep-every-n-hours must not be negative, got '" + f.keep_every_n_hours + "'");
    cfg.keep_checkpoint_every_n_hours = std::min(hours, kMaxKeepHours);
  }
  if (!f.dynamic_full_every.empty())
    cfg.dynamic_full_every = parse_int(f.dynamic_full_every, "--dynamic-full-every", 1, 1 << 30);
  const bool saving_flags = !f.save_every_steps.empty() || !f.save_every_secs.empty() || !f.max_to_keep.empty() ||
                            !f.keep_every_n_hours.empty() || !f.on_save_error.empty() || !f.dynamic_full_every.empty();
  if (saving_flags && cfg.model_dir.empty())
    throw ConfigError(
        "--save-every-steps/--save-every-secs/--max-to-keep/--keep-every-n-hours/--on-save-error/--dynamic-full-every "
        "need --checkpoint-dir");
  if (!f.on_save_error.empty()) {
    if (f.on_save_error != "stop" && f.on_save_error != "continue")
      throw ConfigError("--on-save-error: '" + f.on_save_error + "' is not stop or continue");
    cfg.stop_on_save_error = f.on_save_error == "stop";
  }
  if (!f.eval_steps.empty()) {
    cmd.eval.steps = parse_int64(f.eval_steps, "--eval-steps");
    if (cmd.eval.steps < 0) throw ConfigError("--eval-steps must not be negative");
  }
  if (!f.eval_start_delay_secs.empty())
    cmd.eval.start_delay_secs = parse_seconds(f.eval_start_delay_secs, "--eval-start-delay-secs");
  if (!f.eval_throttle_secs.empty())
    cmd.eval.throttle_secs = parse_seconds(f.eval_throttle_secs, "--eval-throttle-secs");
  if (!f.eval_best_metric.empty()) cmd.eval.best_metric = f.eval_best_metric;
  if (cmd.eval.best_metric != "accuracy" && cmd.eval.best_metric != "loss" && cmd.eval.best_metric != "auc")
    throw ConfigError("--eval-best-metric: '" + cmd.eval.best_metric + "' is not accuracy, loss or auc");
  cfg.restore = f.restore;
  cfg.expect_partial = f.expect_partial;
  cfg.allow_unverified_restore = f.allow_unverified;
  if (cfg.restore == "latest" && cfg.model_dir.empty())
    throw ConfigError("--restore latest needs --checkpoint-dir (or give --restore FILE.h5|DIR)");
  // Cheap checks before MPI starts, so a typo fails fast even outside mpirun.
  ps::ConsistencyConfig::parse(cfg.consistency);
  ps::parse_placement_policy(cfg.placement);
  data::parse_auto_shard(cfg.shard, "--shard");
  if (!f.model_spec.empty()) {
    if (!f.model.empty() || !f.hidden.empty())
      throw ConfigError("--model-spec describes the model: --model and --hidden do not go with it");
    if (f.data.empty())
      throw ConfigError("--model-spec needs --data csv:FILE[,FILE...] (or fashion-mnist[:DIR] or FILE.h5 for a spec of "
                        "numeric columns)");
    if (f.data.rfind("csv:", 0) == 0) {
      csv_files(f.data, "--data");
      if (!f.eval_data.empty()) csv_files(f.eval_data, "--eval-data");
    } else {
      if (f.data == "synthetic-sparse")
        throw ConfigError("--data synthetic-sparse holds sparse ids without columns; a --model-spec reads csv:FILE, "
                          "fashion-mnist[:DIR] or FILE.h5");
      if (!f.eval_data.empty())
        throw ConfigError("--eval-data csv:... goes with --data csv:...; " + f.data + " brings its own evaluation data");
    }
    auto spec = std::make_shared<nn::ModelSpec>(nn::load_model_spec(f.model_spec));
    // The spec's training defaults, where no flag gave one.
    if (f.optimizer.empty() && !spec->optimizer.empty()) cfg.optimizer = spec->optimizer;
    if (!f.optimizer.empty()) spec->estimator.part_optimizer_defaults = false;  // job-wide choice (estimator.h)
    if (f.lr.empty() && spec->learning_rate > 0) cfg.learning_rate = spec->learning_rate;
    if (f.epochs.empty() && spec->epochs > 0) cmd.epochs = spec->epochs;
    if (f.global_batch.empty() && spec->batch_size > 0) cfg.global_batch = spec->batch_size;
    cmd.spec = std::move(spec);
    cmd.eval_data = f.eval_data;
    if (f.streaming) {
      if (f.data.rfind("csv:", 0) != 0) throw ConfigError("--streaming reads --data csv:FILE[,FILE...]");
      if (f.eval_data.empty())
        throw ConfigError("--streaming needs --eval-data csv:FILE[,FILE...] (the training files are never held whole)");
      cmd.streaming = true;
      cmd.shuffle_buffer = f.shuffle_buffer.empty() ? 65536 : parse_int64(f.shuffle_buffer, "--shuffle-buffer");
      if (cmd.shuffle_buffer < 0 || cmd.shuffle_buffer > (std::int64_t{1} << 28))
        throw ConfigError("--shuffle-buffer: " + f.shuffle_buffer + " is not a row count in [0, 2^28]");
    } else if (!f.shuffle_buffer.empty()) {
      throw ConfigError("--shuffle-buffer goes with --streaming (in-memory data is shuffled whole every epoch)");
    }
    if (cfg.devices == DevicePolicy::kGpu)
      throw ConfigError("--devices gpu: GPU replicas run the mlp and softmax models; a --model-spec model runs on CPU "
                        "replicas (--devices cpu)");
    cfg.devices = DevicePolicy::kCpu;
    return run_train(cmd, argc, argv);
  }
  if (f.streaming) throw ConfigError("--streaming goes with --model-spec and --data csv:...");
  if (!f.shuffle_buffer.empty()) throw ConfigError("--shuffle-buffer goes with --model-spec and --streaming");
  if (!f.eval_data.empty()) throw ConfigError("--eval-data goes with --model-spec (a built-in model evaluates on its data's test split)");
  if (cmd.data.rfind("csv:", 0) == 0) throw ConfigError("--data csv:... needs --model-spec FILE.json (the columns and the model)");
  const auto& names = model::model_names();
  if (std::find(names.begin(), names.end(), cmd.model) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("--model: '" + cmd.model + "' is not one of " + known);
  }
  // GPU replicas run the dense models; wide_deep (sparse embeddings) runs on CPU replicas.
  if (cmd.model == "wide_deep") {
    if (cfg.devices == DevicePolicy::kGpu)
      throw ConfigError("--devices gpu: GPU replicas run the mlp and softmax models; wide_deep runs on CPU replicas "
                        "(--devices cpu)");
    cfg.devices = DevicePolicy::kCpu;
  }
  if (cfg.devices == DevicePolicy::kGpu && !f.cpu_replicas.empty())
    throw ConfigError("--cpu-replicas sets CPU replicas; with --devices gpu a worker runs one replica per GPU");
  return run_train(cmd, argc, argv);
}

}  // namespace strata::cli
