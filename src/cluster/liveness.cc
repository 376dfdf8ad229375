// Liveness monitor (see strata/cluster/liveness.h for the contract).
//
// Why point-to-point heartbeats on a communicator of their own, driven by a thread: the training
// loop can sit in a long computation or in a collective for minutes and is still healthy; what
// must be noticed is a process that no longer runs at all. A thread that wakes every 250 ms is
// cheap (it sleeps in a condition variable, never spins) and keeps beating whatever the loop does.
// MPI_THREAD_MULTIPLE (checked by the runtime) makes its MPI calls legal beside the loop's.
#include "strata/cluster/liveness.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "strata/cluster/runtime.h"
#include "strata/common/error.h"
#include "strata/common/parse.h"
#include "strata/common/rank_context.h"
#include "strata/common/watchdog.h"

namespace strata {
namespace liveness {
namespace {
std::atomic<std::int64_t> g_phase{static_cast<std::int64_t>(Phase::kBootstrap)};
std::atomic<std::int64_t> g_step{0};
}  // namespace

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::kBootstrap: return "bootstrap";
    case Phase::kRestore: return "restore";
    case Phase::kTrain: return "train";
    case Phase::kSave: return "checkpoint save";
    case Phase::kFinal: return "final barrier";
    case Phase::kServe: return "serve";
    case Phase::kEvaluate: return "evaluate";
    case Phase::kDone: return "done";
  }
  return "?";
}
namespace {
// "checkpoint save" -> "checkpoint-save": a file name.
std::string slug(const char* name) {
  std::string s(name);
  for (char& c : s)
    if (c == ' ') c = '-';
  return s;
}
}  // namespace

void set_phase(Phase phase) {
  g_phase.store(static_cast<std::int64_t>(phase), std::memory_order_relaxed);
  // Test hooks (tests/fault; documented in the env table). Phase changes are rare (a handful per
  // job), so reading the environment here costs nothing.
  //   STRATA_TEST_PHASE_DIR=DIR       this rank creates DIR/<world rank>.<phase> on entering a phase,
  //                                   so a test can inject a fault while the job is in it
  //   STRATA_TEST_HOLD_PHASE=P[@R]:SECS[,P[@R]:SECS...]  entering phase P (its file name, e.g.
  //                                   final-barrier), the rank (only world rank R, when given)
  //                                   sleeps SECS first, so a short phase lasts long enough to hit,
  //                                   or one rank is late in it; the first entry that matches holds
  if (phase == Phase::kDone) return;  // the monitor thread's last beat: never held
  const std::string name = slug(to_string(phase));
  const RankContext ctx = current_rank_context();
  if (const char* dir = std::getenv("STRATA_TEST_PHASE_DIR"); dir && *dir) {
    const std::string path = std::string(dir) + "/" + std::to_string(ctx.rank) + "." + name;
    if (std::FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
  }
  if (const char* hold = std::getenv("STRATA_TEST_HOLD_PHASE"); hold && *hold) {
    const std::string all(hold);
    for (std::size_t begin = 0; begin <= all.size();) {
      const std::size_t end = std::min(all.find(',', begin), all.size());
      const std::string spec = all.substr(begin, end - begin);
      begin = end + 1;
      const auto colon = spec.rfind(':');
      std::string target = colon == std::string::npos ? spec : spec.substr(0, colon);
      bool mine = true;
      if (const auto at = target.find('@'); at != std::string::npos) {
        mine = target.substr(at + 1) == std::to_string(ctx.rank);
        target.resize(at);
      }
      if (colon != std::string::npos && target == name && mine) {
        std::this_thread::sleep_for(std::chrono::duration<double>(clamp_seconds(std::atof(spec.c_str() + colon + 1))));
        break;
      }
    }
  }
}
void set_step(std::int64_t step) { g_step.store(step, std::memory_order_relaxed); }

}  // namespace liveness

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTagBeat = 1;  // rank r -> rank 0
constexpr int kTagBack = 2;  // rank 0 -> rank r
constexpr int kTagHello = 3;  // rank r -> rank 0 (and rank 0 -> rank 1): the sender's host name, once
// Witness beats: every rank r >= 1 hears one rank besides rank 0 (its witness: rank 2 for rank 1,
// rank r - 1 for r >= 2), so it can tell rank 0's silence from its own isolation.
constexpr int kTagWitness = 4;
// The witness of `rank` in a communicator of `size` ranks; -1 when it has none (rank 0, or size < 3).
int witness_of(int rank, int size) {
  if (rank < 1 || size < 3) return -1;
  return rank == 1 ? 2 : rank - 1;
}
constexpr int kHostBytes = 64;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Seen {
  Clock::time_point last;        // last heartbeat
  std::int64_t step = 0;
  std::int64_t phase = 0;
  Clock::time_point step_moved;  // when `step` or `phase` last changed
};

}  // namespace

struct LivenessMonitor::Impl {
  LivenessOptions options;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  // "worker:1 on cn3" per rank once the runtime's table is known (name_ranks), "on cn3" from the
  // host-name hellos before that. Written by the caller's thread, read by the monitor's: names_mu.
  std::mutex names_mu;
  std::vector<std::string> names;
  bool named_by_runtime = false;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;

  // In-flight requests and their buffers (owned by the thread).
  std::vector<MPI_Request> recv_req, send_req;
  std::vector<std::array<std::int64_t, 2>> recv_buf, send_buf;
  std::vector<Seen> seen;
  // The host-name hellos: this rank's (sent once), and those this rank watches (received once).
  std::array<char, kHostBytes> my_host{};
  std::vector<MPI_Request> hello_send, hello_recv;
  std::vector<std::array<char, kHostBytes>> hello_buf;

  std::string name_of(int r) {
    std::lock_guard<std::mutex> lock(names_mu);
    return names[r];
  }

  // Which ranks this rank watches (names when they fall silent): rank 0 all others, rank 1 rank 0.
  // Ranks >= 2 name nobody but themselves: they hear rank 0 and their witness only to detect their
  // own isolation, so a cut-off rank's line names its own node instead of a transport timeout
  // blaming the PS.
  bool watches(int r) const { return r != rank && (rank == 0 || (rank == 1 && r == 0)); }

  void start_hellos() {
    hello_send.assign(size, MPI_REQUEST_NULL);
    hello_recv.assign(size, MPI_REQUEST_NULL);
    hello_buf.assign(size, {});
    const RankContext ctx = current_rank_context();
    const std::string host = ctx.host.empty() ? short_hostname() : ctx.host;
    std::memcpy(my_host.data(), host.data(), std::min<std::size_t>(host.size(), kHostBytes - 1));
    {
      std::lock_guard<std::mutex> lock(names_mu);  // a verdict on this rank itself names its host too
      if (!named_by_runtime) names[rank] = "on " + host;
    }
    for (int r = 0; r < size; ++r) {
      if (watches(r)) MPI_Irecv(hello_buf[r].data(), kHostBytes, MPI_CHAR, r, kTagHello, comm, &hello_recv[r]);
      // Everyone tells rank 0; rank 0 tells rank 1, its watcher.
      if (r != rank && (r == 0 || (rank == 0 && r == 1)))
        MPI_Isend(my_host.data(), kHostBytes, MPI_CHAR, r, kTagHello, comm, &hello_send[r]);
    }
  }

  void take_hellos() {
    for (int r = 0; r < size; ++r) {
      if (hello_recv[r] == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Test(&hello_recv[r], &done, MPI_STATUS_IGNORE);
      if (!done) continue;
      hello_buf[r][kHostBytes - 1] = '\0';
      std::lock_guard<std::mutex> lock(names_mu);
      if (!named_by_runtime) names[r] = std::string("on ") + hello_buf[r].data();
    }
  }

  void post_recv(int from, int tag) {
    MPI_Irecv(recv_buf[from].data(), 2, MPI_INT64_T, from, tag, comm, &recv_req[from]);
  }

  void beat(int to, int tag) {
    if (send_req[to] != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&send_req[to], &done, MPI_STATUS_IGNORE);
      if (!done) return;  // the peer has not taken the last one yet: do not pile up
    }
    send_buf[to] = {liveness::g_step.load(std::memory_order_relaxed),
                    liveness::g_phase.load(std::memory_order_relaxed)};
    MPI_Isend(send_buf[to].data(), 2, MPI_INT64_T, to, tag, comm, &send_req[to]);
  }

  // Beats to the ranks this rank is the witness of (rank 2 serves rank 1; rank r serves r + 1).
  void witness_beats() {
    for (const int to : {rank - 1, rank + 1})
      if (to >= 1 && to < size && witness_of(to, size) == rank) beat(to, kTagWitness);
  }

  void take(int from, int tag, Clock::time_point now) {
    if (recv_req[from] == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Test(&recv_req[from], &done, MPI_STATUS_IGNORE);
    while (done) {
      Seen& s = seen[from];
      s.last = now;
      // A new phase restarts the progress clock as a new step does: a worker's stall is counted
      // from when it entered training (or made its last step), never from the start of the job,
      // so a long start-up (a large input counted, a restore) is not taken for a frozen step.
      if (recv_buf[from][0] != s.step || recv_buf[from][1] != s.phase) s.step_moved = now;
      s.step = recv_buf[from][0];
      s.phase = recv_buf[from][1];
      post_recv(from, tag);
      MPI_Test(&recv_req[from], &done, MPI_STATUS_IGNORE);
    }
  }

  [[noreturn]] void verdict(int r, const std::string& what) {
    // A verdict on this rank itself (it lost every peer it watches) reports its own step and phase.
    const std::int64_t step = r == rank ? liveness::g_step.load(std::memory_order_relaxed) : seen[r].step;
    const std::int64_t phase = r == rank ? liveness::g_phase.load(std::memory_order_relaxed) : seen[r].phase;
    std::fprintf(stderr, "strata: liveness: rank %d (%s) %s; last step %lld, phase %s\n", r, name_of(r).c_str(),
                 what.c_str(), static_cast<long long>(step), liveness::to_string(static_cast<liveness::Phase>(phase)));
    std::fflush(stderr);
    // MPI_Abort asks the launcher to end every rank; should that request itself stall (a launcher
    // that is not scheduled, a daemon on the stopped rank's node that does not answer), this rank
    // still ends, and the launcher ends the job on its unexpected exit.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::fprintf(stderr, "strata: liveness: MPI_Abort did not end this rank within 10 s; exiting\n");
      std::fflush(stderr);
      std::_Exit(1);
    }).detach();
    MPI_Abort(comm, 1);
    std::abort();
  }

  void check(Clock::time_point now) {
    auto done = [&](int r) { return seen[r].phase == static_cast<std::int64_t>(liveness::Phase::kDone); };
    // Rank 0 watches everyone; rank 1 watches rank 0.
    // Every watched rank silent at once, when there are two or more, is this rank's own isolation
    // far more often than all the others stopping together (a node cut off from the network; its
    // line, delivered when the link comes back, must not blame a healthy peer). The verdict then
    // names this rank, so a launcher leaves its node out.
    // "At once" means their last beats came within at_once_s of each other: a rank that stops
    // and leaves the others blocked behind it falls silent first, and is the one named.
    const double at_once_s = std::max(2.0, 8 * options.interval_s);
    int watched = 0, silent = 0;
    double least = 0, most = 0;
    for (int r = 0; r < size; ++r) {
      if (!watches(r) || done(r)) continue;
      const double quiet = seconds(now - seen[r].last);
      least = watched == 0 ? quiet : std::min(least, quiet);
      most = watched == 0 ? quiet : std::max(most, quiet);
      ++watched;
      if (quiet > options.stop_timeout_s) ++silent;
    }
    if (watched >= 2 && silent == watched && most - least <= at_once_s) {
      std::ostringstream os;
      os.precision(3);
      os << "lost every one of the " << watched << " ranks it watches at once (none beat for " << least
         << " s, --stall-timeout " << options.stop_timeout_s
         << " s): this rank's node is cut off from the others, or every other rank stopped";
      verdict(rank, os.str());
    }
    // Every other rank watches rank 0 alone; its witness's beats tell rank 0's silence from its
    // own isolation: rank 0 and the witness silent at once is this rank's isolation, as above.
    const int w = witness_of(rank, size);
    if (w >= 0 && !done(0) && !done(w) && seconds(now - seen[0].last) > options.stop_timeout_s &&
        seconds(now - seen[w].last) > options.stop_timeout_s &&
        std::abs(seconds(seen[0].last - seen[w].last)) <= at_once_s) {
      std::ostringstream os;
      os.precision(3);
      os << "lost rank 0 (" << name_of(0) << ") and rank " << w << " at once (neither beat for "
         << std::min(seconds(now - seen[0].last), seconds(now - seen[w].last)) << " s, --stall-timeout "
         << options.stop_timeout_s << " s): this rank's node is cut off from the others, or both stopped";
      verdict(rank, os.str());
    }
    for (int r = 0; r < size; ++r) {
      if (!watches(r) || done(r)) continue;
      const double silent = seconds(now - seen[r].last);
      if (silent > options.stop_timeout_s) {
        // The others this rank hears from gone quiet too, just not yet past the timeout: an
        // isolation in the making (their last beats came a moment later). Decide in a later
        // round, once they either beat again (then `r` is named) or pass the timeout too (then
        // the checks above name this rank); at most at_once_s later.
        bool others_quiet = false, any_other = false;
        for (int q = 0; q < size; ++q) {
          const bool hears = q != r && q != rank && !done(q) && (watches(q) || q == w);
          if (!hears) continue;
          if (!any_other) others_quiet = true;
          any_other = true;
          others_quiet = others_quiet && seconds(now - seen[q].last) > options.stop_timeout_s - at_once_s;
        }
        if (others_quiet && silent <= options.stop_timeout_s + at_once_s) continue;
        std::ostringstream os;
        os.precision(3);
        os << "stopped: no heartbeat for " << silent << " s (--stall-timeout " << options.stop_timeout_s << " s)";
        verdict(r, os.str());
      }
    }
    if (rank != 0 || options.stall_timeout_s <= 0) return;
    const auto train = static_cast<std::int64_t>(liveness::Phase::kTrain);
    for (int r = 0; r < size; ++r) {
      if (seen[r].phase != train) continue;
      const double frozen = seconds(now - seen[r].step_moved);
      if (frozen <= options.stall_timeout_s) continue;
      // Only a stall while others move: in lockstep (sync) everybody waits for everybody.
      for (int q = 0; q < size; ++q) {
        if (q == r || seen[q].phase != train) continue;
        if (seen[q].step_moved > seen[r].step_moved + std::chrono::seconds(1)) {
          std::ostringstream os;
          os.precision(3);
          os << "makes no progress: its step has not moved for " << frozen << " s while rank " << q << " ("
             << name_of(q) << ") reached step " << seen[q].step << " (STRATA_PROGRESS_TIMEOUT_S "
             << options.stall_timeout_s << " s)";
          verdict(r, os.str());
        }
      }
    }
  }

  void run() {
    const auto start = Clock::now();
    for (auto& s : seen) s.last = s.step_moved = start;
    if (rank == 0) {
      for (int r = 1; r < size; ++r) post_recv(r, kTagBeat);
    } else {
      post_recv(0, kTagBack);
    }
    if (const int w = witness_of(rank, size); w >= 0) post_recv(w, kTagWitness);
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      lock.unlock();
      const auto now = Clock::now();
      take_hellos();
      if (rank == 0) {
        for (int r = 1; r < size; ++r) take(r, kTagBeat, now);
        for (int r = 1; r < size; ++r) beat(r, kTagBack);
      } else {
        take(0, kTagBack, now);
        beat(0, kTagBeat);
      }
      if (const int w = witness_of(rank, size); w >= 0) take(w, kTagWitness, now);
      witness_beats();
      check(now);
      lock.lock();
      cv.wait_for(lock, std::chrono::duration<double>(options.interval_s), [this] { return stop; });
    }
    lock.unlock();
    // A last beat that says "done", so no watcher mistakes the end of this rank for a stop.
    liveness::set_phase(liveness::Phase::kDone);
    if (rank == 0) {
      for (int r = 1; r < size; ++r) beat(r, kTagBack);
    } else {
      beat(0, kTagBeat);
    }
    witness_beats();
    for (auto* reqs : {&recv_req, &hello_recv})
      for (auto& req : *reqs)
        if (req != MPI_REQUEST_NULL) {
          MPI_Cancel(&req);
          MPI_Wait(&req, MPI_STATUS_IGNORE);
        }
    // Small messages are sent eagerly: these complete without the peer; bounded anyway.
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    std::vector<MPI_Request> sends = send_req;
    sends.insert(sends.end(), hello_send.begin(), hello_send.end());
    for (auto& req : sends) {
      int done = req == MPI_REQUEST_NULL;
      while (!done && Clock::now() < deadline) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!done) {
        MPI_Cancel(&req);
        MPI_Request_free(&req);
      }
    }
  }
};

LivenessMonitor::LivenessMonitor(const Runtime& runtime, const LivenessOptions& options)
    : LivenessMonitor(runtime.comms().runtime(), options) {
  name_ranks(runtime);
}

LivenessMonitor::LivenessMonitor(MPI_Comm comm, const LivenessOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  {
    const double limit = options.setup_timeout_s;
    Watchdog watchdog(std::chrono::duration<double>(limit), [limit, comm] {
      std::fprintf(stderr, "strata: liveness: MPI_Comm_dup for the monitor did not complete within %g s "
                   "(--timeout / STRATA_TIMEOUT_S): a rank did not start; aborting the job\n", limit);
      std::fflush(stderr);
      MPI_Abort(comm, 1);
    });
    STRATA_CHECK_MPI(MPI_Comm_dup(comm, &m.comm));
  }
  MPI_Comm_set_errhandler(m.comm, MPI_ERRORS_RETURN);
  STRATA_CHECK_MPI(MPI_Comm_rank(m.comm, &m.rank));
  STRATA_CHECK_MPI(MPI_Comm_size(m.comm, &m.size));
  m.names.assign(m.size, "host not yet known");
  m.recv_req.assign(m.size, MPI_REQUEST_NULL);
  m.send_req.assign(m.size, MPI_REQUEST_NULL);
  m.recv_buf.assign(m.size, {0, 0});
  m.send_buf.assign(m.size, {0, 0});
  m.seen.resize(m.size);
  m.start_hellos();
  if (m.size > 1) m.thread = std::thread([&m] { m.run(); });
}

void LivenessMonitor::name_ranks(const Runtime& runtime) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.names_mu);
  const auto& ranks = runtime.ranks();
  for (std::size_t r = 0; r < ranks.size() && r < m.names.size(); ++r)
    m.names[r] = ranks[r].task.str() + " on " + ranks[r].host;
  m.named_by_runtime = true;
}

LivenessMonitor::~LivenessMonitor() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  // MPI_Comm_free is collective: skip it while an error unwinds (the job is about to be aborted,
  // and the peers may never get here).
  if (!finalized && impl_->comm != MPI_COMM_NULL && std::uncaught_exceptions() == 0) MPI_Comm_free(&impl_->comm);
}

}  // namespace strata
