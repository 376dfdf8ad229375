// Environment variables: an immutable snapshot (so resolvers are pure functions over it and tests
// never call setenv) and the one table of every variable strata reads (`strata --help-env`).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/common/parse.h"

namespace strata {

class Env {
 public:
  using Vars = std::map<std::string, std::string, std::less<>>;
  Env() = default;
  explicit Env(Vars vars) : vars_(std::move(vars)) {}
  // Snapshot of the process environment (environ) at the time of the call.
  static Env from_process();

  std::optional<std::string> get(std::string_view name) const;
  // Set and non-empty.
  bool has(std::string_view name) const;
  const Vars& vars() const { return vars_; }
  Env with(const std::string& name, const std::string& value) const;

  // Strict typed accessors: a value that does not parse raises ConfigError naming the variable.
  std::int64_t get_int(std::string_view name, std::int64_t fallback) const;
  double get_double(std::string_view name, double fallback) const;
  // A duration (parse_seconds: finite, not negative, positive with ZeroSeconds::kRejected, clamped
  // to kMaxDurationS); `fallback` when unset or empty.
  double get_seconds(std::string_view name, double fallback, ZeroSeconds zero = ZeroSeconds::kAllowed) const;
  bool get_bool(std::string_view name, bool fallback) const;
  std::string get_string(std::string_view name, const std::string& fallback) const;

 private:
  Vars vars_;
};

// The one timeout contract (every command, every phase): `--timeout` where a command has it, else
// STRATA_TIMEOUT_S, else kDefaultTimeoutS, bounds each single wait for another rank (a bootstrap
// exchange, a PS request, a collective, a barrier); a wait past it names who it waited for.
// Waits are never a multiple of it. Values above kMaxDurationS (common/parse.h) are clamped to it. Liveness (a stopped or stalled rank) has its own limits
// (--stall-timeout, STRATA_PROGRESS_TIMEOUT_S).
inline constexpr double kDefaultTimeoutS = 120;
// STRATA_TIMEOUT_S or kDefaultTimeoutS; ConfigError when malformed or not positive.
double timeout_from_env(const Env& env);
// A command's timeout: `flag_value` (the --timeout text, "" when not given) or timeout_from_env.
// The result is also published as STRATA_TIMEOUT_S in this process's environment, so layers that
// read the variable (the transports) use the same bound. Call before any thread is started.
double resolve_timeout(const std::string& flag_value, const Env& env);

// Test hooks of the form RANK:SECONDS (STRATA_TEST_DELAY_RANK and its kin): the seconds that world
// rank `rank` is to wait, 0 when the variable is unset or names another rank; ConfigError naming
// the variable when it does not parse.
double test_hook_delay(const Env& env, const char* var, int rank);

struct EnvVarDoc {
  const char* name;
  const char* type;
  const char* default_value;
  const char* doc;
};

// Every environment variable strata reads, its own and the ones it takes from TensorFlow, Slurm,
// Open MPI and CUDA. Adding a variable anywhere in the code means adding a row here.
const std::vector<EnvVarDoc>& env_table();
// The table formatted for a terminal (`strata --help-env`).
std::string format_env_table();

}  // namespace strata
