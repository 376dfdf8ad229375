// `strata bench --op dynamic` (bench_dynamic.cc): the PS side of a dynamic embedding table
// (src/ps/dynamic_table.h) on one core, the figures of its targets (>= 2 M lookups/s and
// >= 1 M inserts/s per PS core for 16-float rows; docs/DYNAMIC.md, "Figures") and the table's
// memory per row, in one process;
// under mpirun (two ranks or more: --num-ps PS ranks, the others workers) the data plane instead:
// lookups and updates by id from workers to a PS (PsClient::lookup_dynamic / update_dynamic), and,
// when worker 0 and PS 0 are on different nodes, `link` and `vs_link` against raw TCP.
#pragma once

#include <cstdint>
#include <string>

#include "cli/commands.h"

namespace strata::cli {

struct DynamicBenchConfig {
  std::int64_t rows = std::int64_t{1} << 20;  // distinct ids: the Zipf law's support, all inserted
  std::int64_t dim = 16;                       // floats per row
  std::int64_t batch = 4096;                   // ids per call
  int warmup = 4;                              // untimed batches before the lookup and update phases
  int iters = 256;                             // timed batches of the lookup and update phases
  double zipf_s = 1.05;                        // the Zipf law's exponent
  std::string optimizer = "adagrad";
  int ps_threads = 1;  // the table's threads (one process) or the PS's apply threads (mpirun)
  std::string json_path;
  // Under mpirun only:
  int num_ps = 1;
  std::string transport = "auto";
  double timeout_s = 120;
};

// Three phases on one table, each checked against values computed without the table:
//   insert  every id of the support looked up once, in batches (rows created from the
//           initializer); #wrong counts returned rows that differ from ps::fill with row_seed()
//   lookup  `iters` batches of Zipf draws (present ids); #wrong as for insert
//   update  `iters` batches of Zipf draws with random gradients through the optimizer; #wrong
//           counts rows that differ (values or slots) from a map of rows updated by apply_dense
// ops_per_s counts ids (duplicates included) per second of the table's calls alone. Returns the
// exit status (1 if anything is wrong).
int run_dynamic_bench(const DynamicBenchConfig& cfg);

// Under mpirun: every worker inserts its share of the support (lookups that create rows), then
// looks up `iters` Zipf batches, then updates `iters` Zipf batches, the phases separated by a
// barrier of the workers. Per phase: time_us (one call of `batch` ids, returning with its rows or
// once applied), ids per second, #wrong (insert and lookup: rows that differ from the initializer's;
// update: row updates the PS counted minus the distinct ids of every batch, plus rejected ids), and
// between nodes link (raw TCP of the same bytes: the pull shape for lookups, the push shape for
// updates; bench_link.h) and vs_link = algbw / link. Collective; returns the exit status.
int run_dynamic_plane_bench(const DynamicBenchConfig& cfg, int* argc, char*** argv);

// --op dynamic's flags: --rows (support size, K/M suffixes), --row-elems (dim), -b (batch), -w,
// -n, --optimizer, --json; under mpirun also --num-ps, --transport and --timeout; any other flag
// is a ConfigError.
int run_dynamic_bench_command(const BenchFlags& flags, int* argc, char*** argv);

}  // namespace strata::cli
