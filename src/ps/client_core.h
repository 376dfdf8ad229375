// The client part of the parameter servers: a worker's (or the chief's) state, its data plane
// (pulls, pushes, rows, assign, acks, the settling of sync rounds) and clocks (ps_client.cc), and
// its side of the checkpoint protocol (checkpoint_protocol.cc). Private to the ps layer.
// Thread-safety: one thread uses a client at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <string_view>
#include <vector>

#include "ps/ps_core.h"

namespace strata::ps {

struct ClientCore final : PsCore {
  int worker = -1;  // index among chief + workers
  bool done_called = false;

  std::vector<std::int64_t> pushes;  // per shard: pushes this worker sent
  std::vector<std::int64_t> acked;   // per shard: the last ack of this worker's pushes read from its PS
  // Per shard: the ack word a streamed push reads back (put_notify), valid once drained by a flush;
  // readback_pending says one is on its way. Sized once: the transport writes into it.
  std::vector<std::int64_t> ack_readback;
  std::vector<char> readback_pending;
  std::int64_t clock = 0;
  std::int64_t max_staleness = 0;
  std::int64_t known_low = 0;  // a lower bound of the slowest worker's clock (clocks only grow)
  bool staleness_owed = false;  // end_step left its staleness wait to join a save first
  // Checkpoint protocol (checkpoint_protocol.cc).
  std::int64_t saves_joined = 0;     // saves this worker took part in
  std::int64_t save_posted = 0;      // chief: the last request id it posted
  std::int64_t posted_target = 0;    // chief: value of the target word it last wrote
  std::int64_t posted_flags = 0;     // chief: value of the flags word it last wrote
  bool last_save_stopped = false;
  std::int64_t last_flags = 0;       // flags of the last save joined
  std::int64_t saves_committed = 0;  // saves joined that committed a checkpoint
  PsClient::SavePauses pauses;       // saves joined at training step boundaries

  // ---- data plane (ps_client.cc) ----
  const VariableSpec& spec_of(std::string_view variable, const char* op) const;
  void check_bytes(const VariableSpec& spec, std::size_t bytes, const char* op) const;
  void check_trainable(const VariableSpec& spec, const char* op) const;
  // Waits until the PS applied this worker's previous push to shard s.
  void wait_ack(std::size_t s, const char* why);
  void refresh_acks();
  void send_inbox(std::size_t s, bool dense, const std::vector<std::int64_t>& rows, const void* payload,
                  std::size_t payload_bytes);
  void send_streamed(std::size_t s, const void* payload);
  // Sync consistency: waits until every round this worker pushed is applied. No-op otherwise.
  void settle_sync(const char* why);
  template <typename T>
  void push_dense_shard(std::size_t s, const T* grad);
  template <typename T>
  void push_rows_typed(const VariableSpec& spec, const std::vector<std::int64_t>& rows, const T* grads);

  // ---- dynamic variables (dynamic_service.cc) ----
  std::vector<std::vector<std::int64_t>> dyn_sent;   // per dynamic variable, per PS: requests sent
  std::vector<std::vector<std::int64_t>> dyn_acked;  // per dynamic variable, per PS: answers seen
  // Per dynamic variable, per PS: the ack word a put_notify request reads back (valid after a
  // flush; pending says one is on its way). Sized once: the transport writes into it.
  std::vector<std::vector<std::int64_t>> dyn_readback;
  std::vector<std::vector<char>> dyn_readback_pending;
  std::vector<std::int64_t> dyn_message;  // the request being sent (reused)
  // A batch's distinct ids grouped per PS (group_dynamic); every buffer is reused across calls,
  // so a steady stream of batches allocates nothing and touches no fresh page.
  struct DynamicBatch {
    std::vector<std::uint32_t> slot_of;  // per input id: its distinct id's position in `ids`
    std::vector<std::int64_t> ids;       // distinct ids, PS 0's first, each PS's in order of first appearance
    std::vector<std::size_t> begin;      // num_ps + 1 offsets: PS p's distinct ids are [begin[p], begin[p + 1])
    std::vector<float> rows;             // lookup: distinct rows (answers land here); update: summed gradients
    // Scratch: the open-addressing table (key, then distinct number + 1 and the call's epoch, so
    // it is never cleared between calls), the distinct ids in order of first appearance, their
    // PS and their position in `ids`.
    struct Slot {  // key and tag on one line: a probe touches one cache line
      std::int64_t key;
      std::uint32_t epoch;
      std::uint32_t number;  // distinct number
    };
    std::vector<Slot> table;
    std::uint32_t epoch = 0;
    std::vector<std::int64_t> first_ids;
    std::vector<std::int32_t> first_ps;
    std::vector<std::uint32_t> position;
    std::vector<std::size_t> next;  // counting sort's cursors
    std::size_t distinct = 0;       // distinct ids deduplicated so far in this call
    std::vector<float> sums;    // update with several PS: the sums in order of distinct numbers
  };
  DynamicBatch dyn_batch;
  // Deduplicates ids[0..n) and groups the distinct ids per PS into dyn_batch. With `grads` (n rows
  // of dim floats, an update's), rows[position * dim ..] ends as the sum of the gradients of that
  // position's id in order of appearance; without, rows is left unsized.
  void group_dynamic(const std::int64_t* ids, std::size_t n, const float* grads = nullptr, std::size_t dim = 0);
  // Starts a call's deduplication of up to n ids (sizes the table, advances the epoch).
  void start_dedupe(std::size_t n);
  // Takes a drained read-back of PS p into dyn_acked (call after a flush).
  void take_readback(std::size_t d, int p);
  // Writes one request into this worker's area on PS p (after the previous one was answered) and
  // rings the doorbell. `rows`: the gradients of an update (n * dim floats), null for a lookup.
  void send_dynamic(std::size_t d, int p, DynamicRequestKind kind, const std::int64_t* ids, std::size_t n,
                    const float* rows, std::int64_t step, bool last);
  // Waits until PS p answered every request of variable d this worker sent.
  void wait_dynamic(std::size_t d, int p, const char* op);

  // Pipelining (tcp between nodes, where a PS serves a request on arrival on its transport's
  // thread and answers in order): several requests of one call in flight at once, the PS working
  // on one while the next is on the wire and the answers of the previous stream back.
  // Per PS: a request of this worker was seen answered on arrival (a put_notify's read-back said
  // so), so requests to it may be posted without waiting for the previous answer.
  std::vector<char> dyn_on_arrival;
  // Chunks a call is posted in to such PS ranks (STRATA_TCP_DYNAMIC_CHUNKS, read with the first call).
  int dyn_chunks = 1;
  struct Posted {  // a request posted ahead: its PS, its number, whether its batch ends with it
    int p;
    std::int64_t number;
    bool last;
  };
  std::vector<Posted> dyn_posted;
  // The read-back words of posted requests, one per request (a deque: the transport writes into
  // them while more are added, so they never move).
  std::deque<std::int64_t> dyn_posted_readback;
  // Whether every PS may take requests posted ahead (dyn_on_arrival sized here).
  bool dynamic_pipelined();
  // Posts one request to PS p as one put_notify with a read-back, without waiting for earlier ones;
  // with `answer`, a lookup's rows are read into it behind the read-back (put_notify_get).
  void post_dynamic(std::size_t d, int p, DynamicRequestKind kind, const std::int64_t* ids, std::size_t n,
                    const float* rows, std::int64_t step, bool last, float* answer = nullptr);
  // Flushes, checks every posted request's read-back and empties the list. A request that is not
  // its batch's last must have been answered on arrival (else the PS broke the protocol: an
  // error naming it); a last one may wait for its sync round (wait_dynamic).
  void finish_posted(std::size_t d, const char* op);
  // Deduplicates ids[lo, hi) against the call's earlier chunks (group_dynamic's table, same epoch):
  // appends the new distinct ids to dyn_batch.first_ids and sets slot_of[lo, hi) to distinct numbers.
  // With `grads`, also sums each id's gradient rows (dim floats) into sums[number * dim ..], the
  // first one copied (sums must hold a row per id of the call).
  void dedupe_chunk(const std::int64_t* ids, std::size_t lo, std::size_t hi, const float* grads = nullptr,
                    std::size_t dim = 0, float* sums = nullptr);
  void lookup_pipelined(std::size_t d, const std::int64_t* ids, std::size_t n, float* out, DynamicRequestKind kind);
  void lookup_dynamic(std::size_t d, const std::int64_t* ids, std::size_t n, float* out, DynamicRequestKind kind);
  void update_dynamic(std::size_t d, const std::int64_t* ids, std::size_t n, const float* grads, std::int64_t step);

  // ---- clocks (ps_client.cc) ----
  std::int64_t read_slowest(std::vector<int>* who);
  bool wait_staleness(bool yield_to_save);

  // ---- checkpoint protocol (checkpoint_protocol.cc) ----
  bool joinable(std::int64_t n);
  bool save_waiting_here();
  PsClient::Boundary join_save(std::int64_t n, const WorkerPosition& position, bool training);
  void wait_arrivals(std::int64_t n);
  void post_save(std::int64_t target, std::int64_t flags);
};

}  // namespace strata::ps
