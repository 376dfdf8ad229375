// ParameterServerStrategy: TensorFlow's tf.distribute.experimental.ParameterServerStrategy in C++.
//
//   strata::MpiSession mpi(&argc, &argv);
//   auto runtime = strata::Runtime::bootstrap(MPI_COMM_WORLD, strata::Env::from_process(), {});
//   strata::ParameterServerStrategy strategy(*runtime, options);
//   strata::Variable w, b;
//   strategy.scope([&] {                       // variables created here live on the PS ranks
//     w = strategy.create_variable(kernel_spec);
//     b = strategy.create_variable(bias_spec);
//   });                                        // outermost scope exit: collective materialisation
//   if (strategy.is_ps()) { strategy.serve(); return 0; }
//   for (...) strategy.run([&](strata::ReplicaContext& ctx) {
//     ctx.read(w, w_host);                     // pulled once per worker, shared by its replicas
//     ... forward/backward on this replica's slice of the batch ...
//     ctx.apply_gradient(w, dw);               // MEAN across replicas, pushed once per worker
//   });
//   strategy.finish();
//
// Semantics: between-graph replication (every worker creates the same variables in the same order;
// checked), asynchronous between workers (or staleness:N / sync, PsOptions::consistency),
// synchronous between the replicas of one worker. num_replicas_in_sync() is the number of replicas
// of this worker, as in TF2's ParameterServerStrategy: one per GPU it uses (StrategyOptions::gpus,
// from choose_replica_gpus) or StrategyOptions::cpu_replicas CPU threads.
// Threading: the strategy is driven by one thread; run() calls `fn` on one thread per replica and
// the ReplicaContext collectives synchronise those threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "strata/data/dataset.h"
#include "strata/ps/parameter_servers.h"
#include "strata/replica/replica_group.h"

namespace strata {

class Runtime;
class Env;
namespace cluster {
struct ResolvedCluster;
}

using replica::ReduceOp;

// A host tensor: row-major values and their shape.
struct Tensor {
  std::vector<float> values;
  std::vector<std::int64_t> shape;
};

// One value per replica, indexed by replica_id_in_sync_group.
template <typename T>
using PerReplica = std::vector<T>;

// A variable created in scope. A value type naming the variable; reads and updates go through the
// strategy or a ReplicaContext.
class Variable {
 public:
  Variable() = default;
  const std::string& name() const { return spec_.name; }
  const ps::Shape& shape() const { return spec_.shape; }
  ps::DType dtype() const { return spec_.dtype; }
  bool trainable() const { return spec_.trainable; }
  std::int64_t num_elements() const { return ps::num_elements(spec_.shape); }
  const ps::VariableSpec& spec() const { return spec_; }

 private:
  friend class ParameterServerStrategy;
  ps::VariableSpec spec_;
};

// A dynamic embedding table created in scope (ps::DynamicVariableSpec, docs/DYNAMIC.md): rows of
// dim() floats keyed by arbitrary int64 ids, sharded over the PS ranks by a hash of the id. A value
// type naming the variable; lookups and updates go through the strategy or a ReplicaContext.
class DynamicVariable {
 public:
  DynamicVariable() = default;
  const std::string& name() const { return spec_.name; }
  std::int64_t dim() const { return spec_.dim; }
  const ps::DynamicVariableSpec& spec() const { return spec_; }

 private:
  friend class ParameterServerStrategy;
  ps::DynamicVariableSpec spec_;
};

// Checkpoints (format: checkpoint/FORMAT.md; TF's CheckpointManager and Checkpoint.restore). The PS ranks
// write `<directory>/ckpt-<global_step>.h5` collectively with parallel HDF5 while the job is
// quiesced at a step boundary (ps::PsClient::at_step_boundary), so a checkpoint is one
// consistent state: every push of every worker up to its recorded position applied, nothing after.
struct CheckpointOptions {
  std::string directory;              // "" = no checkpoints
  // Saves: every N global steps and/or T seconds (the chief decides), and always a final one in
  // finish() after the last step. Under sync consistency a save lands on a round boundary: the
  // save at round c (this job's c-th step of every worker) holds exactly G0 + W * c global steps
  // (G0: the step the job started or restored at, W: the workers), and the steps schedule is
  // deterministic: a save is due at the first round whose global step reaches the previous save's
  // (or G0) plus N, but no sooner than two rounds after it. Async and staleness:N: the chief
  // checks the global step it reads at each of its boundaries.
  std::int64_t save_every_steps = 0;  // 0: off
  double save_every_secs = 0;         // and/or every T seconds (0: off)
  int max_to_keep = 5;                // 0: keep every checkpoint
  double keep_every_n_hours = 0;      // see checkpoint::SaveOptions
  // SIGTERM / SIGUSR1: every rank notes it, the chief asks for a save at the next boundary, and
  // the job stops after it (StepOutcome::stop, serve() returning true): exit with kExitPreempted.
  bool handle_signals = true;
  // A save that fails on every PS rank alike (checkpoint::SaveError: no space left, I/O error):
  // PS 0 reports it in one line naming the file and the reason, the previous checkpoint stays
  // committed, and then either the job stops (true: StepOutcome::stop, save_error_stopped(), exit
  // with status 1) or training goes on (false: one WARNING line per failed save).
  bool stop_on_save_error = true;
};

struct RestoreOptions {
  // Silences the report of checkpoint variables the model does not create (TF's expect_partial).
  bool expect_partial = false;
  // Restore from format 1 files too; they have no integrity block, so HDF5 parses them before
  // anything can be checked (checkpoint::VerifyOptions::allow_unverified; --allow-unverified).
  bool allow_unverified = false;
};

// What a restore did, known on every rank after the outermost scope() (collective report).
struct RestoreReport {
  std::string path;                       // the file restored
  std::int64_t global_step = 0;
  std::vector<std::string> restored;      // model variables read from the checkpoint
  std::vector<std::string> initialized;   // model variables absent from it: initializer
  std::vector<std::string> unused;        // checkpoint variables the model does not create
  std::vector<std::string> fresh_slots;   // "var/slot" optimizer slots absent from it: initial value
  std::vector<std::string> skipped;       // newer checkpoints that failed verification, with why
  std::vector<ps::WorkerPosition> positions;  // per worker of the saving job
};

// Result of ParameterServerStrategy::end_step.
struct StepOutcome {
  bool saved = false;  // this boundary took part in a checkpoint save
  // Stop training (then finish()): a preemption save happened (exit 75), or a save failed under
  // stop_on_save_error (save_failed; exit 1).
  bool stop = false;
  bool save_failed = false;  // that save failed (the previous checkpoint stays committed)
};

struct StrategyOptions {
  ps::PsOptions ps;
  int cpu_replicas = 1;  // replicas per worker when it runs CPU replicas (--cpu-replicas)
  // GPU replicas: one replica per listed device (indices into the CUDA devices this process sees,
  // see choose_replica_gpus), gradients all-reduced with NCCL; cpu_replicas is then ignored.
  // Empty: cpu_replicas CPU replicas. Ignored on PS ranks.
  std::vector<int> gpus;
};

// Which devices a worker's replicas run on (`strata train --devices`).
enum class DevicePolicy {
  kAuto,  // GPU replicas when the worker sees a GPU, else CPU replicas
  kCpu,   // CPU replicas (threads), StrategyOptions::cpu_replicas of them
  kGpu,   // GPU replicas; a worker that sees no GPU is a configuration error
};
// "auto" | "cpu" | "gpu"; ConfigError naming `what` otherwise.
DevicePolicy parse_device_policy(const std::string& text, const std::string& what = "--devices");
const char* to_string(DevicePolicy policy);

// The GPUs this rank's replicas use, for StrategyOptions::gpus. Collective over the whole job:
// every rank calls it with the same policy (no communication at all for kCpu). Empty on PS and
// evaluator ranks, for kCpu, and for kAuto on a worker that sees no GPU. Otherwise the worker's
// share of the GPUs it sees (replica::visible_gpu_count(), i.e. after CUDA_VISIBLE_DEVICES): the
// ranks exchange their CUDA_VISIBLE_DEVICES, and the workers on one host (PS ranks excluded)
// split the visible GPUs with replica::select_worker_devices: contiguous blocks by node-local
// worker index when they all see the same GPUs, every visible GPU when the launcher gave each
// worker its own (srun --gpus-per-task, a per-rank CUDA_VISIBLE_DEVICES).
// Errors: ConfigError, on a worker with kGpu that sees no GPU, naming the worker, its host and
// replica::gpu_unavailable_reason(); it is raised after the exchange, so every rank has left the
// collective and the caller can agree on the verdict without a hang. TimeoutError naming the
// ranks that did not arrive within timeout_s.
std::vector<int> choose_replica_gpus(const Runtime& runtime, const Env& env, DevicePolicy policy, double timeout_s);

class ParameterServerStrategy;

struct DistributeOptions {
  int global_batch = 128;     // examples per worker step, split over its replicas
  std::uint64_t seed = 1;     // shuffle seed; the order of epoch e depends on (seed, e)
  bool shuffle = true;
  bool drop_remainder = true;
  int prefetch = 2;           // batches prepared ahead by a background thread
};

// Input read as a stream, a batch at a time, never whole in memory (TF's tf.data pipelines over
// files larger than memory). Both functions shard for themselves, as distribute_datasets_from_
// function's does, from the input context (num_input_pipelines workers, this one
// input_pipeline_id): `source` makes this worker's batches of one epoch (DistributeOptions::
// global_batch examples each, in that epoch's order), `examples` counts the examples its share
// holds per epoch (the training loop agrees the steps per epoch across workers from it).
struct StreamingInput {
  std::function<data::BatchIterator::Source(const data::InputContext& ctx, int epoch)> source;
  std::function<std::int64_t(const data::InputContext& ctx)> examples;
  // Optional, for an input whose share every worker would otherwise count by reading all of it
  // (DATA sharding of files): shared_parts(ctx) says how many parts (files) the count splits into
  // (0: call `examples` instead; the same on every worker), count_part(p) counts part p, and
  // examples_of(ctx, rows) gives this worker's examples from every part's count. distribute_stream
  // then has each part counted once, part p by worker p % workers, and exchanges the counts.
  // part_bytes(p), when set, is part p's size: the exchange then waits, beyond the timeout, one
  // second per kCountBytesPerSecond that the busiest worker counts (the workers' shares of the
  // count differ, and an early worker must not take a later one's counting for a lost rank).
  std::function<std::int64_t(const data::InputContext& ctx)> shared_parts;
  std::function<std::int64_t(std::int64_t part)> count_part;
  std::function<std::int64_t(const data::InputContext& ctx, const std::vector<std::int64_t>& part_rows)> examples_of;
  std::function<std::uint64_t(std::int64_t part)> part_bytes;
  // A counting rate about a hundredth of a warm page cache's (docs/DATA.md): a cold or shared file
  // system is allowed that much slower before a worker is taken for lost.
  static constexpr double kCountBytesPerSecond = 4e6;
};

// A dataset distributed over the workers (TF's DistributedDataset): each worker iterates its own
// shard; each step yields one batch per replica of this worker. Movable, not copyable.
class DistributedDataset {
 public:
  // Starts epoch `epoch`: this worker's shard of it, in the epoch's shuffled order, skipping its
  // first `skip_examples` examples (resuming from a checkpoint's position; the order does not
  // depend on the skip, so the resumed epoch continues exactly where the saved one stopped).
  // examples_this_epoch() still counts the whole shard.
  void start_epoch(int epoch, std::int64_t skip_examples = 0);
  // The next step's batches, one per replica (earlier replicas take the extra examples of a partial
  // batch; a replica can get an empty batch at the very end). false once the epoch is exhausted.
  bool next(PerReplica<data::Batch>& out);
  data::AutoShard policy() const { return policy_; }  // AUTO resolved to FILE or DATA
  std::int64_t examples_this_epoch() const { return examples_; }

 private:
  friend class ParameterServerStrategy;
  std::shared_ptr<const data::Dataset> dataset_;
  StreamingInput stream_;      // distribute_stream: batches come from stream_.source
  data::InputContext context_;
  data::AutoShard policy_ = data::AutoShard::kData;
  DistributeOptions options_;
  int workers_ = 1, worker_ = 0, replicas_ = 1;
  std::int64_t examples_ = 0;
  std::unique_ptr<data::BatchIterator> iterator_;
};

// What a replica sees inside run(). Every method that says "collective" must be called by all
// replicas of this worker, in the same order.
class ReplicaContext {
 public:
  int replica_id_in_sync_group() const { return replica_; }
  int num_replicas_in_sync() const;

  // The CUDA device this replica runs on (an index into the visible devices); -1 for a CPU replica.
  int device() const;

  // Collective: in-place SUM or MEAN of host memory across this worker's replicas (deterministic
  // order), for CPU and GPU replicas alike.
  void all_reduce(ReduceOp op, float* data, std::size_t n);
  void all_reduce(ReduceOp op, std::vector<float>& values) { all_reduce(op, values.data(), values.size()); }
  // Collective: the same on memory of this replica's device: device memory of its GPU (reduced with
  // NCCL) for GPU replicas, host memory for CPU replicas.
  void all_reduce_on_device(ReduceOp op, float* data, std::size_t n);

  // Collective: the variable's current value; the first replica pulls it, the others share it.
  void read(const Variable& var, std::vector<float>& out);
  // Collective: the current values of `vars` concatenated in that order in one host buffer that all
  // replicas share, without a copy per replica: the first replica pulls each variable once. The
  // pointer is read-only and valid until this replica's next read() or read_all(). For models whose
  // parameters live in one flat buffer (GPU replicas upload it with one copy).
  const float* read_all(const std::vector<Variable>& vars);
  // Collective: read() of several variables at once, out[i] getting vars[i]; the pulls share one
  // completion wait (between nodes one round trip for all of them instead of one per variable).
  void read_many(const std::vector<Variable>& vars, const std::vector<std::vector<float>*>& out);
  // read_many, reading in place where it can (ps::PsClient::PullTarget's `in_place`: sync
  // consistency, one replica per worker, a variable in one shard on a PS of this node):
  // in_place[i] is then the PS's own values of vars[i] and out[i] is left alone, else nullptr
  // and out[i] is filled. In-place values are valid until this worker pushes that variable again.
  void read_many(const std::vector<Variable>& vars, const std::vector<std::vector<float>*>& out,
                 std::vector<const float*>& in_place);
  // Done reading in-place values (from the form above) for this step, before pushing them:
  // ps::PsClient::release_in_place. Not collective.
  void release_in_place(const float* values, std::size_t count);
  // Rows of a (sparse) variable; each replica asks for its own rows. Not collective; thread-safe
  // (the replicas' requests to the PS are serialised).
  void read_rows(const Variable& var, const std::vector<std::int64_t>& rows, std::vector<float>& out);
  // Collective: MEAN-reduces `grad` across replicas, then the first replica pushes it once.
  void apply_gradient(const Variable& var, std::vector<float>& grad);
  // Collective: apply_gradient for several variables whose gradients lie concatenated, in the order
  // of `vars`, in one buffer of n floats (n must be the sum of their sizes) in this replica's device
  // memory (host memory for CPU replicas). One MEAN all-reduce across the replicas (NCCL for GPU
  // replicas; the mean divides by num_replicas_in_sync, which is the gradient of the mean loss over
  // the worker's batch when the replicas' slices are equal, as distribute_dataset makes them),
  // then the first replica stages the result to host and pushes each trainable variable once.
  // On return `grads` holds the reduced gradient on every replica.
  void apply_gradients_flat(const std::vector<Variable>& vars, float* grads, std::size_t n);
  // Collective: every replica's rows are gathered (gradients divided by the replica count, so the
  // push is the mean over replicas, as for dense gradients) and the first replica pushes them once.
  void apply_sparse_gradient(const Variable& var, const std::vector<std::int64_t>& rows,
                             const std::vector<float>& grads);
  // Rows of dynamic variable `var` for ids[0..n) (any int64; duplicates get the same row) into
  // out (n * dim floats, resized), in the caller's order. Not collective; thread-safe (the
  // replicas' requests are serialised). kTrain counts the ids for admission and creates admitted
  // rows; kInference only reads (a missing row reads as zeros).
  void lookup(const DynamicVariable& var, const std::vector<std::int64_t>& ids, std::vector<float>& out,
              ps::DynamicLookup mode = ps::DynamicLookup::kTrain);
  // Collective: every replica's ids and gradient rows (grads.size() == ids.size() * dim) are
  // gathered in replica order, each gradient divided by the replica count (the mean over
  // replicas, as for dense gradients), and the first replica sends one update_dynamic with
  // optimizer step `step` (>= 1). Under sync consistency every worker must call it once per step
  // and variable, even with no ids. Error on a size mismatch (before any replica waits).
  void apply_dynamic_gradient(const DynamicVariable& var, const std::vector<std::int64_t>& ids,
                              const std::vector<float>& grads, std::int64_t step);
  // Collective: the first replica increments the global step on PS 0; all replicas get the value.
  std::int64_t increment_global_step();

 private:
  friend class ParameterServerStrategy;
  ReplicaContext(ParameterServerStrategy& strategy, int replica) : strategy_(strategy), replica_(replica) {}
  // Collective over the replicas: gathers every replica's rows and gradient rows; replica 0 then
  // calls `send` once, under the PS client's lock, with the rows in replica order and the
  // gradients averaged over the replicas.
  void gather_rows(const std::vector<std::int64_t>& rows, const std::vector<float>& grads,
                   const std::function<void(const std::vector<std::int64_t>&, const std::vector<float>&)>& send);
  ParameterServerStrategy& strategy_;
  int replica_;
};

class ParameterServerStrategy {
 public:
  // Not collective. `runtime` must outlive the strategy.
  ParameterServerStrategy(const Runtime& runtime, StrategyOptions options);
  ~ParameterServerStrategy();  // collective once variables are materialised
  ParameterServerStrategy(const ParameterServerStrategy&) = delete;
  ParameterServerStrategy& operator=(const ParameterServerStrategy&) = delete;

  // Runs `body`; variables it creates are placed on the PS ranks. A nested call belongs to the
  // enclosing scope. When the outermost call returns, the variables are materialised: collective
  // over the whole job (PS ranks call scope() too; what they create is ignored, they receive the
  // chief's list). ConfigError on a creation-sequence mismatch between workers.
  void scope(const std::function<void()>& body);
  bool in_scope() const { return scope_depth_ > 0; }
  // Declares a variable; only inside scope(), only before materialisation.
  Variable create_variable(ps::VariableSpec spec);
  // Declares a dynamic embedding table (validated: ConfigError naming the field); only inside
  // scope(), only before materialisation. Collected with the dense variables and materialised with
  // them; every worker must declare the same dynamic variables in the same order, and a name may
  // not be used twice nor by a dense variable (checked at materialisation: ConfigError naming it).
  DynamicVariable create_dynamic_variable(ps::DynamicVariableSpec spec);
  // The dynamic variables declared so far (creation order).
  const std::vector<ps::DynamicVariableSpec>& dynamic_variables() const { return pending_dynamic_; }
  // TF's strategy.extended.colocate_vars_with(var): variables created in `body` share var's PS.
  void colocate_vars_with(const Variable& var, const std::function<void()>& body);
  ParameterServerStrategy& extended() { return *this; }

  const cluster::ResolvedCluster& cluster_resolver() const;
  bool is_ps() const;
  bool is_chief() const;
  int num_replicas_in_sync() const { return replicas_->size(); }
  // GPU replicas: the devices, replica r on gpus()[r]; empty for CPU replicas (and on PS ranks).
  const std::vector<int>& gpus() const { return gpus_; }
  bool uses_gpus() const { return !gpus_.empty(); }
  // "gpu:0,1" (the devices of the replicas) or "cpu:K" (K CPU replicas).
  std::string devices() const;
  // The group across the replicas' devices (NCCL across GPUs, else the host group): what device
  // models such as replica::GpuMlpReplica are built on.
  replica::ReplicaGroup& device_group() { return device_group_ ? *device_group_ : *replicas_; }
  int num_workers() const;
  int worker_index() const;  // among chief + workers; -1 elsewhere

  // PS ranks: the service loop; returns when every worker called finish(). true when the job was
  // stopped by a preemption save (exit with kExitPreempted).
  bool serve();
  // Workers, after the last step, with checkpoints: takes part in the saves the chief still
  // requests and in the final save (skipped when a preemption save stopped the job). Collective
  // over the workers; call it before any other wait on the other workers (a worker blocked
  // elsewhere would never arrive at a save). Idempotent.
  void finish_training(const ps::WorkerPosition& position);
  // Workers: the very end (pushes are complete when it returns); calls finish_training(position)
  // first if that did not happen yet. The PS ranks' serve() returns once every worker finished.
  void finish(const ps::WorkerPosition& position = {});

  // ---- checkpoints ----
  // Before the outermost scope() ends, on every rank with the same arguments.
  void set_checkpoint_options(const CheckpointOptions& options);
  const CheckpointOptions& checkpoint_options() const { return checkpoint_; }
  // Lazy restore: records `path` (a checkpoint file, or a directory meaning its newest checkpoint
  // that verifies) and materialisation reads each shard's rows straight into its PS arena. A
  // directory without any checkpoint is not an error: training starts from the initializers and
  // restore_report() stays empty. A missing path, a file that is not a checkpoint, or a variable
  // whose shape or dtype differs is a ConfigError on every rank, raised by scope().
  void restore(const std::string& path, const RestoreOptions& options = {});
  const std::optional<RestoreReport>& restore_report() const { return report_; }
  // This worker's position in the restored checkpoint (zeros without a restore; when the
  // checkpoint was written by a different number of workers, every worker restarts at the
  // beginning of the oldest epoch any of them was in).
  ps::WorkerPosition restored_position() const;
  // Workers, after each step: ends the step (staleness bookkeeping), lets the chief decide on a
  // save (steps, seconds, preemption), and takes part in a save when it is this boundary's turn.
  StepOutcome end_step(const ps::WorkerPosition& position);
  bool stopped() const { return stopped_; }
  // A failed save stopped the job (CheckpointOptions::stop_on_save_error): every rank exits with
  // status 1. Valid after serve() (PS) or the step / finish_training() that stopped (workers).
  bool save_error_stopped() const;
  // Workers, after finish_training(): the file holding the final state, when the final save
  // committed it or found it already saved (the chief reports it); "" otherwise.
  const std::string& final_checkpoint() const { return final_checkpoint_; }

  // Runs `fn` once per replica, each on its own thread (inline when there is one replica), and
  // returns the per-replica results. An exception in any replica is rethrown here.
  template <typename R>
  PerReplica<R> run(const std::function<R(ReplicaContext&)>& fn) {
    PerReplica<R> out(num_replicas_in_sync());
    run_replicas([&](ReplicaContext& ctx) { out[ctx.replica_id_in_sync_group()] = fn(ctx); });
    return out;
  }
  void run(const std::function<void(ReplicaContext&)>& fn) { run_replicas(fn); }
  // call_for_each_replica is TF's older name for run.
  void call_for_each_replica(const std::function<void(ReplicaContext&)>& fn) { run_replicas(fn); }

  // Cross-replica reduction with TF's semantics. axis = nullopt: element-wise over replicas (all
  // shapes equal; MEAN divides by the replica count). axis = k: the per-replica tensors are
  // concatenated along k and reduced along it (MEAN divides by the total extent along k, so a
  // partial last batch is weighted correctly).
  Tensor reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis = std::nullopt) const;
  template <typename T>
  const PerReplica<T>& local_results(const PerReplica<T>& value) const {
    return value;
  }

  // Input (TF's distribute_dataset / distribute_datasets_from_function). The input context has one
  // input pipeline per worker and this worker's replica count; the global batch must divide by
  // num_replicas_in_sync (ConfigError otherwise). `dataset` must outlive the result.
  data::InputContext input_context() const;
  DistributedDataset distribute_dataset(const data::Dataset& dataset, data::AutoShard policy,
                                        const DistributeOptions& options);
  // `fn` builds this worker's own dataset from the input context (it does its own sharding, as in
  // TF); the result is owned by the returned DistributedDataset and not sharded again.
  DistributedDataset distribute_datasets_from_function(const data::DatasetFn& fn, const DistributeOptions& options);
  // A streamed input (see StreamingInput); counts this worker's share once, here: collective over
  // the workers when the input shares its count (StreamingInput::shared_parts), its wait bounded
  // by the PS options' timeout plus the counting allowance (TimeoutError naming the missing
  // workers); a part that fails to count is the same error on every worker (a ConfigError stays
  // one). Epochs resume
  // only at batch boundaries (start_epoch's skip a multiple of the batch; Error otherwise), which
  // is where checkpoints record the position.
  DistributedDataset distribute_stream(const StreamingInput& input, const DistributeOptions& options);

  // Strategy-level (cross-replica context) reads and the global step.
  void read(const Variable& var, std::vector<float>& out);
  // Cross-replica lookup of dynamic rows (see ReplicaContext::lookup); workers only.
  void lookup(const DynamicVariable& var, const std::vector<std::int64_t>& ids, std::vector<float>& out,
              ps::DynamicLookup mode = ps::DynamicLookup::kTrain);
  // Cross-replica update of dynamic rows (ids, grads of ids.size() * dim floats, optimizer step
  // >= 1): PsClient::update_dynamic, returning once every PS applied it. Workers only.
  void update(const DynamicVariable& var, const std::vector<std::int64_t>& ids, const std::vector<float>& grads,
              std::int64_t step);
  std::int64_t global_step();
  // This rank's part of the parameter servers, once materialised (Error before): the client on the
  // chief and workers (Error on other ranks), and what every role shares.
  ps::PsClient& ps_client();
  ps::PsEndpoint& ps_endpoint();
  // The server part on a PS rank (Error before materialisation and on other ranks).
  ps::PsServer& ps_server();
  const Runtime& runtime() const { return runtime_; }

 private:
  // distribute_stream's count when the input shares it (see there).
  std::int64_t shared_count(const StreamingInput& input, const data::InputContext& ctx, std::int64_t parts);
  friend class ReplicaContext;
  void run_replicas(const std::function<void(ReplicaContext&)>& fn);
  void materialize();
  // Checkpoint glue (src/strategy/checkpointing.cc).
  struct CheckpointState;
  void prepare_checkpoint_hooks();
  void gather_restore_report();
  CheckpointOptions checkpoint_;
  std::optional<std::string> restore_path_;
  RestoreOptions restore_options_;
  std::optional<RestoreReport> report_;
  std::shared_ptr<CheckpointState> ckpt_state_;
  bool stopped_ = false;
  std::string final_checkpoint_;
  bool training_finished_ = false;
  std::int64_t last_save_global_step_ = 0;
  double last_save_time_ = 0;
  // Sync consistency, chief: the global step at this job's start (G0) and the round of the last
  // save (0: none yet), from which the steps schedule is computed without reading the global
  // step (which the other workers advance concurrently).
  std::int64_t sync_start_step_ = 0;
  std::int64_t last_save_round_ = 0;
  // Chief, sync: posts the next save (it lands two rounds after `round`) when it is due.
  void schedule_sync_save(std::int64_t round);

  const Runtime& runtime_;
  StrategyOptions options_;
  // The host group synchronises the replica threads and reduces host memory; with GPU replicas,
  // device_group_ (NCCL) reduces device memory across the same replicas.
  std::unique_ptr<replica::ReplicaGroup> replicas_;
  std::unique_ptr<replica::ReplicaGroup> device_group_;
  std::vector<int> gpus_;
  std::vector<float> staging_;  // the first replica's host copy of device gradients, for the push
  std::unique_ptr<ps::ParameterServers> ps_;
  std::vector<ps::VariableSpec> pending_;
  std::vector<ps::DynamicVariableSpec> pending_dynamic_;
  int scope_depth_ = 0;
  std::string colocate_with_;
  // Shared by the replicas of one collective (written by the first replica, read by all).
  std::vector<float> shared_;
  std::vector<std::vector<std::int64_t>> gathered_rows_;
  std::vector<std::vector<float>> gathered_grads_;
  std::int64_t shared_step_ = 0;
  std::mutex ps_mutex_;  // replicas share one PS client, which is single-threaded
};

}  // namespace strata
