#include "strata/common/watchdog.h"

#include "strata/common/parse.h"

namespace strata {

Watchdog::Watchdog(std::chrono::duration<double> timeout, std::function<void()> on_expire) {
  // Clamped (common/parse.h): a timeout past steady_clock's range would wrap into the past and
  // fire at once.
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(clamp_seconds(timeout.count())));
  thread_ = std::thread([this, deadline, on_expire = std::move(on_expire)] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_until(lock, deadline, [this] { return disarmed_; })) return;
    lock.unlock();
    on_expire();
  });
}

void Watchdog::disarm() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    disarmed_ = true;
  }
  cv_.notify_all();
}

Watchdog::~Watchdog() {
  disarm();
  if (thread_.joinable()) thread_.join();
}

}  // namespace strata
