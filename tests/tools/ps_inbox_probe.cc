// strata_test_ps_inbox_probe: a job of 1 PS (rank 0) and workers in which worker 0 writes one
// malformed message straight into the PS region through the transport, for the end-to-end test
// of the PS's checks (tests/cli/ps_untrusted_inbox_test.sh). The program ends as the strata binary
// does on a runtime failure (src/cli/main.cc): the exception's message on one line of stderr as
// "strata: <rank context> <message>", then abort_job(1), so the job ends with status 1, whatever
// rank failed.
//
//   ps_inbox_probe CASE [TRANSPORT]
//     CASE: row-count (785 rows into a 784-row inbox), row-index (row 2^40), negative-row (row -3),
//           doorbell (rung 3 ahead), chunks (a streamed push's counter 3 chunks ahead), none (no
//           malformed message: the job must end with status 0)
//     TRANSPORT: as --transport (default auto)
// The variables: 'dense/kernel' f32 [784,10] and 'big' f32 [1024,128] (streamed), Adam.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "ps/test_peer.h"
#include "strata/cluster/runtime.h"
#include "strata/common/error.h"
#include "strata/ps/parameter_servers.h"

namespace {

using strata::ps::ParameterServers;
using strata::ps::PsClient;
using strata::ps::PsEndpoint;
using Peer = strata::ps::ParameterServersTestPeer;

strata::ps::VariableSpec var(const std::string& name, strata::ps::Shape shape) {
  strata::ps::VariableSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.init = strata::ps::Initializer::constant(0.5);
  return s;
}

void put_i64s(PsEndpoint& ps, int rank, std::uint64_t offset, const std::vector<std::int64_t>& words) {
  Peer::put(ps, rank, offset, words.data(), words.size() * 8);
}

// Worker 0's malformed message; false for an unknown case.
bool attack(PsClient& ps, const std::string& which) {
  const Peer::InboxWords kernel = Peer::inbox_words(ps, "dense/kernel");
  if (which == "row-count") {
    put_i64s(ps, kernel.rank, kernel.header, {785});
  } else if (which == "row-index") {
    put_i64s(ps, kernel.rank, kernel.header, {1, std::int64_t{1} << 40});
  } else if (which == "negative-row") {
    put_i64s(ps, kernel.rank, kernel.header, {2, 7, -3});
  } else if (which == "doorbell") {
    put_i64s(ps, kernel.rank, kernel.header, {1, 7});
    Peer::fetch_add(ps, kernel.rank, kernel.doorbell, 3);
    return true;
  } else if (which == "chunks") {
    const Peer::InboxWords big = Peer::inbox_words(ps, "big");
    Peer::fetch_add(ps, big.rank, big.chunks, 3);
    return true;
  } else if (which == "none") {
    return true;
  } else {
    return false;
  }
  Peer::fetch_add(ps, kernel.rank, kernel.doorbell, 1);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ps_inbox_probe CASE [TRANSPORT]\n");
    return 2;
  }
  const std::string which = argv[1];
  try {
    strata::MpiSession session(&argc, &argv);
    {
      strata::BootstrapOptions options;
      options.resolve.resolver = strata::cluster::ResolverKind::kMpi;
      options.resolve.num_ps = 1;
      options.timeout_s = 30;
      auto runtime = strata::Runtime::bootstrap(MPI_COMM_WORLD, strata::Env(), options);
      strata::ps::PsOptions ps_options;
      ps_options.optimizer = strata::ps::OptimizerConfig::parse("adam:lr=0.1");
      ps_options.transport = argc > 2 ? argv[2] : "auto";
      ps_options.timeout_s = 30;
      auto ps = ParameterServers::materialize(*runtime, ps_options, {var("dense/kernel", {784, 10}), var("big", {1024, 128})});
      if (ps.is_ps()) {
        ps.server->serve();
      } else {
        if (ps.client->worker_index() == 0 && !attack(*ps.client, which)) throw strata::ConfigError("unknown case '" + which + "'");
        ps.client->done();
      }
      ps.endpoint().barrier();
    }
  } catch (const std::exception& e) {
    std::string text = e.what();
    for (char& c : text)
      if (c == '\n') c = ' ';
    std::fprintf(stderr, "strata: %s\n", text.c_str());
    std::fflush(stderr);
    strata::abort_job(1);
    return 1;
  }
  return 0;
}
