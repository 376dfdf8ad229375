// custom_model: a model of your own trained with strata::train::train_and_evaluate, using the
// public API only. Logistic regression on a seeded synthetic problem, wired from strata::nn
// layers, so no gradient is written by hand; a hook of its own reads the variables back from the
// parameter servers and reports each worker's loss before and after. The variables live on the
// PS ranks, each worker trains on its shard, its 2 replicas split each batch and their gradients
// are averaged and pushed once per step. From the training layer it gets checkpoints and resume
// (give a model_dir), the preemption save and exit 75 (SIGTERM/SIGUSR1), the chief's progress
// lines and JSON summary, and an evaluator task when the job has one.
//
//   mpirun -np 3 ./custom_model                       # 1 PS + 2 workers; prints each worker's loss
//   mpirun -np 3 ./custom_model /scratch/logreg       # with checkpoints; run again to resume
//   mpirun -np 3 ./custom_model /scratch/logreg 3000  # ... and 3000 steps per worker (default 150)
//   strata-mpirun --ps 1 --workers 2 --evaluator 1 -- ./custom_model /scratch/logreg
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include <strata/strata.h>

namespace {

constexpr int kFeatures = 8;

// Examples [begin, begin + n) of the problem: features in [-1, 1], label from a fixed hidden
// weight vector (a pure function of the index, so every rank builds the same data).
strata::data::Dataset examples(std::uint64_t begin, std::int64_t n) {
  strata::data::Dataset d;
  d.size = n;
  d.dense_dim = kFeatures;
  d.num_classes = 2;
  for (std::int64_t k = 0; k < n; ++k) {
    std::mt19937_64 gen((begin + static_cast<std::uint64_t>(k)) * 7919 + 13);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    float score = 0.5f;
    for (int f = 0; f < kFeatures; ++f) {
      const float x = u(gen);
      d.features.push_back(x);
      score += x * static_cast<float>(f % 3 == 0 ? 2 : -1);
    }
    d.labels.push_back(score > 0 ? 1 : 0);
  }
  return d;
}

// The model: p = sigmoid(x . w + b) with the mean logistic loss, wired from strata::nn layers
// (one Dense of one unit and the sigmoid cross-entropy loss); the graph derives the gradients.
// Variables "logreg/linear/kernel" [8, 1] and "logreg/linear/bias" [1]. Default optimizer: plain
// SGD at 0.5 (--optimizer style "sgd:lr=0.5" is the same).
std::unique_ptr<strata::nn::GraphModel> logistic_regression() {
  using namespace strata::nn;
  Graph g("logreg", /*seed=*/1);
  const Tensor x = g.dense_input(0, kFeatures);
  const Tensor logit = g.dense(x, 1, Activation::kNone, "linear");
  return std::make_unique<GraphModel>(g, logit, Loss::kSigmoidCrossEntropy, "logreg", TrainingDefaults{"sgd", 0.5, 20});
}

// A hook of our own: each worker's loss on a fixed set before and after training.
class LossReport : public strata::train::SessionRunHook {
 public:
  explicit LossReport(const strata::train::Model& model) : model_(model), probe_(examples(0, 2000)) {}
  void after_create_session(strata::train::RunContext& ctx) override {
    fresh_ = !ctx.resumed;
    before_ = loss_now(ctx);
  }
  void end(strata::train::RunContext& ctx) override {
    after_ = loss_now(ctx);
    std::printf("worker %d: loss %.4f -> %.4f (global step %lld)\n", ctx.strategy->worker_index(), before_, after_,
                static_cast<long long>(ctx.strategy->global_step()));
    std::fflush(stdout);
  }
  // Only a worker that trained from the initializers is held to halving its loss (a resumed one
  // may start near the end).
  bool ok() const { return before_ < 0 || !fresh_ || after_ < before_ * 0.5; }

 private:
  double loss_now(strata::train::RunContext& ctx) {
    strata::train::Params params;
    for (const auto& v : ctx.variables) ctx.strategy->read(v, params.dense[v.name()].value);
    double loss = 0;
    strata::train::evaluate_params(model_, params, probe_, &loss);
    return loss;
  }
  const strata::train::Model& model_;
  strata::data::Dataset probe_;
  double before_ = -1, after_ = -1;
  bool fresh_ = true;
};

int run(int argc, char** argv) {
  // Roles: TF_CONFIG or the Slurm step when present, else plain MPI with the first rank as PS.
  strata::train::RunConfig config = strata::train::RunConfig::from_environment(strata::Env::from_process());
  config.cpu_replicas = 2;
  config.devices = strata::DevicePolicy::kCpu;
  config.global_batch = 64;
  config.log_step_count_steps = 50;
  if (argc > 1) {
    config.model_dir = argv[1];       // checkpoints, and where a restarted job resumes
    config.save_checkpoints_steps = 100;
    // Resume from the newest valid checkpoint there, if any (a missing directory: a fresh start).
    if (std::filesystem::exists(config.model_dir)) config.restore = "latest";
  }
  const auto model = logistic_regression();
  auto report = std::make_shared<LossReport>(*model);
  strata::train::TrainSpec train;
  train.input_fn = [] { return examples(100000, 40000); };
  train.data_name = "synthetic logistic";
  train.max_steps = argc > 2 ? strata::parse_int64(argv[2], "MAX_STEPS") : 150;
  train.hooks.push_back(report);
  strata::train::EvalSpec eval;
  eval.input_fn = [] { return examples(0, 2000); };
  const auto result = strata::train::train_and_evaluate(*model, config, train, eval);
  if (!result.error.empty()) {
    if (result.report_error) std::fprintf(stderr, "custom_model: %s\n", result.error.c_str());
    return result.status;
  }
  if (result.status == 0 && !report->ok()) return 1;
  return result.status;
}

}  // namespace

int main(int argc, char** argv) {
  strata::MpiSession mpi(&argc, &argv);
  try {
    return run(argc, argv);
  } catch (const strata::ConfigError& e) {
    std::fprintf(stderr, "custom_model: %s\n", e.what());
    strata::abort_job(2);
    return 2;
  } catch (const std::exception& e) {
    // One failing rank ends the job instead of leaving its peers waiting.
    std::fprintf(stderr, "custom_model: %s\n", e.what());
    strata::abort_job(1);
  }
  return 1;
}
