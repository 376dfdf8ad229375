#include "strata/cluster/cluster_spec.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "cluster/config_json.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"

namespace strata::cluster {

using ordered_json = nlohmann::ordered_json;

std::string TaskId::str() const { return valid() ? type + ":" + std::to_string(index) : "?"; }

ClusterSpec ClusterSpec::from_json(const std::string& json_text, const std::string& origin) {
  const ordered_json doc = parse_config_json(json_text, origin);
  if (!doc.is_object()) throw ConfigError(origin + " must be a JSON object mapping job names to task lists");
  ClusterSpec spec;
  for (const auto& [job, tasks] : doc.items()) {
    if (job.empty()) throw ConfigError(origin + ": empty job name");
    spec.add_job(job);
    if (tasks.is_array()) {
      int index = 0;
      for (const auto& address : tasks) {
        if (!address.is_string())
          throw ConfigError(origin + ": job '" + job + "' task " + std::to_string(index) +
                            " address must be a string, got " + json_excerpt(address));
        spec.set_task(job, index++, address.get<std::string>());
      }
    } else if (tasks.is_object()) {
      // TensorFlow's sparse form: {"0": "host:port", "3": "host:port"}.
      for (const auto& [key, address] : tasks.items()) {
        int index = parse_int(key, origin + ": job '" + job + "' task index", 0,
                              std::numeric_limits<int>::max());
        if (!address.is_string())
          throw ConfigError(origin + ": job '" + job + "' task " + key + " address must be a string");
        spec.set_task(job, index, address.get<std::string>());
      }
    } else {
      throw ConfigError(origin + ": job '" + job + "' must be a list of addresses or an {index: address} object, got " +
                        json_excerpt(tasks));
    }
  }
  return spec;
}

void ClusterSpec::add_job(const std::string& name) {
  if (!has_job(name)) jobs_.emplace_back(name, std::map<int, std::string>{});
}

void ClusterSpec::set_task(const std::string& job, int index, const std::string& address) {
  add_job(job);
  for (auto& [name, tasks] : jobs_) {
    if (name == job) tasks[index] = address;
  }
}

std::vector<std::string> ClusterSpec::job_names() const {
  std::vector<std::string> names;
  for (const auto& job : jobs_) names.push_back(job.first);
  return names;
}

bool ClusterSpec::has_job(const std::string& job) const {
  return std::any_of(jobs_.begin(), jobs_.end(), [&](const auto& j) { return j.first == job; });
}

int ClusterSpec::num_tasks(const std::string& job) const {
  for (const auto& [name, tasks] : jobs_)
    if (name == job) return static_cast<int>(tasks.size());
  return 0;
}

std::vector<int> ClusterSpec::task_indices(const std::string& job) const {
  std::vector<int> out;
  for (const auto& [name, tasks] : jobs_)
    if (name == job)
      for (const auto& task : tasks) out.push_back(task.first);
  return out;
}

std::optional<std::string> ClusterSpec::task_address(const std::string& job, int index) const {
  for (const auto& [name, tasks] : jobs_) {
    if (name != job) continue;
    auto it = tasks.find(index);
    if (it != tasks.end()) return it->second;
  }
  return std::nullopt;
}

bool ClusterSpec::has_task(const TaskId& task) const { return task_address(task.type, task.index).has_value(); }

int ClusterSpec::total_tasks() const {
  int total = 0;
  for (const auto& job : jobs_) total += static_cast<int>(job.second.size());
  return total;
}

std::vector<TaskId> ClusterSpec::tasks() const {
  std::vector<TaskId> out;
  for (const auto& [name, tasks] : jobs_)
    for (const auto& task : tasks) out.push_back(TaskId{name, task.first});
  return out;
}

std::string ClusterSpec::summary() const {
  auto sorted = jobs_;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& [name, tasks] : sorted) {
    if (!out.empty()) out += ",";
    out += name + "=" + std::to_string(tasks.size());
  }
  return out.empty() ? "(empty)" : out;
}

std::string ClusterSpec::canonical_string() const {
  auto sorted = jobs_;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Length-prefixed fields: no address or job name can forge a separator.
  std::string out;
  for (const auto& [name, tasks] : sorted) {
    out += std::to_string(name.size()) + ":" + name + "{";
    for (const auto& [index, address] : tasks)
      out += std::to_string(index) + "=" + std::to_string(address.size()) + ":" + address + ";";
    out += "}";
  }
  return out;
}

std::uint64_t ClusterSpec::hash() const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : canonical_string()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string ClusterSpec::to_json() const {
  ordered_json out = ordered_json::object();
  for (const auto& [name, tasks] : jobs_) {
    bool dense = true;
    int expected = 0;
    for (const auto& task : tasks) dense = dense && task.first == expected++;
    if (dense) {
      ordered_json list = ordered_json::array();
      for (const auto& task : tasks) list.push_back(task.second);
      out[name] = list;
    } else {
      ordered_json sparse = ordered_json::object();
      for (const auto& [index, address] : tasks) sparse[std::to_string(index)] = address;
      out[name] = sparse;
    }
  }
  return out.dump();
}

}  // namespace strata::cluster
