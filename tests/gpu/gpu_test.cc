// GPU tier (label gpu): the NCCL replica group and the GPU MLP step, on whatever GPUs are visible.
//
// Every test that needs a GPU starts with STRATA_REQUIRE_GPU(): without one (no device, no or too
// old driver, or a build without CUDA/NCCL) it is skipped with the reason cudaGetDeviceCount gave,
// visibly ("[  SKIPPED ]" in gtest, "Skipped" in CTest), never silently passed. The device-selection
// policy and the factory's argument checks are pure and run everywhere.
//
// Oracles: collectives are checked against exact integer-valued inputs (sums of small integers are
// exact in float, so SUM must match bit for bit, MEAN to float rounding); the GPU MLP step is
// checked against the CPU model (src/model) on the same parameters and batch, and the NCCL-reduced
// gradients of several replicas against the mean of the CPU model's per-shard gradients.
//
// GPU replicas through ParameterServerStrategy (GpuStrategy.*) need a PS rank and a worker rank,
// i.e. two MPI processes: such a test re-runs itself, alone, as a 2-rank job under mpiexec (see
// run_as_mpi_job) and passes when that job does.
#include "strata/replica/gpu.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "strata/cluster/runtime.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/config.h"
#include "strata/model/model.h"
#include "strata/nn/builtin.h"
#include "strata/strategy/parameter_server_strategy.h"

#if STRATA_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "replica/nccl/cublas_api.h"
#include "replica/nccl/gpu_mlp.h"
#include "replica/nccl/nccl_replica_group.h"
#endif

// Skips the calling test, with the reason, unless this process sees a GPU.
#define STRATA_REQUIRE_GPU()                                                               \
  do {                                                                                     \
    if (::strata::replica::visible_gpu_count() == 0)                                       \
      GTEST_SKIP() << "no GPU: " << ::strata::replica::gpu_unavailable_reason();           \
  } while (0)

namespace strata::replica {
namespace {

// The CPU reference: the built-in model's layer graph (nn::make_builtin_model) beside the
// configuration it was built from (defaults filled).
class CpuModel {
 public:
  explicit CpuModel(const model::ModelConfig& config)
      : config_(model::resolve_model_config(config)), net_(nn::make_builtin_model(config_)) {}
  const model::ModelConfig& config() const { return config_; }
  const nn::GraphModel& net() const { return *net_; }
  std::vector<ps::VariableSpec> variables() const { return net_->variables(); }
  std::int64_t num_parameters() const { return net_->num_parameters(); }
  // The mean loss of the batch; *correct (when non-null) the examples predicted right.
  double train_step(const model::Params& p, const model::Inputs& in, model::Grads* g, std::int64_t* correct) const {
    const train::StepResult r = net_->step(p, in, g);
    if (correct != nullptr) *correct = r.correct;
    return r.loss;
  }

 private:
  model::ModelConfig config_;
  std::unique_ptr<nn::GraphModel> net_;
};

std::unique_ptr<CpuModel> make_cpu_model(const model::ModelConfig& config) {
  return std::make_unique<CpuModel>(config);
}

// ---- device selection (pure: runs without a GPU) ----------------------------------------------

TEST(SelectDevices, NoGpuMeansNoDevice) {
  EXPECT_TRUE(select_devices(0, 1, 0).empty());
  EXPECT_TRUE(select_devices(1, 3, 0).empty());
  EXPECT_TRUE(select_devices(0, 1, -1).empty());
}

TEST(SelectDevices, SingleWorkerTakesEveryDevice) {
  EXPECT_EQ(select_devices(0, 1, 1), (std::vector<int>{0}));
  EXPECT_EQ(select_devices(0, 1, 4), (std::vector<int>{0, 1, 2, 3}));
}

TEST(SelectDevices, EvenSplitInContiguousBlocks) {
  EXPECT_EQ(select_devices(0, 2, 8), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(select_devices(1, 2, 8), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(select_devices(3, 4, 8), (std::vector<int>{6, 7}));
  EXPECT_EQ(select_devices(2, 4, 4), (std::vector<int>{2}));
}

TEST(SelectDevices, RemainderGoesToTheLowestRanks) {
  EXPECT_EQ(select_devices(0, 3, 8), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(select_devices(1, 3, 8), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(select_devices(2, 3, 8), (std::vector<int>{6, 7}));
}

TEST(SelectDevices, MoreWorkersThanGpusShareRoundRobin) {
  EXPECT_EQ(select_devices(0, 4, 2), (std::vector<int>{0}));
  EXPECT_EQ(select_devices(1, 4, 2), (std::vector<int>{1}));
  EXPECT_EQ(select_devices(2, 4, 2), (std::vector<int>{0}));
  EXPECT_EQ(select_devices(4, 5, 3), (std::vector<int>{1}));
}

// The policy's invariants over every small configuration: all devices in range; every device
// used; with enough devices the blocks are disjoint, contiguous, ascending and differ in size by
// at most one; with too few every worker gets exactly one.
TEST(SelectDevices, InvariantsOverAllSmallConfigurations) {
  for (int gpus = 1; gpus <= 16; ++gpus) {
    for (int workers = 1; workers <= 16; ++workers) {
      SCOPED_TRACE("gpus=" + std::to_string(gpus) + " workers=" + std::to_string(workers));
      std::vector<int> uses(static_cast<std::size_t>(gpus), 0);
      std::size_t smallest = SIZE_MAX, largest = 0;
      for (int rank = 0; rank < workers; ++rank) {
        const std::vector<int> d = select_devices(rank, workers, gpus);
        ASSERT_FALSE(d.empty());
        smallest = std::min(smallest, d.size());
        largest = std::max(largest, d.size());
        for (std::size_t i = 0; i < d.size(); ++i) {
          ASSERT_GE(d[i], 0);
          ASSERT_LT(d[i], gpus);
          if (i > 0) {
            EXPECT_EQ(d[i], d[i - 1] + 1) << "not contiguous";
          }
          ++uses[static_cast<std::size_t>(d[i])];
        }
      }
      for (int g = 0; g < gpus; ++g) EXPECT_GE(uses[static_cast<std::size_t>(g)], 1) << "GPU " << g << " unused";
      if (gpus >= workers) {
        for (int g = 0; g < gpus; ++g) EXPECT_EQ(uses[static_cast<std::size_t>(g)], 1) << "GPU " << g << " shared";
        EXPECT_LE(largest - smallest, 1u);
      } else {
        EXPECT_EQ(largest, 1u);
      }
    }
  }
}

TEST(SelectDevices, RejectsBadRanks) {
  EXPECT_THROW(select_devices(0, 0, 4), ConfigError);
  EXPECT_THROW(select_devices(-1, 2, 4), ConfigError);
  EXPECT_THROW(select_devices(2, 2, 4), ConfigError);
}

// Workers on one node that see the same GPUs split them; workers the launcher gave their own GPUs
// (different CUDA_VISIBLE_DEVICES) use all they see.
TEST(SelectWorkerDevices, SharedGpusAreSplitOwnGpusAreKept) {
  using Cvd = std::optional<std::string>;
  const std::vector<Cvd> unset{std::nullopt, std::nullopt};
  EXPECT_EQ(select_worker_devices(unset, 0, 4), (std::vector<int>{0, 1}));
  EXPECT_EQ(select_worker_devices(unset, 1, 4), (std::vector<int>{2, 3}));
  const std::vector<Cvd> same{Cvd("0,1,2"), Cvd("0,1,2"), Cvd("0,1,2")};
  EXPECT_EQ(select_worker_devices(same, 2, 3), (std::vector<int>{2}));
  const std::vector<Cvd> own{Cvd("0,1"), Cvd("2,3")};
  EXPECT_EQ(select_worker_devices(own, 0, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(select_worker_devices(own, 1, 2), (std::vector<int>{0, 1}));
  // One worker with CUDA_VISIBLE_DEVICES set and one without: not the same GPUs, each keeps its own.
  EXPECT_EQ(select_worker_devices({Cvd("1"), std::nullopt}, 0, 1), (std::vector<int>{0}));
  EXPECT_EQ(select_worker_devices({Cvd("")}, 0, 0), std::vector<int>{});
  EXPECT_EQ(select_worker_devices({std::nullopt}, 0, 8), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_THROW(select_worker_devices(unset, 2, 4), ConfigError);
  EXPECT_THROW(select_worker_devices({}, 0, 4), ConfigError);
}

TEST(DevicePolicy, ParsesTheFlagValues) {
  EXPECT_EQ(parse_device_policy("auto"), DevicePolicy::kAuto);
  EXPECT_EQ(parse_device_policy("cpu"), DevicePolicy::kCpu);
  EXPECT_EQ(parse_device_policy("gpu"), DevicePolicy::kGpu);
  EXPECT_STREQ(to_string(DevicePolicy::kGpu), "gpu");
  try {
    parse_device_policy("tpu");
    ADD_FAILURE() << "'tpu' was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--devices: 'tpu' is not one of auto, cpu, gpu"), std::string::npos)
        << e.what();
  }
}

// ---- probe and factory (run without a GPU too: they must fail softly, not crash) --------------

TEST(GpuProbe, ReasonGivenExactlyWhenNoGpu) {
  const int count = visible_gpu_count();
  const std::string reason = gpu_unavailable_reason();
  EXPECT_GE(count, 0);
  EXPECT_EQ(count == 0, !reason.empty()) << "count " << count << ", reason '" << reason << "'";
  EXPECT_EQ(visible_gpu_count(), count) << "the probe must be stable";
  RecordProperty("visible_gpus", count);
  if (!reason.empty()) RecordProperty("gpu_unavailable_reason", reason);
}

TEST(GpuProbe, FactoryRejectsBadDeviceListsWithConfigError) {
  EXPECT_THROW(make_nccl_replica_group({}, 10.0), ConfigError);
  EXPECT_THROW(make_nccl_replica_group({-1}, 10.0), ConfigError);
  // One past the last visible device: with no GPU (or no CUDA) this is device 0, and the error
  // must carry the probe's reason rather than crash in the CUDA runtime.
  try {
    make_nccl_replica_group({visible_gpu_count()}, 10.0);
    ADD_FAILURE() << "an invisible device was accepted";
  } catch (const ConfigError& e) {
    if (visible_gpu_count() == 0) {
      EXPECT_NE(std::string(e.what()).find(gpu_unavailable_reason()), std::string::npos) << e.what();
    }
  }
}

// A GPU model needs the NCCL group's device and stream: on a host group (and in builds without
// CUDA/NCCL) the constructor is a ConfigError, never a crash.
TEST(GpuProbe, GpuMlpReplicaNeedsAnNcclGroup) {
  auto host = make_host_replica_group(2, 10.0);
  EXPECT_THROW(GpuMlpReplica(*host, 0, GpuMlpReplica::Shape{4, {3}, 2}), ConfigError);
}

#if STRATA_HAVE_NCCL

// ---- helpers ------------------------------------------------------------------------------------

void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// A float buffer on one device (test-side RAII; the library's own buffers are not used here).
class DeviceVector {
 public:
  DeviceVector(int device, std::size_t n) : device_(device), n_(n) {
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    if (n_ > 0) cuda_ok(cudaMalloc(&data_, n_ * sizeof(float)), "cudaMalloc");
  }
  ~DeviceVector() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  float* data() { return data_; }
  void upload(const std::vector<float>& host) {
    cuda_ok(cudaMemcpy(data_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<float> download() const {
    std::vector<float> host(n_);
    cuda_ok(cudaMemcpy(host.data(), data_, n_ * sizeof(float), cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  int device_;
  std::size_t n_;
  float* data_ = nullptr;
};

// Runs fn(r) on one thread per replica (each on its replica's device) and rethrows the first
// exception after all threads have joined.
template <typename Fn>
void run_replicas(const NcclReplicaGroup& group, Fn fn) {
  const int k = group.size();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(k));
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      try {
        cuda_ok(cudaSetDevice(group.device(r)), "cudaSetDevice");
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Called by every replica after it allocated its buffers and before its first collective: no
// replica may allocate (or free) device or pinned memory while another one's NCCL kernel is
// already waiting for it (see nccl_replica_group.h), so the allocations end behind a barrier.
void allocated(NcclReplicaGroup& group, int replica) { group.barrier(replica); }

std::vector<int> all_devices() { return select_devices(0, 1, visible_gpu_count()); }

std::unique_ptr<NcclReplicaGroup> make_group(bool native_mean, double timeout_s = 120.0) {
  NcclReplicaGroup::Options options;
  options.timeout_s = timeout_s;
  options.native_mean = native_mean;
  return std::make_unique<NcclReplicaGroup>(all_devices(), options);
}

// Odd sizes: a single element, less than a warp, not a multiple of any NCCL chunk, > 1 M.
const std::vector<std::size_t> kOddSizes{1, 7, 1001, 65537, (1u << 20) + 3};

// Replica r's input: small integers, so every partial sum is exact in float.
float input_value(int replica, std::size_t i) { return static_cast<float>((replica + 1) + static_cast<int>(i % 13)); }

// ---- NcclReplicaGroup ---------------------------------------------------------------------------

TEST(NcclReplicaGroup, DescribesItself) {
  STRATA_REQUIRE_GPU();
  auto group = make_nccl_replica_group(all_devices(), 60.0);
  EXPECT_EQ(group->size(), visible_gpu_count());
  EXPECT_EQ(group->memory_kind(), MemoryKind::kCuda);
  EXPECT_STREQ(group->name(), "nccl");
}

TEST(NcclReplicaGroup, AllReduceSumAndMeanOverOddSizes) {
  STRATA_REQUIRE_GPU();
  // Both MEAN paths: ncclAvg (where NCCL has it) and ncclSum + the divide kernel.
  for (bool native_mean : {true, false}) {
    auto group = make_group(native_mean);
    const int k = group->size();
    SCOPED_TRACE(std::string("MEAN via ") + (group->uses_native_mean() ? "ncclAvg" : "sum + divide"));
    for (std::size_t n : kOddSizes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " op=" + to_string(op));
        run_replicas(*group, [&](int r) {
          DeviceVector buffer(group->device(r), n);
          std::vector<float> host(n);
          for (std::size_t i = 0; i < n; ++i) host[i] = input_value(r, i);
          buffer.upload(host);
          allocated(*group, r);
          group->all_reduce(r, buffer.data(), n, op);
          const std::vector<float> out = buffer.download();
          std::size_t bad = 0, first_bad = 0;
          for (std::size_t i = 0; i < n; ++i) {
            float sum = 0.0f;
            for (int q = 0; q < k; ++q) sum += input_value(q, i);
            const bool ok = op == ReduceOp::kSum
                                ? out[i] == sum
                                : std::fabs(out[i] - sum / static_cast<float>(k)) <= 1e-6f * std::fabs(sum);
            if (!ok && bad++ == 0) first_bad = i;
          }
          EXPECT_EQ(bad, 0u) << "replica " << r << ": " << bad << " wrong elements, first at " << first_bad
                             << " = " << out[first_bad];
        });
      }
    }
  }
}

TEST(NcclReplicaGroup, BroadcastFromEveryRootOverOddSizes) {
  STRATA_REQUIRE_GPU();
  auto group = make_group(true);
  const int k = group->size();
  for (std::size_t n : {std::size_t{1}, std::size_t{4099}, std::size_t{(1u << 20) + 3}}) {
    for (int root = 0; root < k; ++root) {
      SCOPED_TRACE("n=" + std::to_string(n) + " root=" + std::to_string(root));
      run_replicas(*group, [&](int r) {
        DeviceVector buffer(group->device(r), n);
        std::vector<float> host(n);
        for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(r * 1000 + static_cast<int>(i % 17));
        buffer.upload(host);
        allocated(*group, r);
        group->broadcast(r, buffer.data(), n, root);
        const std::vector<float> out = buffer.download();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) bad += out[i] != static_cast<float>(root * 1000 + static_cast<int>(i % 17));
        EXPECT_EQ(bad, 0u) << "replica " << r;
      });
    }
  }
}

// Many small collectives back to back, mixed: catches ordering mix-ups between consecutive calls.
TEST(NcclReplicaGroup, MixedSequenceOfCollectives) {
  STRATA_REQUIRE_GPU();
  auto group = make_group(false);
  const int k = group->size();
  run_replicas(*group, [&](int r) {
    DeviceVector buffer(group->device(r), 3);
    allocated(*group, r);
    for (int step = 0; step < 40; ++step) {
      buffer.upload({static_cast<float>(r + step), 1.0f, static_cast<float>(r)});
      group->all_reduce(r, buffer.data(), 3, ReduceOp::kSum);
      std::vector<float> out = buffer.download();
      const float ranks = static_cast<float>(k * (k - 1) / 2);
      EXPECT_EQ(out[0], ranks + static_cast<float>(k * step)) << "step " << step;
      EXPECT_EQ(out[1], static_cast<float>(k));
      group->broadcast(r, buffer.data(), 3, step % k);
      group->all_reduce(r, nullptr, 0, ReduceOp::kMean);  // zero length: a no-op for everyone
      if (step % 5 == 0) group->barrier(r);
      out = buffer.download();
      EXPECT_EQ(out[2], ranks) << "step " << step;
    }
  });
}

TEST(NcclReplicaGroup, BadArgumentsThrow) {
  STRATA_REQUIRE_GPU();
  auto group = make_group(true);
  const int k = group->size();
  DeviceVector buffer(group->device(0), 4);
  EXPECT_THROW(group->all_reduce(k, buffer.data(), 4, ReduceOp::kSum), Error);   // no such replica
  EXPECT_THROW(group->all_reduce(-1, buffer.data(), 4, ReduceOp::kSum), Error);
  EXPECT_THROW(make_nccl_replica_group({0, 0}, 10.0), ConfigError);              // duplicate device
  EXPECT_THROW(make_nccl_replica_group({0}, 0.0), ConfigError);                  // no timeout
}

// copy_to_host, how the strategy stages the reduced gradients for the push: ordered after the
// collective on the replica's stream, through the pinned buffer (whole, or in chunks of a size
// that divides none of the lengths), or straight into pageable memory with pinned staging off.
TEST(NcclReplicaGroup, CopyToHostPinnedChunkedAndPageable) {
  STRATA_REQUIRE_GPU();
  struct Variant {
    const char* name;
    bool pinned;
    std::size_t max_bytes;
  };
  for (const Variant& v : {Variant{"pinned", true, gpu::kDefaultMaxStagingBytes},
                           Variant{"pinned, chunks of 1025 floats", true, 4100},
                           Variant{"pageable", false, gpu::kDefaultMaxStagingBytes}}) {
    SCOPED_TRACE(v.name);
    NcclReplicaGroup::Options options;
    options.timeout_s = 120.0;
    options.pinned_staging = v.pinned;
    options.max_staging_bytes = v.max_bytes;
    NcclReplicaGroup group(all_devices(), options);
    const int k = group.size();
    for (std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{(1u << 20) + 3}}) {
      SCOPED_TRACE("n=" + std::to_string(n));
      run_replicas(group, [&](int r) {
        DeviceVector buffer(group.device(r), n);
        std::vector<float> host(n);
        for (std::size_t i = 0; i < n; ++i) host[i] = input_value(r, i);
        buffer.upload(host);
        allocated(group, r);
        group.all_reduce(r, buffer.data(), n, ReduceOp::kSum);
        std::vector<float> out(n, -1.0f);
        group.copy_to_host(r, out.data(), buffer.data(), n);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          float sum = 0.0f;
          for (int q = 0; q < k; ++q) sum += input_value(q, i);
          bad += out[i] != sum;
        }
        EXPECT_EQ(bad, 0u) << "replica " << r;
        if (v.pinned) {
          EXPECT_EQ(group.staging_bytes(r), std::min(n * sizeof(float), v.max_bytes)) << "grown to the largest copy";
        } else {
          EXPECT_EQ(group.staging_bytes(r), 0u);
        }
        group.copy_to_host(r, nullptr, nullptr, 0);  // nothing to copy: a no-op
        EXPECT_THROW(group.copy_to_host(r, nullptr, buffer.data(), n), Error);
      });
    }
  }
}

// A null buffer is a usage error that fails the whole group: the peers may already be waiting
// inside the collective, and must not be left to time out.
TEST(NcclReplicaGroup, UsageErrorMakesTheGroupUnusable) {
  STRATA_REQUIRE_GPU();
  NcclReplicaGroup::Options options;
  options.timeout_s = 30.0;
  NcclReplicaGroup group({0}, options);
  DeviceVector buffer(0, 4);
  EXPECT_THROW(group.all_reduce(0, nullptr, 4, ReduceOp::kSum), Error);
  try {
    group.all_reduce(0, buffer.data(), 4, ReduceOp::kSum);
    ADD_FAILURE() << "a failed group accepted another collective";
  } catch (const NcclError& e) {
    EXPECT_NE(std::string(e.what()).find("unusable"), std::string::npos) << e.what();
  }
}

// A replica that never arrives: the others time out, name it, and abort their communicators.
TEST(NcclReplicaGroup, MissingReplicaTimesOutNamingIt) {
  STRATA_REQUIRE_GPU();
  if (visible_gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << visible_gpu_count() << " visible";
  auto group = make_group(true, /*timeout_s=*/3.0);
  const int k = group->size();
  std::vector<int> expected_missing{k - 1};
  run_replicas(*group, [&](int r) {
    if (r == k - 1) return;  // this replica skips the collective
    DeviceVector buffer(group->device(r), 1024);
    try {
      group->all_reduce(r, buffer.data(), 1024, ReduceOp::kSum);
      ADD_FAILURE() << "replica " << r << ": all_reduce completed without replica " << k - 1;
    } catch (const TimeoutError& e) {
      EXPECT_EQ(e.missing_ranks(), expected_missing) << e.what();
    } catch (const NcclError& e) {
      // A replica may see the first one's recorded failure before its own deadline.
      EXPECT_NE(std::string(e.what()).find("did not arrive"), std::string::npos) << e.what();
    }
  });
}

// ---- GPU MLP step against the CPU model -------------------------------------------------------


struct Case {
  std::string name;
  model::ModelConfig config;
  int batch;
};

std::vector<Case> mlp_cases() {
  std::vector<Case> cases;
  model::ModelConfig odd;
  odd.name = "mlp";
  odd.input_dim = 37;
  odd.hidden = {33, 17};
  odd.num_classes = 7;
  odd.seed = 11;
  cases.push_back({"mlp 37-33-17-7, batch 29", odd, 29});
  model::ModelConfig softmax;
  softmax.name = "softmax";
  softmax.input_dim = 20;
  softmax.num_classes = 3;
  softmax.seed = 5;
  cases.push_back({"softmax 20-3, batch 1", softmax, 1});
  model::ModelConfig deflt;  // the default mlp 784-256-128-10 at the training batch size
  deflt.seed = 3;
  cases.push_back({"mlp 784-256-128-10, batch 128", deflt, 128});
  return cases;
}

gpu::MlpShape shape_of(const CpuModel& m) {
  return gpu::MlpShape{m.config().input_dim, m.config().hidden, m.config().num_classes};
}

// Initial parameters with non-zero biases (Keras initialises them to zero, which would leave the
// bias addition of the forward pass untested).
model::Params test_params(const CpuModel& m, std::uint32_t seed) {
  model::Params params = nn::init_local_params(m.net());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  for (auto& [name, p] : params.dense)
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, "/bias") == 0)
      for (float& v : p.value) v = u(rng);
  return params;
}

struct Batch {
  std::vector<float> x;
  std::vector<std::int32_t> labels;
};

Batch random_batch(const model::ModelConfig& c, int size, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Batch b;
  b.x.resize(static_cast<std::size_t>(size) * static_cast<std::size_t>(c.input_dim));
  for (float& v : b.x) v = u(rng);
  b.labels.resize(static_cast<std::size_t>(size));
  for (auto& y : b.labels) y = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(c.num_classes));
  return b;
}

// |gpu - cpu| <= 1e-4 * max|cpu| + 1e-7, element by element; the message names the worst element.
::testing::AssertionResult GradientsClose(const std::string& name, const std::vector<float>& gpu,
                                          const std::vector<float>& cpu) {
  if (gpu.size() != cpu.size())
    return ::testing::AssertionFailure() << name << ": " << gpu.size() << " vs " << cpu.size() << " elements";
  float scale = 0.0f;
  for (float v : cpu) scale = std::max(scale, std::fabs(v));
  const float tolerance = 1e-4f * scale + 1e-7f;
  std::size_t worst = 0;
  float worst_diff = 0.0f;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const float diff = std::fabs(gpu[i] - cpu[i]);
    if (diff > worst_diff) {
      worst_diff = diff;
      worst = i;
    }
  }
  if (worst_diff <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << "[" << worst << "]: gpu " << gpu[worst] << " vs cpu " << cpu[worst]
                                       << " (|diff| " << worst_diff << " > " << tolerance << ")";
}

struct StagingVariant {
  const char* name;
  gpu::GpuMlp::Staging staging;
};

std::vector<StagingVariant> staging_variants() {
  return {{"pinned staging", gpu::GpuMlp::Staging{}},
          {"pinned staging in chunks of 251 floats", gpu::GpuMlp::Staging{true, 251 * sizeof(float)}},
          {"pageable staging", gpu::GpuMlp::Staging{false, gpu::kDefaultMaxStagingBytes}}};
}

void upload_params(gpu::GpuMlp& mlp, const model::Params& params) {
  for (const gpu::MlpVariable& v : mlp.variables()) {
    const auto& p = params.dense.at(v.name);
    mlp.upload_param(v.name, p.value.data(), p.value.size());
  }
}

// cuBLAS is opened on first use, never at process start (replica/nccl/cublas_api.h): its
// initialisers cost every process ~0.5 s of CPU. Runs without a GPU (dlopen needs none). Forked,
// so that "not mapped yet" holds whatever this binary's other tests did first.
bool cublas_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcublas") != std::string::npos) return true;
  return false;
}

TEST(CublasApi, OpenedOnFirstUseWithEveryEntryPoint) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    if (cublas_mapped() || ::strata::detail::cublas_if_loaded() != nullptr) code = 10;  // linked: loaded at start
    try {
      const ::strata::detail::CublasApi& api = ::strata::detail::cublas();
      if (api.create == nullptr || api.destroy == nullptr || api.set_stream == nullptr ||
          api.set_math_mode == nullptr || api.sgemm == nullptr || api.status_name == nullptr ||
          api.status_string == nullptr)
        code = code != 0 ? code : 11;
      const char* name = api.status_name(CUBLAS_STATUS_NOT_INITIALIZED);
      if (name == nullptr || std::string(name) != "CUBLAS_STATUS_NOT_INITIALIZED") code = code != 0 ? code : 12;
      if (!cublas_mapped() || ::strata::detail::cublas_if_loaded() != &api) code = code != 0 ? code : 13;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      code = code != 0 ? code : 14;
    }
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: libcublas mapped before first use, 11: an entry point missing, "
                                       "12: wrong status name, 13: not mapped after loading, 14: load failed";
}

// The flat layout, host-side only: runs without a GPU. strata train checks the same against the
// strategy's variables at startup; a mismatch would push every gradient into the wrong variable.
TEST(GpuMlpLayout, MatchesTheCpuModelWithoutAGpu) {
  for (const Case& c : mlp_cases()) {
    SCOPED_TRACE(c.name);
    auto cpu = make_cpu_model(c.config);
    const std::vector<gpu::MlpVariable> layout = gpu::mlp_variables(shape_of(*cpu));
    const auto specs = cpu->variables();
    ASSERT_EQ(layout.size(), specs.size());
    std::size_t offset = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(layout[i].name, specs[i].name);
      EXPECT_EQ(layout[i].shape, specs[i].shape);
      EXPECT_EQ(layout[i].offset, offset) << "the variables are concatenated without padding";
      EXPECT_EQ(static_cast<std::int64_t>(layout[i].size), ps::num_elements(specs[i].shape));
      offset += layout[i].size;
    }
    EXPECT_EQ(static_cast<std::int64_t>(offset), cpu->num_parameters());
  }
  // Kernel before bias, layer by layer, the logits last.
  const auto small = gpu::mlp_variables(gpu::MlpShape{3, {2}, 4});
  ASSERT_EQ(small.size(), 4u);
  EXPECT_EQ(small[0].name, "dense_0/kernel");
  EXPECT_EQ(small[1].offset, 6u);
  EXPECT_EQ(small[2].name, "logits/kernel");
  EXPECT_EQ(small[2].offset, 8u);
  EXPECT_EQ(small[3].offset, 16u);
  EXPECT_EQ(small[3].size, 4u);
}

// A bad shape is a ConfigError before any CUDA call, so it is the same with or without a GPU.
TEST(GpuMlpLayout, BadShapesAreConfigErrorsWithoutAGpu) {
  EXPECT_THROW(gpu::mlp_variables(gpu::MlpShape{0, {}, 2}), ConfigError);
  EXPECT_THROW(gpu::mlp_variables(gpu::MlpShape{4, {}, 1}), ConfigError);
  EXPECT_THROW(gpu::mlp_variables(gpu::MlpShape{4, {8, 0}, 2}), ConfigError);
  EXPECT_THROW(gpu::GpuMlp(0, gpu::MlpShape{0, {}, 2}, nullptr), ConfigError);
  EXPECT_THROW(gpu::GpuMlp(0, gpu::MlpShape{4, {-3}, 2}, nullptr), ConfigError);
}

// Pinned staging must fail soft: without a GPU (or driver) cudaHostAlloc fails, reserve() says so
// and the buffer stays empty. With a GPU the memory is usable, grows, moves and is freed, and a
// failed allocation (an impossible size) leaves the buffer empty and the thread's CUDA error state
// clean (a stale error would be reported by the next kernel-launch check). Without a driver that
// state cannot be cleaned (every call reports the initialisation error again), and no kernel is
// ever launched there, so it is not checked.
TEST(PinnedBuffer, ReservesOrFallsBackCleanly) {
  gpu::PinnedBuffer buffer;
  EXPECT_TRUE(buffer.reserve(0));
  EXPECT_EQ(buffer.capacity(), 0u);
  const bool pinned = buffer.reserve(4096);
  if (!pinned) {
    EXPECT_EQ(buffer.data(), nullptr);
    EXPECT_EQ(buffer.capacity(), 0u);
    EXPECT_EQ(visible_gpu_count(), 0) << "cudaHostAlloc of 4 KiB failed although a GPU is visible";
    EXPECT_FALSE(buffer.reserve(1));
    return;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(buffer.capacity(), 4096u);
  static_cast<char*>(buffer.data())[4095] = 7;
  EXPECT_TRUE(buffer.reserve(100));  // already large enough: kept
  EXPECT_EQ(buffer.capacity(), 4096u);
  EXPECT_TRUE(buffer.reserve(10000));
  EXPECT_EQ(buffer.capacity(), 10000u);
  gpu::PinnedBuffer moved(std::move(buffer));
  EXPECT_EQ(moved.capacity(), 10000u);
  EXPECT_EQ(buffer.capacity(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  moved.reset();
  EXPECT_EQ(moved.data(), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // 1 EiB cannot be pinned: the fallback, with a clean error state afterwards.
  EXPECT_FALSE(moved.reserve(std::size_t{1} << 60));
  EXPECT_EQ(moved.data(), nullptr);
  EXPECT_EQ(moved.capacity(), 0u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(GpuMlp, VariablesMatchTheCpuModel) {
  STRATA_REQUIRE_GPU();
  for (const Case& c : mlp_cases()) {
    SCOPED_TRACE(c.name);
    auto cpu = make_cpu_model(c.config);
    gpu::GpuMlp mlp(0, shape_of(*cpu), nullptr);
    const auto specs = cpu->variables();
    ASSERT_EQ(mlp.variables().size(), specs.size());
    std::size_t offset = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(mlp.variables()[i].name, specs[i].name);
      EXPECT_EQ(mlp.variables()[i].shape, specs[i].shape);
      EXPECT_EQ(mlp.variables()[i].offset, offset);
      offset += mlp.variables()[i].size;
    }
    EXPECT_EQ(static_cast<std::int64_t>(mlp.num_parameters()), cpu->num_parameters());
  }
}

TEST(GpuMlp, StepMatchesCpuModel) {
  STRATA_REQUIRE_GPU();
  for (const Case& c : mlp_cases()) {
    SCOPED_TRACE(c.name);
    auto cpu = make_cpu_model(c.config);
    const model::Params params = test_params(*cpu, 17);
    const Batch batch = random_batch(cpu->config(), c.batch, 23);
    const model::Inputs inputs{c.batch, batch.x.data(), cpu->config().input_dim, nullptr, 0, batch.labels.data()};
    model::Grads cpu_grads;
    std::int64_t cpu_correct = -1;
    const double cpu_loss = cpu->train_step(params, inputs, &cpu_grads, &cpu_correct);

    // The same step with every staging path: pinned (what training uses), pinned in chunks of 251
    // floats (so variables straddle chunk boundaries), and pageable. Each is checked against the
    // CPU model and against the first (the device work is identical, so a staging bug is the only
    // way for them to differ).
    std::vector<float> first_grads;
    double first_loss = 0.0;
    for (const StagingVariant& variant : staging_variants()) {
      SCOPED_TRACE(variant.name);
      gpu::GpuMlp mlp(0, shape_of(*cpu), nullptr, variant.staging);
      EXPECT_EQ(mlp.pinned_staging(), variant.staging.pinned);
      upload_params(mlp, params);
      const gpu::MlpStepResult r = mlp.train_step(batch.x.data(), batch.labels.data(), c.batch);
      EXPECT_NEAR(r.loss, cpu_loss, 1e-5 * std::max(1.0, std::fabs(cpu_loss)));
      // The flat download (download_grads), checked against the per-variable downloads below.
      std::vector<float> flat(mlp.num_parameters());
      mlp.download_grads(flat.data(), flat.size());
      if (first_grads.empty()) {
        first_grads = flat;
        first_loss = r.loss;
      } else {
        EXPECT_TRUE(GradientsClose("flat gradient vs the first staging variant", flat, first_grads));
        EXPECT_NEAR(r.loss, first_loss, 1e-9 * std::max(1.0, std::fabs(first_loss)));
      }
      // Parameters round-trip through the staging buffers unchanged.
      for (const gpu::MlpVariable& v : mlp.variables()) {
        std::vector<float> back(v.size);
        mlp.download_param(v.name, back.data(), back.size());
        EXPECT_EQ(back, params.dense.at(v.name).value) << v.name;
      }
      // An argmax can flip where two logits are within float rounding of each other; a real argmax
      // bug (last maximum, wrong row) would differ on many rows.
      EXPECT_LE(std::llabs(r.correct - cpu_correct), 1) << "gpu " << r.correct << " vs cpu " << cpu_correct;
      for (const gpu::MlpVariable& v : mlp.variables()) {
        std::vector<float> g(v.size);
        mlp.download_grad(v.name, g.data(), g.size());
        EXPECT_TRUE(GradientsClose(v.name, g, cpu_grads.dense.at(v.name).value));
        EXPECT_TRUE(std::equal(g.begin(), g.end(), flat.begin() + static_cast<std::ptrdiff_t>(v.offset)))
            << v.name << " is not at its offset in the flat gradient";
      }

      // Forward only: same loss and count, gradients untouched.
      const std::string first = mlp.variables().front().name;
      std::vector<float> before(mlp.variables().front().size), after(before.size());
      mlp.download_grad(first, before.data(), before.size());
      const gpu::MlpStepResult f = mlp.train_step(batch.x.data(), batch.labels.data(), c.batch, /*backward=*/false);
      mlp.download_grad(first, after.data(), after.size());
      EXPECT_DOUBLE_EQ(f.loss, r.loss);
      EXPECT_EQ(f.correct, r.correct);
      EXPECT_EQ(before, after);

      // A larger batch grows the scratch (the old buffers are retired, not freed), a smaller one
      // reuses it; both must still match the CPU model.
      for (int size : {2 * c.batch + 3, 1}) {
        const Batch other = random_batch(cpu->config(), size, 29 + static_cast<std::uint32_t>(size));
        const model::Inputs in{size, other.x.data(), cpu->config().input_dim, nullptr, 0, other.labels.data()};
        model::Grads g_cpu;
        const double l_cpu = cpu->train_step(params, in, &g_cpu, nullptr);
        const gpu::MlpStepResult o = mlp.train_step(other.x.data(), other.labels.data(), size);
        EXPECT_NEAR(o.loss, l_cpu, 1e-5 * std::max(1.0, std::fabs(l_cpu))) << "batch " << size;
        const gpu::MlpVariable& last = mlp.variables().back();
        std::vector<float> g(last.size);
        mlp.download_grad(last.name, g.data(), g.size());
        EXPECT_TRUE(GradientsClose("batch " + std::to_string(size) + " " + last.name, g, g_cpu.dense.at(last.name).value));
      }
    }
  }
}

TEST(GpuMlp, EmptyBatchAndBadLabels) {
  STRATA_REQUIRE_GPU();
  gpu::GpuMlp mlp(0, gpu::MlpShape{4, {3}, 2}, nullptr);
  const gpu::MlpStepResult r = mlp.train_step(nullptr, nullptr, 0);
  EXPECT_EQ(r.loss, 0.0);
  EXPECT_EQ(r.correct, 0);
  std::vector<float> g(mlp.variable("dense_0/kernel").size, 1.0f);
  mlp.download_grad("dense_0/kernel", g.data(), g.size());
  EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));

  const std::vector<float> x(8, 0.5f);
  const std::vector<std::int32_t> bad{0, 2};
  EXPECT_THROW(mlp.train_step(x.data(), bad.data(), 2), Error);
  EXPECT_THROW(mlp.variable("nope"), Error);
  EXPECT_THROW(mlp.upload_param("dense_0/bias", x.data(), 8), Error);  // wrong size
  EXPECT_THROW(gpu::GpuMlp(0, gpu::MlpShape{0, {}, 2}, nullptr), ConfigError);
}

// The data-parallel step of a worker: each replica runs the GPU step on its shard of the batch on
// its own device and stream, then the gradients are all-reduced (MEAN) through NCCL. Every replica
// must end with the mean of the CPU model's per-shard gradients.
TEST(GpuMlp, ReplicasAllReduceMeanMatchesCpu) {
  STRATA_REQUIRE_GPU();
  model::ModelConfig config;
  config.input_dim = 41;
  config.hidden = {29, 13};
  config.num_classes = 5;
  config.seed = 9;
  auto cpu = make_cpu_model(config);
  const model::Params params = test_params(*cpu, 31);
  auto group = make_group(true);
  const int k = group->size();
  constexpr int kShard = 19;
  const Batch batch = random_batch(cpu->config(), k * kShard, 37);

  // Expected: the mean over replicas of the CPU model's gradient on each shard.
  std::map<std::string, std::vector<float>> expected;
  for (int r = 0; r < k; ++r) {
    const std::size_t x0 = static_cast<std::size_t>(r) * kShard * static_cast<std::size_t>(config.input_dim);
    const model::Inputs shard{kShard, batch.x.data() + x0, config.input_dim, nullptr, 0,
                              batch.labels.data() + static_cast<std::size_t>(r) * kShard};
    model::Grads g;
    cpu->train_step(params, shard, &g, nullptr);
    for (auto& [name, p] : g.dense) {
      auto& e = expected[name];
      e.resize(p.value.size(), 0.0f);
      for (std::size_t i = 0; i < e.size(); ++i) e[i] += p.value[i];
    }
  }
  for (auto& [name, e] : expected)
    for (float& v : e) v /= static_cast<float>(k);

  run_replicas(*group, [&](int r) {
    gpu::GpuMlp mlp(group->device(r), shape_of(*cpu), group->stream(r));
    allocated(*group, r);
    upload_params(mlp, params);
    const std::size_t x0 = static_cast<std::size_t>(r) * kShard * static_cast<std::size_t>(config.input_dim);
    mlp.train_step(batch.x.data() + x0, batch.labels.data() + static_cast<std::size_t>(r) * kShard, kShard);
    group->all_reduce(r, mlp.grads(), mlp.num_parameters(), ReduceOp::kMean);
    // As the strategy stages it for the push: the whole flat gradient through the group.
    std::vector<float> flat(mlp.num_parameters());
    group->copy_to_host(r, flat.data(), mlp.grads(), flat.size());
    for (const gpu::MlpVariable& v : mlp.variables()) {
      std::vector<float> g(v.size);
      mlp.download_grad(v.name, g.data(), g.size());
      EXPECT_TRUE(GradientsClose("replica " + std::to_string(r) + " " + v.name, g, expected.at(v.name)));
      EXPECT_TRUE(std::equal(g.begin(), g.end(), flat.begin() + static_cast<std::ptrdiff_t>(v.offset))) << v.name;
    }
  });
}

// A partial last batch can leave a replica with no example. Its gradient is zero (as on a CPU
// replica) and the MEAN still divides by the replica count: the mean of the per-replica mean
// gradients, the same function the CPU replicas compute. With one GPU that replica is the only one.
TEST(GpuMlp, ReplicaWithAnEmptyBatchContributesZeros) {
  STRATA_REQUIRE_GPU();
  model::ModelConfig config;
  config.input_dim = 12;
  config.hidden = {9};
  config.num_classes = 3;
  config.seed = 4;
  auto cpu = make_cpu_model(config);
  const model::Params params = test_params(*cpu, 8);
  auto group = make_group(false);  // the sum + divide MEAN, whose kernel runs right after NCCL's
  const int k = group->size();
  constexpr int kShard = 5;
  const int empty = k - 1;  // the last replica gets nothing
  const Batch batch = random_batch(cpu->config(), k * kShard, 41);
  std::map<std::string, std::vector<float>> expected;
  for (const auto& [name, p] : params.dense) expected[name].assign(p.value.size(), 0.0f);
  for (int r = 0; r < k; ++r) {
    if (r == empty) continue;
    const model::Inputs shard{kShard, batch.x.data() + static_cast<std::size_t>(r) * kShard * config.input_dim,
                              config.input_dim, nullptr, 0, batch.labels.data() + static_cast<std::size_t>(r) * kShard};
    model::Grads g;
    cpu->train_step(params, shard, &g, nullptr);
    for (auto& [name, p] : g.dense)
      for (std::size_t i = 0; i < p.value.size(); ++i) expected[name][i] += p.value[i];
  }
  for (auto& [name, e] : expected)
    for (float& v : e) v /= static_cast<float>(k);

  run_replicas(*group, [&](int r) {
    gpu::GpuMlp mlp(group->device(r), shape_of(*cpu), group->stream(r));
    allocated(*group, r);
    upload_params(mlp, params);
    const int size = r == empty ? 0 : kShard;
    const gpu::MlpStepResult res =
        mlp.train_step(size == 0 ? nullptr : batch.x.data() + static_cast<std::size_t>(r) * kShard * config.input_dim,
                       size == 0 ? nullptr : batch.labels.data() + static_cast<std::size_t>(r) * kShard, size);
    if (size == 0) {
      EXPECT_EQ(res.loss, 0.0);
      EXPECT_EQ(res.correct, 0);
    }
    group->all_reduce(r, mlp.grads(), mlp.num_parameters(), ReduceOp::kMean);
    for (const gpu::MlpVariable& v : mlp.variables()) {
      std::vector<float> g(v.size);
      mlp.download_grad(v.name, g.data(), g.size());
      EXPECT_TRUE(GradientsClose("replica " + std::to_string(r) + " " + v.name, g, expected.at(v.name)));
    }
  });
}

#else  // !STRATA_HAVE_NCCL

// This build has no NCCL replica group: the GPU tests are not compiled, and this one says so.
TEST(NcclReplicaGroup, NotBuilt) { STRATA_REQUIRE_GPU(); }

#endif

// ---- GPU replicas through ParameterServerStrategy -----------------------------------------------
//
// One PS and one worker, i.e. two MPI processes. CTest runs this binary without a launcher, so each
// of these tests re-runs itself, alone, as a 2-rank job: mpiexec (STRATA_MPIEXEC, else mpiexec or
// mpirun on PATH; Open MPI's flags) -n 2 <this binary> --gtest_filter=<the test>, with
// STRATA_GPU_TEST_JOB=1 in the ranks' environment (-x), bounded by `timeout`. The test passes when that job exits 0; inside it rank
// 0 serves the variables and rank 1 trains, and a failure there fails the job. Compiled in every
// configuration (GpuMlpReplica and the strategy's GPU path need no #if).

constexpr char kJobMarker[] = "STRATA_GPU_TEST_JOB";

bool inside_mpi_job() {
  const char* v = std::getenv(kJobMarker);
  return v != nullptr && std::string(v) == "1";
}

std::string find_mpiexec() {
  if (const char* v = std::getenv("STRATA_MPIEXEC"); v != nullptr && *v != '\0') return v;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    for (const char* name : {"mpiexec", "mpirun"})
      if (!dir.empty() && access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
  return "";
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs the current test as a 2-rank MPI job: a failure of the job fails the test (with its log);
// when no launcher is found, *skip says so and nothing runs.
void run_as_mpi_job(std::string* skip) {
  const std::string mpiexec = find_mpiexec();
  if (mpiexec.empty()) {
    *skip = "no mpiexec/mpirun on PATH (or STRATA_MPIEXEC) to start the PS and the worker";
    return;
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(len, 0) << "readlink(/proc/self/exe)";
  self[len] = '\0';
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string(info->test_suite_name()) + "." + info->name();
  char log_path[] = "/tmp/strata_gpu_test_job.XXXXXX";
  const int fd = mkstemp(log_path);
  ASSERT_GE(fd, 0) << "mkstemp";
  close(fd);
  std::string command = "timeout -s KILL 240 " + quoted(mpiexec);
  if (geteuid() == 0) command += " --allow-run-as-root";
  command += " --oversubscribe --bind-to none -x " + std::string(kJobMarker) + "=1 -n 2 " + quoted(self) +
             " --gtest_filter=" + quoted(filter) + " >" + quoted(log_path) + " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log_path);
  std::stringstream log;
  log << in.rdbuf();
  std::remove(log_path);
  const int rc = status == -1 ? -1 : (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  EXPECT_EQ(rc, 0) << "the 2-rank job failed (" << command << "):\n" << log.str();
}

struct Blobs {
  std::vector<float> x;
  std::vector<std::int32_t> labels;
};

// A learnable task: `classes` Gaussian blobs in `dim` dimensions (class means fixed by the seed 99,
// the draws by `seed`), so the loss of a small MLP must fall within a few dozen SGD steps.
Blobs blobs(int n, int dim, int classes, std::uint32_t seed) {
  std::mt19937 means_rng(99);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> means(static_cast<std::size_t>(classes) * static_cast<std::size_t>(dim));
  for (float& m : means) m = 1.5f * unit(means_rng);
  std::mt19937 rng(seed);
  Blobs b;
  b.x.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(dim));
  b.labels.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int c = static_cast<int>(rng() % static_cast<std::uint32_t>(classes));
    b.labels[static_cast<std::size_t>(i)] = c;
    for (int j = 0; j < dim; ++j)
      b.x[static_cast<std::size_t>(i) * dim + j] = means[static_cast<std::size_t>(c) * dim + j] + 0.8f * unit(rng);
  }
  return b;
}

// Inside the job. Rank 0 serves; rank 1 trains a small mlp with `devices` replicas through the
// strategy, the way strata train does (read_all -> step on the replica's slice ->
// apply_gradients_flat -> increment_global_step), and checks:
//   1. one step on a fixed batch with SGD (lr kLr, sync: the push returns once applied): the
//      update the PS applied, (w0 - w1) / lr, equals the mean over replicas of the CPU model's
//      gradients on each replica's slice at w0, within 1e-4 of the largest gradient plus the float
//      rounding of w (the GPU replicas' cuBLAS/NCCL path against src/model's Eigen path), and the
//      replicas' mean loss equals the CPU loss;
//   2. 40 more steps on fresh batches: the mean loss of the last 5 is below half the first 5's and
//      below a quarter of the first step's; the global step counts worker steps.
void train_through_strategy(DevicePolicy devices) {
  constexpr float kLr = 0.5f;
  MpiSession mpi(nullptr, nullptr);
  BootstrapOptions boot;
  boot.resolve.resolver = cluster::ResolverKind::kMpi;
  boot.resolve.num_ps = 1;
  boot.timeout_s = 60;
  auto rt = Runtime::bootstrap(MPI_COMM_WORLD, Env(), boot);
  ASSERT_EQ(rt->size(), 2) << "the job must have exactly 2 ranks";
  StrategyOptions options;
  options.ps.optimizer = ps::OptimizerConfig::parse("sgd:lr=" + std::to_string(kLr));
  options.ps.consistency = ps::ConsistencyConfig::parse("sync");
  options.ps.timeout_s = 60;
  options.cpu_replicas = 2;
  // The device exchange runs in both variants; for kAuto without a GPU it must choose CPU replicas.
  const std::vector<int> chosen = choose_replica_gpus(*rt, Env::from_process(), devices, 60);
  if (devices == DevicePolicy::kGpu) {
    options.gpus = chosen;
  } else if (rt->role() != Role::kPs && visible_gpu_count() == 0) {
    EXPECT_TRUE(chosen.empty()) << "--devices auto chose GPUs on a worker that sees none";
  }
  ParameterServerStrategy strategy(*rt, options);
  model::ModelConfig config;
  config.input_dim = 24;
  config.hidden = {32, 16};
  config.num_classes = 4;
  config.seed = 5;
  auto net = make_cpu_model(config);
  std::vector<Variable> vars;
  strategy.scope([&] {
    if (!strategy.is_ps())
      for (const auto& spec : net->variables()) vars.push_back(strategy.create_variable(spec));
  });
  if (strategy.is_ps()) {
    strategy.serve();
    return;
  }
  const int k = strategy.num_replicas_in_sync();
  if (devices == DevicePolicy::kGpu) {
    EXPECT_TRUE(strategy.uses_gpus());
    EXPECT_EQ(k, visible_gpu_count()) << "one replica per visible GPU";
  } else {
    EXPECT_EQ(strategy.devices(), "cpu:2");
  }
  std::size_t n = 0;
  for (const auto& v : vars) n += static_cast<std::size_t>(v.num_elements());
  PerReplica<std::unique_ptr<GpuMlpReplica>> gpu;
  if (strategy.uses_gpus())
    for (int r = 0; r < k; ++r)
      gpu.push_back(std::make_unique<GpuMlpReplica>(
          strategy.device_group(), r, GpuMlpReplica::Shape{config.input_dim, config.hidden, config.num_classes}));
  PerReplica<std::vector<float>> host_grads(static_cast<std::size_t>(k));
  constexpr int kSlice = 16;

  // One worker step on `batch` (k slices of kSlice rows); returns the mean loss over the batch.
  auto step = [&](const Blobs& batch) {
    PerReplica<double> losses(static_cast<std::size_t>(k));
    strategy.run([&](ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      const float* x = batch.x.data() + static_cast<std::size_t>(r) * kSlice * config.input_dim;
      const std::int32_t* y = batch.labels.data() + static_cast<std::size_t>(r) * kSlice;
      const float* w = ctx.read_all(vars);
      if (!gpu.empty()) {
        EXPECT_EQ(ctx.device(), strategy.gpus()[static_cast<std::size_t>(r)]);
        gpu[r]->upload_params(w, n);
        losses[r] = gpu[r]->train_step(x, y, kSlice).loss;
        ctx.apply_gradients_flat(vars, gpu[r]->grads(), n);
      } else {
        model::Params params;
        std::size_t offset = 0;
        for (const auto& v : vars) {
          const std::size_t size = static_cast<std::size_t>(v.num_elements());
          params.dense[v.name()] = model::DenseParam{std::vector<float>(w + offset, w + offset + size), v.shape()};
          offset += size;
        }
        model::Grads grads;
        losses[r] = net->train_step(params, model::Inputs{kSlice, x, config.input_dim, nullptr, 0, y}, &grads, nullptr);
        auto& flat = host_grads[static_cast<std::size_t>(r)];
        flat.clear();
        for (const auto& v : vars) {
          const auto& g = grads.dense.at(v.name()).value;
          flat.insert(flat.end(), g.begin(), g.end());
        }
        ctx.apply_gradients_flat(vars, flat.data(), n);
      }
      ctx.increment_global_step();
    });
    double mean = 0.0;
    for (double l : losses) mean += l / k;
    return mean;
  };
  auto read_all_host = [&] {
    std::vector<float> all;
    for (const auto& v : vars) {
      std::vector<float> value;
      strategy.read(v, value);
      all.insert(all.end(), value.begin(), value.end());
    }
    return all;
  };

  // 1. The applied update against the CPU reference on a fixed batch.
  const Blobs fixed = blobs(k * kSlice, config.input_dim, config.num_classes, 7);
  const std::vector<float> w0 = read_all_host();
  const double loss = step(fixed);
  std::int64_t steps = 1;
  strategy.end_step({0, 0, steps});
  const std::vector<float> w1 = read_all_host();
  model::Params params;
  {
    std::size_t offset = 0;
    for (const auto& v : vars) {
      const std::size_t size = static_cast<std::size_t>(v.num_elements());
      params.dense[v.name()] = model::DenseParam{std::vector<float>(w0.begin() + offset, w0.begin() + offset + size), v.shape()};
      offset += size;
    }
  }
  std::vector<float> expected(n, 0.0f);
  double expected_loss = 0.0;
  for (int r = 0; r < k; ++r) {
    model::Grads g;
    const model::Inputs slice{kSlice, fixed.x.data() + static_cast<std::size_t>(r) * kSlice * config.input_dim,
                              config.input_dim, nullptr, 0, fixed.labels.data() + static_cast<std::size_t>(r) * kSlice};
    expected_loss += net->train_step(params, slice, &g, nullptr) / k;
    std::size_t offset = 0;
    for (const auto& v : vars) {
      for (float x : g.dense.at(v.name()).value) expected[offset++] += x / static_cast<float>(k);
    }
  }
  EXPECT_NEAR(loss, expected_loss, 1e-5 * std::max(1.0, std::fabs(expected_loss)));
  float scale = 0.0f;
  for (float g : expected) scale = std::max(scale, std::fabs(g));
  std::size_t bad = 0, worst = 0;
  float worst_diff = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float applied = (w0[i] - w1[i]) / kLr;
    // Reading the gradient back from two weights loses up to an ulp of w (twice, / lr).
    const float rounding = 4.0f * std::ldexp(1.0f, std::ilogb(std::max(std::fabs(w0[i]), 1e-30f)) - 23);
    const float diff = std::fabs(applied - expected[i]);
    if (diff > 1e-4f * scale + rounding + 1e-7f) ++bad;
    if (diff > worst_diff) {
      worst_diff = diff;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << n << " gradient values differ from the CPU reference; worst at " << worst
                     << ": applied " << (w0[worst] - w1[worst]) / kLr << " vs cpu " << expected[worst]
                     << " (largest gradient " << scale << ")";

  // 2. The loss falls.
  std::vector<double> history;
  for (int s = 0; s < 40; ++s) {
    history.push_back(step(blobs(k * kSlice, config.input_dim, config.num_classes, 1000 + static_cast<std::uint32_t>(s))));
    strategy.end_step({0, 0, ++steps});
  }
  double first = 0.0, last = 0.0;
  for (int i = 0; i < 5; ++i) {
    first += history[static_cast<std::size_t>(i)] / 5;
    last += history[history.size() - 1 - static_cast<std::size_t>(i)] / 5;
  }
  EXPECT_LT(last, 0.5 * first) << "loss " << first << " over the first 5 steps, " << last << " over the last 5";
  EXPECT_LT(last, 0.25 * loss) << "loss " << loss << " at the start, " << last << " over the last 5 steps";
  EXPECT_EQ(strategy.global_step(), steps) << "one global step per worker step, not per replica";
  ::testing::Test::RecordProperty("first_loss", std::to_string(first));
  ::testing::Test::RecordProperty("last_loss", std::to_string(last));
  std::printf("replicas %s: one-step loss %.6f (cpu %.6f), mean loss first 5 steps %.4f, last 5 %.4f\n",
              strategy.devices().c_str(), loss, expected_loss, first, last);
  strategy.finish();
}

// Inside the job a failure must end both ranks: the PS would otherwise wait in serve().
void run_job_body(DevicePolicy devices) {
  try {
    train_through_strategy(devices);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank threw: " << e.what();
    std::fflush(stdout);
    abort_job(1);
  }
  if (::testing::Test::HasFailure()) {
    std::fflush(stdout);
    abort_job(1);
  }
}

TEST(GpuStrategy, GpuReplicasMatchTheCpuGradientsAndLearn) {
  STRATA_REQUIRE_GPU();
  if (inside_mpi_job()) return run_job_body(DevicePolicy::kGpu);
  std::string skip;
  run_as_mpi_job(&skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
}

// The same harness on CPU replicas (2 threads, host all-reduce): runs everywhere, so the test's
// oracle, the relaunch and the strategy's flat-buffer path (read_all, apply_gradients_flat on host
// memory) and the device exchange of choose_replica_gpus are checked even where no GPU is.
TEST(GpuStrategy, CpuReplicasThroughTheSameHarness) {
  if (inside_mpi_job()) return run_job_body(DevicePolicy::kAuto);
  std::string skip;
  run_as_mpi_job(&skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
}

}  // namespace
}  // namespace strata::replica
