// The training layer under mpirun (np 2: 1 PS + 1 worker; np 3: 1 PS + 2 workers): hooks are
// called in SessionRunHook order on every training worker and only begin() on the PS; stop
// conditions (max_steps, a user hook's request_stop, a resumed job already past max_steps) end
// the loop where they should; a user model trains through train_and_evaluate and its loss falls.
// The inproc tier runs the same cases on 2 and 3 thread ranks (RunConfig::group), except the
// resumed job, whose checkpoints need MPI (parallel HDF5).
#define STRATA_INPROC_RANKS 2, 3
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <unistd.h>

#include "common/rank_test.h"
#include "strata/train/train_and_evaluate.h"

namespace strata {
namespace {

using testing::TestComm;

constexpr int kFeatures = 4;

// Two classes, label = [w . x > 0] for a fixed w: a pure function of the seed.
data::Dataset make_data(std::int64_t n, std::uint64_t seed) {
  data::Dataset d;
  d.size = n;
  d.dense_dim = kFeatures;
  d.num_classes = 2;
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::int64_t i = 0; i < n; ++i) {
    float score = 0.25f;
    for (int f = 0; f < kFeatures; ++f) {
      const float x = u(gen);
      d.features.push_back(x);
      score += x * (f % 2 ? -1.5f : 1.0f);
    }
    d.labels.push_back(score > 0 ? 1 : 0);
  }
  return d;
}

// Logistic regression: p = sigmoid(x . w + b), mean log loss.
class LogReg : public train::Model {
 public:
  std::string name() const override { return "logreg"; }
  std::string describe() const override { return "logreg 4-1"; }
  std::vector<ps::VariableSpec> variables() const override {
    ps::VariableSpec w;
    w.name = "logreg/w";
    w.shape = {kFeatures};
    ps::VariableSpec b;
    b.name = "logreg/b";
    b.shape = {1};
    return {w, b};
  }
  train::StepResult step(const train::Params& params, const train::Inputs& in, train::Grads* grads) const override {
    const auto& w = params.dense.at("logreg/w").value;
    const float b = params.dense.at("logreg/b").value[0];
    train::StepResult r;
    std::vector<float> gw(kFeatures, 0.0f);
    float gb = 0;
    for (int i = 0; i < in.size; ++i) {
      const float* x = in.dense + static_cast<std::size_t>(i) * kFeatures;
      float z = b;
      for (int f = 0; f < kFeatures; ++f) z += w[f] * x[f];
      const float p = 1.0f / (1.0f + std::exp(-z));
      const float y = static_cast<float>(in.labels[i]);
      r.loss += -(y * std::log(p + 1e-7f) + (1 - y) * std::log(1 - p + 1e-7f));
      r.correct += (p > 0.5f) == (in.labels[i] == 1) ? 1 : 0;
      for (int f = 0; f < kFeatures; ++f) gw[f] += (p - y) * x[f];
      gb += p - y;
    }
    const float n = static_cast<float>(std::max(1, in.size));
    if (in.size > 0) r.loss /= in.size;
    if (grads) {
      for (auto& g : gw) g /= n;
      grads->dense["logreg/w"].value = gw;
      grads->dense["logreg/w"].shape = {kFeatures};
      grads->dense["logreg/b"].value = {gb / n};
      grads->dense["logreg/b"].shape = {1};
    }
    return r;
  }
  std::string default_optimizer() const override { return "sgd:lr=0.5"; }
};

// Records every call, and optionally stops after a given step.
class Recorder : public train::SessionRunHook {
 public:
  explicit Recorder(std::int64_t stop_after = -1) : stop_after_(stop_after) {}
  void begin(train::RunContext&) override { events.push_back("begin"); }
  void after_create_session(train::RunContext& ctx) override {
    events.push_back("after_create_session");
    first_step = ctx.step;
  }
  void before_run(train::RunContext&) override { events.push_back("before_run"); }
  void after_run(train::RunContext& ctx, const train::RunValues& v) override {
    events.push_back("after_run");
    last_loss = v.loss;
    if (first_loss < 0) first_loss = v.loss;
    if (stop_after_ >= 0 && v.step >= stop_after_) ctx.request_stop();
  }
  void end(train::RunContext&) override { events.push_back("end"); }
  std::vector<std::string> events;
  std::int64_t first_step = -1;
  double first_loss = -1, last_loss = -1;

 private:
  std::int64_t stop_after_;
};

train::RunConfig quiet_config(TestComm& comm) {
  train::RunConfig cfg;
#if defined(STRATA_TEST_TIER_INPROC)
  cfg.group = std::shared_ptr<comm::Group>(&comm.group(), [](comm::Group*) {});  // borrowed
#else
  cfg.world = comm.get();
#endif
  cfg.num_ps = 1;
  cfg.global_batch = 32;
  cfg.timeout_s = 30;
  cfg.log_step_count_steps = 0;
  cfg.log_step_count_secs = 0;
  return cfg;
}

train::TrainSpec spec(std::int64_t max_steps, std::shared_ptr<Recorder> hook) {
  train::TrainSpec t;
  t.input_fn = [] { return make_data(2048, 7); };
  t.data_name = "logreg-synthetic";
  t.max_steps = max_steps;
  t.epochs = 5;
  t.hooks.push_back(std::move(hook));
  return t;
}

train::EvalSpec eval_spec() {
  train::EvalSpec e;
  e.input_fn = [] { return make_data(500, 99); };
  return e;
}

// The expected sequence on a training worker that runs `steps` steps.
std::vector<std::string> worker_events(int steps) {
  std::vector<std::string> e = {"begin", "after_create_session"};
  for (int s = 0; s < steps; ++s) {
    e.push_back("before_run");
    e.push_back("after_run");
  }
  e.push_back("end");
  return e;
}

STRATA_RANK_TEST(TrainAndEvaluate, HooksRunInSessionRunHookOrderAndMaxStepsStops) {
  TestComm comm;
  LogReg model;
  auto rec = std::make_shared<Recorder>();
  const auto result = train::train_and_evaluate(model, quiet_config(comm), spec(12, rec), eval_spec());
  const bool ps = result.role == Role::kPs;
  STRATA_EXPECT_ALL(comm.get(), result.status == 0);
  STRATA_EXPECT_ALL(comm.get(), ps ? rec->events == std::vector<std::string>{"begin"} : rec->events == worker_events(12));
  // The job's global step counts every worker's steps.
  STRATA_EXPECT_ALL(comm.get(), ps || result.global_step == 12 * (comm.size() - 1));
  STRATA_EXPECT_ALL(comm.get(), ps || rec->last_loss < rec->first_loss);
}

STRATA_RANK_TEST(TrainAndEvaluate, AUserHookStopsTraining) {
  TestComm comm;
  LogReg model;
  auto rec = std::make_shared<Recorder>(3);
  const auto result = train::train_and_evaluate(model, quiet_config(comm), spec(-1, rec), eval_spec());
  const bool ps = result.role == Role::kPs;
  STRATA_EXPECT_ALL(comm.get(), result.status == 0);
  STRATA_EXPECT_ALL(comm.get(), ps || rec->events == worker_events(3));
}

#if !defined(STRATA_TEST_TIER_INPROC)
TEST(TrainAndEvaluate, AResumedJobPastMaxStepsRunsNoStep) {
  TestComm comm;
  // One directory for the job: rank 0 names it, everyone gets it.
  char dir[256] = {};
  if (comm.rank() == 0) {
    const auto p = std::filesystem::temp_directory_path() / ("strata_train_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    std::snprintf(dir, sizeof dir, "%s", p.c_str());
  }
  comm.group().broadcast(dir, sizeof dir, 0, comm::Deadline{60, "test directory"});
  LogReg model;
  train::RunConfig cfg = quiet_config(comm);
  cfg.model_dir = dir;
  auto first = std::make_shared<Recorder>();
  const auto r1 = train::train_and_evaluate(model, cfg, spec(5, first), eval_spec());
  STRATA_EXPECT_ALL(comm.get(), r1.status == 0);
  // The final checkpoint holds every worker at step 5: a restart with the same max_steps stops
  // right after the session is created, and still ends (final save skipped, summary, end()).
  cfg.restore = "latest";
  auto second = std::make_shared<Recorder>();
  const auto r2 = train::train_and_evaluate(model, cfg, spec(5, second), eval_spec());
  const bool ps = r2.role == Role::kPs;
  STRATA_EXPECT_ALL(comm.get(), r2.status == 0);
  STRATA_EXPECT_ALL(comm.get(), ps || second->first_step == 5);
  STRATA_EXPECT_ALL(comm.get(), ps || second->events == worker_events(0));
  comm.group().barrier(comm::Deadline{60, "test barrier"});
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}
#endif

STRATA_RANK_TEST(TrainAndEvaluate, AnAgreedConfigurationErrorIsReportedByOneRank) {
  TestComm comm;
  LogReg model;
  train::RunConfig cfg = quiet_config(comm);
  cfg.consistency = "eventually";
  auto rec = std::make_shared<Recorder>();
  const auto result = train::train_and_evaluate(model, cfg, spec(3, rec), eval_spec());
  STRATA_EXPECT_ALL(comm.get(), result.status == train::kStatusUsage);
  STRATA_EXPECT_ALL(comm.get(), result.error.find("eventually") != std::string::npos);
  const std::int64_t reporters = result.report_error ? 1 : 0;
  const std::int64_t total = comm.group().allreduce(reporters, comm::ReduceOp::kSum, comm::Deadline{60, "reporters"});
  STRATA_EXPECT_ALL(comm.get(), total == 1);
  STRATA_EXPECT_ALL(comm.get(), rec->events.empty());
}

}  // namespace
}  // namespace strata
