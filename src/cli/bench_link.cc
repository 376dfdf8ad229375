#include "cli/bench_link.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include <iostream>

#include "cli/poll_then_sleep.h"
#include "comm/job_secret.h"
#include "comm/tcp/handshake.h"
#include "comm/tcp/socket.h"
#include "strata/common/env.h"
#include "strata/common/error.h"

namespace strata::cli {
namespace {

namespace tcp = comm::tcp;

// The baseline's listener admits only its client, as the transport's does: a one-time secret goes
// to the client over MPI with the endpoint, and a connection that fails the handshake is closed
// with a warning line while the listener waits for the next.
tcp::Socket accept_client(const tcp::Socket& listener, const comm::JobSecret& secret, int client, int self,
                          int world_size, double timeout_s) {
  const tcp::Deadline deadline = tcp::Deadline::in(timeout_s);
  while (true) {
    tcp::Socket s = tcp::accept_from(listener, deadline);
    tcp::ServerHandshake hs(secret, tcp::Purpose::kBenchLink, world_size, self);
    std::string why;
    try {
      const tcp::Deadline step = tcp::Deadline::in(std::min(timeout_s, 5.0));
      while (true) {
        std::string msg(hs.wants(), '\0');
        tcp::recv_all(s.fd(), msg.data(), msg.size(), step, -1, "link handshake");
        tcp::ServerHandshake::Step out = hs.on_message(msg.data(), msg.size());
        if (out.proven && hs.claimed_rank() != client) out.refused = "it is not the benchmark's client";
        if (!out.refused.empty()) {
          why = out.refused;
          break;
        }
        if (out.proven) out.reply.assign(reinterpret_cast<const char*>(&tcp::kAcceptWord), sizeof tcp::kAcceptWord);
        if (!out.reply.empty()) tcp::send_all(s.fd(), out.reply.data(), out.reply.size(), step, -1, "link handshake");
        if (out.proven) return s;
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::cerr << "strata: warning: bench link listener refused a connection: " << why << std::endl;
  }
}

// The server side: pulls (8-byte request in, data out), then pushes (data in, 8-byte ack out).
void serve_link(MPI_Comm comm, int client, std::uint64_t bytes, int n, double timeout_s, int tag) {
  tcp::Endpoint at;
  tcp::Socket listener = tcp::listen_on(tcp::choose_local_address(Env::from_process(), nullptr), &at);
  const comm::JobSecret secret = comm::JobSecret::random();
  unsigned long long packed = (static_cast<unsigned long long>(at.ip) << 16) | at.port;
  STRATA_CHECK_MPI(MPI_Send(&packed, 1, MPI_UNSIGNED_LONG_LONG, client, tag, comm));
  secret.send_to(comm, client, tag);
  int self = 0, world_size = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &self));
  STRATA_CHECK_MPI(MPI_Comm_size(comm, &world_size));
  tcp::Socket s = accept_client(listener, secret, client, self, world_size, timeout_s);
  std::vector<char> data(bytes, 1);
  std::uint64_t word = 0;
  for (int i = 0; i < n; ++i) {
    tcp::recv_all(s.fd(), &word, 8, tcp::Deadline::in(timeout_s), client, "link pull request");
    tcp::send_all(s.fd(), data.data(), bytes, tcp::Deadline::in(timeout_s), client, "link pull reply");
  }
  for (int i = 0; i < n; ++i) {
    tcp::recv_all(s.fd(), data.data(), bytes, tcp::Deadline::in(timeout_s), client, "link push");
    tcp::send_all(s.fd(), &word, 8, tcp::Deadline::in(timeout_s), client, "link push ack");
  }
}

}  // namespace

LinkTimes measure_link(MPI_Comm comm, int server, int client, std::uint64_t bytes, int warmup, int iters,
                       double timeout_s) {
  int rank = 0;
  STRATA_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  double times[2] = {0, 0};
  const int tag = 7411;
  if (rank == server) {
    // The serving runs on a thread of its own while this rank's main thread waits in MPI, the
    // layout of the tcp transport in a bench (a server thread beside a main thread in a barrier
    // that polls, then sleeps), so the baseline and the transport meet the same scheduling.
    std::exception_ptr failure;
    std::thread serve([&] {
      try {
        serve_link(comm, client, bytes, warmup + iters, timeout_s, tag);
      } catch (...) {
        failure = std::current_exception();
      }
    });
    MPI_Request done;
    STRATA_CHECK_MPI(MPI_Irecv(nullptr, 0, MPI_BYTE, client, tag + 1, comm, &done));
    int flag = 0;
    PollThenSleep wait;  // as the transport's PS waits in a bench: poll 50 us, then sleep
    while (true) {
      STRATA_CHECK_MPI(MPI_Test(&done, &flag, MPI_STATUS_IGNORE));
      if (flag) break;
      wait.pause();
    }
    serve.join();
    if (failure) std::rethrow_exception(failure);
  } else if (rank == client) {
    unsigned long long packed = 0;
    STRATA_CHECK_MPI(MPI_Recv(&packed, 1, MPI_UNSIGNED_LONG_LONG, server, tag, comm, MPI_STATUS_IGNORE));
    const comm::JobSecret secret = comm::JobSecret::receive_from(comm, server, tag);
    tcp::Endpoint to{static_cast<std::uint32_t>(packed >> 16), static_cast<std::uint16_t>(packed & 0xffff)};
    const tcp::Deadline deadline = tcp::Deadline::in(timeout_s);
    tcp::Socket s = tcp::connect_to(to, deadline, "rank " + std::to_string(server));
    tcp::client_handshake(s.fd(), secret, tcp::Purpose::kBenchLink, rank, server, deadline);
    std::vector<char> data(bytes, 2);
    std::uint64_t word = 42;
    auto round = [&](bool pull) {
      if (pull) {
        tcp::send_all(s.fd(), &word, 8, tcp::Deadline::in(timeout_s), server, "link pull request");
        tcp::recv_all(s.fd(), data.data(), bytes, tcp::Deadline::in(timeout_s), server, "link pull reply");
      } else {
        tcp::send_all(s.fd(), data.data(), bytes, tcp::Deadline::in(timeout_s), server, "link push");
        tcp::recv_all(s.fd(), &word, 8, tcp::Deadline::in(timeout_s), server, "link push ack");
      }
    };
    for (int k = 0; k < 2; ++k) {
      const bool pull = k == 0;
      for (int i = 0; i < warmup; ++i) round(pull);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) round(pull);
      times[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e6 / iters;
    }
    STRATA_CHECK_MPI(MPI_Send(nullptr, 0, MPI_BYTE, server, tag + 1, comm));
  }
  // The same pull shape through MPI point-to-point between the same two ranks.
  double mpi_us = 0;
  if (rank == server || rank == client) {
    std::vector<char> data(bytes, 3);
    std::uint64_t word = 7;
    const int peer = rank == server ? client : server;
    for (int i = 0; i < warmup + iters; ++i) {
      if (i == warmup && rank == client) mpi_us = -MPI_Wtime();
      if (rank == client) {
        STRATA_CHECK_MPI(MPI_Send(&word, 1, MPI_UINT64_T, peer, tag + 2, comm));
        STRATA_CHECK_MPI(MPI_Recv(data.data(), static_cast<int>(bytes), MPI_BYTE, peer, tag + 3, comm, MPI_STATUS_IGNORE));
      } else {
        STRATA_CHECK_MPI(MPI_Recv(&word, 1, MPI_UINT64_T, peer, tag + 2, comm, MPI_STATUS_IGNORE));
        STRATA_CHECK_MPI(MPI_Send(data.data(), static_cast<int>(bytes), MPI_BYTE, peer, tag + 3, comm));
      }
    }
    if (rank == client) mpi_us = (mpi_us + MPI_Wtime()) * 1e6 / iters;
  }
  double all[3] = {times[0], times[1], mpi_us};
  STRATA_CHECK_MPI(MPI_Bcast(all, 3, MPI_DOUBLE, client, comm));
  return {all[0], all[1], all[2]};
}

}  // namespace strata::cli
