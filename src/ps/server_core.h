// The server part of the parameter servers: a PS rank's state, its service loop (ps_server.cc)
// and its side of the checkpoint protocol (checkpoint_protocol.cc). Private to the ps layer.
//
// Thread-safety: the service loop's thread owns everything here, except the optimizer state
// (values, slots) and the fields marked "apply_mu" below, which the transport's thread also
// writes when it hands a streamed push's chunk over (consume_notified): both hold apply_mu while
// they do.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "ps/apply_team.h"
#include "ps/dynamic_table.h"
#include "ps/ps_core.h"

namespace strata::ps {

struct ServerCore final : PsCore {
  int ps_index = -1;

  std::mutex apply_mu;
  std::vector<std::size_t> local_shards;  // shards served here through the inbox ("local shard" ls indexes it)
  // Per local shard, per worker (apply_mu):
  std::vector<std::vector<std::int64_t>> consumed;     // pushes applied
  std::vector<std::vector<std::int64_t>> bells_seen;   // doorbell pushes applied
  std::vector<std::vector<std::int64_t>> chunks_seen;  // streamed chunks applied
  std::vector<std::vector<std::int64_t>> stream_step;  // step of its streamed push
  std::vector<std::vector<std::int64_t>> handed_seen;  // chunks the transport handed over
  std::vector<std::int64_t> rounds;     // per shard: applications in this job (sync rounds) (apply_mu)
  // Per worker: an ack was stored since the last ring_acks() (apply_mu). A pass rings each worker
  // once at its end, so a sync worker waiting for a round of several shards wakes once.
  std::vector<char> ack_stored;
  // Stores worker w's ack word at `offset` of this arena and notes the worker for ring_acks().
  void store_ack(std::uint64_t offset, int w, std::int64_t value) {
    store_i64(base() + offset, value);
    ack_stored[static_cast<std::size_t>(w)] = 1;
  }
  // Rings the wake word of every worker noted by store_ack since the last call (apply_mu).
  void ring_acks() {
    for (std::size_t w = 0; w < ack_stored.size(); ++w) {
      if (!ack_stored[w]) continue;
      ack_stored[w] = 0;
      if (std::uint32_t* word = worker_wake[w]) wake::ring(word);
    }
  }
  std::vector<std::int64_t> step_base;  // per shard: optimizer steps restored from a checkpoint
  // Per shard: the optimizer that updates it, its variable's own (VariableSpec::optimizer) or the
  // job's. Filled by initialise_local_shards before anything reads it; read-only afterwards.
  std::vector<OptimizerConfig> shard_optimizers;
  const OptimizerConfig& optimizer_of(std::size_t s) const { return shard_optimizers[s]; }
  // Service statistics (apply_mu), published in the control block (publish_stats).
  std::int64_t applied = 0;
  std::int64_t applied_elements = 0;
  double busy_s = 0;                // time in apply() and sync-round sums
  std::int64_t split_updates = 0;   // applications split over the apply team
  std::int64_t max_parts = 1;       // most threads one application used
  std::unique_ptr<ApplyTeam> team;  // optimizer threads beyond the loop's own (serve())
  std::vector<float> round_sum_f32;  // a sync round's mean gradient (reused across rounds)
  std::vector<double> round_sum_f64;
  template <typename T>
  std::vector<T>& round_sum() {
    if constexpr (std::is_same_v<T, float>) return round_sum_f32;
    else return round_sum_f64;
  }
  // Dynamic variables (dynamic_service.cc): this PS's shard of each, in declaration order.
  struct DynamicState {
    std::unique_ptr<DynamicTable> table;
    std::vector<std::int64_t> seen;   // per worker: requests taken (its ack word once answered)
    std::vector<std::int64_t> bells;  // per worker: requests taken through the doorbell
    // Sync: per worker, whether its round's last update request arrived (its ack waits for the
    // round), and the ids, gradient rows and steps of its requests of the round, copied out.
    std::vector<char> waiting;
    std::vector<std::vector<std::int64_t>> staged_ids;
    std::vector<std::vector<float>> staged_rows;
    std::vector<std::vector<std::int64_t>> staged_steps;  // per staged request: step, then its id count
    std::int64_t next_evict = 0;     // ttl: the step of the next eviction scan
    std::int64_t requests = 0;       // requests served
    double lookup_s = 0, update_s = 0;  // table time (DynamicShardStats)
    std::int64_t lookup_requests = 0, update_requests = 0;
    std::int64_t restored_step = -1;  // the step its rows were restored at (-1: none)
  };
  std::vector<DynamicState> dynamic_state;
  // Builds the tables and the service state (materialisation).
  void prepare_dynamic();
  // One pass over dynamic variable d's doorbells; true when it served something. apply_mu held.
  bool serve_dynamic(std::size_t d);
  // Serves worker w's request `number` of variable d: header, ids and (update) gradient rows at
  // `req`, `bytes` readable there (exact: the message is exactly that long). Checks every word
  // first (Error naming the writer). apply_mu held.
  void serve_request(std::size_t d, int w, const char* req, std::size_t bytes, bool exact, std::int64_t number);
  // A request handed over by the transport's thread (consume_notified): served there, under apply_mu.
  void consume_dynamic(std::size_t d, int w, std::uint64_t offset, const void* data, std::size_t bytes);
  void consume_dynamic_locked(std::size_t d, int w, std::uint64_t offset, const void* data, std::size_t bytes);
  // What a request handed over by the transport's thread was refused for ("" if none) (apply_mu);
  // serve_once throws it.
  std::string dynamic_failure;
  // Sync: applies the round of dynamic variable d (every worker's requests, in worker order) and
  // acknowledges every worker's last request. Called once every worker's last one arrived.
  void apply_dynamic_round(std::size_t d);
  // One update of table d (and its ttl scan).
  void apply_dynamic(std::size_t d, const std::int64_t* ids, std::size_t n, const float* rows, std::int64_t step);

  // Checkpoint protocol (checkpoint_protocol.cc).
  std::int64_t saves_done = 0;  // saves this PS took part in
  bool stopped = false;         // a preemption save happened

  // Dynamic tables in checkpoints (checkpoint_protocol.cc, CheckpointHooks' dynamic fields).
  std::unique_ptr<comm::Group> dyn_group;  // the PS ranks by PS index; only in jobs with dynamic variables
  std::int64_t dyn_saves = 0;         // dynamic saves committed in this job (the full/delta cadence)
  std::int64_t dyn_saved_step = -1;   // the global step of the last one (a delta's parent step)
  std::vector<std::uint32_t> dyn_parent_checksums;  // every PS: per table, its content checksum there
  std::vector<std::uint32_t> dyn_pending_checksums;  // every PS: the same for the save in progress
  std::vector<std::vector<std::uint16_t>> dyn_parent_sketches, dyn_pending_sketches;  // PS 0: likewise, whole sketches
  // Restored before allocation (restore_dynamic), imported by prepare_dynamic: per table, this
  // shard's rows and the step.
  std::vector<DynamicTableSnapshot> dyn_restored;
  std::vector<std::int64_t> dyn_restored_steps;
  ~ServerCore() override;
  // Reads this shard of every table from the chains (dynamic_restore_dir at dynamic_restore_step)
  // into dyn_restored: "" when done, else one line naming the variable and the reason.
  std::string restore_dynamic();
  // Collective over the PS ranks (dyn_group): writes every table of this save, full or delta, into
  // one file, each PS rank its own rows (parallel HDF5); the same status on every PS rank (kFailed:
  // nothing committed, said once by PS 0 naming the PS that failed). `wrote`: a new file was written (false when this step's tables are saved already).
  SaveStatus save_dynamic(const SaveContext& ctx, bool* wrote);
  // After the dense save: on kSaved (or kSkipped) the tables start a new delta period; on
  // kFailed PS 0 removes the tables file of this step again.
  void finish_dynamic_save(SaveStatus status, bool wrote, std::int64_t global_step);

  // Materialisation, after the region is allocated: slots, values (restored or initialised) and
  // the restored global step (PS 0).
  void initialise_local_shards();
  // The service state, and a consumer for every streamed push the transport can hand over.
  // Called once, after the shards are initialised and before the barrier that lets workers push.
  void prepare_service();
  // This PS's view of shard s (s must be placed here).
  ShardBuffers shard_buffers(std::size_t s);
  // Publishes the service statistics in this PS's control block (ArenaLayout::stats()).
  void publish_stats();

  // One pass of the service loop over every local shard; true when it applied something.
  bool serve_once();
  // The whole loop (PsServer::serve).
  bool serve();

  // Checkpoint protocol: runs the save requested on PS 0 once every worker arrived at it.
  bool maybe_save();

  template <typename T>
  void apply(std::size_t s, const T* grad_or_null, const std::vector<std::int64_t>& rows, const T* row_grads);
  // A sync round's dense update of shard s: the mean of `grads` (one per worker, worker order)
  // and the optimizer step, fused and split over the team (apply_mean_team); `scratch` holds the
  // shard's elements. Counts and times itself as apply() does.
  template <typename T>
  void apply_mean(std::size_t s, const std::vector<const T*>& grads, T* scratch);
  template <typename T>
  void apply_stream_chunk(std::size_t ls, std::size_t s, int w, std::size_t begin, std::size_t count, const T* grad,
                          bool first, bool last, bool on_loop);
  template <typename T>
  const T* read_inbox(std::size_t s, int w, std::vector<std::int64_t>& rows, bool* dense);
  template <typename T>
  bool serve_shard_async(std::size_t ls, std::size_t s);
  template <typename T>
  bool serve_shard_sync(std::size_t ls, std::size_t s);
  template <typename T>
  void consume_chunk(std::size_t ls, std::size_t s, int w, std::uint64_t offset, const void* data, std::size_t bytes);
};

}  // namespace strata::ps
