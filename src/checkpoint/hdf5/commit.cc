// Atomic commit and the checkpoint.json pointer; list_checkpoints() and latest_checkpoint(); what
// interrupted saves leave behind and its removal.
//
// Durability argument (FORMAT.md "Commit protocol"): a reader only ever follows checkpoint.json,
// and checkpoint.json only ever names files that were fsync'ed and renamed into place before it
// was itself written, fsync'ed and renamed. rename(2) within one directory is atomic, so a crash
// at any point leaves either the old pointer (naming old, intact files) or the new one (naming a
// complete file). What a crash can leave besides, and nothing ever restores from:
//   - a crash while the file is written or read back: `ckpt-<step>.h5.tmp`;
//   - a crash between the file's rename and the pointer's: a complete `ckpt-<step>.h5` that
//     checkpoint.json does not name (uncommitted; `strata ckpt ls` lists it as such);
//   - a crash while the pointer is written: `checkpoint.json.tmp`.
// remove_orphaned_files() removes all three when the next job starts in the directory (PS 0,
// before its first save), under an exclusive lock that no live job's DirectoryClaim allows, so a
// file another job may still be writing or committing is never removed. A save that fails without
// a crash removes its own leftovers (writer.cc).
#include "checkpoint/hdf5/commit.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

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

namespace {

// The step of `name` when it is exactly what save() writes for it ("ckpt-<step>.h5", canonical
// decimal: no sign, no leading zero), else nothing. Only such names are ever listed or removed.
std::optional<std::int64_t> checkpoint_step_of(const std::string& name) {
  if (name.size() <= 8 || name.size() > 5 + 19 + 3 || name.compare(0, 5, "ckpt-") != 0 ||
      name.compare(name.size() - 3, 3, ".h5") != 0)
    return std::nullopt;
  const std::string digits = name.substr(5, name.size() - 8);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  std::int64_t step = 0;
  try {
    step = std::stoll(digits);
  } catch (const std::exception&) {
    return std::nullopt;  // beyond int64
  }
  if (detail::checkpoint_file_name(step) != name) return std::nullopt;
  return step;
}

// The uncommitted checkpoint files of `dir` (see list_uncommitted_files()); complete files only
// when `with_complete`, and only those whose name is not in `named`.
std::vector<UncommittedFile> scan_uncommitted(const std::string& dir, const std::set<std::string>& named,
                                              bool with_complete) {
  std::vector<UncommittedFile> out;
  std::error_code ec;
  for (const auto& item : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = item.path().filename().string();
    const bool tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    const std::string base = tmp ? name.substr(0, name.size() - 4) : name;
    if (!checkpoint_step_of(base)) continue;
    if (!tmp && (!with_complete || named.count(name) > 0)) continue;
    struct stat st {};
    if (::lstat(item.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    out.push_back({name, static_cast<std::uint64_t>(st.st_size), !tmp});
  }
  std::sort(out.begin(), out.end(), [](const UncommittedFile& a, const UncommittedFile& b) { return a.file < b.file; });
  return out;
}

std::set<std::string> named_files(const CheckpointList& list) {
  std::set<std::string> named;
  for (const auto& e : list.entries) named.insert(e.file);
  for (const auto& r : list.refused) named.insert(r.file);
  return named;
}

// flock(2), retried on EINTR. 0 or errno.
int flock_errno(int fd, int operation) {
  while (::flock(fd, operation) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

// Opens <dir>/checkpoint.lock for locking, creating it: a regular file, never through a link.
// Read-write, because NFS implements flock(2) with byte-range locks, and an exclusive one needs a
// file open for writing. -1 with `why` set when it cannot.
int open_lock_file(const std::string& dir, std::string& why) {
  const std::string path = (std::filesystem::path(dir) / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = errno == ELOOP ? path + " is a symbolic link" : "cannot open " + path + ": " + std::strerror(errno);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = path + " is not a regular file";
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::vector<UncommittedFile> list_uncommitted_files(const std::string& dir) {
  return scan_uncommitted(dir, named_files(read_checkpoint_list(dir)), /*with_complete=*/true);
}

OrphanCleanup remove_orphaned_files(const std::string& dir, const std::string& keep) {
  OrphanCleanup out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  const std::filesystem::path root(dir);
  const std::string lock_path = (root / kLockFile).string();

  // 1. The exclusive lock, without waiting: held, no other job is between its start and its exit
  // in this directory (each holds a DirectoryClaim), so nothing uncommitted here is being written
  // or committed. Closing the descriptor releases it.
  std::string no_lock;
  int fd = open_lock_file(dir, no_lock);
  if (fd >= 0) {
    if (const int err = flock_errno(fd, LOCK_EX | LOCK_NB); err != 0) {
      no_lock = err == EWOULDBLOCK ? "another job holds the directory (" + lock_path + ") and may be writing them"
                                   : "no lock on " + lock_path + " (" + std::strerror(err) +
                                         "), so another job could be writing them";
      ::close(fd);
      fd = -1;
    }
  } else {
    no_lock = "no lock: " + no_lock + ", so another job could be writing them";
  }
  struct Release {
    int fd;
    ~Release() {
      if (fd >= 0) ::close(fd);
    }
  } release{fd};

  // 2. What is uncommitted. A complete file counts only against a checkpoint.json that reads
  // cleanly; without one, a ckpt-<step>.h5 may be a file a user put there.
  std::set<std::string> named;
  std::int64_t newest_named = -1;  // the newest step checkpoint.json names (-1: none)
  std::string complete_kept;
  bool pointer_ok = false;
  try {
    struct stat st {};
    if (::lstat((root / detail::kPointerFile).c_str(), &st) != 0) {
      complete_kept = "there is no checkpoint.json";
    } else {
      const CheckpointList list = detail::read_pointer(dir);
      named = named_files(list);
      for (const auto& e : list.entries) newest_named = std::max(newest_named, e.global_step);
      pointer_ok = true;
    }
  } catch (const Error& e) {
    complete_kept = "checkpoint.json cannot be read (" + e.message() + ")";
  }
  std::vector<UncommittedFile> found = scan_uncommitted(dir, named, /*with_complete=*/true);
  const std::string pointer_tmp = std::string(detail::kPointerFile) + ".tmp";
  {
    struct stat st {};
    if (::lstat((root / pointer_tmp).c_str(), &st) == 0 && S_ISREG(st.st_mode))
      found.push_back({pointer_tmp, static_cast<std::uint64_t>(st.st_size), false});
  }
  // Dynamic tables (FORMAT.md 10.7): a dynamic-<step>.h5.tmp is a save in progress or killed; a
  // complete dynamic-<step>.h5 above the newest step checkpoint.json names holds the tables of a
  // save whose dense part never committed (the tables are written first). Older ones may be links
  // of a named step's chain, and stay.
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const bool tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    const std::string base = tmp ? name.substr(0, name.size() - 4) : name;
    if (base.size() < 12 || base.size() > 8 + 19 + 3 || base.compare(0, 8, "dynamic-") != 0 ||
        base.compare(base.size() - 3, 3, ".h5") != 0)
      continue;
    const std::string digits = base.substr(8, base.size() - 11);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        (digits.size() > 1 && digits[0] == '0'))
      continue;
    std::int64_t step = -1;
    try {
      step = std::stoll(digits);
    } catch (const std::exception&) {
      continue;  // beyond int64: no file a save writes
    }
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0) continue;
    if (tmp) found.push_back({name, static_cast<std::uint64_t>(st.st_size), false});
    else if (step > newest_named) found.push_back({name, static_cast<std::uint64_t>(st.st_size), true});
  }
  struct stat keep_st {};
  const bool have_keep = !keep.empty() && ::stat(keep.c_str(), &keep_st) == 0;

  // 3. Remove, or say why not.
  std::vector<std::string> reasons;
  auto keep_file = [&](const std::string& name, const std::string& why) {
    out.kept.push_back(name);
    if (std::find(reasons.begin(), reasons.end(), why) == reasons.end()) reasons.push_back(why);
  };
  for (const auto& f : found) {
    const std::string path = (root / f.file).string();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;  // gone meanwhile
    if (fd < 0) {
      keep_file(f.file, no_lock);
    } else if (f.complete && !pointer_ok) {
      keep_file(f.file, "complete files are kept when " + complete_kept);
    } else if (have_keep && st.st_dev == keep_st.st_dev && st.st_ino == keep_st.st_ino) {
      keep_file(f.file, f.file + " is the checkpoint this job restores from");
    } else if (!S_ISREG(st.st_mode)) {
      keep_file(f.file, f.file + " is " + detail::file_kind(st.st_mode) + ", not a regular file");
    } else if (::unlink(path.c_str()) == 0 || errno == ENOENT) {
      // unlink(2) never follows a link and never removes a directory, should the name have
      // changed since the lstat.
      out.removed.push_back(f.file);
    } else {
      keep_file(f.file, "cannot remove " + f.file + ": " + std::strerror(errno));
    }
  }
  std::sort(out.removed.begin(), out.removed.end());
  std::sort(out.kept.begin(), out.kept.end());
  for (std::size_t i = 0; i < reasons.size(); ++i) out.why_kept += (i ? "; " : "") + reasons[i];
  return out;
}

DirectoryClaim::DirectoryClaim(const std::string& dir, double timeout_s) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    why_not_ = "cannot create '" + dir + "': " + ec.message();
    return;
  }
  const int fd = open_lock_file(dir, why_not_);
  if (fd < 0) return;
  // Shared with every other job's claim; only a remove_orphaned_files() in progress (exclusive,
  // for as long as a few unlinks take) makes it wait.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const int err = flock_errno(fd, LOCK_SH | LOCK_NB);
    if (err == 0) {
      fd_ = fd;
      return;
    }
    if (err != EWOULDBLOCK) {
      why_not_ = "no lock on " + (std::filesystem::path(dir) / kLockFile).string() + ": " + std::strerror(err);
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      why_not_ = "another process held " + (std::filesystem::path(dir) / kLockFile).string() +
                 " exclusively for more than " + std::to_string(timeout_s) + " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::close(fd);
}

DirectoryClaim::~DirectoryClaim() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

DirectoryClaim::DirectoryClaim(DirectoryClaim&& other) noexcept : fd_(other.fd_), why_not_(std::move(other.why_not_)) {
  other.fd_ = -1;
}

DirectoryClaim& DirectoryClaim::operator=(DirectoryClaim&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    why_not_ = std::move(other.why_not_);
    other.fd_ = -1;
  }
  return *this;
}

}  // namespace strata::checkpoint
