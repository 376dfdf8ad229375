// The checkpoint-boundary and preemption protocol, on top of the server and client parts: the
// chief posts a save request on PS 0, every worker quiesces at a step boundary and arrives, the
// PS ranks' service loops take the save collectively and publish its outcome (the protocol is
// narrated at PsClient's checkpoint methods in include/strata/ps/parameter_servers.h; its words
// are in the control block, arena_layout.h).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <atomic>
#include <chrono>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ps/client_core.h"
#include "ps/dynamic_checkpoint.h"
#include "ps/server_core.h"
#include "strata/comm/mpi_group.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/signals.h"

namespace strata::ps {

namespace {

// Calls Transport::progress() from a helper thread for its lifetime. The owner must make no
// transport call meanwhile (Transport::progress's thread contract).
class BackgroundProgress {
 public:
  explicit BackgroundProgress(comm::Transport& transport)
      : thread_([this, &transport] {
          while (!stop_.load(std::memory_order_acquire)) {
            transport.progress();
            std::this_thread::sleep_for(std::chrono::microseconds(50));
          }
        }) {}
  ~BackgroundProgress() {
    stop_.store(true, std::memory_order_release);
    thread_.join();
  }
  BackgroundProgress(const BackgroundProgress&) = delete;
  BackgroundProgress& operator=(const BackgroundProgress&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// --timeout without progress, as the protocol's waits bound themselves: the deadline moves on
// while the job's global step (on PS 0) moves, and when the caller reports progress of its own
// (a save joined). Not thread-safe; one per wait.
class ProgressDeadline {
 public:
  explicit ProgressDeadline(ClientCore& m)
      : m_(m),
        bound_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(m.options.timeout_s))),
        deadline_(Clock::now() + bound_),
        step_(m.read_ps0(control::kGlobalStep)) {}
  // Reads the global step (a move restarts the bound); true once the bound passed without one.
  bool expired() {
    if (const std::int64_t now_step = m_.read_ps0(control::kGlobalStep); now_step != step_) {
      step_ = now_step;
      progressed();
    }
    return Clock::now() > deadline_;
  }
  void progressed() { deadline_ = Clock::now() + bound_; }
  // The global step as last read.
  std::int64_t step() const { return step_; }

 private:
  ClientCore& m_;
  Clock::duration bound_;
  Clock::time_point deadline_;
  std::int64_t step_;
};

}  // namespace

// ---- checkpoint saves ---------------------------------------------------------------------

// PS ranks, from the service loop: runs save `n` once every worker arrived at it. Every PS rank
// sees the same monotone counters on PS 0, so all of them enter the collective save for n.
//
// The protocol words on PS 0 are written by the chief (request, flags) and the workers (arrivals,
// positions, the global step) and checked before use: the chief posts one request at a time,
// each once the previous one committed, so a new request is exactly saves_done + 1 (which also
// keeps n * workers small); no worker arrives at a save before it is posted.
bool ServerCore::maybe_save() {
  const std::int64_t n = read_ps0(control::kSaveRequest);
  if (n <= saves_done) return false;
  if (n != saves_done + 1)
    fail_word(writers[0], "posted checkpoint save request " + std::to_string(n) + " on ps:0 after " +
                              std::to_string(saves_done) + " saves (requests are posted one at a time)");
  const std::int64_t arrivals = read_ps0(control::kSaveArrivals);
  if (arrivals < n * num_workers) return false;
  if (arrivals > n * num_workers)
    throw Error("ps:0's checkpoint arrival count reads " + std::to_string(arrivals) + " at save " + std::to_string(n) +
                ", more than the " + std::to_string(n * num_workers) + " arrivals of " + std::to_string(num_workers) +
                " workers at " + std::to_string(n) + " saves (each worker arrives once per save)");
  SaveContext ctx;
  ctx.save_number = n;
  // Every worker arrived quiesced (its pushes applied) and increments the global step inside its
  // step, before its boundary: the word counts exactly the steps whose updates the arenas hold.
  ctx.global_step = read_ps0(control::kGlobalStep);
  if (ctx.global_step < 0) throw Error("the global step on ps:0 reads " + std::to_string(ctx.global_step) + " at save " + std::to_string(n));
  const std::int64_t flags = read_ps0(control::kSaveFlags);
  if ((flags & ~(control::kSaveFinal | control::kSaveStop)) != 0)
    fail_word(writers[0], "posted checkpoint save flags " + std::to_string(flags) + " for save " + std::to_string(n) +
                              " (known flags: 1 final, 2 stop)");
  ctx.final = (flags & control::kSaveFinal) != 0;
  ctx.stop = (flags & control::kSaveStop) != 0;
  constexpr std::size_t kWords = control::kPositionBytes / 8;
  std::vector<std::int64_t> pos(kWords * static_cast<std::size_t>(num_workers));
  transport->get(*region, ps0(), layout.positions(), pos.data(), pos.size() * 8);
  transport->flush(*region, ps0());
  for (int w = 0; w < num_workers; ++w) {
    const std::int64_t* word = pos.data() + kWords * static_cast<std::size_t>(w);
    const WorkerPosition p{word[0], word[1], word[2]};
    if (p.epoch < 0 || p.offset < 0 || p.step < 0)
      fail_word(writers[w], "published the input position epoch " + std::to_string(p.epoch) + ", offset " +
                                std::to_string(p.offset) + ", step " + std::to_string(p.step) + " for checkpoint save " +
                                std::to_string(n) + " (none may be negative)");
    // A worker writes its position and n before it arrives: with n * W arrivals counted, every
    // worker's word reads n, or the position beside it is not the one of this save.
    if (word[3] != n)
      fail_word(writers[w], "arrived at checkpoint save " + std::to_string(n) + " but its position word names save " +
                                std::to_string(word[3]));
    ctx.positions.push_back(p);
  }
  transport->sync_local(*region);
  {
    // The save itself reads values and slots without the lock: every worker arrived, so each
    // of its pushes was applied (acknowledged) and none is in flight.
    std::lock_guard<std::mutex> lock(apply_mu);
    for (std::size_t s = 0; s < map.shards().size(); ++s)
      if (shard(s).ps == ps_index) ctx.shards.push_back(shard_buffers(s));
  }
  STRATA_LOG(DEBUG) << "saving checkpoint " << n << " at global step " << ctx.global_step;
  SaveStatus status = SaveStatus::kFailed;
  {
    // The save is a blocking collective (parallel HDF5) during which this thread makes no
    // transport call. Transports whose one-sided operations need the target's progress (UCX over
    // TCP) would otherwise stall every peer reading this PS: another PS still reading the save
    // counters here before joining the collective (a deadlock), and workers polling for the commit.
    BackgroundProgress keep_answering(*transport);
    // Dynamic tables first: the dense save commits the checkpoint (its pointer), so once it names
    // this step, the tables of this step are committed already.
    bool dyn_wrote = false;
    const bool dyn = dyn_group && !options.checkpoint.dynamic_dir.empty();
    if (dyn) status = save_dynamic(ctx, &dyn_wrote);
    if (!dyn || status != SaveStatus::kFailed) status = options.checkpoint.save(ctx);
    if (dyn) finish_dynamic_save(status, dyn_wrote, ctx.global_step);
  }
  saves_done = n;
  if (ctx.stop) stopped = true;
  if (status == SaveStatus::kFailed) {
    ++saves_failed;
    if (options.checkpoint.stop_on_save_error) save_error_stop = true;
  }
  if (ps_index == 0) {
    // The status first: a worker that reads done >= n then reads n's status (it cannot change
    // before that worker arrives at save n + 1).
    store_i64(base() + control::kSaveStatus, static_cast<std::int64_t>(status));
    store_i64(base() + control::kSaveDone, n);
    transport->sync_local(*region);
  }
  return true;
}


// ---- dynamic tables in checkpoints (FORMAT.md section 10.7) -------------------------------------

ServerCore::~ServerCore() = default;

std::string ServerCore::restore_dynamic() {
  const CheckpointHooks& hooks = options.checkpoint;
  dyn_restored.clear();
  dyn_restored_steps.clear();
  const int k = num_ps();
  const int me = ps_index;
  const std::string want_optimizer = to_string(options.optimizer.kind);
  const std::string dir = hooks.dynamic_restore_dir.empty() ? "." : hooks.dynamic_restore_dir;
  const std::int64_t at = hooks.dynamic_restore_step;
  // A checkpoint saved by a job without dynamic variables has no tables file at or before its
  // step (a save writes the tables before it commits): its dynamic variables start afresh, as a
  // dense variable the checkpoint lacks does. Any tables file there must restore, or it is an error.
  bool any = false;
  for (const std::int64_t step : checkpoint::list_dynamic_checkpoints(dir)) any = any || step <= at;
  if (!any) {
    if (ps_index == 0)
      std::cout << "checkpoint: no dynamic tables saved at or before global step " << at << " in " << dir
                << ": the dynamic variables start from their initializers" << std::endl;
    return "";
  }
  for (const DynamicVariableSpec& spec : dynamic) {
    const std::string who = "cannot restore dynamic variable '" + spec.name + "'";
    checkpoint::DynamicRestore r;
    try {
      r = checkpoint::restore_dynamic_table(dir, table_name(spec.name), at,
                                            [k, me](std::int64_t id) { return shard_of(id, k) == me; });
    } catch (const Error& e) {
      return who + " at global step " + std::to_string(at) + " from " + dir + ": " + e.message();
    }
    if (r.state.dim != spec.dim)
      return who + ": its table has rows of " + std::to_string(r.state.dim) + " floats, the variable " +
             std::to_string(spec.dim);
    if (r.state.optimizer != want_optimizer && r.state.slot_names != slot_names(options.optimizer.kind))
      return who + ": its table was saved with optimizer " + r.state.optimizer + " (slots of another kind), this job uses " +
             want_optimizer;
    if (ps_index == 0) {
      if (!r.warning.empty()) std::cout << "checkpoint: " << r.warning << std::endl;
      std::cout << "checkpoint: restored dynamic variable '" << spec.name << "' at global step " << r.step << " from "
                << r.chain.size() << " file(s) onto " << k << " PS" << std::endl;
    }
    dyn_restored_steps.push_back(r.step);
    dyn_restored.push_back(to_snapshot(std::move(r.state)));
  }
  return "";
}

SaveStatus ServerCore::save_dynamic(const SaveContext& ctx, bool* wrote) {
  *wrote = false;
  // This step's tables are committed already (a final save right after a periodic one).
  if (ctx.global_step == dyn_saved_step) return SaveStatus::kSaved;
  const CheckpointHooks& hooks = options.checkpoint;
  const std::int64_t every = std::max<std::int64_t>(1, hooks.dynamic_full_every);
  const bool full = dyn_saved_step < 0 || dyn_saves % every == 0;
  std::vector<checkpoint::DynamicTableState> mine;
  {
    std::lock_guard<std::mutex> lock(apply_mu);
    for (std::size_t d = 0; d < dynamic.size(); ++d) {
      const DynamicTable& table = *dynamic_state[d].table;
      const std::string name = table_name(dynamic[d].name);
      if (full)
        mine.push_back(full_state(name, table.config(), table.export_rows()));
      else
        mine.push_back(delta_state(name, table.config(), table.export_delta(), table.stats().rows, dyn_saved_step,
                                   dyn_parent_checksums.at(d)));
    }
  }
  // Every PS rank writes its own rows into the one file (parallel HDF5 on the PS ranks'
  // communicator; in-process PS ranks send theirs to PS 0, which writes the file) (FORMAT.md 10.7).
  checkpoint::DynamicParallelOptions save;
  if (!full && ps_index == 0) save.parent_sketches = dyn_parent_sketches;
  for (int p = 0; p < num_ps(); ++p)
    save.rank_names.push_back("ps:" + std::to_string(p) + " (rank " + std::to_string(ps_rank[static_cast<std::size_t>(p)]) + ")");
  const int shard = ps_index, shards = num_ps();
  save.owns = [shard, shards](std::int64_t id) { return shard_of(id, shards) == shard; };
  std::int64_t rows[2] = {0, 0};  // this save's rows, the tables' rows
  for (const auto& t : mine) {
    rows[0] += static_cast<std::int64_t>(t.ids.size());
    rows[1] += t.total_rows;
  }
  try {
    const auto result = checkpoint::write_dynamic_checkpoint(*dyn_group, hooks.dynamic_dir, ctx.global_step, mine, save);
    dyn_pending_checksums = result.content_checksums;
    dyn_pending_sketches = result.sketches;
    *wrote = true;
    // The outcome is agreed, so every PS rank is here.
    dyn_group->reduce(rows, 2, comm::ElemType::kI64, comm::ReduceOp::kSum, 0,
                      comm::Deadline{options.timeout_s, "the PS ranks' dynamic-table save"});
    if (ps_index == 0) {
      char line[512];
      std::snprintf(line, sizeof line, "checkpoint: saved dynamic tables %s (%s, %lld of %lld rows, %.2f MiB, %d PS)",
                    result.path.c_str(), full ? "full" : "delta", static_cast<long long>(rows[0]),
                    static_cast<long long>(rows[1]), static_cast<double>(result.file_bytes) / (1 << 20), num_ps());
      std::cout << line << std::endl;
    }
    return SaveStatus::kSaved;
  } catch (const Error& e) {
    if (ps_index == 0)
      std::cerr << "checkpoint: ERROR: the dynamic tables of global step " << ctx.global_step
                << " were not saved, so neither is the checkpoint: " << e.message() << std::endl;
    return SaveStatus::kFailed;
  }
}

void ServerCore::finish_dynamic_save(SaveStatus status, bool wrote, std::int64_t global_step) {
  if (!wrote) return;
  if (status == SaveStatus::kFailed) {
    // The checkpoint of this step is not committed: its tables file must not outlive it as if it
    // were (nothing links to it yet; the next delta still names the previous save).
    if (ps_index == 0) {
      const std::string path = options.checkpoint.dynamic_dir + "/" + checkpoint::dynamic_file_name(global_step);
      if (std::remove(path.c_str()) != 0) {
        STRATA_LOG(WARN) << "checkpoint: could not remove " << path << " after the failed save";
      }
    }
    return;
  }
  std::lock_guard<std::mutex> lock(apply_mu);
  for (auto& st : dynamic_state) st.table->mark_saved();
  dyn_saved_step = global_step;
  ++dyn_saves;
  dyn_parent_checksums = std::move(dyn_pending_checksums);
  dyn_pending_checksums.clear();
  dyn_parent_sketches = std::move(dyn_pending_sketches);
  dyn_pending_sketches.clear();
}

// Worker: whether save request n (the newest one) is this boundary's to join: not joined yet,
// its target clock reached, and not the final save (joined from finish_checkpoints() only: a
// worker still training would push after it and then wait for a request that never comes).
bool ClientCore::joinable(std::int64_t n) {
  if (n <= saves_joined) return false;
  if (clock < read_ps0(control::kSaveTarget)) return false;
  return (read_ps0(control::kSaveFlags) & control::kSaveFinal) == 0;
}

bool ClientCore::save_waiting_here() { return options.checkpoint.enabled && joinable(read_ps0(control::kSaveRequest)); }


// Worker: takes part in save `n`: quiesce (every push applied), publish the position, arrive,
// wait until every worker arrived, then for the commit. `training`: joined at a step boundary of
// the training loop; the time it took is this worker's save pause (ParameterServers::save_pauses).
PsClient::Boundary ClientCore::join_save(std::int64_t n, const WorkerPosition& position, bool training) {
  const auto t0 = Clock::now();
  flush_all_peers();
  for (std::size_t s = 0; s < pushes.size(); ++s) wait_ack(s, "checkpoint quiesce");
  const std::int64_t words[control::kPositionBytes / 8] = {position.epoch, position.offset, position.step, n};
  transport->put(*region, ps0(), layout.positions() + control::kPositionBytes * static_cast<std::uint64_t>(worker), words,
                 sizeof words);
  transport->flush(*region, ps0());
  // Read n's flags before arriving: once every worker arrived the save can commit and the chief
  // may post n + 1 (overwriting the flags) before this worker looks again.
  last_flags = read_ps0(control::kSaveFlags);
  transport->fetch_add(*region, ps0(), control::kSaveArrivals, 1);
  wait_arrivals(n);
  const double limit = std::max(options.save_timeout_s, options.timeout_s);
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  Backoff backoff;
  while (read_ps0(control::kSaveDone) < n) {
    if (Clock::now() > deadline) {
      std::vector<int> blame(ps_rank.begin(), ps_rank.end());
      throw TimeoutError("worker " + std::to_string(worker) + " waited " + std::to_string(limit) +
                             " s for the PS ranks to write checkpoint save " + std::to_string(n) +
                             " (every worker arrived)",
                         std::move(blame));
    }
    backoff.pause();
  }
  saves_joined = n;
  const auto status = static_cast<SaveStatus>(read_ps0(control::kSaveStatus));
  PsClient::Boundary b;
  b.saved = true;
  b.failed = status == SaveStatus::kFailed;
  b.skipped = status == SaveStatus::kSkipped;
  if (status == SaveStatus::kSaved) ++saves_committed;
  if (b.failed) {
    ++saves_failed;
    if (options.checkpoint.stop_on_save_error) save_error_stop = true;
  }
  last_save_stopped = (last_flags & control::kSaveStop) != 0 || (b.failed && options.checkpoint.stop_on_save_error);
  b.stop = last_save_stopped;
  if (training) {
    const double paused = std::chrono::duration<double>(Clock::now() - t0).count();
    pauses.total_s += paused;
    pauses.max_s = std::max(pauses.max_s, paused);
    ++pauses.saves;
  }
  return b;
}


// Worker, arrived at save n: waits until every worker arrived. A worker that is not at a step
// boundary yet is still in a step (async: its next boundary; sync: the target clock), so the
// bound is --timeout without progress: the deadline moves on while the job's global step moves.
// Past it, the message names the workers whose position word does not name save n.
void ClientCore::wait_arrivals(std::int64_t n) {
  ProgressDeadline deadline(*this);
  Backoff backoff;
  while (read_ps0(control::kSaveArrivals) < n * num_workers && read_ps0(control::kSaveDone) < n) {
    if (deadline.expired()) {
      std::vector<int> late;
      std::string names;
      for (int w = 0; w < num_workers; ++w) {
        const std::uint64_t id_word = layout.positions() + control::kPositionBytes * static_cast<std::uint64_t>(w) + 24;
        if (transport->atomic_read(*region, ps0(), id_word) >= n) continue;
        late.push_back(writers[w].rank);
        names += (names.empty() ? "" : ", ") + describe(writers[w]);
      }
      std::ostringstream os;
      os << "worker " << worker << " waited " << options.timeout_s << " s at checkpoint save " << n
         << " while the job's global step stayed at " << deadline.step() << "; not arrived at a step boundary: "
         << (names.empty() ? "(none: they arrived meanwhile)" : names) << " (--timeout / STRATA_TIMEOUT_S)";
      throw TimeoutError(os.str(), std::move(late));
    }
    backoff.pause();
  }
}


// Chief: posts request n = saves_joined + 1. Target and flags are written before the id, each
// remotely complete, so a worker that reads id n reads n's target and flags.
void ClientCore::post_save(std::int64_t target, std::int64_t flags) {
  transport->fetch_add(*region, ps0(), control::kSaveTarget, target - posted_target);
  transport->fetch_add(*region, ps0(), control::kSaveFlags, flags - posted_flags);
  posted_target = target;
  posted_flags = flags;
  save_posted = transport->fetch_add(*region, ps0(), control::kSaveRequest, 1) + 1;
}

// ---- PsClient's checkpoint methods --------------------------------------------------------------

void PsClient::request_save(bool stop) {
  ClientCore& m = core();
  if (m.worker != 0) throw Error("request_save: only the chief (worker 0) requests saves");
  if (!m.options.checkpoint.enabled) throw Error("request_save: checkpointing is not enabled");
  if (save_pending()) return;
  // Sync: the target c+2, where every worker's round c+2 ends. Not c+1: the chief posts after
  // its push of round c, and another worker may have finished round c+1 (it needs only round c)
  // and looked for a request at its boundary before this post; round c+2 needs the chief's push
  // of round c+1, which comes after it. Async and staleness:N: 0, so every worker joins at its
  // own next boundary and none waits for another to reach the chief's clock (a slow worker costs
  // the others at most its step in progress).
  const bool sync = m.options.consistency.mode == Consistency::kSync;
  m.post_save(sync ? m.clock + 2 : 0, stop ? control::kSaveStop : 0);
}

bool PsClient::save_pending() const { return core().save_posted > core().saves_joined; }

PsClient::Boundary PsClient::at_step_boundary(const WorkerPosition& position) {
  ClientCore& m = core();
  if (!m.options.checkpoint.enabled) return {};
  if (!m.preemption_reported && preemption_signal() != 0) report_preemption();
  // Join the save this boundary owes, then finish a staleness wait end_step left for it; a save
  // posted during that wait is joined too (at the same position: this worker pushed nothing since).
  Boundary b;
  while (true) {
    if (const std::int64_t n = m.read_ps0(control::kSaveRequest); m.joinable(n)) {
      const Boundary joined = m.join_save(n, position, true);
      const bool failed = b.failed || joined.failed;
      b = joined;
      b.failed = failed;
      if (b.stop) {
        m.staleness_owed = false;
        return b;
      }
    }
    if (!m.staleness_owed) return b;
    m.staleness_owed = !m.wait_staleness(true);
  }
}

PsClient::Boundary PsClient::finish_checkpoints(const WorkerPosition& position, const std::function<int()>& due) {
  ClientCore& m = core();
  if (!m.options.checkpoint.enabled || m.last_save_stopped) return {};
  m.transport->fetch_add(*m.region, m.ps0(), control::kTrainingDone, 1);
  Boundary last;
  if (m.worker == 0) {
    // A request posted at one of the last boundaries (sync: the last two) targets a clock nobody
    // reaches: every worker is at its end, so all of them join it here regardless of the target;
    // then the final save.
    if (save_pending()) last = m.join_save(m.save_posted, position, false);
    if (last.stop) return last;
    // Async and staleness:N: slower workers may train for long after the chief; the periodic saves
    // go on meanwhile (target 0: each joins at its next boundary). Sync is lockstep: every worker
    // ends with the chief.
    if (due && m.options.consistency.mode != Consistency::kSync && m.num_workers > 1) {
      ProgressDeadline deadline(m);
      Backoff backoff;
      // The word is the workers' (untrusted): a count past num_workers ends the wait like a full one.
      while (m.read_ps0(control::kTrainingDone) < m.num_workers && !deadline.expired()) {
        if (!m.preemption_reported && preemption_signal() != 0) report_preemption();
        if (const int kind = due(); kind != 0) {
          m.post_save(0, kind == 2 ? control::kSaveStop : 0);
          last = m.join_save(m.save_posted, position, false);
          if (last.stop) return last;
          backoff.reset();
          deadline.progressed();
          continue;
        }
        // Polls a few times a second at most once idle: a worker's step is milliseconds to seconds.
        backoff.pause();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    m.post_save(0, control::kSaveFinal);
    return m.join_save(m.save_posted, position, false);
  }
  // Join whatever the chief still requests until its final (or a stop) save. The chief may still
  // be training (async: legitimately for long), so the bound is the one of the job's end-of-training
  // barrier: --timeout without progress. The deadline moves on while the job's global step moves
  // or a save is joined; a chief alive but stuck (no step, no request) is named after --timeout.
  ProgressDeadline deadline(m);
  Backoff backoff;
  while (true) {
    if (!m.preemption_reported && preemption_signal() != 0) report_preemption();
    const std::int64_t n = m.read_ps0(control::kSaveRequest);
    if (n > m.saves_joined) {
      last = m.join_save(n, position, false);
      if (last.stop || (m.last_flags & (control::kSaveFinal | control::kSaveStop)) != 0) return last;
      backoff.reset();
      deadline.progressed();
      continue;
    }
    if (deadline.expired()) {
      std::ostringstream os;
      os << "worker " << m.worker << " finished training and waited " << m.options.timeout_s
         << " s for the chief (worker 0, rank " << m.chief_rank
         << ") to request the final checkpoint, while the job's global step stayed at " << deadline.step()
         << " (--timeout / STRATA_TIMEOUT_S)";
      throw TimeoutError(os.str(), {m.chief_rank});
    }
    backoff.pause();
  }
}

std::int64_t PsClient::saves_completed() const { return core().saves_committed; }

PsClient::SavePauses PsClient::save_pauses() const { return core().pauses; }

}  // namespace strata::ps
