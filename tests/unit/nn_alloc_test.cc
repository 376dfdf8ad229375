// nn::GraphModel's steady-state contract: once a model has run a step of a given batch size on a
// thread, further steps (and predictions) of that size allocate no heap memory. Its own binary,
// because it replaces the global operator new (and, where no sanitizer owns malloc, malloc itself,
// which Eigen's allocations use) to count calls.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "strata/model/model.h"
#include "strata/nn/graph.h"
#include "strata/nn/graph_model.h"

namespace {
std::atomic<long> g_news{0};
std::atomic<long> g_mallocs{0};
}  // namespace

// The replacements below pair malloc with free, which is correct; GCC, inlining a replaced
// operator delete into a caller whose pointer came from operator new, takes the pair for a
// mismatch.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_news.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

// glibc's malloc is interposable: count it too, unless a sanitizer's runtime provides malloc.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STRATA_TEST_COUNTS_MALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define STRATA_TEST_COUNTS_MALLOC 0
#endif
#endif
#ifndef STRATA_TEST_COUNTS_MALLOC
#if defined(__GLIBC__)
#define STRATA_TEST_COUNTS_MALLOC 1
#else
#define STRATA_TEST_COUNTS_MALLOC 0
#endif
#endif
#if STRATA_TEST_COUNTS_MALLOC
extern "C" void* __libc_malloc(std::size_t);
extern "C" void* malloc(std::size_t n) {
  g_mallocs.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(n);
}
#endif

namespace strata::nn {
namespace {

// Every layer kind, tables pulled as a subset (the distributed path) and at MLP-like widths
// where Eigen's own product would put its packing buffers on the heap.
TEST(NnAlloc, SteadyStateStepsAndPredictionsAllocateNothing) {
  const int batch = 128, fields = 6, dense_dim = 256;
  const std::int64_t vocab = 500;
  Graph g("ctr", 1);
  std::vector<Tensor> towers{g.dense(g.dense_input(0, dense_dim), 16, Activation::kRelu)};
  for (int f = 0; f < 3; ++f) towers.push_back(g.embedding(g.ids_input(f, 1), vocab, 16, Combiner::kSum));
  towers.push_back(g.embedding(g.ids_input(3, 3), vocab, 16, Combiner::kSqrtn));
  const Tensor x = g.concatenate({g.dot_interaction(towers, true), g.indicator(g.ids_input(0, 2), vocab)});
  Tensor h = g.cross(x, x);
  h = g.dense(g.dropout(h, 0.2, 5), 512, Activation::kTanh);
  h = g.dense(g.multiply({h, h}), 256, Activation::kSigmoid);
  h = g.add({g.dense(h, 1), g.embedding(g.ids_input(0, fields), vocab, 1, Combiner::kMean, "wide")});
  const GraphModel m(g, h, Loss::kSigmoidCrossEntropy);

  std::mt19937 rng(3);
  std::vector<float> dense(static_cast<std::size_t>(batch) * dense_dim);
  for (float& v : dense) v = static_cast<float>(rng() % 1000) / 1000.0f;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(batch) * fields);
  for (auto& id : ids) id = rng() % 5 == 0 ? kNoId : static_cast<std::int64_t>(rng() % vocab);
  std::vector<std::int32_t> labels(batch);
  for (auto& y : labels) y = static_cast<std::int32_t>(rng() % 2);
  train::Inputs in;
  in.size = batch;
  in.dense = dense.data();
  in.dense_dim = dense_dim;
  in.sparse_ids = ids.data();
  in.num_fields = fields;
  in.labels = labels.data();

  // The parameters as a worker pulls them: dense variables whole, tables restricted to the rows
  // the batch reads.
  const train::Params full = init_local_params(m);
  train::Params params = full;
  for (const std::string& name : m.sparse_variables()) {
    model::SparseParam& p = params.sparse.at(name);
    const model::SparseParam& whole = full.sparse.at(name);
    p.rows = m.rows_needed(name, in);
    p.values.clear();
    for (std::int64_t r : p.rows)
      p.values.insert(p.values.end(), whole.values.begin() + r * p.width, whole.values.begin() + (r + 1) * p.width);
  }
  train::Grads grads;
  std::vector<float> scores(batch);
  in.step = 0;
  const double first = m.step(params, in, &grads).loss;
  ASSERT_TRUE(m.predict(params, in, scores.data()));
  const long news = g_news.load(), mallocs = g_mallocs.load();
  double last = 0;
  for (int s = 1; s <= 5; ++s) {
    in.step = s;  // new dropout masks, same shapes
    last = m.step(params, in, &grads).loss;
    ASSERT_TRUE(m.predict(params, in, scores.data()));
  }
  const long news_after = g_news.load(), mallocs_after = g_mallocs.load();
  EXPECT_EQ(news_after - news, 0) << "operator new calls in steps 2..6";
  EXPECT_EQ(mallocs_after - mallocs, 0) << "malloc calls in steps 2..6";
  EXPECT_NE(first, last);  // the steps really ran (another dropout mask each)
  // The counters count: one more model's first step allocates.
  const GraphModel other(g, h, Loss::kSigmoidCrossEntropy);
  train::Grads other_grads;
  other.step(params, in, &other_grads);
  EXPECT_GT(g_news.load(), news_after);
#if STRATA_TEST_COUNTS_MALLOC
  EXPECT_GT(g_mallocs.load(), mallocs_after);
#endif
}

}  // namespace
}  // namespace strata::nn
