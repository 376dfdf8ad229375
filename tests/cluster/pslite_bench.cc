// pslite_bench: the ps-lite side of tests/cluster/bench_vs_pslite.sh. Not part of strata's
// build: the script compiles it against a ps-lite build given on its command line (ps-lite is
// not packaged for Debian and is never vendored into strata).
//
// The same shapes as `strata bench --op pull|push` with one PS and one worker: a tensor of S
// bytes (S/4 floats) under one key. A push sends S bytes that the server adds into the stored
// tensor (what strata's SGD push does: an accumulate), answered by ps-lite's empty response;
// a pull sends the key and gets S bytes back into a buffer the worker allocated once.
// Each operation is waited for (KVWorker::Wait) before the next, as strata bench flushes each
// one. Output, one line per size, from the worker:
//   pslite BYTES push_us PUSH_US pull_us PULL_US wrong N
// `wrong` counts pulled elements that differ from the number of pushes made so far (every push
// adds 1.0 to each element; exact in float below 2^24), the check strata bench makes too.
//
// Roles and the scheduler come from ps-lite's own environment (DMLC_ROLE, DMLC_PS_ROOT_URI,
// DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER=1, DMLC_NUM_WORKER=1, DMLC_INTERFACE).
// Arguments (worker only; the others ignore them): -n ITERS -w WARMUP -s ITERS_SMALL SIZE...
// where sizes below 64 KiB use ITERS_SMALL iterations (many more round trips are cheap there).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

using Clock = std::chrono::steady_clock;

// The server's tensors, one per key. Only ps-lite's single customer thread calls the handler,
// but the mutex keeps that an assumption we do not rely on.
std::mutex store_mu;
std::unordered_map<ps::Key, ps::SArray<float>> store;

void handle(const ps::KVMeta& meta, const ps::KVPairs<float>& req, ps::KVServer<float>* server) {
  ps::KVPairs<float> res;
  std::lock_guard<std::mutex> lock(store_mu);
  if (meta.push) {
    // One key per request, its length in lens (or all of vals when lens is absent).
    const size_t n = req.lens.empty() ? req.vals.size() : static_cast<size_t>(req.lens[0]);
    ps::SArray<float>& t = store[req.keys[0]];
    if (t.size() != n) {
      t.resize(n);
      std::memset(t.data(), 0, n * sizeof(float));
    }
    float* dst = t.data();
    const float* src = req.vals.data();
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
    server->Response(meta, res);
  } else {
    // The reply shares the stored array (SArray is reference counted): no copy on the server,
    // as strata sends a pull straight from the PS region.
    res.keys = req.keys;
    res.vals = store[req.keys[0]];
    res.lens.push_back(static_cast<int>(res.vals.size()));
    server->Response(meta, res);
  }
}

double us_since(Clock::time_point t0, int iters) {
  return std::chrono::duration<double>(Clock::now() - t0).count() * 1e6 / iters;
}

void run_worker(int argc, char** argv) {
  int iters = 20, warmup = 5, iters_small = 200;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-n" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "-w" && i + 1 < argc) warmup = std::atoi(argv[++i]);
    else if (a == "-s" && i + 1 < argc) iters_small = std::atoi(argv[++i]);
    else sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  }
  ps::KVWorker<float> kv(0, 0);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t bytes = sizes[k], n = bytes / sizeof(float);
    const int it = bytes < (64u << 10) ? iters_small : iters;
    ps::SArray<ps::Key> keys(1, static_cast<ps::Key>(k));
    ps::SArray<float> grad(n, 1.0f);
    ps::SArray<int> lens(1, static_cast<int>(n));
    ps::SArray<float> out(n, 0.0f);
    ps::SArray<int> out_lens(1, 0);
    int pushes = 0;
    for (int i = 0; i < warmup; ++i, ++pushes) kv.Wait(kv.ZPush(keys, grad, lens));
    auto t0 = Clock::now();
    for (int i = 0; i < it; ++i, ++pushes) kv.Wait(kv.ZPush(keys, grad, lens));
    const double push_us = us_since(t0, it);
    for (int i = 0; i < warmup; ++i) kv.Wait(kv.ZPull(keys, &out, &out_lens));
    t0 = Clock::now();
    for (int i = 0; i < it; ++i) kv.Wait(kv.ZPull(keys, &out, &out_lens));
    const double pull_us = us_since(t0, it);
    long wrong = out.size() == n ? 0 : static_cast<long>(n);
    for (size_t i = 0; i < out.size() && i < n; ++i)
      if (out[i] != static_cast<float>(pushes)) ++wrong;
    std::printf("pslite %zu push_us %.2f pull_us %.2f wrong %ld\n", bytes, push_us, pull_us, wrong);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ps::Start(0);
  if (ps::IsServer()) {
    auto* server = new ps::KVServer<float>(0);
    server->set_request_handle(handle);
    ps::RegisterExitCallback([server]() { delete server; });
  }
  if (ps::IsWorker()) run_worker(argc, argv);
  ps::Finalize(0, true);
  return 0;
}
