// BatchIterator: a producer thread assembles batches into a bounded queue; split_batch.
//
// Protocol (all under State::mu):
//  1. The producer waits for room (ready.size() < prefetch) or stop, takes a spare buffer if there
//     is one, and fills it outside the lock.
//  2. It appends the batch to `ready` and wakes the consumer. At the end, or on an exception, it
//     sets `done` (and `error`) and wakes the consumer for good.
//  3. next() waits for a ready batch or `done`; it swaps the batch out and hands the consumer's
//     previous buffers back as a spare, so steady state allocates nothing.
//  4. The destructor sets `stop` and wakes the producer, which leaves at its next wait; a batch
//     being filled is finished first (a source call is not interruptible).
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "strata/common/error.h"
#include "strata/data/dataset.h"

namespace strata::data {

struct BatchIterator::State {
  Source source;
  std::size_t prefetch = 2;
  std::mutex mu;
  std::condition_variable ready_cv;  // consumer: a batch, the end or an error
  std::condition_variable space_cv;  // producer: room in the queue, or stop
  std::deque<Batch> ready;
  std::vector<Batch> spare;
  bool done = false;
  bool stop = false;
  std::exception_ptr error;
  std::thread thread;

  void produce() {
    try {
      for (;;) {
        Batch batch;
        {
          std::unique_lock<std::mutex> lock(mu);
          space_cv.wait(lock, [&] { return stop || ready.size() < prefetch; });
          if (stop) break;
          if (!spare.empty()) {
            batch = std::move(spare.back());
            spare.pop_back();
          }
        }
        if (!source(batch)) break;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (stop) break;
          ready.push_back(std::move(batch));
        }
        ready_cv.notify_one();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    ready_cv.notify_all();
  }
};

namespace {

void check_prefetch(int prefetch) {
  if (prefetch < 1)
    throw ConfigError("batch iterator: prefetch depth is " + std::to_string(prefetch) + ", expected >= 1");
}

// Copies example rows `indices[first, first + count)` of `d` into `out`, reusing its capacity.
void gather(const Dataset& d, const std::vector<std::int64_t>& indices, std::size_t first, int count, Batch& out) {
  const auto dense = static_cast<std::size_t>(d.dense_dim);
  const auto fields = static_cast<std::size_t>(d.num_fields);
  out.size = count;
  out.dense_dim = d.dense_dim;
  out.num_fields = d.num_fields;
  out.features.resize(static_cast<std::size_t>(count) * dense);
  out.sparse_ids.resize(static_cast<std::size_t>(count) * fields);
  out.labels.resize(d.labels.empty() ? 0 : static_cast<std::size_t>(count));
  out.targets.resize(d.targets.empty() ? 0 : static_cast<std::size_t>(count));
  for (std::size_t r = 0; r < static_cast<std::size_t>(count); ++r) {
    const auto i = static_cast<std::size_t>(indices[first + r]);
    std::copy_n(d.features.begin() + static_cast<std::ptrdiff_t>(i * dense), dense,
                out.features.begin() + static_cast<std::ptrdiff_t>(r * dense));
    std::copy_n(d.sparse_ids.begin() + static_cast<std::ptrdiff_t>(i * fields), fields,
                out.sparse_ids.begin() + static_cast<std::ptrdiff_t>(r * fields));
    if (!d.labels.empty()) out.labels[r] = d.labels[i];
    if (!d.targets.empty()) out.targets[r] = d.targets[i];
  }
}

}  // namespace

BatchIterator::BatchIterator(const Dataset& dataset, std::vector<std::int64_t> indices, int batch_size,
                             bool drop_remainder, int prefetch) {
  check_prefetch(prefetch);
  if (batch_size < 1)
    throw ConfigError("batch iterator: batch size is " + std::to_string(batch_size) + ", expected >= 1");
  validate(dataset);
  // Checked here, on the caller's thread, so a bad index is reported where it was made.
  for (std::int64_t i : indices)
    STRATA_CHECK(i >= 0 && i < dataset.size, "example index ", i, " is outside the dataset of ", dataset.size);
  const std::int64_t batches = num_batches(static_cast<std::int64_t>(indices.size()), batch_size, drop_remainder);
  std::size_t next = 0;
  std::int64_t produced = 0;
  Source source = [&dataset, indices = std::move(indices), batch_size, batches, next,
                   produced](Batch& out) mutable {
    if (produced == batches) return false;
    const int count = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(batch_size), indices.size() - next));
    gather(dataset, indices, next, count, out);
    next += static_cast<std::size_t>(count);
    ++produced;
    return true;
  };
  state_ = std::make_unique<State>();
  state_->source = std::move(source);
  state_->prefetch = static_cast<std::size_t>(prefetch);
  state_->thread = std::thread([s = state_.get()] { s->produce(); });
}

BatchIterator::BatchIterator(Source source, int prefetch) {
  check_prefetch(prefetch);
  STRATA_CHECK(static_cast<bool>(source), "batch iterator: empty source function");
  state_ = std::make_unique<State>();
  state_->source = std::move(source);
  state_->prefetch = static_cast<std::size_t>(prefetch);
  state_->thread = std::thread([s = state_.get()] { s->produce(); });
}

BatchIterator::~BatchIterator() {
  if (!state_) return;  // moved from
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->space_cv.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

BatchIterator::BatchIterator(BatchIterator&&) noexcept = default;

BatchIterator& BatchIterator::operator=(BatchIterator&& other) noexcept {
  if (this != &other) {
    BatchIterator old(std::move(*this));  // stops and joins our producer on scope exit
    state_ = std::move(other.state_);
  }
  return *this;
}

bool BatchIterator::next(Batch& out) {
  STRATA_CHECK(state_ != nullptr, "next() on a moved-from BatchIterator");
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.ready_cv.wait(lock, [&] { return !s.ready.empty() || s.done; });
  if (s.ready.empty()) {
    if (s.error) std::rethrow_exception(s.error);
    return false;
  }
  Batch previous = std::move(out);
  out = std::move(s.ready.front());
  s.ready.pop_front();
  // Keep the consumer's old buffers for the producer; the cap bounds memory if the consumer
  // passes a fresh Batch every time.
  if (s.spare.size() <= s.prefetch) s.spare.push_back(std::move(previous));
  lock.unlock();
  s.space_cv.notify_one();
  return true;
}

std::int64_t BatchIterator::num_batches(std::int64_t num_examples, int batch_size, bool drop_remainder) {
  if (batch_size < 1 || num_examples <= 0) return 0;
  return drop_remainder ? num_examples / batch_size : (num_examples + batch_size - 1) / batch_size;
}

std::vector<Batch> split_batch(const Batch& batch, int k) {
  if (k < 1) throw ConfigError("split_batch: the number of replicas is " + std::to_string(k) + ", expected >= 1");
  const auto n = static_cast<std::size_t>(batch.size);
  STRATA_CHECK(batch.size >= 0 && batch.features.size() == n * static_cast<std::size_t>(batch.dense_dim) &&
                   batch.sparse_ids.size() == n * static_cast<std::size_t>(batch.num_fields) &&
                   (batch.labels.size() == n || batch.labels.empty()) &&
                   (batch.targets.size() == n || batch.targets.empty()),
               "split_batch: the batch's vectors do not match its size ", batch.size);
  std::vector<Batch> parts(static_cast<std::size_t>(k));
  const int base = batch.size / k, extra = batch.size % k;
  const auto dense = static_cast<std::size_t>(batch.dense_dim);
  const auto fields = static_cast<std::size_t>(batch.num_fields);
  std::size_t first = 0;
  for (int r = 0; r < k; ++r) {
    Batch& part = parts[static_cast<std::size_t>(r)];
    part.size = base + (r < extra ? 1 : 0);
    part.dense_dim = batch.dense_dim;
    part.num_fields = batch.num_fields;
    const std::size_t rows = static_cast<std::size_t>(part.size);
    part.features.assign(batch.features.begin() + static_cast<std::ptrdiff_t>(first * dense),
                         batch.features.begin() + static_cast<std::ptrdiff_t>((first + rows) * dense));
    part.sparse_ids.assign(batch.sparse_ids.begin() + static_cast<std::ptrdiff_t>(first * fields),
                           batch.sparse_ids.begin() + static_cast<std::ptrdiff_t>((first + rows) * fields));
    if (!batch.labels.empty())
      part.labels.assign(batch.labels.begin() + static_cast<std::ptrdiff_t>(first),
                         batch.labels.begin() + static_cast<std::ptrdiff_t>(first + rows));
    if (!batch.targets.empty())
      part.targets.assign(batch.targets.begin() + static_cast<std::ptrdiff_t>(first),
                          batch.targets.begin() + static_cast<std::ptrdiff_t>(first + rows));
    first += rows;
  }
  return parts;
}

}  // namespace strata::data
