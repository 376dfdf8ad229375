// `strata bench --op update`: one complete optimizer update through the parameter servers (the
// PS layer, not the bare transport): a worker pushes a gradient of `size` bytes, the PS applies the
// optimizer (SGD straight into the values; Adam, Adagrad, ... through the worker's inbox and the
// PS service loop), and the worker waits until the update is applied. Between nodes every row
// carries the raw TCP push of the same size measured in the same run (vs_link).
#pragma once

#include <cstdint>
#include <string>

namespace strata {
class Runtime;
}

namespace strata::cli {

struct UpdateBenchConfig {
  std::string optimizer = "adam";
  std::string transport = "auto";
  std::uint64_t min_bytes = 1 << 20, max_bytes = 16 << 20;
  int factor = 4;
  int warmup = 3;
  int iters = 10;
  int ps_threads = 1;
  double timeout_s = 60;
  std::string json_path;
};

// Collective over the runtime (PS ranks serve, workers push). Returns the exit status (1 when an
// update count is wrong).
int run_update_bench(const UpdateBenchConfig& cfg, const Runtime& rt);

}  // namespace strata::cli
