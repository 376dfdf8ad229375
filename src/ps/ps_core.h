// What the server and the client parts of the parameter servers share on one rank: the variable
// list and its placement, the arena layout, the transport and the region, who every rank is, and
// the waits and words both roles use. materialize (parameter_servers.cc) builds one per rank, as a
// ServerCore on PS ranks (server_core.h) or a ClientCore on chief and workers (client_core.h).
// Private to the ps layer.
// Thread-safety: one thread per rank uses it, except where server_core.h says otherwise.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>


#include "ps/arena_checks.h"
#include "ps/arena_layout.h"
#include "ps/wake_word.h"
#include "strata/comm/group.h"
#include "strata/comm/transport.h"
#include "strata/common/error.h"
#include "strata/ps/parameter_servers.h"

namespace strata::ps {

using Clock = std::chrono::steady_clock;

// Largest optimizer or global step a checkpoint may restore.
constexpr std::int64_t kMaxRestoredStep = std::int64_t{1} << 62;

inline std::int64_t load_i64(const void* p) {
  return __atomic_load_n(static_cast<const std::int64_t*>(p), __ATOMIC_ACQUIRE);
}
inline void store_i64(void* p, std::int64_t v) { __atomic_store_n(static_cast<std::int64_t*>(p), v, __ATOMIC_RELEASE); }

// Backoff for polling loops: spin briefly (latency), then sleep in growing steps so an
// oversubscribed node keeps its cores for the ranks doing work.
class Backoff {
 public:
  void reset() { idle_ = 0; }
  // Whether the next pause() sleeps (the spin is over): a loop that can sleep on a wake word
  // instead announces itself before its next check (wake_word.h).
  bool sleeps_next() const { return idle_ + 1 >= 64; }
  // The sleep the next pause() takes (zero while spinning).
  std::chrono::microseconds next_sleep() const {
    const int idle = idle_ + 1;
    if (idle < 64) return std::chrono::microseconds(0);
    return std::chrono::microseconds(std::min<int>(500, 1 << std::min(idle / 64, 9)));
  }
  void pause() {
    const auto us = next_sleep();
    ++idle_;
    if (us.count() > 0) std::this_thread::sleep_for(us);
  }
  // As pause(), sleeping on a wake word announced before the caller's last check. True when the
  // sleep was ended by a ring (or not taken).
  bool pause_on(std::uint32_t* word) {
    const auto us = next_sleep();
    ++idle_;
    if (us.count() > 0) return wake::sleep(word, us);
    wake::withdraw(word);
    return true;
  }

 private:
  int idle_ = 0;
};

// A wake-word sleep's timeout: a fallback for a ring that does not come, not the expected wait.
constexpr std::chrono::microseconds kWakeFallback{2000};

struct PsCore {
  PsOptions options;
  ShardMap map;
  ArenaLayout layout;
  std::vector<int> ps_rank;  // PS index -> transport rank
  // The runtime's ranks as a process group (barriers, agreements): declared before the transport,
  // whose regions' destruction is collective over it (the in-process transport's is).
  std::shared_ptr<comm::Group> group;
  std::unique_ptr<comm::Transport> transport;
  std::unique_ptr<comm::Region> region;
  int num_workers = 0;
  int chief_rank = -1;     // worker 0's transport rank (the chief, which requests every save)
  bool uses_inbox = false;  // pushes go through the PS's inboxes (a stateful optimizer or sync)
  // Who writes each worker's words (per worker index) and how messages name each shard (per shard):
  // what a check of a word read from an arena names when it fails (arena_checks.h).
  std::vector<WordWriter> writers;
  std::vector<ShardName> shard_names;
  // The dynamic variables (the chief's list), in declaration order; layout.dynamic(d, ps) places them.
  std::vector<DynamicVariableSpec> dynamic;
  // Wake words (wake_word.h), mapped after the region exists (map_wake_words); null where the PS's
  // arena is not mapped here (another node, a transport without shared memory), and that side
  // then polls on its timer alone. ps_wake[p]: PS p's own word (its service loop sleeps on it;
  // co-located clients ring it after a doorbell). worker_wake[p]: a client's own word in PS p's
  // arena (it sleeps on it for PS p's acks). On a PS, worker_wake[w] is worker w's word in this
  // PS's own arena, which the PS rings after storing w's acks.
  std::vector<std::uint32_t*> ps_wake;
  std::vector<std::uint32_t*> worker_wake;
  // Sleeps this rank took on a wake word, and those a ring ended before their timeout.
  std::int64_t wake_sleeps = 0;
  std::int64_t wake_rung = 0;
  // Checkpoint outcomes as this rank saw them (checkpoint_protocol.cc).
  std::int64_t saves_failed = 0;  // worker: saves joined that failed; PS: saves that failed here
  bool save_error_stop = false;   // a failed save stopped the job (stop_on_save_error)
  bool preemption_reported = false;

  PsCore() = default;
  virtual ~PsCore() = default;
  PsCore(const PsCore&) = delete;
  PsCore& operator=(const PsCore&) = delete;

  // Collective: frees the region, then the transport, in the same order on every rank. Idempotent.
  // Called before the role's own state is destroyed, so no transport thread still calls into it.
  void release() noexcept;

  int ps0() const { return ps_rank[0]; }
  int num_ps() const { return static_cast<int>(ps_rank.size()); }
  // Index of dynamic variable `name` in `dynamic`; Error naming `op` when there is none.
  std::size_t dynamic_index(std::string_view name, const char* op) const;
  std::int64_t read_ps0(std::uint64_t offset) { return transport->atomic_read(*region, ps0(), offset); }
  char* base() { return static_cast<char*>(region->local_base()); }
  const Shard& shard(std::size_t s) const { return map.shards()[s]; }
  bool trainable_shard(std::size_t s) const { return takes_gradients(map, shard(s)); }
  std::size_t row_bytes(std::size_t s) const {
    const Shard& sh = shard(s);
    std::int64_t rows = std::max<std::int64_t>(1, sh.row_end - sh.row_begin);
    return sh.bytes / static_cast<std::size_t>(rows);
  }
  void flush_all_peers() { transport->flush_all(*region); }

  // Maps the wake words above (after the region is allocated). `ps_index`: this rank's PS index, or
  // -1 on a client (whose index among the workers is `worker`).
  void map_wake_words(int ps_index, int worker);
  // Rings PS p's wake word (a no-op when it is not mapped here): call after a doorbell or a word
  // that PS waits for is written and complete.
  void ring_ps(int p) {
    if (std::uint32_t* w = ps_wake[static_cast<std::size_t>(p)]) wake::ring(w);
  }

  // Adds 1 to PS 0's preemption word, once per rank.
  void report_preemption();

  [[noreturn]] void timeout(const std::string& what, std::vector<int> ranks) const;

  // Polls `ready` until it is true or options.timeout_s passes (then TimeoutError blaming `blame`).
  // With a wake word (the writer of what `ready` reads rings it after writing), the sleeps of the
  // backoff become sleeps on the word, cut short by the ring (wake_word.h); their timeout, a
  // fallback only, is kWakeFallback.
  template <typename Pred>
  void wait_for(Pred ready, const std::string& what, std::vector<int> blame, std::uint32_t* wake_word = nullptr) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options.timeout_s));
    Backoff backoff;
    while (!ready()) {
      if (Clock::now() > deadline) timeout(what, blame);
      if (wake_word != nullptr && backoff.sleeps_next()) {
        wake::announce(wake_word);
        if (ready()) {
          wake::withdraw(wake_word);
          return;
        }
        ++wake_sleeps;
        wake_rung += wake::sleep(wake_word, std::min(kWakeFallback, std::chrono::duration_cast<std::chrono::microseconds>(
                                                                        deadline - Clock::now() + std::chrono::microseconds(1))))
                         ? 1
                         : 0;
      } else {
        backoff.pause();
      }
    }
  }
};

}  // namespace strata::ps
