// src/model/gemm.h: every backend against the double reference on every product the built-in
// models make (recorded from their steps) and on edge shapes; bit-reproducibility across buffer
// addresses and threads; argument errors.
#include "model/gemm.h"

#include <dlfcn.h>

#include <cstdlib>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/common/error.h"
#include "strata/model/model.h"
#include "strata/nn/builtin.h"

namespace strata::model::detail {
namespace {

std::size_t stored(int rows, int cols, int ld) {
  return rows == 0 || cols == 0 ? 1 : static_cast<std::size_t>(rows - 1) * ld + static_cast<std::size_t>(cols);
}

// Operands of one call, seeded; C holds a start value (read when beta != 0).
struct Operands {
  std::vector<float> a, b, c;
  Operands(const GemmCall& g, unsigned seed, std::size_t pad = 0) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    a.resize(pad + stored(g.ta == Transpose::kYes ? g.k : g.m, g.ta == Transpose::kYes ? g.m : g.k, g.lda));
    b.resize(pad + stored(g.tb == Transpose::kYes ? g.n : g.k, g.tb == Transpose::kYes ? g.k : g.n, g.ldb));
    c.resize(pad + stored(g.m, g.n, g.ldc));
    for (auto* v : {&a, &b, &c})
      for (std::size_t i = pad; i < v->size(); ++i) (*v)[i] = u(gen);
  }
};

void run(const GemmCall& g, const float* a, const float* b, float* c) {
  sgemm(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a, g.lda, b, g.ldb, g.beta, c, g.ldc);
}

// The backend products requested as `backend` actually use on this thread (auto resolved).
GemmBackend current_backend_for(GemmBackend backend) {
  ScopedGemmBackend scoped(backend);
  return current_gemm_backend();
}

// Elements of `backend`'s result outside the error bound of the double reference.
std::int64_t wrong_elements(GemmBackend backend, const GemmCall& g, unsigned seed) {
  Operands ops(g, seed);
  std::vector<float> c = ops.c;
  {
    ScopedGemmBackend scoped(backend);
    run(g, ops.a.data(), ops.b.data(), c.data());
  }
  std::int64_t wrong = 0;
  auto at = [](const std::vector<float>& p, int ld, Transpose t, int r, int col) {
    return static_cast<double>(t == Transpose::kYes ? p[static_cast<std::size_t>(col) * ld + r]
                                                    : p[static_cast<std::size_t>(r) * ld + col]);
  };
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double s = 0, s_abs = 0;
      for (int p = 0; p < g.k; ++p) {
        const double t = at(ops.a, g.lda, g.ta, i, p) * at(ops.b, g.ldb, g.tb, p, j);
        s += t;
        s_abs += std::fabs(t);
      }
      const double c0 = ops.c[static_cast<std::size_t>(i) * g.ldc + j];
      const double want = g.alpha * s + (g.beta != 0.0f ? g.beta * c0 : 0.0);
      const double bound = gemm_error_bound(g.k, std::fabs(g.alpha) * s_abs + (g.beta != 0.0f ? std::fabs(g.beta * c0) : 0.0));
      wrong += !(std::fabs(c[static_cast<std::size_t>(i) * g.ldc + j] - want) <= bound);
    }
  return wrong;
}

// The products one training step of `name` makes at `batch` (recorded from the step itself).
std::vector<GemmCall> model_calls(const std::string& name, int batch) {
  ModelConfig mc;
  mc.name = name;
  if (name == "wide_deep") {
    mc.input_dim = 4;
    mc.num_classes = 2;
    mc.num_fields = 8;
    mc.vocab = 1000;
  }
  const ModelConfig c = resolve_model_config(mc);
  const auto net = nn::make_builtin_model(c);
  const Params params = nn::init_local_params(*net);
  std::vector<float> dense(static_cast<std::size_t>(batch) * c.input_dim, 0.5f);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(batch) * c.num_fields);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i * 37 % 1000);
  for (int i = 0; i < batch; ++i) labels[i] = i % c.num_classes;
  Inputs in;
  in.size = batch;
  in.dense = dense.empty() ? nullptr : dense.data();
  in.dense_dim = c.input_dim;
  in.sparse_ids = ids.empty() ? nullptr : ids.data();
  in.num_fields = c.num_fields;
  in.labels = labels.data();
  // The reference backend takes every product of the step (the layer graph keeps some on its own
  // Eigen kernel otherwise), so the recorder sees them all.
  ScopedGemmBackend reference(GemmBackend::kReference);
  GemmRecorder recorder;
  Grads grads;
  net->step(params, in, &grads);
  return recorder.calls();
}

std::vector<GemmCall> edge_calls() {
  std::vector<GemmCall> calls;
  const int dims[][3] = {{1, 1, 1}, {7, 13, 5}, {17, 33, 65}, {64, 48, 1}, {3, 100, 257}, {129, 31, 16}};
  for (const auto& d : dims)
    for (int t = 0; t < 4; ++t)
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        GemmCall g;
        g.ta = (t & 1) ? Transpose::kYes : Transpose::kNo;
        g.tb = (t & 2) ? Transpose::kYes : Transpose::kNo;
        g.m = d[0];
        g.n = d[1];
        g.k = d[2];
        // Padded leading dimensions: row length + 3.
        g.lda = (g.ta == Transpose::kYes ? g.m : g.k) + 3;
        g.ldb = (g.tb == Transpose::kYes ? g.k : g.n) + 3;
        g.ldc = g.n + 3;
        g.alpha = beta == 0.5f ? -2.0f : 1.0f;
        g.beta = beta;
        calls.push_back(g);
      }
  return calls;
}

class GemmBackends : public ::testing::TestWithParam<GemmBackend> {
 protected:
  void SetUp() override {
    if (!gemm_backend_built(GetParam())) GTEST_SKIP() << "built without " << gemm_backend_id(GetParam());
  }
};

TEST_P(GemmBackends, EveryProductOfTheBuiltInModelsMatchesTheReference) {
  unsigned seed = 1;
  for (const std::string name : {"mlp", "softmax", "wide_deep"})
    for (int batch : {128, 37, 1}) {
      const std::vector<GemmCall> calls = model_calls(name, batch);
      ASSERT_FALSE(calls.empty()) << name;
      for (const GemmCall& g : calls)
        EXPECT_EQ(wrong_elements(GetParam(), g, ++seed), 0)
            << name << " batch " << batch << ": m=" << g.m << " n=" << g.n << " k=" << g.k;
    }
}

TEST_P(GemmBackends, EdgeShapesTransposesAlphaBetaAndPaddedRowsMatchTheReference) {
  unsigned seed = 100;
  for (const GemmCall& g : edge_calls())
    EXPECT_EQ(wrong_elements(GetParam(), g, ++seed), 0)
        << "ta=" << static_cast<int>(g.ta) << " tb=" << static_cast<int>(g.tb) << " m=" << g.m << " n=" << g.n
        << " k=" << g.k << " beta=" << g.beta;
}

// Sync training's reproducibility: the same operands give the same bits whatever the buffers'
// addresses and however many threads multiply at once.
TEST_P(GemmBackends, SameBitsAtAnyAddressAndFromConcurrentThreads) {
  const std::vector<GemmCall> calls = model_calls("mlp", 128);
  for (const GemmCall& g : calls) {
    Operands base(g, 7);
    std::vector<float> want = base.c;
    {
      ScopedGemmBackend scoped(GetParam());
      run(g, base.a.data(), base.b.data(), want.data());
    }
    for (std::size_t pad : {1u, 3u, 16u}) {
      Operands shifted(g, 7, pad);
      // Same values, shifted in memory by `pad` floats.
      std::copy(base.a.begin(), base.a.end(), shifted.a.begin() + pad);
      std::copy(base.b.begin(), base.b.end(), shifted.b.begin() + pad);
      std::copy(base.c.begin(), base.c.end(), shifted.c.begin() + pad);
      ScopedGemmBackend scoped(GetParam());
      run(g, shifted.a.data() + pad, shifted.b.data() + pad, shifted.c.data() + pad);
      EXPECT_EQ(std::memcmp(want.data(), shifted.c.data() + pad, want.size() * sizeof(float)), 0)
          << "m=" << g.m << " n=" << g.n << " k=" << g.k << " shifted by " << pad;
    }
    // OpenBLAS is used from one thread per process only (gemm.h): no concurrent case for it.
    if (current_backend_for(GetParam()) == GemmBackend::kOpenBlas) continue;
    std::vector<std::vector<float>> got(3, base.c);
    std::vector<std::thread> threads;
    for (auto& out : got)
      threads.emplace_back([&, out_ptr = &out] {
        ScopedGemmBackend scoped(GetParam());
        for (int rep = 0; rep < 20; ++rep) {
          *out_ptr = base.c;
          run(g, base.a.data(), base.b.data(), out_ptr->data());
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& out : got)
      EXPECT_EQ(std::memcmp(want.data(), out.data(), want.size() * sizeof(float)), 0)
          << "concurrent threads, m=" << g.m << " n=" << g.n << " k=" << g.k;
  }
}

TEST_P(GemmBackends, BetaZeroNeverReadsC) {
  GemmCall g;
  g.m = 33;
  g.n = 17;
  g.k = 9;
  g.lda = g.k;
  g.ldb = g.n;
  g.ldc = g.n;
  Operands ops(g, 3);
  std::fill(ops.c.begin(), ops.c.end(), std::numeric_limits<float>::quiet_NaN());
  ScopedGemmBackend scoped(GetParam());
  run(g, ops.a.data(), ops.b.data(), ops.c.data());
  for (float x : ops.c) ASSERT_TRUE(std::isfinite(x));
}

// Threads that come and go (a replica's or the apply team's threads are not one fixed pool): rounds
// of fresh threads multiplying every product of the MLP's step at once, each result compared bit
// for bit with the same product made alone on this thread. The sanitizer builds (ASan+UBSan, TSan)
// of this binary run it too.
TEST_P(GemmBackends, ThreadsThatComeAndGoGetTheSameBits) {
  if (current_backend_for(GetParam()) == GemmBackend::kOpenBlas) GTEST_SKIP() << "OpenBLAS: one thread per process";
  std::vector<GemmCall> calls = model_calls("mlp", 128);
  for (const GemmCall& g : model_calls("mlp", 37)) calls.push_back(g);
  std::vector<Operands> operands;
  std::vector<std::vector<float>> want;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    operands.emplace_back(calls[i], 40 + static_cast<unsigned>(i));
    want.push_back(operands.back().c);
    ScopedGemmBackend scoped(GetParam());
    run(calls[i], operands[i].a.data(), operands[i].b.data(), want.back().data());
  }
  constexpr int kRounds = 12, kThreads = 4;
  std::atomic<int> mismatches{0};
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        ScopedGemmBackend scoped(GetParam());
        // Each thread walks the products from a different start, so different shapes overlap.
        for (std::size_t j = 0; j < calls.size(); ++j) {
          const std::size_t i = (j + static_cast<std::size_t>(t) * 3) % calls.size();
          std::vector<float> c = operands[i].c;
          run(calls[i], operands[i].a.data(), operands[i].b.data(), c.data());
          if (std::memcmp(c.data(), want[i].data(), c.size() * sizeof(float)) != 0) mismatches.fetch_add(1);
        }
      });
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(mismatches.load(), 0) << gemm_backend_id(GetParam());
}

INSTANTIATE_TEST_SUITE_P(All, GemmBackends,
                         ::testing::Values(GemmBackend::kEigen, GemmBackend::kBlis, GemmBackend::kOpenBlas,
                                           GemmBackend::kDefault),
                         [](const auto& info) { return std::string(gemm_backend_id(info.param)) + "_backend"; });

TEST(Gemm, ChecksEachLibraryOnTheModelsShapesAndNamesTheBackend) {
  for (GemmBackend lib : {GemmBackend::kBlis, GemmBackend::kOpenBlas}) {
    if (!gemm_backend_built(lib)) {
      EXPECT_FALSE(check_gemm_shape(lib, model_calls("mlp", 8).front()));
      continue;
    }
    for (const GemmCall& g : model_calls("mlp", 128)) {
      // True unless the library computed a wrong product on this processor, in which case it is
      // off for the rest of the process and every product it would get is Eigen's.
      const bool ok = check_gemm_shape(lib, g);
      EXPECT_EQ(ok, !gemm_backend_disabled(lib)) << gemm_backend_id(lib);
    }
    ScopedGemmBackend scoped(lib);
    const std::string name = gemm_backend_name(current_gemm_backend());
    EXPECT_EQ(name.rfind(gemm_backend_disabled(lib) ? "eigen" : gemm_backend_id(lib), 0), 0u) << name;
  }
  EXPECT_FALSE(check_gemm_shape(GemmBackend::kEigen, model_calls("mlp", 8).front()));
}

// BLIS and OpenBLAS both export cblas_sgemm; strata's OpenBLAS products must be OpenBLAS's.
TEST(Gemm, CblasSgemmIsOpenBlasWhenBothLibrariesAreLinked) {
  if (!gemm_backend_built(GemmBackend::kOpenBlas)) GTEST_SKIP() << "built without OpenBLAS";
  void* symbol = dlsym(RTLD_DEFAULT, "cblas_sgemm");
  ASSERT_NE(symbol, nullptr);
  Dl_info info{};
  ASSERT_NE(dladdr(symbol, &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  EXPECT_NE(std::string(info.dli_fname).find("openblas"), std::string::npos) << info.dli_fname;
}

TEST(Gemm, ScopedBackendNestsAndRecorderSeesEveryCall) {
  {
    ScopedGemmBackend outer(GemmBackend::kReference);
    EXPECT_EQ(current_gemm_backend(), GemmBackend::kReference);
    {
      ScopedGemmBackend inner(GemmBackend::kEigen);
      EXPECT_EQ(current_gemm_backend(), GemmBackend::kEigen);
    }
    EXPECT_EQ(current_gemm_backend(), GemmBackend::kReference);
  }
  EXPECT_NE(current_gemm_backend(), GemmBackend::kDefault);
  GemmRecorder recorder;
  EXPECT_THROW(GemmRecorder second, Error);
  std::vector<float> a(6, 1.0f), b(6, 1.0f), c(6, 0.0f);  // C holds the larger of the two results (3 x 2)
  sgemm(Transpose::kNo, Transpose::kNo, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);
  sgemm(Transpose::kYes, Transpose::kNo, 3, 2, 2, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2);
  ASSERT_EQ(recorder.calls().size(), 2u);
  EXPECT_EQ(recorder.calls()[1].ta, Transpose::kYes);
  EXPECT_EQ(recorder.calls()[1].m, 3);
  EXPECT_DOUBLE_EQ(recorder.calls()[0].flops(), 2.0 * 2 * 2 * 3);
}

TEST(Gemm, BadArgumentsAndBackendNamesAreErrors) {
  std::vector<float> a(16, 1.0f), b(16, 1.0f), c(16, 0.0f);
  EXPECT_THROW(sgemm(Transpose::kNo, Transpose::kNo, -1, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2),
               Error);
  // lda shorter than a row of A (k = 4).
  EXPECT_THROW(sgemm(Transpose::kNo, Transpose::kNo, 2, 2, 4, 1.0f, a.data(), 3, b.data(), 2, 0.0f, c.data(), 2),
               Error);
  EXPECT_THROW(sgemm(Transpose::kNo, Transpose::kNo, 2, 2, 2, 1.0f, nullptr, 2, b.data(), 2, 0.0f, c.data(), 2),
               Error);
  EXPECT_THROW(parse_gemm_backend("mkl", "STRATA_GEMM"), ConfigError);
  EXPECT_EQ(parse_gemm_backend("blis", "x"), GemmBackend::kBlis);
  EXPECT_STREQ(gemm_backend_id(GemmBackend::kBlis), "blis");
  EXPECT_EQ(parse_gemm_backend("eigen", "x"), GemmBackend::kEigen);
  EXPECT_EQ(parse_gemm_backend("auto", "x"), GemmBackend::kDefault);
}

// The whole MLP step with each backend against the same step accumulated in double.
TEST(Gemm, MlpStepGradientsAgreeWithTheDoubleReference) {
  const auto net = nn::make_builtin_model(ModelConfig{});
  const Params params = nn::init_local_params(*net);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> dense(128 * 784);
  for (float& x : dense) x = pixel(gen);
  std::vector<std::int32_t> labels(128);
  for (int i = 0; i < 128; ++i) labels[i] = (i * 7) % 10;
  Inputs in;
  in.size = 128;
  in.dense = dense.data();
  in.dense_dim = 784;
  in.labels = labels.data();
  Grads ref;
  {
    ScopedGemmBackend scoped(GemmBackend::kReference);
    net->step(params, in, &ref);
  }
  for (GemmBackend b : {GemmBackend::kEigen, GemmBackend::kBlis, GemmBackend::kOpenBlas}) {
    Grads got, again;
    ScopedGemmBackend scoped(b);
    net->step(params, in, &got);
    net->step(params, in, &again);
    for (const auto& [name, r] : ref.dense) {
      double scale = 0;
      for (float x : r.value) scale = std::max(scale, std::fabs(static_cast<double>(x)));
      const auto& g = got.dense.at(name).value;
      ASSERT_EQ(g.size(), r.value.size());
      std::int64_t off = 0;
      for (std::size_t i = 0; i < g.size(); ++i) off += !(std::fabs(g[i] - r.value[i]) <= 1e-3 * scale);
      EXPECT_EQ(off, 0) << gemm_backend_id(b) << " " << name;
      EXPECT_EQ(std::memcmp(g.data(), again.dense.at(name).value.data(), g.size() * sizeof(float)), 0)
          << gemm_backend_id(b) << " " << name << ": two steps differ";
    }
  }
}

}  // namespace
}  // namespace strata::model::detail

// auto never settles for OpenBLAS's generic SSE kernels on an AVX2 processor (OpenBLAS 0.3.21 picks
// "Prescott" on x86-64 CPUs it does not know; on such a Xeon it ran 2.6x slower than Eigen).
TEST(GemmBackendChoice, GenericOpenBlasKernelsAreNotChosenOnAvx2Processors) {
  using strata::model::detail::openblas_core_is_fast;
  for (const char* fast : {"Haswell", "Zen", "SkylakeX", "COOPERLAKE", "sapphirerapids"})
    EXPECT_TRUE(openblas_core_is_fast(fast, true)) << fast;
  for (const char* slow : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Penryn", "Atom", ""})
    EXPECT_FALSE(openblas_core_is_fast(slow, true)) << slow;
  // Without AVX2 there is nothing faster to prefer.
  EXPECT_TRUE(openblas_core_is_fast("Prescott", false));
}

// auto is BLIS where the kernel family it chose suits the CPU (blis_arch_is_fast); else OpenBLAS
// where it chose AVX-512 kernels on an AVX-512 CPU and the process multiplies on one thread (the
// serial OpenBLAS takes products in turns); else Eigen. This test binary never declares one
// multiplying thread, so here auto is never OpenBLAS.
TEST(GemmBackendChoice, AutoIsBlisWithFastKernelsElseEigen) {
  for (const char* avx512 : {"SkylakeX", "cooperlake", "SAPPHIRERAPIDS"})
    EXPECT_TRUE(strata::model::detail::openblas_core_is_avx512(avx512)) << avx512;
  for (const char* other : {"Haswell", "Zen", "Prescott", "Sandybridge", ""})
    EXPECT_FALSE(strata::model::detail::openblas_core_is_avx512(other)) << other;
  using namespace strata::model::detail;
  for (const bool avx512 : {false, true}) {
    for (const char* fast : {"skx", "knl", "zen", "zen2", "zen3", "ZEN4"})
      EXPECT_TRUE(blis_arch_is_fast(fast, true, avx512)) << fast;
    for (const char* slow : {"generic", "sandybridge", "penryn", "bulldozer", "piledriver", "steamroller", "excavator", ""})
      EXPECT_FALSE(blis_arch_is_fast(slow, true, avx512)) << slow;
    EXPECT_TRUE(blis_arch_is_fast("sandybridge", false, avx512));
    EXPECT_TRUE(blis_arch_is_fast("penryn", false, avx512));
    EXPECT_FALSE(blis_arch_is_fast("generic", false, avx512));
  }
  // BLIS's AVX2 haswell kernels lose to Eigen's AVX-512 code (measured on an AVX-512 Xeon).
  EXPECT_TRUE(blis_arch_is_fast("haswell", true, false));
  EXPECT_FALSE(blis_arch_is_fast("haswell", true, true));
  const GemmBackend chosen = auto_gemm_backend();
  EXPECT_TRUE(chosen == GemmBackend::kBlis || chosen == GemmBackend::kEigen);
  if (gemm_backend_built(GemmBackend::kBlis)) {
    const std::string name = gemm_backend_name(GemmBackend::kBlis);  // "blis 0.9.0 (zen3)"
    const std::string arch = name.substr(name.find('(') + 1, name.size() - name.find('(') - 2);
    EXPECT_EQ(chosen == GemmBackend::kBlis, blis_arch_is_fast(arch, __builtin_cpu_supports("avx2"), eigen_uses_avx512()))
        << name;
  } else {
    EXPECT_EQ(chosen, GemmBackend::kEigen);
  }
  if (std::getenv("STRATA_GEMM") == nullptr) {
    EXPECT_EQ(current_gemm_backend(), gemm_backend_disabled(chosen) ? GemmBackend::kEigen : chosen);
  }
}
