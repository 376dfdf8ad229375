// Subcommands of the strata binary. Each adds its flags to the CLI11 app and runs after parsing.
// Numbers are taken as strings and parsed with strata's strict parsers, so a bad value gets the
// same one-line message everywhere ("--port-base: 'x' is not an integer").
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli/synth_ctr.h"

namespace strata::cli {

// Process exit statuses (part of the command-line contract; docs/RELIABILITY.md, "What the launchers do").
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // runtime failure
constexpr int kExitUsage = 2;    // usage or configuration error

// Footer of every command with duration flags (common/parse.h, kMaxDurationS).
constexpr const char* kDurationsFooter =
    "Durations are in seconds (--*-secs, --timeout, --stall-timeout and the *_S variables): a "
    "negative or non-finite value is a usage error; a value above 1e6 s (11.6 days) is taken as 1e6 s.";

struct ClusterFlags {
  std::string resolver = "auto";
  std::string cluster;
  std::string jobs;
  std::string port_base;
  std::string gpus_per_node;
  std::string gpus_per_task;
  std::string tasks_per_node;
  bool no_auto_set_gpu = false;
  std::string rpc_layer;
  std::string task_type;
  std::string task_id;
  std::string num_ps;
  std::string timeout;
  bool verify = false;
};
CLI::App* add_cluster_command(CLI::App& app, ClusterFlags& flags);
int run_cluster_command(const ClusterFlags& flags, int* argc, char*** argv);

struct BenchFlags {
  std::string op, min_bytes, max_bytes, factor, warmup, iters, num_ps, transport, rows, row_elems, json, timeout;
  std::string dir;    // --op checkpoint: where the files go
  bool keep = false;  // --op checkpoint: keep them
  std::string optimizer, ps_threads;  // --op apply
  std::string model, batch;           // --op step
};
CLI::App* add_bench_command(CLI::App& app, BenchFlags& flags);
int run_bench_command(const BenchFlags& flags, int* argc, char*** argv);

struct TrainFlags {
  std::string model, data, hidden, epochs, steps, global_batch, optimizer, lr, consistency, transport, placement,
      shard, cpu_replicas, num_ps, jobs, seed, log_every, log_every_secs, metrics, trace, timeout, ps_threads,
      stall_timeout;
  std::string checkpoint_dir, save_every_steps, save_every_secs, max_to_keep, keep_every_n_hours, restore;
  std::string on_save_error;  // --on-save-error stop|continue
  std::string dynamic_full_every;  // --dynamic-full-every K
  std::string devices;  // --devices auto|cpu|gpu
  std::string model_spec, eval_data;  // --model-spec FILE.json, --eval-data csv:FILE[,FILE...]
  bool streaming = false;             // --streaming
  std::string shuffle_buffer;         // --shuffle-buffer
  std::string eval_steps, eval_start_delay_secs, eval_throttle_secs, eval_best_metric;  // the evaluator task
  bool profile = false;
  bool expect_partial = false;
  bool allow_unverified = false;
};
CLI::App* add_train_command(CLI::App& app, TrainFlags& flags);
int run_train_command(const TrainFlags& flags, int* argc, char*** argv);

// `strata ckpt ls|show|verify|diff`: no MPI (the checkpoint reader is independent). `action` is
// the subcommand that was parsed; `path` is DIR/PATH/A, `path_b` is B of diff, `paths` the PATHs
// of verify.
struct CkptFlags {
  std::string action, path, path_b, atol, block_bytes;
  std::vector<std::string> paths;
  bool json = false;
  bool verify = false;
  bool allow_unverified = false;  // accept format 1 files (no integrity block)
};
CLI::App* add_ckpt_command(CLI::App& app, CkptFlags& flags);
int run_ckpt_command(const CkptFlags& flags);

struct SlurmFlags {
  std::string expr;
};
CLI::App* add_slurm_command(CLI::App& app, SlurmFlags& flags, CLI::App** hostnames, CLI::App** tasks_per_node);
int run_slurm_hostnames(const SlurmFlags& flags);
int run_slurm_tasks_per_node(const SlurmFlags& flags);

// `strata data synth-ctr`: no MPI. Numbers are kept as text for the strict parsers.
// `strata data synth-ctr`'s flags are the generator's own flag text (parsed and checked by
// parse_synth_ctr_options).
using DataFlags = SynthCtrFlagText;
CLI::App* add_data_command(CLI::App& app, DataFlags& flags, CLI::App** synth_ctr);
int run_data_synth_ctr(const DataFlags& flags);

}  // namespace strata::cli
