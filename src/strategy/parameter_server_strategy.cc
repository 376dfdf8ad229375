#include "strata/strategy/parameter_server_strategy.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <thread>

#include "strata/cluster/runtime.h"
#include "strata/comm/group.h"
#include "strata/comm/mpi_group.h"
#include "strata/common/env.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/parse.h"
#include "strata/common/rank_context.h"
#include "strata/common/signals.h"
#include "strata/replica/gpu.h"

namespace strata {

// ---- ReplicaContext ---------------------------------------------------------------------------

int ReplicaContext::num_replicas_in_sync() const { return strategy_.num_replicas_in_sync(); }

int ReplicaContext::device() const {
  return strategy_.gpus_.empty() ? -1 : strategy_.gpus_[static_cast<std::size_t>(replica_)];
}

void ReplicaContext::all_reduce(ReduceOp op, float* data, std::size_t n) {
  strategy_.replicas_->all_reduce(replica_, data, n, op);
}

void ReplicaContext::all_reduce_on_device(ReduceOp op, float* data, std::size_t n) {
  strategy_.device_group().all_reduce(replica_, data, n, op);
}

const float* ReplicaContext::read_all(const std::vector<Variable>& vars) {
  auto& group = *strategy_.replicas_;
  std::size_t total = 0;
  for (const Variable& v : vars) total += static_cast<std::size_t>(v.num_elements());
  // Barrier first: nobody may still be reading the previous shared value.
  group.barrier(replica_);
  if (replica_ == 0) {
    strategy_.shared_.resize(total);
    std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
    std::vector<ps::PsClient::PullTarget> targets;
    std::size_t offset = 0;
    for (const Variable& v : vars) {
      const std::size_t n = static_cast<std::size_t>(v.num_elements());
      targets.push_back({v.name(), strategy_.shared_.data() + offset, n * sizeof(float)});
      offset += n;
    }
    strategy_.ps_client().pull_many(targets);
  }
  group.barrier(replica_);
  return strategy_.shared_.data();
}

void ReplicaContext::read_many(const std::vector<Variable>& vars, const std::vector<std::vector<float>*>& out) {
  if (out.size() != vars.size())
    throw Error("read_many: " + std::to_string(out.size()) + " outputs for " + std::to_string(vars.size()) +
                " variables");
  if (strategy_.replicas_->size() == 1) {
    // One replica: the pulls land in the outputs directly.
    std::vector<ps::PsClient::PullTarget> targets;
    for (std::size_t i = 0; i < vars.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(vars[i].num_elements());
      out[i]->resize(n);
      targets.push_back({vars[i].name(), out[i]->data(), n * sizeof(float)});
    }
    std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
    strategy_.ps_client().pull_many(targets);
    return;
  }
  const float* all = read_all(vars);
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const std::size_t n = static_cast<std::size_t>(vars[i].num_elements());
    out[i]->assign(all, all + n);
    all += n;
  }
}

void ReplicaContext::read_many(const std::vector<Variable>& vars, const std::vector<std::vector<float>*>& out,
                               std::vector<const float*>& in_place) {
  in_place.assign(vars.size(), nullptr);
  if (strategy_.replicas_->size() != 1 || out.size() != vars.size()) return read_many(vars, out);
  std::vector<const void*> views(vars.size(), nullptr);
  std::vector<ps::PsClient::PullTarget> targets;
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const std::size_t n = static_cast<std::size_t>(vars[i].num_elements());
    out[i]->resize(n);
    targets.push_back({vars[i].name(), out[i]->data(), n * sizeof(float), &views[i]});
  }
  {
    std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
    strategy_.ps_client().pull_many(targets);
  }
  for (std::size_t i = 0; i < vars.size(); ++i) in_place[i] = static_cast<const float*>(views[i]);
}

void ReplicaContext::release_in_place(const float* values, std::size_t count) {
  std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
  strategy_.ps_client().release_in_place(values, count * sizeof(float));
}

void ReplicaContext::read(const Variable& var, std::vector<float>& out) {
  auto& group = *strategy_.replicas_;
  const std::size_t n = static_cast<std::size_t>(var.num_elements());
  if (group.size() == 1) {
    // One replica: nothing to share, so the pull lands in `out` directly (no second copy).
    out.resize(n);
    std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
    strategy_.ps_client().pull(var.name(), out.data(), n * sizeof(float));
    return;
  }
  // Barrier first: nobody may still be copying the previous shared value.
  group.barrier(replica_);
  if (replica_ == 0) {
    strategy_.shared_.resize(n);
    strategy_.ps_client().pull(var.name(), strategy_.shared_.data(), n * sizeof(float));
  }
  group.barrier(replica_);
  out.assign(strategy_.shared_.begin(), strategy_.shared_.begin() + static_cast<std::ptrdiff_t>(n));
}

void ReplicaContext::read_rows(const Variable& var, const std::vector<std::int64_t>& rows, std::vector<float>& out) {
  const std::size_t width =
      static_cast<std::size_t>(var.num_elements() / std::max<std::int64_t>(1, ps::num_rows(var.shape())));
  out.resize(rows.size() * width);
  std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
  strategy_.ps_client().pull_rows(var.name(), rows, out.data(), out.size() * sizeof(float));
}

void ReplicaContext::apply_gradient(const Variable& var, std::vector<float>& grad) {
  if (static_cast<std::int64_t>(grad.size()) != var.num_elements())
    throw Error("apply_gradient '" + var.name() + "': " + std::to_string(grad.size()) + " values for a variable of " +
                std::to_string(var.num_elements()));
  all_reduce(ReduceOp::kMean, grad);
  if (replica_ == 0) {
    std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
    strategy_.ps_client().push(var.name(), grad.data(), grad.size() * sizeof(float));
  }
}

void ReplicaContext::apply_gradients_flat(const std::vector<Variable>& vars, float* grads, std::size_t n) {
  std::size_t total = 0;
  for (const Variable& v : vars) total += static_cast<std::size_t>(v.num_elements());
  if (total != n)
    throw Error("apply_gradients_flat: " + std::to_string(n) + " gradient values for " + std::to_string(vars.size()) +
                " variable(s) of " + std::to_string(total) + " elements in all");
  auto& group = strategy_.device_group();
  all_reduce_on_device(ReduceOp::kMean, grads, n);
  if (replica_ != 0) return;
  // Device gradients are staged to host memory once, by the first replica, for the push.
  const float* host = grads;
  if (group.memory_kind() != replica::MemoryKind::kHost) {
    strategy_.staging_.resize(n);
    group.copy_to_host(replica_, strategy_.staging_.data(), grads, n);
    host = strategy_.staging_.data();
  }
  std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
  std::size_t offset = 0;
  for (const Variable& v : vars) {
    const std::size_t size = static_cast<std::size_t>(v.num_elements());
    if (v.trainable()) strategy_.ps_client().push(v.name(), host + offset, size * sizeof(float));
    offset += size;
  }
}

void ReplicaContext::gather_rows(
    const std::vector<std::int64_t>& rows, const std::vector<float>& grads,
    const std::function<void(const std::vector<std::int64_t>&, const std::vector<float>&)>& send) {
  auto& group = *strategy_.replicas_;
  const int k = group.size();
  group.barrier(replica_);
  if (replica_ == 0) {
    strategy_.gathered_rows_.assign(k, {});
    strategy_.gathered_grads_.assign(k, {});
  }
  group.barrier(replica_);
  strategy_.gathered_rows_[replica_] = rows;
  strategy_.gathered_grads_[replica_] = grads;
  group.barrier(replica_);
  if (replica_ == 0) {
    std::vector<std::int64_t> all_rows;
    std::vector<float> all_grads;
    const float inv = 1.0f / static_cast<float>(k);
    for (int r = 0; r < k; ++r) {
      all_rows.insert(all_rows.end(), strategy_.gathered_rows_[r].begin(), strategy_.gathered_rows_[r].end());
      for (float g : strategy_.gathered_grads_[r]) all_grads.push_back(k == 1 ? g : g * inv);
    }
    std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
    send(all_rows, all_grads);
  }
}

void ReplicaContext::apply_sparse_gradient(const Variable& var, const std::vector<std::int64_t>& rows,
                                           const std::vector<float>& grads) {
  gather_rows(rows, grads, [&](const std::vector<std::int64_t>& all_rows, const std::vector<float>& all_grads) {
    strategy_.ps_client().push_rows(var.name(), all_rows, all_grads.data(), all_grads.size() * sizeof(float));
  });
}

namespace {
void check_dynamic_grads(const DynamicVariable& var, std::size_t ids, std::size_t grads) {
  if (grads != ids * static_cast<std::size_t>(var.dim()))
    throw Error("dynamic variable '" + var.name() + "': " + std::to_string(grads) + " gradient values for " +
                std::to_string(ids) + " id(s) of " + std::to_string(var.dim()) + " floats");
}
}  // namespace

void ReplicaContext::lookup(const DynamicVariable& var, const std::vector<std::int64_t>& ids, std::vector<float>& out,
                            ps::DynamicLookup mode) {
  out.resize(ids.size() * static_cast<std::size_t>(var.dim()));
  std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
  strategy_.ps_client().lookup_dynamic(var.name(), ids.data(), ids.size(), out.data(), mode);
}

void ReplicaContext::apply_dynamic_gradient(const DynamicVariable& var, const std::vector<std::int64_t>& ids,
                                            const std::vector<float>& grads, std::int64_t step) {
  check_dynamic_grads(var, ids.size(), grads.size());
  gather_rows(ids, grads, [&](const std::vector<std::int64_t>& all_ids, const std::vector<float>& all_grads) {
    strategy_.ps_client().update_dynamic(var.name(), all_ids.data(), all_ids.size(), all_grads.data(), step);
  });
}

void ParameterServerStrategy::lookup(const DynamicVariable& var, const std::vector<std::int64_t>& ids,
                                     std::vector<float>& out, ps::DynamicLookup mode) {
  out.resize(ids.size() * static_cast<std::size_t>(var.dim()));
  std::lock_guard<std::mutex> lock(ps_mutex_);
  ps_client().lookup_dynamic(var.name(), ids.data(), ids.size(), out.data(), mode);
}

void ParameterServerStrategy::update(const DynamicVariable& var, const std::vector<std::int64_t>& ids,
                                     const std::vector<float>& grads, std::int64_t step) {
  check_dynamic_grads(var, ids.size(), grads.size());
  std::lock_guard<std::mutex> lock(ps_mutex_);
  ps_client().update_dynamic(var.name(), ids.data(), ids.size(), grads.data(), step);
}

std::int64_t ReplicaContext::increment_global_step() {
  auto& group = *strategy_.replicas_;
  group.barrier(replica_);
  if (replica_ == 0) {
    std::lock_guard<std::mutex> lock(strategy_.ps_mutex_);
    strategy_.shared_step_ = strategy_.ps_client().increment_global_step();
  }
  group.barrier(replica_);
  return strategy_.shared_step_;
}

// ---- DistributedDataset -----------------------------------------------------------------------

void DistributedDataset::start_epoch(int epoch, std::int64_t skip_examples) {
  iterator_.reset();
  if (skip_examples < 0) throw Error("start_epoch: negative skip");
  if (stream_.source) {
    if (skip_examples % options_.global_batch != 0)
      throw Error("start_epoch: a streamed epoch resumes at a batch boundary; skip " + std::to_string(skip_examples) +
                  " is not a multiple of the batch " + std::to_string(options_.global_batch));
    iterator_ = std::make_unique<data::BatchIterator>(stream_.source(context_, epoch), options_.prefetch);
    data::Batch discard;
    for (std::int64_t b = skip_examples / options_.global_batch; b > 0 && iterator_->next(discard); --b) {
    }
    return;
  }
  auto indices = data::shard_indices(*dataset_, policy_, workers_, worker_, options_.seed, epoch, options_.shuffle);
  examples_ = static_cast<std::int64_t>(indices.size());
  indices.erase(indices.begin(), indices.begin() + static_cast<std::ptrdiff_t>(std::min(skip_examples, examples_)));
  iterator_ = std::make_unique<data::BatchIterator>(*dataset_, std::move(indices), options_.global_batch,
                                                    options_.drop_remainder, options_.prefetch);
}

bool DistributedDataset::next(PerReplica<data::Batch>& out) {
  if (!iterator_) start_epoch(0);
  data::Batch batch;
  if (!iterator_->next(batch)) return false;
  out = data::split_batch(batch, replicas_);
  return true;
}

// ---- ParameterServerStrategy ------------------------------------------------------------------

data::InputContext ParameterServerStrategy::input_context() const {
  data::InputContext ctx;
  ctx.num_input_pipelines = std::max(1, num_workers());
  ctx.input_pipeline_id = std::max(0, ps_ && ps_->client ? ps_->client->worker_index() : 0);
  ctx.num_replicas_in_sync = num_replicas_in_sync();
  return ctx;
}

DistributedDataset ParameterServerStrategy::distribute_dataset(const data::Dataset& dataset, data::AutoShard policy,
                                                               const DistributeOptions& options) {
  input_context().get_per_replica_batch_size(options.global_batch);  // divisibility check
  DistributedDataset out;
  // Not owned: the caller keeps the dataset alive (documented), so a large dataset is not copied.
  out.dataset_ = std::shared_ptr<const data::Dataset>(&dataset, [](const data::Dataset*) {});
  out.options_ = options;
  out.workers_ = std::max(1, num_workers());
  out.worker_ = std::max(0, worker_index());
  out.replicas_ = num_replicas_in_sync();
  out.policy_ = data::resolve_auto_shard(dataset, policy, out.workers_);
  return out;
}

DistributedDataset ParameterServerStrategy::distribute_stream(const StreamingInput& input,
                                                              const DistributeOptions& options) {
  if (!input.source || !input.examples) throw ConfigError("distribute_stream: the StreamingInput has no source or count");
  DistributedDataset out;
  out.context_ = input_context();
  out.context_.get_per_replica_batch_size(options.global_batch);  // divisibility check
  out.stream_ = input;
  out.options_ = options;
  out.workers_ = out.context_.num_input_pipelines;
  out.worker_ = out.context_.input_pipeline_id;
  out.replicas_ = num_replicas_in_sync();
  out.policy_ = data::AutoShard::kOff;  // the stream's functions shard for themselves
  const std::int64_t parts = input.shared_parts && input.count_part && input.examples_of
                                 ? input.shared_parts(out.context_)
                                 : 0;
  out.examples_ = parts > 0 ? shared_count(input, out.context_, parts) : input.examples(out.context_);
  return out;
}

std::int64_t ParameterServerStrategy::shared_count(const StreamingInput& input, const data::InputContext& ctx,
                                                    std::int64_t parts) {
  // Each worker counts its parts (p % workers == this worker), then every worker's record goes to
  // every worker: "C" or "E" (a ConfigError or another Error) and the first failure's message, or
  // "N" and its counts in part order. One failure is everyone's, so no worker goes on alone.
  const int workers = ctx.num_input_pipelines, me = ctx.input_pipeline_id;
  std::string mine = "N";
  try {
    for (std::int64_t p = me; p < parts; p += workers) mine += std::to_string(input.count_part(p)) + ",";
  } catch (const ConfigError& e) {
    mine = "C" + e.message();
  } catch (const Error& e) {
    mine = "E" + e.message();
  }
  // The workers arrive as they finish counting: the wait allows the busiest one's count.
  double allowance_s = 0;
  if (input.part_bytes) {
    std::vector<double> bytes(static_cast<std::size_t>(workers), 0.0);
    for (std::int64_t p = 0; p < parts; ++p)
      bytes[static_cast<std::size_t>(p % workers)] += static_cast<double>(input.part_bytes(p));
    allowance_s = *std::max_element(bytes.begin(), bytes.end()) / StreamingInput::kCountBytesPerSecond;
  }
  const std::vector<std::string> all = comm::workers_group(runtime_)
                                           ->allgather_strings(mine, comm::Deadline{std::min(options_.ps.timeout_s + allowance_s, kMaxDurationS),
                                                                                    "counting the streamed input"});
  for (std::size_t w = 0; w < all.size(); ++w) {
    if (all[w].empty() || all[w][0] == 'N') continue;
    const std::string what = "worker " + std::to_string(w) + " counting its part of the input: " + all[w].substr(1);
    if (all[w][0] == 'C') throw ConfigError(what);
    throw Error(what);
  }
  std::vector<std::int64_t> rows(static_cast<std::size_t>(parts), -1);
  for (std::size_t w = 0; w < all.size(); ++w) {
    std::int64_t p = static_cast<std::int64_t>(w);
    for (const std::string& n : split(all[w].substr(1), ','))
      if (!n.empty() && p < parts) {
        rows[static_cast<std::size_t>(p)] = parse_int64(n, "a worker's count");
        p += workers;
      }
  }
  for (std::int64_t p = 0; p < parts; ++p)
    if (rows[static_cast<std::size_t>(p)] < 0)
      throw Error("counting the streamed input: no count of part " + std::to_string(p) + " arrived from worker " +
                  std::to_string(p % workers));
  return input.examples_of(ctx, rows);
}

DistributedDataset ParameterServerStrategy::distribute_datasets_from_function(const data::DatasetFn& fn,
                                                                              const DistributeOptions& options) {
  const data::InputContext ctx = input_context();
  ctx.get_per_replica_batch_size(options.global_batch);
  DistributedDataset out;
  out.dataset_ = std::make_shared<const data::Dataset>(fn(ctx));
  out.options_ = options;
  // The function already produced this worker's share: iterate all of it.
  out.workers_ = 1;
  out.worker_ = 0;
  out.replicas_ = num_replicas_in_sync();
  out.policy_ = data::AutoShard::kOff;
  return out;
}


// ---- device selection -------------------------------------------------------------------------

DevicePolicy parse_device_policy(const std::string& text, const std::string& what) {
  if (text == "auto") return DevicePolicy::kAuto;
  if (text == "cpu") return DevicePolicy::kCpu;
  if (text == "gpu") return DevicePolicy::kGpu;
  throw ConfigError(what + ": '" + text + "' is not one of auto, cpu, gpu");
}

const char* to_string(DevicePolicy policy) {
  switch (policy) {
    case DevicePolicy::kAuto: return "auto";
    case DevicePolicy::kCpu: return "cpu";
    case DevicePolicy::kGpu: return "gpu";
  }
  return "?";
}

std::vector<int> choose_replica_gpus(const Runtime& runtime, const Env& env, DevicePolicy policy, double timeout_s) {
  if (policy == DevicePolicy::kCpu) return {};  // same policy on every rank: nobody exchanges
  const bool worker = runtime.role() == Role::kChief || runtime.role() == Role::kWorker;
  // What each rank was given: "" for ranks without replicas, else "=" + CUDA_VISIBLE_DEVICES, or
  // "-" when it is unset (so that unset and empty, which hides every GPU, stay distinct).
  std::string mine;
  if (worker) {
    const std::optional<std::string> cvd = env.get("CUDA_VISIBLE_DEVICES");
    mine = cvd ? "=" + *cvd : "-";
  }
  const std::vector<std::string> all = comm::runtime_group(runtime)
                                           ->allgather_strings(mine, comm::Deadline{timeout_s, "replica device selection"});
  if (!worker) return {};
  const int gpus = replica::visible_gpu_count();
  if (gpus == 0) {
    if (policy == DevicePolicy::kAuto) return {};
    throw ConfigError("--devices gpu: " + runtime.task().str() + " on " + runtime.ranks()[runtime.rank()].host +
                      " sees no GPU (" + replica::gpu_unavailable_reason() + "); use --devices cpu or auto");
  }
  // The workers on this host, in world-rank order (the node-local order, PS ranks excluded).
  const std::string& host = runtime.ranks()[runtime.rank()].host;
  std::vector<std::optional<std::string>> node_workers;
  int local = -1;
  for (const RankInfo& info : runtime.ranks()) {
    const std::string& given = all[static_cast<std::size_t>(info.rank)];
    if (info.host != host || given.empty()) continue;
    if (info.rank == runtime.rank()) local = static_cast<int>(node_workers.size());
    node_workers.push_back(given == "-" ? std::nullopt : std::optional<std::string>(given.substr(1)));
  }
  return replica::select_worker_devices(node_workers, local, gpus);
}

ParameterServerStrategy::ParameterServerStrategy(const Runtime& runtime, StrategyOptions options)
    : runtime_(runtime), options_(std::move(options)) {
  const bool worker = runtime_.role() == Role::kChief || runtime_.role() == Role::kWorker;
  if (worker && !options_.gpus.empty()) {
    // One replica per GPU: NCCL reduces their device memory; a host group of the same size keeps
    // the replica threads' host-side collectives (shared pulls, the global step, host reductions).
    device_group_ = replica::make_nccl_replica_group(options_.gpus, options_.ps.timeout_s);
    gpus_ = options_.gpus;
    replicas_ = replica::make_host_replica_group(static_cast<int>(gpus_.size()), options_.ps.timeout_s);
  } else {
    replicas_ = replica::make_host_replica_group(options_.cpu_replicas, options_.ps.timeout_s);
  }
}

std::string ParameterServerStrategy::devices() const {
  if (gpus_.empty()) return "cpu:" + std::to_string(replicas_->size());
  std::string s = "gpu:";
  for (std::size_t i = 0; i < gpus_.size(); ++i) s += (i ? "," : "") + std::to_string(gpus_[i]);
  return s;
}

ParameterServerStrategy::~ParameterServerStrategy() = default;

void ParameterServerStrategy::scope(const std::function<void()>& body) {
  if (ps_ && scope_depth_ == 0)
    throw Error("scope(): variables were already materialised; strata supports one top-level scope per strategy");
  ++scope_depth_;
  try {
    body();
  } catch (...) {
    --scope_depth_;
    throw;
  }
  if (--scope_depth_ == 0) materialize();
}

Variable ParameterServerStrategy::create_variable(ps::VariableSpec spec) {
  if (scope_depth_ == 0) throw Error("create_variable('" + spec.name + "') outside strategy.scope()");
  if (!colocate_with_.empty() && spec.colocate_with.empty()) spec.colocate_with = colocate_with_;
  Variable var;
  var.spec_ = spec;
  pending_.push_back(std::move(spec));
  return var;
}

DynamicVariable ParameterServerStrategy::create_dynamic_variable(ps::DynamicVariableSpec spec) {
  if (scope_depth_ == 0) throw Error("create_dynamic_variable('" + spec.name + "') outside strategy.scope()");
  spec.validate();
  DynamicVariable var;
  var.spec_ = spec;
  pending_dynamic_.push_back(std::move(spec));
  return var;
}

void ParameterServerStrategy::colocate_vars_with(const Variable& var, const std::function<void()>& body) {
  std::string saved = colocate_with_;
  colocate_with_ = var.name();
  try {
    body();
  } catch (...) {
    colocate_with_ = saved;
    throw;
  }
  colocate_with_ = saved;
}

void ParameterServerStrategy::materialize() {
  prepare_checkpoint_hooks();
  // PS ranks ignore what they declared; the chief's list is authoritative (checked on workers).
  ps_ = std::make_unique<ps::ParameterServers>(
      ps::ParameterServers::materialize(runtime_, options_.ps, pending_, pending_dynamic_));
  gather_restore_report();
  if (report_) last_save_global_step_ = report_->global_step;
  last_save_time_ = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  // Sync: the clocks start at 0 in every job and each worker advances the global step once per
  // step, so round c ends at G0 + W * c. The chief may post the first save now (before its first
  // push), which is the only way it can land at round 2.
  sync_start_step_ = last_save_global_step_;
  last_save_round_ = 0;
  if (is_chief() && !checkpoint_.directory.empty() && options_.ps.consistency.mode == ps::Consistency::kSync) {
    std::lock_guard<std::mutex> lock(ps_mutex_);
    schedule_sync_save(0);
  }
}

ps::PsEndpoint& ParameterServerStrategy::ps_endpoint() {
  if (!ps_) throw Error("variables are not materialised yet: create them in strategy.scope() first");
  return ps_->endpoint();
}

ps::PsClient& ParameterServerStrategy::ps_client() {
  if (!ps_) throw Error("variables are not materialised yet: create them in strategy.scope() first");
  if (!ps_->client) throw Error("the parameter-server client is a chief's or worker's; this rank is " + runtime_.task().str());
  return *ps_->client;
}

ps::PsServer& ParameterServerStrategy::ps_server() {
  if (!ps_) throw Error("variables are not materialised yet: create them in strategy.scope() first");
  if (!ps_->server) throw Error("the parameter-server service is a PS rank's; this rank is " + runtime_.task().str());
  return *ps_->server;
}

const cluster::ResolvedCluster& ParameterServerStrategy::cluster_resolver() const { return runtime_.resolved(); }
bool ParameterServerStrategy::is_ps() const { return runtime_.role() == Role::kPs; }
bool ParameterServerStrategy::is_chief() const { return runtime_.is_chief(); }
int ParameterServerStrategy::num_workers() const {
  return runtime_.count_role(Role::kChief) + runtime_.count_role(Role::kWorker);
}
int ParameterServerStrategy::worker_index() const { return ps_ && ps_->client ? ps_->client->worker_index() : -1; }

bool ParameterServerStrategy::serve() {
  ps_endpoint();  // materialised
  if (!ps_->server) throw Error("serve() runs on PS ranks only; this rank is " + runtime_.task().str());
  stopped_ = ps_->server->serve();
  return stopped_;
}

void ParameterServerStrategy::finish_training(const ps::WorkerPosition& position) {
  std::lock_guard<std::mutex> lock(ps_mutex_);
  auto& p = ps_client();
  if (training_finished_) return;
  training_finished_ = true;
  if (!checkpoint_.directory.empty() && !stopped_) {
    // The chief's periodic schedule (end_step's) while slower workers still train: async and
    // staleness:N only (finish_checkpoints never calls it under sync, where every worker ends
    // with the chief), so the global step it reads is the one the save will hold, give or take
    // the steps in flight, as in end_step's async branch.
    auto due = [this, &p]() -> int {
      const bool preempt = checkpoint_.handle_signals && (preemption_signal() != 0 || p.preemption_reports() > 0);
      bool save = preempt;
      if (!save && checkpoint_.save_every_steps > 0)
        save = p.global_step() - last_save_global_step_ >= checkpoint_.save_every_steps;
      const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      if (!save && checkpoint_.save_every_secs > 0) save = now - last_save_time_ >= checkpoint_.save_every_secs;
      if (!save) return 0;
      // A failed save restarts the interval too, as in end_step.
      last_save_global_step_ = p.global_step();
      last_save_time_ = now;
      return preempt ? 2 : 1;
    };
    auto b = p.finish_checkpoints(position, due);
    if (b.stop) stopped_ = true;
    // The final save committed global step G, or found it committed by an earlier save of this job.
    if (b.saved && !b.failed && !b.stop)
      final_checkpoint_ = (std::filesystem::path(checkpoint_.directory) /
                           ("ckpt-" + std::to_string(p.global_step()) + ".h5")).string();
  }
}

bool ParameterServerStrategy::save_error_stopped() const { return ps_ && ps_->endpoint().save_error_stopped(); }

void ParameterServerStrategy::finish(const ps::WorkerPosition& position) {
  finish_training(position);
  std::lock_guard<std::mutex> lock(ps_mutex_);
  ps_client().done();
}

void ParameterServerStrategy::read(const Variable& var, std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(var.num_elements()));
  std::lock_guard<std::mutex> lock(ps_mutex_);
  ps_client().pull(var.name(), out.data(), out.size() * sizeof(float));
}

std::int64_t ParameterServerStrategy::global_step() {
  std::lock_guard<std::mutex> lock(ps_mutex_);
  return ps_client().global_step();
}

void ParameterServerStrategy::run_replicas(const std::function<void(ReplicaContext&)>& fn) {
  const int k = num_replicas_in_sync();
  if (k == 1) {
    ReplicaContext ctx(*this, 0);
    fn(ctx);
    return;
  }
  std::vector<std::exception_ptr> errors(k);
  RankContext context = current_rank_context();
  auto body = [&](int r) {
    ScopedRankContext scoped(context);
    try {
      ReplicaContext ctx(*this, r);
      fn(ctx);
    } catch (...) {
      errors[r] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < k; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

Tensor ParameterServerStrategy::reduce(ReduceOp op, const PerReplica<Tensor>& value, std::optional<int> axis) const {
  if (value.empty()) throw Error("reduce: no per-replica values");
  const auto& first = value.front();
  if (!axis) {
    Tensor out = first;
    for (std::size_t r = 1; r < value.size(); ++r) {
      if (value[r].shape != first.shape)
        throw Error("reduce: replica " + std::to_string(r) + " has another shape than replica 0 (axis=None)");
      for (std::size_t i = 0; i < out.values.size(); ++i) out.values[i] += value[r].values[i];
    }
    if (op == ReduceOp::kMean)
      for (auto& x : out.values) x /= static_cast<float>(value.size());
    return out;
  }
  const int rank = static_cast<int>(first.shape.size());
  const int a = *axis < 0 ? *axis + rank : *axis;
  if (a < 0 || a >= rank) throw Error("reduce: axis " + std::to_string(*axis) + " is out of range for rank " + std::to_string(rank));
  // Output shape: the input shape without `a`. outer = product of dims before a, inner = after.
  std::vector<std::int64_t> out_shape;
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < rank; ++d) {
    if (d < a) outer *= first.shape[d];
    if (d > a) inner *= first.shape[d];
    if (d != a) out_shape.push_back(first.shape[d]);
  }
  Tensor out;
  out.shape = out_shape;
  out.values.assign(static_cast<std::size_t>(outer * inner), 0.0f);
  std::int64_t extent = 0;
  for (std::size_t r = 0; r < value.size(); ++r) {
    const auto& t = value[r];
    if (static_cast<int>(t.shape.size()) != rank)
      throw Error("reduce: replica " + std::to_string(r) + " has rank " + std::to_string(t.shape.size()));
    for (int d = 0; d < rank; ++d)
      if (d != a && t.shape[d] != first.shape[d])
        throw Error("reduce: replica " + std::to_string(r) + " differs from replica 0 outside axis " + std::to_string(a));
    const std::int64_t len = t.shape[a];
    extent += len;
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t l = 0; l < len; ++l)
        for (std::int64_t i = 0; i < inner; ++i)
          out.values[o * inner + i] += t.values[(o * len + l) * inner + i];
  }
  if (op == ReduceOp::kMean) {
    if (extent == 0) throw Error("reduce: MEAN over an empty axis");
    for (auto& x : out.values) x /= static_cast<float>(extent);
  }
  return out;
}

}  // namespace strata
