// The built-in hooks' stop conditions, on a RunContext of their own (no MPI, no strategy): a
// worker stops at max_steps (also when it resumes past it), after a failed save under
// --on-save-error stop, and after a preemption save; nothing else stops it. And the default
// hook list follows the RunConfig.
#include <gtest/gtest.h>

#include <typeinfo>

#include "strata/common/error.h"
#include "strata/train/hooks.h"
#include "strata/train/run_config.h"

namespace strata::train {
namespace {

RunValues values_at(std::int64_t step, bool stop = false, bool save_failed = false) {
  RunValues v;
  v.step = step;
  v.outcome.stop = stop;
  v.outcome.save_failed = save_failed;
  v.outcome.saved = stop;
  return v;
}

TEST(StopAtStepHook, StopsAtMaxStepsAndNotBefore) {
  RunContext ctx;
  StopAtStepHook hook(5);
  hook.after_create_session(ctx);
  EXPECT_FALSE(ctx.stop_requested());
  for (std::int64_t s = 1; s < 5; ++s) {
    hook.after_run(ctx, values_at(s));
    EXPECT_FALSE(ctx.stop_requested()) << "step " << s;
  }
  hook.after_run(ctx, values_at(5));
  EXPECT_TRUE(ctx.stop_requested());
}

TEST(StopAtStepHook, AResumedWorkerAtOrPastMaxStepsStopsBeforeItsFirstStep) {
  for (std::int64_t resumed : {5, 9}) {
    RunContext ctx;
    ctx.step = resumed;
    StopAtStepHook(5).after_create_session(ctx);
    EXPECT_TRUE(ctx.stop_requested()) << "resumed at " << resumed;
  }
  RunContext ctx;
  ctx.step = 4;
  StopAtStepHook(5).after_create_session(ctx);
  EXPECT_FALSE(ctx.stop_requested());
}

TEST(StopAtStepHook, ZeroStepsMeansNoStepAndNegativeMeansNoLimit) {
  RunContext zero;
  StopAtStepHook(0).after_create_session(zero);
  EXPECT_TRUE(zero.stop_requested());
  RunContext none;
  StopAtStepHook unlimited(-1);
  unlimited.after_create_session(none);
  for (std::int64_t s = 1; s < 100000; s *= 7) unlimited.after_run(none, values_at(s));
  EXPECT_FALSE(none.stop_requested());
}

TEST(CheckpointSaverHook, AFailedSaveStopsTrainingAndAnythingElseDoesNot) {
  RunContext ctx;  // not the chief: nothing printed
  CheckpointSaverHook hook;
  hook.after_run(ctx, values_at(1, false, false));
  hook.after_run(ctx, values_at(2, true, false));  // a preemption save: not this hook's business
  EXPECT_FALSE(ctx.stop_requested());
  EXPECT_FALSE(ctx.summary.save_failed);
  hook.after_run(ctx, values_at(3, true, true));
  EXPECT_TRUE(ctx.stop_requested());
  EXPECT_TRUE(ctx.summary.save_failed);
  EXPECT_FALSE(ctx.summary.preempted);
}

TEST(PreemptionHook, APreemptionSaveStopsTrainingButAFailedSaveIsNotAPreemption) {
  RunContext ctx;
  PreemptionHook hook;
  hook.after_run(ctx, values_at(1, true, true));
  EXPECT_FALSE(ctx.stop_requested());
  EXPECT_FALSE(ctx.summary.preempted);
  hook.after_run(ctx, values_at(2, true, false));
  EXPECT_TRUE(ctx.stop_requested());
  EXPECT_TRUE(ctx.summary.preempted);
}

TEST(DefaultHooks, FollowTheRunConfigInTheDocumentedOrder) {
  RunConfig cfg;
  TrainSpec spec;
  auto names = [](const HookList& hooks) {
    std::vector<std::string> out;
    for (const auto& h : hooks) {
      const auto& r = *h;
      if (typeid(r) == typeid(CheckpointSaverHook)) out.push_back("saver");
      else if (typeid(r) == typeid(PreemptionHook)) out.push_back("preemption");
      else if (typeid(r) == typeid(StopAtStepHook)) out.push_back("stop");
      else if (typeid(r) == typeid(LoggingHook)) out.push_back("logging");
      else if (typeid(r) == typeid(MetricsJsonlHook)) out.push_back("metrics");
      else if (typeid(r) == typeid(TraceHook)) out.push_back("trace");
      else if (typeid(r) == typeid(ProfilerHook)) out.push_back("profiler");
      else if (typeid(r) == typeid(SummaryHook)) out.push_back("summary");
      else out.push_back("?");
    }
    return out;
  };
  EXPECT_EQ(names(default_hooks(cfg, spec)),
            (std::vector<std::string>{"saver", "preemption", "stop", "logging", "summary"}));
  cfg.metrics_path = "m.jsonl";
  cfg.trace_path = "t.json";
  cfg.profile = true;
  EXPECT_EQ(names(default_hooks(cfg, spec)), (std::vector<std::string>{"saver", "preemption", "stop", "logging",
                                                                       "metrics", "trace", "profiler", "summary"}));
}

TEST(RunConfig, EvaluatorNiceComesFromTheEnvironmentAndIsChecked) {
  EXPECT_EQ(RunConfig::from_environment(Env()).evaluator_nice, 10);
  EXPECT_EQ(RunConfig::from_environment(Env(Env::Vars{{"STRATA_EVALUATOR_NICE", "0"}})).evaluator_nice, 0);
  EXPECT_EQ(RunConfig::from_environment(Env(Env::Vars{{"STRATA_EVALUATOR_NICE", "19"}})).evaluator_nice, 19);
  for (const char* bad : {"20", "-1", "x"})
    EXPECT_THROW(RunConfig::from_environment(Env(Env::Vars{{"STRATA_EVALUATOR_NICE", bad}})), ConfigError) << bad;
}

}  // namespace
}  // namespace strata::train
