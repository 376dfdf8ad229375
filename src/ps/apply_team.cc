#include "ps/apply_team.h"

#include <algorithm>
#include <chrono>
#include <string>

// Every strata translation unit that includes Eigen agrees on EIGEN_FAST_MATH (src/model/gemm.cc).
#ifndef EIGEN_FAST_MATH
#define EIGEN_FAST_MATH 0
#endif
#include <Eigen/Core>

#include "strata/common/error.h"

namespace strata::ps {

ApplyTeam::ApplyTeam(int threads) {
  try {
    for (int id = 1; id < std::max(1, threads); ++id) helpers_.emplace_back([this, id] { helper_main(id); });
  } catch (...) {
    // A thread could not start: stop and join the ones that did, then report.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : helpers_) t.join();
    throw;
  }
}

ApplyTeam::~ApplyTeam() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : helpers_) t.join();
}

void ApplyTeam::helper_main(int id) {
  std::uint64_t seen = 0;
  while (true) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= parts_) continue;  // not needed for this job
      job = job_;
    }
    std::exception_ptr error;
    try {
      (*job)(id);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !error_) error_ = error;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ApplyTeam::run(int parts, const std::function<void(int)>& fn, const std::function<void()>& idle) {
  parts = std::clamp(parts, 1, size());
  if (parts == 1) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    parts_ = parts;
    pending_ = parts - 1;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  while (pending_ != 0) {
    if (!idle) {
      done_cv_.wait(lock, [&] { return pending_ == 0; });
      break;
    }
    if (done_cv_.wait_for(lock, std::chrono::microseconds(50), [&] { return pending_ == 0; })) break;
    lock.unlock();
    idle();
    lock.lock();
  }
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void split_range(std::size_t n, int parts, int p, std::size_t* begin, std::size_t* end) {
  auto boundary = [&](int q) -> std::size_t {
    if (q >= parts) return n;
    const std::size_t b = n / static_cast<std::size_t>(parts) * static_cast<std::size_t>(q);
    return std::min(n, b / 16 * 16);
  };
  *begin = boundary(p);
  *end = boundary(p + 1);
}

// Runs range(begin, end, caller) over [0, n): on the calling thread alone, or split into
// min(team size, n / min_per_part) parts (part 0 on the caller); returns the parts used.
template <typename Range>
int run_split(ApplyTeam* team, std::size_t n, std::size_t min_per_part, const Range& range,
              const std::function<void()>& between_chunks) {
  const int parts =
      team ? static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(team->size()), n / min_per_part)) : 1;
  if (parts <= 1) {
    range(0, n, true);
    return 1;
  }
  team->run(
      parts,
      [&](int p) {
        std::size_t begin = 0, end = 0;
        split_range(n, parts, p, &begin, &end);
        range(begin, end, p == 0);
      },
      between_chunks);
  return parts;
}

template <typename T>
int apply_dense_team(ApplyTeam* team, const OptimizerConfig& config, std::int64_t step, T* var,
                      T* const* slots, int num_slots, const T* grad, std::size_t n,
                      const std::function<void()>& between_chunks) {
  constexpr std::size_t kChunk = std::size_t{1} << 18;
  // Called for every push the PS applies, most of them small: no allocation here (optimizers
  // have at most 2 slots; 4 leaves room).
  constexpr int kMaxSlots = 4;
  if (num_slots < 0 || num_slots > kMaxSlots)
    throw Error("apply_dense_team: " + std::to_string(num_slots) + " optimizer slots, at most 4 supported");
  auto range = [&](std::size_t begin, std::size_t end, bool caller) {
    T* chunk_slots[kMaxSlots] = {};
    for (std::size_t b = begin; b < end; b += kChunk) {
      const std::size_t len = std::min(kChunk, end - b);
      for (int k = 0; k < num_slots; ++k) chunk_slots[static_cast<std::size_t>(k)] = slots[k] + b;
      apply_dense(config, step, var + b, chunk_slots, grad + b, len);
      if (caller && between_chunks && b + len < end) between_chunks();
    }
  };
  return run_split(team, n, kMinElementsPerPart, range, between_chunks);
}

template <typename T>
int apply_mean_team(ApplyTeam* team, const OptimizerConfig& config, std::int64_t step, T* var, T* const* slots,
                    int num_slots, const T* const* grads, int num_grads, T* scratch, std::size_t n,
                    const std::function<void()>& between_chunks) {
  constexpr std::size_t kRun = 1024;                      // averaged and applied from L1
  constexpr std::size_t kProgress = std::size_t{1} << 18;  // between_chunks about this often
  constexpr int kMaxSlots = 4;
  if (num_slots < 0 || num_slots > kMaxSlots)
    throw Error("apply_mean_team: " + std::to_string(num_slots) + " optimizer slots, at most 4 supported");
  if (num_grads < 1) throw Error("apply_mean_team: no gradients to average");
  using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
  const T workers = static_cast<T>(num_grads);
  auto range = [&](std::size_t begin, std::size_t end, bool caller) {
    T* run_slots[kMaxSlots] = {};
    std::size_t since_progress = 0;
    for (std::size_t b = begin; b < end; b += kRun) {
      const std::size_t len = std::min(kRun, end - b);
      Eigen::Map<Vec> mean(scratch + b, static_cast<Eigen::Index>(len));
      mean.setZero();
      for (int w = 0; w < num_grads; ++w) mean += Eigen::Map<const Vec>(grads[w] + b, static_cast<Eigen::Index>(len));
      mean /= workers;
      for (int k = 0; k < num_slots; ++k) run_slots[static_cast<std::size_t>(k)] = slots[k] + b;
      apply_dense(config, step, var + b, run_slots, scratch + b, len);
      since_progress += len;
      if (caller && between_chunks && since_progress >= kProgress && b + len < end) {
        between_chunks();
        since_progress = 0;
      }
    }
  };
  return run_split(team, n, kMinElementsPerPartSync, range, between_chunks);
}

template int apply_mean_team<float>(ApplyTeam*, const OptimizerConfig&, std::int64_t, float*, float* const*, int,
                                    const float* const*, int, float*, std::size_t, const std::function<void()>&);
template int apply_mean_team<double>(ApplyTeam*, const OptimizerConfig&, std::int64_t, double*, double* const*, int,
                                     const double* const*, int, double*, std::size_t, const std::function<void()>&);

template int apply_dense_team<float>(ApplyTeam*, const OptimizerConfig&, std::int64_t, float*, float* const*, int,
                                      const float*, std::size_t, const std::function<void()>&);
template int apply_dense_team<double>(ApplyTeam*, const OptimizerConfig&, std::int64_t, double*, double* const*, int,
                                       const double*, std::size_t, const std::function<void()>&);

}  // namespace strata::ps
