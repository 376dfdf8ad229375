// RunConfig's environment defaults: the same variables, defaults and messages `strata train` has
// always used (common/env.cc lists them).
#include "strata/train/run_config.h"

#include "strata/checkpoint/mpiio_hints.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"

namespace strata::train {

RunConfig RunConfig::from_environment(const Env& env) {
  RunConfig c;
  c.transport = env.get_string("STRATA_TRANSPORT", "auto");
  c.cpu_replicas = static_cast<int>(env.get_int("STRATA_CPU_REPLICAS", 1));
  if (c.cpu_replicas < 1) throw ConfigError("STRATA_CPU_REPLICAS must be at least 1");
  c.ps_threads = static_cast<int>(env.get_int("STRATA_PS_THREADS", 1));
  if (c.ps_threads < 1 || c.ps_threads > 1024) throw ConfigError("STRATA_PS_THREADS must be between 1 and 1024");
  const std::int64_t cap = env.get_int("STRATA_PS_MAX_ARENA_BYTES", 0);
  if (cap < 0) throw ConfigError("STRATA_PS_MAX_ARENA_BYTES must not be negative");
  c.max_arena_bytes = static_cast<std::uint64_t>(cap);
  // Without STRATA_NUM_PS / STRATA_JOBS the first rank is the PS (the resolvers' own default is
  // none, which leaves nothing to serve the variables).
  if (!env.has("STRATA_NUM_PS") && !env.has("STRATA_JOBS")) c.num_ps = 1;
  c.stall_timeout_s = env.get_seconds("STRATA_STALL_TIMEOUT_S", 10.0, ZeroSeconds::kRejected);
  c.progress_timeout_s = env.get_seconds("STRATA_PROGRESS_TIMEOUT_S", 120.0);
  c.timeout_s = timeout_from_env(env);
  c.restarts = env.get_int("STRATA_RESTART_COUNT", 0);
  if (c.restarts < 0) throw ConfigError("STRATA_RESTART_COUNT must not be negative");
  c.evaluator_nice = static_cast<int>(env.get_int("STRATA_EVALUATOR_NICE", 10));
  if (c.evaluator_nice < 0 || c.evaluator_nice > 19) throw ConfigError("STRATA_EVALUATOR_NICE must be between 0 and 19");
  const std::string policy = env.get_string("STRATA_ON_SAVE_ERROR", "stop");
  if (policy != "stop" && policy != "continue")
    throw ConfigError("STRATA_ON_SAVE_ERROR: '" + policy + "' is not stop or continue");
  c.stop_on_save_error = policy == "stop";
  // Read again by every parallel checkpoint write (strata/checkpoint/mpiio_hints.h); parsed here
  // so that a malformed value ends the job at its start, not at its first save.
  checkpoint::mpiio_hints_from_env(env);
  return c;
}

CheckpointOptions RunConfig::checkpoint_options() const {
  CheckpointOptions o;
  o.directory = model_dir;
  o.save_every_steps = save_checkpoints_steps;
  o.save_every_secs = save_checkpoints_secs;
  o.max_to_keep = keep_checkpoint_max;
  o.keep_every_n_hours = keep_checkpoint_every_n_hours;
  o.stop_on_save_error = stop_on_save_error;
  return o;
}

}  // namespace strata::train
