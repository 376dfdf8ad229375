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

#include "checkpoint/hdf5/integrity.h"
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

std::string check_entry_name(const std::string& name, std::int64_t global_step) {
  const std::string expected = checkpoint_file_name(global_step);
  if (name == expected) return "";
  const bool shaped = name.size() > 8 && name.size() <= 5 + 19 + 3 && name.compare(0, 5, "ckpt-") == 0 &&
                      name.compare(name.size() - 3, 3, ".h5") == 0 &&
                      std::all_of(name.begin() + 5, name.end() - 3, [](char c) { return c >= '0' && c <= '9'; });
  if (!shaped) return "not a checkpoint file name (ckpt-<step>.h5 inside the directory)";
  return "the file name says another step than the entry's global_step " + std::to_string(global_step) +
         " (expected " + expected + ")";
}

std::size_t json_nesting_depth(const std::string& text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

CheckpointList read_pointer(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kPointerFile).string();
  // O_NOFOLLOW: the pointer is strata's own file, replaced by rename; a link in its place is not.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return {};
    if (errno == ELOOP) throw ConfigError("checkpoint: " + path + " is a symbolic link, not a regular file");
    fail_errno("open", path);
  }
  std::string text;
  {
    struct stat st {};
    const bool stat_ok = ::fstat(fd, &st) == 0;
    const int err = errno;
    if (!stat_ok || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) > kMaxPointerBytes) {
      ::close(fd);
      if (!stat_ok) throw Error("checkpoint: stat '" + path + "' failed: " + std::strerror(err));
      if (!S_ISREG(st.st_mode))
        throw ConfigError("checkpoint: " + path + " is " + file_kind(st.st_mode) + ", not a regular file");
      throw ConfigError("checkpoint: " + path + " has " + std::to_string(st.st_size) + " bytes, more than the " +
                        std::to_string(kMaxPointerBytes) + " a checkpoint.json may have");
    }
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t r = ::read(fd, text.data() + got, text.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    text.resize(got);
    ::close(fd);
  }
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw ConfigError("checkpoint: malformed " + path + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels");
  CheckpointList list;
  try {
    const nlohmann::json doc = nlohmann::json::parse(text);
    for (const auto& e : doc.at("checkpoints")) {
      CheckpointEntry entry;
      entry.file = e.at("file").get<std::string>();
      entry.global_step = e.at("global_step").get<std::int64_t>();
      entry.created_unix = e.at("created_unix").get<std::int64_t>();
      entry.preserved = e.value("preserved", false);
      std::string why = check_entry_name(entry.file, entry.global_step);
      if (why.empty())
        list.entries.push_back(entry);
      else
        list.refused.push_back({entry.file, why});
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("checkpoint: malformed " + path + ": " + e.what());
  }
  return list;
}

std::string remove_entry_file(const std::string& dir, const CheckpointEntry& entry) {
  const std::string why = check_entry_name(entry.file, entry.global_step);
  if (!why.empty()) return why;
  const std::string path = (std::filesystem::path(dir) / entry.file).string();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "" : std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return std::string("it is ") + file_kind(st.st_mode) + ", not a regular file";
  // unlink(2) never follows a link and never removes a directory, should the name change between
  // the lstat and here.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return std::strerror(errno);
  return "";
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

CheckpointList read_checkpoint_list(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw ConfigError("checkpoint directory '" + dir + "' does not exist");
  return detail::read_pointer(dir);
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir) { return read_checkpoint_list(dir).entries; }

Verification verify_entry(const std::string& dir, const CheckpointEntry& entry, const VerifyOptions& options) {
  const std::string path = (std::filesystem::path(dir) / entry.file).string();
  const std::string bad_name = detail::check_entry_name(entry.file, entry.global_step);
  Verification v;
  v.path = path;
  v.structure_intact = false;
  if (!bad_name.empty()) {
    v.error = "checkpoint.json entry '" + entry.file + "': " + bad_name;
    return v;
  }
  // lstat first: an entry is a file strata wrote in this directory, never a link to elsewhere, and
  // a FIFO or device is never opened (opening a FIFO blocks until a writer appears).
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    v.error = errno == ENOENT ? "file is missing" : "cannot stat: " + std::string(std::strerror(errno));
    return v;
  }
  if (!S_ISREG(st.st_mode)) {
    v.error = std::string("is ") + detail::file_kind(st.st_mode) + ", not a regular file";
    return v;
  }
  v = verify_checkpoint(path, options);
  if (v.ok && v.global_step != entry.global_step) {
    v.ok = false;
    v.error = "holds global step " + std::to_string(v.global_step) + ", checkpoint.json says " +
              std::to_string(entry.global_step);
  }
  return v;
}

std::optional<LatestCheckpoint> latest_checkpoint(const std::string& dir, const VerifyOptions& options) {
  const CheckpointList list = read_checkpoint_list(dir);
  const std::string pointer = (std::filesystem::path(dir) / detail::kPointerFile).string();
  for (const auto& r : list.refused)
    STRATA_LOG(WARN) << "checkpoint: ignoring entry '" << r.file << "' of " << pointer << ": " << r.reason;
  const auto& entries = list.entries;
  std::vector<std::string> skipped;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    const Verification v = verify_entry(dir, *it, options);
    const std::string& path = v.path;
    if (v.ok) {
      if (!skipped.empty()) {
        STRATA_LOG(WARN) << "checkpoint: using " << path << " (step " << it->global_step
                         << ") instead of the newer invalid checkpoint(s)";
      }
      return LatestCheckpoint{path, it->global_step, std::move(skipped)};
    }
    const std::string reason = v.summary();
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
