// Parameter servers over one-sided communication: variables live in one arena per PS rank, workers
// read and update them with RMA, PS ranks apply stateful optimizers in a service loop.
//
// Lifecycle (every step collective over the whole job unless noted):
//   1. Every worker (chief and workers) declares the same variables in the same order; PS ranks
//      declare nothing (they receive the chief's list).
//   2. ParameterServers::materialize(runtime, options, specs): the workers' creation sequences are
//      compared (a mismatch is a ConfigError on every rank naming the first differing variable and
//      the workers that disagree, before anything is allocated); every rank builds the same
//      ShardMap and arena layout; each PS checks its arena fits; one region per PS is allocated;
//      PS ranks fill values (from options.restore when it supplies them, else the initializer) and
//      optimizer slots.
//   3. PS ranks call PsServer::serve(), which returns once every worker called done(). Workers
//      pull, push, step the global step and call end_step() (bounded staleness) from their
//      training loop through their PsClient.
//   4. Destroying the server or client is collective (it frees the region).
//
// Roles: materialize hands a PS rank a PsServer (the service loop) and a chief or worker a
// PsClient (the data plane, clocks, checkpoint boundaries); what both roles may call sits on their
// common base PsEndpoint. Calling a worker operation on a PS rank does not compile.
//
// The arenas' layout (control words, per-shard values, slots, inboxes, doorbells, acks, clocks) is
// computed in one place, src/ps/arena_layout.h, which documents it.
//
// Push protocols:
//   async SGD      MPI_Accumulate(SUM) of -lr*g straight into the values (atomic per element).
//   inbox          put g into this worker's inbox, flush, fetch_add its doorbell; the PS applies
//                  the optimizer in its service loop and publishes an ack. A worker's next push to
//                  the same shard waits for the ack (one push in flight per worker and shard).
//   sync           inbox, and the PS applies once every worker's gradient for that round arrived
//                  (mean of the gradients, summed in worker order, so results are reproducible).
//                  push returns once the gradient is delivered, without waiting for the round:
//                  this worker's next pull, pull_many, pull_rows, assign or wait_applied (and its
//                  next push to the same shard) first waits until every round it pushed to is
//                  applied, so it never reads parameters that lack its own last step. A step that
//                  pushes several variables therefore has all of them in flight at once and the
//                  PS applies them in one pass of its loop, instead of one round trip per
//                  variable (each a PS wake-up and a worker wake-up).
// Consistency: async readers may see a tensor mid-update (TF semantics). staleness:N makes
// end_step() wait while this worker is more than N steps ahead of the slowest worker.
// Thread-safety: one thread per rank uses its PsServer or PsClient at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/ps/optimizer.h"
#include "strata/ps/shard_map.h"
#include "strata/ps/variable.h"

namespace strata {
class Runtime;
}

namespace strata::ps {

enum class Consistency { kAsync, kStaleness, kSync };

struct ConsistencyConfig {
  Consistency mode = Consistency::kAsync;
  int staleness = 0;  // kStaleness: maximum steps ahead of the slowest worker
  // "async", "sync", "staleness:N" (N >= 0). ConfigError otherwise.
  static ConsistencyConfig parse(std::string_view text);
  std::string to_string() const;
};

// ---- checkpoint hooks -------------------------------------------------------------------------
// The PS layer knows no file format: the strategy layer's checkpoint glue fills these hooks, and the
// PS layer calls them at the right moments (docs/ARCHITECTURE.md, "The path of one training step",
// step 5; the file: checkpoint/FORMAT.md).

// One shard held by this PS, as it is restored into or saved from its arena.
struct ShardBuffers {
  const Shard* shard = nullptr;
  void* values = nullptr;           // shard->bytes
  std::vector<void*> slots;         // one per slot_names(the variable's optimizer: its own, else the
                                    // job's), same bytes; empty if not trainable
  std::int64_t optimizer_step = 0;  // updates applied to this shard (Adam's t); in/out
};

// Where one worker is in its input (saved with every checkpoint so a resume neither replays nor
// skips data): `offset` examples of its shard of `epoch` consumed, `step` steps done in total.
struct WorkerPosition {
  std::int64_t epoch = 0;
  std::int64_t offset = 0;
  std::int64_t step = 0;
};

// What a save sees. Identical on every PS rank except `shards` (this PS's own).
struct SaveContext {
  std::int64_t save_number = 0;            // 1, 2, ... within this job
  std::int64_t global_step = 0;
  std::vector<WorkerPosition> positions;   // per worker (index = worker index)
  std::vector<ShardBuffers> shards;        // this PS's shards, in shard-map order
  bool final = false;                      // the save at the end of training
  bool stop = false;                       // the job stops after it (preemption)
};

// What one save did (CheckpointHooks::save), the same on every PS rank.
enum class SaveStatus {
  kSaved,    // a new checkpoint is committed
  kSkipped,  // nothing to write: the final save found this global step already saved in this job
  kFailed,   // the save failed on every PS rank alike; the previous checkpoint stays committed
};

struct CheckpointHooks {
  // Set identically on every rank when the job saves checkpoints: workers then stop at the agreed
  // step boundaries and the PS ranks save there (see PsClient::at_step_boundary).
  bool enabled = false;
  // PS ranks, after the variable list and placement are known, before anything is allocated: ""
  // when a pending restore can go ahead, else one line (e.g. a shape mismatch naming the variable).
  // The verdicts of all PS ranks become one ConfigError on every rank.
  std::function<std::string(const ShardMap& map)> check;
  // PS ranks, once per local shard during materialisation; slots already hold their initial
  // values. Fill what the checkpoint has; return true when `values` were restored (false: the
  // initializer fills them).
  std::function<bool(ShardBuffers& shard)> restore;
  // PS 0 only: the global step to start from; called once during materialisation.
  std::function<std::int64_t()> restore_global_step;
  // COLLECTIVE over the PS ranks (Communicators::ps()): writes one checkpoint from the shards of a
  // quiesced job and returns the same status on every PS rank (a failure it can agree on, such as
  // a full disk, is kFailed, reported by the hook itself). Throwing is fatal for the job (the
  // previous checkpoint stays committed).
  std::function<SaveStatus(const SaveContext& context)> save;
  // Every rank, identically: after a kFailed save the workers stop training as after a preemption
  // save (PsClient::Boundary::stop), and every rank ends with save_error_stopped() true. false: training
  // continues, the failure only counted (save_failures()).
  bool stop_on_save_error = true;
  // Dynamic variables (checkpoint/FORMAT.md section 10.7). Ignored by jobs without any.
  // Set identically on every rank. Non-empty: every save first writes the dynamic tables to
  // <dynamic_dir>/dynamic-<global step>.h5 (the PS ranks send their shards to PS 0, which writes
  // the one file), and only then calls `save`; the dense state is committed only after the tables
  // are, so a committed dense checkpoint always has its tables. A save whose tables fail to write
  // is kFailed on every PS rank without calling `save`; a tables file whose dense save then fails
  // is removed again.
  std::string dynamic_dir;
  // The first save of a job, and then every dynamic_full_every-th, writes every table full; the
  // others write deltas (the rows changed since the previous save and the ids evicted since). >= 1.
  std::int64_t dynamic_full_every = 8;
  // >= 0: PS ranks restore the tables during materialisation (before allocation; a failure is a
  // ConfigError on every rank) from the chains in dynamic_restore_dir at this global step (the
  // dense checkpoint's), each keeping its shard's ids. A damaged link falls back to the newest
  // complete state below it, and PS 0 prints one line saying so.
  std::string dynamic_restore_dir;
  std::int64_t dynamic_restore_step = -1;
};

struct PsOptions {
  // The job's optimizer: every variable without its own (VariableSpec::optimizer) and every
  // dynamic variable.
  OptimizerConfig optimizer = OptimizerConfig::defaults(OptimizerKind::kSgd);
  ConsistencyConfig consistency;
  PlacementPolicy placement = PlacementPolicy::kRoundRobin;
  std::string transport = "auto";
  double timeout_s = 60.0;  // every wait (acks, staleness, barriers) names who is late after this
  // 0: no cap; otherwise a PS arena above this many bytes is refused (STRATA_PS_MAX_ARENA_BYTES).
  std::uint64_t max_arena_bytes = 0;
  // PS ranks: threads that apply a stateful optimizer to one large shard together (the service
  // loop's own thread counts as one). 1 keeps everything on the loop's thread. Results are
  // bit-identical for any value (the updates are element-wise). STRATA_PS_THREADS, --ps-threads.
  int apply_threads = 1;
  // How long a worker waits for the PS ranks to write a checkpoint (the job is stopped meanwhile).
  double save_timeout_s = 900.0;
  CheckpointHooks checkpoint;
};

struct PsCore;
struct ServerCore;
struct ClientCore;

// What a PS's service loop did: `busy_s` is time spent applying the optimizer (and summing sync
// rounds), not counting the progress calls made between chunks; busy_s over the training time is
// the PS's utilisation, the quantity docs/SCALING.md uses to size the number of PS ranks. Async
// SGD pushes are MPI accumulates that never pass through the loop: they count nowhere here.
struct ServeStats {
  std::int64_t updates = 0;   // optimizer applications (one per shard per push or sync round)
  std::int64_t elements = 0;  // parameter elements (or row elements) updated, summed
  double busy_s = 0;
  std::int64_t split_updates = 0;  // applications split over the apply team (--ps-threads)
  std::int64_t max_threads = 1;    // most threads one application used
};

// One PS's part of a dynamic variable (counters of its DynamicTable, docs/DYNAMIC.md).
struct DynamicShardStats {
  std::int64_t rows = 0;              // live rows now
  std::int64_t admitted = 0;          // rows created for admitted ids
  std::int64_t lookups = 0;           // ids looked up (training and inference)
  std::int64_t updates = 0;           // row updates applied (one per distinct id of a batch)
  std::int64_t rejected_lookups = 0;  // training lookups answered with zeros (not admitted yet)
  std::int64_t rejected_updates = 0;  // gradients dropped (not admitted yet)
  std::int64_t rejected_full = 0;     // ids refused at capacity
  std::int64_t evicted_ttl = 0;
  std::int64_t evicted_capacity = 0;
  std::int64_t bytes = 0;             // memory the table holds
  std::int64_t requests = 0;          // lookup and update requests served
  // The PS thread's time in the table, for the data plane's figures: lookup requests that created
  // no row (a lookup that creates rows costs their initializers too), and updates (a sync round
  // counts as one request).
  double lookup_s = 0;
  std::int64_t lookup_requests = 0;
  double update_s = 0;
  std::int64_t update_requests = 0;
  std::int64_t split_batches = 0;     // lookups and updates split over the PS's threads (--ps-threads)
  // Checkpoints (CheckpointHooks' dynamic fields): the global step this shard was restored at
  // (-1: not restored), and the step of the last save that committed its rows (-1: none yet).
  std::int64_t restored_step = -1;
  std::int64_t saved_step = -1;
};

// How a lookup of a dynamic variable treats ids without a row.
enum class DynamicLookup {
  kTrain,      // counts the ids for admission and creates the rows of admitted ids
  kInference,  // reads only: a missing row reads as zeros; nothing counted or created
};

// What both roles share: the placement, the transport, the job-wide barrier and the checkpoint
// outcomes. Destroying one is collective over the job (it frees the region).
class PsEndpoint {
 public:
  virtual ~PsEndpoint();
  PsEndpoint(const PsEndpoint&) = delete;
  PsEndpoint& operator=(const PsEndpoint&) = delete;

  const ShardMap& shard_map() const;
  int num_workers() const;
  // The data-plane transport this job uses and why it was chosen, in words (identical on every
  // rank): "tcp: 3 node(s): intra-node shared memory ..., inter-node TCP ... [auto: ...]".
  std::string transport_description() const;
  // COLLECTIVE over every rank of the job (PS ranks and workers). A barrier that keeps this rank's
  // transport progressing while it waits: over transports whose one-sided operations need the
  // target's help (UCX over TCP, between nodes), a PS in a plain MPI_Barrier would stall workers
  // still pulling from it. Throws TimeoutError after PsOptions::timeout_s.
  void barrier();
  // Preemption: record that this rank (any role) got a signal; the chief reads the job-wide count.
  void report_preemption();
  std::int64_t preemption_reports();
  // Saves that failed (SaveStatus::kFailed), as seen by this rank (worker or PS).
  std::int64_t save_failures() const;
  // A failed save stopped the job (CheckpointHooks::stop_on_save_error): exit with status 1.
  bool save_error_stopped() const;

 protected:
  explicit PsEndpoint(std::unique_ptr<PsCore> core);
  std::unique_ptr<PsCore> core_;

 private:
  friend struct ParameterServersTestPeer;  // tests: raw words into a PS arena (src/ps/test_peer.h)
};

// A PS rank's part: the service loop that applies the workers' pushes and takes the checkpoint
// saves.
class PsServer final : public PsEndpoint {
 public:
  ~PsServer() override;
  int ps_index() const;
  // The service loop. Returns once every worker has called done() and every update they pushed
  // is applied. An idle PS waits as long as the job runs: the deadlines sit in the workers' waits,
  // and a dead worker ends the job through mpirun/srun (fail-stop).
  // Returns true when the job was stopped by a preemption save (see PsClient::at_step_boundary),
  // false when training ran to its end. Every word a worker wrote into this PS's arena (inbox row
  // counts and row indices, doorbells, chunk counters, save-protocol words) is checked before it
  // is used; a malformed one throws Error naming the worker (task and rank), the shard and the
  // value, before anything of it is applied: the caller ends the job (fail-stop).
  bool serve();
  // Statistics of this PS's service loop.
  std::int64_t applied_updates() const;
  // This PS's part of dynamic variable `name` (its shard of the ids): the table's counters.
  // Error for an unknown name. Read it on the PS's own thread (after serve() returned, say).
  DynamicShardStats dynamic_stats(std::string_view name) const;
  // The job's dynamic variables (the chief's list, declaration order): the names dynamic_stats takes.
  const std::vector<DynamicVariableSpec>& dynamic_variables() const;

 private:
  friend struct ParameterServers;
  explicit PsServer(std::unique_ptr<ServerCore> core);
  ServerCore& core();
  const ServerCore& core() const;
};

// A chief's or worker's part: the data plane, the clocks and the checkpoint boundaries.
class PsClient final : public PsEndpoint {
 public:
  ~PsClient() override;
  int worker_index() const;  // this worker's index among chief + workers

  // Waits until every push this worker made has been applied (each shard's wait has the job's
  // timeout and names the PS). After it returns on every worker (and a barrier), the variables
  // and ps_stats() include every update of the job.
  void wait_applied();
  // Every PS's ServeStats so far, in PS order, read from the PS regions (one-sided; the PS
  // publishes them before acknowledging each application). Not collective. The words are read
  // one by one, so mid-training they are not one snapshot; after wait_applied on every worker and
  // a barrier they are exact.
  std::vector<ServeStats> ps_stats();

  // Dense pull of the whole (logical, reassembled) variable into `dst` (its full byte size).
  // Under sync consistency it first waits until this worker's pushed rounds are applied (above).
  void pull(std::string_view variable, void* dst, std::size_t bytes);
  // Dense pulls of several variables with one completion wait for all of them (between nodes,
  // one network round trip for the lot instead of one per variable).
  //   In place (`in_place` non-null): under sync consistency, a variable held in one shard by a
  //   PS on this node is not copied: *in_place points at the PS's own values (Transport::local_view)
  //   and dst is left alone; otherwise *in_place is nullptr and dst is filled. Those values are
  //   this worker's settled round and do not change until this worker pushes the variable again
  //   (the PS applies a sync round only once every worker pushed it), so the caller reads them
  //   only until its next push of that variable. Never in place under async or staleness:N, where
  //   the PS applies while workers compute.
  struct PullTarget {
    std::string_view variable;
    void* dst = nullptr;
    std::size_t bytes = 0;
    const void** in_place = nullptr;
  };
  void pull_many(const std::vector<PullTarget>& targets);
  // Done reading an in-place pull's values for this step (before pushing the variable): lets the
  // transport write the lines out of this core's caches (Transport::release_view). Not collective.
  void release_in_place(const void* values, std::size_t bytes);
  // Dense push of a gradient of the variable's full shape and dtype.
  void push(std::string_view variable, const void* grad, std::size_t bytes);
  // Rows along axis 0: pull rows (in the order given, duplicates allowed) into dst, packed.
  void pull_rows(std::string_view variable, const std::vector<std::int64_t>& rows, void* dst, std::size_t bytes);
  // Push packed row gradients; duplicate rows are summed before the update (TF semantics).
  void push_rows(std::string_view variable, const std::vector<std::int64_t>& rows, const void* grads,
                 std::size_t bytes);
  // Writes values straight into the variable (all shards), bypassing the optimizer: for
  // non-trainable variables and tests.
  void assign(std::string_view variable, const void* values, std::size_t bytes);

  // ---- dynamic variables (DynamicVariableSpec) ----
  // The ids are deduplicated, grouped per PS (shard_of(id, num_ps)), and every PS's request is
  // sent before any answer is waited for: one round trip per PS (more only when a PS gets more
  // distinct ids than the spec's max_ids, which are sent in several requests). Every wait has the
  // job's timeout and names the PS. Ids are any int64; n == 0 is a no-op except under sync (below).
  // Errors (strata::Error): unknown variable, null pointers with n > 0, step < 1.
  //
  // Rows of ids[0..n) into out[i * dim ..] in the caller's order (duplicates get the same row).
  void lookup_dynamic(std::string_view variable, const std::int64_t* ids, std::size_t n, float* out,
                      DynamicLookup mode = DynamicLookup::kTrain);
  // One optimizer update of the rows of ids[0..n) with gradient rows grads[i * dim ..]: the
  // gradients of a repeated id are summed in order of appearance (from the first), then its row
  // gets one update; `step` (>= 1) is the optimizer's step (Adam's t) and the rows' stamp.
  // Returns once every PS applied it. Sync consistency: every worker calls it once per step (with
  // n == 0 if it has nothing), and a PS applies a round's batches in worker order once all of them
  // arrived, so the result equals one table fed worker 0's batch, then worker 1's, ... each step;
  // it returns once the whole round is applied. Async: applied as each arrives.
  void update_dynamic(std::string_view variable, const std::int64_t* ids, std::size_t n, const float* grads,
                      std::int64_t step);
  // Floats per row of dynamic variable `variable` (Error when unknown).
  std::int64_t dynamic_dim(std::string_view variable) const;

  // Global step on PS 0: read, and fetch-and-add by one (returns the new value).
  std::int64_t global_step();
  std::int64_t increment_global_step();
  // Ends this worker's step: advances its clock and, under staleness:N, waits until it is at most
  // N steps ahead of the slowest worker. Returns this worker's clock.
  std::int64_t end_step();
  // Largest (own clock - slowest clock) observed when end_step() returned: the bound holds when this
  // never exceeds N. Observed, not exhaustive: to keep end_step O(1) remote operations, the W
  // clocks are read only when staleness:N needs them and otherwise every 16th step.
  std::int64_t max_observed_staleness() const;
  // Reads every worker's clock on PS 0 (W remote atomics, so not for every step at scale) and
  // returns the slowest. For tests and diagnostics: after end_step() under staleness:N, this
  // worker's clock minus slowest_clock() is at most N.
  std::int64_t slowest_clock();
  // Signals the PS ranks that this worker is finished. Call once, after its last push (and after
  // finish_checkpoints() when checkpointing).
  void done();

  // ---- checkpoints (only when options.checkpoint.enabled) ----
  // A save is taken at a consistent point of the PS state: every worker stops at one of its step
  // boundaries, waits until the PS ranks applied all its pushes, records its WorkerPosition and
  // arrives; once all arrived, the PS ranks save collectively and release the workers. The saved
  // state holds exactly each worker's steps up to its recorded position (a step in progress when
  // the save was requested is in: the worker joins after it), and the global step counts exactly
  // those steps. The chief decides when (request_save); every worker takes part in every save, in
  // order.
  //   Agreement: the chief posts request n with a target clock. Sync: c+2 (c = the chief's clock,
  //   posted after its push of round c): no worker can have reached c+2 before the post (round
  //   c+2 starts by reading what round c+1 applied, which needs the chief's next push), so each
  //   joins exactly at c+2, and the wait for the others is part of sync's lockstep. (c+1 would
  //   race: a worker needs only round c to finish round c+1, and may pass that boundary before the
  //   post.) This assumes a sync worker reads the parameters, or waits for its update, in every
  //   step, as the training loop does. Async and staleness:N: 0, so
  //   each worker joins at its own next boundary, whatever its clock: workers' saved steps differ,
  //   and a save pauses every worker for at most the longest step in progress plus the write, never
  //   until a slow worker reaches a fast one's step. Under staleness:N a worker whose end_step is
  //   waiting for the slowest worker (which may be sitting at the save) joins the save first and
  //   finishes the wait after it (at_step_boundary).
  //   Waits: for the other workers to arrive, --timeout without progress of the global step (past
  //   it, a TimeoutError names the workers not arrived); for the write, max(save_timeout_s,
  //   timeout_s).
  struct Boundary {
    bool saved = false;    // this boundary took part in a save
    bool stop = false;     // stop training now: a preemption save, or a failed save under stop_on_save_error
    bool failed = false;   // that save failed (SaveStatus::kFailed)
    bool skipped = false;  // that save had nothing to write (SaveStatus::kSkipped)
  };
  // Chief only: ask for a save (no-op if one is already pending): at each worker's next boundary,
  // under sync two rounds ahead (the boundary of round clock + 2, see Agreement). `stop`: the
  // workers stop after it and serve() returns true on the PS ranks.
  void request_save(bool stop);
  bool save_pending() const;
  // After end_step() (mandatory when checkpointing: under staleness:N it may finish end_step's
  // wait): joins the pending save when this boundary is its turn.
  Boundary at_step_boundary(const WorkerPosition& position);
  // After the last step: takes part in every save the chief still requests, ending with the final
  // save, which the chief requests here. Returns when that save is committed.
  //   The chief, done before slower workers (async and staleness:N), keeps requesting the periodic
  //   saves while they train: `due` (called on the chief only, between polls) returns 0 when no
  //   save is due, 1 for a periodic save, 2 for a stop save (preemption); the workers still
  //   training join each at their next step boundary, so a failure then loses no more than one
  //   save interval. The final save follows once every worker finished training (or, should the
  //   global step stop moving for --timeout, at once: its wait names the workers not arrived).
  Boundary finish_checkpoints(const WorkerPosition& position, const std::function<int()>& due = {});
  // Saves this job committed so far (as seen by this worker; skipped and failed saves not counted).
  std::int64_t saves_completed() const;
  // How long the saves joined at training step boundaries (at_step_boundary) paused this worker,
  // from the boundary to the commit: its own quiesce, the wait for the other workers to arrive,
  // and the write. The saves joined in finish_checkpoints() (after training) not counted.
  struct SavePauses {
    std::int64_t saves = 0;
    double total_s = 0;
    double max_s = 0;
  };
  SavePauses save_pauses() const;

 private:
  friend struct ParameterServers;
  explicit PsClient(std::unique_ptr<ClientCore> core);
  ClientCore& core();
  const ClientCore& core() const;
};

// What materialize hands one rank: a PS rank gets `server`, a chief or worker `client`, and a rank
// of neither role (an evaluator) `bystander`, which only holds its share of the collective region;
// the others are null. Destroying it is collective (through the part it holds).
struct ParameterServers {
  // Collective over the runtime's communicator (see the lifecycle above). `specs` is read on the
  // chief and workers and ignored on PS ranks.
  // `dynamic`: the dynamic variables (same rules: read on the chief and workers, compared across
  // them, ignored on PS ranks). Without any, the arenas are exactly what they are without this
  // argument.
  static ParameterServers materialize(const Runtime& runtime, const PsOptions& options,
                                      const std::vector<VariableSpec>& specs,
                                      const std::vector<DynamicVariableSpec>& dynamic = {});

  std::unique_ptr<PsServer> server;
  std::unique_ptr<PsClient> client;
  std::unique_ptr<PsEndpoint> bystander;

  bool is_ps() const { return server != nullptr; }
  // The part this rank holds, as what every role shares.
  PsEndpoint& endpoint() {
    if (server) return *server;
    if (client) return *client;
    return *bystander;
  }
};

// Serialises variable specs (every field, exactly) to JSON and back: how the chief ships its
// variable list to the PS ranks, and how workers compare theirs.
std::string specs_to_json(const std::vector<VariableSpec>& specs);
std::vector<VariableSpec> specs_from_json(const std::string& json);
// The same for dynamic variable specs (from_json: Error on a malformed list, ConfigError on an
// invalid spec).
std::string dynamic_specs_to_json(const std::vector<DynamicVariableSpec>& specs);
std::vector<DynamicVariableSpec> dynamic_specs_from_json(const std::string& json);

}  // namespace strata::ps
