// `strata ckpt ls|show|verify|diff`: inspect checkpoint directories and files (checkpoint/FORMAT.md).
//
// CheckpointReader is independent (sec2 driver, no MPI calls), so these commands run as plain
// processes: no mpirun, and MPI is never initialised.
//
// Exit statuses (those of every strata command), classified here rather than by exception type,
// because the reader raises ConfigError for a file that is "not a strata checkpoint" too, which is
// a finding about the file's content, not a usage error:
//   0  success; `verify`: every file verified; `diff`: identical
//   1  runtime failure or negative finding: a file that is missing from its directory, truncated,
//      not HDF5, not a strata checkpoint, corrupt or malformed (checkpoints are untrusted input,
//      FORMAT.md section 9), format 1 without --allow-unverified; a checkpoint.json that is
//      malformed or too deep; `verify` / `ls --verify` with a failing file or a refused entry;
//      `diff` with differences; a directory without a valid checkpoint where one is needed
//   2  usage: bad flags, a PATH that does not exist, `ls` given a file
// Every error is one line on stderr.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <type_traits>
#include <vector>

#include "cli/commands.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"
#include "strata/common/parse.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
namespace ck = strata::checkpoint;

// A runtime failure (exit 1), as opposed to ConfigError, which this file reserves for usage (exit 2).
class Failure : public Error {
 public:
  using Error::Error;
};

// Default bound on the values diff holds in memory per side: a checkpoint of any size is compared
// in blocks of whole rows of at most this many bytes (one row when a single row is larger).
constexpr std::uint64_t kDefaultBlockBytes = 16ull << 20;

// ---- formatting --------------------------------------------------------------------------------

std::string iso_utc(std::int64_t unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return "?";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// 1536 -> "1.5 KiB"; below 1 KiB the exact count ("512 B").
std::string human_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  return buf;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

// Left-aligned columns separated by two spaces; trailing blanks trimmed.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], row[c].size());
    }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

// ---- paths and readers -------------------------------------------------------------------------

std::int64_t elements_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::uint64_t bytes_of(const ck::VariableMeta& v) {
  return static_cast<std::uint64_t>(elements_of(v.shape)) * ck::dtype_size(v.dtype);
}

// The message of any exception, without strata's rank-context prefix (these run outside a job).
std::string message_of(const std::exception& e) {
  if (const auto* se = dynamic_cast<const Error*>(&e)) return se->message();
  return e.what();
}

// Usage-level check of a PATH argument: it must exist. Returns true for a directory.
bool is_directory_arg(const std::string& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw ConfigError("'" + path + "' does not exist");
  if (fs::is_directory(st)) return true;
  if (fs::is_regular_file(st)) return false;
  throw ConfigError("'" + path + "' is neither a checkpoint file nor a directory");
}

ck::CheckpointList list_entries(const std::string& dir) {
  try {
    return ck::read_checkpoint_list(dir);
  } catch (const Error& e) {  // malformed checkpoint.json: content, not usage
    throw Failure(e.message());
  }
}

ck::VerifyOptions verify_options(const CkptFlags& f) {
  ck::VerifyOptions o;
  o.allow_unverified = f.allow_unverified;
  return o;
}

// The line for a checkpoint.json entry that is not used (its name is no checkpoint of the directory).
std::string refused_line(const std::string& dir, const ck::RefusedEntry& r) {
  return (fs::path(dir) / "checkpoint.json").string() + ": entry '" + r.file + "' REFUSED: " + r.reason;
}

ck::CheckpointReader open_reader(const std::string& path) {
  try {
    return ck::CheckpointReader(path);
  } catch (const std::exception& e) {
    throw Failure("cannot read checkpoint '" + path + "': " + message_of(e));
  }
}

// Why a directory has no committed checkpoint, for error messages; names the refused entries.
std::string no_checkpoints(const std::string& dir, const std::vector<ck::RefusedEntry>& refused = {}) {
  std::error_code ec;
  bool has_pointer = fs::exists(fs::path(dir) / "checkpoint.json", ec);
  std::string why = has_pointer ? "checkpoint.json lists none" : "no checkpoint.json";
  for (std::size_t i = 0; i < refused.size(); ++i)
    why += (i ? ", '" : "; it refused: '") + refused[i].file + "' (" + refused[i].reason + ")";
  return "no committed checkpoints in '" + dir + "' (" + why + ")";
}

// latest_checkpoint() logs a WARN line per skipped entry; callers that report the skipped entries
// themselves silence it for the duration of the call.
class QuietWarnings {
 public:
  QuietWarnings() : saved_(log_level()) {
    if (saved_ < LogLevel::kError) set_log_level(LogLevel::kError);
  }
  ~QuietWarnings() { set_log_level(saved_); }
  QuietWarnings(const QuietWarnings&) = delete;
  QuietWarnings& operator=(const QuietWarnings&) = delete;

 private:
  LogLevel saved_;
};

std::optional<ck::LatestCheckpoint> latest_valid(const std::string& dir, bool quiet, const ck::VerifyOptions& options) {
  std::optional<QuietWarnings> silence;
  if (quiet) silence.emplace();
  try {
    return ck::latest_checkpoint(dir, options);
  } catch (const Error& e) {
    throw Failure(e.message());
  }
}

// PATH as `show` and `diff` take it: a file is itself, verified first (one read of it), so a
// damaged file is reported rather than parsed by HDF5; one whose damage is confined to dataset
// values is still read, after a warning on stderr, so that `diff` can show what changed. A
// directory means the checkpoint that `--restore latest` would use (the newest entry that
// verifies; newer invalid ones are skipped with a WARN line each, from the library).
std::string resolve_checkpoint(const std::string& path, const ck::VerifyOptions& options) {
  if (!is_directory_arg(path)) {
    const ck::Verification v = ck::verify_checkpoint(path, options);
    if (!v.ok && !v.structure_intact) throw Failure("cannot read checkpoint '" + path + "': " + v.summary());
    if (!v.ok) {
      const std::string line = "strata ckpt: warning: '" + path + "' fails verification: " + v.summary() + "\n";
      std::fwrite(line.data(), 1, line.size(), stderr);
    }
    return path;
  }
  const ck::CheckpointList list = list_entries(path);
  const auto& entries = list.entries;
  if (entries.empty()) throw Failure(no_checkpoints(path, list.refused));
  auto latest = latest_valid(path, /*quiet=*/false, options);
  if (!latest)
    throw Failure("no valid checkpoint in '" + path + "': all " + std::to_string(entries.size()) +
                  " committed checkpoint(s) fail verification");
  return latest->path;
}

// ---- verification ------------------------------------------------------------------------------

using FileVerdict = ck::Verification;

// verify_checkpoint() never throws: any problem is in the verdict.
FileVerdict verify_file(const std::string& path, const CkptFlags& f) {
  return ck::verify_checkpoint(path, verify_options(f));
}

// A committed entry: a regular file of the directory that verifies and holds the step
// checkpoint.json names (the rule of latest_checkpoint(), so `ls --verify` and `verify DIR` agree
// with --restore latest).
FileVerdict verify_entry(const std::string& dir, const ck::CheckpointEntry& entry, const CkptFlags& f) {
  return ck::verify_entry(dir, entry, verify_options(f));
}

// ---- dynamic tables (FORMAT.md section 10) ------------------------------------------------------
// A directory's dynamic-<step>.h5 files are listed and verified beside its dense checkpoints. A
// dynamic file is read only after it verifies (its whole-file CRC-32 first), so listing one reads
// it whole.

struct DynamicRow {
  std::int64_t step = 0;
  std::string file, path;
  std::uint64_t bytes = 0;
  std::optional<ck::DynamicCheckpointFile> contents;  // set when the file verified
  std::string problem;
};

// Every committed dynamic file of `dir`, oldest first. `with_data` also reads and checks the rows
// (FORMAT.md 10.4 step 5), as verify does.
std::vector<DynamicRow> dynamic_rows(const std::string& dir, bool with_data) {
  std::vector<std::int64_t> steps;
  try {
    steps = ck::list_dynamic_checkpoints(dir);
  } catch (const Error& e) {
    throw Failure(e.message());
  }
  std::vector<DynamicRow> rows;
  for (std::int64_t step : steps) {
    DynamicRow r;
    r.step = step;
    r.file = ck::dynamic_file_name(step);
    r.path = (fs::path(dir) / r.file).string();
    std::error_code ec;
    r.bytes = fs::file_size(r.path, ec);
    try {
      r.contents = ck::read_dynamic_checkpoint(r.path, with_data);
      // Rows are not kept: only the summary is printed.
      for (auto& t : r.contents->tables) {
        std::vector<std::int64_t>().swap(t.ids);
        std::vector<float>().swap(t.values);
        std::vector<std::vector<float>>().swap(t.slots);
        std::vector<std::int64_t>().swap(t.stamps);
        std::vector<std::uint32_t>().swap(t.update_counts);
        std::vector<std::uint16_t>().swap(t.sketch);
      }
    } catch (const Error& e) {
      r.problem = e.message();
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string dynamic_table_summary(const ck::DynamicTableState& t) {
  if (t.kind == ck::DynamicKind::kFull) return t.name + " full " + std::to_string(t.stored_rows) + " rows";
  return t.name + " delta of step " + std::to_string(t.parent_step) + ": " + std::to_string(t.stored_rows) +
         " rows changed, " + std::to_string(t.evicted_ids.size()) + " evicted, " + std::to_string(t.total_rows) +
         " rows after";
}

// Per table named in any verified file: the chain a restore would use, or why there is none.
struct DynamicPlanRow {
  std::string table;
  std::optional<ck::DynamicRestorePlan> plan;
  std::string problem;
};
std::vector<DynamicPlanRow> dynamic_plans(const std::string& dir, const std::vector<DynamicRow>& rows) {
  std::vector<std::string> names;
  for (const auto& r : rows)
    if (r.contents)
      for (const auto& t : r.contents->tables)
        if (std::find(names.begin(), names.end(), t.name) == names.end()) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  std::vector<DynamicPlanRow> out;
  for (const auto& name : names) {
    DynamicPlanRow p;
    p.table = name;
    try {
      p.plan = ck::plan_dynamic_restore(dir, name);
    } catch (const Error& e) {
      p.problem = e.message();
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string chain_text(const ck::DynamicRestorePlan& plan) {
  std::vector<std::string> files;
  for (const auto& p : plan.chain) files.push_back(fs::path(p).filename().string());
  return join(files, " <- ");
}

// Lines for `ls` and `verify DIR`: the files (with `verified` per file when `verify_word`) and
// the restore plans. Returns the number of problems (failed files, tables without a state).
std::size_t print_dynamic(std::ostream& out, const std::string& dir, const std::vector<DynamicRow>& rows,
                          const std::vector<DynamicPlanRow>& plans) {
  std::size_t bad = 0;
  out << "dynamic tables in " << dir << " (dynamic-<step>.h5, oldest first)\n";
  std::vector<std::vector<std::string>> table{{"step", "file", "bytes", "size", "tables"}};
  for (const auto& r : rows) {
    std::vector<std::string> summaries;
    if (r.contents)
      for (const auto& t : r.contents->tables) summaries.push_back(dynamic_table_summary(t));
    table.push_back({std::to_string(r.step), r.file, std::to_string(r.bytes), human_bytes(r.bytes),
                     r.contents ? join(summaries, "; ") : "CORRUPT"});
    bad += r.contents ? 0 : 1;
  }
  print_table(out, table);
  for (const auto& r : rows)
    if (!r.contents) out << "  " << r.file << ": " << r.problem << "\n";
  for (const auto& p : plans) {
    if (!p.plan) {
      out << "restore " << p.table << ": nothing: " << p.problem << "\n";
      ++bad;
      continue;
    }
    out << "restore " << p.table << ": step " << p.plan->step << " from " << chain_text(*p.plan) << "\n";
    if (!p.plan->warning.empty()) out << "  " << p.plan->warning << "\n";
  }
  return bad;
}

nlohmann::json dynamic_json(const std::vector<DynamicRow>& rows, const std::vector<DynamicPlanRow>& plans) {
  nlohmann::json files = nlohmann::json::array(), restore = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json j = {{"file", r.file}, {"global_step", r.step}, {"bytes", r.bytes}, {"verified", r.contents.has_value()}};
    if (!r.contents) j["problem"] = r.problem;
    nlohmann::json tables = nlohmann::json::array();
    if (r.contents)
      for (const auto& t : r.contents->tables) {
        nlohmann::json tj = {{"name", t.name}, {"kind", ck::to_string(t.kind)}, {"rows", t.stored_rows},
                             {"total_rows", t.total_rows}, {"dim", t.dim}, {"optimizer", t.optimizer},
                             {"content_checksum", t.content_checksum}};
        if (t.kind == ck::DynamicKind::kDelta) {
          tj["parent_step"] = t.parent_step;
          tj["parent_checksum"] = t.parent_checksum;
          tj["evicted"] = t.evicted_ids.size();
        }
        tables.push_back(tj);
      }
    j["tables"] = tables;
    files.push_back(j);
  }
  for (const auto& p : plans) {
    nlohmann::json j = {{"table", p.table}};
    if (p.plan) {
      j["step"] = p.plan->step;
      nlohmann::json chain = nlohmann::json::array();
      for (const auto& c : p.plan->chain) chain.push_back(fs::path(c).filename().string());
      j["chain"] = chain;
      if (!p.plan->warning.empty()) j["warning"] = p.plan->warning;
    } else {
      j["step"] = nullptr;
      j["problem"] = p.problem;
    }
    restore.push_back(j);
  }
  return {{"files", files}, {"restore", restore}};
}

// ---- ls ----------------------------------------------------------------------------------------

int run_ls(const CkptFlags& f) {
  if (!is_directory_arg(f.path))
    throw ConfigError("'" + f.path + "' is a file; ls takes a checkpoint directory (for a file: strata ckpt show)");
  const ck::CheckpointList list = list_entries(f.path);
  const auto& entries = list.entries;

  struct Row {
    ck::CheckpointEntry entry;
    bool exists = false;
    std::string absent = "MISSING";  // the size column when !exists
    std::uint64_t bytes = 0;
    std::optional<FileVerdict> verdict;
  };
  std::vector<Row> rows;
  bool any_bad = f.verify && !list.refused.empty();
  for (const auto& e : entries) {
    Row row;
    row.entry = e;
    std::string path = (fs::path(f.path) / e.file).string();
    // symlink_status: the listing never follows a link out of the directory (verify refuses one).
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(path, ec);
    row.exists = !ec && fs::is_regular_file(st);
    if (row.exists) row.bytes = fs::file_size(path, ec);
    if (!ec && fs::exists(st) && !row.exists) row.absent = "NOT-A-REGULAR-FILE";
    if (f.verify) {
      row.verdict = verify_entry(f.path, e, f);
      any_bad = any_bad || !row.verdict->ok;
    }
    rows.push_back(std::move(row));
  }

  // Files a save left behind (in progress or crashed; FORMAT.md section 7): never restored from,
  // listed so the user knows they exist and why they are ignored.
  std::vector<ck::UncommittedFile> stray;
  try {
    stray = ck::list_uncommitted_files(f.path);
  } catch (const Error& e) {
    throw Failure(e.message());
  }

  // Dynamic-table files (FORMAT.md section 10), when the directory has any.
  const std::vector<DynamicRow> dyn_rows = dynamic_rows(f.path, false);
  const std::vector<DynamicPlanRow> dyn_plans = dynamic_plans(f.path, dyn_rows);

  // With --verify, the entry `--restore latest` would use: the newest one that verified, the same
  // rule as latest_checkpoint() (FORMAT.md section 6), from results already computed.
  const Row* restore = nullptr;
  if (f.verify)
    for (auto it = rows.rbegin(); it != rows.rend() && restore == nullptr; ++it)
      if (it->verdict->ok) restore = &*it;

  if (f.json) {
    nlohmann::json doc;
    doc["dir"] = f.path;
    doc["latest"] = rows.empty() ? nlohmann::json(nullptr) : nlohmann::json(rows.back().entry.file);
    doc["checkpoints"] = nlohmann::json::array();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      nlohmann::json j = {{"file", r.entry.file},
                          {"global_step", r.entry.global_step},
                          {"created_unix", r.entry.created_unix},
                          {"created", iso_utc(r.entry.created_unix)},
                          {"exists", r.exists},
                          {"bytes", r.exists ? nlohmann::json(r.bytes) : nlohmann::json(nullptr)},
                          {"latest", i + 1 == rows.size()},
                          {"preserved", r.entry.preserved}};
      if (r.verdict) {
        j["verified"] = r.verdict->ok;
        if (!r.verdict->ok) j["problem"] = r.verdict->summary();
        if (r.verdict->file_checksum) j["file_crc32"] = r.verdict->file_crc;
      }
      doc["checkpoints"].push_back(j);
    }
    doc["refused"] = nlohmann::json::array();
    for (const auto& r : list.refused) doc["refused"].push_back({{"file", r.file}, {"reason", r.reason}});
    doc["uncommitted"] = nlohmann::json::array();
    for (const auto& u : stray)
      doc["uncommitted"].push_back({{"file", u.file}, {"bytes", u.bytes}, {"complete", u.complete}});
    if (f.verify) doc["restore"] = restore ? nlohmann::json(restore->entry.file) : nlohmann::json(nullptr);
    if (!dyn_rows.empty()) {
      doc["dynamic"] = dynamic_json(dyn_rows, dyn_plans);
      for (const auto& r : dyn_rows) any_bad = any_bad || (f.verify && !r.contents);
      for (const auto& p : dyn_plans) any_bad = any_bad || (f.verify && !p.plan);
    }
    std::cout << doc.dump() << std::endl;
    return f.verify && any_bad ? kExitFailure : kExitOk;
  }

  std::ostringstream out;
  if (rows.empty()) {
    out << "no committed checkpoints in " << f.path << "\n";
  } else {
    out << "checkpoints in " << f.path << " (from checkpoint.json, oldest first)\n";
    std::vector<std::vector<std::string>> table;
    std::vector<std::string> header{"step", "file", "bytes", "size", "created"};
    if (f.verify) header.push_back("verify");
    header.push_back("");
    table.push_back(header);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::vector<std::string> cells{std::to_string(r.entry.global_step), r.entry.file,
                                     r.exists ? std::to_string(r.bytes) : "-", r.exists ? human_bytes(r.bytes) : r.absent,
                                     iso_utc(r.entry.created_unix)};
      if (f.verify) cells.push_back(r.verdict->ok ? "verified" : "CORRUPT");
      // keep_every_n_hours entries are exempt from max_to_keep: say so, or their survival looks odd.
      std::string note = i + 1 == rows.size() ? "latest" : "";
      if (r.entry.preserved) note += note.empty() ? "preserved" : ", preserved";
      cells.push_back(note);
      table.push_back(cells);
    }
    print_table(out, table);
    if (f.verify)
      for (const auto& r : rows)
        if (!r.verdict->ok) out << "  " << r.entry.file << ": " << r.verdict->summary() << "\n";
  }
  for (const auto& r : list.refused) out << refused_line(f.path, r) << "\n";
  for (const auto& u : stray)
    out << "uncommitted (ignored): " << u.file << " (" << u.bytes << " bytes)"
        << (u.complete ? ": complete, but checkpoint.json does not name it (a save interrupted before its commit)"
                       : ": an unfinished save")
        << "\n";
  if (f.verify && !rows.empty() && !rows.back().verdict->ok)
    out << "latest " << rows.back().entry.file << " is CORRUPT; --restore latest would use "
        << (restore ? restore->entry.file + " (step " + std::to_string(restore->entry.global_step) + ")"
                    : std::string("nothing (no valid checkpoint)"))
        << "\n";
  if (!dyn_rows.empty()) {
    const std::size_t bad = print_dynamic(out, f.path, dyn_rows, dyn_plans);
    any_bad = any_bad || (f.verify && bad > 0);
  }
  std::cout << out.str() << std::flush;
  return f.verify && any_bad ? kExitFailure : kExitOk;
}

// ---- show --------------------------------------------------------------------------------------

int run_show(const CkptFlags& f) {
  std::string path = resolve_checkpoint(f.path, verify_options(f));
  ck::CheckpointReader reader = open_reader(path);
  std::error_code ec;
  std::uint64_t file_bytes = fs::file_size(path, ec);
  std::string optimizer, position;
  std::uint64_t hash = 0;
  std::int64_t created = 0;
  try {
    optimizer = reader.optimizer();
    position = reader.training_position_json();
    hash = reader.variable_sequence_hash();
    created = reader.created_unix();
  } catch (const std::exception& e) {
    throw Failure("cannot read the attributes of '" + path + "': " + message_of(e));
  }

  if (f.json) {
    nlohmann::json doc;
    doc["path"] = path;
    doc["bytes"] = file_bytes;
    doc["format_version"] = reader.format_version();
    doc["global_step"] = reader.global_step();
    doc["created_unix"] = created;
    doc["created"] = iso_utc(created);
    doc["optimizer"] = optimizer;
    doc["variable_sequence_hash"] = hash;
    // Embedded as JSON when it parses, so consumers need not parse a string; else the raw text.
    nlohmann::json pos = nlohmann::json::parse(position, nullptr, /*allow_exceptions=*/false);
    doc["training_position"] = pos.is_discarded() ? nlohmann::json(position) : pos;
    doc["variables"] = nlohmann::json::array();
    for (const auto& v : reader.variables())
      doc["variables"].push_back({{"name", v.name},
                                  {"shape", v.shape},
                                  {"dtype", ck::to_string(v.dtype)},
                                  {"bytes", bytes_of(v)},
                                  {"slots", v.slots},
                                  {"optimizer_step", v.optimizer_step}});
    std::cout << doc.dump() << std::endl;
    return kExitOk;
  }

  std::ostringstream out;
  std::vector<std::vector<std::string>> head{
      {"checkpoint", path},
      {"file size", std::to_string(file_bytes) + " bytes (" + human_bytes(file_bytes) + ")"},
      {"format_version", std::to_string(reader.format_version())},
      {"global_step", std::to_string(reader.global_step())},
      {"created", iso_utc(created) + " (unix " + std::to_string(created) + ")"},
      {"optimizer", optimizer.empty() ? "-" : optimizer},
      {"variable_sequence_hash", hex64(hash) + " (" + std::to_string(hash) + ")"},
      {"training_position", position.empty() ? "{}" : position}};
  print_table(out, head);
  out << "\n";
  std::vector<std::vector<std::string>> table{{"name", "shape", "dtype", "bytes", "slots", "optimizer_step"}};
  std::uint64_t value_bytes = 0, slot_bytes = 0;
  for (const auto& v : reader.variables()) {
    table.push_back({v.name, shape_string(v.shape), ck::to_string(v.dtype), std::to_string(bytes_of(v)),
                     v.slots.empty() ? "-" : join(v.slots, ","), std::to_string(v.optimizer_step)});
    value_bytes += bytes_of(v);
    slot_bytes += bytes_of(v) * v.slots.size();
  }
  print_table(out, table);
  out << reader.variables().size() << " variable(s): " << value_bytes << " bytes of values ("
      << human_bytes(value_bytes) << "), " << slot_bytes << " bytes of slots (" << human_bytes(slot_bytes) << ")\n";
  std::cout << out.str() << std::flush;
  return kExitOk;
}

// ---- verify ------------------------------------------------------------------------------------

void print_verdict(std::ostream& out, const FileVerdict& v) {
  if (v.ok) {
    out << v.path << ": OK (step " << v.global_step << ", " << v.datasets << " dataset(s) verified, ";
    if (v.file_checksum) {
      char crc[16];
      std::snprintf(crc, sizeof crc, "0x%08x", v.file_crc);
      out << "file checksum " << crc << " over " << v.file_bytes << " bytes)\n";
    } else {
      out << "format " << v.format_version << ": no file checksum)\n";
    }
    return;
  }
  if (!v.error.empty()) {
    out << v.path << ": FAILED: " << v.error << "\n";
  } else {
    out << v.path << ": FAILED: " << v.bad.size() << " of " << v.datasets << " dataset(s) bad\n";
  }
  for (const auto& b : v.bad) out << "  " << b.path << ": " << b.reason << "\n";
}

// A directory's dynamic files, read whole and checked, and each table's restore chain. Returns the
// number of problems.
std::size_t verify_dynamic(const std::string& dir, const std::vector<DynamicRow>& rows) {
  std::size_t bad = 0;
  for (const auto& r : rows) {
    if (r.contents) {
      std::vector<std::string> summaries;
      for (const auto& t : r.contents->tables) summaries.push_back(dynamic_table_summary(t));
      std::cout << r.path << ": OK (step " << r.step << ", dynamic: " << join(summaries, "; ") << ")\n";
    } else {
      std::cout << r.path << ": FAILED: " << r.problem << "\n";
      ++bad;
    }
  }
  for (const auto& p : dynamic_plans(dir, rows)) {
    if (!p.plan) {
      std::cout << "dynamic table " << p.table << ": no complete state: " << p.problem << "\n";
      ++bad;
      continue;
    }
    std::cout << "dynamic table " << p.table << ": restores step " << p.plan->step << " from " << chain_text(*p.plan) << "\n";
    if (!p.plan->warning.empty()) std::cout << "  " << p.plan->warning << "\n";
  }
  std::cout << rows.size() << " dynamic file(s): " << rows.size() - std::min(bad, rows.size()) << " OK\n" << std::flush;
  return bad;
}

// One directory: every committed entry, a count, and what --restore latest would use when the
// latest fails. Returns the number of entries that failed.
std::size_t verify_directory(const std::string& dir, const CkptFlags& f) {
  const ck::CheckpointList list = list_entries(dir);
  const auto& entries = list.entries;
  const std::vector<DynamicRow> dyn = dynamic_rows(dir, /*with_data=*/true);
  if (entries.empty() && list.refused.empty()) {
    if (dyn.empty()) throw Failure(no_checkpoints(dir) + ", nothing to verify");
    return verify_dynamic(dir, dyn);
  }
  // Entries that name no checkpoint of this directory are failures, never opened.
  for (const auto& r : list.refused) std::cout << refused_line(dir, r) << "\n";
  std::size_t failed = list.refused.size();
  bool latest_ok = true;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    FileVerdict v = verify_entry(dir, entries[i], f);
    print_verdict(std::cout, v);
    std::cout << std::flush;  // a long verification shows progress file by file
    if (!v.ok) ++failed;
    if (i + 1 == entries.size()) latest_ok = v.ok;
  }
  const std::size_t total = entries.size() + list.refused.size();
  std::cout << total << " checkpoint(s): " << total - failed << " OK, " << failed << " FAILED\n";
  if (!latest_ok) {
    // Ask the restore path itself, so this line can never disagree with what `--restore latest`
    // does. It re-reads the older files; only paid when the latest is bad.
    auto latest = latest_valid(dir, /*quiet=*/true, verify_options(f));
    std::cout << "latest checkpoint " << entries.back().file << " failed verification; --restore latest would use "
              << (latest ? latest->path + " (step " + std::to_string(latest->global_step) + ")"
                         : std::string("nothing (no valid checkpoint)"))
              << "\n";
  }
  std::cout << std::flush;
  if (!dyn.empty()) failed += verify_dynamic(dir, dyn);
  return failed;
}

int run_verify(const CkptFlags& f) {
  // Every PATH must exist before anything is verified (a typo is a usage error).
  std::vector<bool> is_dir;
  for (const auto& p : f.paths) is_dir.push_back(is_directory_arg(p));
  std::size_t failed = 0, files = 0;
  for (std::size_t i = 0; i < f.paths.size(); ++i) {
    if (is_dir[i]) {
      if (f.paths.size() > 1) std::cout << "directory " << f.paths[i] << ":\n";
      try {
        failed += verify_directory(f.paths[i], f) > 0 ? 1 : 0;
      } catch (const Failure& e) {
        if (f.paths.size() == 1) throw;
        std::cout << f.paths[i] << ": FAILED: " << e.message() << "\n";
        ++failed;
      }
    } else if (fs::path(f.paths[i]).filename().string().rfind("dynamic-", 0) == 0) {
      ++files;
      try {
        const ck::DynamicCheckpointFile d = ck::read_dynamic_checkpoint(f.paths[i], true);
        std::vector<std::string> summaries;
        for (const auto& t : d.tables) summaries.push_back(dynamic_table_summary(t));
        std::cout << f.paths[i] << ": OK (step " << d.global_step << ", dynamic: " << join(summaries, "; ") << ")\n";
      } catch (const Error& e) {
        std::cout << f.paths[i] << ": FAILED: " << e.message() << "\n";
        ++failed;
      }
      std::cout << std::flush;
    } else {
      FileVerdict v = verify_file(f.paths[i], f);
      print_verdict(std::cout, v);
      std::cout << std::flush;
      ++files;
      if (!v.ok) ++failed;
    }
  }
  if (f.paths.size() > 1)
    std::cout << f.paths.size() << " path(s): " << f.paths.size() - failed << " OK, " << failed << " FAILED\n";
  std::cout << std::flush;
  return failed == 0 ? kExitOk : kExitFailure;
}

// ---- diff --------------------------------------------------------------------------------------

// Differences found in one dataset. Elements count as equal when bitwise equal, or both NaN, or
// (with --atol) |a - b| <= atol.
struct DiffStats {
  std::int64_t count = 0;
  double max_abs = 0;          // over differing elements with a finite difference
  bool nan_mismatch = false;   // some difference was NaN (NaN vs number, or inf - inf)
  std::int64_t first = -1;     // flat row-major index of the first differing element
  std::string first_a, first_b;
};

template <typename T>
std::string value_string(T v) {
  char buf[48];
  if constexpr (std::is_integral_v<T>) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  } else {
    // Enough digits to round-trip, so two values that differ never print alike.
    std::snprintf(buf, sizeof buf, "%.*g", std::is_same_v<T, float> ? 9 : 17, static_cast<double>(v));
  }
  return buf;
}

template <typename T>
void compare_elements(const T* a, const T* b, std::int64_t n, std::int64_t base, std::optional<double> atol,
                      DiffStats& s) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) == 0) continue;
    // long double holds every int64 difference exactly (64-bit mantissa on x86-64).
    long double diff = std::fabs(static_cast<long double>(a[i]) - static_cast<long double>(b[i]));
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;  // NaNs with different payloads
    }
    if (atol && diff <= *atol) continue;  // false for NaN differences
    ++s.count;
    if (std::isnan(diff))
      s.nan_mismatch = true;
    else
      s.max_abs = std::max(s.max_abs, static_cast<double>(diff));
    if (s.first < 0) {
      s.first = base + i;
      s.first_a = value_string(a[i]);
      s.first_b = value_string(b[i]);
    }
  }
}

std::string unravel(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 0) break;
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_string(index);
}

// Streams one dataset of both files in blocks of whole rows: memory stays at two blocks no matter
// how large the checkpoint is. `slot` empty means the variable's values.
DiffStats diff_dataset(const ck::CheckpointReader& a, const ck::CheckpointReader& b, const ck::VariableMeta& v,
                       const std::string& slot, std::optional<double> atol, std::uint64_t block_bytes) {
  DiffStats s;
  std::int64_t rows = v.shape[0];
  std::int64_t row_elems = rows == 0 ? 0 : elements_of(v.shape) / rows;
  std::int64_t row_bytes = row_elems * static_cast<std::int64_t>(ck::dtype_size(v.dtype));
  if (rows == 0 || row_bytes == 0) return s;
  std::int64_t rows_per_block = std::max<std::int64_t>(1, static_cast<std::int64_t>(block_bytes) / row_bytes);
  std::vector<unsigned char> buf_a, buf_b;
  for (std::int64_t r = 0; r < rows; r += rows_per_block) {
    std::int64_t e = std::min(rows, r + rows_per_block);
    std::size_t n = static_cast<std::size_t>((e - r) * row_bytes);
    buf_a.resize(n);
    buf_b.resize(n);
    for (auto [reader, buf] : {std::pair{&a, &buf_a}, std::pair{&b, &buf_b}}) {
      try {
        reader->read_slot_rows(v.name, slot, r, e, buf->data());
      } catch (const std::exception& ex) {
        throw Failure("cannot read " + (slot.empty() ? "variables/" + v.name : "slots/" + v.name + "/" + slot) +
                      " rows [" + std::to_string(r) + "," + std::to_string(e) + ") of '" + reader->path() +
                      "': " + message_of(ex));
      }
    }
    if (std::memcmp(buf_a.data(), buf_b.data(), n) == 0) continue;  // the common case: bitwise equal
    std::int64_t count = (e - r) * row_elems, base = r * row_elems;
    switch (v.dtype) {
      case ck::DType::kF32:
        compare_elements(reinterpret_cast<const float*>(buf_a.data()), reinterpret_cast<const float*>(buf_b.data()),
                         count, base, atol, s);
        break;
      case ck::DType::kF64:
        compare_elements(reinterpret_cast<const double*>(buf_a.data()),
                         reinterpret_cast<const double*>(buf_b.data()), count, base, atol, s);
        break;
      case ck::DType::kI64:
        compare_elements(reinterpret_cast<const std::int64_t*>(buf_a.data()),
                         reinterpret_cast<const std::int64_t*>(buf_b.data()), count, base, atol, s);
        break;
    }
  }
  return s;
}

std::string max_diff_string(const DiffStats& s) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", s.max_abs);
  if (s.nan_mismatch) return s.count > 0 && s.max_abs > 0 ? std::string(buf) + " (and NaN mismatches)" : "nan";
  return buf;
}

bool is_dynamic_file(const std::string& path) { return fs::path(path).filename().string().rfind("dynamic-", 0) == 0; }

// The state every table of dynamic file `path` restores to, merged along its chain from the
// file's directory. Failure when a table's chain is broken there (the restore would fall back).
std::vector<ck::DynamicTableState> restored_tables(const std::string& path, std::int64_t& step) {
  const ck::DynamicCheckpointFile head = ck::read_dynamic_checkpoint(path, false);
  step = head.global_step;
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (fs::path(path).filename().string() != ck::dynamic_file_name(step))
    throw Failure("'" + path + "' holds step " + std::to_string(step) + "; chains are followed only from files named " +
                  ck::dynamic_file_name(step));
  std::vector<ck::DynamicTableState> out;
  for (const auto& t : head.tables) {
    ck::DynamicRestore r = ck::restore_dynamic_table(dir, t.name, step);
    if (r.step != step) throw Failure(r.warning);
    out.push_back(std::move(r.state));
  }
  return out;
}

// `diff` of two dynamic files: the states their chains restore, table by table, row by row (by id).
int run_dynamic_diff(const CkptFlags& f, std::optional<double> atol) {
  std::int64_t step_a = 0, step_b = 0;
  const std::vector<ck::DynamicTableState> ta = restored_tables(f.path, step_a);
  const std::vector<ck::DynamicTableState> tb = restored_tables(f.path_b, step_b);
  std::cout << "A: " << f.path << " (step " << step_a << ", dynamic)\n"
            << "B: " << f.path_b << " (step " << step_b << ", dynamic)\n";
  std::ostringstream out;
  std::size_t differences = 0;
  auto report = [&](const std::string& line) {
    out << line << "\n";
    ++differences;
  };
  if (step_a != step_b) report("global_step: A " + std::to_string(step_a) + ", B " + std::to_string(step_b));
  auto same = [&](float x, float y) {
    return std::memcmp(&x, &y, sizeof x) == 0 || (std::isnan(x) && std::isnan(y)) ||
           (atol && std::fabs(static_cast<double>(x) - static_cast<double>(y)) <= *atol);
  };
  for (const auto& x : ta) {
    auto it = std::find_if(tb.begin(), tb.end(), [&](const auto& t) { return t.name == x.name; });
    if (it == tb.end()) {
      report("only in A: dynamic table " + x.name);
      continue;
    }
    const ck::DynamicTableState& y = *it;
    const std::string name = "dynamic/" + x.name;
    if (x.dim != y.dim || x.optimizer != y.optimizer || x.slot_names != y.slot_names) {
      report(name + ": A dim " + std::to_string(x.dim) + " " + x.optimizer + ", B dim " + std::to_string(y.dim) + " " +
             y.optimizer + " (rows not compared)");
      continue;
    }
    if (x.clock != y.clock) report(name + " clock: A " + std::to_string(x.clock) + ", B " + std::to_string(y.clock));
    if (x.sketch != y.sketch) report(name + " sketch differs");
    if (!(x.counters == y.counters)) report(name + " counters differ");
    const auto dim = static_cast<std::size_t>(x.dim);
    std::int64_t only_a = 0, only_b = 0, rows_differ = 0, counts_differ = 0;
    std::string first, first_count;
    // Update counts are exact (no --atol); a file without them (older format) counts 0 a row.
    auto count_of = [](const ck::DynamicTableState& t, std::size_t i) -> std::uint32_t {
      return t.update_counts.empty() ? 0 : t.update_counts[i];
    };
    std::size_t i = 0, j = 0;
    while (i < x.ids.size() || j < y.ids.size()) {
      if (j == y.ids.size() || (i < x.ids.size() && x.ids[i] < y.ids[j])) {
        ++only_a, ++i;
        continue;
      }
      if (i == x.ids.size() || y.ids[j] < x.ids[i]) {
        ++only_b, ++j;
        continue;
      }
      bool equal = x.stamps[i] == y.stamps[j];
      for (std::size_t k = 0; k < dim && equal; ++k) equal = same(x.values[i * dim + k], y.values[j * dim + k]);
      for (std::size_t s = 0; s < x.slots.size() && equal; ++s)
        for (std::size_t k = 0; k < dim && equal; ++k) equal = same(x.slots[s][i * dim + k], y.slots[s][j * dim + k]);
      if (!equal && rows_differ++ == 0) first = std::to_string(x.ids[i]);
      if (count_of(x, i) != count_of(y, j) && counts_differ++ == 0)
        first_count = std::to_string(x.ids[i]) + " (A " + std::to_string(count_of(x, i)) + ", B " +
                      std::to_string(count_of(y, j)) + ")";
      ++i, ++j;
    }
    if (only_a > 0) report(name + ": " + std::to_string(only_a) + " id(s) only in A");
    if (only_b > 0) report(name + ": " + std::to_string(only_b) + " id(s) only in B");
    if (rows_differ > 0)
      report(name + ": " + std::to_string(rows_differ) + " row(s) differ (values, slots or stamp), first id " + first);
    if (counts_differ > 0)
      report(name + ": " + std::to_string(counts_differ) + " row(s) differ in update count, first id " + first_count);
  }
  for (const auto& y : tb)
    if (std::none_of(ta.begin(), ta.end(), [&](const auto& t) { return t.name == y.name; }))
      report("only in B: dynamic table " + y.name);
  if (differences == 0)
    out << "identical\n";
  else
    out << differences << (differences == 1 ? " difference\n" : " differences\n");
  std::cout << out.str() << std::flush;
  return differences == 0 ? kExitOk : kExitFailure;
}

int run_diff(const CkptFlags& f) {
  std::optional<double> atol;
  if (!f.atol.empty()) {
    double t = parse_double(f.atol, "--atol");
    if (!(t >= 0) || !std::isfinite(t)) throw ConfigError("--atol must be a finite number >= 0, got '" + f.atol + "'");
    atol = t;
  }
  std::uint64_t block_bytes = kDefaultBlockBytes;
  if (!f.block_bytes.empty()) {
    block_bytes = parse_bytes(f.block_bytes, "--block-bytes");
    if (block_bytes == 0) throw ConfigError("--block-bytes must be positive");
  }
  // Both PATHs are checked for existence before anything is read, so a typo is a usage error even
  // when the other side is a large directory.
  const bool dir_a = is_directory_arg(f.path), dir_b = is_directory_arg(f.path_b);
  if (!dir_a && !dir_b && is_dynamic_file(f.path) && is_dynamic_file(f.path_b)) {
    try {
      return run_dynamic_diff(f, atol);
    } catch (const Failure&) {
      throw;
    } catch (const Error& e) {
      throw Failure(e.message());
    }
  }
  ck::CheckpointReader a = open_reader(resolve_checkpoint(f.path, verify_options(f)));
  ck::CheckpointReader b = open_reader(resolve_checkpoint(f.path_b, verify_options(f)));

  std::ostringstream out;
  std::size_t differences = 0;
  auto report = [&](const std::string& line) {
    out << line << "\n";
    ++differences;
  };
  std::cout << "A: " << a.path() << " (step " << a.global_step() << ")\n"
            << "B: " << b.path() << " (step " << b.global_step() << ")\n";

  // Root metadata that describes the training state. created_unix and the file name differ between
  // two saves of the same state and are ignored.
  if (a.global_step() != b.global_step())
    report("global_step: A " + std::to_string(a.global_step()) + ", B " + std::to_string(b.global_step()));
  try {
    if (a.optimizer() != b.optimizer()) report("optimizer: A '" + a.optimizer() + "', B '" + b.optimizer() + "'");
    if (a.variable_sequence_hash() != b.variable_sequence_hash())
      report("variable_sequence_hash: A " + hex64(a.variable_sequence_hash()) + ", B " +
             hex64(b.variable_sequence_hash()));
    // Compared as JSON values, so formatting (spaces, key order) does not count.
    std::string pa = a.training_position_json(), pb = b.training_position_json();
    auto ja = nlohmann::json::parse(pa, nullptr, false), jb = nlohmann::json::parse(pb, nullptr, false);
    bool same = (ja.is_discarded() || jb.is_discarded()) ? pa == pb : ja == jb;
    if (!same) report("training_position: A " + pa + ", B " + pb);
  } catch (const Failure&) {
    throw;
  } catch (const std::exception& e) {
    throw Failure("cannot read root attributes: " + message_of(e));
  }

  // Variables: both lists are sorted by name (CheckpointReader contract); merge them.
  const auto& va = a.variables();
  const auto& vb = b.variables();
  std::size_t i = 0, j = 0;
  auto describe = [](const ck::VariableMeta& v) { return shape_string(v.shape) + " " + ck::to_string(v.dtype); };
  while (i < va.size() || j < vb.size()) {
    if (j == vb.size() || (i < va.size() && va[i].name < vb[j].name)) {
      report("only in A: variables/" + va[i].name + " " + describe(va[i]));
      ++i;
      continue;
    }
    if (i == va.size() || vb[j].name < va[i].name) {
      report("only in B: variables/" + vb[j].name + " " + describe(vb[j]));
      ++j;
      continue;
    }
    const ck::VariableMeta& x = va[i++];
    const ck::VariableMeta& y = vb[j++];
    if (x.shape != y.shape || x.dtype != y.dtype) {
      report("variables/" + x.name + ": A " + describe(x) + ", B " + describe(y) + " (values not compared)");
      continue;
    }
    // The optimizer's step count drives Adam's bias correction: a restore that lost it would
    // continue training differently even with equal values and slots.
    if (x.optimizer_step != y.optimizer_step)
      report("variables/" + x.name + " optimizer_step: A " + std::to_string(x.optimizer_step) + ", B " +
             std::to_string(y.optimizer_step));
    std::vector<std::string> slots{""};
    for (const auto& s : x.slots) {
      if (std::find(y.slots.begin(), y.slots.end(), s) != y.slots.end())
        slots.push_back(s);
      else
        report("only in A: slots/" + x.name + "/" + s);
    }
    for (const auto& s : y.slots)
      if (std::find(x.slots.begin(), x.slots.end(), s) == x.slots.end()) report("only in B: slots/" + x.name + "/" + s);
    for (const auto& slot : slots) {
      DiffStats s = diff_dataset(a, b, x, slot, atol, block_bytes);
      if (s.count == 0) continue;
      std::string name = slot.empty() ? "variables/" + x.name : "slots/" + x.name + "/" + slot;
      report(name + ": " + std::to_string(s.count) + " of " + std::to_string(elements_of(x.shape)) +
             " element(s) differ, max abs diff " + max_diff_string(s) + ", first at " + unravel(s.first, x.shape) +
             " (A " + s.first_a + ", B " + s.first_b + ")");
    }
  }
  if (differences == 0)
    out << "identical\n";
  else
    out << differences << (differences == 1 ? " difference\n" : " differences\n");
  std::cout << out.str() << std::flush;
  return differences == 0 ? kExitOk : kExitFailure;
}

void print_line(std::FILE* stream, const std::string& text) {
  std::string line = text + "\n";
  std::fwrite(line.data(), 1, line.size(), stream);
  std::fflush(stream);
}

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

// `prune DIR`: the dynamic files no step of checkpoint.json needs (FORMAT.md 10.8), removed as
// save() removes them after each commit (preserved steps' deltas compacted first, as there); for files a crash between a pointer's commit and the
// deletions left behind. No lock is needed against a job saving meanwhile: its next pointer keeps
// a subset of these steps plus a newer one whose chain runs through files kept here.
int run_prune(const CkptFlags& f) {
  if (!is_directory_arg(f.path))
    throw ConfigError("'" + f.path + "' is a file; prune takes a checkpoint directory");
  const ck::CheckpointList list = list_entries(f.path);
  std::vector<std::int64_t> kept, preserved;
  for (const auto& e : list.entries) {
    kept.push_back(e.global_step);
    if (e.preserved) preserved.push_back(e.global_step);
  }
  if (kept.empty()) {
    std::cout << "nothing pruned: " << f.path << "/checkpoint.json names no checkpoint\n";
    return 0;
  }
  const ck::DynamicPrune p = ck::prune_dynamic_checkpoints(f.path, kept, preserved);
  for (const auto& note : p.plan.notes) std::cout << "kept: " << note << "\n";
  for (const auto& name : p.compacted) std::cout << "compacted " << f.path << "/" << name << " (preserved)\n";
  for (const auto& name : p.removed) std::cout << "removed " << f.path << "/" << name << "\n";
  for (const auto& why : p.not_removed) std::cout << "not removed: " << f.path << "/" << why << "\n";
  std::cout << p.removed.size() << " dynamic file(s) removed, " << p.plan.needed.size() << " kept for "
            << kept.size() << " checkpoint(s)\n";
  return p.not_removed.empty() ? 0 : kExitFailure;
}

}  // namespace

constexpr const char* kAllowUnverifiedHelp =
    "accept format 1 files, which have no integrity block: HDF5 parses them unverified (refused by default)";

CLI::App* add_ckpt_command(CLI::App& app, CkptFlags& f) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect checkpoints: list, show, verify checksums, compare two");
  ckpt->require_subcommand(1);

  CLI::App* ls = ckpt->add_subcommand("ls", "List the committed checkpoints of a directory, oldest first");
  ls->add_option("DIR", f.path, "checkpoint directory (holds checkpoint.json)")->required();
  ls->add_flag("--verify", f.verify, "also verify every file's checksums (exit 1 if any fails)");
  ls->add_flag("--json", f.json, "print one JSON object");
  ls->add_flag("--allow-unverified", f.allow_unverified, kAllowUnverifiedHelp);
  ls->callback([&f] { f.action = "ls"; });

  CLI::App* show = ckpt->add_subcommand("show", "Show a checkpoint's attributes and its variables with shapes");
  show->add_option("PATH", f.path, "checkpoint file, or a directory meaning its latest valid checkpoint")->required();
  show->add_flag("--json", f.json, "print one JSON object");
  show->add_flag("--allow-unverified", f.allow_unverified, kAllowUnverifiedHelp);
  show->callback([&f] { f.action = "show"; });

  CLI::App* verify = ckpt->add_subcommand(
      "verify", "Verify every byte of checkpoint files (whole-file, metadata and dataset checksums); exit 1 if any fails");
  verify->add_option("PATH", f.paths, "checkpoint files or directories (a directory: every committed checkpoint)")
      ->required();
  verify->add_flag("--allow-unverified", f.allow_unverified, kAllowUnverifiedHelp);
  verify->callback([&f] { f.action = "verify"; });

  CLI::App* diff = ckpt->add_subcommand(
      "diff", "Compare two checkpoints value by value (exit 0 when identical); two dynamic-<step>.h5 files: the "
              "states their chains restore, row by row");
  diff->add_option("A", f.path, "checkpoint file, or a directory meaning its latest valid checkpoint")->required();
  diff->add_option("B", f.path_b, "checkpoint file, or a directory meaning its latest valid checkpoint")->required();
  diff->add_option("--atol", f.atol, "elements with |a - b| <= X count as equal (default: bitwise, NaN == NaN)");
  diff->add_option("--block-bytes", f.block_bytes, "read at most this many bytes per side at a time (default 16M)");
  diff->add_flag("--allow-unverified", f.allow_unverified, kAllowUnverifiedHelp);
  diff->callback([&f] { f.action = "diff"; });

  CLI::App* prune = ckpt->add_subcommand(
      "prune", "Remove the dynamic-<step>.h5 files that no checkpoint named by checkpoint.json needs");
  prune->add_option("DIR", f.path, "checkpoint directory (holds checkpoint.json)")->required();
  prune->callback([&f] { f.action = "prune"; });
  return ckpt;
}

int run_ckpt_command(const CkptFlags& flags) {
  std::string who = "strata ckpt " + flags.action;
  try {
    if (flags.action == "ls") return run_ls(flags);
    if (flags.action == "show") return run_show(flags);
    if (flags.action == "verify") return run_verify(flags);
    if (flags.action == "diff") return run_diff(flags);
    if (flags.action == "prune") return run_prune(flags);
    throw ConfigError("no ckpt command given");
  } catch (const Failure& e) {
    std::cout << std::flush;
    print_line(stderr, who + ": " + one_line(e.message()));
    return kExitFailure;
  } catch (const ConfigError& e) {
    std::cout << std::flush;
    print_line(stderr, who + ": error: " + one_line(e.message()));
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cout << std::flush;
    print_line(stderr, who + ": " + one_line(message_of(e)));
    return kExitFailure;
  }
}

}  // namespace strata::cli
