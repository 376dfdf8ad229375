// strata: the command-line tool. Usage and configuration errors print one line on stderr and exit
// with status 2; runtime failures exit 1 with a rank-tagged message (scripts and launchers rely on both).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include <mpi.h>

#include "cli/commands.h"
#include "strata/cluster/runtime.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/config.h"

namespace {

// CLI11 messages are single lines already; keep them single even if a future version adds more.
std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

// A usage error that comes from the command line alone, found before MPI starts, is found by every
// rank of the job alike (the same argv): only the launcher's rank 0 prints it, so the job says it
// once, the others exit 2 silently. Errors that may depend on a rank's own environment (its node's
// GPUs, its SLURM_* values) are printed by every rank that finds them: a rank-specific problem must
// never go unsaid. Outside a launcher this process is rank 0.
bool speaks_for_the_job() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    // Only a well-formed other rank stays silent: a malformed value is itself the error to report.
    const std::string r(v);
    return r.find_first_not_of("0123456789") != std::string::npos || r.find_first_not_of('0') == std::string::npos;
  }
  return true;
}

// Prints a usage error line, unless it comes from the command line alone (`from_argv`), MPI has not
// started and another rank speaks for the job.
void usage_error(const std::string& text, bool from_argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (from_argv && !initialized && !speaks_for_the_job()) {
    // Let the speaking rank say it first: a launcher ends the whole job at the first non-zero
    // exit, and a silent rank that exits first could take rank 0 down before its line is out.
    // The launcher ends this wait as soon as rank 0 exits; it is bounded either way.
    std::this_thread::sleep_for(std::chrono::seconds(5));
    return;
  }
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata::cli;
  CLI::App app{"strata " STRATA_VERSION_STRING
               ": a parameter-server training runtime for HPC clusters (MPI RMA, UCX, NCCL, parallel HDF5)",
               "strata"};
  app.require_subcommand(0, 1);
  bool help_env = false;
  app.add_flag("--help-env", help_env, "Print every environment variable strata reads, then exit");
  // The instruction set too: a "native" binary copied to an older node dies of SIGILL, and this
  // is the first thing to check.
  app.set_version_flag("--version", STRATA_VERSION_STRING " (arch " STRATA_BUILD_ARCH ")");

  ClusterFlags cluster_flags;
  CLI::App* cluster_cmd = add_cluster_command(app, cluster_flags);
  TrainFlags train_flags;
  CLI::App* train_cmd = add_train_command(app, train_flags);
  BenchFlags bench_flags;
  CLI::App* bench_cmd = add_bench_command(app, bench_flags);
  CkptFlags ckpt_flags;
  CLI::App* ckpt_cmd = add_ckpt_command(app, ckpt_flags);
  SlurmFlags slurm_flags;
  CLI::App* hostnames_cmd = nullptr;
  CLI::App* tasks_cmd = nullptr;
  add_slurm_command(app, slurm_flags, &hostnames_cmd, &tasks_cmd);
  DataFlags data_flags;
  CLI::App* synth_ctr_cmd = nullptr;
  add_data_command(app, data_flags, &synth_ctr_cmd);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    usage_error("strata: error: " + one_line(e.what()) + " (see strata --help)", true);
    return kExitUsage;
  }

  try {
    // Validate the logging variables up front: a typo in STRATA_LOG_LEVEL is a usage error, not a
    // silently ignored setting.
    strata::Env env = strata::Env::from_process();
    if (auto level = env.get("STRATA_LOG_LEVEL"); level && !level->empty()) strata::parse_log_level(*level);

    if (help_env) {
      std::cout << strata::format_env_table();
      return kExitOk;
    }
    if (cluster_cmd->parsed()) return run_cluster_command(cluster_flags, &argc, &argv);
    if (train_cmd->parsed()) return run_train_command(train_flags, &argc, &argv);
    if (bench_cmd->parsed()) return run_bench_command(bench_flags, &argc, &argv);
    if (ckpt_cmd->parsed()) return run_ckpt_command(ckpt_flags);
    if (hostnames_cmd->parsed()) return run_slurm_hostnames(slurm_flags);
    if (tasks_cmd->parsed()) return run_slurm_tasks_per_node(slurm_flags);
    if (synth_ctr_cmd->parsed()) return run_data_synth_ctr(data_flags);
    usage_error("strata: error: no command given (see strata --help)", true);
    return kExitUsage;
  } catch (const strata::ConfigError& e) {
    // A flag's own value ("--stall-timeout must be positive") is the same on every rank; anything
    // else may come from this rank's environment.
    const std::string what = one_line(e.what());
    usage_error("strata: error: " + what, what.rfind("--", 0) == 0);
    // A configuration error found by one rank after MPI started: its peers cannot know, so end
    // the job (agreed verdicts are handled inside the commands and never reach here).
    strata::abort_job(kExitUsage);
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: %s\n", one_line(e.what()).c_str());
    std::fflush(stderr);
    strata::abort_job(kExitFailure);
    return kExitFailure;
  }
}
