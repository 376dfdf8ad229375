// The PS never trusts the words workers write into its arena (docs/SECURITY.md, issue 18):
// in a real job (1 PS + workers, over every compiled transport), worker 0 writes a malformed
// message straight into the PS region through the transport (a row count above the inbox's
// capacity, row indices outside the shard or negative, a doorbell or chunk counter run ahead, a
// save request run ahead) and rings the doorbell. The PS's service loop must throw out of serve() with an Error naming the
// writer (task and rank), the shard and the bad value, before applying anything: the variable
// keeps its values. The other end of the fail-stop path (the job ends with status 1 and that line)
// is tests/cli/ps_untrusted_inbox_test.sh. The same cases run in the inproc tier on 2 and 3
// thread ranks (tests/common/rank_test.h).
#define STRATA_INPROC_RANKS 2, 3
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/rank_test.h"
#include "ps/test_peer.h"
#include "strata/cluster/runtime.h"
#include "strata/comm/transport.h"
#include "strata/common/error.h"
#include "strata/ps/parameter_servers.h"

namespace strata::ps {
namespace {

using testing::TestComm;
using Peer = ParameterServersTestPeer;

// 1 PS (rank 0, ps:0) and the other ranks workers (rank r is worker:r-1).
std::unique_ptr<Runtime> start(TestComm& comm) {
  BootstrapOptions options;
  options.resolve.resolver = cluster::ResolverKind::kMpi;
  options.resolve.num_ps = 1;
  options.timeout_s = 30;
  return testing::bootstrap_runtime(comm, Env(), options);
}

VariableSpec var(const std::string& name, Shape shape, Partitioner part = Partitioner::none()) {
  VariableSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.init = Initializer::constant(0.5);
  s.partitioner = part;
  return s;
}

void put_i64s(PsEndpoint& ps, int rank, std::uint64_t offset, const std::vector<std::int64_t>& words) {
  Peer::put(ps, rank, offset, words.data(), words.size() * 8);
}

// A malformed inbox: the header (row count, then row indices) written raw, then the doorbell rung
// as a worker rings it once its message is in place.
void malformed_inbox(PsClient& ps, const std::string& shard, const std::vector<std::int64_t>& header) {
  const Peer::InboxWords words = Peer::inbox_words(ps, shard);
  put_i64s(ps, words.rank, words.header, header);
  Peer::fetch_add(ps, words.rank, words.doorbell, 1);
}

struct Outcome {
  std::string ps_error;     // the PS: what serve() threw ("" if it returned)
  bool values_kept = true;  // worker 0: the variable still holds its initial values
};

// Runs one job of `specs` under `optimizer`/`consistency`: worker 0 calls attack(ps) and every
// worker then calls done(); the PS serves. Afterwards worker 0 pulls `check` (unless empty) and
// compares it with the initializer's 0.5 everywhere.
Outcome run_case(TestComm& comm, const std::string& transport, const std::string& optimizer,
                 const std::vector<VariableSpec>& specs, const std::string& check,
                 const std::function<void(PsClient&)>& attack, const std::string& consistency = "async") {
  auto runtime = start(comm);
  PsOptions options;
  options.transport = transport;
  options.optimizer = OptimizerConfig::parse(optimizer);
  options.consistency = ConsistencyConfig::parse(consistency);
  options.timeout_s = 30;
  auto ps = ParameterServers::materialize(*runtime, options, specs);
  Outcome out;
  if (ps.is_ps()) {
    try {
      ps.server->serve();
    } catch (const Error& e) {
      out.ps_error = e.message();
    }
  } else {
    attack(*ps.client);
    ps.client->done();
  }
  // Keeps the PS's transport progressing while worker 0 reads the values back (over UCX on TCP a
  // get needs the target's help).
  ps.endpoint().barrier();
  if (ps.client && ps.client->worker_index() == 0 && !check.empty()) {
    const VariableSpec* spec = ps.endpoint().shard_map().find(check);
    std::vector<float> got(static_cast<std::size_t>(num_elements(spec->shape)));
    ps.client->pull(check, got.data(), got.size() * 4);
    for (float v : got) out.values_kept = out.values_kept && v == 0.5f;
  }
  ps.endpoint().barrier();
  return out;
}

#define SKIP_WITHOUT_WORKERS(comm) \
  if ((comm).size() < 2) GTEST_SKIP() << "needs a PS and a worker"

class PsUntrusted : public ::testing::TestWithParam<std::string> {};
STRATA_RANK_SUITE(Compiled, PsUntrusted, ::testing::ValuesIn(testing::tier_transports()),
                         [](const auto& info) { return info.param; });

// Asserted collectively: the PS reports exactly `want`; worker 0 still reads the initial values.
#define EXPECT_REFUSED(comm, outcome, want)                                                        \
  do {                                                                                             \
    const bool strata_is_ps_ = (comm).rank() == 0;                                                 \
    if (strata_is_ps_) {                                                                           \
      EXPECT_EQ((outcome).ps_error, (want));                                                       \
    }                                                                                              \
    STRATA_EXPECT_ALL((comm).get(), !strata_is_ps_ || (outcome).ps_error == (want));               \
    STRATA_EXPECT_ALL((comm).get(), (outcome).values_kept);                                        \
  } while (0)

STRATA_RANK_TEST_P(PsUntrusted, RowCountAboveTheInboxCapacity) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  const Outcome out = run_case(comm, GetParam(), "adam:lr=0.1", {var("dense/kernel", {784, 10})}, "dense/kernel",
                               [](PsClient& ps) {
                                 if (ps.worker_index() == 0) malformed_inbox(ps, "dense/kernel", {785});
                               });
  EXPECT_REFUSED(comm, out,
                 "worker:0 (rank 1) put a row count of 785 into its inbox for variable 'dense/kernel' shard 0, which "
                 "has 784 rows (-1 marks a dense gradient)");
}

STRATA_RANK_TEST_P(PsUntrusted, RowCountBelowMinusOne) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  const Outcome out = run_case(comm, GetParam(), "adagrad:lr=0.1", {var("dense/kernel", {784, 10})}, "dense/kernel",
                               [](PsClient& ps) {
                                 if (ps.worker_index() == 0) malformed_inbox(ps, "dense/kernel", {-7});
                               });
  EXPECT_REFUSED(comm, out,
                 "worker:0 (rank 1) put a row count of -7 into its inbox for variable 'dense/kernel' shard 0, which "
                 "has 784 rows (-1 marks a dense gradient)");
}

// The review's crash: one row at index 2^40.
STRATA_RANK_TEST_P(PsUntrusted, RowIndexFarOutsideTheShard) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  const Outcome out = run_case(comm, GetParam(), "adam:lr=0.1", {var("dense/kernel", {784, 10})}, "dense/kernel",
                               [](PsClient& ps) {
                                 if (ps.worker_index() == 0)
                                   malformed_inbox(ps, "dense/kernel", {1, std::int64_t{1} << 40});
                               });
  EXPECT_REFUSED(comm, out,
                 "worker:0 (rank 1) put row index 1099511627776 (entry 0 of 1) into its inbox for variable "
                 "'dense/kernel' shard 0, which has 784 rows");
}

STRATA_RANK_TEST_P(PsUntrusted, NegativeRowIndex) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  const Outcome out = run_case(comm, GetParam(), "momentum:lr=0.1,momentum=0.9", {var("dense/kernel", {784, 10})},
                               "dense/kernel", [](PsClient& ps) {
                                 if (ps.worker_index() == 0) malformed_inbox(ps, "dense/kernel", {3, 5, 783, -3});
                               });
  EXPECT_REFUSED(comm, out,
                 "worker:0 (rank 1) put row index -3 (entry 2 of 3) into its inbox for variable 'dense/kernel' shard "
                 "0, which has 784 rows");
}

// Row indices are shard-local: 5 is past the 5 rows of the second shard of a 10-row variable.
STRATA_RANK_TEST_P(PsUntrusted, RowIndexOfTheNextShard) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  const Outcome out = run_case(comm, GetParam(), "adam:lr=0.1", {var("emb", {10, 4}, Partitioner::fixed_shards(2))},
                               "emb", [](PsClient& ps) {
                                 if (ps.worker_index() == 0) malformed_inbox(ps, "emb/part_1", {2, 4, 5});
                               });
  EXPECT_REFUSED(comm, out,
                 "worker:0 (rank 1) put row index 5 (entry 1 of 2) into its inbox for variable 'emb' shard 1, which "
                 "has 5 rows");
}

// A well-formed message behind a doorbell run 3 ahead: one push in flight per shard, so refused.
STRATA_RANK_TEST_P(PsUntrusted, DoorbellRunAhead) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  const Outcome out = run_case(comm, GetParam(), "adam:lr=0.1", {var("dense/kernel", {784, 10})}, "dense/kernel",
                               [](PsClient& ps) {
                                 if (ps.worker_index() != 0) return;
                                 const Peer::InboxWords words = Peer::inbox_words(ps, "dense/kernel");
                                 put_i64s(ps, words.rank, words.header, {1, 7});
                                 Peer::fetch_add(ps, words.rank, words.doorbell, 3);
                               });
  EXPECT_REFUSED(comm, out,
                 "worker:0 (rank 1) rang its doorbell for variable 'dense/kernel' shard 0 to 3 after 0 of its pushes "
                 "were applied (one push in flight per shard: the doorbell must read 0 or 1)");
}

// A streamed shard (512 KiB: 2 chunks a push) whose chunk counter announces 3 chunks at once.
STRATA_RANK_TEST_P(PsUntrusted, ChunkCounterRunAhead) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  const Outcome out = run_case(comm, GetParam(), "adam:lr=0.1", {var("big", {1024, 128})}, "big",
                               [](PsClient& ps) {
                                 if (ps.worker_index() != 0) return;
                                 const Peer::InboxWords words = Peer::inbox_words(ps, "big");
                                 ASSERT_NE(words.chunks, 0u) << "'big' should be streamed";
                                 Peer::fetch_add(ps, words.rank, words.chunks, 3);
                               });
  EXPECT_REFUSED(comm, out,
                 "worker:0 (rank 1) announced 3 chunks of its streamed pushes to variable 'big' shard 0 after 0 were "
                 "applied (a push has 2 chunks and one is in flight per shard: the counter must read 0 to 2)");
}

// Sync rounds mean every worker's gradient: a dense one from worker 0 and a sparse one from
// worker 1 for the same round (the others dense too) cannot be combined, and the PS says so
// instead of dropping one.
STRATA_RANK_TEST_P(PsUntrusted, SyncRoundMixingDenseAndSparse) {
  TestComm comm;
  if (comm.size() < 3) GTEST_SKIP() << "needs 2 workers";
  const Outcome out = run_case(
      // No read-back: a sync pull waits for the round, which the PS refused.
      comm, GetParam(), "sgd:lr=0.1", {var("emb", {10, 4})}, "",
      [](PsClient& ps) {
        std::vector<float> g(40, 1.0f);
        if (ps.worker_index() == 1)
          ps.push_rows("emb", {3}, g.data(), 16);
        else
          ps.push("emb", g.data(), g.size() * 4);
      },
      "sync");
  std::string want = "worker:1 (rank 2) put a sparse gradient into its inbox for variable 'emb' shard 0 in sync round 1, "
                     "where worker:0 (rank 1) put a dense one";
  EXPECT_REFUSED(comm, out, want);
}

// The save protocol's request id on PS 0 is the chief's: it posts one request at a time. A jump
// to 5 with no save done is refused by name (checkpoints on, with a save hook that must not run).
STRATA_RANK_TEST_P(PsUntrusted, SaveRequestRunAhead) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  auto runtime = start(comm);
  PsOptions options;
  options.transport = GetParam();
  options.optimizer = OptimizerConfig::parse("adam:lr=0.1");
  options.checkpoint.enabled = true;
  bool saved = false;
  options.checkpoint.save = [&saved](const SaveContext&) {
    saved = true;
    return SaveStatus::kSaved;
  };
  auto ps = ParameterServers::materialize(*runtime, options, {var("dense/kernel", {784, 10})});
  std::string error;
  if (ps.is_ps()) {
    try {
      ps.server->serve();
    } catch (const Error& e) {
      error = e.message();
    }
  } else {
    if (ps.client->worker_index() == 0) {
      const Peer::ControlWords words = Peer::control_words(ps.endpoint());
      Peer::fetch_add(ps.endpoint(), words.ps_rank, words.save_request, 5);
    }
    ps.client->done();
  }
  ps.endpoint().barrier();
  const std::string want = "worker:0 (rank 1) posted checkpoint save request 5 on ps:0 after 0 saves (requests are "
                           "posted one at a time)";
  if (ps.is_ps()) {
    EXPECT_EQ(error, want);
  }
  STRATA_EXPECT_ALL(comm.get(), !ps.is_ps() || error == want);
  STRATA_EXPECT_ALL(comm.get(), !saved);
}

// Only a worker advances its own clock word: one moved under it is named at its next end_step.
STRATA_RANK_TEST_P(PsUntrusted, ClockWordMovedUnderItsWorker) {
  TestComm comm;
  SKIP_WITHOUT_WORKERS(comm);
  auto runtime = start(comm);
  PsOptions options;
  options.transport = GetParam();
  options.consistency = ConsistencyConfig::parse("staleness:2");
  auto ps = ParameterServers::materialize(*runtime, options, {var("dense/kernel", {784, 10})});
  std::string error;
  if (ps.is_ps()) {
    ps.server->serve();
  } else {
    if (ps.client->worker_index() == 0) {
      ps.client->end_step();
      const Peer::ControlWords words = Peer::control_words(ps.endpoint());
      Peer::fetch_add(ps.endpoint(), words.ps_rank, words.clock_of_worker0, 5);
      try {
        ps.client->end_step();
      } catch (const Error& e) {
        error = e.message();
      }
    }
    ps.client->done();
  }
  ps.endpoint().barrier();
  const std::string want = "the clock word of worker:0 (rank 1) on ps:0 read 6, but only this worker advances it and it "
                           "last set 1";
  const bool worker0 = ps.client && ps.client->worker_index() == 0;
  if (worker0) {
    EXPECT_EQ(error, want);
  }
  STRATA_EXPECT_ALL(comm.get(), !worker0 || error == want);
}


}  // namespace
}  // namespace strata::ps
