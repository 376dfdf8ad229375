// `strata bench --op apply` (bench_apply.cc): a PS rank's optimizer rate, the U of
// docs/SCALING.md, with and without the apply team (--ps-threads).
#pragma once

#include <cstdint>
#include <string>

namespace strata::cli {

struct ApplyBenchConfig {
  std::uint64_t min_bytes = 1ull << 20, max_bytes = 64ull << 20;  // bytes of one f32 variable
  int factor = 4;
  int warmup = 2;
  int iters = 10;
  int threads = 2;
  std::string optimizer = "adam";
  std::string json_path;
};

// One process, no MPI. Per size: the same sequence of updates applied by one thread (apply_dense)
// and by `threads` threads (the PS's apply team), both checked bit for bit against the scalar
// reference (apply_dense_reference); #wrong counts differing elements of the variable and slots.
// Returns the exit status (1 if anything is wrong).
int run_apply_bench(const ApplyBenchConfig& cfg);

}  // namespace strata::cli
