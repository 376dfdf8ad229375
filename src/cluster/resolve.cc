// Cluster resolvers. Each follows the TensorFlow resolver of the same name, with the deviations
// docs/ARCHITECTURE.md lists ("Where strata deliberately differs from TensorFlow's resolvers");
// every deviation is marked "TF:" below.
#include "strata/cluster/resolve.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cluster/config_json.h"
#include "strata/cluster/hostlist.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"

namespace strata::cluster {
namespace {

using ordered_json = nlohmann::ordered_json;
constexpr int kIntMax = std::numeric_limits<int>::max();

bool valid_job_name(const std::string& name) {
  if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

// First variable of `names` that is set and non-empty.
std::optional<std::pair<std::string, std::string>> first_of(const Env& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto value = env.get(name); value && !value->empty()) return std::make_pair(std::string(name), *value);
  }
  return std::nullopt;
}

// A cluster file is read up to kMaxConfigFileBytes: more is refused, so /dev/zero or a huge file
// is never read whole into memory. Pipes (--cluster <(...)) are fine.
constexpr std::size_t kMaxPathBytes = 4096;  // PATH_MAX
constexpr std::size_t kMaxConfigFileBytes = 64 << 20;

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(what + ": cannot read file '" + path + "' (" + std::strerror(errno) + ")");
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxConfigFileBytes)
      throw ConfigError(what + ": file '" + path + "' is larger than " + std::to_string(kMaxConfigFileBytes >> 20) +
                        " MiB; a cluster description is far smaller");
  }
  if (in.bad()) throw ConfigError(what + ": cannot read file '" + path + "' (" + std::strerror(errno) + ")");
  return text;
}

// TF casts task.index with int(); strata accepts integers, integral floats and integer strings, and
// rejects what int() would silently truncate (2.7) or coerce (true).
int task_index_from_json(const ordered_json& value, const std::string& origin) {
  if (value.is_number_integer()) {
    auto v = value.get<std::int64_t>();
    if (v < 0 || v > kIntMax) throw ConfigError(origin + ": task index " + json_excerpt(value) + " is out of range");
    return static_cast<int>(v);
  }
  if (value.is_number_float()) {
    double v = value.get<double>();
    if (std::floor(v) != v || v < 0 || v > kIntMax)
      throw ConfigError(origin + ": task index " + json_excerpt(value) + " is not a non-negative integer");
    return static_cast<int>(v);
  }
  if (value.is_string()) return parse_int(value.get<std::string>(), origin + ": task index", 0, kIntMax);
  throw ConfigError(origin + ": task index must be an integer, got " + json_excerpt(value));
}

// TF casts task.type with str(): numbers become their text.
std::string task_type_from_json(const ordered_json& value, const std::string& origin) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number()) return value.dump();
  throw ConfigError(origin + ": task type must be a string, got " + json_excerpt(value));
}

std::optional<std::string> optional_string(const ordered_json& doc, const char* key, const std::string& origin) {
  if (!doc.contains(key) || doc[key].is_null()) return std::nullopt;
  if (!doc[key].is_string()) throw ConfigError(origin + ": '" + key + "' must be a string, got " + json_excerpt(doc[key]));
  return doc[key].get<std::string>();
}

// Shared by TF_CONFIG and TF_CONFIG-shaped --cluster documents.
ResolvedCluster resolve_tf_document(const std::string& text, const std::string& origin, const Env& env,
                                    const ResolveOptions& options, const ProcessInfo& process) {
  const ordered_json doc = parse_config_json(text, origin);
  if (!doc.is_object()) throw ConfigError(origin + " must be a JSON object, got " + std::string(doc.type_name()));
  ResolvedCluster out;
  if (doc.contains("cluster") && !doc["cluster"].is_null())
    out.cluster = ClusterSpec::from_json(doc["cluster"].dump(), origin + " 'cluster'");
  if (doc.contains("task") && !doc["task"].is_null()) {
    const auto& task = doc["task"];
    if (!task.is_object()) throw ConfigError(origin + ": 'task' must be an object like {\"type\": \"worker\", \"index\": 0}");
    if (task.contains("type")) out.task.type = task_type_from_json(task["type"], origin);
    if (task.contains("index")) out.task.index = task_index_from_json(task["index"], origin);
  }
  out.rpc_layer = options.rpc_layer ? *options.rpc_layer : optional_string(doc, "rpc_layer", origin).value_or("");
  out.environment = optional_string(doc, "environment", origin).value_or("");
  out.session_master = optional_string(doc, "session_master", origin).value_or("");
  out.num_gpus = visible_gpus(env, process.physical_gpus);
  if (auto cvd = env.get("CUDA_VISIBLE_DEVICES")) out.cuda_visible_devices = *cvd;
  return out;
}

// ---- where the tasks of a Slurm step run --------------------------------------------------------
// Slurm numbers a step's tasks across its nodes according to the distribution (srun -m): block
// (the default) fills each node before the next, cyclic deals one task per node in turn, plane=N
// deals N at a time, arbitrary follows SLURM_HOSTFILE line by line, and a heterogeneous step puts
// each component's tasks on that component's nodes. SLURM_STEP_TASKS_PER_NODE only counts the
// tasks on each node; which task is where comes from, first that applies:
//   1. SLURM_PMIX_MAPPING_SERV (srun --mpi=pmix, as strata runs under srun): Slurm's own map of
//      the step, "(vector,(NODE,COUNT,DEPTH),...)": DEPTH consecutive tasks on each of the COUNT
//      nodes from NODE on, for every distribution and for heterogeneous steps;
//   2. SLURM_DISTRIBUTION (block, cyclic, plane with SLURM_DIST_PLANESIZE, arbitrary with a
//      readable SLURM_HOSTFILE), laid out the way Slurm lays out tasks over the given counts.
// TF: SlurmClusterResolver assumes block order, which gives a task another node's address under
// any other distribution.
struct StepLayout {
  std::vector<int> node_of;   // node index (into the step's node list) of every task
  std::vector<int> local_of;  // index of the task among the tasks of its node (SLURM_LOCALID)
  std::string origin;         // what it was derived from, for messages
};

void fill_local_indices(StepLayout& layout, std::size_t num_nodes) {
  std::vector<int> seen(num_nodes, 0);
  layout.local_of.clear();
  for (int node : layout.node_of) layout.local_of.push_back(seen[node]++);
}

// The PMIx process map, or nullopt when it is malformed or does not describe exactly these
// counts (e.g. --tasks-per-node overrides them); anything else then decides the layout.
std::optional<std::vector<int>> parse_pmix_map(const std::string& text, const std::vector<int>& per_node) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  const std::string head = "(vector";
  if (s.rfind(head, 0) != 0 || s.size() < head.size() + 1 || s.back() != ')') return std::nullopt;
  std::vector<int> node_of;
  std::vector<int> count(per_node.size(), 0);
  std::size_t pos = head.size();
  const std::size_t end = s.size() - 1;
  while (pos < end) {
    if (s.compare(pos, 2, ",(") != 0) return std::nullopt;
    std::size_t close = s.find(')', pos);
    if (close == std::string::npos || close >= end) return std::nullopt;
    std::vector<std::string> fields = split(s.substr(pos + 2, close - pos - 2), ',');
    if (fields.size() != 3) return std::nullopt;
    long long v[3];
    for (int i = 0; i < 3; ++i) {
      const std::string& f = fields[i];
      if (f.empty() || f.size() > 9 || !std::all_of(f.begin(), f.end(), ::isdigit)) return std::nullopt;
      v[i] = std::stoll(f);
    }
    const long long start = v[0], nodes = v[1], depth = v[2];
    if (nodes < 1 || depth < 1 || start + nodes > static_cast<long long>(per_node.size())) return std::nullopt;
    for (long long n = start; n < start + nodes; ++n) {
      for (long long d = 0; d < depth; ++d) {
        if (++count[n] > per_node[n]) return std::nullopt;
        node_of.push_back(static_cast<int>(n));
      }
    }
    pos = close + 1;
  }
  if (count != per_node) return std::nullopt;
  return node_of;
}

// Tasks dealt over the nodes in rounds, each node taking up to `chunk` per round until it holds
// its count: chunk 1 is Slurm's cyclic layout, chunk N its plane=N layout (slurm_step_layout.c).
// A block layout is the same with an unbounded chunk.
std::vector<int> deal_tasks(const std::vector<int>& per_node, long long chunk) {
  std::vector<int> node_of, left = per_node;
  bool placed = true;
  while (placed) {
    placed = false;
    for (std::size_t n = 0; n < left.size(); ++n) {
      for (long long k = 0; k < chunk && left[n] > 0; ++k, --left[n]) {
        node_of.push_back(static_cast<int>(n));
        placed = true;
      }
    }
  }
  return node_of;
}

// SLURM_HOSTFILE as Slurm reads it for -m arbitrary: one host (or hostlist) a line, '#' starts a
// comment; task i runs on the i-th name.
std::vector<int> hostfile_layout(const std::string& path, const std::vector<std::string>& hosts,
                                 const std::vector<int>& per_node, const std::string& counts_origin) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError("SLURM_DISTRIBUTION=arbitrary: the task layout is in SLURM_HOSTFILE=" + path +
                      ", which cannot be read here (" + std::strerror(errno) +
                      "); launch with srun --mpi=pmix (strata then reads Slurm's task map) or put the "
                      "hostfile on a file system every node sees");
  const int total = std::accumulate(per_node.begin(), per_node.end(), 0);
  std::vector<int> node_of;
  std::string line;
  while (static_cast<int>(node_of.size()) < total && std::getline(in, line)) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::vector<std::string> names;
    try {
      names = expand_hostlist(line);
    } catch (const ConfigError& e) {
      throw ConfigError("SLURM_HOSTFILE=" + path + ": " + e.message());
    }
    for (const auto& name : names) {
      if (static_cast<int>(node_of.size()) == total) break;
      auto it = std::find(hosts.begin(), hosts.end(), name);
      if (it == hosts.end())
        throw ConfigError("SLURM_HOSTFILE=" + path + " names " + name + ", which is not a node of the step");
      node_of.push_back(static_cast<int>(it - hosts.begin()));
    }
  }
  std::vector<int> count(per_node.size(), 0);
  for (int n : node_of) ++count[n];
  if (static_cast<int>(node_of.size()) != total || count != per_node)
    throw ConfigError("SLURM_HOSTFILE=" + path + " does not match the step (" + counts_origin + ")");
  return node_of;
}

StepLayout step_layout(const Env& env, const std::vector<std::string>& hosts, const std::vector<int>& per_node,
                       const std::string& counts_origin) {
  StepLayout layout;
  if (auto map = env.get("SLURM_PMIX_MAPPING_SERV"); map && !map->empty()) {
    if (auto node_of = parse_pmix_map(*map, per_node)) {
      layout.node_of = std::move(*node_of);
      layout.origin = "SLURM_PMIX_MAPPING_SERV=" + *map;
      fill_local_indices(layout, hosts.size());
      return layout;
    }
  }
  const std::string dist = env.get_string("SLURM_DISTRIBUTION", "");
  const std::string dist_origin = dist.empty() ? "block order" : "SLURM_DISTRIBUTION=" + dist;
  // "cyclic:block,Pack": the part before ':' places tasks on nodes, the rest within a node.
  std::string kind = dist.substr(0, dist.find_first_of(":,"));
  long long chunk = 0;
  if (kind.empty() || kind == "block" || kind == "*") {
    chunk = std::numeric_limits<int>::max();
  } else if (kind == "cyclic") {
    chunk = 1;
  } else if (kind == "plane" || kind.rfind("plane=", 0) == 0) {
    // srun sets "plane" and SLURM_DIST_PLANESIZE; "plane=N" is the form a user may export.
    const bool inline_size = kind != "plane";
    std::string size = inline_size ? kind.substr(6) : env.get_string("SLURM_DIST_PLANESIZE", "");
    if (size.empty()) throw ConfigError(dist_origin + " without a plane size (SLURM_DIST_PLANESIZE is not set)");
    chunk = parse_int(size, inline_size ? "SLURM_DISTRIBUTION plane size" : "SLURM_DIST_PLANESIZE", 1, kIntMax);
  } else if (kind == "arbitrary") {
    auto file = env.get("SLURM_HOSTFILE");
    if (!file || file->empty())
      throw ConfigError("SLURM_DISTRIBUTION=arbitrary but SLURM_HOSTFILE is not set: the task layout is unknown; "
                        "launch with srun --mpi=pmix (strata then reads Slurm's task map)");
    layout.node_of = hostfile_layout(*file, hosts, per_node, counts_origin);
    layout.origin = dist_origin + " (SLURM_HOSTFILE=" + *file + ")";
    fill_local_indices(layout, hosts.size());
    return layout;
  } else {
    throw ConfigError(dist_origin + ": unknown task distribution '" + kind +
                      "' (strata knows block, cyclic, plane and arbitrary); launch with srun --mpi=pmix, whose "
                      "task map strata reads, or describe the cluster with --cluster");
  }
  layout.node_of = deal_tasks(per_node, chunk);
  layout.origin = dist_origin + " over " + counts_origin;
  fill_local_indices(layout, hosts.size());
  return layout;
}

int rank_for(const Env& env, const ProcessInfo& process) {
  return process.rank >= 0 ? process.rank : launcher_rank_hint(env);
}

}  // namespace

const char* to_string(ResolverKind kind) {
  switch (kind) {
    case ResolverKind::kAuto: return "auto";
    case ResolverKind::kExplicit: return "explicit";
    case ResolverKind::kTfConfig: return "tfconfig";
    case ResolverKind::kSlurm: return "slurm";
    case ResolverKind::kMpi: return "mpi";
  }
  return "?";
}

ResolverKind parse_resolver_kind(std::string_view text) {
  for (auto kind : {ResolverKind::kAuto, ResolverKind::kExplicit, ResolverKind::kTfConfig, ResolverKind::kSlurm,
                    ResolverKind::kMpi}) {
    if (text == to_string(kind)) return kind;
  }
  throw ConfigError("--resolver: '" + std::string(text) + "' is not one of auto, explicit, tfconfig, slurm, mpi");
}

JobsSpec parse_jobs_spec(std::string_view text) {
  JobsSpec jobs;
  if (trim(text).empty()) throw ConfigError("--jobs: empty jobs spec (expected e.g. ps=1,worker=3)");
  for (const std::string& field : split(text, ',')) {
    auto eq = field.find('=');
    if (eq == std::string::npos)
      throw ConfigError("--jobs: '" + field + "' in '" + std::string(text) + "' is not JOB=COUNT (e.g. ps=1,worker=3)");
    std::string name = field.substr(0, eq);
    if (!valid_job_name(name))
      throw ConfigError("--jobs: '" + name + "' in '" + std::string(text) + "' is not a valid job name");
    int count = parse_int(field.substr(eq + 1), "--jobs: count of '" + name + "'", 0, 1 << 24);
    for (const auto& job : jobs) {
      if (job.first == name) throw ConfigError("--jobs: job '" + name + "' appears twice in '" + std::string(text) + "'");
    }
    jobs.emplace_back(name, count);
  }
  return jobs;
}

std::string format_jobs_spec(const JobsSpec& jobs) {
  std::string out;
  for (const auto& [name, count] : jobs) out += (out.empty() ? "" : ",") + name + "=" + std::to_string(count);
  return out;
}

std::string ResolvedCluster::master() const {
  if (task.valid()) {
    if (auto address = cluster.task_address(task.type, task.index))
      return rpc_layer.empty() ? *address : rpc_layer + "://" + *address;
  }
  return session_master;
}

std::string ResolvedCluster::to_json() const {
  ordered_json out = ordered_json::object();
  out["cluster"] = ordered_json::parse(cluster.to_json());
  if (task.valid())
    out["task"] = {{"type", task.type}, {"index", task.index}};
  else
    out["task"] = nullptr;
  out["rpc_layer"] = rpc_layer.empty() ? ordered_json(nullptr) : ordered_json(rpc_layer);
  out["num_accelerators"] = {{"GPU", num_gpus}};
  out["cuda_visible_devices"] = cuda_visible_devices ? ordered_json(*cuda_visible_devices) : ordered_json(nullptr);
  out["environment"] = environment;
  out["master"] = master();
  out["resolver"] = to_string(resolver);
  return out.dump();
}

int launcher_rank_hint(const Env& env) {
  if (auto v = first_of(env, {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}))
    return parse_int(v->second, v->first, 0, kIntMax);
  return -1;
}

int launcher_size_hint(const Env& env) {
  if (auto v = first_of(env, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}))
    return parse_int(v->second, v->first, 1, kIntMax);
  return -1;
}

ResolvedCluster resolve_explicit(const std::string& file_or_json, const Env& env, const ResolveOptions& options,
                                 const ProcessInfo& process, const std::string& source) {
  std::string text = trim(file_or_json);
  std::string origin = source;
  if (text.empty()) throw ConfigError(source + ": empty value (expected a JSON object or a file)");
  if (text.front() != '{') {
    if (text.size() > kMaxPathBytes)
      throw ConfigError(source + ": neither a JSON object (it does not start with '{') nor a file name (" +
                        std::to_string(text.size()) + " bytes)");
    origin = source + " file '" + text + "'";
    text = read_text_file(text, source);
  }
  const ordered_json probe = parse_config_json(text, origin);
  ResolvedCluster out;
  if (probe.is_object() && probe.contains("cluster")) {
    // TF_CONFIG-shaped: {"cluster": {...}, "task": {...}, "rpc_layer": ...}
    out = resolve_tf_document(text, origin, env, options, process);
  } else {
    out.cluster = ClusterSpec::from_json(text, origin);
    out.rpc_layer = options.rpc_layer.value_or("");
    out.num_gpus = visible_gpus(env, process.physical_gpus);
    if (auto cvd = env.get("CUDA_VISIBLE_DEVICES")) out.cuda_visible_devices = *cvd;
  }
  // A job map without a task: rank r takes the r-th task (jobs in the order written).
  if (!out.task.valid()) {
    int rank = rank_for(env, process);
    auto tasks = out.cluster.tasks();
    if (rank >= 0 && rank < static_cast<int>(tasks.size())) out.task = tasks[rank];
  }
  out.resolver = ResolverKind::kExplicit;
  return out;
}

ResolvedCluster resolve_tf_config(const std::string& tf_config, const Env& env, const ResolveOptions& options,
                                  const ProcessInfo& process) {
  ResolvedCluster out = resolve_tf_document(tf_config, "TF_CONFIG", env, options, process);
  out.resolver = ResolverKind::kTfConfig;
  return out;
}

ResolvedCluster resolve_slurm(const Env& env, const ResolveOptions& options, const ProcessInfo& process) {
  auto procid = env.get("SLURM_PROCID");
  if (!procid || procid->empty())
    throw ConfigError("SLURM_PROCID is not set: not inside a Slurm step (launch with srun, or choose --resolver)");
  const int rank = parse_int(*procid, "SLURM_PROCID", 0, kIntMax);

  auto nodelist = first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!nodelist) throw ConfigError("SLURM_STEP_NODELIST (and SLURM_JOB_NODELIST) is not set: cannot list the nodes");
  std::vector<std::string> hosts;
  try {
    hosts = expand_hostlist(nodelist->second);
  } catch (const ConfigError& e) {
    throw ConfigError(nodelist->first + ": " + e.message());
  }

  // TF: tasks are laid out in sorted host order; strata keeps Slurm's node order, the order of
  // SLURM_STEP_TASKS_PER_NODE and of Slurm's own task map.
  std::vector<int> per_node;
  std::string per_node_origin;
  if (options.tasks_per_node) {
    per_node.assign(hosts.size(), *options.tasks_per_node);
    per_node_origin = "--tasks-per-node " + std::to_string(*options.tasks_per_node);
  } else {
    auto tpn = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
    if (!tpn) throw ConfigError("SLURM_STEP_TASKS_PER_NODE is not set and --tasks-per-node was not given");
    try {
      per_node = expand_tasks_per_node(tpn->second);
    } catch (const ConfigError& e) {
      throw ConfigError(tpn->first + ": " + e.message());
    }
    per_node_origin = tpn->first + "=" + tpn->second;
    // TF zips the two lists and silently drops the excess; a mismatch means the environment is
    // inconsistent, so say so.
    if (per_node.size() != hosts.size())
      throw ConfigError(per_node_origin + " describes " + std::to_string(per_node.size()) + " node(s) but " +
                        nodelist->first + "=" + nodelist->second + " has " + std::to_string(hosts.size()));
  }
  int total = 0, max_per_node = 0;
  for (int n : per_node) {
    total += n;
    max_per_node = std::max(max_per_node, n);
  }

  JobsSpec jobs = options.jobs;
  // STRATA_JOBS (strata-mpirun --evaluator sets it) stands in for --jobs unless --num-ps is given.
  if (jobs.empty() && !options.num_ps && env.has("STRATA_JOBS"))
    jobs = parse_jobs_spec(env.get_string("STRATA_JOBS", ""));
  if (jobs.empty()) {
    int num_tasks = total;
    if (auto n = first_of(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}))
      num_tasks = parse_int(n->second, n->first, 1, kIntMax);
    // TF's default is every task a worker; a PS count (--num-ps / STRATA_NUM_PS, a strata
    // extension) turns the first tasks into parameter servers, as with plain MPI.
    const int num_ps = options.num_ps ? *options.num_ps
                                      : parse_int(env.get_string("STRATA_NUM_PS", "0"), "STRATA_NUM_PS", 0, kIntMax);
    if (num_ps >= num_tasks)
      throw ConfigError("--num-ps " + std::to_string(num_ps) + " leaves no worker among the step's " +
                        std::to_string(num_tasks) + " task(s)");
    if (num_ps > 0) jobs.emplace_back("ps", num_ps);
    jobs.emplace_back("worker", num_tasks - num_ps);
  }
  int requested = 0;
  for (const auto& job : jobs) requested += job.second;
  if (requested != total)
    throw ConfigError("jobs " + format_jobs_spec(jobs) + " ask for " + std::to_string(requested) +
                      " tasks but the Slurm step has " + std::to_string(total) + " (" + per_node_origin + ")");
  if (rank >= total)
    throw ConfigError("SLURM_PROCID=" + std::to_string(rank) + " is outside the step's " + std::to_string(total) +
                      " tasks");

  int gpus_per_node = 0;
  if (options.gpus_per_node)
    gpus_per_node = *options.gpus_per_node;
  else if (auto g = env.get("SLURM_GPUS_ON_NODE"); g && !g->empty())
    gpus_per_node = parse_int(*g, "SLURM_GPUS_ON_NODE", 0, 1 << 16);
  else
    gpus_per_node = process.physical_gpus;
  if (gpus_per_node < 0) throw ConfigError("GPUs per node must not be negative, got " + std::to_string(gpus_per_node));
  int gpus_per_task = options.gpus_per_task.value_or(max_per_node > 0 ? gpus_per_node / max_per_node : 0);
  if (gpus_per_task < 0) throw ConfigError("GPUs per task must not be negative, got " + std::to_string(gpus_per_task));
  if (static_cast<long long>(gpus_per_task) * max_per_node > gpus_per_node)
    throw ConfigError(std::to_string(gpus_per_task) + " GPU(s) per task x " + std::to_string(max_per_node) +
                      " tasks on a node needs " + std::to_string(gpus_per_task * max_per_node) +
                      " GPUs but a node has " + std::to_string(gpus_per_node) +
                      " (--gpus-per-node, SLURM_GPUS_ON_NODE)");

  // Where each task runs (see step_layout): its node and its index among that node's tasks, which
  // give its address (host:port_base+local) and its GPUs.
  const StepLayout layout = step_layout(env, hosts, per_node, per_node_origin);

  // Cross-check with what Slurm tells this task about itself: a layout that puts it elsewhere
  // would give it (and others) another node's address, so it is an error naming the task, never a
  // silently wrong cluster. (Every rank checks itself; bootstrap then names every failing rank.)
  if (auto me = env.get("SLURMD_NODENAME"); me && !me->empty()) {
    const std::string& placed = hosts[layout.node_of[rank]];
    const int placed_local = layout.local_of[rank];
    std::optional<int> local_id;
    if (auto l = env.get("SLURM_LOCALID"); l && !l->empty()) local_id = parse_int(*l, "SLURM_LOCALID", 0, kIntMax);
    if (*me != placed || (local_id && *local_id != placed_local))
      throw ConfigError("SLURM_PROCID=" + std::to_string(rank) + " runs on " + *me + " (SLURMD_NODENAME" +
                        (local_id ? ", SLURM_LOCALID=" + std::to_string(*local_id) : std::string()) + ") but " +
                        layout.origin + " puts it on " + placed + " as local task " + std::to_string(placed_local) +
                        ": its address would name the wrong node (launch with srun --mpi=pmix, whose task map "
                        "strata reads, or pass --cluster)");
  }

  // One entry per task in task order: address host:port_base+local and its GPUs.
  std::vector<std::string> addresses, gpu_lists;
  for (int task = 0; task < total; ++task) {
    const int local = layout.local_of[task];
    addresses.push_back(hosts[layout.node_of[task]] + ":" + std::to_string(options.port_base + local));
    std::string gpus;
    for (int g = local * gpus_per_task; g < (local + 1) * gpus_per_task; ++g)
      gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
    gpu_lists.push_back(gpus);
  }

  ResolvedCluster out;
  out.resolver = ResolverKind::kSlurm;
  int offset = 0;
  for (const auto& [name, count] : jobs) {
    out.cluster.add_job(name);
    for (int i = 0; i < count; ++i) out.cluster.set_task(name, i, addresses[offset + i]);
    if (rank >= offset && rank < offset + count) out.task = TaskId{name, rank - offset};
    offset += count;
  }
  out.rpc_layer = options.rpc_layer.value_or("grpc");
  out.num_gpus = gpus_per_task;  // TF: num_accelerators() is {"GPU": gpus_per_task}
  if (options.auto_set_gpu)
    out.cuda_visible_devices = gpu_lists[rank];
  else if (auto cvd = env.get("CUDA_VISIBLE_DEVICES"))
    out.cuda_visible_devices = *cvd;
  return out;
}

ResolvedCluster resolve_mpi(const Env& env, const ResolveOptions& options, const ProcessInfo& process) {
  int size = process.size > 0 ? process.size : launcher_size_hint(env);
  if (size <= 0) size = 1;
  int rank = rank_for(env, process);
  if (rank < 0) rank = 0;
  JobsSpec jobs = options.jobs;
  // STRATA_JOBS (strata-mpirun --evaluator sets it) stands in for --jobs unless --num-ps is given.
  if (jobs.empty() && !options.num_ps && env.has("STRATA_JOBS"))
    jobs = parse_jobs_spec(env.get_string("STRATA_JOBS", ""));
  if (jobs.empty()) {
    // mpi_launch/strata-mpirun passes the PS count through STRATA_NUM_PS.
    const int num_ps = options.num_ps ? *options.num_ps
                                      : static_cast<int>(parse_int(env.get_string("STRATA_NUM_PS", "0"),
                                                                   "STRATA_NUM_PS", 0, kIntMax));
    if (num_ps < 0 || num_ps >= size)
      throw ConfigError("--num-ps " + std::to_string(num_ps) + " leaves no worker among " + std::to_string(size) +
                        " rank(s)");
    if (num_ps > 0) jobs.emplace_back("ps", num_ps);
    jobs.emplace_back("worker", size - num_ps);
  }
  int requested = 0;
  for (const auto& job : jobs) requested += job.second;
  if (requested != size)
    throw ConfigError("jobs " + format_jobs_spec(jobs) + " ask for " + std::to_string(requested) +
                      " tasks but the job has " + std::to_string(size) + " MPI rank(s)");

  ResolvedCluster out;
  out.resolver = ResolverKind::kMpi;
  std::map<std::string, int> next_port;
  int r = 0;
  for (const auto& [name, count] : jobs) {
    out.cluster.add_job(name);
    for (int i = 0; i < count; ++i, ++r) {
      std::string host = static_cast<int>(process.rank_hosts.size()) == size ? process.rank_hosts[r]
                                                                               : process.hostname;
      int port = options.port_base + next_port[host]++;
      out.cluster.set_task(name, i, host + ":" + std::to_string(port));
      if (r == rank) out.task = TaskId{name, i};
    }
  }
  out.rpc_layer = options.rpc_layer.value_or("mpi");
  out.num_gpus = visible_gpus(env, process.physical_gpus);
  if (auto cvd = env.get("CUDA_VISIBLE_DEVICES")) out.cuda_visible_devices = *cvd;
  return out;
}

ResolverKind choose_resolver(const Env& env, const ResolveOptions& options) {
  if (options.resolver != ResolverKind::kAuto) return options.resolver;
  if (!options.cluster.empty() || env.has("STRATA_CLUSTER")) return ResolverKind::kExplicit;
  if (env.has("TF_CONFIG")) return ResolverKind::kTfConfig;
  // Under mpirun inside an allocation, SLURM_PROCID belongs to Open MPI's daemon, not to the rank:
  // the Slurm step variables do not describe the MPI job, so use the MPI resolver.
  if (env.has("SLURM_PROCID") && !env.has("OMPI_COMM_WORLD_RANK")) return ResolverKind::kSlurm;
  return ResolverKind::kMpi;
}

ResolvedCluster resolve(const Env& env, const ResolveOptions& options, const ProcessInfo& process) {
  ResolvedCluster out;
  switch (choose_resolver(env, options)) {
    case ResolverKind::kExplicit:
      if (options.cluster.empty())
        out = resolve_explicit(env.get_string("STRATA_CLUSTER", ""), env, options, process, "STRATA_CLUSTER");
      else
        out = resolve_explicit(options.cluster, env, options, process, "--cluster");
      break;
    case ResolverKind::kTfConfig:
      out = resolve_tf_config(env.get_string("TF_CONFIG", "{}"), env, options, process);
      break;
    case ResolverKind::kSlurm:
      out = resolve_slurm(env, options, process);
      break;
    case ResolverKind::kMpi:
    case ResolverKind::kAuto:
      out = resolve_mpi(env, options, process);
      break;
  }
  // --task-type / --task-id override the resolved task, as TF's constructor arguments do.
  if (options.task_type) out.task.type = *options.task_type;
  if (options.task_id) out.task.index = *options.task_id;

  const std::string origin = to_string(out.resolver);
  if (!out.task.type.empty() || out.task.index >= 0) {
    if (out.task.type.empty())
      throw ConfigError("task index " + std::to_string(out.task.index) + " given without a task type (" + origin + ")");
    if (out.task.index < 0)
      throw ConfigError("task type '" + out.task.type + "' given without a task index (" + origin + ")");
    if (out.cluster.empty())
      throw ConfigError("task " + out.task.str() + " but the cluster is empty (" + origin + ")");
    if (!out.cluster.has_job(out.task.type)) {
      std::string jobs;
      for (const auto& name : out.cluster.job_names()) jobs += (jobs.empty() ? "" : ", ") + name;
      throw ConfigError("task type '" + out.task.type + "' is not a job of the cluster (jobs: " + jobs + ") (" +
                        origin + ")");
    }
    if (!out.cluster.has_task(out.task)) {
      auto indices = out.cluster.task_indices(out.task.type);
      throw ConfigError("task index " + std::to_string(out.task.index) + " is out of range for job '" +
                        out.task.type + "' (" + std::to_string(indices.size()) + " task(s), indices " +
                        (indices.empty() ? std::string("none")
                                         : std::to_string(indices.front()) + ".." + std::to_string(indices.back())) +
                        ") (" + origin + ")");
    }
  }
  return out;
}

int visible_gpus(const Env& env, int physical_gpus) {
  auto cvd = env.get("CUDA_VISIBLE_DEVICES");
  if (!cvd) return physical_gpus;
  // CUDA stops at the first entry that is not a valid device; "" or "-1" hides every GPU.
  int count = 0;
  for (const std::string& field : split(*cvd, ',')) {
    std::string entry = trim(field);
    if (entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0) {
      ++count;
      continue;
    }
    if (entry.empty() || !std::all_of(entry.begin(), entry.end(), ::isdigit)) break;
    if (std::stoll(entry.substr(0, 9)) >= physical_gpus) break;
    ++count;
  }
  return std::min(count, physical_gpus);
}

int count_physical_gpus() {
  int count = 0;
  if (DIR* dir = opendir("/dev")) {
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
          std::all_of(name.begin() + 6, name.end(), ::isdigit))
        ++count;
    }
    closedir(dir);
  }
  return count;
}

}  // namespace strata::cluster
