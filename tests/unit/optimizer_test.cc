// Unit tests of the PS optimizer math (strata/ps/optimizer.h). Three properties are under test:
//   1. the update rules are TF Keras' rules: hand-computed values for one and several steps;
//   2. the floating-point contract: the Eigen path equals the scalar reference bit for bit, for any
//      n, alignment and split of the variable, which is what lets distributed runs be compared
//      with a single-process reference;
//   3. sparse semantics: duplicate rows are summed in order of appearance before one update per
//      row; unlisted rows and their slots are untouched.
// Plus the strict parsing and validation of optimizer specs, and "no allocation per apply".
#include "common/test_util.h"
#include "strata/ps/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/common/error.h"

// ---- allocation counting -----------------------------------------------------------------------
// Replaces the global operator new for this test binary so that a test can assert that an apply
// call allocates nothing. Counting is off unless a test turns it on for its own thread; otherwise
// these behave exactly like the default (malloc/free).
namespace {
thread_local bool g_count_allocations = false;
std::atomic<long> g_allocations{0};
float* volatile g_probe_sink = nullptr;

void* counted_alloc(std::size_t size) {
  if (g_count_allocations) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t size) { return counted_alloc(size); }
void* operator new[](std::size_t size) { return counted_alloc(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace strata::ps {
namespace {

using strata::testing::config_error;
using strata::testing::Contains;

OptimizerConfig config_for(OptimizerKind kind, bool nesterov = false) {
  OptimizerConfig c = OptimizerConfig::defaults(kind);
  c.nesterov = nesterov;
  return c;
}

// A variable with its slots, all owned; slots start at slot_initial_value().
template <typename T>
struct State {
  std::vector<T> var;
  std::vector<std::vector<T>> slots;
  std::vector<T*> slot_ptrs;

  State(const OptimizerConfig& c, std::vector<T> values) : var(std::move(values)) {
    for (int s = 0; s < num_slots(c.kind); ++s)
      slots.emplace_back(var.size(), static_cast<T>(slot_initial_value(c, s)));
    refresh();
  }
  State(const State& other) : var(other.var), slots(other.slots) { refresh(); }
  State& operator=(const State&) = delete;
  void refresh() {
    slot_ptrs.clear();
    for (auto& s : slots) slot_ptrs.push_back(s.data());
  }
  T* const* sp() { return slot_ptrs.empty() ? nullptr : slot_ptrs.data(); }
};

// Deterministic data as a pure function of (seed, index): splitmix64 mapped to [-1, 1), so the
// test does not depend on the standard library's distributions.
double unit_value(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
}

template <typename T>
std::vector<T> random_vector(std::uint64_t seed, std::size_t n, double scale = 1.0) {
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(scale * unit_value(seed, i));
  return out;
}

// Fills slots with plausible non-trivial state: signed momenta, non-negative second moments, plus
// some zeros and denormals, which an approximate sqrt (Eigen's EIGEN_FAST_MATH) gets wrong.
template <typename T>
void randomize_slots(OptimizerKind kind, State<T>& st, std::uint64_t seed) {
  const T denormal = std::numeric_limits<T>::denorm_min() * T(3);
  for (std::size_t s = 0; s < st.slots.size(); ++s) {
    const bool second_moment = kind == OptimizerKind::kAdagrad || kind == OptimizerKind::kRmsProp ||
                               (kind == OptimizerKind::kAdam && s == 1) || (kind == OptimizerKind::kFtrl && s == 0);
    for (std::size_t i = 0; i < st.slots[s].size(); ++i) {
      T x = static_cast<T>(unit_value(seed + 100 + s, i));
      if (second_moment) x = x * x;
      if (i % 13 == 5) x = T(0);
      if (i % 17 == 3) x = denormal;
      st.slots[s][i] = x;
    }
  }
}

// Bitwise equality of two arrays; on mismatch names the first differing index and both values.
template <typename T>
::testing::AssertionResult BitEqual(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " != " << b.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << " differs: " << std::hexfloat << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult StatesBitEqual(const State<T>& a, const State<T>& b) {
  if (auto r = BitEqual(a.var, b.var); !r) return r << " (var)";
  for (std::size_t s = 0; s < a.slots.size(); ++s)
    if (auto r = BitEqual(a.slots[s], b.slots[s]); !r) return r << " (slot " << s << ")";
  return ::testing::AssertionSuccess();
}

// ---- names, slots ------------------------------------------------------------------------------

TEST(OptimizerKindTest, ParsesEveryNameAndRoundTrips) {
  for (const char* name : {"sgd", "momentum", "adagrad", "adam", "rmsprop", "ftrl"})
    EXPECT_STREQ(to_string(parse_optimizer_kind(name)), name);
  EXPECT_EQ(parse_optimizer_kind("rmsprop"), OptimizerKind::kRmsProp);
  EXPECT_EQ(parse_optimizer_kind("ftrl"), OptimizerKind::kFtrl);
}

TEST(OptimizerKindTest, RejectsUnknownNamesListingTheKnownOnes) {
  for (const char* bad : {"", "Adam", "adamw", " adam", "sgd "}) {
    std::string msg = config_error([&] { parse_optimizer_kind(bad); });
    EXPECT_TRUE(Contains(msg, "'" + std::string(bad) + "'"));
    EXPECT_TRUE(Contains(msg, "sgd, momentum, adagrad, adam, rmsprop, ftrl"));
  }
}

TEST(OptimizerSlotsTest, KerasSlotNamesAndInitialValues) {
  EXPECT_EQ(num_slots(OptimizerKind::kSgd), 0);
  EXPECT_EQ(slot_names(OptimizerKind::kSgd), std::vector<std::string>{});
  EXPECT_EQ(slot_names(OptimizerKind::kMomentum), std::vector<std::string>{"momentum"});
  EXPECT_EQ(slot_names(OptimizerKind::kAdagrad), std::vector<std::string>{"accumulator"});
  EXPECT_EQ(slot_names(OptimizerKind::kAdam), (std::vector<std::string>{"m", "v"}));
  EXPECT_EQ(slot_names(OptimizerKind::kRmsProp), std::vector<std::string>{"rms"});
  EXPECT_EQ(slot_names(OptimizerKind::kFtrl), (std::vector<std::string>{"accumulator", "linear"}));
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad,
                          OptimizerKind::kAdam, OptimizerKind::kRmsProp, OptimizerKind::kFtrl})
    EXPECT_EQ(static_cast<std::size_t>(num_slots(k)), slot_names(k).size());

  OptimizerConfig adagrad = OptimizerConfig::parse("adagrad:initial_accumulator=0.25");
  EXPECT_EQ(slot_initial_value(adagrad, 0), 0.25);
  EXPECT_EQ(slot_initial_value(config_for(OptimizerKind::kAdagrad), 0), 0.1);
  EXPECT_EQ(slot_initial_value(config_for(OptimizerKind::kAdam), 0), 0.0);
  EXPECT_EQ(slot_initial_value(config_for(OptimizerKind::kAdam), 1), 0.0);
  EXPECT_EQ(slot_initial_value(config_for(OptimizerKind::kMomentum), 0), 0.0);
  EXPECT_EQ(slot_initial_value(config_for(OptimizerKind::kRmsProp), 0), 0.0);
  EXPECT_THROW(slot_initial_value(config_for(OptimizerKind::kAdam), 2), Error);
  EXPECT_THROW(slot_initial_value(config_for(OptimizerKind::kSgd), 0), Error);
  // FTRL: the accumulator starts at initial_accumulator (Keras 0.1), "linear" at 0.
  EXPECT_EQ(slot_initial_value(config_for(OptimizerKind::kFtrl), 0), 0.1);
  EXPECT_EQ(slot_initial_value(config_for(OptimizerKind::kFtrl), 1), 0.0);
  EXPECT_EQ(slot_initial_value(OptimizerConfig::parse("ftrl:initial_accumulator_value=0.5"), 0), 0.5);
  EXPECT_THROW(slot_initial_value(config_for(OptimizerKind::kFtrl), 2), Error);
}

// ---- parse / validate --------------------------------------------------------------------------

TEST(OptimizerConfigTest, BareNamesGetKerasDefaults) {
  OptimizerConfig sgd = OptimizerConfig::parse("sgd");
  EXPECT_EQ(sgd.kind, OptimizerKind::kSgd);
  EXPECT_EQ(sgd.learning_rate, 0.01);
  OptimizerConfig adam = OptimizerConfig::parse("adam");
  EXPECT_EQ(adam.kind, OptimizerKind::kAdam);
  EXPECT_EQ(adam.learning_rate, 0.001);
  EXPECT_EQ(adam.beta1, 0.9);
  EXPECT_EQ(adam.beta2, 0.999);
  EXPECT_EQ(adam.epsilon, 1e-7);
  OptimizerConfig mom = OptimizerConfig::parse("momentum");
  EXPECT_EQ(mom.learning_rate, 0.01);
  EXPECT_EQ(mom.momentum, 0.9);
  EXPECT_FALSE(mom.nesterov);
  EXPECT_EQ(OptimizerConfig::parse("adagrad").initial_accumulator, 0.1);
  EXPECT_EQ(OptimizerConfig::parse("adagrad").learning_rate, 0.001);
  EXPECT_EQ(OptimizerConfig::parse("rmsprop").rho, 0.9);
  EXPECT_EQ(OptimizerConfig::parse("rmsprop").learning_rate, 0.001);
  // Keras' Ftrl defaults.
  OptimizerConfig ftrl = OptimizerConfig::parse("ftrl");
  EXPECT_EQ(ftrl.kind, OptimizerKind::kFtrl);
  EXPECT_EQ(ftrl.learning_rate, 0.001);
  EXPECT_EQ(ftrl.learning_rate_power, -0.5);
  EXPECT_EQ(ftrl.initial_accumulator, 0.1);
  EXPECT_EQ(ftrl.l1, 0.0);
  EXPECT_EQ(ftrl.l2, 0.0);
  EXPECT_EQ(ftrl.l2_shrinkage, 0.0);
  EXPECT_EQ(ftrl.beta, 0.0);
}

TEST(OptimizerConfigTest, ParsesKeysAndKerasAliases) {
  OptimizerConfig a = OptimizerConfig::parse("adam:lr=0.01,beta1=0.8,beta2=0.99,epsilon=1e-8");
  EXPECT_EQ(a.learning_rate, 0.01);
  EXPECT_EQ(a.beta1, 0.8);
  EXPECT_EQ(a.beta2, 0.99);
  EXPECT_EQ(a.epsilon, 1e-8);
  OptimizerConfig k = OptimizerConfig::parse("adam:learning_rate=0.5,beta_1=0,beta_2=0.5");
  EXPECT_EQ(k.learning_rate, 0.5);
  EXPECT_EQ(k.beta1, 0.0);
  EXPECT_EQ(k.beta2, 0.5);
  OptimizerConfig m = OptimizerConfig::parse("momentum:lr=0.1,momentum=0.5,nesterov=1");
  EXPECT_EQ(m.learning_rate, 0.1);
  EXPECT_EQ(m.momentum, 0.5);
  EXPECT_TRUE(m.nesterov);
  EXPECT_FALSE(OptimizerConfig::parse("momentum:nesterov=false").nesterov);
  EXPECT_EQ(OptimizerConfig::parse("adagrad:initial_accumulator_value=0").initial_accumulator, 0.0);
  EXPECT_EQ(OptimizerConfig::parse("rmsprop:rho=0.5,epsilon=1e-6").rho, 0.5);
  OptimizerConfig f = OptimizerConfig::parse("ftrl:lr=0.1,lr_power=-0.25,initial_accumulator=0,l1=0.01,l2=0.02,"
                                             "l2_shrinkage=0.03,beta=0.5");
  EXPECT_EQ(f.learning_rate, 0.1);
  EXPECT_EQ(f.learning_rate_power, -0.25);
  EXPECT_EQ(f.initial_accumulator, 0.0);
  EXPECT_EQ(f.l1, 0.01);
  EXPECT_EQ(f.l2, 0.02);
  EXPECT_EQ(f.l2_shrinkage, 0.03);
  EXPECT_EQ(f.beta, 0.5);
  OptimizerConfig k2 = OptimizerConfig::parse(
      "ftrl:learning_rate=0.2,learning_rate_power=0,initial_accumulator_value=0.3,l1_regularization_strength=0.4,"
      "l2_regularization_strength=0.5,l2_shrinkage_regularization_strength=0.6");
  EXPECT_EQ(k2.learning_rate, 0.2);
  EXPECT_EQ(k2.learning_rate_power, 0.0);
  EXPECT_EQ(k2.initial_accumulator, 0.3);
  EXPECT_EQ(k2.l1, 0.4);
  EXPECT_EQ(k2.l2, 0.5);
  EXPECT_EQ(k2.l2_shrinkage, 0.6);
}

TEST(OptimizerConfigTest, ToStringRoundTrips) {
  for (const char* spec : {"sgd:lr=0.1", "momentum:lr=0.3,momentum=0.7,nesterov=1",
                           "adagrad:lr=0.2,initial_accumulator=0.3,epsilon=1e-5",
                           "adam:lr=0.001,beta1=0.85,beta2=0.995,epsilon=1e-8",
                           "rmsprop:lr=0.004,rho=0.8,epsilon=1e-6",
                           "ftrl:lr=0.05,initial_accumulator=0.2,lr_power=-0.7,l1=0.001,l2=0.25,l2_shrinkage=0.125,"
                           "beta=0.3"}) {
    OptimizerConfig c = OptimizerConfig::parse(spec);
    std::string text = to_string(c);
    OptimizerConfig back = OptimizerConfig::parse(text);
    EXPECT_EQ(to_string(back), text) << spec;
    EXPECT_EQ(back.kind, c.kind);
    EXPECT_EQ(back.learning_rate, c.learning_rate);
    EXPECT_EQ(back.momentum, c.momentum);
    EXPECT_EQ(back.nesterov, c.nesterov);
    EXPECT_EQ(back.initial_accumulator, c.initial_accumulator);
    EXPECT_EQ(back.beta1, c.beta1);
    EXPECT_EQ(back.beta2, c.beta2);
    EXPECT_EQ(back.epsilon, c.epsilon);
    EXPECT_EQ(back.rho, c.rho);
    EXPECT_EQ(back.learning_rate_power, c.learning_rate_power);
    EXPECT_EQ(back.l1, c.l1);
    EXPECT_EQ(back.l2, c.l2);
    EXPECT_EQ(back.l2_shrinkage, c.l2_shrinkage);
    EXPECT_EQ(back.beta, c.beta);
  }
  EXPECT_EQ(to_string(OptimizerConfig::parse("ftrl")),
            "ftrl:lr=0.001,initial_accumulator=0.1,lr_power=-0.5,l1=0,l2=0,l2_shrinkage=0,beta=0");
  EXPECT_EQ(to_string(OptimizerConfig::parse("sgd:lr=0.5")), "sgd:lr=0.5");
  EXPECT_EQ(to_string(OptimizerConfig::parse("adam")), "adam:lr=0.001,beta1=0.9,beta2=0.999,epsilon=1e-07");
  EXPECT_EQ(to_string(OptimizerConfig::parse("momentum:nesterov=1")), "momentum:lr=0.01,momentum=0.9,nesterov=1");
}

TEST(OptimizerConfigTest, RejectsMalformedSpecsNamingTheCulprit) {
  struct Case {
    const char* spec;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {"", "''"},
           {"adamx:lr=1", "'adamx'"},
           {"adam:", "nothing after ':'"},
           {"adam:lr", "'lr' is not KEY=VALUE"},
           {"adam:=1", "'=1' is not KEY=VALUE"},
           {"adam:lr=0.1,,beta1=0.9", "'' is not KEY=VALUE"},
           {"adam:lr=0.1,", "'' is not KEY=VALUE"},
           {"adam:alpha=0.1", "unknown key 'alpha'"},
           {"adam:LR=0.1", "unknown key 'LR'"},
           {"adam: lr=0.1", "unknown key ' lr'"},
           {"sgd:momentum=0.9", "unknown key 'momentum' for sgd (accepted: lr)"},
           {"sgd:nesterov=1", "unknown key 'nesterov'"},
           {"momentum:beta1=0.9", "accepted: lr, momentum, nesterov"},
           {"rmsprop:momentum=0.9", "unknown key 'momentum' for rmsprop"},
           {"adagrad:rho=0.9", "unknown key 'rho'"},
           {"adagrad:l1=0.1", "unknown key 'l1' for adagrad"},
           {"ftrl:epsilon=1e-7", "unknown key 'epsilon' for ftrl (accepted: lr, initial_accumulator, lr_power, l1, l2, "
                                 "l2_shrinkage, beta)"},
           {"ftrl:l1=0.1,l1_regularization_strength=0.2", "given twice"},
           {"ftrl:l1=x", "'x'"},
           {"adam:lr=0.1,learning_rate=0.2", "given twice"},
           {"adam:beta1=0.9,beta1=0.8", "given twice"},
           {"adam:lr=abc", "'abc'"},
           {"adam:lr=", "lr"},
           {"adam:lr=0.1x", "'0.1x'"},
           {"adam:lr= 0.1", "' 0.1'"},
           {"adam:lr=inf", "'inf'"},
           {"adam:lr=nan", "'nan'"},
           {"adam:lr=1e999", "'1e999'"},
           {"momentum:nesterov=maybe", "'maybe'"},
       }) {
    SCOPED_TRACE(c.spec);
    std::string msg = config_error([&] { OptimizerConfig::parse(c.spec); });
    EXPECT_TRUE(Contains(msg, c.needle));
  }
}

TEST(OptimizerConfigTest, ValidateRejectsOutOfRangeValues) {
  struct Case {
    const char* spec;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {"sgd:lr=0", "learning_rate = 0"},
           {"sgd:lr=-0.1", "learning_rate = -0.1 is out of range (expected a finite number > 0)"},
           {"momentum:momentum=-0.1", "momentum = -0.1"},
           {"momentum:momentum=1.5", "expected [0, 1]"},
           {"adagrad:initial_accumulator=-1", "initial_accumulator = -1"},
           {"adagrad:epsilon=0", "epsilon = 0"},
           {"adam:beta1=1", "beta1 = 1 is out of range (expected [0, 1))"},
           {"adam:beta1=-0.5", "beta1"},
           {"adam:beta2=1.5", "beta2"},
           {"adam:epsilon=-1e-7", "epsilon"},
           {"rmsprop:rho=1", "rho = 1"},
           {"rmsprop:epsilon=0", "epsilon"},
           {"ftrl:lr_power=0.5", "lr_power = 0.5 is out of range (expected a finite number <= 0)"},
           {"ftrl:initial_accumulator=-0.1", "initial_accumulator = -0.1"},
           {"ftrl:l1=-1", "l1 = -1 is out of range (expected a finite number >= 0)"},
           {"ftrl:l2=-0.5", "l2 = -0.5"},
           {"ftrl:l2_shrinkage=-2", "l2_shrinkage = -2"},
           {"ftrl:beta=-0.1", "beta = -0.1"},
           {"ftrl:lr=0", "learning_rate = 0"},
       }) {
    SCOPED_TRACE(c.spec);
    std::string msg = config_error([&] { OptimizerConfig::parse(c.spec); });
    EXPECT_TRUE(Contains(msg, c.needle));
  }
  // Boundary values that are valid.
  EXPECT_NO_THROW(OptimizerConfig::parse("momentum:momentum=0"));
  EXPECT_NO_THROW(OptimizerConfig::parse("momentum:momentum=1"));
  EXPECT_NO_THROW(OptimizerConfig::parse("adam:beta1=0,beta2=0"));
  EXPECT_NO_THROW(OptimizerConfig::parse("rmsprop:rho=0"));
  EXPECT_NO_THROW(OptimizerConfig::parse("ftrl:lr_power=0,initial_accumulator=0,l1=0,l2=0,l2_shrinkage=0,beta=0"));

  // Direct validate(): unset learning rate, NaN, nesterov on a non-momentum optimizer, and fields
  // of other optimizers are ignored.
  OptimizerConfig c;
  EXPECT_TRUE(Contains(config_error([&] { c.validate(); }), "learning_rate = 0"));
  c.learning_rate = std::nan("");
  EXPECT_TRUE(Contains(config_error([&] { c.validate(); }), "learning_rate = nan"));
  c = config_for(OptimizerKind::kAdam);
  c.nesterov = true;
  EXPECT_TRUE(Contains(config_error([&] { c.validate(); }), "nesterov applies only"));
  c = config_for(OptimizerKind::kSgd);
  c.beta1 = 7;
  c.epsilon = -1;
  EXPECT_NO_THROW(c.validate());
  c = config_for(OptimizerKind::kAdam);
  c.epsilon = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(Contains(config_error([&] { c.validate(); }), "epsilon = inf"));
  c = config_for(OptimizerKind::kFtrl);
  c.l1 = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(Contains(config_error([&] { c.validate(); }), "l1 = inf"));
  c = config_for(OptimizerKind::kFtrl);
  c.learning_rate_power = std::nan("");
  EXPECT_TRUE(Contains(config_error([&] { c.validate(); }), "lr_power = nan"));
  c = config_for(OptimizerKind::kAdam);
  c.l1 = -1;  // an FTRL field: ignored by Adam
  EXPECT_NO_THROW(c.validate());
}

// ---- hand-computed updates ---------------------------------------------------------------------
// The inputs of the exact cases are powers of two and short binary fractions, so every
// intermediate is exactly representable and the expected values are exact in float and double.

template <typename T>
class HandComputedTest : public ::testing::Test {};
using Floats = ::testing::Types<float, double>;
TYPED_TEST_SUITE(HandComputedTest, Floats);

TYPED_TEST(HandComputedTest, SgdExact) {
  using T = TypeParam;
  OptimizerConfig c = OptimizerConfig::parse("sgd:lr=0.5");
  std::vector<T> w = {1, -2, 0.25};
  const std::vector<T> g = {2, 1, -0.5};
  // w - g*0.5 = {1-1, -2-0.5, 0.25+0.25} = {0, -2.5, 0.5}
  apply_dense(c, 1, w.data(), nullptr, g.data(), w.size());
  EXPECT_EQ(w, (std::vector<T>{0, -2.5, 0.5}));
  // again: {0-1, -2.5-0.5, 0.5+0.25} = {-1, -3, 0.75}
  apply_dense(c, 2, w.data(), nullptr, g.data(), w.size());
  EXPECT_EQ(w, (std::vector<T>{-1, -3, 0.75}));
}

TYPED_TEST(HandComputedTest, MomentumExact) {
  using T = TypeParam;
  OptimizerConfig c = OptimizerConfig::parse("momentum:lr=0.5,momentum=0.5");
  State<T> st(c, {1});
  auto step = [&](std::int64_t t, T g) { apply_dense(c, t, st.var.data(), st.sp(), &g, 1); };
  // a = 0*0.5 - 1*0.5 = -0.5;            w = 1 + (-0.5) = 0.5
  step(1, 1);
  EXPECT_EQ(st.slots[0][0], T(-0.5));
  EXPECT_EQ(st.var[0], T(0.5));
  // a = -0.5*0.5 - 1*0.5 = -0.75;        w = 0.5 - 0.75 = -0.25
  step(2, 1);
  EXPECT_EQ(st.slots[0][0], T(-0.75));
  EXPECT_EQ(st.var[0], T(-0.25));
  // a = -0.75*0.5 - (-2)*0.5 = 0.625;    w = -0.25 + 0.625 = 0.375
  step(3, -2);
  EXPECT_EQ(st.slots[0][0], T(0.625));
  EXPECT_EQ(st.var[0], T(0.375));
}

TYPED_TEST(HandComputedTest, NesterovMomentumExact) {
  using T = TypeParam;
  OptimizerConfig c = OptimizerConfig::parse("momentum:lr=0.5,momentum=0.5,nesterov=1");
  State<T> st(c, {1});
  auto step = [&](std::int64_t t, T g) { apply_dense(c, t, st.var.data(), st.sp(), &g, 1); };
  // a = 0*0.5 - 1*0.5 = -0.5;       w = 1 + (-0.5*0.5 - 1*0.5) = 1 - 0.75 = 0.25
  step(1, 1);
  EXPECT_EQ(st.slots[0][0], T(-0.5));
  EXPECT_EQ(st.var[0], T(0.25));
  // a = -0.25 - 0.5 = -0.75;        w = 0.25 + (-0.75*0.5 - 0.5) = 0.25 - 0.875 = -0.625
  step(2, 1);
  EXPECT_EQ(st.slots[0][0], T(-0.75));
  EXPECT_EQ(st.var[0], T(-0.625));
}

TYPED_TEST(HandComputedTest, AdagradExactWhenTheRootIsExact) {
  using T = TypeParam;
  // initial accumulator 0.75, g = 0.5: a = 0.75 + 0.25 = 1, sqrt(a) = 1; with epsilon 2^-20 (exact
  // in float) w = 1 - (0.5*0.5)/(1 + 2^-20) = 1 - 0.25/(1+2^-20). Only that quotient rounds; the
  // expectation performs the same single division in T.
  OptimizerConfig c = OptimizerConfig::parse("adagrad:lr=0.5,initial_accumulator=0.75,epsilon=9.5367431640625e-07");
  State<T> st(c, {1});
  const T g = 0.5;
  apply_dense(c, 1, st.var.data(), st.sp(), &g, 1);
  EXPECT_EQ(st.slots[0][0], T(1));
  EXPECT_EQ(st.var[0], T(1) - T(0.25) / (T(1) + T(9.5367431640625e-07)));
}

// Adagrad, Adam and RMSprop with Keras defaults need square roots; the expected values below were
// computed by hand (in double) and compared with a tolerance well above double rounding and well
// below the size of the update. Float runs use a float-sized tolerance.
template <typename T>
T tolerance() {
  return std::is_same_v<T, float> ? T(2e-7) : T(1e-15);
}

TYPED_TEST(HandComputedTest, AdagradTwoSteps) {
  using T = TypeParam;
  OptimizerConfig c = OptimizerConfig::parse("adagrad:lr=0.1");  // initial 0.1, epsilon 1e-7
  State<T> st(c, {1});
  T g = 0.5;
  // a = 0.1 + 0.25 = 0.35, sqrt(a) = 0.5916079783099616
  // w = 1 - 0.05 / (0.5916079783099616 + 1e-7) = 1 - 0.0845154111871398 = 0.9154845888128602
  apply_dense(c, 1, st.var.data(), st.sp(), &g, 1);
  EXPECT_NEAR(st.slots[0][0], 0.35, 2 * tolerance<T>());
  EXPECT_NEAR(st.var[0], 0.9154845888128602, 4 * tolerance<T>());
  // a = 0.35 + 0.0625 = 0.4125, sqrt(a) = 0.6422616289332564
  // w = 0.9154845888128602 + 0.025 / (0.6422616289332564 + 1e-7) = 0.9544095299603312
  g = -0.25;
  apply_dense(c, 2, st.var.data(), st.sp(), &g, 1);
  EXPECT_NEAR(st.slots[0][0], 0.4125, 2 * tolerance<T>());
  EXPECT_NEAR(st.var[0], 0.9544095299603312, 4 * tolerance<T>());
}

TYPED_TEST(HandComputedTest, AdamTwoStepsWithEpsilonHat) {
  using T = TypeParam;
  OptimizerConfig c = OptimizerConfig::parse("adam");  // lr 1e-3, beta1 0.9, beta2 0.999, eps 1e-7
  State<T> st(c, {1});
  T g = 0.5;
  // t = 1: alpha = 0.001 * sqrt(1 - 0.999) / (1 - 0.9) = 0.001 * 0.0316227766 / 0.1 = 3.1622776601683816e-4
  //        m = 0 + (0.5 - 0)*0.1 = 0.05;   v = 0 + (0.25 - 0)*0.001 = 2.5e-4, sqrt(v) = 0.0158113883
  //        w = 1 - (0.05*alpha) / (0.0158113883 + 1e-7) = 1 - 9.999936754846795e-4 = 0.9990000063245154
  apply_dense(c, 1, st.var.data(), st.sp(), &g, 1);
  EXPECT_NEAR(st.slots[0][0], 0.05, tolerance<T>());
  EXPECT_NEAR(st.slots[1][0], 2.5e-4, tolerance<T>());
  EXPECT_NEAR(st.var[0], 0.9990000063245154, 4 * tolerance<T>());
  // Algorithm 1 of the paper (epsilon added to sqrt(v_hat) = 0.5) would give
  // 1 - 0.001*0.5/(0.5 + 1e-7) = 0.99900000019999996: Keras' epsilon hat differs by 6.3e-9.
  if (std::is_same_v<T, double>) {
    EXPECT_GT(std::fabs(double(st.var[0]) - 0.99900000019999996), 6e-9);
  }
  // t = 2: alpha = 0.001 * sqrt(1 - 0.999^2) / (1 - 0.9^2) = 2.3531672532745276e-4
  //        m = 0.05 + (-0.25 - 0.05)*0.1 = 0.02;   v = 2.5e-4 + (0.0625 - 2.5e-4)*0.001 = 3.1225e-4
  //        sqrt(v) = 0.017670597047072297
  //        w = 0.9990000063245154 - (0.02*alpha)/(0.017670597047072297 + 1e-7)
  //          = 0.9990000063245154 - 2.663355324361019e-4 = 0.9987336707920792
  g = -0.25;
  apply_dense(c, 2, st.var.data(), st.sp(), &g, 1);
  EXPECT_NEAR(st.slots[0][0], 0.02, tolerance<T>());
  EXPECT_NEAR(st.slots[1][0], 3.1225e-4, tolerance<T>());
  EXPECT_NEAR(st.var[0], 0.9987336707920792, 4 * tolerance<T>());
}

TYPED_TEST(HandComputedTest, RmsPropTwoSteps) {
  using T = TypeParam;
  OptimizerConfig c = OptimizerConfig::parse("rmsprop");  // lr 1e-3, rho 0.9, eps 1e-7
  State<T> st(c, {1});
  T g = 0.5;
  // r = 0*0.9 + 0.25*0.1 = 0.025, sqrt(r) = 0.15811388300841894
  // w = 1 - 0.0005 / (0.15811388300841894 + 1e-7) = 1 - 0.0031622756601696 = 0.9968377243398303
  apply_dense(c, 1, st.var.data(), st.sp(), &g, 1);
  EXPECT_NEAR(st.slots[0][0], 0.025, tolerance<T>());
  EXPECT_NEAR(st.var[0], 0.9968377243398303, 4 * tolerance<T>());
  // r = 0.025*0.9 + 0.0625*0.1 = 0.02875, sqrt(r) = 0.16955824957813168
  // w = 0.9968377243398303 + 0.00025 / (0.16955824957813168 + 1e-7) = 0.9983121430318146
  g = -0.25;
  apply_dense(c, 2, st.var.data(), st.sp(), &g, 1);
  EXPECT_NEAR(st.slots[0][0], 0.02875, tolerance<T>());
  EXPECT_NEAR(st.var[0], 0.9983121430318146, 4 * tolerance<T>());
}

TEST(OptimizerApplyTest, StepMustBePositiveAndEmptyIsANoOp) {
  OptimizerConfig c = config_for(OptimizerKind::kAdam);
  float w = 1, m = 0, v = 0, g = 1;
  float* slots[] = {&m, &v};
  EXPECT_THROW(apply_dense(c, 0, &w, slots, &g, 1), Error);
  EXPECT_THROW(apply_dense_reference(c, -1, &w, slots, &g, 1), Error);
  EXPECT_THROW(apply_sparse_rows(c, 0, &w, slots, 1, nullptr, &g, 0), Error);
  EXPECT_EQ(w, 1.0f);
  apply_dense(c, 1, static_cast<float*>(nullptr), nullptr, nullptr, 0);
  apply_sparse_rows(c, 1, static_cast<double*>(nullptr), nullptr, 4, nullptr, nullptr, 0);
  // Missing slot arrays are a programming error, reported rather than dereferenced.
  EXPECT_THROW(apply_dense(c, 1, &w, nullptr, &g, 1), Error);
}

// ---- Eigen path == scalar reference, bit for bit -----------------------------------------------

struct Variant {
  OptimizerKind kind;
  bool nesterov;
};
const Variant kVariants[] = {{OptimizerKind::kSgd, false},     {OptimizerKind::kMomentum, false},
                             {OptimizerKind::kMomentum, true}, {OptimizerKind::kAdagrad, false},
                             {OptimizerKind::kAdam, false},    {OptimizerKind::kRmsProp, false},
                             {OptimizerKind::kFtrl, false}};

template <typename T>
class BitExactTest : public ::testing::Test {};
TYPED_TEST_SUITE(BitExactTest, Floats);

TYPED_TEST(BitExactTest, EigenEqualsReferenceForAnySizeAndAlignment) {
  using T = TypeParam;
  for (const Variant& variant : kVariants) {
    const OptimizerConfig c = config_for(variant.kind, variant.nesterov);
    for (std::size_t n : {0, 1, 7, 1000, 4097}) {
      // offset 1 starts the arrays one element past an allocation, so Eigen peels unaligned
      // elements before its packet loop.
      for (std::size_t offset : {0, 1}) {
        SCOPED_TRACE(to_string(c) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset));
        State<T> eigen(c, random_vector<T>(1, n + offset));
        randomize_slots(variant.kind, eigen, 2);
        State<T> ref(eigen);
        for (std::int64_t step = 1; step <= 5; ++step) {
          // Gradients of varied magnitude, with zeros and denormals mixed in.
          std::vector<T> g = random_vector<T>(10 + step, n + offset, step == 3 ? 1e3 : 1.0);
          for (std::size_t i = 5; i < g.size(); i += 11) g[i] = T(0);
          for (std::size_t i = 4; i < g.size(); i += 19) g[i] = std::numeric_limits<T>::denorm_min();
          std::vector<T*> es, rs;
          for (auto& s : eigen.slots) es.push_back(s.data() + offset);
          for (auto& s : ref.slots) rs.push_back(s.data() + offset);
          apply_dense(c, step, eigen.var.data() + offset, es.data(), g.data() + offset, n);
          apply_dense_reference(c, step, ref.var.data() + offset, rs.data(), g.data() + offset, n);
          ASSERT_TRUE(StatesBitEqual(eigen, ref)) << "step " << step;
        }
        // The update did something (guards against a silently skipped apply).
        if (n > 0) {
          EXPECT_FALSE(BitEqual(eigen.var, random_vector<T>(1, n + offset)));
        }
      }
    }
  }
}

// The property distributed runs rely on: splitting a variable into shards (at any element) and
// updating each shard separately gives the same bits as updating it whole.
TYPED_TEST(BitExactTest, SplittingTheVariableDoesNotChangeResults) {
  using T = TypeParam;
  const std::size_t n = 4097;
  for (const Variant& variant : kVariants) {
    const OptimizerConfig c = config_for(variant.kind, variant.nesterov);
    SCOPED_TRACE(to_string(c));
    State<T> whole(c, random_vector<T>(3, n));
    randomize_slots(variant.kind, whole, 4);
    State<T> split(whole);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const std::vector<T> g = random_vector<T>(20 + step, n);
      apply_dense(c, step, whole.var.data(), whole.sp(), g.data(), n);
      const std::size_t cuts[] = {0, 3, 1000, 1001, 2500, n};
      for (std::size_t k = 0; k + 1 < std::size(cuts); ++k) {
        std::vector<T*> s;
        for (auto& slot : split.slots) s.push_back(slot.data() + cuts[k]);
        apply_dense(c, step, split.var.data() + cuts[k], s.data(), g.data() + cuts[k], cuts[k + 1] - cuts[k]);
      }
      ASSERT_TRUE(StatesBitEqual(whole, split)) << "step " << step;
    }
  }
}

// ---- sparse rows -------------------------------------------------------------------------------

template <typename T>
class SparseTest : public ::testing::Test {};
TYPED_TEST_SUITE(SparseTest, Floats);

// Expected result of apply_sparse_rows: for each distinct row, sum its gradients in order of
// appearance with a plain loop, then apply_dense to that row alone.
template <typename T>
void expected_sparse(const OptimizerConfig& c, std::int64_t step, State<T>& st, std::size_t row_elems,
                     const std::vector<std::int64_t>& rows, const std::vector<T>& grads) {
  std::vector<std::int64_t> distinct;
  for (std::int64_t r : rows)
    if (std::find(distinct.begin(), distinct.end(), r) == distinct.end()) distinct.push_back(r);
  for (std::int64_t r : distinct) {
    std::vector<T> sum;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] != r) continue;
      if (sum.empty()) {
        sum.assign(grads.begin() + i * row_elems, grads.begin() + (i + 1) * row_elems);
      } else {
        for (std::size_t e = 0; e < row_elems; ++e) sum[e] = sum[e] + grads[i * row_elems + e];
      }
    }
    const std::size_t off = static_cast<std::size_t>(r) * row_elems;
    std::vector<T*> s;
    for (auto& slot : st.slots) s.push_back(slot.data() + off);
    apply_dense(c, step, st.var.data() + off, s.data(), sum.data(), row_elems);
  }
}

TYPED_TEST(SparseTest, DuplicatesAreSummedFirstAndOtherRowsUntouched) {
  using T = TypeParam;
  const std::size_t num_var_rows = 10;
  const std::vector<std::vector<std::int64_t>> row_lists = {
      {7, 2, 7, 0, 2, 7},  // duplicates, unsorted
      {1, 4, 9},           // sorted unique: the no-scratch fast path
      {9, 1, 4},           // unique but unsorted
      {3, 3, 3, 3},        // one row, four times
      {0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
  };
  for (const Variant& variant : kVariants) {
    const OptimizerConfig c = config_for(variant.kind, variant.nesterov);
    for (std::size_t row_elems : {1, 5, 17}) {
      for (const auto& rows : row_lists) {
        SCOPED_TRACE(to_string(c) + " row_elems=" + std::to_string(row_elems) + " rows=" +
                     std::to_string(rows.size()) + " first=" + std::to_string(rows[0]));
        State<T> sparse(c, random_vector<T>(5, num_var_rows * row_elems));
        randomize_slots(variant.kind, sparse, 6);
        const State<T> before(sparse);
        State<T> expected(sparse);
        for (std::int64_t step = 1; step <= 3; ++step) {
          const std::vector<T> grads = random_vector<T>(30 + step, rows.size() * row_elems);
          apply_sparse_rows(c, step, sparse.var.data(), sparse.sp(), row_elems, rows.data(),
                            grads.data(), rows.size());
          expected_sparse(c, step, expected, row_elems, rows, grads);
          ASSERT_TRUE(StatesBitEqual(sparse, expected)) << "step " << step;
        }
        // Untouched rows: value and slots identical to before, bit for bit.
        for (std::size_t r = 0; r < num_var_rows; ++r) {
          if (std::find(rows.begin(), rows.end(), static_cast<std::int64_t>(r)) != rows.end()) continue;
          for (std::size_t e = 0; e < row_elems; ++e) {
            const std::size_t i = r * row_elems + e;
            EXPECT_EQ(std::memcmp(&sparse.var[i], &before.var[i], sizeof(T)), 0) << "row " << r;
            for (std::size_t s = 0; s < sparse.slots.size(); ++s)
              EXPECT_EQ(std::memcmp(&sparse.slots[s][i], &before.slots[s][i], sizeof(T)), 0)
                  << "row " << r << " slot " << s;
          }
        }
      }
    }
  }
}

TYPED_TEST(SparseTest, SummationOrderIsOrderOfAppearance) {
  using T = TypeParam;
  // Row 0 receives 1, then h = 2^-p (half an ulp of 1), then h again. In order of appearance,
  // (1 + h) + h = 1 + h = 1 (each addition is a tie that rounds to even), so SGD with lr 1 gives
  // w = 0 - 1 = -1. Adding the two h first would give 1 + 2h, which is representable.
  const int p = std::numeric_limits<T>::digits;
  const T half_ulp = std::ldexp(T(1), -p);
  OptimizerConfig c = OptimizerConfig::parse("sgd:lr=1");
  std::vector<T> w = {0};
  const std::vector<std::int64_t> rows = {0, 0, 0};
  const std::vector<T> g = {1, half_ulp, half_ulp};
  apply_sparse_rows(c, 1, w.data(), nullptr, 1, rows.data(), g.data(), rows.size());
  EXPECT_EQ(w[0], T(-1));
  // Listing the small ones first changes the sum: (2^-p + 2^-p) + 1 = 1 + 2^(1-p).
  std::vector<T> w2 = {0};
  const std::vector<T> g2 = {half_ulp, half_ulp, 1};
  apply_sparse_rows(c, 1, w2.data(), nullptr, 1, rows.data(), g2.data(), rows.size());
  EXPECT_EQ(w2[0], -(T(1) + 2 * half_ulp));
}

// ---- FTRL ---------------------------------------------------------------------------------------
// TF's ApplyFtrl / ApplyFtrlV2 kernels (what Keras' Ftrl calls), transcribed in double:
//   gs = g + 2*l2_shrinkage*w;  na = a + g*g;  z += gs - (na^p - a^p)/lr*w   (p = -lr_power)
//   w = |z| > l1 ? (sign(z)*l1 - z) / (na^p/lr + 2*l2') : 0;  a = na;   l2' = l2 + beta/(2*lr)
struct FtrlDouble {
  double w, a, z;
};
void ftrl_double_step(const OptimizerConfig& c, FtrlDouble& s, double g) {
  const double p = -c.learning_rate_power;
  auto pw = [&](double x) { return c.learning_rate_power == -0.5 ? std::sqrt(x) : std::pow(x, p); };
  const double l2 = c.l2 + c.beta / (2 * c.learning_rate);
  const double gs = g + 2 * c.l2_shrinkage * s.w;
  const double na = s.a + g * g;
  s.z += gs - (pw(na) - pw(s.a)) / c.learning_rate * s.w;
  s.w = std::fabs(s.z) > c.l1 ? (std::copysign(c.l1, s.z) - s.z) / (pw(na) / c.learning_rate + 2 * l2) : 0.0;
  s.a = na;
}

const char* const kFtrlSpecs[] = {
    "ftrl",
    "ftrl:lr=0.1",
    "ftrl:lr=0.1,l1=0.3",
    "ftrl:lr=0.05,l1=0.2,l2=0.01,l2_shrinkage=0.02,beta=0.1",
    "ftrl:lr=0.1,lr_power=-0.3,l2=0.05",
    "ftrl:lr=0.1,lr_power=0,l1=0.4",
    "ftrl:lr=0.2,lr_power=-1,initial_accumulator=0.5,l2_shrinkage=0.1",
    "ftrl:lr=0.1,initial_accumulator=0,beta=1",
};

TYPED_TEST(HandComputedTest, FtrlExact) {
  using T = TypeParam;
  // Accumulator 0, g = 0.5, w = 1, lr 0.5: na = 0.25, sqrt(na) = 0.5, sqrt(0) = 0,
  // z = 0 + 0.5 - ((0.5 - 0)/0.5)*1 = -0.5.
  struct Case {
    const char* spec;
    T w, z;
  };
  for (const Case& k : std::vector<Case>{
           {"ftrl:lr=0.5,initial_accumulator=0", T(0.5), T(-0.5)},  // w = 0.5 / (0.5/0.5)
           // |z| > l1: w = (-0.25 + 0.5) / (1 + 2*0.5) = 0.125
           {"ftrl:lr=0.5,initial_accumulator=0,l1=0.25,l2=0.5", T(0.125), T(-0.5)},
           // |z| <= l1: the weight is exactly 0 (L1 sparsity)
           {"ftrl:lr=0.5,initial_accumulator=0,l1=1", T(0), T(-0.5)},
           // beta 0.5 adds 0.5/(2*0.5) = 0.5 to l2: w = 0.5 / (1 + 1) = 0.25
           {"ftrl:lr=0.5,initial_accumulator=0,beta=0.5", T(0.25), T(-0.5)},
           // shrinkage 0.5: gs = 0.5 + 2*0.5*1 = 1.5, z = 1.5 - 1 = 0.5, w = -0.5 / 1
           {"ftrl:lr=0.5,initial_accumulator=0,l2_shrinkage=0.5", T(-0.5), T(0.5)},
           // lr_power 0: na^0 - a^0 = 0, z = 0.5, w = -0.5 / (1/0.5) = -0.25
           {"ftrl:lr=0.5,initial_accumulator=0,lr_power=0", T(-0.25), T(0.5)},
       }) {
    SCOPED_TRACE(k.spec);
    const OptimizerConfig c = OptimizerConfig::parse(k.spec);
    for (bool reference : {false, true}) {
      State<T> st(c, {1});
      const T g = 0.5;
      if (reference)
        apply_dense_reference(c, 1, st.var.data(), st.sp(), &g, 1);
      else
        apply_dense(c, 1, st.var.data(), st.sp(), &g, 1);
      EXPECT_EQ(st.var[0], k.w);
      EXPECT_EQ(st.slots[1][0], k.z);
      EXPECT_EQ(st.slots[0][0], T(0.25));  // the accumulator takes g*g, not gs*gs
    }
  }
}

// Several steps of every apply path against the double transcription of TF's kernel, on random
// data, for Keras' defaults and for l1 > 0 (exact zeros), l2, l2_shrinkage, beta and other powers.
TYPED_TEST(HandComputedTest, FtrlMatchesTheDoubleReference) {
  using T = TypeParam;
  const std::size_t n = 257;
  const double rel = std::is_same_v<T, float> ? 2e-4 : 1e-10;
  for (const char* spec : kFtrlSpecs) {
    SCOPED_TRACE(spec);
    const OptimizerConfig c = OptimizerConfig::parse(spec);
    State<T> dense(c, random_vector<T>(40, n));
    State<T> reference(dense);
    State<T> sparse(dense);
    std::vector<FtrlDouble> expect(n);
    for (std::size_t i = 0; i < n; ++i)
      expect[i] = {static_cast<double>(dense.var[i]), static_cast<double>(dense.slots[0][i]), 0.0};
    std::vector<std::int64_t> rows(n);
    for (std::size_t i = 0; i < n; ++i) rows[i] = static_cast<std::int64_t>(n - 1 - i);  // unsorted, unique
    for (std::int64_t step = 1; step <= 6; ++step) {
      const std::vector<T> g = random_vector<T>(50 + step, n, 0.5);
      apply_dense(c, step, dense.var.data(), dense.sp(), g.data(), n);
      apply_dense_reference(c, step, reference.var.data(), reference.sp(), g.data(), n);
      std::vector<T> reversed(g.rbegin(), g.rend());
      apply_sparse_rows(c, step, sparse.var.data(), sparse.sp(), 1, rows.data(), reversed.data(), n);
      for (std::size_t i = 0; i < n; ++i) ftrl_double_step(c, expect[i], static_cast<double>(g[i]));
    }
    ASSERT_TRUE(StatesBitEqual(dense, reference));
    ASSERT_TRUE(StatesBitEqual(dense, sparse));
    std::size_t zeros = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const FtrlDouble& e = expect[i];
      EXPECT_NEAR(dense.var[i], e.w, rel * (1 + std::fabs(e.w))) << "w " << i;
      EXPECT_NEAR(dense.slots[0][i], e.a, rel * (1 + std::fabs(e.a))) << "accumulator " << i;
      EXPECT_NEAR(dense.slots[1][i], e.z, rel * (1 + std::fabs(e.z))) << "linear " << i;
      if (e.w == 0.0) {
        EXPECT_EQ(dense.var[i], T(0)) << i;  // L1 zeros are exact zeros
        ++zeros;
      }
    }
    if (c.l1 > 0) {
      EXPECT_GT(zeros, 0u) << "l1 > 0 should zero some weights";
      EXPECT_LT(zeros, n) << "l1 this large should not zero every weight";
    } else {
      EXPECT_EQ(zeros, 0u);
    }
  }
}

// The bit-exactness properties for non-default FTRL settings (pow instead of sqrt, shrinkage,
// l1), with denormal and zero accumulators.
TYPED_TEST(BitExactTest, FtrlVariantsEigenEqualsReferenceAndSplits) {
  using T = TypeParam;
  const std::size_t n = 4097;
  for (const char* spec : kFtrlSpecs) {
    SCOPED_TRACE(spec);
    const OptimizerConfig c = OptimizerConfig::parse(spec);
    State<T> eigen(c, random_vector<T>(60, n));
    randomize_slots(OptimizerKind::kFtrl, eigen, 61);
    State<T> ref(eigen);
    State<T> split(eigen);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const std::vector<T> g = random_vector<T>(70 + step, n);
      apply_dense(c, step, eigen.var.data(), eigen.sp(), g.data(), n);
      apply_dense_reference(c, step, ref.var.data(), ref.sp(), g.data(), n);
      const std::size_t cuts[] = {0, 1, 999, 2048, n};
      for (std::size_t k = 0; k + 1 < std::size(cuts); ++k) {
        std::vector<T*> s;
        for (auto& slot : split.slots) s.push_back(slot.data() + cuts[k]);
        apply_dense(c, step, split.var.data() + cuts[k], s.data(), g.data() + cuts[k], cuts[k + 1] - cuts[k]);
      }
      ASSERT_TRUE(StatesBitEqual(eigen, ref)) << "step " << step;
      ASSERT_TRUE(StatesBitEqual(eigen, split)) << "step " << step;
    }
  }
}

// ---- allocation ---------------------------------------------------------------------------------

TEST(OptimizerApplyTest, ApplyAllocatesNothing) {
  const OptimizerConfig c = config_for(OptimizerKind::kAdam);
  State<float> st(c, random_vector<float>(7, 64 * 8));
  const std::vector<float> g = random_vector<float>(8, 64 * 8);
  const std::vector<std::int64_t> rows = {5, 3, 5, 9, 0, 3};
  const std::vector<float> rg = random_vector<float>(9, rows.size() * 8);
  // Warm-up: the sparse path may grow its thread_local scratch once.
  apply_sparse_rows(c, 1, st.var.data(), st.sp(), 8, rows.data(), rg.data(), rows.size());

  // The counter itself works: a vector allocation while counting is seen.
  g_allocations = 0;
  g_count_allocations = true;
  {
    std::vector<float> probe(16);
    g_probe_sink = probe.data();  // escapes, so the allocation cannot be elided
  }
  g_count_allocations = false;
  ASSERT_GT(g_allocations.load(), 0);

  g_allocations = 0;
  g_count_allocations = true;
  apply_dense(c, 2, st.var.data(), st.sp(), g.data(), g.size());
  apply_sparse_rows(c, 3, st.var.data(), st.sp(), 8, rows.data(), rg.data(), rows.size());
  apply_sparse_rows(c, 4, st.var.data(), st.sp(), 8, rows.data(), rg.data(), 3);
  g_count_allocations = false;
  EXPECT_EQ(g_allocations.load(), 0);
}

}  // namespace
}  // namespace strata::ps
