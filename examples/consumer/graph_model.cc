// graph_model: a wide-and-deep click model wired from layers (strata/nn), trained with
// train_and_evaluate: no gradient is written by hand. The embedding tables live on the PS ranks
// and each step pulls and pushes only the rows its batch reads.
//
//   mpirun -np 3 ./graph_model            # 1 PS + 2 workers, 2 epochs of synthetic click data
//   mpirun -np 3 ./graph_model /scratch/wd  # with checkpoints; run again to resume
#include <cstdio>
#include <exception>
#include <filesystem>
#include <vector>

#include <strata/strata.h>

namespace {

constexpr int kFields = 8;
constexpr std::int64_t kVocab = 4000;

// Examples [begin, begin + n) of one click-style problem with a known optimum
// (data::make_synthetic_sparse: 8 id fields, 4 dense features; the seed fixes the hidden
// weights, so training and evaluation take disjoint slices of one generated set).
strata::data::Dataset clicks(std::int64_t begin, std::int64_t n) {
  const strata::data::Dataset all = strata::data::make_synthetic_sparse(44000, kFields, kVocab, 1.0, 7, 4);
  strata::data::Dataset d = all;
  d.size = n;
  d.features.assign(all.features.begin() + begin * all.dense_dim, all.features.begin() + (begin + n) * all.dense_dim);
  d.sparse_ids.assign(all.sparse_ids.begin() + begin * all.num_fields,
                      all.sparse_ids.begin() + (begin + n) * all.num_fields);
  d.labels.assign(all.labels.begin() + begin, all.labels.begin() + begin + n);
  return d;
}

// Wide: a linear model over every id (an embedding of width 1, summed). Deep: one 8-wide
// embedding per field and the dense features through two ReLU layers. Logit = wide + deep.
std::unique_ptr<strata::nn::GraphModel> wide_and_deep() {
  using namespace strata::nn;
  Graph g("wd", /*seed=*/1);
  std::vector<Tensor> deep{g.dense_input(0, 4)};
  for (int f = 0; f < kFields; ++f) deep.push_back(g.embedding(g.ids_input(f, 1), kVocab, 8, Combiner::kSum));
  Tensor h = g.dense(g.concatenate(deep), 64, Activation::kRelu);
  h = g.dense(h, 32, Activation::kRelu);
  const Tensor wide = g.embedding(g.ids_input(0, kFields), kVocab, 1, Combiner::kSum, "wide");
  return std::make_unique<GraphModel>(g, g.add({g.dense(h, 1), wide}), Loss::kSigmoidCrossEntropy, "wide_deep",
                                      TrainingDefaults{"adagrad", 0.1, 2});
}

int run(int argc, char** argv) {
  strata::train::RunConfig config = strata::train::RunConfig::from_environment(strata::Env::from_process());
  config.devices = strata::DevicePolicy::kCpu;
  config.global_batch = 128;
  if (argc > 1) {
    config.model_dir = argv[1];
    config.save_checkpoints_steps = 100;
    if (std::filesystem::exists(config.model_dir)) config.restore = "latest";
  }
  const auto model = wide_and_deep();
  strata::train::TrainSpec train;
  train.input_fn = [] { return clicks(0, 40000); };
  train.data_name = "synthetic clicks";
  strata::train::EvalSpec eval;
  eval.input_fn = [] { return clicks(40000, 4000); };
  const auto result = strata::train::train_and_evaluate(*model, config, train, eval);
  if (!result.error.empty() && result.report_error) std::fprintf(stderr, "graph_model: %s\n", result.error.c_str());
  return result.status;
}

}  // namespace

int main(int argc, char** argv) {
  strata::MpiSession mpi(&argc, &argv);
  try {
    return run(argc, argv);
  } catch (const strata::ConfigError& e) {
    std::fprintf(stderr, "graph_model: %s\n", e.what());
    strata::abort_job(2);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "graph_model: %s\n", e.what());
    strata::abort_job(1);
  }
  return 1;
}
