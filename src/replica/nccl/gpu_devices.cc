// strata/replica/gpu.h with CUDA and NCCL built in: the device probe, the NCCL group factory and
// GpuMlpReplica (a handle to gpu::GpuMlp). (select_devices is pure and lives in
// src/replica/gpu_select.cc; builds without NCCL compile src/replica/gpu_stub.cc instead of this
// file.)
#include <mutex>

#include "cuda_check.h"
#include "gpu_mlp.h"
#include "nccl_replica_group.h"
#include "strata/replica/gpu.h"

namespace strata::replica {
namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

// cudaGetDeviceCount is the first CUDA runtime call of a process and the one that reports a
// missing or too old driver (cudaErrorInsufficientDriver on this project's GPU-less CI machines,
// cudaErrorNoDevice where the driver runs but no device is visible). It fails softly: nothing is
// thrown, the reason is kept for skip messages and logs.
const Probe& probe() {
  static const Probe result = [] {
    Probe p;
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();  // clear the thread's last-error slot so no later check sees it
      p.reason = "cudaGetDeviceCount: " + detail::cuda_error_text(rc);
      return p;
    }
    p.count = count;
    if (count == 0) p.reason = "cudaGetDeviceCount: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)";
    return p;
  }();
  return result;
}

}  // namespace

int visible_gpu_count() { return probe().count; }

std::string gpu_unavailable_reason() { return probe().reason; }

std::unique_ptr<ReplicaGroup> make_nccl_replica_group(const std::vector<int>& devices, double timeout_s) {
  NcclReplicaGroup::Options options;
  options.timeout_s = timeout_s;
  return std::make_unique<NcclReplicaGroup>(devices, options);
}

// ---- GpuMlpReplica ------------------------------------------------------------------------------

struct GpuMlpReplica::Impl {
  Impl(int device, gpu::MlpShape shape, cudaStream_t stream) : mlp(device, std::move(shape), stream) {
    for (const gpu::MlpVariable& v : mlp.variables()) variables.push_back(Variable{v.name, v.shape, v.offset, v.size});
  }
  gpu::GpuMlp mlp;
  std::vector<Variable> variables;
};

GpuMlpReplica::GpuMlpReplica(ReplicaGroup& group, int replica, const Shape& shape) {
  auto* nccl = dynamic_cast<NcclReplicaGroup*>(&group);
  if (nccl == nullptr)
    throw ConfigError(std::string("a GPU mlp replica needs an NCCL replica group, got a '") + group.name() + "' group");
  if (replica < 0 || replica >= nccl->size())
    throw ConfigError("GPU mlp replica " + std::to_string(replica) + " is outside the group of " +
                      std::to_string(nccl->size()));
  impl_ = std::make_unique<Impl>(nccl->device(replica), gpu::MlpShape{shape.input_dim, shape.hidden, shape.num_classes},
                                 nccl->stream(replica));
}

GpuMlpReplica::~GpuMlpReplica() = default;

int GpuMlpReplica::device() const { return impl_->mlp.device(); }
const std::vector<GpuMlpReplica::Variable>& GpuMlpReplica::variables() const { return impl_->variables; }
std::size_t GpuMlpReplica::num_parameters() const { return impl_->mlp.num_parameters(); }
void GpuMlpReplica::upload_params(const float* host, std::size_t n) { impl_->mlp.upload_params(host, n); }

GpuMlpReplica::StepResult GpuMlpReplica::train_step(const float* x, const std::int32_t* labels, int batch,
                                                    bool backward) {
  const gpu::MlpStepResult r = impl_->mlp.train_step(x, labels, batch, backward);
  return StepResult{r.loss, r.correct};
}

float* GpuMlpReplica::grads() { return impl_->mlp.grads(); }
void GpuMlpReplica::download_grads(float* host, std::size_t n) { impl_->mlp.download_grads(host, n); }

}  // namespace strata::replica
