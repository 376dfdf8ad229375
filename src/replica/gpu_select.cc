// select_devices and select_worker_devices (strata/replica/gpu.h): which visible GPUs a worker
// uses. Pure, built in every configuration so that the policy is the same (and unit-testable)
// with or without CUDA.
#include <algorithm>
#include <string>

#include "strata/common/error.h"
#include "strata/replica/gpu.h"

namespace strata::replica {

std::vector<int> select_devices(int local_rank, int local_size, int gpus) {
  if (local_size < 1)
    throw ConfigError("select_devices: the node-local worker count must be >= 1, got " + std::to_string(local_size));
  if (local_rank < 0 || local_rank >= local_size)
    throw ConfigError("select_devices: node-local rank " + std::to_string(local_rank) + " is outside [0, " +
                      std::to_string(local_size) + ")");
  std::vector<int> devices;
  if (gpus <= 0) return devices;
  if (gpus < local_size) {
    // More workers than GPUs: one device each, shared round-robin.
    devices.push_back(local_rank % gpus);
    return devices;
  }
  // Contiguous blocks; the first `extra` ranks take one device more, so all `gpus` are used.
  const int base = gpus / local_size;
  const int extra = gpus % local_size;
  const int first = local_rank * base + std::min(local_rank, extra);
  const int count = base + (local_rank < extra ? 1 : 0);
  for (int d = first; d < first + count; ++d) devices.push_back(d);
  return devices;
}

std::vector<int> select_worker_devices(const std::vector<std::optional<std::string>>& node_workers, int local_rank,
                                       int gpus) {
  const int local_size = static_cast<int>(node_workers.size());
  if (local_rank < 0 || local_rank >= local_size)
    throw ConfigError("select_worker_devices: node-local worker " + std::to_string(local_rank) + " is outside [0, " +
                      std::to_string(local_size) + ")");
  const bool shared = std::all_of(node_workers.begin(), node_workers.end(),
                                  [&](const std::optional<std::string>& v) { return v == node_workers.front(); });
  return shared ? select_devices(local_rank, local_size, gpus) : select_devices(0, 1, gpus);
}

}  // namespace strata::replica
