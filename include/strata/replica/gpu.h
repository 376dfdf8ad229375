// GPU replicas of a worker (one per GPU it uses; `strata train --devices`): how many GPUs this
// process sees, which of them a worker uses, the NCCL replica group across them and the dense model
// step each replica runs.
//
// No CUDA or NCCL header is included, and every function exists in every build: without CUDA/NCCL
// visible_gpu_count() is 0, gpu_unavailable_reason() says why, and make_nccl_replica_group and
// GpuMlpReplica's constructor throw ConfigError, so callers need no #if (STRATA_HAVE_NCCL in
// strata/config.h says what was built).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/replica/replica_group.h"

namespace strata::replica {

// CUDA devices visible to this process (after CUDA_VISIBLE_DEVICES), numbered 0..n-1. Returns 0
// without throwing when CUDA is not built in, the driver is missing or too old, or no device is
// present. The probe runs once per process (the answer cannot change while it runs).
int visible_gpu_count();

// Why visible_gpu_count() is 0, e.g. "cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver
// version is insufficient for CUDA runtime version" or "built without CUDA/NCCL"; empty when at
// least one GPU is visible.
std::string gpu_unavailable_reason();

// The devices (indices into the visible ones) that the worker with node-local rank `local_rank`
// of `local_size` uses when `gpus` devices are visible. Pure; the policy:
//   - gpus <= 0: none (the worker runs CPU replicas).
//   - local_size == 1: all of them, 0..gpus-1. Also the right call when the launcher already
//     gives every worker its own devices (Slurm --gpus-per-task, or a per-rank
//     CUDA_VISIBLE_DEVICES): each process then sees only its own GPUs, so pass local_size = 1.
//   - gpus >= local_size: an even split into contiguous blocks by local rank; when gpus is not a
//     multiple of local_size the first gpus % local_size ranks get one device more (8 GPUs, 3
//     workers: {0,1,2} {3,4,5} {6,7}), so no device sits idle. Contiguous blocks keep a worker's
//     GPUs on the same NVLink/PCIe switch on usual topologies.
//   - gpus < local_size: more workers than GPUs; each worker gets one device, local_rank % gpus,
//     shared (time-sliced) with the other workers mapped to it.
// local_rank and local_size count the workers on this node that may use GPUs (parameter servers
// excluded). ConfigError when local_size < 1 or local_rank is outside [0, local_size).
std::vector<int> select_devices(int local_rank, int local_size, int gpus);

// The devices of one worker given what the workers on its node see. Pure; `node_workers` holds the
// CUDA_VISIBLE_DEVICES value of every worker on the node (parameter servers excluded) in
// node-local order (nullopt: unset), `local_rank` is this worker's index in it, `gpus` the number
// of GPUs it sees:
//   - every worker sees the same value (or none is set): they share those GPUs and split them with
//     select_devices(local_rank, node_workers.size(), gpus);
//   - the values differ: the launcher gave each worker its own GPUs (srun --gpus-per-task or
//     --gpu-bind, a per-rank CUDA_VISIBLE_DEVICES), so the worker uses all it sees,
//     select_devices(0, 1, gpus).
// ConfigError when local_rank is outside node_workers.
std::vector<int> select_worker_devices(const std::vector<std::optional<std::string>>& node_workers, int local_rank,
                                       int gpus);

// One replica per listed device (distinct, each in [0, visible_gpu_count())), all in this process,
// reduced with NCCL. memory_kind() is kCuda: all_reduce/broadcast take device pointers on the
// replica's own device. Each replica thread calls the collectives for its own replica (the
// ReplicaGroup contract); a collective returns once its result is in the buffer. Every wait is
// bounded by timeout_s: a replica that does not arrive makes the others throw TimeoutError naming
// it, and the group is unusable afterwards. ConfigError for a bad device list and in builds without
// CUDA/NCCL; NcclError / CudaError when NCCL or CUDA fail.
std::unique_ptr<ReplicaGroup> make_nccl_replica_group(const std::vector<int>& devices, double timeout_s);

// One GPU replica of the built-in dense models (mlp; softmax is the stack without hidden layers):
// forward and backward with cuBLAS on the replica's GPU. Same math and variables as the CPU model
// (src/model): "dense_<i>/kernel" [in, out], "dense_<i>/bias" [out], ..., "logits/kernel",
// "logits/bias", created in that order, row-major. All parameters live in one flat device buffer
// and all gradients in another with the same layout (the variables concatenated in order), so a
// step is: upload the pulled weights (one copy), train_step, and one all-reduce of grads() over
// the group (ReplicaContext::apply_gradients_flat). A handle to the private CUDA implementation;
// no CUDA type appears here. One thread at a time per object (the replica's thread).
class GpuMlpReplica {
 public:
  // Layer widths: input_dim -> hidden... -> num_classes.
  struct Shape {
    int input_dim = 0;
    std::vector<int> hidden;
    int num_classes = 0;
  };
  // One variable inside the flat buffers.
  struct Variable {
    std::string name;
    std::vector<std::int64_t> shape;
    std::size_t offset = 0;  // in floats
    std::size_t size = 0;    // elements
  };
  struct StepResult {
    double loss = 0.0;         // mean softmax cross-entropy over the batch (0 for an empty batch)
    std::int64_t correct = 0;  // examples whose first maximal logit is the label
  };

  // The model of replica `replica` of `group`, which must come from make_nccl_replica_group: it
  // lives on that replica's GPU and queues its work on the stream the group's collectives use, so
  // the gradient all-reduce is ordered after the backward pass. ConfigError for another kind of
  // group, a bad shape, and in builds without CUDA/NCCL.
  GpuMlpReplica(ReplicaGroup& group, int replica, const Shape& shape);
  ~GpuMlpReplica();
  GpuMlpReplica(const GpuMlpReplica&) = delete;
  GpuMlpReplica& operator=(const GpuMlpReplica&) = delete;

  int device() const;
  const std::vector<Variable>& variables() const;
  std::size_t num_parameters() const;
  // Host -> device copy of all parameters (n == num_parameters(), flat layout); synchronous.
  void upload_params(const float* host, std::size_t n);
  // One step on a host batch x [batch, input_dim] (row-major), labels in [0, num_classes) (Error
  // naming the first bad one). With `backward`, grads() holds d(mean loss)/d(parameters) on return.
  StepResult train_step(const float* x, const std::int32_t* labels, int batch, bool backward = true);
  // The flat gradient buffer, device memory on device().
  float* grads();
  // Device -> host copy of all gradients (n == num_parameters()); synchronous.
  void download_grads(float* host, std::size_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::replica
