// The built-in models' configuration check and the model-independent helpers of
// strata/model/model.h: seed derivation and local SGD.
#include "strata/model/model.h"

#include <algorithm>
#include <unordered_map>

#include "strata/common/error.h"

namespace strata::model {
namespace {

std::string join_names() {
  std::string s;
  for (const std::string& n : model_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// One message shape for every size check: "model mlp: input_dim must be >= 1, got 0".
void check_positive(const ModelConfig& c, const char* field, std::int64_t value, std::int64_t min) {
  if (value < min)
    throw ConfigError("model " + c.name + ": " + field + " must be >= " + std::to_string(min) + ", got " +
                      std::to_string(value));
}

}  // namespace

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> kNames{"softmax", "mlp", "wide_deep"};
  return kNames;
}

std::uint64_t derive_seed(std::uint64_t model_seed, const std::string& variable_name) {
  // FNV-1a 64: stable everywhere, unlike std::hash. The XOR keeps "one model seed" the only knob
  // while giving every variable its own stream (ps::fill mixes the seed again before use).
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : variable_name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return model_seed ^ h;
}

// Validates everything the built-in graphs rely on (sizes >= 1, known name) and fills the
// defaults, so the summary line reports what runs.
ModelConfig resolve_model_config(const ModelConfig& config) {
  ModelConfig c = config;
  const bool known = c.name == "softmax" || c.name == "mlp" || c.name == "wide_deep";
  if (!known) throw ConfigError("unknown model '" + c.name + "' (known: " + join_names() + ")");
  check_positive(c, "num_classes", c.num_classes, 2);
  for (int width : c.hidden) check_positive(c, "every hidden layer width", width, 1);
  if (c.name == "softmax") {
    c.hidden.clear();
    check_positive(c, "input_dim", c.input_dim, 1);
    return c;
  }
  if (c.name == "mlp") {
    if (c.hidden.empty()) c.hidden = default_mlp_hidden();
    check_positive(c, "input_dim", c.input_dim, 1);
    return c;
  }
  if (c.hidden.empty()) c.hidden = default_wide_deep_hidden();
  if (c.embed_dim == 0) c.embed_dim = kDefaultEmbedDim;
  check_positive(c, "input_dim (dense features)", c.input_dim, 0);
  check_positive(c, "num_fields", c.num_fields, 1);
  check_positive(c, "vocab", c.vocab, 1);
  check_positive(c, "embed_dim", c.embed_dim, 1);
  return c;
}

void sgd_apply_local(Params& params, const Grads& grads, float lr) {
  for (const auto& [name, g] : grads.dense) {
    const auto it = params.dense.find(name);
    if (it == params.dense.end()) throw Error("sgd_apply_local: no parameter '" + name + "'");
    std::vector<float>& v = it->second.value;
    if (v.size() != g.value.size())
      throw Error("sgd_apply_local: '" + name + "' has " + std::to_string(v.size()) + " values, gradient " +
                  std::to_string(g.value.size()));
    // Same expression as the PS's SGD (value -= lr * grad), so local and distributed runs agree.
    for (std::size_t i = 0; i < v.size(); ++i) v[i] -= lr * g.value[i];
  }
  for (const auto& [name, g] : grads.sparse) {
    const auto it = params.sparse.find(name);
    if (it == params.sparse.end()) throw Error("sgd_apply_local: no parameter '" + name + "'");
    SparseParam& p = it->second;
    if (p.width != g.width || g.values.size() != g.rows.size() * static_cast<std::size_t>(g.width))
      throw Error("sgd_apply_local: gradient of '" + name + "' does not match the parameter's width");
    // Whole tables (local training) are indexed directly; a pulled subset goes through a map.
    std::unordered_map<std::int64_t, std::size_t> where;
    bool identity = true;
    for (std::size_t i = 0; i < p.rows.size() && identity; ++i) identity = p.rows[i] == static_cast<std::int64_t>(i);
    if (!identity)
      for (std::size_t i = 0; i < p.rows.size(); ++i) where.emplace(p.rows[i], i);
    const std::size_t width = static_cast<std::size_t>(p.width);
    for (std::size_t k = 0; k < g.rows.size(); ++k) {
      const std::int64_t row = g.rows[k];
      std::size_t at = 0;
      if (identity && row >= 0 && static_cast<std::size_t>(row) < p.rows.size()) {
        at = static_cast<std::size_t>(row);
      } else if (const auto w = where.find(row); !identity && w != where.end()) {
        at = w->second;
      } else {
        throw Error("sgd_apply_local: row " + std::to_string(row) + " of '" + name + "' is not in the parameter");
      }
      float* dst = p.values.data() + at * width;
      const float* src = g.values.data() + k * width;
      for (std::size_t j = 0; j < width; ++j) dst[j] -= lr * src[j];
    }
  }
}

}  // namespace strata::model
