// `strata bench --op checkpoint`: save and restore throughput of the checkpoint layer against this
// disk's sequential write bandwidth, measured in the same run.
//
// Every rank of the job plays a parameter server: a model of `size` bytes (f32 values, no optimizer
// slots) made of four variables [rows, 1024] whose rows are split across the ranks the way PS shards
// are. For each size of the -b/-e/-f sweep:
//   dd       rank 0 runs `dd if=/dev/zero of=DIR/dd.bench bs=1M count=<size in MiB> conv=fsync`
//            (the reference a user would measure; the file is removed afterwards) once before each
//            timed save, so dd and the saves see the same state of a disk whose speed drifts (a VM
//            disk behind the host's cache drifts widely between runs: docs/PERFORMANCE.md,
//            "Checkpoints"); dd_MB/s is the total bytes over dd's total seconds, as save_MB/s is
//            for the saves;
//   save     -w warm-up and -n timed saves through checkpoint::save, the collective parallel-HDF5
//            writer training uses (.tmp, fsync, rename, checkpoint.json, directory fsync, and with
//            max_to_keep 1 the unlink of the previous save's file): the time from a barrier to the
//            commit, the slowest rank's;
//   restore  what `--restore` does: the file's pages are dropped from the page cache
//            (posix_fadvise DONTNEED after the fsync), rank 0 verifies every checksum (reading the
//            whole file, as latest_checkpoint does before a restore), then every rank reads its own
//            rows; every restored element is compared with the pattern (#wrong).
// Sizes count the values written (MB = 1e6 bytes in the rates, like dd). Files are removed unless
// --keep. Exit 1 when any element is wrong or a checksum fails, 2 for bad input.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/bench_checkpoint.h"
#include "cli/bench_json.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/cluster/runtime.h"
#include "strata/common/error.h"

namespace strata::cli {

std::uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

namespace {

namespace ck = checkpoint;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kVariables = 4;
constexpr std::int64_t kRowElems = 1024;  // 4 KiB rows
constexpr std::uint64_t kRowBytes = kRowElems * sizeof(float);

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Element i of variable v: exact in float, distinct per variable.
float pattern(int v, std::uint64_t i) { return static_cast<float>(i % 8191) * 0.25f + static_cast<float>(v); }


struct DdRun {
  double bytes = 0, secs = 0;  // as dd reports them
};

// Runs dd on this rank (not collective), returns the bytes and seconds dd printed; throws Error
// with dd's output when it fails or prints something unexpected.
DdRun dd_write(const std::string& dir, std::uint64_t bytes) {
  const std::string file = dir + "/dd.bench";
  const std::uint64_t mib = std::max<std::uint64_t>(1, bytes >> 20);
  const std::string cmd = "dd if=/dev/zero of='" + file + "' bs=1M count=" + std::to_string(mib) + " conv=fsync 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    const int rc = pclose(p);
    std::error_code ec;
    fs::remove(file, ec);
    if (rc != 0) throw Error("dd failed: " + out);
  } else {
    throw Error("cannot run dd");
  }
  // "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 2.04 s, 526 MB/s"
  const auto copied = out.find(" bytes");
  const auto comma = out.find("copied, ");
  if (copied == std::string::npos || comma == std::string::npos) throw Error("unexpected dd output: " + out);
  std::size_t line_start = out.rfind('\n', copied);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  const double written = std::stod(out.substr(line_start, copied - line_start));
  const double secs = std::stod(out.substr(comma + 8));
  if (!(written > 0 && secs > 0)) throw Error("unexpected dd output: " + out);
  return {written, secs};
}

// This rank's rows of every variable.
struct LocalModel {
  ck::SaveRequest request;
  std::vector<std::vector<float>> values;  // per variable, this rank's rows
  std::vector<std::int64_t> begin, end;    // per variable
};

LocalModel build_model(std::uint64_t bytes, int rank, int size) {
  LocalModel m;
  const std::int64_t rows_total = std::max<std::int64_t>(kVariables, static_cast<std::int64_t>(bytes / kRowBytes));
  for (int v = 0; v < kVariables; ++v) {
    const std::int64_t rows = rows_total / kVariables + (v < rows_total % kVariables ? 1 : 0);
    ck::VariableMeta meta;
    meta.name = "layer_" + std::to_string(v) + "/kernel";
    meta.shape = {rows, kRowElems};
    m.request.variables.push_back(meta);
    const std::int64_t b = rows * rank / size, e = rows * (rank + 1) / size;
    m.begin.push_back(b);
    m.end.push_back(e);
    std::vector<float> vals(static_cast<std::size_t>((e - b) * kRowElems));
    const std::uint64_t first = static_cast<std::uint64_t>(b * kRowElems);
    for (std::size_t i = 0; i < vals.size(); ++i) vals[i] = pattern(v, first + i);
    m.values.push_back(std::move(vals));
  }
  for (int v = 0; v < kVariables; ++v) {
    if (m.begin[v] == m.end[v]) continue;
    ck::ShardData shard;
    shard.variable = m.request.variables[v].name;
    shard.row_begin = m.begin[v];
    shard.row_end = m.end[v];
    shard.values = m.values[v].data();
    m.request.shards.push_back(shard);
  }
  return m;
}

// Drops the file's cached pages (clean after the writer's fsync), so the restore reads the disk
// where the kernel honours the hint.
void drop_from_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct Result {
  std::uint64_t bytes = 0;
  double save_s = 0, dd_mbps = 0, restore_s = 0, verify_s = 0;
  std::vector<double> save_s_each, dd_mbps_each;  // per timed iteration (JSON only): the drift
  std::int64_t wrong = 0;
  int bad_checksums = 0;
};

// Collective: one verdict for all ranks (true on every rank when any rank's flag is true).
bool any(MPI_Comm comm, bool mine) {
  int in = mine ? 1 : 0, out = 0;
  STRATA_CHECK_MPI(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm));
  return out != 0;
}

// Collective over `comm`, for the restore phase: every rank's value, gathered the way training
// exchanges its restore verdict (allgather_strings: nonblocking MPI with short sleeps). A blocking
// MPI_Bcast/Allreduce would busy-poll on the waiting ranks and, with all ranks on one 2-core host,
// take a core from rank 0's verification (reader + CRC thread), which training does not do.
std::vector<double> gather_quietly(MPI_Comm comm, double mine, const std::string& what) {
  std::vector<double> out;
  std::ostringstream os;
  os << std::setprecision(17) << mine;
  for (const auto& s : allgather_strings(comm, os.str(), 600.0, what)) out.push_back(std::stod(s));
  return out;
}

double max_over_ranks(MPI_Comm comm, double mine) {
  double out = 0;
  STRATA_CHECK_MPI(MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, comm));
  return out;
}

}  // namespace

int run_checkpoint_bench(const CheckpointBenchConfig& cfg, int* argc, char*** argv) {
  MpiSession mpi(argc, argv);
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &size));

  // The memory check, then the directory (rank 0 decides, everyone agrees), before any work. A
  // directory the bench created is removed again when the input turns out to be bad.
  std::string dir = cfg.dir, problem;
  bool created = false;
  if (rank == 0) {
    // Model values on the ranks plus the restore buffers: twice the largest size, with room left
    // for the page cache the writes go through. (All ranks on this host: the usual bench setup.)
    const std::uint64_t avail = mem_available_bytes();
    if (avail > 0 && 2 * cfg.max_bytes > avail * 8 / 10)
      problem = "-e " + std::to_string(cfg.max_bytes >> 20) + " MiB needs about " +
                std::to_string((2 * cfg.max_bytes) >> 20) + " MiB of memory (values and restore buffers); " +
                std::to_string(avail >> 20) + " MiB are available";
    std::error_code ec;
    if (problem.empty() && dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/strata-bench-ckpt-XXXXXX";
      std::vector<char> buf(templ.begin(), templ.end());
      buf.push_back('\0');
      if (mkdtemp(buf.data()) == nullptr)
        problem = "cannot create a directory under " + templ.substr(0, templ.rfind('/'));
      else
        dir = buf.data();
      created = problem.empty();
    } else if (problem.empty()) {
      created = !fs::exists(dir, ec);
      fs::create_directories(dir, ec);
      if (ec || !fs::is_directory(dir)) problem = "--dir " + dir + ": cannot create the directory";
    }
    // A real write, not access(2): root passes access() on read-only mounts and 0555 directories.
    if (problem.empty()) {
      const std::string probe = dir + "/.strata-bench-probe";
      const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0 || ::write(fd, "x", 1) != 1) problem = "--dir " + dir + ": not writable";
      if (fd >= 0) ::close(fd);
      ::unlink(probe.c_str());
    }
    if (!problem.empty() && created) fs::remove_all(dir, ec);
  }
  int len = static_cast<int>(problem.size());
  STRATA_CHECK_MPI(MPI_Bcast(&len, 1, MPI_INT, 0, comm));
  if (len > 0) {
    if (rank == 0) std::fprintf(stderr, "strata bench: error: %s\n", problem.c_str());
    return kExitUsage;
  }
  char path[4096] = {0};
  if (rank == 0) std::snprintf(path, sizeof path, "%s", dir.c_str());
  STRATA_CHECK_MPI(MPI_Bcast(path, sizeof path, MPI_CHAR, 0, comm));
  dir = path;

  std::vector<Result> results;
  std::int64_t step = 0;
  for (std::uint64_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= cfg.factor) {
    Result r;
    {
      LocalModel model = build_model(bytes, rank, size);
      r.bytes = 0;
      for (const auto& v : model.request.variables) r.bytes += static_cast<std::uint64_t>(v.shape[0]) * kRowBytes;

      ck::Attributes attributes;
      attributes.optimizer = "none";
      ck::SaveOptions options;
      options.max_to_keep = 1;  // the bench's files never accumulate
      std::string file;
      double total = 0;
      DdRun dd_total;
      for (int i = 0; i < cfg.warmup + cfg.iters; ++i) {
        if (i >= cfg.warmup) {
          // dd on rank 0 right before this timed save; the other ranks wait in any().
          std::string dd_error;
          if (rank == 0) {
            try {
              const DdRun d = dd_write(dir, r.bytes);
              dd_total.bytes += d.bytes;
              dd_total.secs += d.secs;
              r.dd_mbps_each.push_back(d.bytes / d.secs / 1e6);
            } catch (const Error& e) {
              dd_error = e.message();
            }
          }
          if (any(comm, !dd_error.empty())) {
            if (rank == 0) std::fprintf(stderr, "strata bench: %s\n", dd_error.c_str());
            return kExitFailure;
          }
        }
        STRATA_CHECK_MPI(MPI_Barrier(comm));
        auto start = Clock::now();
        file = ck::save(comm, dir, ++step, model.request, attributes, options);
        const double t = max_over_ranks(comm, seconds_since(start));
        if (i >= cfg.warmup) {
          total += t;
          r.save_s_each.push_back(t);
        }
      }
      r.save_s = total / cfg.iters;
      if (rank == 0) r.dd_mbps = dd_total.bytes / dd_total.secs / 1e6;

      // Restore, as training does it: verify (rank 0 reads the whole file), then every rank reads
      // its rows straight into its buffers. The buffers are allocated (and zero-filled, so their
      // pages exist) before the clock starts, as the PS arena exists before a lazy restore reads
      // into it.
      std::vector<std::vector<float>> restored(kVariables);
      for (int v = 0; v < kVariables; ++v) restored[v].resize(model.values[v].size());
      drop_from_page_cache(file);
      STRATA_CHECK_MPI(MPI_Barrier(comm));
      auto start = Clock::now();
      int bad = 0;
      if (rank == 0) {
        auto verify_start = Clock::now();
        bad = static_cast<int>(ck::CheckpointReader(file).verify().size());
        r.verify_s = seconds_since(verify_start);
      }
      bad = static_cast<int>(gather_quietly(comm, bad, "checkpoint bench verification")[0]);
      {
        ck::CheckpointReader reader(file);
        for (int v = 0; v < kVariables; ++v) {
          if (model.end[v] > model.begin[v])
            reader.read_rows(model.request.variables[v].name, model.begin[v], model.end[v], restored[v].data());
        }
      }
      {
        const auto times = gather_quietly(comm, seconds_since(start), "checkpoint bench restore times");
        r.restore_s = *std::max_element(times.begin(), times.end());
      }
      r.bad_checksums = bad;
      std::int64_t wrong = 0;
      for (int v = 0; v < kVariables; ++v) {
        const std::uint64_t first = static_cast<std::uint64_t>(model.begin[v] * kRowElems);
        for (std::size_t i = 0; i < restored[v].size(); ++i) wrong += restored[v][i] != pattern(v, first + i);
      }
      STRATA_CHECK_MPI(MPI_Allreduce(&wrong, &r.wrong, 1, MPI_INT64_T, MPI_SUM, comm));
      if (rank == 0 && !cfg.keep) {
        std::error_code ec;
        fs::remove(file, ec);
        fs::remove(fs::path(dir) / "checkpoint.json", ec);
      }
    }
    results.push_back(r);
    if (cfg.factor == 1) break;
  }

  int status = kExitOk;
  if (rank == 0) {
    std::ostringstream os;
    os << "# strata bench: op checkpoint, " << size << " rank(s) writing collectively, warmup " << cfg.warmup
       << ", iters " << cfg.iters << ", dir " << dir << "\n";
    os << "# save: checkpoint::save to the commit (slowest rank); dd: dd bs=1M conv=fsync of the same size before each timed save; "
          "ratio: save / dd; restore: verify on rank 0 + every rank reads its rows, page cache dropped first; "
          "MB = 1e6 bytes\n";
    os << std::setw(12) << "size" << std::setw(7) << "ranks" << std::setw(10) << "save_s" << std::setw(10) << "save_MB/s"
       << std::setw(10) << "dd_MB/s" << std::setw(8) << "ratio" << std::setw(11) << "restore_s" << std::setw(11)
       << "rest_MB/s" << std::setw(10) << "verify_s" << std::setw(8) << "#wrong\n";
    nlohmann::json rows = nlohmann::json::array();
    std::int64_t total_wrong = 0;
    int total_bad = 0;
    for (const auto& r : results) {
      const double save_mbps = static_cast<double>(r.bytes) / r.save_s / 1e6;
      const double restore_mbps = static_cast<double>(r.bytes) / r.restore_s / 1e6;
      const double ratio = r.dd_mbps > 0 ? save_mbps / r.dd_mbps : 0;
      os << std::setw(12) << r.bytes << std::setw(7) << size << std::fixed << std::setprecision(3) << std::setw(10)
         << r.save_s << std::setprecision(1) << std::setw(10) << save_mbps << std::setw(10) << r.dd_mbps
         << std::setprecision(2) << std::setw(8) << ratio << std::setprecision(3) << std::setw(11) << r.restore_s
         << std::setprecision(1) << std::setw(11) << restore_mbps << std::setprecision(3) << std::setw(10)
         << r.verify_s << std::setw(7) << r.wrong << "\n";
      total_wrong += r.wrong;
      total_bad += r.bad_checksums;
      rows.push_back({{"op", "checkpoint"},
                      {"bytes", r.bytes},
                      {"ranks", size},
                      {"save_s", r.save_s},
                      {"save_MBps", save_mbps},
                      {"dd_MBps", r.dd_mbps},
                      {"ratio", ratio},
                      {"restore_s", r.restore_s},
                      {"restore_MBps", restore_mbps},
                      {"verify_s", r.verify_s},
                      {"bad_checksums", r.bad_checksums},
                      {"wrong", r.wrong},
                      {"save_s_each", r.save_s_each},
                      {"dd_MBps_each", r.dd_mbps_each}});
    }
    if (total_bad > 0) os << "# " << total_bad << " dataset checksum(s) failed verification\n";
    os << "# " << (total_wrong == 0 ? "all results correct" : std::to_string(total_wrong) + " wrong element(s)") << "\n";
    std::cout << os.str() << std::flush;
    if (total_wrong != 0 || total_bad != 0) status = kExitFailure;
    if (!write_bench_rows(cfg.json_path, rows)) status = kExitFailure;
    if (created && !cfg.keep) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  }
  STRATA_CHECK_MPI(MPI_Bcast(&status, 1, MPI_INT, 0, comm));
  return status;
}

}  // namespace strata::cli
