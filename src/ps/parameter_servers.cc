// Parameter servers: materialisation (who is who, the variable list, the placement and the arena
// layout, agreed by every rank before anything is allocated) and what both roles share. The
// server part is in ps_server.cc, the client part in ps_client.cc, the checkpoint protocol on top
// of both in checkpoint_protocol.cc. The protocols are narrated in
// include/strata/ps/parameter_servers.h.
#include "strata/ps/parameter_servers.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ps/client_core.h"
#include "ps/dynamic_checkpoint.h"
#include "ps/server_core.h"
#include "ps/test_peer.h"
#include "strata/cluster/runtime.h"
#include "strata/comm/mpi_group.h"
#include "strata/comm/registry.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/parse.h"

namespace strata::ps {

namespace {

// Bytes the kernel says a new allocation can take without swapping; 0 if unknown.
std::uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// A rank of neither role (the evaluator): it takes part in the collective allocation and release
// of the region and nothing else.
class Bystander final : public PsEndpoint {
 public:
  explicit Bystander(std::unique_ptr<PsCore> core) : PsEndpoint(std::move(core)) {}
};

}  // namespace

ConsistencyConfig ConsistencyConfig::parse(std::string_view text) {
  ConsistencyConfig c;
  if (text == "async") return c;
  if (text == "sync") {
    c.mode = Consistency::kSync;
    return c;
  }
  if (text.rfind("staleness:", 0) == 0) {
    c.mode = Consistency::kStaleness;
    c.staleness = parse_int(text.substr(10), "--consistency staleness", 0, 1 << 30);
    return c;
  }
  throw ConfigError("--consistency: '" + std::string(text) + "' is not one of async, sync, staleness:N");
}

std::string ConsistencyConfig::to_string() const {
  switch (mode) {
    case Consistency::kAsync: return "async";
    case Consistency::kSync: return "sync";
    case Consistency::kStaleness: return "staleness:" + std::to_string(staleness);
  }
  return "?";
}

// ---- PsCore -------------------------------------------------------------------------------------

void PsCore::release() noexcept {
  try {
    ps_wake.clear();
    worker_wake.clear();
    region.reset();
    transport.reset();
  } catch (const std::exception& e) {
    STRATA_LOG(ERROR) << "freeing the parameter-server region failed: " << e.what();
    std::terminate();
  }
}

void PsCore::map_wake_words(int ps_index, int worker) {
  ps_wake.assign(ps_rank.size(), nullptr);
  if (ps_index >= 0) {
    ps_wake[static_cast<std::size_t>(ps_index)] = transport->shared_word(*region, transport->rank(), layout.ps_wake());
    worker_wake.assign(static_cast<std::size_t>(num_workers), nullptr);
    for (int w = 0; w < num_workers; ++w)
      worker_wake[static_cast<std::size_t>(w)] = transport->shared_word(*region, transport->rank(), layout.worker_wake(w));
    return;
  }
  worker_wake.assign(ps_rank.size(), nullptr);
  if (worker < 0) return;  // a bystander neither pushes nor waits for acks
  for (std::size_t p = 0; p < ps_rank.size(); ++p) {
    ps_wake[p] = transport->shared_word(*region, ps_rank[p], layout.ps_wake());
    worker_wake[p] = transport->shared_word(*region, ps_rank[p], layout.worker_wake(worker));
  }
}

void PsCore::report_preemption() {
  if (preemption_reported) return;
  preemption_reported = true;
  transport->fetch_add(*region, ps0(), control::kPreempt, 1);
}

void PsCore::timeout(const std::string& what, std::vector<int> ranks) const {
  std::ostringstream os;
  os << what << " did not complete within " << options.timeout_s << " s";
  throw TimeoutError(os.str(), std::move(ranks));
}

// ---- PsEndpoint ---------------------------------------------------------------------------------

PsEndpoint::PsEndpoint(std::unique_ptr<PsCore> core) : core_(std::move(core)) {}

// Collective: region and transport are freed in the same order on every rank.
PsEndpoint::~PsEndpoint() { core_->release(); }

const ShardMap& PsEndpoint::shard_map() const { return core_->map; }

int PsEndpoint::num_workers() const { return core_->num_workers; }

std::string PsEndpoint::transport_description() const {
  const comm::Transport& t = *core_->transport;
  return std::string(t.name()) + " (" + t.describe() + ")" + (t.why().empty() ? "" : "; " + t.why());
}

void PsEndpoint::barrier() {
  PsCore& m = *core_;
  // The transport is driven while waiting: a peer's operations may need this rank's progress.
  m.group->barrier(comm::Deadline{m.options.timeout_s, "parameter servers: barrier",
                                  [&m] { m.transport->progress(); }});
}

void PsEndpoint::report_preemption() { core_->report_preemption(); }

std::int64_t PsEndpoint::preemption_reports() { return core_->read_ps0(control::kPreempt); }

std::int64_t PsEndpoint::save_failures() const { return core_->saves_failed; }

bool PsEndpoint::save_error_stopped() const { return core_->save_error_stop; }

// ---- materialisation ----------------------------------------------------------------------------

ParameterServers ParameterServers::materialize(const Runtime& runtime, const PsOptions& options,
                                               const std::vector<VariableSpec>& specs,
                                               const std::vector<DynamicVariableSpec>& dynamic) {
  // The role decides the part this rank gets; everything until the allocation is common.
  const bool is_ps = runtime.role() == Role::kPs;
  std::unique_ptr<ServerCore> server;
  std::unique_ptr<ClientCore> client;
  std::unique_ptr<PsCore> bystander;
  PsCore* impl = nullptr;
  if (is_ps) {
    server = std::make_unique<ServerCore>();
    server->ps_index = runtime.task().index;
    impl = server.get();
  } else if (runtime.role() == Role::kChief || runtime.role() == Role::kWorker) {
    client = std::make_unique<ClientCore>();
    impl = client.get();
  } else {
    bystander = std::make_unique<PsCore>();
    impl = bystander.get();
  }
  impl->options = options;
  impl->options.optimizer.validate();
  // An MPI runtime's communicator as a group, or a runtime's process group (in-process ranks).
  impl->group = comm::runtime_group(runtime);
  comm::Group& group = *impl->group;
  const double timeout = options.timeout_s;

  // Who is who: PS index -> rank, worker index (chief first, then workers by index).
  std::vector<int> worker_ranks;
  int chief_rank = -1;
  for (const auto& info : runtime.ranks()) {
    if (info.task.type == "ps") {
      if (static_cast<int>(impl->ps_rank.size()) <= info.task.index) impl->ps_rank.resize(info.task.index + 1, -1);
      impl->ps_rank[info.task.index] = info.rank;
    } else if (info.task.type == "chief" || info.task.type == "master") {
      chief_rank = info.rank;
    }
  }
  if (chief_rank >= 0) worker_ranks.push_back(chief_rank);
  {
    std::vector<std::pair<int, int>> workers;
    for (const auto& info : runtime.ranks())
      if (info.task.type == "worker") workers.emplace_back(info.task.index, info.rank);
    std::sort(workers.begin(), workers.end());
    for (const auto& w : workers) worker_ranks.push_back(w.second);
  }
  if (impl->ps_rank.empty()) throw ConfigError("the cluster has no ps task: parameter servers need at least one");
  if (worker_ranks.empty()) throw ConfigError("the cluster has no chief or worker task to train");
  impl->num_workers = static_cast<int>(worker_ranks.size());
  int worker = -1;  // this rank's index among chief + workers
  for (int w = 0; w < impl->num_workers; ++w)
    if (worker_ranks[w] == runtime.rank()) worker = w;
  if (client) {
    if (worker < 0) throw Error("parameter servers: this " + runtime.task().str() + " is missing from the worker list");
    client->worker = worker;
  }
  impl->chief_rank = worker_ranks[0];
  for (int r : worker_ranks) {
    WordWriter writer;
    writer.rank = r;
    for (const auto& info : runtime.ranks())
      if (info.rank == r) writer.task = info.task.str();
    impl->writers.push_back(std::move(writer));
  }

  // Between-graph replication check: every worker must have created the same variable sequence.
  const std::string mine = worker >= 0 ? specs_to_json(specs) : std::string();
  std::vector<std::string> all = group.allgather_strings(mine, comm::Deadline{timeout, "variable creation check"});
  const std::string& reference = all[worker_ranks[0]];
  std::vector<VariableSpec> ref_specs = specs_from_json(reference);
  std::string mismatch;
  for (int w = 1; w < impl->num_workers; ++w) {
    const std::string& theirs = all[worker_ranks[w]];
    if (theirs == reference) continue;
    std::string diff = describe_difference(ref_specs, specs_from_json(theirs));
    mismatch += (mismatch.empty() ? "" : "; ") + std::string("worker ") + std::to_string(w) + " (rank " +
                std::to_string(worker_ranks[w]) + "): " + diff;
  }
  if (!mismatch.empty())
    throw ConfigError("variable creation differs from worker 0 (rank " + std::to_string(worker_ranks[0]) +
                      ") on " + mismatch + " (every worker must create the same variables in the same order)");

  // The same for the dynamic variables; the reference list is validated on every rank alike
  // (dynamic_specs_from_json), so a bad spec is the same ConfigError everywhere.
  {
    const std::string dyn_mine = worker >= 0 ? dynamic_specs_to_json(dynamic) : std::string();
    std::vector<std::string> dyn_all = group.allgather_strings(dyn_mine, comm::Deadline{timeout, "dynamic variable check"});
    const std::string& dyn_reference = dyn_all[worker_ranks[0]];
    std::string dyn_mismatch;
    for (int w = 1; w < impl->num_workers; ++w)
      if (dyn_all[worker_ranks[w]] != dyn_reference)
        dyn_mismatch += (dyn_mismatch.empty() ? "" : ", ") + std::string("worker ") + std::to_string(w) + " (rank " +
                        std::to_string(worker_ranks[w]) + ")";
    if (!dyn_mismatch.empty())
      throw ConfigError("dynamic variables differ from worker 0 (rank " + std::to_string(worker_ranks[0]) + ") on " +
                        dyn_mismatch + " (every worker must declare the same dynamic variables in the same order)");
    impl->dynamic = dynamic_specs_from_json(dyn_reference);
    for (const auto& d : impl->dynamic) {
      if (ref_specs.end() != std::find_if(ref_specs.begin(), ref_specs.end(), [&](const VariableSpec& v) { return v.name == d.name; }))
        throw ConfigError("dynamic variable '" + d.name + "' has the name of a variable");
      if (std::count_if(impl->dynamic.begin(), impl->dynamic.end(), [&](const DynamicVariableSpec& e) { return e.name == d.name; }) > 1)
        throw ConfigError("dynamic variable '" + d.name + "' is declared twice");
    }
  }

  // The PS ranks' own communicator for saving dynamic tables (point-to-point to PS 0): made by
  // every rank alike, since every rank knows the same dynamic list.
  if (!impl->dynamic.empty()) {
    // A variable whose checkpoint table name cannot be spelled is refused now, on every rank alike
    // (dynamic_dir is set on every rank), rather than at its first save.
    if (!options.checkpoint.dynamic_dir.empty())
      for (const auto& d : impl->dynamic) table_name(d.name);
    auto dyn_group = group.split(is_ps ? 0 : -1, is_ps ? server->ps_index : 0,
                                 comm::Deadline{timeout, "the PS ranks' dynamic-table save group"});
    if (server) server->dyn_group = std::move(dyn_group);
  }

  // A variable with its own optimizer is updated by its PS, so its pushes go through the inboxes;
  // the accumulate path (async SGD applied by the workers' atomics) stays for jobs where every
  // variable uses the job's SGD.
  const bool own_optimizers = std::any_of(ref_specs.begin(), ref_specs.end(), [](const VariableSpec& v) { return v.optimizer.has_value(); });
  impl->uses_inbox = impl->options.optimizer.kind != OptimizerKind::kSgd || own_optimizers ||
                     impl->options.consistency.mode == Consistency::kSync;
  impl->map = ShardMap::build(ref_specs, static_cast<int>(impl->ps_rank.size()), options.placement);
  impl->layout = ArenaLayout::build(impl->map, impl->num_workers, static_cast<int>(impl->ps_rank.size()),
                                    impl->options.optimizer.kind,
                                    PushPath{impl->uses_inbox, impl->options.consistency.mode == Consistency::kSync},
                                    impl->dynamic);
  for (const Shard& sh : impl->map.shards()) impl->shard_names.push_back(ShardName{sh.variable, sh.part, sh.row_end - sh.row_begin});

  // Each PS checks that its arena fits before anyone allocates: a refusal is reported on every rank
  // instead of one rank failing inside a collective allocation.
  std::string verdict;
  if (is_ps) {
    const std::uint64_t need = impl->layout.arena_bytes(server->ps_index);
    const std::uint64_t avail = mem_available_bytes();
    if (options.max_arena_bytes > 0 && need > options.max_arena_bytes)
      verdict = "ps:" + std::to_string(server->ps_index) + " needs an arena of " + std::to_string(need) +
                " bytes, above the cap of " + std::to_string(options.max_arena_bytes) + " (STRATA_PS_MAX_ARENA_BYTES)";
    else if (avail > 0 && need > avail / 10 * 9)
      verdict = "ps:" + std::to_string(server->ps_index) + " needs an arena of " + std::to_string(need) +
                " bytes but its node has " + std::to_string(avail) + " bytes available";
  }
  std::string refusals;
  for (const auto& v : group.allgather_strings(verdict, comm::Deadline{timeout, "arena size check"}))
    if (!v.empty()) refusals += (refusals.empty() ? "" : "; ") + v;
  if (!refusals.empty()) throw ConfigError("cannot place the variables: " + refusals);
  // A pending restore is checked the same way, before allocation: every PS looks at the checkpoint
  // against the variable list; identical complaints from several PS ranks are reported once.
  std::string restore_verdict;
  if (is_ps && options.checkpoint.check) restore_verdict = options.checkpoint.check(impl->map);
  // The dynamic tables' rows are read now too (this shard's ids only), so that a missing or
  // unusable chain is the same ConfigError on every rank before anything is allocated.
  if (is_ps && restore_verdict.empty() && !impl->dynamic.empty() && options.checkpoint.dynamic_restore_step >= 0)
    restore_verdict = server->restore_dynamic();
  std::vector<std::string> complaints;
  for (const auto& v : group.allgather_strings(restore_verdict, comm::Deadline{timeout, "checkpoint restore check"}))
    if (!v.empty() && std::find(complaints.begin(), complaints.end(), v) == complaints.end()) complaints.push_back(v);
  if (!complaints.empty()) {
    std::string all;
    for (const auto& c : complaints) all += (all.empty() ? "" : "; ") + c;
    throw ConfigError(all);
  }

  impl->transport = comm::create_transport(options.transport, group);
  impl->region = impl->transport->allocate_region(is_ps ? impl->layout.arena_bytes(server->ps_index) : 0);
  const std::size_t shards = impl->map.shards().size();
  impl->map_wake_words(server ? server->ps_index : -1, client ? client->worker : -1);
  if (client) {
    client->pushes.assign(shards, 0);
    client->acked.assign(shards, 0);
    client->ack_readback.assign(shards, 0);
    client->readback_pending.assign(shards, 0);
    client->dyn_sent.assign(impl->dynamic.size(), std::vector<std::int64_t>(impl->ps_rank.size(), 0));
    client->dyn_acked = client->dyn_sent;
    client->dyn_readback = client->dyn_sent;
    client->dyn_readback_pending.assign(impl->dynamic.size(), std::vector<char>(impl->ps_rank.size(), 0));
  }
  if (server) {
    server->rounds.assign(shards, 0);
    server->step_base.assign(shards, 0);
    server->initialise_local_shards();
    server->prepare_service();
    server->prepare_dynamic();
  }
  // Values must be in place before any worker pulls, and stream consumers registered before any
  // worker pushes.
  // A PS may restore a large checkpoint first, so an MPI job's ranks wait here up to an hour (a
  // rank that dies meanwhile is found sooner by the job's liveness monitor); in-process ranks, a
  // test's, wait the job's timeout.
  const double materialise_s = std::strcmp(group.kind(), "mpi") == 0 ? std::max(timeout, 3600.0) : timeout;
  group.barrier(comm::Deadline{materialise_s, "parameter servers: materialising the variables"});
  STRATA_LOG(DEBUG) << "materialised " << impl->map.variables().size() << " variables, "
                    << impl->map.shards().size() << " shards on " << impl->ps_rank.size() << " PS";
  ParameterServers out;
  if (server) out.server.reset(new PsServer(std::move(server)));
  if (client) out.client.reset(new PsClient(std::move(client)));
  if (bystander) out.bystander.reset(new Bystander(std::move(bystander)));
  return out;
}

// ---- test access (test_peer.h) ------------------------------------------------------------------

ParameterServersTestPeer::InboxWords ParameterServersTestPeer::inbox_words(PsClient& client,
                                                                           std::string_view shard_name) {
  const PsEndpoint& endpoint = client;
  const auto& m = static_cast<const ClientCore&>(*endpoint.core_);
  for (std::size_t s = 0; s < m.map.shards().size(); ++s) {
    if (m.shard(s).name != shard_name) continue;
    const ShardLayout& l = m.layout.shard(s);
    if (l.inbox_bytes == 0) throw Error("inbox_words: '" + std::string(shard_name) + "' has no inboxes in this job");
    InboxWords words;
    words.rank = m.ps_rank[static_cast<std::size_t>(m.shard(s).ps)];
    words.header = l.inboxes + static_cast<std::uint64_t>(m.worker) * l.inbox_bytes;
    words.payload = words.header + l.payload;
    words.doorbell = l.doorbells + 8ull * static_cast<std::uint64_t>(m.worker);
    words.chunks = l.chunks == 0 ? 0 : l.chunks + 8ull * static_cast<std::uint64_t>(m.worker);
    words.chunk_bytes = l.chunk_bytes;
    return words;
  }
  throw Error("inbox_words: no shard named '" + std::string(shard_name) + "'");
}

ParameterServersTestPeer::DynamicWords ParameterServersTestPeer::dynamic_words(PsClient& client, std::string_view name,
                                                                               int ps) {
  const PsEndpoint& endpoint = client;
  const auto& m = static_cast<const ClientCore&>(*endpoint.core_);
  const DynamicLayout& l = m.layout.dynamic(m.dynamic_index(name, "dynamic_words"), ps);
  DynamicWords words;
  words.rank = m.ps_rank[static_cast<std::size_t>(ps)];
  words.request = l.request(m.worker);
  words.doorbell = l.doorbell(m.worker);
  return words;
}

ParameterServersTestPeer::ControlWords ParameterServersTestPeer::control_words(PsEndpoint& endpoint) {
  const PsCore& m = *endpoint.core_;
  ControlWords words;
  words.ps_rank = m.ps0();
  words.save_request = control::kSaveRequest;
  words.clock_of_worker0 = m.layout.clock(0);
  return words;
}

ParameterServersTestPeer::WakeCounts ParameterServersTestPeer::wake_counts(PsEndpoint& endpoint) {
  const PsCore& m = *endpoint.core_;
  WakeCounts counts;
  counts.mapped = std::any_of(m.ps_wake.begin(), m.ps_wake.end(), [](const std::uint32_t* w) { return w != nullptr; });
  counts.sleeps = m.wake_sleeps;
  counts.rung = m.wake_rung;
  return counts;
}

DynamicTableSnapshot ParameterServersTestPeer::export_dynamic(PsServer& server, std::string_view name) {
  PsEndpoint& endpoint = server;
  auto& m = static_cast<ServerCore&>(*endpoint.core_);
  std::lock_guard<std::mutex> lock(m.apply_mu);
  return m.dynamic_state[m.dynamic_index(name, "export_dynamic")].table->export_rows();
}

void ParameterServersTestPeer::put(PsEndpoint& endpoint, int rank, std::uint64_t offset, const void* src,
                                   std::size_t bytes) {
  PsCore& m = *endpoint.core_;
  m.transport->put(*m.region, rank, offset, src, bytes);
  m.transport->flush(*m.region, rank);
}

void ParameterServersTestPeer::put_notify(PsEndpoint& endpoint, int rank, std::uint64_t offset, const void* src,
                                          std::size_t bytes, std::uint64_t counter) {
  PsCore& m = *endpoint.core_;
  m.transport->put_notify(*m.region, rank, offset, src, bytes, bytes, counter, nullptr, 0);
  m.transport->flush(*m.region, rank);
}

std::int64_t ParameterServersTestPeer::fetch_add(PsEndpoint& endpoint, int rank, std::uint64_t offset,
                                                 std::int64_t value) {
  PsCore& m = *endpoint.core_;
  return m.transport->fetch_add(*m.region, rank, offset, value);
}

}  // namespace strata::ps
