// Unit tests of cluster resolution (strata/cluster/resolve.h) and ClusterSpec (cluster_spec.h).
//
// Every resolver is a pure function of an Env snapshot, ResolveOptions and ProcessInfo, so these
// tests build the environment from a map (no setenv, no MPI). Expected clusters and tasks are what
// TensorFlow 2.x's TFConfigClusterResolver and SlurmClusterResolver produce for the same input,
// except for strata's documented deviations (docs/ARCHITECTURE.md), marked "TF:" where they matter:
// Slurm's node order is kept, --jobs order is the order written, a GPU count of 0 works, a
// tasks-per-node list that does not match the node list is an error, and tasks are placed where
// Slurm runs them (distribution, task map) instead of in block order.
#include "common/test_util.h"
#include "strata/cluster/resolve.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "strata/cluster/cluster_spec.h"
#include "strata/common/env.h"
#include "strata/common/error.h"

namespace strata::cluster {
namespace {

using Addresses = std::vector<std::string>;

using strata::testing::config_error;
using strata::testing::Contains;

Env make_env(Env::Vars vars) { return Env(std::move(vars)); }

ProcessInfo process_info(int rank = -1, int size = -1, int physical_gpus = 0) {
  ProcessInfo p;
  p.rank = rank;
  p.size = size;
  p.hostname = "localhost";
  p.physical_gpus = physical_gpus;
  return p;
}

// Addresses of `job` in index order.
Addresses addresses(const ClusterSpec& spec, const std::string& job) {
  Addresses out;
  for (int i : spec.task_indices(job)) out.push_back(spec.task_address(job, i).value_or("<none>"));
  return out;
}

// =================================================================================================
// TF_CONFIG
// =================================================================================================

constexpr const char* kTfConfig = R"({
  "cluster": {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"], "ps": {"0": "p0:2222", "3": "p3:2222"}},
  "task": {"type": "worker", "index": 1},
  "rpc_layer": "grpc",
  "environment": "cloud",
  "session_master": "sm:1111"
})";

TEST(TfConfig, ListAndSparseJobsTaskAndMetadata) {
  ResolvedCluster r = resolve(make_env({{"TF_CONFIG", kTfConfig}}), {}, process_info());
  EXPECT_EQ(r.resolver, ResolverKind::kTfConfig);
  EXPECT_EQ(r.cluster.job_names(), (std::vector<std::string>{"chief", "worker", "ps"}));
  EXPECT_EQ(addresses(r.cluster, "chief"), (Addresses{"c0:2222"}));
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"w0:2222", "w1:2222"}));
  EXPECT_EQ(r.cluster.task_indices("ps"), (std::vector<int>{0, 3}));
  EXPECT_EQ(r.cluster.task_address("ps", 3).value_or(""), "p3:2222");
  EXPECT_FALSE(r.cluster.task_address("ps", 1).has_value());
  EXPECT_EQ(r.task, (TaskId{"worker", 1}));
  EXPECT_EQ(r.rpc_layer, "grpc");
  EXPECT_EQ(r.environment, "cloud");
  EXPECT_EQ(r.session_master, "sm:1111");
  EXPECT_EQ(r.master(), "grpc://w1:2222");
}

TEST(TfConfig, NumericTaskTypeBecomesItsText) {
  // TF: str(task['type']).
  ResolvedCluster r = resolve(
      make_env({{"TF_CONFIG", R"({"cluster": {"1": ["a:1", "b:1"]}, "task": {"type": 1, "index": 1}})"}}), {},
      process_info());
  EXPECT_EQ(r.task, (TaskId{"1", 1}));
  EXPECT_EQ(r.master(), "b:1");
}

class TfConfigTaskIndexAccepted : public ::testing::TestWithParam<std::pair<const char*, int>> {};

TEST_P(TfConfigTaskIndexAccepted, CastToInteger) {
  const auto& [json_index, expected] = GetParam();
  std::string tf_config = std::string(R"({"task": {"type": "worker", "index": )") + json_index + "}}";
  ResolvedCluster r = resolve_tf_config(tf_config, Env{}, {}, process_info());
  EXPECT_EQ(r.task.type, "worker");
  EXPECT_EQ(r.task.index, expected);
}

INSTANTIATE_TEST_SUITE_P(IntFloatString, TfConfigTaskIndexAccepted,
                         ::testing::Values(std::make_pair("2", 2), std::make_pair("0", 0),
                                           std::make_pair("2.0", 2), std::make_pair("1e2", 100),
                                           std::make_pair("\"2\"", 2), std::make_pair("\"0\"", 0)));

class TfConfigTaskIndexRejected : public ::testing::TestWithParam<const char*> {};

TEST_P(TfConfigTaskIndexRejected, WithConfigErrorNamingTfConfig) {
  std::string tf_config = std::string(R"({"task": {"type": "worker", "index": )") + GetParam() + "}}";
  std::string message = config_error([&] { resolve_tf_config(tf_config, Env{}, {}, process_info()); });
  EXPECT_TRUE(Contains(message, "TF_CONFIG"));
}

INSTANTIATE_TEST_SUITE_P(NotANonNegativeInteger, TfConfigTaskIndexRejected,
                         ::testing::Values("2.5", "true", "false", "\"x\"", "-1", "\"-1\"", "\"1.5\"", "null", "[1]",
                                           "{}", "3e9", "-0.5"));

TEST(TfConfig, MasterWithoutRpcLayerIsTheBareAddress) {
  ResolvedCluster r = resolve(
      make_env({{"TF_CONFIG", R"({"cluster": {"worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 0}})"}}),
      {}, process_info());
  EXPECT_EQ(r.rpc_layer, "");
  EXPECT_EQ(r.master(), "w0:1");
}

TEST(TfConfig, MasterWithoutTaskIsSessionMaster) {
  ResolvedCluster r = resolve(
      make_env({{"TF_CONFIG", R"({"cluster": {"worker": ["w0:1"]}, "rpc_layer": "grpc", "session_master": "sm:9"})"}}),
      {}, process_info());
  EXPECT_FALSE(r.task.valid());
  EXPECT_EQ(r.master(), "sm:9");
}

TEST(TfConfig, EmptyObjectGivesEmptyClusterAndNoTask) {
  ResolvedCluster r = resolve(make_env({{"TF_CONFIG", "{}"}}), {}, process_info());
  EXPECT_EQ(r.resolver, ResolverKind::kTfConfig);
  EXPECT_TRUE(r.cluster.empty());
  EXPECT_EQ(r.cluster.total_tasks(), 0);
  EXPECT_FALSE(r.task.valid());
  EXPECT_EQ(r.rpc_layer, "");
  EXPECT_EQ(r.environment, "");
  EXPECT_EQ(r.master(), "");
}

TEST(TfConfig, MalformedJsonIsAConfigErrorMentioningTfConfig) {
  for (const char* text : {"{", R"({"cluster": )", "not json", R"({"task": {"type": "worker",}})"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(Contains(config_error([&] { resolve(make_env({{"TF_CONFIG", text}}), {}, process_info()); }),
                         "TF_CONFIG"));
  }
}

TEST(TfConfig, NonObjectIsAConfigError) {
  for (const char* text : {"[]", "42", "\"worker\"", "null", "true"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(Contains(config_error([&] { resolve_tf_config(text, Env{}, {}, process_info()); }), "TF_CONFIG"));
  }
}

TEST(TfConfig, BadClusterOrTaskShapesAreConfigErrors) {
  for (const char* text : {R"({"cluster": {"worker": "w0:1"}})", R"({"cluster": ["w0:1"]})",
                           R"({"cluster": {"worker": [1]}})", R"({"cluster": {"ps": {"x": "p:1"}}})",
                           R"({"task": "worker"})", R"({"task": {"type": ["worker"], "index": 0}})"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(Contains(config_error([&] { resolve_tf_config(text, Env{}, {}, process_info()); }), "TF_CONFIG"));
  }
}

TEST(TfConfig, TaskTypeNotInClusterIsRejectedByResolve) {
  std::string tf = R"({"cluster": {"worker": ["w0:1"], "ps": ["p0:1"]}, "task": {"type": "evaluator", "index": 0}})";
  // The resolver itself only reads; resolve() validates.
  EXPECT_NO_THROW(resolve_tf_config(tf, Env{}, {}, process_info()));
  std::string message = config_error([&] { resolve(make_env({{"TF_CONFIG", tf}}), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "evaluator"));
}

TEST(TfConfig, TaskIndexOutOfRangeIsRejectedByResolve) {
  std::string tf = R"({"cluster": {"worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 7}})";
  std::string message = config_error([&] { resolve(make_env({{"TF_CONFIG", tf}}), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "7"));
  EXPECT_TRUE(Contains(message, "worker"));
}

TEST(TfConfig, TaskIndexMissingFromSparseJobIsRejectedByResolve) {
  std::string tf = R"({"cluster": {"ps": {"0": "p0:1", "3": "p3:1"}}, "task": {"type": "ps", "index": 1}})";
  std::string message = config_error([&] { resolve(make_env({{"TF_CONFIG", tf}}), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "ps"));
  EXPECT_TRUE(Contains(message, "1"));
}

TEST(TfConfig, TaskWithEmptyClusterIsRejectedByResolve) {
  std::string tf = R"({"task": {"type": "worker", "index": 0}})";
  EXPECT_TRUE(Contains(config_error([&] { resolve(make_env({{"TF_CONFIG", tf}}), {}, process_info()); }), "worker"));
}

TEST(TfConfig, TaskTypeAndIdOptionsReplaceTheResolvedTask) {
  ResolveOptions options;
  options.task_type = "ps";
  options.task_id = 3;
  ResolvedCluster r = resolve(make_env({{"TF_CONFIG", kTfConfig}}), options, process_info());
  EXPECT_EQ(r.task, (TaskId{"ps", 3}));
  EXPECT_EQ(r.master(), "grpc://p3:2222");

  ResolveOptions only_id;
  only_id.task_id = 0;
  EXPECT_EQ(resolve(make_env({{"TF_CONFIG", kTfConfig}}), only_id, process_info()).task, (TaskId{"worker", 0}));

  ResolveOptions only_type;
  only_type.task_type = "chief";
  only_type.task_id = 0;
  EXPECT_EQ(resolve(make_env({{"TF_CONFIG", kTfConfig}}), only_type, process_info()).task, (TaskId{"chief", 0}));
}

TEST(TfConfig, OverriddenTaskIsValidatedToo) {
  ResolveOptions options;
  options.task_type = "ps";
  options.task_id = 1;  // ps has tasks 0 and 3 only
  EXPECT_TRUE(
      Contains(config_error([&] { resolve(make_env({{"TF_CONFIG", kTfConfig}}), options, process_info()); }), "ps"));

  ResolveOptions unknown;
  unknown.task_type = "evaluator";
  EXPECT_TRUE(Contains(
      config_error([&] { resolve(make_env({{"TF_CONFIG", kTfConfig}}), unknown, process_info()); }), "evaluator"));
}

TEST(TfConfig, RpcLayerOptionBeatsTfConfig) {
  ResolveOptions options;
  options.rpc_layer = "grpc+verbs";
  ResolvedCluster r = resolve(make_env({{"TF_CONFIG", kTfConfig}}), options, process_info());
  EXPECT_EQ(r.rpc_layer, "grpc+verbs");
  EXPECT_EQ(r.master(), "grpc+verbs://w1:2222");
}

class TfConfigGpus : public ::testing::TestWithParam<std::pair<const char*, int>> {};

TEST_P(TfConfigGpus, NumAcceleratorsIsTheVisibleGpuCount) {
  const auto& [cvd, expected] = GetParam();
  Env env = make_env({{"CUDA_VISIBLE_DEVICES", cvd}});
  ResolvedCluster r = resolve_tf_config("{}", env, {}, process_info(-1, -1, /*physical_gpus=*/4));
  EXPECT_EQ(r.num_gpus, expected);
  // The TF_CONFIG resolver does not assign GPUs: it passes the environment's value through.
  ASSERT_TRUE(r.cuda_visible_devices.has_value());
  EXPECT_EQ(*r.cuda_visible_devices, cvd);
}

INSTANTIATE_TEST_SUITE_P(CudaVisibleDevices, TfConfigGpus,
                         ::testing::Values(std::make_pair("0,1", 2), std::make_pair("", 0), std::make_pair("-1", 0),
                                           std::make_pair("0,7", 1), std::make_pair("3,2,1,0", 4),
                                           std::make_pair("1", 1)));

TEST(TfConfig, WithoutCudaVisibleDevicesAllPhysicalGpusAreVisible) {
  ResolvedCluster r = resolve_tf_config("{}", Env{}, {}, process_info(-1, -1, 4));
  EXPECT_EQ(r.num_gpus, 4);
  EXPECT_FALSE(r.cuda_visible_devices.has_value());
}

TEST(VisibleGpus, NarrowsThePhysicalCountLikeCuda) {
  auto with = [](const char* cvd) { return make_env({{"CUDA_VISIBLE_DEVICES", cvd}}); };
  EXPECT_EQ(visible_gpus(Env{}, 4), 4);
  EXPECT_EQ(visible_gpus(Env{}, 0), 0);
  EXPECT_EQ(visible_gpus(with("0,1"), 4), 2);
  EXPECT_EQ(visible_gpus(with(""), 4), 0);
  EXPECT_EQ(visible_gpus(with("-1"), 4), 0);
  EXPECT_EQ(visible_gpus(with("0,7"), 4), 1);
  EXPECT_EQ(visible_gpus(with("0,-1,1"), 4), 1);  // CUDA stops at the first invalid entry
  EXPECT_EQ(visible_gpus(with("0"), 0), 0);
  EXPECT_EQ(visible_gpus(with("0,1,2"), 2), 2);
}

// =================================================================================================
// Slurm
// =================================================================================================

Env::Vars slurm_vars(int procid, const std::string& nodelist = "n[1-2]", const std::string& per_node = "2(x2)",
                     int ntasks = 4) {
  return Env::Vars{{"SLURM_PROCID", std::to_string(procid)},
                   {"SLURM_STEP_NUM_TASKS", std::to_string(ntasks)},
                   {"SLURM_STEP_NODELIST", nodelist},
                   {"SLURM_STEP_TASKS_PER_NODE", per_node}};
}

ResolveOptions jobs_options(const std::string& spec) {
  ResolveOptions options;
  options.jobs = parse_jobs_spec(spec);
  return options;
}

TEST(Slurm, DefaultJobsMakeEveryTaskAWorker) {
  ResolvedCluster r = resolve(make_env(slurm_vars(2)), {}, process_info());
  EXPECT_EQ(r.resolver, ResolverKind::kSlurm);
  EXPECT_EQ(r.cluster.job_names(), (std::vector<std::string>{"worker"}));
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"n1:8888", "n1:8889", "n2:8888", "n2:8889"}));
  EXPECT_EQ(r.task, (TaskId{"worker", 2}));
  EXPECT_EQ(r.rpc_layer, "grpc");
  EXPECT_EQ(r.master(), "grpc://n2:8888");
}

class SlurmPsWorker : public ::testing::TestWithParam<std::pair<int, TaskId>> {};

TEST_P(SlurmPsWorker, ClusterAndTaskForEachProcid) {
  const auto& [procid, expected] = GetParam();
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(procid)), jobs_options("ps=1,worker=3"), process_info());
  EXPECT_EQ(r.cluster.job_names(), (std::vector<std::string>{"ps", "worker"}));
  EXPECT_EQ(addresses(r.cluster, "ps"), (Addresses{"n1:8888"}));
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"n1:8889", "n2:8888", "n2:8889"}));
  EXPECT_EQ(r.task, expected);
}

INSTANTIATE_TEST_SUITE_P(Procids, SlurmPsWorker,
                         ::testing::Values(std::make_pair(0, TaskId{"ps", 0}), std::make_pair(1, TaskId{"worker", 0}),
                                           std::make_pair(2, TaskId{"worker", 1}),
                                           std::make_pair(3, TaskId{"worker", 2})));

TEST(Slurm, JobsAreFilledInTheOrderWritten) {
  // TF: sorts the job names, so ps would come first; strata keeps --jobs order.
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(3)), jobs_options("worker=3,ps=1"), process_info());
  EXPECT_EQ(r.cluster.job_names(), (std::vector<std::string>{"worker", "ps"}));
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"n1:8888", "n1:8889", "n2:8888"}));
  EXPECT_EQ(addresses(r.cluster, "ps"), (Addresses{"n2:8889"}));
  EXPECT_EQ(r.task, (TaskId{"ps", 0}));
}

TEST(Slurm, SlurmNodeOrderIsKept) {
  // TF: sorts the host names, which would put "a" first.
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(0, "b,a", "1(x2)", 2)), {}, process_info());
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"b:8888", "a:8888"}));
  EXPECT_EQ(r.task, (TaskId{"worker", 0}));
  EXPECT_EQ(r.master(), "grpc://b:8888");
}

TEST(Slurm, HostlistIsExpandedAsSlurmDoes) {
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(1, "gpu[09-10]", "1(x2)", 2)), {}, process_info());
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"gpu09:8888", "gpu10:8888"}));
}

TEST(Slurm, UnevenTasksPerNode) {
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(2, "n[1-2]", "2,1", 3)), {}, process_info());
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"n1:8888", "n1:8889", "n2:8888"}));
  EXPECT_EQ(r.task, (TaskId{"worker", 2}));
}

TEST(Slurm, PortBase) {
  ResolveOptions options = jobs_options("ps=1,worker=3");
  options.port_base = 2222;
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(0)), options, process_info());
  EXPECT_EQ(addresses(r.cluster, "ps"), (Addresses{"n1:2222"}));
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"n1:2223", "n2:2222", "n2:2223"}));
}

TEST(Slurm, JobLevelFallbacks) {
  Env env = make_env({{"SLURM_PROCID", "1"},
                      {"SLURM_NTASKS", "4"},
                      {"SLURM_JOB_NODELIST", "n[1-2]"},
                      {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  ResolvedCluster r = resolve_slurm(env, {}, process_info());
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"n1:8888", "n1:8889", "n2:8888", "n2:8889"}));
  EXPECT_EQ(r.task, (TaskId{"worker", 1}));
}

TEST(Slurm, StepVariablesWinOverJobLevelOnes) {
  Env::Vars vars = slurm_vars(0, "s[1-2]", "1(x2)", 2);
  vars["SLURM_NTASKS"] = "6";
  vars["SLURM_JOB_NODELIST"] = "j[1-3]";
  vars["SLURM_TASKS_PER_NODE"] = "2(x3)";
  ResolvedCluster r = resolve_slurm(make_env(vars), {}, process_info());
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"s1:8888", "s2:8888"}));
}

class SlurmGpus : public ::testing::TestWithParam<std::pair<int, const char*>> {};

TEST_P(SlurmGpus, FourGpusTwoTasksPerNodeSplitsThemInHalves) {
  const auto& [procid, expected] = GetParam();
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(procid)), {}, process_info(-1, -1, /*physical_gpus=*/4));
  EXPECT_EQ(r.num_gpus, 2);
  ASSERT_TRUE(r.cuda_visible_devices.has_value());
  EXPECT_EQ(*r.cuda_visible_devices, expected);
}

INSTANTIATE_TEST_SUITE_P(Procids, SlurmGpus,
                         ::testing::Values(std::make_pair(0, "0,1"), std::make_pair(1, "2,3"),
                                           std::make_pair(2, "0,1"), std::make_pair(3, "2,3")));

TEST(Slurm, GpusPerNodeOptionAndSlurmGpusOnNode) {
  ResolveOptions options;
  options.gpus_per_node = 4;
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(1)), options, process_info(-1, -1, 0));
  EXPECT_EQ(r.cuda_visible_devices.value_or("<unset>"), "2,3");

  Env::Vars vars = slurm_vars(1);
  vars["SLURM_GPUS_ON_NODE"] = "2";
  r = resolve_slurm(make_env(vars), {}, process_info(-1, -1, 8));
  EXPECT_EQ(r.num_gpus, 1);
  EXPECT_EQ(r.cuda_visible_devices.value_or("<unset>"), "1");
}

TEST(Slurm, GpusPerTaskOverride) {
  ResolveOptions options;
  options.gpus_per_task = 1;
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(1)), options, process_info(-1, -1, 4));
  EXPECT_EQ(r.num_gpus, 1);
  EXPECT_EQ(r.cuda_visible_devices.value_or("<unset>"), "1");
  r = resolve_slurm(make_env(slurm_vars(2)), options, process_info(-1, -1, 4));
  EXPECT_EQ(r.cuda_visible_devices.value_or("<unset>"), "0");
}

TEST(Slurm, MoreGpusPerTaskThanTheNodeHasIsAConfigError) {
  ResolveOptions options;
  options.gpus_per_task = 3;  // 3 x 2 tasks > 4 GPUs
  std::string message =
      config_error([&] { resolve_slurm(make_env(slurm_vars(0)), options, process_info(-1, -1, 4)); });
  EXPECT_TRUE(Contains(message, "4"));
  EXPECT_TRUE(Contains(message, "3"));
}

TEST(Slurm, AutoSetGpuOffLeavesTheEnvironmentAlone) {
  ResolveOptions options;
  options.auto_set_gpu = false;
  Env::Vars vars = slurm_vars(1);
  EXPECT_FALSE(resolve_slurm(make_env(vars), options, process_info(-1, -1, 4)).cuda_visible_devices.has_value());
  vars["CUDA_VISIBLE_DEVICES"] = "5";
  EXPECT_EQ(resolve_slurm(make_env(vars), options, process_info(-1, -1, 4)).cuda_visible_devices.value_or(""), "5");
}

TEST(Slurm, ZeroGpusGiveAnEmptyDeviceList) {
  // TF: crashes on a node without GPUs; strata assigns none.
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(3)), {}, process_info(-1, -1, 0));
  EXPECT_EQ(r.num_gpus, 0);
  ASSERT_TRUE(r.cuda_visible_devices.has_value());
  EXPECT_EQ(*r.cuda_visible_devices, "");
}

TEST(Slurm, TasksPerNodeOverride) {
  Env::Vars vars = slurm_vars(3);
  vars.erase("SLURM_STEP_TASKS_PER_NODE");
  ResolveOptions options;
  options.tasks_per_node = 2;
  ResolvedCluster r = resolve_slurm(make_env(vars), options, process_info());
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"n1:8888", "n1:8889", "n2:8888", "n2:8889"}));
  EXPECT_EQ(r.task, (TaskId{"worker", 3}));

  // The option also wins over what Slurm says.
  Env::Vars disagreeing = slurm_vars(3, "n[1-2]", "1(x2)", 4);
  r = resolve_slurm(make_env(disagreeing), options, process_info());
  EXPECT_EQ(r.cluster.total_tasks(), 4);
}

TEST(Slurm, TasksPerNodeRequiredWithoutOverride) {
  Env::Vars vars = slurm_vars(0);
  vars.erase("SLURM_STEP_TASKS_PER_NODE");
  EXPECT_TRUE(
      Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }), "TASKS_PER_NODE"));
}

TEST(Slurm, MissingProcidIsAConfigErrorNamingIt) {
  Env::Vars vars = slurm_vars(0);
  vars.erase("SLURM_PROCID");
  EXPECT_TRUE(Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }), "SLURM_PROCID"));
  // Also when the Slurm resolver is asked for explicitly.
  ResolveOptions options;
  options.resolver = ResolverKind::kSlurm;
  EXPECT_TRUE(Contains(config_error([&] { resolve(make_env(vars), options, process_info()); }), "SLURM_PROCID"));
}

TEST(Slurm, BadProcidIsAConfigErrorNamingIt) {
  Env::Vars vars = slurm_vars(0);
  vars["SLURM_PROCID"] = "one";
  EXPECT_TRUE(Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }), "SLURM_PROCID"));
}

TEST(Slurm, JobsThatDoNotAddUpGiveBothCounts) {
  std::string message =
      config_error([&] { resolve_slurm(make_env(slurm_vars(0)), jobs_options("ps=2,worker=5"), process_info()); });
  EXPECT_TRUE(Contains(message, "7"));
  EXPECT_TRUE(Contains(message, "4"));
}

TEST(Slurm, NumTasksDisagreeingWithTasksPerNodeIsAConfigError) {
  std::string message =
      config_error([&] { resolve_slurm(make_env(slurm_vars(0, "n[1-2]", "2(x2)", 5)), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "5"));
  EXPECT_TRUE(Contains(message, "4"));
}

TEST(Slurm, BadHostlistIsAConfigError) {
  for (const char* nodelist : {"n[2-1]", "n[a-b]", "n[1-2]x"}) {
    SCOPED_TRACE(nodelist);
    std::string message =
        config_error([&] { resolve_slurm(make_env(slurm_vars(0, nodelist, "1", 1)), {}, process_info()); });
    EXPECT_TRUE(Contains(message, "SLURM_STEP_NODELIST"));
  }
}

TEST(Slurm, TasksPerNodeLengthMismatchIsAConfigError) {
  // TF: zips the two lists and drops the excess silently.
  std::string message =
      config_error([&] { resolve_slurm(make_env(slurm_vars(0, "n[1-2]", "2(x3)", 6)), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "SLURM_STEP_TASKS_PER_NODE"));
  EXPECT_TRUE(Contains(message, "3"));
  EXPECT_TRUE(Contains(message, "2"));
}

TEST(Slurm, ProcidOutOfRangeIsAConfigError) {
  std::string message = config_error([&] { resolve_slurm(make_env(slurm_vars(4)), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "SLURM_PROCID"));
  EXPECT_TRUE(Contains(message, "4"));
}

TEST(Slurm, RpcLayerOption) {
  ResolveOptions options;
  options.rpc_layer = "mpi";
  EXPECT_EQ(resolve_slurm(make_env(slurm_vars(0)), options, process_info()).rpc_layer, "mpi");
}

// ---- where the tasks run: distributions, Slurm's task map, and the self-check -------------------
// The layouts below are what Slurm 22.05 did on the emulated 3-node cluster (tests/cluster/) for
// `srun -N 3 -n 5` with each distribution: SLURMD_NODENAME/SLURM_LOCALID of every task and the
// step's SLURM_PMIX_MAPPING_SERV, recorded from the tasks' environments.

// A 5-task step on n[1-3] as Slurm describes it to task `procid`.
Env::Vars step5(int procid, const std::string& per_node = "3,1(x2)") {
  return slurm_vars(procid, "n[1-3]", per_node, 5);
}

// Addresses of every task in task order for ps=1,worker=4.
Addresses all_addresses(const Env& env, const ResolveOptions& options = jobs_options("ps=1,worker=4")) {
  ResolvedCluster r = resolve_slurm(env, options, process_info());
  Addresses out = addresses(r.cluster, "ps");
  for (const auto& a : addresses(r.cluster, "worker")) out.push_back(a);
  return out;
}

TEST(SlurmLayout, BlockIsTheDefaultAndIgnoresTheWithinNodePart) {
  const Addresses block = {"n1:8888", "n1:8889", "n1:8890", "n2:8888", "n3:8888"};
  EXPECT_EQ(all_addresses(make_env(step5(0))), block);
  for (const char* dist : {"block", "block:cyclic", "block:block,Pack", "*"}) {
    SCOPED_TRACE(dist);
    Env::Vars vars = step5(0);
    vars["SLURM_DISTRIBUTION"] = dist;
    EXPECT_EQ(all_addresses(make_env(vars)), block);
  }
}

TEST(SlurmLayout, CyclicDealsOneTaskPerNodeUntilEachHoldsItsCount) {
  // srun -N 3 -n 5 -m cyclic: tasks 0,3,4 on n1, 1 on n2, 2 on n3 (the counts stay 3,1,1).
  Env::Vars vars = step5(1);
  vars["SLURM_DISTRIBUTION"] = "cyclic";
  EXPECT_EQ(all_addresses(make_env(vars)), (Addresses{"n1:8888", "n2:8888", "n3:8888", "n1:8889", "n1:8890"}));
  ResolvedCluster r = resolve_slurm(make_env(vars), jobs_options("ps=1,worker=4"), process_info());
  EXPECT_EQ(r.task, (TaskId{"worker", 0}));
  EXPECT_EQ(r.master(), "grpc://n2:8888");
  // 2,2,1 and a secondary distribution.
  vars = step5(0, "2(x2),1");
  vars["SLURM_DISTRIBUTION"] = "cyclic:block,NoPack";
  EXPECT_EQ(all_addresses(make_env(vars)), (Addresses{"n1:8888", "n2:8888", "n3:8888", "n1:8889", "n2:8889"}));
}

TEST(SlurmLayout, PlaneDealsPlaneSizeTasksPerNode) {
  // srun -N 3 -n 5 -m plane=2: srun sets SLURM_DISTRIBUTION=plane and SLURM_DIST_PLANESIZE=2;
  // tasks 0,1,4 on n1, 2 on n2, 3 on n3.
  const Addresses expected = {"n1:8888", "n1:8889", "n2:8888", "n3:8888", "n1:8890"};
  Env::Vars vars = step5(0);
  vars["SLURM_DISTRIBUTION"] = "plane";
  vars["SLURM_DIST_PLANESIZE"] = "2";
  EXPECT_EQ(all_addresses(make_env(vars)), expected);
  vars.erase("SLURM_DIST_PLANESIZE");
  vars["SLURM_DISTRIBUTION"] = "plane=2";
  EXPECT_EQ(all_addresses(make_env(vars)), expected);
  // Plane 1 is cyclic; a plane at least as large as every node's count is block.
  vars["SLURM_DISTRIBUTION"] = "plane=1";
  EXPECT_EQ(all_addresses(make_env(vars)), (Addresses{"n1:8888", "n2:8888", "n3:8888", "n1:8889", "n1:8890"}));
  vars["SLURM_DISTRIBUTION"] = "plane=3";
  EXPECT_EQ(all_addresses(make_env(vars)), (Addresses{"n1:8888", "n1:8889", "n1:8890", "n2:8888", "n3:8888"}));
}

TEST(SlurmLayout, PlaneWithoutASizeAndUnknownDistributionsAreConfigErrors) {
  Env::Vars vars = step5(0);
  vars["SLURM_DISTRIBUTION"] = "plane";
  EXPECT_TRUE(Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }),
                       "SLURM_DIST_PLANESIZE"));
  vars["SLURM_DIST_PLANESIZE"] = "0";
  EXPECT_TRUE(Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }),
                       "SLURM_DIST_PLANESIZE"));
  vars["SLURM_DISTRIBUTION"] = "spiral";
  std::string message = config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "SLURM_DISTRIBUTION=spiral"));
  EXPECT_TRUE(Contains(message, "--mpi=pmix"));
}

TEST(SlurmLayout, ArbitraryFollowsTheHostfile) {
  // srun -n 5 --distribution=arbitrary with SLURM_HOSTFILE "n2 n1 n2 n3 n2": the step's node list
  // is sorted (n[1-3]) and its counts 1,3,1, but task 0 runs on n2.
  const std::string path = ::testing::TempDir() + "strata_hostfile_" + std::to_string(::getpid());
  {
    std::ofstream out(path);
    ASSERT_TRUE(out) << path;
    out << "# the layout\nn2\nn1   # task 1\n\nn[2-3]\nn2\nn1\n";  // names past the 5th are not used
  }
  Env::Vars vars = step5(0, "1,3,1");
  vars["SLURM_DISTRIBUTION"] = "arbitrary";
  vars["SLURM_HOSTFILE"] = path;
  EXPECT_EQ(all_addresses(make_env(vars)), (Addresses{"n2:8888", "n1:8888", "n2:8889", "n3:8888", "n2:8890"}));

  // A hostfile that does not match the step, or names a node outside it.
  { std::ofstream(path) << "n1\nn2\nn2\nn2\nn3\n"; }
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2,2,1";
  EXPECT_TRUE(Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }), path));
  { std::ofstream(path) << "n1\nn2\nn9\n"; }
  EXPECT_TRUE(Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }), "n9"));
  std::remove(path.c_str());

  // Unreadable (e.g. on a node-local file system) or unset: the layout is unknown.
  std::string message = config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "SLURM_HOSTFILE=" + path));
  EXPECT_TRUE(Contains(message, "--mpi=pmix"));
  vars.erase("SLURM_HOSTFILE");
  EXPECT_TRUE(Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }), "SLURM_HOSTFILE"));
}

TEST(SlurmLayout, PmixTaskMapOfEveryDistribution) {
  struct Case {
    const char* name;
    const char* per_node;
    const char* dist;
    const char* map;
    Addresses expected;
  };
  const std::vector<Case> cases = {
      {"block", "3,1(x2)", "", "(vector,(0,1,3),(1,2,1))",
       {"n1:8888", "n1:8889", "n1:8890", "n2:8888", "n3:8888"}},
      {"cyclic", "3,1(x2)", "cyclic", "(vector,(0,3,1),(0,1,2))",
       {"n1:8888", "n2:8888", "n3:8888", "n1:8889", "n1:8890"}},
      {"plane=2", "3,1(x2)", "plane", "(vector,(0,1,2),(1,2,1),(0,1,1))",
       {"n1:8888", "n1:8889", "n2:8888", "n3:8888", "n1:8890"}},
      // No SLURM_HOSTFILE needed: the map says where each task is.
      {"arbitrary", "1,3,1", "arbitrary", "(vector,(1,1,1),(0,3,1),(1,1,1))",
       {"n2:8888", "n1:8888", "n2:8889", "n3:8888", "n2:8890"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Env::Vars vars = step5(0, c.per_node);
    if (*c.dist) vars["SLURM_DISTRIBUTION"] = c.dist;  // plane without its size: the map decides
    vars["SLURM_PMIX_MAPPING_SERV"] = c.map;
    EXPECT_EQ(all_addresses(make_env(vars)), c.expected);
  }
}

TEST(SlurmLayout, PmixTaskMapWinsWhereTheDistributionCannotTell) {
  // Oversubscribed cyclic (CPUs 3 and 1, 6 tasks, slurm_step_layout.c): Slurm deals cyclically
  // while CPUs last (0,1 2 3), then over every node again (4,5), so the counts (4,2) alone do not
  // give the order (dealing them would put task 3 on n2); Slurm's map does.
  Env::Vars vars = slurm_vars(3, "n[1-2]", "4,2", 6);
  vars["SLURM_DISTRIBUTION"] = "cyclic";
  vars["SLURM_PMIX_MAPPING_SERV"] = "(vector,(0,2,1),(0,1,3),(1,1,1))";
  EXPECT_EQ(all_addresses(make_env(vars), jobs_options("ps=1,worker=5")),
            (Addresses{"n1:8888", "n2:8888", "n1:8889", "n1:8890", "n1:8891", "n2:8889"}));
}

TEST(SlurmLayout, HeterogeneousStepFromThePmixTaskMap) {
  // sbatch -N1 -n1 -w n3 : -N2 -n3 with srun --het-group=0,1: one step of 4 tasks, node list n[1-3],
  // counts 2,1,1, but task 0 (component 0) runs on n3. Each component has its own
  // SLURM_DISTRIBUTION (cyclic in component 0, block in 1); every task must still resolve the same
  // cluster, with the PS on n3.
  const std::vector<std::pair<int, const char*>> tasks = {{0, "cyclic"}, {1, "block"}, {2, "block"}, {3, "block"}};
  std::uint64_t hash = 0;
  for (const auto& [procid, dist] : tasks) {
    SCOPED_TRACE(procid);
    Env::Vars vars = slurm_vars(procid, "n[1-3]", "2,1(x2)", 4);
    vars["SLURM_DISTRIBUTION"] = dist;
    vars["SLURM_PMIX_MAPPING_SERV"] = "(vector,(2,1,1),(0,1,2),(1,1,1))";
    vars["SLURMD_NODENAME"] = std::vector<const char*>{"n3", "n1", "n1", "n2"}[procid];
    vars["SLURM_LOCALID"] = procid == 2 ? "1" : "0";
    ResolvedCluster r = resolve_slurm(make_env(vars), jobs_options("ps=1,worker=3"), process_info());
    EXPECT_EQ(addresses(r.cluster, "ps"), (Addresses{"n3:8888"}));
    EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"n1:8888", "n1:8889", "n2:8888"}));
    if (procid == 0) hash = r.cluster.hash();
    EXPECT_EQ(r.cluster.hash(), hash);
  }
}

TEST(SlurmLayout, MalformedOrMismatchedPmixTaskMapIsIgnored) {
  for (const char* map : {"(vector,(0,3,1))", "(vector,(0,1,3),(1,2,1)", "(vector,(0,1,3),(1,2))", "vector",
                          "(vector,(0,1,3),(1,3,1))", "(vector,(0,1,3),(1,2,x))", "(vector,(0,1,4),(1,2,1))", ""}) {
    SCOPED_TRACE(map);
    Env::Vars vars = step5(0);
    vars["SLURM_DISTRIBUTION"] = "cyclic";
    vars["SLURM_PMIX_MAPPING_SERV"] = map;
    EXPECT_EQ(all_addresses(make_env(vars)), (Addresses{"n1:8888", "n2:8888", "n3:8888", "n1:8889", "n1:8890"}));
  }
}

TEST(SlurmLayout, TaskOnAnotherNodeThanTheLayoutSaysIsAConfigErrorNamingIt) {
  // What the resolver used to do under -m cyclic: block order, task 1 on n2 but given n1:8889.
  // Without Slurm's map or distribution (e.g. a launcher that drops them) the self-check catches it.
  Env::Vars vars = step5(1);
  vars["SLURMD_NODENAME"] = "n2";
  vars["SLURM_LOCALID"] = "0";
  std::string message = config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); });
  EXPECT_TRUE(Contains(message, "SLURM_PROCID=1 runs on n2 (SLURMD_NODENAME, SLURM_LOCALID=0)"));
  EXPECT_TRUE(Contains(message, "puts it on n1 as local task 1"));
  EXPECT_TRUE(Contains(message, "wrong node"));
  // The same task with the step's distribution resolves, and its address is its own node's.
  vars["SLURM_DISTRIBUTION"] = "cyclic";
  ResolvedCluster r = resolve_slurm(make_env(vars), {}, process_info());
  EXPECT_EQ(r.master(), "grpc://n2:8888");
  // The right node but another local index (a port another task holds) is caught as well.
  vars = step5(4);
  vars["SLURM_DISTRIBUTION"] = "cyclic";
  vars["SLURMD_NODENAME"] = "n1";
  vars["SLURM_LOCALID"] = "1";
  EXPECT_TRUE(Contains(config_error([&] { resolve_slurm(make_env(vars), {}, process_info()); }),
                       "puts it on n1 as local task 2"));
  vars["SLURM_LOCALID"] = "2";
  EXPECT_EQ(resolve_slurm(make_env(vars), {}, process_info()).master(), "grpc://n1:8890");
}

class SlurmCyclicGpus : public ::testing::TestWithParam<std::pair<int, const char*>> {};

TEST_P(SlurmCyclicGpus, GpusFollowTheNodeLocalIndex) {
  // -N 3 -n 5 --ntasks-per-node=2 -m cyclic, 2 GPUs per node: 1 GPU per task, tasks 0,3 on n1,
  // 1,4 on n2, 2 on n3: each task's GPU is its index on its node.
  const auto& [procid, expected] = GetParam();
  Env::Vars vars = step5(procid, "2(x2),1");
  vars["SLURM_DISTRIBUTION"] = "cyclic";
  ResolveOptions options;
  options.gpus_per_node = 2;
  ResolvedCluster r = resolve_slurm(make_env(vars), options, process_info());
  EXPECT_EQ(r.num_gpus, 1);
  EXPECT_EQ(r.cuda_visible_devices.value_or("<unset>"), expected);
}

INSTANTIATE_TEST_SUITE_P(Procids, SlurmCyclicGpus,
                         ::testing::Values(std::make_pair(0, "0"), std::make_pair(1, "0"), std::make_pair(2, "0"),
                                           std::make_pair(3, "1"), std::make_pair(4, "1")));

// =================================================================================================
// MPI
// =================================================================================================

TEST(Mpi, FirstNumPsRanksArePsTheRestWorkers) {
  ResolveOptions options;
  options.num_ps = 1;
  const std::vector<TaskId> expected = {{"ps", 0}, {"worker", 0}, {"worker", 1}};
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(rank);
    ProcessInfo p = process_info(rank, 3);
    p.rank_hosts = {"h0", "h0", "h1"};
    ResolvedCluster r = resolve_mpi(Env{}, options, p);
    EXPECT_EQ(r.resolver, ResolverKind::kMpi);
    EXPECT_EQ(r.cluster.job_names(), (std::vector<std::string>{"ps", "worker"}));
    EXPECT_EQ(addresses(r.cluster, "ps"), (Addresses{"h0:8888"}));
    EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"h0:8889", "h1:8888"}));
    EXPECT_EQ(r.task, expected[rank]);
    EXPECT_EQ(r.rpc_layer, "mpi");
  }
}

TEST(Mpi, PortBaseAndOwnHostnameWithoutRankHosts) {
  ResolveOptions options;
  options.port_base = 5000;
  ProcessInfo p = process_info(1, 3);
  p.hostname = "me";
  ResolvedCluster r = resolve_mpi(Env{}, options, p);
  EXPECT_EQ(r.cluster.job_names(), (std::vector<std::string>{"worker"}));
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"me:5000", "me:5001", "me:5002"}));
  EXPECT_EQ(r.task, (TaskId{"worker", 1}));
}

TEST(Mpi, NumPsLeavingNoWorkerIsAConfigError) {
  for (int num_ps : {3, 4, -1}) {
    SCOPED_TRACE(num_ps);
    ResolveOptions options;
    options.num_ps = num_ps;
    std::string message = config_error([&] { resolve_mpi(Env{}, options, process_info(0, 3)); });
    EXPECT_TRUE(Contains(message, std::to_string(num_ps)));
  }
}

TEST(Mpi, RankAndSizeFromTheLauncherWhenMpiIsNotUp) {
  Env env = make_env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  ResolveOptions options;
  options.num_ps = 2;
  ResolvedCluster r = resolve_mpi(env, options, process_info());
  EXPECT_EQ(r.cluster.num_tasks("ps"), 2);
  EXPECT_EQ(r.cluster.num_tasks("worker"), 2);
  EXPECT_EQ(r.task, (TaskId{"worker", 0}));
}

TEST(Mpi, JobsSpecMustMatchTheWorldSize) {
  ResolvedCluster r = resolve_mpi(Env{}, jobs_options("chief=1,worker=2"), process_info(0, 3));
  EXPECT_EQ(r.task, (TaskId{"chief", 0}));
  std::string message = config_error([&] { resolve_mpi(Env{}, jobs_options("ps=1,worker=3"), process_info(0, 3)); });
  EXPECT_TRUE(Contains(message, "4"));
  EXPECT_TRUE(Contains(message, "3"));
}

TEST(LauncherHints, RankAndSizePrecedence) {
  EXPECT_EQ(launcher_rank_hint(Env{}), -1);
  EXPECT_EQ(launcher_size_hint(Env{}), -1);
  EXPECT_EQ(launcher_rank_hint(make_env({{"SLURM_PROCID", "3"}})), 3);
  EXPECT_EQ(launcher_rank_hint(make_env({{"SLURM_PROCID", "3"}, {"OMPI_COMM_WORLD_RANK", "1"}})), 1);
  EXPECT_EQ(launcher_rank_hint(make_env({{"PMI_RANK", "5"}})), 5);
  EXPECT_EQ(launcher_size_hint(make_env({{"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "4"}})), 4);
  EXPECT_TRUE(Contains(config_error([] { launcher_rank_hint(make_env({{"PMI_RANK", "x"}})); }), "PMI_RANK"));
}

// =================================================================================================
// choose_resolver / resolve precedence
// =================================================================================================

TEST(ChooseResolver, Precedence) {
  const ResolveOptions none;
  EXPECT_EQ(choose_resolver(Env{}, none), ResolverKind::kMpi);
  EXPECT_EQ(choose_resolver(make_env({{"SLURM_PROCID", "0"}}), none), ResolverKind::kSlurm);
  // Under mpirun inside an allocation the Slurm variables describe mpirun, not the ranks.
  EXPECT_EQ(choose_resolver(make_env({{"SLURM_PROCID", "0"}, {"OMPI_COMM_WORLD_RANK", "0"}}), none),
            ResolverKind::kMpi);
  EXPECT_EQ(choose_resolver(make_env({{"TF_CONFIG", "{}"}, {"SLURM_PROCID", "0"}}), none), ResolverKind::kTfConfig);
  EXPECT_EQ(choose_resolver(make_env({{"STRATA_CLUSTER", "{}"}, {"TF_CONFIG", "{}"}, {"SLURM_PROCID", "0"}}), none),
            ResolverKind::kExplicit);
  // Set but empty counts as unset.
  EXPECT_EQ(choose_resolver(make_env({{"TF_CONFIG", ""}, {"STRATA_CLUSTER", ""}}), none), ResolverKind::kMpi);

  ResolveOptions cluster;
  cluster.cluster = R"({"worker": ["a:1"]})";
  EXPECT_EQ(choose_resolver(make_env({{"TF_CONFIG", "{}"}}), cluster), ResolverKind::kExplicit);
}

TEST(ChooseResolver, ExplicitResolverOptionWins) {
  Env env = make_env({{"STRATA_CLUSTER", "{}"}, {"TF_CONFIG", "{}"}, {"SLURM_PROCID", "0"}});
  for (auto kind : {ResolverKind::kExplicit, ResolverKind::kTfConfig, ResolverKind::kSlurm, ResolverKind::kMpi}) {
    ResolveOptions options;
    options.resolver = kind;
    options.cluster = R"({"worker": ["a:1"]})";
    EXPECT_EQ(choose_resolver(env, options), kind) << to_string(kind);
  }
}

TEST(ChooseResolver, ParseAndPrintResolverKinds) {
  for (auto kind : {ResolverKind::kAuto, ResolverKind::kExplicit, ResolverKind::kTfConfig, ResolverKind::kSlurm,
                    ResolverKind::kMpi})
    EXPECT_EQ(parse_resolver_kind(to_string(kind)), kind);
  EXPECT_STREQ(to_string(ResolverKind::kTfConfig), "tfconfig");
  EXPECT_TRUE(Contains(config_error([] { parse_resolver_kind("TF_CONFIG"); }), "TF_CONFIG"));
}

TEST(Resolve, TfConfigBeatsSlurmAndExplicitBeatsTfConfig) {
  Env::Vars vars = slurm_vars(0);
  vars["TF_CONFIG"] = R"({"cluster": {"worker": ["tf:1"]}, "task": {"type": "worker", "index": 0}})";
  ResolvedCluster r = resolve(make_env(vars), {}, process_info());
  EXPECT_EQ(r.resolver, ResolverKind::kTfConfig);
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"tf:1"}));

  vars["STRATA_CLUSTER"] = R"({"worker": ["explicit:1"]})";
  r = resolve(make_env(vars), {}, process_info(0, 1));
  EXPECT_EQ(r.resolver, ResolverKind::kExplicit);
  EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"explicit:1"}));
}

TEST(Resolve, PlainMpiWhenNothingElseApplies) {
  ResolveOptions options;
  options.num_ps = 1;
  ResolvedCluster r = resolve(Env{}, options, process_info(1, 2));
  EXPECT_EQ(r.resolver, ResolverKind::kMpi);
  EXPECT_EQ(r.task, (TaskId{"worker", 0}));
}

// =================================================================================================
// Explicit --cluster / STRATA_CLUSTER
// =================================================================================================

constexpr const char* kJobMap = R"({"ps": ["a:1"], "worker": ["b:1", "c:1"]})";

TEST(Explicit, JobMapTaskChosenByRankInJobOrder) {
  ResolveOptions options;
  options.cluster = kJobMap;
  const std::vector<TaskId> expected = {{"ps", 0}, {"worker", 0}, {"worker", 1}};
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(rank);
    ResolvedCluster r = resolve(Env{}, options, process_info(rank, 3));
    EXPECT_EQ(r.resolver, ResolverKind::kExplicit);
    EXPECT_EQ(r.task, expected[rank]);
    EXPECT_EQ(addresses(r.cluster, "worker"), (Addresses{"b:1", "c:1"}));
  }
}

TEST(Explicit, JobMapOrderIsTheOrderWritten) {
  ResolveOptions options;
  options.cluster = R"({"worker": ["b:1", "c:1"], "ps": ["a:1"]})";
  EXPECT_EQ(resolve(Env{}, options, process_info(2, 3)).task, (TaskId{"ps", 0}));
}

TEST(Explicit, RankFromTheLauncherWhenMpiIsNotUp) {
  EXPECT_EQ(resolve(make_env({{"STRATA_CLUSTER", kJobMap}, {"PMI_RANK", "1"}}), {}, process_info()).task,
            (TaskId{"worker", 0}));
}

TEST(Explicit, RankBeyondTheClusterLeavesNoTask) {
  ResolveOptions options;
  options.cluster = kJobMap;
  ResolvedCluster r = resolve(Env{}, options, process_info(3, 4));
  EXPECT_FALSE(r.task.valid());
}

TEST(Explicit, TfConfigShapedDocumentKeepsItsTask) {
  ResolveOptions options;
  options.cluster = R"({"cluster": {"ps": ["a:1"], "worker": ["b:1", "c:1"]},
                        "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"})";
  ResolvedCluster r = resolve(Env{}, options, process_info(0, 3));  // rank 0 would be ps:0
  EXPECT_EQ(r.resolver, ResolverKind::kExplicit);
  EXPECT_EQ(r.task, (TaskId{"worker", 1}));
  EXPECT_EQ(r.master(), "grpc://c:1");
}

TEST(Explicit, TfConfigShapedDocumentWithoutTaskUsesTheRank) {
  ResolveOptions options;
  options.cluster = R"({"cluster": {"ps": ["a:1"], "worker": ["b:1", "c:1"]}})";
  EXPECT_EQ(resolve(Env{}, options, process_info(1, 3)).task, (TaskId{"worker", 0}));
}

TEST(Explicit, ClusterFile) {
  const std::string path = ::testing::TempDir() + "strata_resolve_test_" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream out(path);
    ASSERT_TRUE(out) << path;
    out << "\n  " << kJobMap << "\n";
  }
  ResolveOptions options;
  options.cluster = path;
  ResolvedCluster r = resolve(Env{}, options, process_info(2, 3));
  std::remove(path.c_str());
  EXPECT_EQ(r.resolver, ResolverKind::kExplicit);
  EXPECT_EQ(addresses(r.cluster, "ps"), (Addresses{"a:1"}));
  EXPECT_EQ(r.task, (TaskId{"worker", 1}));
}

TEST(Explicit, UnreadableFileIsAConfigErrorNamingThePath) {
  const std::string path = ::testing::TempDir() + "strata_no_such_dir_" + std::to_string(::getpid()) + "/c.json";
  ResolveOptions options;
  options.cluster = path;
  EXPECT_TRUE(Contains(config_error([&] { resolve(Env{}, options, process_info(0, 1)); }), path));
}

TEST(Explicit, BadDocumentsAreConfigErrors) {
  for (const char* text : {"{bad", R"({"worker": "a:1"})", R"({"worker": [1]})", R"({"cluster": []})"}) {
    SCOPED_TRACE(text);
    ResolveOptions options;
    options.cluster = text;
    EXPECT_TRUE(Contains(config_error([&] { resolve(Env{}, options, process_info(0, 1)); }), "--cluster"));
  }
}

// =================================================================================================
// Jobs spec
// =================================================================================================

TEST(JobsSpec, ParsesInTheOrderWritten) {
  EXPECT_EQ(parse_jobs_spec("ps=1,worker=3"), (JobsSpec{{"ps", 1}, {"worker", 3}}));
  EXPECT_EQ(parse_jobs_spec("worker=3,ps=1"), (JobsSpec{{"worker", 3}, {"ps", 1}}));
  EXPECT_EQ(parse_jobs_spec("chief=1,worker=2,ps=2,evaluator=1"),
            (JobsSpec{{"chief", 1}, {"worker", 2}, {"ps", 2}, {"evaluator", 1}}));
  EXPECT_EQ(format_jobs_spec(parse_jobs_spec("worker=3,ps=1")), "worker=3,ps=1");
}

TEST(JobsSpec, RejectsDuplicatesEmptyGarbageAndNegativeCounts) {
  for (const char* text : {"", "  ", "ps=1,ps=2", "ps", "=1", "ps=", "ps=-1", "ps=x", "ps=1,", ",ps=1",
                           "ps=1,,worker=2", "1ps=1", "ps=1;worker=2", "ps=1.5", "ps=+1", "p s=1", "ps=1 "}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(Contains(config_error([&] { parse_jobs_spec(text); }), "--jobs"));
  }
}

TEST(JobsSpec, DuplicateIsNamed) {
  EXPECT_TRUE(Contains(config_error([] { parse_jobs_spec("worker=1,ps=1,worker=2"); }), "worker"));
}

// =================================================================================================
// ClusterSpec and TaskId
// =================================================================================================

TEST(TaskId, StrAndValidity) {
  EXPECT_EQ((TaskId{"worker", 3}).str(), "worker:3");
  EXPECT_EQ(TaskId{}.str(), "?");
  EXPECT_FALSE(TaskId{}.valid());
  EXPECT_FALSE((TaskId{"worker", -1}).valid());
  EXPECT_FALSE((TaskId{"", 0}).valid());
  EXPECT_TRUE((TaskId{"ps", 0}).valid());
}

TEST(ClusterSpec, FromJsonListAndSparse) {
  ClusterSpec spec = ClusterSpec::from_json(R"({"worker": ["w0:1", "w1:1"], "ps": {"3": "p3:1", "0": "p0:1"}})", "t");
  EXPECT_FALSE(spec.empty());
  EXPECT_EQ(spec.job_names(), (std::vector<std::string>{"worker", "ps"}));
  EXPECT_TRUE(spec.has_job("ps"));
  EXPECT_FALSE(spec.has_job("chief"));
  EXPECT_EQ(spec.num_tasks("worker"), 2);
  EXPECT_EQ(spec.num_tasks("ps"), 2);
  EXPECT_EQ(spec.num_tasks("chief"), 0);
  EXPECT_EQ(spec.task_indices("ps"), (std::vector<int>{0, 3}));
  EXPECT_EQ(spec.task_address("ps", 3).value_or(""), "p3:1");
  EXPECT_FALSE(spec.task_address("ps", 2).has_value());
  EXPECT_FALSE(spec.task_address("chief", 0).has_value());
  EXPECT_TRUE(spec.has_task(TaskId{"worker", 1}));
  EXPECT_FALSE(spec.has_task(TaskId{"worker", 2}));
  EXPECT_EQ(spec.total_tasks(), 4);
}

TEST(ClusterSpec, TasksAreInJobOrderThenIndexOrder) {
  ClusterSpec spec = ClusterSpec::from_json(R"({"worker": ["w0:1", "w1:1"], "ps": {"3": "p3:1", "0": "p0:1"}})", "t");
  EXPECT_EQ(spec.tasks(), (std::vector<TaskId>{{"worker", 0}, {"worker", 1}, {"ps", 0}, {"ps", 3}}));
}

TEST(ClusterSpec, FromJsonRejectsBadShapesNamingTheOrigin) {
  for (const char* text : {"{", "[]", "\"x\"", R"({"worker": "w:1"})", R"({"worker": 3})", R"({"worker": null})",
                           R"({"worker": ["w:1", 2]})", R"({"ps": {"x": "p:1"}})", R"({"ps": {"-1": "p:1"}})",
                           R"({"ps": {"0": 5}})", R"({"": ["w:1"]})"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(Contains(config_error([&] { ClusterSpec::from_json(text, "my-origin"); }), "my-origin"));
  }
}

TEST(ClusterSpec, HashIgnoresJobAndKeyOrder) {
  ClusterSpec a = ClusterSpec::from_json(R"({"ps": ["a:1"], "worker": ["b:1", "c:1"]})", "t");
  ClusterSpec b = ClusterSpec::from_json(R"({"worker": ["b:1", "c:1"], "ps": ["a:1"]})", "t");
  ClusterSpec c = ClusterSpec::from_json(R"({"worker": {"1": "c:1", "0": "b:1"}, "ps": {"0": "a:1"}})", "t");
  ClusterSpec d;
  d.set_task("worker", 1, "c:1");
  d.set_task("ps", 0, "a:1");
  d.set_task("worker", 0, "b:1");
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.hash(), c.hash());
  EXPECT_EQ(a.hash(), d.hash());
  EXPECT_EQ(a.canonical_string(), c.canonical_string());
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(a == d);
}

TEST(ClusterSpec, HashDiffersForDifferentClusters) {
  ClusterSpec base = ClusterSpec::from_json(R"({"ps": ["a:1"], "worker": ["b:1", "c:1"]})", "t");
  for (const char* text : {R"({"ps": ["a:1"], "worker": ["b:1", "c:2"]})",   // another port
                           R"({"ps": ["a:1"], "worker": ["c:1", "b:1"]})",   // tasks swapped
                           R"({"ps": ["a:1"], "worker": ["b:1"]})",          // fewer tasks
                           R"({"ps": ["b:1"], "worker": ["a:1", "c:1"]})",   // roles swapped
                           R"({"chief": ["a:1"], "worker": ["b:1", "c:1"]})",  // job renamed
                           R"({"ps": ["a:1"], "worker": {"0": "b:1", "2": "c:1"}})"}) {
    SCOPED_TRACE(text);
    ClusterSpec other = ClusterSpec::from_json(text, "t");
    EXPECT_NE(base.hash(), other.hash());
    EXPECT_FALSE(base == other);
  }
}

TEST(ClusterSpec, CanonicalFormCannotBeForgedByAddresses) {
  // Naive concatenation of "index=address;" would make these two identical.
  ClusterSpec one = ClusterSpec::from_json(R"({"w": ["a:1;1=b:1"]})", "t");
  ClusterSpec two = ClusterSpec::from_json(R"({"w": ["a:1", "b:1"]})", "t");
  EXPECT_NE(one.canonical_string(), two.canonical_string());
  EXPECT_NE(one.hash(), two.hash());
}

TEST(ClusterSpec, ToJsonDenseIsAListSparseIsAnObjectInInsertionOrder) {
  ClusterSpec spec = ClusterSpec::from_json(R"({"worker": ["w0:1", "w1:1"], "ps": {"1": "p1:1", "4": "p4:1"}})", "t");
  auto doc = nlohmann::ordered_json::parse(spec.to_json());
  ASSERT_TRUE(doc.is_object());
  ASSERT_EQ(doc.size(), 2u);
  EXPECT_EQ(doc.begin().key(), "worker");
  ASSERT_TRUE(doc["worker"].is_array());
  EXPECT_EQ(doc["worker"], nlohmann::ordered_json::parse(R"(["w0:1", "w1:1"])"));
  ASSERT_TRUE(doc["ps"].is_object());
  EXPECT_EQ(doc["ps"]["1"], "p1:1");
  EXPECT_EQ(doc["ps"]["4"], "p4:1");
  // Round trip.
  ClusterSpec again = ClusterSpec::from_json(spec.to_json(), "t");
  EXPECT_TRUE(again == spec);
  EXPECT_EQ(again.job_names(), spec.job_names());
  EXPECT_EQ(again.to_json(), spec.to_json());
}

TEST(ClusterSpec, ToJsonOfSparseJobStartingAtZeroWithAGap) {
  ClusterSpec spec;
  spec.set_task("ps", 0, "p0:1");
  spec.set_task("ps", 2, "p2:1");
  auto doc = nlohmann::json::parse(spec.to_json());
  EXPECT_TRUE(doc["ps"].is_object());
  EXPECT_EQ(ClusterSpec{}.to_json(), "{}");
}

TEST(ClusterSpec, SummaryIsCanonical) {
  ClusterSpec spec = ClusterSpec::from_json(R"({"worker": ["w0:1", "w1:1", "w2:1"], "ps": ["p0:1"]})", "t");
  EXPECT_EQ(spec.summary(), "ps=1,worker=3");
  EXPECT_EQ(ClusterSpec{}.summary(), "(empty)");
}

TEST(ClusterSpec, SetTaskReplacesAndAddJobKeepsOrder) {
  ClusterSpec spec;
  spec.add_job("worker");
  spec.add_job("ps");
  spec.add_job("worker");
  EXPECT_EQ(spec.job_names(), (std::vector<std::string>{"worker", "ps"}));
  EXPECT_EQ(spec.num_tasks("worker"), 0);
  spec.set_task("worker", 0, "old:1");
  spec.set_task("worker", 0, "new:1");
  EXPECT_EQ(spec.num_tasks("worker"), 1);
  EXPECT_EQ(spec.task_address("worker", 0).value_or(""), "new:1");
}

// =================================================================================================
// ResolvedCluster::to_json (the `strata cluster` output)
// =================================================================================================

TEST(ResolvedClusterJson, KnownTask) {
  ResolvedCluster r;
  r.resolver = ResolverKind::kSlurm;
  r.cluster = ClusterSpec::from_json(R"({"ps": ["n1:8888"], "worker": {"0": "n1:8889", "2": "n2:8888"}})", "t");
  r.task = TaskId{"worker", 2};
  r.rpc_layer = "grpc";
  r.num_gpus = 2;
  r.cuda_visible_devices = "2,3";
  auto doc = nlohmann::json::parse(r.to_json());
  EXPECT_EQ(doc["cluster"]["ps"], nlohmann::json::parse(R"(["n1:8888"])"));
  EXPECT_EQ(doc["cluster"]["worker"], nlohmann::json::parse(R"({"0": "n1:8889", "2": "n2:8888"})"));
  EXPECT_EQ(doc["task"]["type"], "worker");
  EXPECT_EQ(doc["task"]["index"], 2);
  EXPECT_EQ(doc["rpc_layer"], "grpc");
  EXPECT_EQ(doc["num_accelerators"], nlohmann::json::parse(R"({"GPU": 2})"));
  EXPECT_EQ(doc["cuda_visible_devices"], "2,3");
}

TEST(ResolvedClusterJson, UnknownTaskNoRpcLayerUntouchedDevicesAreNull) {
  ResolvedCluster r;
  auto doc = nlohmann::json::parse(r.to_json());
  ASSERT_TRUE(doc.contains("cluster"));
  EXPECT_EQ(doc["cluster"], nlohmann::json::object());
  ASSERT_TRUE(doc.contains("task"));
  EXPECT_TRUE(doc["task"].is_null());
  ASSERT_TRUE(doc.contains("rpc_layer"));
  EXPECT_TRUE(doc["rpc_layer"].is_null());
  EXPECT_EQ(doc["num_accelerators"]["GPU"], 0);
  ASSERT_TRUE(doc.contains("cuda_visible_devices"));
  EXPECT_TRUE(doc["cuda_visible_devices"].is_null());
}

TEST(ResolvedClusterJson, EmptyDeviceListIsAnEmptyStringNotNull) {
  ResolvedCluster r = resolve_slurm(make_env(slurm_vars(0)), {}, process_info(-1, -1, 0));
  auto doc = nlohmann::json::parse(r.to_json());
  EXPECT_EQ(doc["cuda_visible_devices"], "");
  EXPECT_EQ(doc["task"]["type"], "worker");
  EXPECT_EQ(doc["task"]["index"], 0);
  EXPECT_EQ(doc["rpc_layer"], "grpc");
}

}  // namespace
}  // namespace strata::cluster

namespace strata::cluster {
namespace {

// strata extension: a PS count turns the first Slurm tasks into parameter servers.
TEST(SlurmNumPs, FirstTasksBecomeParameterServers) {
  Env env({{"SLURM_PROCID", "0"},
           {"SLURM_STEP_NUM_TASKS", "3"},
           {"SLURM_STEP_NODELIST", "n1"},
           {"SLURM_STEP_TASKS_PER_NODE", "3"}});
  ResolveOptions options;
  options.num_ps = 1;
  ProcessInfo process;
  ResolvedCluster r = resolve(env, options, process);
  EXPECT_EQ(r.cluster.summary(), "ps=1,worker=2");
  EXPECT_EQ(r.task.str(), "ps:0");
  // STRATA_NUM_PS does the same when the option is absent; without either, TF's default holds.
  EXPECT_EQ(resolve(env.with("STRATA_NUM_PS", "2"), ResolveOptions{}, process).cluster.summary(), "ps=2,worker=1");
  EXPECT_EQ(resolve(env, ResolveOptions{}, process).cluster.summary(), "worker=3");
  options.num_ps = 3;
  EXPECT_THROW(resolve(env, options, process), ConfigError);
}

// STRATA_JOBS (strata-mpirun --evaluator) stands in for --jobs, under MPI and Slurm, unless a PS
// count or --jobs is given.
TEST(StrataJobs, StandsInForJobsUnlessAPsCountOrJobsIsGiven) {
  const Env jobs(Env::Vars{{"STRATA_JOBS", "ps=1,worker=2,evaluator=1"}});
  ResolvedCluster r = resolve_mpi(jobs, ResolveOptions{}, process_info(3, 4));
  EXPECT_EQ(r.cluster.summary(), "evaluator=1,ps=1,worker=2");
  EXPECT_EQ(r.task.str(), "evaluator:0");
  ResolveOptions ps;
  ps.num_ps = 1;
  EXPECT_EQ(resolve_mpi(jobs, ps, process_info(3, 4)).cluster.summary(), "ps=1,worker=3");
  ResolveOptions explicit_jobs;
  explicit_jobs.jobs = parse_jobs_spec("ps=2,worker=2");
  EXPECT_EQ(resolve_mpi(jobs, explicit_jobs, process_info(3, 4)).cluster.summary(), "ps=2,worker=2");
  Env slurm({{"SLURM_PROCID", "3"},
             {"SLURM_STEP_NUM_TASKS", "4"},
             {"SLURM_STEP_NODELIST", "n1"},
             {"SLURM_STEP_TASKS_PER_NODE", "4"},
             {"STRATA_JOBS", "ps=1,worker=2,evaluator=1"}});
  ProcessInfo process;
  EXPECT_EQ(resolve(slurm, ResolveOptions{}, process).task.str(), "evaluator:0");
  EXPECT_THROW(resolve_mpi(Env(Env::Vars{{"STRATA_JOBS", "ps=1,worker=x"}}), ResolveOptions{}, process_info(0, 4)),
               ConfigError);
}

// =================================================================================================
// Untrusted configuration documents (suites named *Security also carry the `security` label)
// =================================================================================================

// A million nested brackets: before the depth bound, the balanced form parsed and then overflowed
// the stack in the recursive dump() that built the error message (SIGSEGV).
TEST(ClusterJsonSecurity, DeepNestingIsAUsageErrorNamingEachSource) {
  const std::string open(1000000, '[');
  const std::string balanced = "{\"worker\": " + open + std::string(1000000, ']') + "}";
  const std::string unbalanced = "{\"worker\": " + open;
  for (const std::string* text : {&balanced, &unbalanced}) {
    ResolveOptions options;
    options.cluster = *text;
    EXPECT_EQ(config_error([&] { resolve(Env{}, options, process_info(0, 1)); }),
              "--cluster: JSON nested deeper than 64 levels (at byte 74)");
    EXPECT_EQ(config_error([&] { resolve(make_env({{"STRATA_CLUSTER", *text}}), {}, process_info(0, 1)); }),
              "STRATA_CLUSTER: JSON nested deeper than 64 levels (at byte 74)");
    EXPECT_EQ(config_error([&] { resolve(make_env({{"TF_CONFIG", *text}}), {}, process_info(0, 1)); }),
              "TF_CONFIG: JSON nested deeper than 64 levels (at byte 74)");
  }
  // Deep inside the TF_CONFIG-shaped document's parts too.
  const std::string deep_task = R"({"cluster": {"worker": ["a:1"]}, "task": {"type": )" + std::string(100, '[');
  EXPECT_TRUE(Contains(config_error([&] { resolve_tf_config(deep_task, Env{}, {}, process_info()); }),
                       "TF_CONFIG: JSON nested deeper than 64 levels"));
}

TEST(ClusterJsonSecurity, DeepNestingInAClusterFileNamesTheFile) {
  const std::string path = ::testing::TempDir() + "strata_deep_" + std::to_string(::getpid()) + ".json";
  {
    std::ofstream out(path);
    ASSERT_TRUE(out) << path;
    out << "{\"worker\": " << std::string(200000, '[');
  }
  ResolveOptions options;
  options.cluster = path;
  const std::string message = config_error([&] { resolve(Env{}, options, process_info(0, 1)); });
  std::remove(path.c_str());
  EXPECT_EQ(message, "--cluster file '" + path + "': JSON nested deeper than 64 levels (at byte 74)");
}

TEST(ClusterJsonSecurity, ModestNestingStillResolves) {
  // A cluster description needs 3 levels; unrelated keys may nest further within the bound.
  const std::string tf = R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0},
                             "extra": )" + std::string(60, '[') + std::string(60, ']') + "}";
  EXPECT_EQ(resolve_tf_config(tf, Env{}, {}, process_info()).task, (TaskId{"worker", 0}));
}

// 1e400 is nlohmann's out_of_range 406, not a parse_error: it escaped as a runtime failure
// (exit 1) before; now it is a usage error naming TF_CONFIG.
TEST(ClusterJsonSecurity, NumberOverflowIsAUsageErrorNamingTheSource) {
  const std::string huge_integer(400, '9');
  for (const std::string& number : {std::string("1e400"), std::string("-1e400"), huge_integer}) {
    SCOPED_TRACE(number);
    const std::string tf = R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": )" + number + "}}";
    EXPECT_TRUE(Contains(config_error([&] { resolve(make_env({{"TF_CONFIG", tf}}), {}, process_info()); }),
                         "TF_CONFIG has a number out of range: [json.exception.out_of_range.406] number overflow"));
    ResolveOptions options;
    options.cluster = tf;
    EXPECT_TRUE(Contains(config_error([&] { resolve(Env{}, options, process_info()); }),
                         "--cluster has a number out of range"));
  }
  // In range for a double but not for a task index: refused, naming TF_CONFIG and the value.
  for (const char* number : {"99999999999999999999", "18446744073709551615", "1e300", "-1"}) {
    SCOPED_TRACE(number);
    const std::string tf =
        R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": )" + std::string(number) + "}}";
    const std::string message = config_error([&] { resolve_tf_config(tf, Env{}, {}, process_info()); });
    EXPECT_TRUE(Contains(message, "TF_CONFIG: task index"));
  }
}

TEST(ClusterJsonSecurity, ValuesQuotedInMessagesAreCut) {
  const std::string big(1 << 20, 'x');
  const std::string tf = R"({"cluster": {"worker": ["a:1"]}, "task": {"type": ["worker", ")" + big + R"("]}})";
  const std::string message = config_error([&] { resolve_tf_config(tf, Env{}, {}, process_info()); });
  EXPECT_TRUE(Contains(message, "TF_CONFIG: task type must be a string, got [\"worker\",\"xxx"));
  EXPECT_LT(message.size(), 300u);
  const std::string spec = R"({"worker": [")" + big + R"(", 7]})";
  EXPECT_LT(config_error([&] { ClusterSpec::from_json(spec, "--cluster"); }).size(), 300u);
}

TEST(ClusterJsonSecurity, AClusterValueTooLongForAFileNameIsRefusedWithoutQuotingIt) {
  ResolveOptions options;
  options.cluster = std::string(1000000, '[');  // does not start with '{': taken as a file name
  EXPECT_EQ(config_error([&] { resolve(Env{}, options, process_info(0, 1)); }),
            "--cluster: neither a JSON object (it does not start with '{') nor a file name (1000000 bytes)");
}

TEST(ClusterJsonSecurity, AClusterFileIsReadOnlyUpToItsBound) {
  ResolveOptions options;
  options.cluster = "/dev/zero";  // endless: read up to the bound, then refused
  EXPECT_EQ(config_error([&] { resolve(Env{}, options, process_info(0, 1)); }),
            "--cluster: file '/dev/zero' is larger than 64 MiB; a cluster description is far smaller");
}

}  // namespace
}  // namespace strata::cluster
