// `strata cluster [--verify]`: resolve this process's cluster and task and print it as JSON, or,
// under mpirun/srun with --verify, run the bootstrap cross-checks and print the rank table.
#include <iostream>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "strata/cluster/resolve.h"
#include "strata/cluster/runtime.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"
#include "strata/common/rank_context.h"

namespace strata::cli {
namespace {

constexpr int kIntMax = std::numeric_limits<int>::max();

cluster::ResolveOptions resolve_options(const ClusterFlags& f) {
  cluster::ResolveOptions o;
  o.resolver = cluster::parse_resolver_kind(f.resolver);
  o.cluster = f.cluster;
  if (!f.jobs.empty()) o.jobs = cluster::parse_jobs_spec(f.jobs);
  if (!f.port_base.empty()) o.port_base = parse_int(f.port_base, "--port-base", 1, 65535);
  if (!f.gpus_per_node.empty()) o.gpus_per_node = parse_int(f.gpus_per_node, "--gpus-per-node", 0, 1 << 16);
  if (!f.gpus_per_task.empty()) o.gpus_per_task = parse_int(f.gpus_per_task, "--gpus-per-task", 0, 1 << 16);
  if (!f.tasks_per_node.empty()) o.tasks_per_node = parse_int(f.tasks_per_node, "--tasks-per-node", 1, 1 << 20);
  o.auto_set_gpu = !f.no_auto_set_gpu;
  if (!f.rpc_layer.empty()) o.rpc_layer = f.rpc_layer;
  if (!f.task_type.empty()) o.task_type = f.task_type;
  if (!f.task_id.empty()) o.task_id = parse_int(f.task_id, "--task-id", 0, kIntMax);
  if (!f.num_ps.empty()) o.num_ps = parse_int(f.num_ps, "--num-ps", 0, kIntMax);
  return o;
}

double timeout_seconds(const ClusterFlags& f, const Env& env) {
  const double t = resolve_timeout(f.timeout, env);
  return t;
}

void print_line(std::FILE* stream, const std::string& text) {
  std::string line = text + "\n";
  std::fwrite(line.data(), 1, line.size(), stream);
  std::fflush(stream);
}

// --verify: collective over MPI_COMM_WORLD. Every rank reaches the same verdict, so a configuration
// error ends every rank with status 2 after a clean MPI_Finalize; anything else aborts the job.
int run_verify(const ClusterFlags& flags, int* argc, char*** argv) {
  Env env = Env::from_process();
  BootstrapOptions options;
  options.resolve = resolve_options(flags);
  options.timeout_s = timeout_seconds(flags, env);
  MpiSession mpi(argc, argv);
  try {
    std::unique_ptr<Runtime> runtime = Runtime::bootstrap(MPI_COMM_WORLD, env, options);
    if (runtime->is_chief()) std::cout << runtime->table() << std::flush;
    return kExitOk;
  } catch (const ConfigError& e) {
    print_line(stderr, "strata cluster --verify: error: " + std::string(e.what()));
    mpi.set_exit_status(kExitUsage);
    return kExitUsage;
  } catch (const std::exception& e) {
    print_line(stderr, "strata cluster --verify: " + std::string(e.what()));
    MPI_Abort(MPI_COMM_WORLD, kExitFailure);
    return kExitFailure;
  }
}

}  // namespace

CLI::App* add_cluster_command(CLI::App& app, ClusterFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "cluster", "Resolve this process's cluster and task and print JSON; with --verify, cross-check every rank");
  cmd->add_option("--resolver", f.resolver, "auto|explicit|tfconfig|slurm|mpi (default auto)");
  cmd->add_option("--cluster", f.cluster, "explicit cluster: JSON text or a file (TF_CONFIG-shaped or a job map)");
  cmd->add_option("--jobs", f.jobs, "ordered jobs spec for the slurm/mpi resolvers, e.g. ps=1,worker=3");
  cmd->add_option("--port-base", f.port_base, "first port on each node (default 8888)");
  cmd->add_option("--gpus-per-node", f.gpus_per_node, "GPUs on each node (default: SLURM_GPUS_ON_NODE or detected)");
  cmd->add_option("--gpus-per-task", f.gpus_per_task, "GPUs per task (default: GPUs per node / tasks per node)");
  cmd->add_option("--tasks-per-node", f.tasks_per_node, "tasks on every node (default: from Slurm)");
  cmd->add_flag("--no-auto-set-gpu", f.no_auto_set_gpu, "do not assign CUDA_VISIBLE_DEVICES per task");
  cmd->add_option("--rpc-layer", f.rpc_layer, "rpc layer to report (default: TF_CONFIG's, grpc for slurm, mpi for mpi)");
  cmd->add_option("--task-type", f.task_type, "override the resolved task type");
  cmd->add_option("--task-id", f.task_id, "override the resolved task index");
  cmd->add_option("--num-ps", f.num_ps, "mpi resolver: the first N world ranks are PS (default 0)");
  cmd->add_option("--timeout", f.timeout, "seconds each wait for another rank may take (default STRATA_TIMEOUT_S or 120)");
  cmd->add_flag("--verify", f.verify, "under mpirun/srun: cross-check every rank and print the rank table");
  cmd->footer(kDurationsFooter);
  return cmd;
}

int run_cluster_command(const ClusterFlags& flags, int* argc, char*** argv) {
  if (flags.verify) return run_verify(flags, argc, argv);

  Env env = Env::from_process();
  cluster::ResolveOptions options = resolve_options(flags);
  cluster::ProcessInfo process;
  process.hostname = short_hostname();
  process.physical_gpus = cluster::count_physical_gpus();
  process.rank = cluster::launcher_rank_hint(env);
  process.size = cluster::launcher_size_hint(env);

  if (cluster::choose_resolver(env, options) == cluster::ResolverKind::kMpi) {
    // Addresses need every rank's host: initialise MPI (a singleton when not under mpirun).
    double timeout = timeout_seconds(flags, env);
    MpiSession mpi(argc, argv);
    MPI_Comm comm = MPI_COMM_NULL;
    STRATA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &process.rank);
    MPI_Comm_size(comm, &process.size);
    int status = kExitOk;
    try {
      process.rank_hosts = gather_hostnames(comm, timeout);
      print_line(stdout, cluster::resolve(env, options, process).to_json());
    } catch (const ConfigError& e) {
      print_line(stderr, "strata: error: " + std::string(e.what()));
      status = kExitUsage;
    } catch (const std::exception& e) {
      print_line(stderr, "strata cluster: " + std::string(e.what()));
      MPI_Abort(MPI_COMM_WORLD, kExitFailure);
    }
    MPI_Comm_free(&comm);
    return status;
  }
  print_line(stdout, cluster::resolve(env, options, process).to_json());
  return kExitOk;
}

}  // namespace strata::cli
