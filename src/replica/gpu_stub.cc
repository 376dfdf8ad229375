// strata/replica/gpu.h in builds without the NCCL replica target (no CUDA toolkit, or
// STRATA_WITH_CUDA / STRATA_WITH_NCCL off): no GPU is ever visible and the NCCL group cannot be
// made, nor a GpuMlpReplica, so callers fall back to CPU replicas without any #if of their own.
// Compiled instead of src/replica/nccl/gpu_devices.cc, never together with it.
#include "strata/common/error.h"
#include "strata/config.h"
#include "strata/replica/gpu.h"

namespace strata::replica {
namespace {

const char* why() {
#if STRATA_HAVE_CUDA
  return "built without NCCL (STRATA_WITH_NCCL=OFF or nccl.h/libnccl not found); GPU replicas need it";
#else
  return "built without CUDA/NCCL";
#endif
}

}  // namespace

int visible_gpu_count() { return 0; }

std::string gpu_unavailable_reason() { return why(); }

std::unique_ptr<ReplicaGroup> make_nccl_replica_group(const std::vector<int>&, double) {
  throw ConfigError(std::string("cannot create an NCCL replica group: ") + why());
}

// GpuMlpReplica cannot be constructed in this build, so no other member is ever reached.
struct GpuMlpReplica::Impl {};

namespace {
[[noreturn]] void unreachable() { throw Error("GpuMlpReplica: built without CUDA/NCCL"); }
}  // namespace

GpuMlpReplica::GpuMlpReplica(ReplicaGroup&, int, const Shape&) {
  throw ConfigError(std::string("cannot create a GPU mlp replica: ") + why());
}
GpuMlpReplica::~GpuMlpReplica() = default;
int GpuMlpReplica::device() const { unreachable(); }
const std::vector<GpuMlpReplica::Variable>& GpuMlpReplica::variables() const { unreachable(); }
std::size_t GpuMlpReplica::num_parameters() const { unreachable(); }
void GpuMlpReplica::upload_params(const float*, std::size_t) { unreachable(); }
GpuMlpReplica::StepResult GpuMlpReplica::train_step(const float*, const std::int32_t*, int, bool) { unreachable(); }
float* GpuMlpReplica::grads() { unreachable(); }
void GpuMlpReplica::download_grads(float*, std::size_t) { unreachable(); }

}  // namespace strata::replica
