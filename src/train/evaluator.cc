// The evaluator task: see evaluator.h and strata/train/train_and_evaluate.h.
//
// What it reads: only checkpoints named in <model_dir>/checkpoint.json, which the PS ranks replace
// atomically after a checkpoint file is closed, fsync'ed and renamed (checkpoint/FORMAT.md), so a
// file being written is never listed. Each one is verified (CRC) before it is read; one removed
// meanwhile by max_to_keep, or damaged, is reported and skipped. The variables are read straight
// from the file (rows of each variable the model uses), without the parameter servers. Dynamic
// tables are read from the dynamic-<step>.h5 chain of the checkpoint's step (the PS ranks commit
// a step's tables before its checkpoint.json entry, so a listed step's tables are complete),
// keeping only the rows the evaluation reads; the state must be the one of that very step (a
// restore's fallback to an older state would pair older tables with newer dense weights).
#include "train/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <set>
#include <thread>

#include "strata/checkpoint/checkpoint.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/common/error.h"
#include "strata/train/hooks.h"
#include "strata/train/train_and_evaluate.h"

namespace strata::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Evaluation {
  bool ok = false;
  std::string why;  // when not ok
  EvalMetrics metrics;  // loss, accuracy and what the model's predictions allow (AUC, ...)
  std::int64_t global_step = 0;
  std::vector<std::string> dynamic_files;  // the tables' chain files read, base first
};

// The rows `ids` (sorted, unique) of the dynamic variable `spec` at `step`, read from the chain in
// `dir` keeping only those ids; a row the table lacks reads as zeros. Adds the chain's files to
// `files`. Throws Error (one line) when the table has no intact state at exactly `step`.
model::SparseParam dynamic_rows_at(const std::string& dir, const ps::DynamicVariableSpec& spec, std::int64_t step,
                                   std::vector<std::int64_t> ids, std::set<std::string>& files) {
  const std::string table = checkpoint::dynamic_table_name(spec.name);
  auto wanted = [&ids](std::int64_t id) { return std::binary_search(ids.begin(), ids.end(), id); };
  checkpoint::DynamicRestore r;
  try {
    r = checkpoint::restore_dynamic_table(dir, table, step, wanted);
  } catch (const Error& e) {
    throw Error("dynamic variable '" + spec.name + "': " + e.message());
  }
  if (r.step != step)
    throw Error("dynamic variable '" + spec.name + "' has no intact table state at global step " +
                std::to_string(step) + (r.warning.empty() ? " (its newest saved state is step " +
                                                                std::to_string(r.step) + ")"
                                                          : ": " + r.warning));
  if (r.state.dim != spec.dim)
    throw Error("dynamic variable '" + spec.name + "': its table has rows of " + std::to_string(r.state.dim) +
                " floats, the model's " + std::to_string(spec.dim));
  files.insert(r.chain.begin(), r.chain.end());
  model::SparseParam sp;
  const auto dim = static_cast<std::size_t>(spec.dim);
  sp.width = static_cast<int>(spec.dim);
  sp.values.assign(ids.size() * dim, 0.0f);
  const auto& have = r.state.ids;
  for (std::size_t i = 0, j = 0; i < ids.size(); ++i) {
    while (j < have.size() && have[j] < ids[i]) ++j;
    if (j < have.size() && have[j] == ids[i])
      std::copy_n(r.state.values.begin() + static_cast<std::ptrdiff_t>(j * dim), dim,
                  sp.values.begin() + static_cast<std::ptrdiff_t>(i * dim));
  }
  sp.rows = std::move(ids);
  return sp;
}

// The value `metric` (accuracy | loss | auc) of an evaluation, and whether higher is better.
double metric_value(const EvalMetrics& m, const std::string& metric) {
  if (metric == "loss") return m.loss;
  if (metric == "auc") return m.auc;
  return m.accuracy;
}

// Reads the model's variables from `path` and evaluates them on `eval`.
Evaluation evaluate_checkpoint(const Model& model, const EvalData& eval, const std::string& path,
                               std::int64_t max_batches) {
  Evaluation e;
  try {
    const checkpoint::Verification v = checkpoint::verify_checkpoint(path);
    if (!v.ok) {
      e.why = v.summary();
      return e;
    }
    checkpoint::CheckpointReader reader(path);
    e.global_step = reader.global_step();
    const auto sparse = model.sparse_variables();
    Params params;
    for (const auto& spec : model.variables()) {
      const checkpoint::VariableMeta* meta = reader.find(spec.name);
      if (!meta) {
        e.why = "the checkpoint has no variable '" + spec.name + "' (not this model's checkpoint?)";
        return e;
      }
      if (meta->dtype != checkpoint::DType::kF32) {
        e.why = "variable '" + spec.name + "' is " + checkpoint::to_string(meta->dtype) + ", the evaluator reads f32";
        return e;
      }
      std::int64_t count = 1;
      for (auto d : meta->shape) count *= d;
      std::vector<float> values(static_cast<std::size_t>(count));
      const std::int64_t rows = meta->shape.empty() ? 1 : meta->shape[0];
      if (count > 0) reader.read_rows(spec.name, 0, rows, values.data());
      if (std::find(sparse.begin(), sparse.end(), spec.name) != sparse.end()) {
        model::SparseParam sp;
        sp.width = static_cast<int>(meta->shape.size() > 1 ? count / std::max<std::int64_t>(1, rows) : 1);
        sp.values = std::move(values);
        for (std::int64_t r = 0; r < rows; ++r) sp.rows.push_back(r);
        params.sparse[spec.name] = std::move(sp);
      } else {
        model::DenseParam p;
        p.shape = spec.shape;
        p.value = std::move(values);
        params.dense[spec.name] = std::move(p);
      }
    }
    const std::vector<ps::DynamicVariableSpec> dynamic = model.dynamic_variables();
    if (!dynamic.empty()) {
      std::vector<std::string> names;
      for (const auto& d : dynamic) names.push_back(d.name);
      std::vector<std::vector<std::int64_t>> ids = eval_rows_needed(model, names, eval, max_batches);
      const std::string dir = fs::path(path).parent_path().string();
      std::set<std::string> files;
      for (std::size_t d = 0; d < dynamic.size(); ++d)
        params.sparse[dynamic[d].name] = dynamic_rows_at(dir.empty() ? "." : dir, dynamic[d], e.global_step,
                                                         std::move(ids[d]), files);
      e.dynamic_files.assign(files.begin(), files.end());
    }
    e.metrics = evaluate_chunks(model, eval, max_batches, true,
                                [&params](const data::Dataset&, std::int64_t) -> const Params& { return params; });
    e.ok = true;
  } catch (const Error& err) {
    // Removed by max_to_keep between listing and reading, or unreadable: reported, skipped.
    e.why = err.message();
  }
  return e;
}

// Keeps a copy of `path` as <dir>/best/<name> (replacing the previous best), with copies of the
// dynamic tables' chain files `dynamic` (the chain restores from best/ alone: its links name steps
// and content checksums, not directories), and best.json. False, with one line saying so and
// best/ unchanged, when a file is gone by now: the trainers' retention (--max-to-keep) may remove
// it while it is being evaluated, which must not end the job.
bool keep_best(const std::string& dir, const std::string& path, const std::vector<std::string>& dynamic,
               std::int64_t step, const std::string& metric, double value) {
  const fs::path best = fs::path(dir) / "best";
  fs::create_directories(best);
  const fs::path name = fs::path(path).filename();
  std::vector<std::string> sources{path};
  sources.insert(sources.end(), dynamic.begin(), dynamic.end());
  std::vector<fs::path> tmps;
  auto drop_tmps = [&] {
    std::error_code ignored;
    for (const auto& t : tmps) fs::remove(t, ignored);
  };
  for (const auto& source : sources) {
    const fs::path tmp = best / (fs::path(source).filename().string() + ".tmp");
    tmps.push_back(tmp);
    std::error_code ec;
    fs::copy_file(source, tmp, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      drop_tmps();
      std::error_code ignored;
      if (fs::exists(source, ignored)) throw fs::filesystem_error("cannot copy the best checkpoint", source, tmp, ec);
      std::cout << "eval: " << fs::path(source).filename().string()
                << " was removed (--max-to-keep) before it could be kept as the best; best/ keeps the previous one"
                << std::endl;
      return false;
    }
  }
  std::set<std::string> kept;
  for (const auto& source : sources) {
    const std::string f = fs::path(source).filename().string();
    fs::rename(best / (f + ".tmp"), best / f);
    kept.insert(f);
  }
  for (const auto& entry : fs::directory_iterator(best)) {
    const std::string f = entry.path().filename().string();
    if (kept.count(f) == 0 && (f.rfind("ckpt-", 0) == 0 || f.rfind("dynamic-", 0) == 0)) fs::remove(entry.path());
  }
  const nlohmann::ordered_json j = {
      {"checkpoint", name.string()}, {"global_step", step}, {"metric", metric}, {"value", value}};
  const fs::path jtmp = best / "best.json.tmp";
  std::ofstream(jtmp) << j.dump() << "\n";
  fs::rename(jtmp, best / "best.json");
  return true;
}

}  // namespace

EvaluatorOutcome run_evaluator(const Model& model, const EvalData& eval, const EvaluatorOptions& opts) {
  EvaluatorOutcome out;
  const EvalSpec& spec = opts.eval_spec;
  const bool by_loss = spec.best_metric == "loss";
  if (!by_loss && spec.best_metric != "accuracy" && spec.best_metric != "auc")
    throw ConfigError("EvalSpec::best_metric: '" + spec.best_metric + "' is not accuracy, loss or auc");
  if (spec.best_metric == "auc" && model.prediction_kind() != PredictionKind::kBinaryProbability)
    throw ConfigError("--eval-best-metric auc: the model is not a binary classifier (AUC needs one); use accuracy or loss");
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::int64_t last_step = -1;  // global step of the newest checkpoint evaluated (or skipped)
  double next_at = spec.start_delay_secs;
  bool have_best = false;
  double best_value = 0;
  std::ofstream jsonl;
  bool done = false;
  std::string final_name;
  // A restarted job (requeue, --restore latest) continues where its evaluator stopped: what
  // eval.jsonl lists is not evaluated again, and best/ keeps competing.
  const fs::path jsonl_path = fs::path(opts.model_dir) / "eval.jsonl";
  {
    std::ifstream in(jsonl_path);
    std::string line;
    while (in && std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("global_step"))
        last_step = std::max(last_step, j["global_step"].get<std::int64_t>());
    }
    std::ifstream best_in(fs::path(opts.model_dir) / "best" / "best.json");
    const auto b = nlohmann::json::parse(best_in, nullptr, false);
    if (b.is_object() && b.value("metric", "") == spec.best_metric && b.contains("value")) {
      have_best = true;
      best_value = b["value"].get<double>();
    }
  }
  std::cout << "eval: evaluator watching " << opts.model_dir << " for checkpoints ("
            << (eval.streamed() ? std::string("eval data streamed") : std::to_string(eval.set().size) + " eval examples")
            << (last_step >= 0 ? ", after global step " + std::to_string(last_step) : "")
            << ")" << std::endl;
  while (true) {
    // 1. Has training ended? The final checkpoint was committed before the message was sent, so
    //    the listing below sees it.
    if (!done) {
      if (auto m = opts.group->try_recv(opts.chief_rank, kEvaluatorTag)) {
        const std::string msg(reinterpret_cast<const char*>(m->data()), m->size());
        const auto j = nlohmann::json::parse(msg);
        out.status = j.at("status").get<int>();
        final_name = j.at("final").get<std::string>();
        done = true;
      }
    }
    // 2. Newly committed checkpoints.
    std::vector<checkpoint::CheckpointEntry> fresh;
    try {
      for (const auto& e : checkpoint::list_checkpoints(opts.model_dir))
        if (e.global_step > last_step) fresh.push_back(e);
    } catch (const ConfigError&) {
      // model_dir not created yet (the first save creates it): nothing committed so far.
    }
    if (!fresh.empty() && (done || elapsed() >= next_at)) {
      const checkpoint::CheckpointEntry target = fresh.back();
      if (fresh.size() > 1) {
        std::string names;
        for (std::size_t i = 0; i + 1 < fresh.size(); ++i) names += (names.empty() ? "" : ", ") + fresh[i].file;
        std::cout << "eval: behind: skipped " << fresh.size() - 1 << " older checkpoint(s) (" << names
                  << "), evaluating the newest, " << target.file << std::endl;
      }
      const std::string path = (fs::path(opts.model_dir) / target.file).string();
      const Evaluation e = evaluate_checkpoint(model, eval, path, spec.steps);
      last_step = target.global_step;
      next_at = elapsed() + spec.throttle_secs;
      if (!e.ok) {
        std::cout << "eval: WARNING: cannot evaluate " << target.file << ": " << e.why << std::endl;
      } else {
        ++out.evaluated;
        out.final_checkpoint = path;
        if (!jsonl.is_open()) {
          jsonl.open(jsonl_path.string(), std::ios::app);
          if (!jsonl) throw Error("eval: cannot append to " + jsonl_path.string());
        }
        const EvalMetrics& m = e.metrics;
        nlohmann::ordered_json row{{"checkpoint", target.file}, {"global_step", e.global_step},
                                   {"loss", m.loss},           {"accuracy", m.accuracy}};
        // The metrics the model's predictions allow (NaN for the others: not written).
        for (const auto& [name, value] : {std::pair<const char*, double>{"auc", m.auc}, {"log_loss", m.log_loss},
                                          {"precision", m.precision}, {"recall", m.recall}, {"mae", m.mae},
                                          {"mse", m.mse}})
          if (std::isfinite(value)) row[name] = value;
        row["examples"] = m.examples;
        row["skipped"] = fresh.size() - 1;
        row["wall_s"] = elapsed();
        jsonl << row.dump() << "\n" << std::flush;
        const double value = metric_value(m, spec.best_metric);
        const bool better = std::isfinite(value) && (!have_best || (by_loss ? value < best_value : value > best_value));
        std::ostringstream line;
        line << std::fixed << std::setprecision(4) << "eval: " << target.file << " global_step " << e.global_step
             << " loss " << m.loss << " accuracy " << m.accuracy;
        if (std::isfinite(m.auc)) line << " auc " << m.auc;
        line << (better ? " (best so far)" : "");
        std::cout << line.str() << std::endl;
        if (better && keep_best(opts.model_dir, path, e.dynamic_files, e.global_step, spec.best_metric, value)) {
          have_best = true;
          best_value = value;
        }
      }
      continue;  // look again at once: the final message may have come meanwhile
    }
    if (done) break;
    std::this_thread::sleep_for(std::chrono::duration<double>(opts.poll_s));
  }
  std::cout << "eval: done: evaluated " << out.evaluated << " checkpoint(s)"
            << (final_name.empty() ? std::string() : ", the final one " + fs::path(final_name).filename().string())
            << std::endl;
  return out;
}

std::vector<std::vector<std::int64_t>> eval_rows_needed(const Model& model, const std::vector<std::string>& vars,
                                                        const data::Dataset& ds, std::int64_t max_batches) {
  std::vector<std::vector<std::int64_t>> ids(vars.size());
  if (vars.empty()) return ids;
  std::vector<std::int64_t> all(static_cast<std::size_t>(ds.size));
  for (std::int64_t i = 0; i < ds.size; ++i) all[static_cast<std::size_t>(i)] = i;
  data::BatchIterator it(ds, all, 1000, false, 2);
  data::Batch batch;
  std::int64_t batches = 0;
  while ((max_batches <= 0 || batches < max_batches) && it.next(batch)) {
    const Inputs in = inputs_of(batch);
    for (std::size_t d = 0; d < vars.size(); ++d) {
      const std::vector<std::int64_t> r = model.rows_needed(vars[d], in);
      ids[d].insert(ids[d].end(), r.begin(), r.end());
    }
    ++batches;
  }
  for (auto& v : ids) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  return ids;
}

std::vector<std::vector<std::int64_t>> eval_rows_needed(const Model& model, const std::vector<std::string>& vars,
                                                        const EvalData& eval, std::int64_t max_batches) {
  std::vector<std::vector<std::int64_t>> ids(vars.size()), pending(vars.size());
  if (vars.empty()) return ids;
  // Each chunk's ids wait in `pending` until they outnumber the merged ones (and a floor): merges
  // then cost O(n log n) over the whole set, not one pass over every merged id per chunk.
  constexpr std::size_t kMergeFloor = std::size_t{1} << 20;
  auto merge = [&](std::size_t d) {
    std::sort(pending[d].begin(), pending[d].end());
    pending[d].erase(std::unique(pending[d].begin(), pending[d].end()), pending[d].end());
    std::vector<std::int64_t> merged;
    merged.reserve(ids[d].size() + pending[d].size());
    std::set_union(ids[d].begin(), ids[d].end(), pending[d].begin(), pending[d].end(), std::back_inserter(merged));
    ids[d] = std::move(merged);
    pending[d].clear();
  };
  eval.for_each_chunk(max_batches, [&](const data::Dataset& chunk, std::int64_t batches_left) {
    std::vector<std::vector<std::int64_t>> more = eval_rows_needed(model, vars, chunk, batches_left);
    for (std::size_t d = 0; d < vars.size(); ++d) {
      pending[d].insert(pending[d].end(), more[d].begin(), more[d].end());
      if (pending[d].size() > std::max(ids[d].size(), kMergeFloor)) merge(d);
    }
  });
  for (std::size_t d = 0; d < vars.size(); ++d) merge(d);
  return ids;
}

void notify_evaluators(const Runtime& runtime, comm::Group& group, const std::string& final_checkpoint, int status,
                       double timeout_s) {
  const std::string msg = nlohmann::json{{"status", status}, {"final", final_checkpoint}}.dump();
  for (const auto& info : runtime.ranks())
    if (info.task.type == "evaluator")
      group.send(info.rank, kEvaluatorTag, msg.data(), msg.size(),
                 comm::Deadline{timeout_s, "the end-of-training message to the evaluator (" + info.task.str() + ")"});
}

}  // namespace strata::train
