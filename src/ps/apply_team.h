// A PS rank's optimizer threads: one element-wise update split over a fixed team.
//
// Why: docs/SCALING.md section 4. A PS rank applies stateful optimizers (Adam: 28 bytes of
// state read and written per element) on its service-loop thread, about 310 M elements/s on
// one core here; at scale that single core, not the link, sets how many PS ranks a job needs.
// The updates are element-wise with one step count per application, so any split of a shard into
// contiguous parts gives the same bits as one pass (the chunked loop already relies on that).
//
// Thread-safety: one caller (the PS service loop) uses a team; run() is not reentrant and must
// not be called from two threads. The helpers only run the function they are handed; they make
// no MPI/transport call (the caller's part may, between its chunks: Transport::progress's
// thread contract is kept because only the caller's thread calls it).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "strata/ps/optimizer.h"

namespace strata::ps {

class ApplyTeam {
 public:
  // threads >= 1 (the caller counts as one); threads - 1 helpers start now and wait.
  explicit ApplyTeam(int threads);
  ~ApplyTeam();
  ApplyTeam(const ApplyTeam&) = delete;
  ApplyTeam& operator=(const ApplyTeam&) = delete;

  int size() const { return static_cast<int>(helpers_.size()) + 1; }

  // Runs fn(p) for every p in [0, parts): part 0 on the calling thread, the others on helpers.
  // parts is clamped to [1, size()]. Returns when every part has returned; an exception thrown by
  // any part is rethrown here (the caller's own first, else a helper's), after all parts finished.
  // While the caller waits for the helpers it calls idle() (if set) about every 50 us, on its
  // own thread: the PS loop keeps calling Transport::progress when a helper lags.
  void run(int parts, const std::function<void(int)>& fn, const std::function<void()>& idle = {});

 private:
  void helper_main(int id);

  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int parts_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// Elements below which a split is not worth the helpers' wake-up, which costs about as much as
// the optimizer's work on a part this size (docs/PERFORMANCE.md, "The PS optimizer rate").
inline constexpr std::size_t kMinElementsPerPart = std::size_t{1} << 17;
// The same for a sync round's update (apply_mean_team): the workers wait for it with nothing to
// do, so their cores are idle and a smaller part still pays for its wake-up.
inline constexpr std::size_t kMinElementsPerPartSync = std::size_t{1} << 15;

// [begin, end) of part p of n elements split in `parts`, boundaries on multiples of 16 elements
// (one 64-byte line of floats) so two threads never write one cache line.
void split_range(std::size_t n, int parts, int p, std::size_t* begin, std::size_t* end);

// apply_dense over n elements, split over `team` (null: one thread) when n is large enough.
// between_chunks, if set, is called on the caller's thread between its chunks of 256 K elements
// and while it waits for the helpers (the PS loop passes Transport::progress). Bit-identical to
// one apply_dense call on all n.
// Returns the number of threads that took part (1: not split).
template <typename T>
int apply_dense_team(ApplyTeam* team, const OptimizerConfig& config, std::int64_t step, T* var,
                      T* const* slots, int num_slots, const T* grad, std::size_t n,
                      const std::function<void()>& between_chunks);

// A sync round's update: the mean of the workers' gradients, (((0 + grads[0][i]) + grads[1][i]) +
// ...) / num_grads (worker order, from +0), then the optimizer step on it, fused: each run of
// 1,024 elements is averaged into `scratch` (n elements, the caller's) and applied while it is in
// L1, and the range is split over `team` (parts of at least kMinElementsPerPartSync). Every element
// gets exactly the arithmetic of mean-then-apply_dense, so the bits do not depend on the team's
// size or the split. between_chunks as in apply_dense_team. Returns the threads that took part.
template <typename T>
int apply_mean_team(ApplyTeam* team, const OptimizerConfig& config, std::int64_t step, T* var, T* const* slots,
                    int num_slots, const T* const* grads, int num_grads, T* scratch, std::size_t n,
                    const std::function<void()>& between_chunks);

}  // namespace strata::ps
