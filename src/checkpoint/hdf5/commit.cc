// Atomic commit and the checkpoint.json pointer; list_checkpoints() and latest_checkpoint().
//
// Durability argument (FORMAT.md "Commit protocol"): a reader only ever follows checkpoint.json,
// and checkpoint.json only ever names files that were fsync'ed and renamed into place before it
// was itself written, fsync'ed and renamed. rename(2) within one directory is atomic, so a crash
// at any point leaves either the old pointer (naming old, intact files) or the new one (naming a
// complete file); at worst an orphaned *.tmp remains, which remove_orphaned_files() deletes when
// the next job opens the directory for saving.
#include "checkpoint/hdf5/commit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/common/error.h"
#include "strata/common/logging.h"

namespace strata::checkpoint {
namespace detail {
namespace {

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  throw Error("checkpoint: " + what + " '" + path + "' failed: " + std::strerror(errno));
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail_errno("open for fsync", path);
  if (::fsync(fd) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    fail_errno("fsync", path);
  }
  ::close(fd);
}

std::string parent_dir(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

std::string checkpoint_file_name(std::int64_t global_step) {
  return "ckpt-" + std::to_string(global_step) + ".h5";
}

void durable_rename(const std::string& tmp, const std::string& final_path) {
  fsync_path(tmp, false);
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0) fail_errno("rename to '" + final_path + "' of", tmp);
  fsync_path(parent_dir(final_path), true);
}

std::vector<CheckpointEntry> read_pointer(const std::string& dir) {
  std::string path = (std::filesystem::path(dir) / kPointerFile).string();
  std::ifstream in(path);
  if (!in) return {};
  std::vector<CheckpointEntry> entries;
  try {
    nlohmann::json doc = nlohmann::json::parse(in);
    for (const auto& e : doc.at("checkpoints")) {
      CheckpointEntry entry;
      entry.file = e.at("file").get<std::string>();
      entry.global_step = e.at("global_step").get<std::int64_t>();
      entry.created_unix = e.at("created_unix").get<std::int64_t>();
      entry.preserved = e.value("preserved", false);
      entries.push_back(entry);
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("checkpoint: malformed " + path + ": " + e.what());
  }
  return entries;
}

void write_pointer(const std::string& dir, const std::vector<CheckpointEntry>& entries) {
  nlohmann::json doc;
  doc["format_version"] = kFormatVersion;
  doc["latest"] = entries.empty() ? nlohmann::json(nullptr) : nlohmann::json(entries.back().file);
  doc["checkpoints"] = nlohmann::json::array();
  for (const auto& e : entries) {
    nlohmann::json entry = {{"file", e.file}, {"global_step", e.global_step}, {"created_unix", e.created_unix}};
    if (e.preserved) entry["preserved"] = true;
    doc["checkpoints"].push_back(entry);
  }
  std::string final_path = (std::filesystem::path(dir) / kPointerFile).string();
  std::string tmp = final_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail_errno("create", tmp);
    out << doc.dump(2) << "\n";
    out.flush();
    if (!out) fail_errno("write", tmp);
  }
  durable_rename(tmp, final_path);
}

}  // namespace detail

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw ConfigError("checkpoint directory '" + dir + "' does not exist");
  return detail::read_pointer(dir);
}

std::optional<LatestCheckpoint> latest_checkpoint(const std::string& dir) {
  auto entries = list_checkpoints(dir);
  std::vector<std::string> skipped;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    std::string path = (std::filesystem::path(dir) / it->file).string();
    Verification v = verify_checkpoint(path);
    std::string reason = v.ok ? "" : v.summary();
    if (v.ok && v.global_step != it->global_step)
      reason = "holds global step " + std::to_string(v.global_step) + ", checkpoint.json says " +
               std::to_string(it->global_step);
    if (reason.empty()) {
      if (!skipped.empty()) {
        STRATA_LOG(WARN) << "checkpoint: using " << path << " (step " << it->global_step
                         << ") instead of the newer invalid checkpoint(s)";
      }
      return LatestCheckpoint{path, it->global_step, std::move(skipped)};
    }
    STRATA_LOG(WARN) << "checkpoint: skipping " << path << ": " << reason;
    skipped.push_back(path + ": " + reason);
  }
  return std::nullopt;
}

std::vector<std::string> remove_orphaned_files(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return removed;
  const std::string pointer_tmp = std::string(detail::kPointerFile) + ".tmp";
  for (const auto& item : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = item.path().filename().string();
    const bool save_tmp = name.size() > 12 && name.compare(0, 5, "ckpt-") == 0 &&
                          name.compare(name.size() - 7, 7, ".h5.tmp") == 0;
    if (!save_tmp && name != pointer_tmp) continue;
    std::error_code type_ec;
    if (!item.is_regular_file(type_ec)) continue;
    std::error_code rm_ec;
    if (std::filesystem::remove(item.path(), rm_ec)) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

}  // namespace strata::checkpoint
