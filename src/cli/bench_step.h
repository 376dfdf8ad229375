// `strata bench --op step` (bench_step.cc): one thread's forward + backward of a built-in model
// against the best the linked matrix-product library does on the same products.
#pragma once

#include <string>

namespace strata::cli {

struct StepBenchConfig {
  std::string model = "mlp";  // mlp | softmax | wide_deep
  int batch = 128;
  int warmup = 20;
  int iters = 200;
  std::string json_path;
};

// One process, no MPI, one thread. For each backend of src/model/gemm.h this build has (eigen, and
// openblas when linked): -w then -n training steps of the model (its layer graph, nn::make_builtin_model) on one synthetic batch (gradients
// kept across steps, as the training loop keeps them), then the same products the step makes
// (recorded from the step itself, so the FLOPs are exactly those it needs: no input gradient for
// a first layer fed by data) replayed back to back -w and -n times on buffers of the same shapes.
// vs_gemm = step GFLOP/s / product-only GFLOP/s with the same backend; vs_best divides by the
// fastest backend's product-only rate. #wrong counts gradient elements (and the loss) farther
// from the same step with every product accumulated in double (the reference backend) than
// 1e-3 of that variable's largest gradient. Returns the exit status (1 if anything is wrong).
int run_step_bench(const StepBenchConfig& cfg);

}  // namespace strata::cli
