// Optimizer updates for parameter-server shards. The rules and the floating-point contract are in
// include/strata/ps/optimizer.h; this file keeps implementations of each rule that must agree
// bit for bit: an Eigen one (vectorised, used by the PS; on x86 momentum, Adagrad, Adam and RMSprop
// run as one fused pass over Eigen's packets, fused_update) and a scalar loop (the test oracle).
//
// Why the Eigen path is written the way it is:
//   * Each statement is one coefficient-wise Eigen expression over Maps of the caller's memory, so
//     nothing is allocated and the operation order is the one written (Eigen does not reassociate).
//   * Adam and the others touch 3-4 arrays per statement and run 2-3 statements; running them over
//     the whole variable would stream it through memory once per statement. We walk the arrays in
//     4 KiB chunks instead and run every statement on a chunk while it is in L1. Chunking cannot
//     change results because every element is updated independently.
//   * EIGEN_FAST_MATH must be 0 (see the header): with Eigen 3.4's default, packet sqrt of float is
//     rsqrt + one Newton step, which differs from std::sqrt and would break bit-identity with the
//     scalar path. Every strata target that includes Eigen must agree on this macro, or the
//     inline psqrt specialisations would differ between translation units (ODR).

//   * a*b + c must not be contracted into an FMA: GCC contracts by default in C++ whenever the
//     target has FMA (-march=haswell or native, every aarch64), and it does so differently in the
//     scalar loop and in Eigen's packet code, so the two paths (and shards split at different
//     elements) would disagree in the last bit, which the bit-exactness tests catch
//     (docs/PERFORMANCE.md, "The native build, reproducibility"). Every strata target is built with
//     -ffp-contract=off -DSTRATA_FP_CONTRACT_OFF whatever STRATA_ARCH is (cmake/StrataArch.cmake;
//     the default, native, has FMA on most machines), and the check below turns a build that
//     lost the flag into a build error instead of silently irreproducible training.

#ifndef EIGEN_FAST_MATH
#define EIGEN_FAST_MATH 0
#endif
#if EIGEN_FAST_MATH
#error "strata/ps/optimizer.cc needs EIGEN_FAST_MATH=0 (exact vectorised sqrt); see optimizer.h"
#endif
#if (defined(__FMA__) || defined(__ARM_FEATURE_FMA)) && !defined(STRATA_FP_CONTRACT_OFF)
#error "FMA target: compile strata/ps/optimizer.cc with -ffp-contract=off -DSTRATA_FP_CONTRACT_OFF"
#endif

#include "strata/ps/optimizer.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>

#include "strata/common/error.h"
#include "strata/common/parse.h"

namespace strata::ps {
namespace {

constexpr OptimizerKind kAllKinds[] = {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                                       OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                                       OptimizerKind::kRmsProp, OptimizerKind::kFtrl};

// The shortest of %.15g..%.17g that reads back as the same double: messages show "0.1" as the
// user typed it, and to_string(config) still round-trips exactly through parse_double().
std::string format_double(double value) {
  char text[64];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

[[noreturn]] void bad_field(const OptimizerConfig& c, const char* field, double value,
                            const char* expected) {
  throw ConfigError(std::string("optimizer ") + to_string(c.kind) + ": " + field + " = " +
                    format_double(value) + " is out of range (expected " + expected + ")");
}

// ---- parameter keys ------------------------------------------------------------------------

enum class Key {
  kLr, kMomentum, kNesterov, kInitialAccumulator, kBeta1, kBeta2, kEpsilon, kRho,
  kLrPower, kL1, kL2, kL2Shrinkage, kBeta,
};
constexpr Key kAllKeys[] = {Key::kLr,    Key::kMomentum, Key::kNesterov, Key::kInitialAccumulator,
                            Key::kBeta1, Key::kBeta2,    Key::kEpsilon,  Key::kRho,
                            Key::kLrPower, Key::kL1,     Key::kL2,       Key::kL2Shrinkage,
                            Key::kBeta};

struct KeyName {
  const char* name;
  Key key;
};
// The first spelling of each key is the canonical one (to_string prints it); the others are the
// Keras argument names, accepted so that a TF user's habits work.
constexpr KeyName kKeyNames[] = {
    {"lr", Key::kLr},
    {"learning_rate", Key::kLr},
    {"momentum", Key::kMomentum},
    {"nesterov", Key::kNesterov},
    {"initial_accumulator", Key::kInitialAccumulator},
    {"initial_accumulator_value", Key::kInitialAccumulator},
    {"beta1", Key::kBeta1},
    {"beta_1", Key::kBeta1},
    {"beta2", Key::kBeta2},
    {"beta_2", Key::kBeta2},
    {"epsilon", Key::kEpsilon},
    {"rho", Key::kRho},
    {"lr_power", Key::kLrPower},
    {"learning_rate_power", Key::kLrPower},
    {"l1", Key::kL1},
    {"l1_regularization_strength", Key::kL1},
    {"l2", Key::kL2},
    {"l2_regularization_strength", Key::kL2},
    {"l2_shrinkage", Key::kL2Shrinkage},
    {"l2_shrinkage_regularization_strength", Key::kL2Shrinkage},
    {"beta", Key::kBeta},
};

bool key_applies(OptimizerKind kind, Key key) {
  switch (key) {
    case Key::kLr: return true;
    case Key::kMomentum:
    case Key::kNesterov: return kind == OptimizerKind::kMomentum;
    case Key::kInitialAccumulator: return kind == OptimizerKind::kAdagrad || kind == OptimizerKind::kFtrl;
    case Key::kBeta1:
    case Key::kBeta2: return kind == OptimizerKind::kAdam;
    case Key::kEpsilon:
      return kind == OptimizerKind::kAdagrad || kind == OptimizerKind::kAdam ||
             kind == OptimizerKind::kRmsProp;
    case Key::kRho: return kind == OptimizerKind::kRmsProp;
    case Key::kLrPower:
    case Key::kL1:
    case Key::kL2:
    case Key::kL2Shrinkage:
    case Key::kBeta: return kind == OptimizerKind::kFtrl;
  }
  return false;
}

const char* canonical_name(Key key) {
  for (const KeyName& k : kKeyNames)
    if (k.key == key) return k.name;
  return "?";
}

// "lr, momentum, nesterov": the canonical keys that apply to `kind`, for error messages.
std::string accepted_keys(OptimizerKind kind) {
  std::string out;
  for (Key key : kAllKeys) {
    if (!key_applies(kind, key)) continue;
    if (!out.empty()) out += ", ";
    out += canonical_name(key);
  }
  return out;
}

// ---- update rules --------------------------------------------------------------------------

// Scalar coefficients of one call, computed in T as TF's kernels compute them (hyper-parameters
// are first rounded to T, then combined), so the element loops only read them.
template <typename T>
struct Coefficients {
  OptimizerKind kind;
  bool nesterov;
  T lr, momentum, epsilon, rho, one_minus_rho, one_minus_beta1, one_minus_beta2, alpha;
  // FTRL: p = -learning_rate_power; ftrl_sqrt when p is 0.5 (TF's special case: sqrt, not pow);
  // ftrl_shrink when l2_shrinkage > 0 (ApplyFtrlV2; otherwise ApplyFtrl, gradient used as is).
  bool ftrl_sqrt, ftrl_shrink;
  T ftrl_p, l1, two_l2, two_l2_shrinkage;
};

template <typename T>
Coefficients<T> make_coefficients(const OptimizerConfig& cfg, std::int64_t step) {
  STRATA_CHECK(step >= 1, "optimizer step must be >= 1 (1-based count of applications), got ", step);
  Coefficients<T> c{};
  c.kind = cfg.kind;
  c.nesterov = cfg.nesterov;
  c.lr = static_cast<T>(cfg.learning_rate);
  c.momentum = static_cast<T>(cfg.momentum);
  c.epsilon = static_cast<T>(cfg.epsilon);
  c.rho = static_cast<T>(cfg.rho);
  c.one_minus_rho = T(1) - c.rho;
  const T beta1 = static_cast<T>(cfg.beta1);
  const T beta2 = static_cast<T>(cfg.beta2);
  c.one_minus_beta1 = T(1) - beta1;
  c.one_minus_beta2 = T(1) - beta2;
  if (cfg.kind == OptimizerKind::kAdam) {
    // TF: local_step = T(iterations + 1); beta_power = pow(beta, local_step);
    // alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power), evaluated left to right.
    const T t = static_cast<T>(step);
    const T beta1_power = std::pow(beta1, t);
    const T beta2_power = std::pow(beta2, t);
    c.alpha = c.lr * std::sqrt(T(1) - beta2_power) / (T(1) - beta1_power);
  }
  if (cfg.kind == OptimizerKind::kFtrl) {
    // Keras' Ftrl passes l2 + beta / (2 * lr) to the kernel as its l2 (in the variable's dtype);
    // the kernel then uses 2 * l2 and 2 * l2_shrinkage.
    const T lr_power = static_cast<T>(cfg.learning_rate_power);
    c.ftrl_sqrt = lr_power == T(-0.5);
    c.ftrl_p = -lr_power;
    c.ftrl_shrink = cfg.l2_shrinkage > 0.0;
    c.l1 = static_cast<T>(cfg.l1);
    const T l2 = static_cast<T>(cfg.l2) + static_cast<T>(cfg.beta) / (T(2) * c.lr);
    c.two_l2 = T(2) * l2;
    c.two_l2_shrinkage = T(2) * static_cast<T>(cfg.l2_shrinkage);
  }
  return c;
}

// sqrt of every element, correctly rounded, vectorised wherever the packet sqrt is the hardware's
// IEEE instruction. Eigen 3.4 marks packet sqrt as unavailable for AVX-512 when EIGEN_FAST_MATH is
// 0 (HasSqrt = EIGEN_FAST_MATH), although its psqrt is then plain vsqrtps/vsqrtpd, exactly as
// for SSE and AVX: with -march=native on an AVX-512 machine, `.sqrt()` makes the whole Adam,
// Adagrad and RMSprop statement scalar, far slower than with AVX2 (docs/PERFORMANCE.md, "The
// native build, reproducibility" has the rates).
// On x86 every psqrt Eigen has without EIGEN_FAST_MATH is that instruction, so this functor allows
// packets there; elsewhere it follows Eigen's own HasSqrt (as `.sqrt()` does).
template <typename T>
struct ExactSqrt {
  T operator()(const T& x) const { return std::sqrt(x); }
  template <typename Packet>
  Packet packetOp(const Packet& x) const { return Eigen::internal::psqrt(x); }
};

// x^p with std::pow, one element at a time in both paths: Eigen's packet pow is not std::pow to
// the bit, so it has no packet access (FTRL with learning_rate_power other than -0.5 only).
template <typename T>
struct ScalarPow {
  T p;
  T operator()(const T& x) const { return std::pow(x, p); }
};

// FTRL's new weight from the linear slot z and the denominator y:
//   |z| > l1 ? (sign(z)*l1 - z) / y : 0.
// A functor rather than Eigen's select(), which Eigen 3.4 evaluates one element at a time. The
// packet path takes sign(z)*l1 as l1 with z's sign bit: equal to the scalar form wherever the
// branch is taken (z is then non-zero and not NaN; l1 >= 0 has a clear sign bit), and a NaN z fails
// the comparison in both paths.
template <typename T>
struct FtrlWeight {
  T l1;
  T operator()(const T& z, const T& y) const { return std::abs(z) > l1 ? ((z > T(0) ? l1 : -l1) - z) / y : T(0); }
  template <typename Packet>
  Packet packetOp(const Packet& z, const Packet& y) const {
    using namespace Eigen::internal;
    const Packet l1p = pset1<Packet>(l1);
    const Packet signed_l1 = por(pand(z, pset1<Packet>(T(-0.0))), l1p);
    return pselect(pcmp_lt(l1p, pabs(z)), pdiv(psub(signed_l1, z), y), pzero(z));
  }
};

}  // namespace
}  // namespace strata::ps

namespace Eigen::internal {
template <typename T>
struct functor_traits<strata::ps::FtrlWeight<T>> {
  enum {
    Cost = 4 * NumTraits<T>::AddCost + scalar_div_cost<T, true>::value,
    PacketAccess = packet_traits<T>::Vectorizable && packet_traits<T>::HasDiv && packet_traits<T>::HasAbs &&
                   packet_traits<T>::HasCmp,
  };
};
template <typename T>
struct functor_traits<strata::ps::ExactSqrt<T>> {
  enum {
    Cost = functor_traits<scalar_sqrt_op<T>>::Cost,
#if defined(EIGEN_VECTORIZE_SSE2) && !EIGEN_FAST_MATH
    PacketAccess = packet_traits<T>::Vectorizable,
#else
    PacketAccess = packet_traits<T>::HasSqrt,
#endif
  };
};
}  // namespace Eigen::internal

namespace strata::ps {
namespace {

template <typename T>
using Vec = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// FTRL over one chunk, pw(x) = x^p, in blocks of kFtrlBlock elements so that pw(a + g*g), used
// twice, is computed once into a stack buffer (no allocation; sqrt and division dominate the
// cost). TF's kernel (x / y where |z| > l1, else 0) evaluates both sides of its select; so does
// FtrlWeight. Vectorised throughout when p is 0.5 (ExactSqrt, FtrlWeight); ScalarPow is scalar.
template <typename T, typename Pw>
void eigen_ftrl(const Coefficients<T>& c, const Pw& pw, T* w, T* a, T* z, const T* g, std::size_t n) {
  constexpr std::size_t kFtrlBlock = 256;
  alignas(64) T buffer[kFtrlBlock];
  for (std::size_t begin = 0; begin < n; begin += kFtrlBlock) {
    const auto len = static_cast<Eigen::Index>(std::min(kFtrlBlock, n - begin));
    Vec<T> var(w + begin, len), accum(a + begin, len), linear(z + begin, len), pw_new(buffer, len);
    ConstVec<T> grad(g + begin, len);
    pw_new = (accum + grad.square()).unaryExpr(pw);
    if (c.ftrl_shrink)
      linear += (grad + var * c.two_l2_shrinkage) - ((pw_new - accum.unaryExpr(pw)) / c.lr) * var;
    else
      linear += grad - ((pw_new - accum.unaryExpr(pw)) / c.lr) * var;
    accum += grad.square();
    var = linear.binaryExpr(pw_new / c.lr + c.two_l2, FtrlWeight<T>{c.l1});
  }
}

#if defined(EIGEN_VECTORIZE_SSE2) && !EIGEN_FAST_MATH
// Momentum, Adagrad, Adam and RMSprop in one pass over packets: every statement of the rule runs on
// a packet while it is in registers, where the Eigen statements below each re-read and re-write
// the chunk's slot arrays (from L1, but Adam then moves 40 bytes per element instead of 28 and
// runs the loop three times). Per element these are the same operations in the same order as the
// Eigen statements and the scalar oracle, so the bits are the same (the tests compare all three).
// Only where psqrt is the exact IEEE instruction (x86 with EIGEN_FAST_MATH 0, as ExactSqrt).
// Returns the number of leading elements it updated (a multiple of the packet size; 0 for the
// other rules); the caller updates the rest.
template <typename T>
std::size_t fused_update(const Coefficients<T>& c, T* w, T* s0, T* s1, const T* g, std::size_t n) {
  namespace ei = Eigen::internal;
  using P = typename ei::packet_traits<T>::type;
  constexpr std::size_t kLanes = static_cast<std::size_t>(ei::packet_traits<T>::size);
  const std::size_t end = n - n % kLanes;
  auto load = [](const T* x) { return ei::ploadu<P>(x); };
  switch (c.kind) {
    case OptimizerKind::kMomentum: {
      const P momentum = ei::pset1<P>(c.momentum), lr = ei::pset1<P>(c.lr);
      for (std::size_t i = 0; i < end; i += kLanes) {
        const P gi = load(g + i);
        const P a = ei::psub(ei::pmul(load(s0 + i), momentum), ei::pmul(gi, lr));
        ei::pstoreu(s0 + i, a);
        const P step = c.nesterov ? ei::psub(ei::pmul(a, momentum), ei::pmul(gi, lr)) : a;
        ei::pstoreu(w + i, ei::padd(load(w + i), step));
      }
      return end;
    }
    case OptimizerKind::kAdagrad: {
      const P lr = ei::pset1<P>(c.lr), eps = ei::pset1<P>(c.epsilon);
      for (std::size_t i = 0; i < end; i += kLanes) {
        const P gi = load(g + i);
        const P a = ei::padd(load(s0 + i), ei::pmul(gi, gi));
        ei::pstoreu(s0 + i, a);
        ei::pstoreu(w + i, ei::psub(load(w + i), ei::pdiv(ei::pmul(gi, lr), ei::padd(ei::psqrt(a), eps))));
      }
      return end;
    }
    case OptimizerKind::kAdam: {
      const P b1 = ei::pset1<P>(c.one_minus_beta1), b2 = ei::pset1<P>(c.one_minus_beta2);
      const P alpha = ei::pset1<P>(c.alpha), eps = ei::pset1<P>(c.epsilon);
      for (std::size_t i = 0; i < end; i += kLanes) {
        const P gi = load(g + i);
        const P m0 = load(s0 + i);
        const P m = ei::padd(m0, ei::pmul(ei::psub(gi, m0), b1));
        ei::pstoreu(s0 + i, m);
        const P v0 = load(s1 + i);
        const P v = ei::padd(v0, ei::pmul(ei::psub(ei::pmul(gi, gi), v0), b2));
        ei::pstoreu(s1 + i, v);
        ei::pstoreu(w + i, ei::psub(load(w + i), ei::pdiv(ei::pmul(m, alpha), ei::padd(ei::psqrt(v), eps))));
      }
      return end;
    }
    case OptimizerKind::kRmsProp: {
      const P rho = ei::pset1<P>(c.rho), one_minus_rho = ei::pset1<P>(c.one_minus_rho);
      const P lr = ei::pset1<P>(c.lr), eps = ei::pset1<P>(c.epsilon);
      for (std::size_t i = 0; i < end; i += kLanes) {
        const P gi = load(g + i);
        const P r = ei::padd(ei::pmul(load(s0 + i), rho), ei::pmul(ei::pmul(gi, gi), one_minus_rho));
        ei::pstoreu(s0 + i, r);
        ei::pstoreu(w + i, ei::psub(load(w + i), ei::pdiv(ei::pmul(gi, lr), ei::padd(ei::psqrt(r), eps))));
      }
      return end;
    }
    case OptimizerKind::kSgd:
    case OptimizerKind::kFtrl:
      break;
  }
  return 0;
}
#else
template <typename T>
std::size_t fused_update(const Coefficients<T>&, T*, T*, T*, const T*, std::size_t) {
  return 0;
}
#endif

// One update of n contiguous elements with Eigen. s0/s1 are the first and second slot (null when
// the optimizer has fewer). Each line is the formula of the header, in the same order; `x -= e`
// evaluates x = x - e, and array-scalar products commute exactly, so g*lr here is lr*g in TF.
template <typename T>
void eigen_update(const Coefficients<T>& c, T* w, T* s0, T* s1, const T* g, std::size_t n) {
  if (const std::size_t done = fused_update(c, w, s0, s1, g, n); done > 0) {
    if (done == n) return;
    w += done;
    g += done;
    if (s0 != nullptr) s0 += done;
    if (s1 != nullptr) s1 += done;
    n -= done;
  }
  const auto len = static_cast<Eigen::Index>(n);
  Vec<T> var(w, len);
  ConstVec<T> grad(g, len);
  switch (c.kind) {
    case OptimizerKind::kSgd:
      var -= grad * c.lr;
      break;
    case OptimizerKind::kMomentum: {
      // Keras' form (ResourceApplyKerasMomentum): lr is folded into the accumulator. The
      // tf.compat.v1 MomentumOptimizer form (a = a*m + g; w -= lr*a) differs once lr changes.
      Vec<T> accum(s0, len);
      accum = accum * c.momentum - grad * c.lr;
      if (c.nesterov)
        var += accum * c.momentum - grad * c.lr;
      else
        var += accum;
      break;
    }
    case OptimizerKind::kAdagrad: {
      // ApplyAdagradV2: epsilon outside the root (the V1 kernel has none and divides by sqrt(a)).
      Vec<T> accum(s0, len);
      accum += grad.square();
      var -= (grad * c.lr) / (accum.unaryExpr(ExactSqrt<T>()) + c.epsilon);
      break;
    }
    case OptimizerKind::kAdam: {
      // The dense TF kernel's m + (g - m)*(1 - beta1), not beta1*m + (1 - beta1)*g as Keras' own
      // sparse path writes it: equal in exact arithmetic, not in the last bit.
      Vec<T> m(s0, len);
      Vec<T> v(s1, len);
      m += (grad - m) * c.one_minus_beta1;
      v += (grad.square() - v) * c.one_minus_beta2;
      var -= (m * c.alpha) / (v.unaryExpr(ExactSqrt<T>()) + c.epsilon);
      break;
    }
    case OptimizerKind::kRmsProp: {
      // Keras' Python path for momentum = 0. (The ResourceApplyRMSProp kernel, which Keras uses
      // only with momentum > 0, puts epsilon inside the root instead.)
      Vec<T> rms(s0, len);
      rms = rms * c.rho + grad.square() * c.one_minus_rho;
      var -= (grad * c.lr) / (rms.unaryExpr(ExactSqrt<T>()) + c.epsilon);
      break;
    }
    case OptimizerKind::kFtrl:
      if (c.ftrl_sqrt)
        eigen_ftrl(c, ExactSqrt<T>(), w, s0, s1, g, n);
      else
        eigen_ftrl(c, ScalarPow<T>{c.ftrl_p}, w, s0, s1, g, n);
      break;
  }
}

// The scalar oracle: one element at a time, every statement of the rule before the next element.
// Written independently of Eigen so that a change in Eigen's evaluation would show up in the tests.
template <typename T>
void reference_update(const Coefficients<T>& c, T* w, T* s0, T* s1, const T* g, std::size_t n) {
  switch (c.kind) {
    case OptimizerKind::kSgd:
      for (std::size_t i = 0; i < n; ++i) w[i] = w[i] - g[i] * c.lr;
      break;
    case OptimizerKind::kMomentum:
      for (std::size_t i = 0; i < n; ++i) {
        s0[i] = s0[i] * c.momentum - g[i] * c.lr;
        w[i] = c.nesterov ? w[i] + (s0[i] * c.momentum - g[i] * c.lr) : w[i] + s0[i];
      }
      break;
    case OptimizerKind::kAdagrad:
      for (std::size_t i = 0; i < n; ++i) {
        s0[i] = s0[i] + g[i] * g[i];
        w[i] = w[i] - (g[i] * c.lr) / (std::sqrt(s0[i]) + c.epsilon);
      }
      break;
    case OptimizerKind::kAdam:
      for (std::size_t i = 0; i < n; ++i) {
        s0[i] = s0[i] + (g[i] - s0[i]) * c.one_minus_beta1;
        s1[i] = s1[i] + (g[i] * g[i] - s1[i]) * c.one_minus_beta2;
        w[i] = w[i] - (s0[i] * c.alpha) / (std::sqrt(s1[i]) + c.epsilon);
      }
      break;
    case OptimizerKind::kRmsProp:
      for (std::size_t i = 0; i < n; ++i) {
        s0[i] = s0[i] * c.rho + (g[i] * g[i]) * c.one_minus_rho;
        w[i] = w[i] - (g[i] * c.lr) / (std::sqrt(s0[i]) + c.epsilon);
      }
      break;
    case OptimizerKind::kFtrl: {
      auto pw = [&c](T x) { return c.ftrl_sqrt ? std::sqrt(x) : std::pow(x, c.ftrl_p); };
      for (std::size_t i = 0; i < n; ++i) {
        const T new_accum = s0[i] + g[i] * g[i];
        const T gs = c.ftrl_shrink ? g[i] + w[i] * c.two_l2_shrinkage : g[i];
        s1[i] = s1[i] + (gs - ((pw(new_accum) - pw(s0[i])) / c.lr) * w[i]);
        s0[i] = new_accum;
        const T z = s1[i];
        // Written out, not through FtrlWeight, so that the oracle is independent of the Eigen path.
        if (std::abs(z) > c.l1)
          w[i] = ((z > T(0) ? c.l1 : -c.l1) - z) / (pw(new_accum) / c.lr + c.two_l2);
        else
          w[i] = T(0);
      }
      break;
    }
  }
}

// The first two slot arrays (all any optimizer has), checked against num_slots.
template <typename T>
struct SlotPtrs {
  T* s0 = nullptr;
  T* s1 = nullptr;
};

template <typename T>
SlotPtrs<T> slot_ptrs(OptimizerKind kind, T* const* slots) {
  SlotPtrs<T> p;
  const int count = num_slots(kind);
  if (count == 0) return p;
  STRATA_CHECK(slots != nullptr, "optimizer ", to_string(kind), " needs ", count, " slot arrays");
  p.s0 = slots[0];
  STRATA_CHECK(p.s0 != nullptr, "optimizer ", to_string(kind), ": slot 0 is null");
  if (count > 1) {
    p.s1 = slots[1];
    STRATA_CHECK(p.s1 != nullptr, "optimizer ", to_string(kind), ": slot 1 is null");
  }
  return p;
}

// Pointer to element `offset` of an optional array (null stays null: offsetting it would be UB).
template <typename T>
T* at(T* base, std::size_t offset) {
  return base ? base + offset : nullptr;
}

template <typename T>
void dense_impl(const OptimizerConfig& cfg, std::int64_t step, T* var, T* const* slots,
                const T* grad, std::size_t n) {
  const Coefficients<T> c = make_coefficients<T>(cfg, step);
  if (n == 0) return;
  STRATA_CHECK(var != nullptr && grad != nullptr, "apply_dense: null var or grad with n = ", n);
  const SlotPtrs<T> s = slot_ptrs(cfg.kind, slots);
  // 4 KiB per array keeps the 2-4 arrays of a chunk in L1 across the statements of one rule.
  constexpr std::size_t kChunk = 4096 / sizeof(T);
  for (std::size_t begin = 0; begin < n; begin += kChunk) {
    const std::size_t len = std::min(kChunk, n - begin);
    eigen_update(c, var + begin, at(s.s0, begin), at(s.s1, begin), grad + begin, len);
  }
}

template <typename T>
void reference_impl(const OptimizerConfig& cfg, std::int64_t step, T* var, T* const* slots,
                    const T* grad, std::size_t n) {
  const Coefficients<T> c = make_coefficients<T>(cfg, step);
  if (n == 0) return;
  STRATA_CHECK(var != nullptr && grad != nullptr, "apply_dense_reference: null var or grad");
  const SlotPtrs<T> s = slot_ptrs(cfg.kind, slots);
  reference_update(c, var, s.s0, s.s1, grad, n);
}

template <typename T>
void sparse_impl(const OptimizerConfig& cfg, std::int64_t step, T* var, T* const* slots,
                 std::size_t row_elems, const std::int64_t* rows, const T* grads,
                 std::size_t num_rows) {
  const Coefficients<T> c = make_coefficients<T>(cfg, step);
  if (num_rows == 0 || row_elems == 0) return;
  STRATA_CHECK(var != nullptr && rows != nullptr && grads != nullptr,
               "apply_sparse_rows: null var, rows or grads with num_rows = ", num_rows);
  const SlotPtrs<T> s = slot_ptrs(cfg.kind, slots);
  auto update_row = [&](std::int64_t row, const T* g) {
    const std::size_t offset = static_cast<std::size_t>(row) * row_elems;
    eigen_update(c, var + offset, at(s.s0, offset), at(s.s1, offset), g, row_elems);
  };

  // Fast path, the common case of a gradient produced from sorted unique ids (a worker that
  // deduplicated before pushing): no duplicates are possible, so no scratch is needed.
  bool strictly_increasing = true;
  for (std::size_t i = 1; i < num_rows && strictly_increasing; ++i)
    strictly_increasing = rows[i] > rows[i - 1];
  if (strictly_increasing) {
    for (std::size_t i = 0; i < num_rows; ++i) update_row(rows[i], grads + i * row_elems);
    return;
  }

  // General case: group equal rows by sorting positions on (row, position). The position tie-break
  // keeps each group in order of appearance, which fixes the summation order; std::sort (unlike
  // std::stable_sort) needs no temporary buffer. The buffers are thread_local so the PS service
  // loop reuses them across calls instead of allocating per apply.
  thread_local std::vector<std::size_t> order;
  thread_local std::vector<T> sum;
  order.resize(num_rows);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [rows](std::size_t a, std::size_t b) {
    return rows[a] != rows[b] ? rows[a] < rows[b] : a < b;
  });
  const auto len = static_cast<Eigen::Index>(row_elems);
  for (std::size_t begin = 0; begin < num_rows;) {
    const std::int64_t row = rows[order[begin]];
    std::size_t end = begin + 1;
    while (end < num_rows && rows[order[end]] == row) ++end;
    if (end - begin == 1) {
      update_row(row, grads + order[begin] * row_elems);
    } else {
      // ((g_first + g_second) + g_third) ...: starting from the first gradient rather than from
      // zero keeps a lone -0.0 a -0.0, as a single occurrence would be.
      sum.resize(row_elems);
      Vec<T> acc(sum.data(), len);
      acc = ConstVec<T>(grads + order[begin] * row_elems, len);
      for (std::size_t k = begin + 1; k < end; ++k) acc += ConstVec<T>(grads + order[k] * row_elems, len);
      update_row(row, sum.data());
    }
    begin = end;
  }
}

template <typename T>
void rows_impl(const OptimizerConfig& cfg, std::int64_t step, T* const* rows, std::size_t slot_stride,
               std::size_t row_elems, const T* const* grads, std::size_t num_rows) {
  const Coefficients<T> c = make_coefficients<T>(cfg, step);
  if (num_rows == 0 || row_elems == 0) return;
  STRATA_CHECK(rows != nullptr && grads != nullptr, "apply_rows: null rows or grads with num_rows = ", num_rows);
  const int count = num_slots(cfg.kind);
  // Chunked like dense_impl, so a wide row keeps its 2-4 arrays in L1 across a rule's statements.
  constexpr std::size_t kChunk = 4096 / sizeof(T);
  for (std::size_t i = 0; i < num_rows; ++i) {
    T* w = rows[i];
    T* s0 = count > 0 ? w + slot_stride : nullptr;
    T* s1 = count > 1 ? w + 2 * slot_stride : nullptr;
    for (std::size_t begin = 0; begin < row_elems; begin += kChunk)
      eigen_update(c, w + begin, at(s0, begin), at(s1, begin), grads[i] + begin, std::min(kChunk, row_elems - begin));
  }
}

}  // namespace

// ---- names, configuration ------------------------------------------------------------------

const char* to_string(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kMomentum: return "momentum";
    case OptimizerKind::kAdagrad: return "adagrad";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kRmsProp: return "rmsprop";
    case OptimizerKind::kFtrl: return "ftrl";
  }
  return "?";
}

OptimizerKind parse_optimizer_kind(std::string_view name) {
  for (OptimizerKind kind : kAllKinds)
    if (name == to_string(kind)) return kind;
  throw ConfigError("--optimizer: '" + std::string(name) +
                    "' is not one of sgd, momentum, adagrad, adam, rmsprop, ftrl");
}

void OptimizerConfig::validate() const {
  // Ranges are Keras' where Keras checks them (momentum in [0, 1], accumulator >= 0) and otherwise
  // the ones outside which the rule stops being a decaying average (beta, rho < 1) or can divide
  // zero by zero (epsilon > 0). `!(x > 0)` and friends reject NaN with the out-of-range values.
  auto in_unit = [](double x, bool include_one) { return x >= 0.0 && (include_one ? x <= 1.0 : x < 1.0); };
  if (!(learning_rate > 0.0) || !std::isfinite(learning_rate))
    bad_field(*this, "learning_rate", learning_rate, "a finite number > 0");
  switch (kind) {
    case OptimizerKind::kSgd:
      break;
    case OptimizerKind::kMomentum:
      if (!in_unit(momentum, true)) bad_field(*this, "momentum", momentum, "[0, 1]");
      break;
    case OptimizerKind::kAdagrad:
      if (!(initial_accumulator >= 0.0) || !std::isfinite(initial_accumulator))
        bad_field(*this, "initial_accumulator", initial_accumulator, "a finite number >= 0");
      break;
    case OptimizerKind::kAdam:
      if (!in_unit(beta1, false)) bad_field(*this, "beta1", beta1, "[0, 1)");
      if (!in_unit(beta2, false)) bad_field(*this, "beta2", beta2, "[0, 1)");
      break;
    case OptimizerKind::kRmsProp:
      if (!in_unit(rho, false)) bad_field(*this, "rho", rho, "[0, 1)");
      break;
    case OptimizerKind::kFtrl: {
      // Keras' Ftrl checks: learning_rate_power <= 0, everything else >= 0.
      if (!(learning_rate_power <= 0.0) || !std::isfinite(learning_rate_power))
        bad_field(*this, "lr_power", learning_rate_power, "a finite number <= 0");
      const std::pair<const char*, double> non_negative[] = {{"initial_accumulator", initial_accumulator},
                                                             {"l1", l1},
                                                             {"l2", l2},
                                                             {"l2_shrinkage", l2_shrinkage},
                                                             {"beta", beta}};
      for (const auto& [field, value] : non_negative)
        if (!(value >= 0.0) || !std::isfinite(value)) bad_field(*this, field, value, "a finite number >= 0");
      break;
    }
  }
  if (key_applies(kind, Key::kEpsilon) && (!(epsilon > 0.0) || !std::isfinite(epsilon)))
    bad_field(*this, "epsilon", epsilon, "a finite number > 0");
  if (nesterov && kind != OptimizerKind::kMomentum)
    throw ConfigError(std::string("optimizer ") + to_string(kind) +
                      ": nesterov applies only to the momentum optimizer");
}

OptimizerConfig OptimizerConfig::defaults(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  // Keras: SGD(learning_rate=0.01), Adagrad/Adam/RMSprop/Ftrl(learning_rate=0.001).
  c.learning_rate =
      (kind == OptimizerKind::kSgd || kind == OptimizerKind::kMomentum) ? 0.01 : 0.001;
  return c;
}

// Strict on purpose: a misspelt key that were ignored would silently train with the default, and
// a key of another optimizer (sgd:momentum=0.9) would suggest an update rule that is not applied.
OptimizerConfig OptimizerConfig::parse(std::string_view spec) {
  const std::string text(spec);
  const auto colon = spec.find(':');
  OptimizerConfig c = defaults(parse_optimizer_kind(spec.substr(0, colon)));
  if (colon != std::string_view::npos) {
    const std::string_view params = spec.substr(colon + 1);
    if (params.empty())
      throw ConfigError("--optimizer '" + text + "': nothing after ':' (expected KEY=VALUE,...)");
    std::vector<Key> seen;
    for (const std::string& field : split(params, ',')) {
      const auto eq = field.find('=');
      if (field.empty() || eq == std::string::npos || eq == 0)
        throw ConfigError("--optimizer '" + text + "': '" + field + "' is not KEY=VALUE");
      const std::string name = field.substr(0, eq);
      const std::string value = field.substr(eq + 1);
      const KeyName* found = nullptr;
      for (const KeyName& k : kKeyNames)
        if (name == k.name) found = &k;
      if (found == nullptr || !key_applies(c.kind, found->key))
        throw ConfigError("--optimizer '" + text + "': unknown key '" + name + "' for " +
                          to_string(c.kind) + " (accepted: " + accepted_keys(c.kind) + ")");
      if (std::find(seen.begin(), seen.end(), found->key) != seen.end())
        throw ConfigError("--optimizer '" + text + "': key '" + name + "' given twice");
      seen.push_back(found->key);
      const std::string what = "--optimizer '" + text + "' " + name;
      switch (found->key) {
        case Key::kLr: c.learning_rate = parse_double(value, what); break;
        case Key::kMomentum: c.momentum = parse_double(value, what); break;
        case Key::kNesterov: c.nesterov = parse_bool(value, what); break;
        case Key::kInitialAccumulator: c.initial_accumulator = parse_double(value, what); break;
        case Key::kBeta1: c.beta1 = parse_double(value, what); break;
        case Key::kBeta2: c.beta2 = parse_double(value, what); break;
        case Key::kEpsilon: c.epsilon = parse_double(value, what); break;
        case Key::kRho: c.rho = parse_double(value, what); break;
        case Key::kLrPower: c.learning_rate_power = parse_double(value, what); break;
        case Key::kL1: c.l1 = parse_double(value, what); break;
        case Key::kL2: c.l2 = parse_double(value, what); break;
        case Key::kL2Shrinkage: c.l2_shrinkage = parse_double(value, what); break;
        case Key::kBeta: c.beta = parse_double(value, what); break;
      }
    }
  }
  c.validate();
  return c;
}

std::string to_string(const OptimizerConfig& config) {
  std::string out = to_string(config.kind);
  char sep = ':';
  auto add = [&](Key key, const std::string& value) {
    if (!key_applies(config.kind, key)) return;
    out += sep;
    out += canonical_name(key);
    out += '=';
    out += value;
    sep = ',';
  };
  add(Key::kLr, format_double(config.learning_rate));
  add(Key::kMomentum, format_double(config.momentum));
  add(Key::kNesterov, config.nesterov ? "1" : "0");
  add(Key::kInitialAccumulator, format_double(config.initial_accumulator));
  add(Key::kBeta1, format_double(config.beta1));
  add(Key::kBeta2, format_double(config.beta2));
  add(Key::kRho, format_double(config.rho));
  add(Key::kEpsilon, format_double(config.epsilon));
  add(Key::kLrPower, format_double(config.learning_rate_power));
  add(Key::kL1, format_double(config.l1));
  add(Key::kL2, format_double(config.l2));
  add(Key::kL2Shrinkage, format_double(config.l2_shrinkage));
  add(Key::kBeta, format_double(config.beta));
  return out;
}

int num_slots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return 0;
    case OptimizerKind::kMomentum:
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kRmsProp: return 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kFtrl: return 2;
  }
  return 0;
}

std::vector<std::string> slot_names(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return {};
    case OptimizerKind::kMomentum: return {"momentum"};
    case OptimizerKind::kAdagrad: return {"accumulator"};
    case OptimizerKind::kAdam: return {"m", "v"};
    case OptimizerKind::kRmsProp: return {"rms"};
    case OptimizerKind::kFtrl: return {"accumulator", "linear"};
  }
  return {};
}

double slot_initial_value(const OptimizerConfig& config, int slot) {
  STRATA_CHECK(slot >= 0 && slot < num_slots(config.kind), "optimizer ", to_string(config.kind),
               " has no slot ", slot);
  const bool accumulator = config.kind == OptimizerKind::kAdagrad ||
                           (config.kind == OptimizerKind::kFtrl && slot == 0);
  return accumulator ? config.initial_accumulator : 0.0;
}

// ---- apply entry points (explicit float / double overloads keep Eigen out of the header) ------

void apply_dense(const OptimizerConfig& config, std::int64_t step, float* var, float* const* slots,
                 const float* grad, std::size_t n) {
  dense_impl(config, step, var, slots, grad, n);
}
void apply_dense(const OptimizerConfig& config, std::int64_t step, double* var, double* const* slots,
                 const double* grad, std::size_t n) {
  dense_impl(config, step, var, slots, grad, n);
}

void apply_dense_reference(const OptimizerConfig& config, std::int64_t step, float* var,
                           float* const* slots, const float* grad, std::size_t n) {
  reference_impl(config, step, var, slots, grad, n);
}
void apply_dense_reference(const OptimizerConfig& config, std::int64_t step, double* var,
                           double* const* slots, const double* grad, std::size_t n) {
  reference_impl(config, step, var, slots, grad, n);
}

void apply_sparse_rows(const OptimizerConfig& config, std::int64_t step, float* var,
                       float* const* slots, std::size_t row_elems, const std::int64_t* rows,
                       const float* grads, std::size_t num_rows) {
  sparse_impl(config, step, var, slots, row_elems, rows, grads, num_rows);
}
void apply_rows(const OptimizerConfig& config, std::int64_t step, float* const* rows, std::size_t slot_stride,
                std::size_t row_elems, const float* const* grads, std::size_t num_rows) {
  rows_impl(config, step, rows, slot_stride, row_elems, grads, num_rows);
}
void apply_sparse_rows(const OptimizerConfig& config, std::int64_t step, double* var,
                       double* const* slots, std::size_t row_elems, const std::int64_t* rows,
                       const double* grads, std::size_t num_rows) {
  sparse_impl(config, step, var, slots, row_elems, rows, grads, num_rows);
}

}  // namespace strata::ps
