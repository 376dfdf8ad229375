// Exact JSON form of VariableSpec lists. Doubles are written with 17 significant digits so that
// every field round-trips bit for bit (the chief's list is what PS ranks initialise from).
#include <nlohmann/json.hpp>

#include "strata/common/error.h"
#include "strata/ps/parameter_servers.h"

namespace strata::ps {
namespace {

using json = nlohmann::json;

json initializer_json(const Initializer& init) {
  return {{"kind", static_cast<int>(init.kind)}, {"value", init.value},   {"minval", init.minval},
          {"maxval", init.maxval},               {"mean", init.mean},     {"stddev", init.stddev},
          {"seed", init.seed}};
}

json partitioner_json(const Partitioner& p) {
  return {{"kind", static_cast<int>(p.kind)},
          {"shards", p.shards},
          {"max_partitions", p.max_partitions},
          {"min_slice_bytes", p.min_slice_bytes},
          {"max_bytes", p.max_bytes},
          {"max_shards", p.max_shards}};
}

}  // namespace

std::string specs_to_json(const std::vector<VariableSpec>& specs) {
  json out = json::array();
  for (const auto& s : specs) {
    out.push_back({{"name", s.name},
                   {"shape", s.shape},
                   {"dtype", to_string(s.dtype)},
                   {"init", initializer_json(s.init)},
                   {"trainable", s.trainable},
                   {"partitioner", partitioner_json(s.partitioner)},
                   {"colocate_with", s.colocate_with}});
    // Only when set, so a job without per-variable optimizers sends what it always sent. The
    // canonical spec round-trips every applicable field exactly (optimizer.h).
    if (s.optimizer) out.back()["optimizer"] = to_string(*s.optimizer);
  }
  return out.dump();
}

std::vector<VariableSpec> specs_from_json(const std::string& text) {
  std::vector<VariableSpec> specs;
  try {
    json doc = json::parse(text);
    for (const auto& v : doc) {
      VariableSpec s;
      s.name = v.at("name").get<std::string>();
      s.shape = v.at("shape").get<Shape>();
      s.dtype = parse_dtype(v.at("dtype").get<std::string>());
      const auto& i = v.at("init");
      s.init.kind = static_cast<Initializer::Kind>(i.at("kind").get<int>());
      s.init.value = i.at("value").get<double>();
      s.init.minval = i.at("minval").get<double>();
      s.init.maxval = i.at("maxval").get<double>();
      s.init.mean = i.at("mean").get<double>();
      s.init.stddev = i.at("stddev").get<double>();
      s.init.seed = i.at("seed").get<std::uint64_t>();
      s.trainable = v.at("trainable").get<bool>();
      const auto& p = v.at("partitioner");
      s.partitioner.kind = static_cast<Partitioner::Kind>(p.at("kind").get<int>());
      s.partitioner.shards = p.at("shards").get<int>();
      s.partitioner.max_partitions = p.at("max_partitions").get<int>();
      s.partitioner.min_slice_bytes = p.at("min_slice_bytes").get<std::uint64_t>();
      s.partitioner.max_bytes = p.at("max_bytes").get<std::uint64_t>();
      s.partitioner.max_shards = p.at("max_shards").get<int>();
      s.colocate_with = v.at("colocate_with").get<std::string>();
      if (v.contains("optimizer")) {
        try {
          s.optimizer = OptimizerConfig::parse(v.at("optimizer").get<std::string>());
        } catch (const ConfigError& e) {
          throw ConfigError("variable '" + s.name + "': optimizer: " + e.message());
        }
      }
      specs.push_back(std::move(s));
    }
  } catch (const json::exception& e) {
    throw Error(std::string("malformed variable list from the chief: ") + e.what());
  }
  return specs;
}

std::string dynamic_specs_to_json(const std::vector<DynamicVariableSpec>& specs) {
  json out = json::array();
  for (const auto& s : specs) {
    out.push_back({{"name", s.name},
                   {"dim", s.dim},
                   {"init", initializer_json(s.init)},
                   {"admit_after", s.admit_after},
                   {"capacity", s.capacity},
                   {"ttl", s.ttl},
                   {"max_ids", s.max_ids}});
  }
  return out.dump();
}

std::vector<DynamicVariableSpec> dynamic_specs_from_json(const std::string& text) {
  std::vector<DynamicVariableSpec> specs;
  try {
    json doc = json::parse(text);
    if (!doc.is_array()) throw Error("malformed dynamic variable list from the chief: not a JSON array");
    for (const auto& v : doc) {
      DynamicVariableSpec s;
      s.name = v.at("name").get<std::string>();
      s.dim = v.at("dim").get<std::int64_t>();
      const auto& i = v.at("init");
      const int kind = i.at("kind").get<int>();
      if (kind < 0 || kind > static_cast<int>(Initializer::Kind::kGlorotUniform))
        throw Error("malformed dynamic variable list from the chief: initializer kind " + std::to_string(kind) +
                    " of '" + s.name + "'");
      s.init.kind = static_cast<Initializer::Kind>(kind);
      s.init.value = i.at("value").get<double>();
      s.init.minval = i.at("minval").get<double>();
      s.init.maxval = i.at("maxval").get<double>();
      s.init.mean = i.at("mean").get<double>();
      s.init.stddev = i.at("stddev").get<double>();
      s.init.seed = i.at("seed").get<std::uint64_t>();
      s.admit_after = v.at("admit_after").get<std::int64_t>();
      s.capacity = v.at("capacity").get<std::int64_t>();
      s.ttl = v.at("ttl").get<std::int64_t>();
      s.max_ids = v.at("max_ids").get<std::int64_t>();
      specs.push_back(std::move(s));
    }
  } catch (const json::exception& e) {
    throw Error(std::string("malformed dynamic variable list from the chief: ") + e.what());
  }
  for (const auto& s : specs) s.validate();
  return specs;
}

}  // namespace strata::ps
