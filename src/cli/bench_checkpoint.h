// `strata bench --op checkpoint` (bench_checkpoint.cc): save/restore throughput against dd.
#pragma once

#include <cstdint>
#include <string>

#include "cli/commands.h"

namespace strata::cli {

struct CheckpointBenchConfig {
  std::uint64_t min_bytes = 256ull << 20, max_bytes = 256ull << 20;
  int factor = 2;
  int warmup = 1;
  int iters = 3;
  std::string dir;  // empty: a fresh directory under $TMPDIR or /tmp, removed afterwards
  bool keep = false;
  std::string json_path;
};

// This machine's available memory (MemAvailable), bytes; 0 when unknown. Benches check their
// buffers against it before allocating (one clear error instead of the OOM killer).
std::uint64_t mem_available_bytes();

// COLLECTIVE over MPI_COMM_WORLD (every rank writes and reads its share). Returns the exit status.
int run_checkpoint_bench(const CheckpointBenchConfig& cfg, int* argc, char*** argv);

}  // namespace strata::cli
