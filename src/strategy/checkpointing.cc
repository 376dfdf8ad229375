// Checkpoint glue between the parameter servers (which know arenas, shards and the save protocol)
// and the checkpoint layer (which knows the HDF5 format): ParameterServerStrategy's restore(),
// set_checkpoint_options(), end_step() and finish() (include/strata/strategy/parameter_server_strategy.h).
//
// Restore, in materialisation order:
//   1. PS 0 resolves the path (a directory means its newest checkpoint that verifies) and every
//      rank learns the verdict (allgather), so a bad path is one ConfigError on every rank.
//   2. Every PS opens the file read-only and, before anything is allocated, checks each model
//      variable the checkpoint has for shape and dtype (PsOptions::checkpoint.check).
//   3. Each PS reads only its own shards' rows (and slots) straight into its arena.
//   4. PS 0 builds the report (restored / initialised / unused variables, positions) and every rank
//      receives it; the chief prints it.
// Save: the PS ranks call checkpoint::save collectively over Communicators::ps() from the service
// loop once every worker stopped at the agreed boundary (PsClient::at_step_boundary). A
// checkpoint::SaveError (identical on every PS rank) is reported by PS 0 in one line and becomes
// SaveStatus::kFailed; the final save is skipped when this job already saved its global step.
// At start-up PS 0 removes what interrupted saves left in the checkpoint directory (*.tmp files and
// complete files checkpoint.json does not name) unless another job holds the directory, then
// claims the directory for this job's life (checkpoint::DirectoryClaim).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "strata/checkpoint/checkpoint.h"
#include "strata/cluster/liveness.h"
#include "strata/cluster/runtime.h"
#include "strata/comm/group.h"
#include "strata/comm/mpi_group.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/signals.h"
#include "strata/strategy/parameter_server_strategy.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

checkpoint::DType to_checkpoint(ps::DType d) {
  switch (d) {
    case ps::DType::kF32: return checkpoint::DType::kF32;
    case ps::DType::kF64: return checkpoint::DType::kF64;
    case ps::DType::kI64: return checkpoint::DType::kI64;
  }
  return checkpoint::DType::kF32;
}

// Checkpoint datasets have rank >= 1: a scalar variable is stored as shape (1,) (FORMAT.md).
std::vector<std::int64_t> file_shape(const ps::Shape& shape) {
  if (shape.empty()) return {1};
  return std::vector<std::int64_t>(shape.begin(), shape.end());
}

bool has_slots(const ps::VariableSpec& spec) { return spec.trainable && spec.dtype != ps::DType::kI64; }

// The slots of `spec` under its own optimizer or the job's, by name (ps/optimizer.h).
std::vector<std::string> slots_of(const ps::VariableSpec& spec, const ps::OptimizerConfig& job) {
  return ps::slot_names(ps::effective_optimizer(spec, job).kind);
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// FNV-1a 64 over names, shapes and dtypes in creation order: the model's identity in a checkpoint,
// independent of partitioning and placement (so resharding keeps it).
std::uint64_t checkpoint_sequence_hash(const std::vector<ps::VariableSpec>& specs) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;
    h *= 1099511628211ull;
  };
  for (const auto& s : specs) {
    mix(s.name);
    mix(ps::shape_to_string(s.shape));
    mix(ps::to_string(s.dtype));
  }
  return h;
}

std::string position_json(const std::vector<ps::WorkerPosition>& positions) {
  nlohmann::ordered_json j;
  std::int64_t epoch = positions.empty() ? 0 : positions.front().epoch;
  for (const auto& p : positions) epoch = std::min(epoch, p.epoch);
  j["epoch"] = epoch;
  j["workers"] = nlohmann::json::array();
  for (std::size_t w = 0; w < positions.size(); ++w)
    j["workers"].push_back({{"worker", w}, {"epoch", positions[w].epoch}, {"offset", positions[w].offset},
                            {"step", positions[w].step}});
  return j.dump();
}

std::vector<ps::WorkerPosition> positions_from_json(const std::string& text) {
  std::vector<ps::WorkerPosition> out;
  try {
    auto j = nlohmann::json::parse(text.empty() ? "{}" : text);
    if (!j.contains("workers")) return out;
    for (const auto& w : j.at("workers")) {
      ps::WorkerPosition p;
      p.epoch = w.value("epoch", std::int64_t{0});
      p.offset = w.value("offset", std::int64_t{0});
      p.step = w.value("step", std::int64_t{0});
      out.push_back(p);
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(std::string("checkpoint: malformed training_position attribute: ") + e.what());
  }
  return out;
}

std::string join(const std::vector<std::string>& v, std::size_t limit = 8) {
  std::string out;
  for (std::size_t i = 0; i < v.size() && i < limit; ++i) out += (i ? ", " : "") + v[i];
  if (v.size() > limit) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out;
}

}  // namespace

struct ParameterServerStrategy::CheckpointState {
  std::string path;                                   // file being restored ("" = none)
  std::vector<std::string> skipped;                   // newer checkpoints that failed verification
  std::shared_ptr<checkpoint::CheckpointReader> reader;  // PS ranks with a restore
  std::string open_error;                             // this PS could not open the file
  ps::OptimizerConfig optimizer;
  // PS ranks with a restore: each variable's slot names under its optimizer (filled by the
  // restore check, which runs before any shard is restored).
  std::map<std::string, std::vector<std::string>> slot_names_of;
  std::int64_t last_saved_step = -1;                  // PS ranks: global step of this job's last committed save
  std::string last_saved_path;
  checkpoint::DirectoryClaim claim;                   // PS 0: held while this job may save
};

namespace {

// The newest checkpoint checkpoint.json lists, for messages ("none" when there is none).
std::string latest_committed(const std::string& dir) {
  try {
    auto entries = checkpoint::list_checkpoints(dir);
    if (!entries.empty()) return (std::filesystem::path(dir) / entries.back().file).string();
  } catch (const Error&) {
  }
  return "none";
}

}  // namespace

void ParameterServerStrategy::set_checkpoint_options(const CheckpointOptions& options) {
  if (ps_) throw Error("set_checkpoint_options(): variables are already materialised");
  if (options.save_every_steps < 0 || options.save_every_secs < 0 || options.max_to_keep < 0 ||
      options.keep_every_n_hours < 0)
    throw ConfigError("checkpoint options must not be negative");
  checkpoint_ = options;
}

void ParameterServerStrategy::restore(const std::string& path, const RestoreOptions& options) {
  if (ps_) throw Error("restore(): variables are already materialised (call it before scope())");
  if (path.empty()) throw ConfigError("restore(): empty path");
  restore_path_ = path;
  restore_options_ = options;
}

void ParameterServerStrategy::prepare_checkpoint_hooks() {
  auto st = std::make_shared<CheckpointState>();
  st->optimizer = options_.ps.optimizer;
  ckpt_state_ = st;
  const bool ps0 = runtime_.role() == Role::kPs && runtime_.task().index == 0;
  const double timeout = options_.ps.timeout_s;

  if (restore_path_) {
    // 1. PS 0 resolves the path; its verdict (JSON) reaches every rank.
    std::string mine;
    if (ps0) {
      nlohmann::json j;
      const std::string& p = *restore_path_;
      checkpoint::VerifyOptions verify_options;
      verify_options.allow_unverified = restore_options_.allow_unverified;
      try {
        std::error_code ec;
        if (!std::filesystem::exists(p, ec)) {
          j["error"] = "restore: '" + p + "' does not exist";
        } else if (std::filesystem::is_directory(p, ec)) {
          auto latest = checkpoint::latest_checkpoint(p, verify_options);
          if (!latest) {
            j["none"] = p;
          } else {
            j["path"] = latest->path;
            j["skipped"] = latest->skipped;
          }
        } else {
          const checkpoint::Verification v = checkpoint::verify_checkpoint(p, verify_options);
          if (!v.ok)
            j["error"] = "restore: '" + p + "' fails verification: " + v.summary();
          else
            j["path"] = p;
        }
      } catch (const Error& e) {
        j["error"] = "restore: " + e.message();
      }
      mine = j.dump();
    }
    nlohmann::json verdict;
    for (const auto& s : comm::runtime_group(runtime_)
                              ->allgather_strings(mine, comm::Deadline{timeout, "checkpoint restore path"}))
      if (!s.empty()) verdict = nlohmann::json::parse(s);
    if (verdict.contains("error")) throw ConfigError(verdict["error"].get<std::string>());
    if (verdict.contains("none")) {
      if (runtime_.is_chief())
        std::cout << "checkpoint: no valid checkpoint in " << verdict["none"].get<std::string>()
                  << ": starting from the initializers" << std::endl;
    } else {
      st->path = verdict["path"].get<std::string>();
      if (verdict.contains("skipped")) st->skipped = verdict["skipped"].get<std::vector<std::string>>();
    }
  }

  auto& hooks = options_.ps.checkpoint;
  if (!st->path.empty() && runtime_.role() == Role::kPs) {
    try {
      st->reader = std::make_shared<checkpoint::CheckpointReader>(st->path);
    } catch (const Error& e) {
      st->open_error = "ps:" + std::to_string(runtime_.task().index) + " cannot open " + st->path + ": " + e.message();
    }
    // 2. Shape and dtype of every model variable the checkpoint has, before allocation.
    hooks.check = [st](const ps::ShardMap& map) -> std::string {
      if (!st->open_error.empty()) return st->open_error;
      for (const auto& spec : map.variables()) {
        st->slot_names_of[spec.name] = slots_of(spec, st->optimizer);
        const checkpoint::VariableMeta* meta = st->reader->find(spec.name);
        if (!meta) continue;
        try {
          st->reader->check_compatible(spec.name, file_shape(spec.shape), to_checkpoint(spec.dtype));
        } catch (const ConfigError& e) {
          return "cannot restore: " + e.message();
        }
        // A variable with its own optimizer takes only its own optimizer's slots: restoring
        // Adagrad's "accumulator" into FTRL's would silently mix two optimizers' state. (Slots
        // name their optimizer: no two optimizers have the same slot list, sgd has none.)
        std::vector<std::string> stored = meta->slots, wanted = st->slot_names_of[spec.name];
        std::sort(stored.begin(), stored.end());
        std::sort(wanted.begin(), wanted.end());
        if (spec.optimizer && has_slots(spec) && stored != wanted)
          return "cannot restore '" + spec.name + "': the checkpoint holds its optimizer slots [" +
                 join_names(meta->slots) + "], but its optimizer is now " + ps::to_string(spec.optimizer->kind) +
                 " (slots [" + join_names(st->slot_names_of[spec.name]) + "])";
      }
      return "";
    };
    // 3. This shard's rows of the variable and of each slot the checkpoint has.
    hooks.restore = [st](ps::ShardBuffers& b) -> bool {
      const checkpoint::VariableMeta* meta = st->reader->find(b.shard->variable);
      if (!meta) return false;
      const std::int64_t begin = b.shard->row_begin, end = b.shard->row_end;
      if (end > begin) st->reader->read_rows(meta->name, begin, end, b.values);
      const auto found = st->slot_names_of.find(b.shard->variable);
      const std::vector<std::string> names = found != st->slot_names_of.end() ? found->second : std::vector<std::string>();
      for (std::size_t k = 0; k < b.slots.size() && k < names.size(); ++k)
        if (std::find(meta->slots.begin(), meta->slots.end(), names[k]) != meta->slots.end() && end > begin)
          st->reader->read_slot_rows(meta->name, names[k], begin, end, b.slots[k]);
      b.optimizer_step = meta->optimizer_step;
      return true;
    };
    hooks.restore_global_step = [st]() { return st->reader->global_step(); };
    if (st->reader) hooks.dynamic_restore_dir = std::filesystem::path(st->path).parent_path().string();
    if (st->reader) hooks.dynamic_restore_step = st->reader->global_step();
  }

  if (!checkpoint_.directory.empty()) {
    hooks.enabled = true;
    hooks.dynamic_dir = checkpoint_.directory;
    hooks.stop_on_save_error = checkpoint_.stop_on_save_error;
    if (checkpoint_.handle_signals) install_preemption_handlers();
    if (ps0) {
      // Leftovers of interrupted saves (a killed job, a full disk): nothing reads them, and one
      // can be as large as a checkpoint. Removed before this job's first save, and only while no
      // other job holds the directory; then this job claims it until it exits, so that another
      // job's start never removes a file this one is writing or committing (FORMAT.md section 7).
      const auto swept = checkpoint::remove_orphaned_files(checkpoint_.directory, st->path);
      if (!swept.removed.empty())
        std::cout << "checkpoint: removed " << join(swept.removed) << " from " << checkpoint_.directory
                  << " (left by an interrupted save)" << std::endl;
      if (!swept.kept.empty())
        std::cout << "checkpoint: not removing the uncommitted " << join(swept.kept) << " from "
                  << checkpoint_.directory << ": " << swept.why_kept << std::endl;
      st->claim = checkpoint::DirectoryClaim(checkpoint_.directory, timeout);
      if (!st->claim.held()) {
        STRATA_LOG(WARN) << "checkpoint: running without a claim on " << checkpoint_.directory << " ("
                         << st->claim.why_not() << "): another job starting there could remove this job's "
                         << "uncommitted files";
      }
    }
    if (runtime_.role() == Role::kPs) {
      const CheckpointOptions copts = checkpoint_;
      const Runtime* rt = &runtime_;
      // Called from serve(), i.e. after materialisation: ps_ is set by then.
      hooks.save = [this, st, copts, rt, timeout](const ps::SaveContext& ctx) -> ps::SaveStatus {
        // The heartbeat says "checkpoint save" while this PS writes, then "serve" again.
        struct SavePhase {
          SavePhase() { liveness::set_phase(liveness::Phase::kSave); }
          ~SavePhase() { liveness::set_phase(liveness::Phase::kServe); }
        } save_phase;
        const bool reporter = rt->task().index == 0;
        if (ctx.final && st->last_saved_step == ctx.global_step) {
          // Nothing changed since this job's last save (it was at the final boundary): the file
          // is committed already, and rewriting it would only cost time.
          if (reporter)
            std::cout << "checkpoint: final save skipped: global step " << ctx.global_step << " is already saved in "
                      << st->last_saved_path << std::endl;
          return ps::SaveStatus::kSkipped;
        }
        const ps::ShardMap& map = ps_->endpoint().shard_map();
        // The PS ranks' group: parallel HDF5 over its communicator in an MPI job; in-process PS
        // ranks send their rows to PS 0, which writes the file (checkpoint::save).
        const std::shared_ptr<comm::Group> ps_group = comm::groups_of(*rt).ps;
        const comm::Deadline agree{timeout, "the PS ranks' checkpoint save"};
        // Per-variable optimizer step: the largest over this variable's shards (all equal for dense
        // variables at a quiesced boundary; sparse shards only count the pushes that touched them).
        std::map<std::string, std::size_t> index;
        for (std::size_t i = 0; i < map.variables().size(); ++i) index[map.variables()[i].name] = i;
        std::vector<std::int64_t> max_steps(map.variables().size(), 0);
        for (const auto& b : ctx.shards)
          max_steps[index.at(b.shard->variable)] = std::max(max_steps[index.at(b.shard->variable)], b.optimizer_step);
        if (!max_steps.empty())
          ps_group->allreduce(max_steps.data(), max_steps.size(), comm::ElemType::kI64, comm::ReduceOp::kMax, agree);
        checkpoint::SaveRequest req;
        std::uint64_t bytes = 0;
        for (std::size_t i = 0; i < map.variables().size(); ++i) {
          const auto& spec = map.variables()[i];
          checkpoint::VariableMeta meta;
          meta.name = spec.name;
          meta.shape = file_shape(spec.shape);
          meta.dtype = to_checkpoint(spec.dtype);
          if (has_slots(spec)) meta.slots = slots_of(spec, st->optimizer);
          meta.optimizer_step = max_steps[i];
          req.variables.push_back(std::move(meta));
        }
        for (const auto& b : ctx.shards) {
          checkpoint::ShardData d;
          d.variable = b.shard->variable;
          d.row_begin = b.shard->row_begin;
          d.row_end = b.shard->row_end;
          d.values = b.values;
          const auto slot_names = slots_of(*map.find(b.shard->variable), st->optimizer);
          for (std::size_t k = 0; k < b.slots.size() && k < slot_names.size(); ++k) d.slots[slot_names[k]] = b.slots[k];
          bytes += b.shard->bytes * (1 + b.slots.size());
          req.shards.push_back(std::move(d));
        }
        checkpoint::Attributes attrs;
        attrs.variable_sequence_hash = checkpoint_sequence_hash(map.variables());
        attrs.optimizer = ps::to_string(st->optimizer.kind);
        attrs.training_position_json = position_json(ctx.positions);
        checkpoint::SaveOptions sopts;
        sopts.max_to_keep = copts.max_to_keep;
        sopts.keep_every_n_hours = copts.keep_every_n_hours;
        const double t0 = now_s();
        std::string path;
        try {
          path = checkpoint::save(*ps_group, copts.directory, ctx.global_step, req, attrs, sopts);
        } catch (const checkpoint::SaveError& e) {
          // Raised identically on every PS rank; nothing committed changed.
          if (reporter) {
            const std::string latest = latest_committed(copts.directory);
            std::string why = e.message();
            if (why.rfind("checkpoint: ", 0) == 0) why = why.substr(12);
            if (copts.stop_on_save_error)
              std::cerr << "checkpoint: ERROR: " << why << "; stopping (on-save-error stop); latest checkpoint: "
                        << latest << std::endl;
            else
              std::cout << "checkpoint: WARNING: " << why
                        << "; training continues (on-save-error continue); latest checkpoint: " << latest << std::endl;
          }
          return ps::SaveStatus::kFailed;
        }
        const double dt = now_s() - t0;
        st->last_saved_step = ctx.global_step;
        st->last_saved_path = path;
        std::int64_t total = static_cast<std::int64_t>(bytes);
        ps_group->reduce(&total, 1, comm::ElemType::kI64, comm::ReduceOp::kSum, 0, agree);
        if (reporter) {
          char line[512];
          std::snprintf(line, sizeof line, "checkpoint: saved %s (global step %lld, %.1f MiB in %.2f s, %.0f MB/s%s)",
                        path.c_str(), static_cast<long long>(ctx.global_step), static_cast<double>(total) / (1 << 20),
                        dt, static_cast<double>(total) / 1e6 / std::max(dt, 1e-9),
                        ctx.stop ? ", preemption: stopping" : ctx.final ? ", final" : "");
          std::cout << line << std::endl;
        }
        return ps::SaveStatus::kSaved;
      };
    }
  }
}

void ParameterServerStrategy::gather_restore_report() {
  if (!restore_path_) return;
  const bool ps0 = runtime_.role() == Role::kPs && runtime_.task().index == 0;
  std::string mine;
  if (ps0 && ckpt_state_->reader) {
    const auto& reader = *ckpt_state_->reader;
    nlohmann::json j;
    j["path"] = ckpt_state_->path;
    j["global_step"] = reader.global_step();
    j["skipped"] = ckpt_state_->skipped;
    std::vector<std::string> restored, initialized, unused, fresh_slots;
    std::set<std::string> model;
    for (const auto& spec : ps_->endpoint().shard_map().variables()) {
      model.insert(spec.name);
      const auto* meta = reader.find(spec.name);
      if (!meta) {
        initialized.push_back(spec.name);
        continue;
      }
      restored.push_back(spec.name);
      if (has_slots(spec))
        for (const auto& s : slots_of(spec, options_.ps.optimizer))
          if (std::find(meta->slots.begin(), meta->slots.end(), s) == meta->slots.end())
            fresh_slots.push_back(spec.name + "/" + s);
    }
    for (const auto& v : reader.variables())
      if (!model.count(v.name)) unused.push_back(v.name);
    j["restored"] = restored;
    j["initialized"] = initialized;
    j["unused"] = unused;
    j["fresh_slots"] = fresh_slots;
    j["position"] = reader.training_position_json();
    mine = j.dump();
  }
  nlohmann::json j;
  for (const auto& s : comm::runtime_group(runtime_)
                              ->allgather_strings(mine, comm::Deadline{options_.ps.timeout_s, "restore report"}))
    if (!s.empty()) j = nlohmann::json::parse(s);
  if (j.is_null()) return;  // the directory had no checkpoint
  RestoreReport r;
  r.path = j["path"].get<std::string>();
  r.global_step = j["global_step"].get<std::int64_t>();
  r.restored = j["restored"].get<std::vector<std::string>>();
  r.initialized = j["initialized"].get<std::vector<std::string>>();
  r.unused = j["unused"].get<std::vector<std::string>>();
  r.fresh_slots = j["fresh_slots"].get<std::vector<std::string>>();
  r.skipped = j["skipped"].get<std::vector<std::string>>();
  r.positions = positions_from_json(j["position"].get<std::string>());
  if (runtime_.is_chief()) {
    for (const auto& s : r.skipped)
      std::cout << "checkpoint: WARNING: skipped a newer checkpoint that failed verification: " << s << std::endl;
    std::cout << "checkpoint: restored " << r.restored.size() << " variable(s) from " << r.path << " (global step "
              << r.global_step << ")" << std::endl;
    if (!r.positions.empty()) {
      // Which steps the restored state holds: each worker's steps up to its saved position, no
      // more and no fewer (FORMAT.md section 2), so each one resumes right after them.
      std::ostringstream line;
      line << "checkpoint: the restored state holds steps";
      for (std::size_t w = 0; w < r.positions.size(); ++w)
        line << (w ? "," : "") << (r.positions[w].step > 0 ? " 1-" + std::to_string(r.positions[w].step) : " none")
             << " of worker " << w;
      line << " (global step " << r.global_step << ")";
      std::cout << line.str() << std::endl;
    }
    if (!r.initialized.empty())
      std::cout << "checkpoint: not in the checkpoint, initialized: " << join(r.initialized) << std::endl;
    if (!r.fresh_slots.empty())
      std::cout << "checkpoint: optimizer slots not in the checkpoint, initialized: " << join(r.fresh_slots)
                << std::endl;
    if (!r.unused.empty() && !restore_options_.expect_partial)
      std::cout << "checkpoint: in the checkpoint but not in the model (unused; expect_partial silences this): "
                << join(r.unused) << std::endl;
  }
  report_ = std::move(r);
}

ps::WorkerPosition ParameterServerStrategy::restored_position() const {
  if (!report_ || report_->positions.empty()) return {};
  const int w = worker_index();
  if (w >= 0 && static_cast<int>(report_->positions.size()) == num_workers()) return report_->positions[w];
  // Another worker count: the shards differ, so restart everyone at the oldest epoch's beginning.
  ps::WorkerPosition p = report_->positions.front();
  for (const auto& q : report_->positions) {
    p.epoch = std::min(p.epoch, q.epoch);
    p.step = std::min(p.step, q.step);
  }
  p.offset = 0;
  return p;
}

void ParameterServerStrategy::schedule_sync_save(std::int64_t round) {
  auto& p = ps_client();
  if (p.save_pending()) return;
  const bool preempt = checkpoint_.handle_signals && (preemption_signal() != 0 || p.preemption_reports() > 0);
  bool due = preempt;
  if (!due && checkpoint_.save_every_steps > 0) {
    // The first round r whose global step G0 + W * r reaches the last save's, G0 + W * last
    // round, plus N. A request posted now lands at round + 2 (PsClient::request_save under sync),
    // so it is posted at the boundary two rounds before r, or at once when r is nearer.
    const std::int64_t n = checkpoint_.save_every_steps, w = std::max(1, num_workers());
    const std::int64_t due_round = last_save_round_ + n / w + (n % w != 0 ? 1 : 0);
    due = due_round <= round + 2;
  }
  if (!due && checkpoint_.save_every_secs > 0) due = now_s() - last_save_time_ >= checkpoint_.save_every_secs;
  if (due) p.request_save(preempt);
}

StepOutcome ParameterServerStrategy::end_step(const ps::WorkerPosition& position) {
  std::lock_guard<std::mutex> lock(ps_mutex_);
  auto& p = ps_client();
  const std::int64_t clock = p.end_step();
  StepOutcome out;
  if (checkpoint_.directory.empty()) return out;
  ps::PsClient::Boundary b;
  if (options_.ps.consistency.mode == ps::Consistency::kSync) {
    // Lockstep: every worker's clock is this round's at the boundary, so the saved global step is
    // G0 + W * round whatever the other workers' increments in flight (the global step word is
    // not read: it races with them). Join first, so that the next save can be posted right here.
    b = p.at_step_boundary(position);
    if (b.saved) {
      // A failed save also restarts the interval: retrying at every step would stall training.
      last_save_round_ = clock;
      last_save_global_step_ = sync_start_step_ + num_workers() * clock;
      last_save_time_ = now_s();
    }
    if (is_chief() && !b.stop) schedule_sync_save(clock);
  } else {
    if (is_chief() && !p.save_pending()) {
      const bool preempt = checkpoint_.handle_signals && (preemption_signal() != 0 || p.preemption_reports() > 0);
      bool due = preempt;
      if (!due && checkpoint_.save_every_steps > 0)
        due = p.global_step() - last_save_global_step_ >= checkpoint_.save_every_steps;
      if (!due && checkpoint_.save_every_secs > 0) due = now_s() - last_save_time_ >= checkpoint_.save_every_secs;
      if (due) p.request_save(preempt);
    }
    b = p.at_step_boundary(position);
    if (b.saved) {  // a failed save too, as under sync
      last_save_global_step_ = p.global_step();
      last_save_time_ = now_s();
    }
  }
  out.saved = b.saved;
  out.stop = b.stop;
  out.save_failed = b.failed;
  if (b.stop) stopped_ = true;
  return out;
}

}  // namespace strata
