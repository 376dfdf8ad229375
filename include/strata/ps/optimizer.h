// Optimizer math applied by parameter-server ranks to the shards they own (by the PS service loop,
// from the workers' inboxes): SGD, Momentum, Adagrad, Adam, RMSprop and FTRL with the update rules
// of TF 2.x Keras (tf.keras.optimizers, the optimizer_v2 family and the training_ops kernels it
// calls), the same slot names and slot initial values, so checkpoints map onto TF's
// `/slots/<var>/<slot>` layout.
//
// Floating-point contract (why a distributed run can be compared bit for bit with a single-process
// reference that applies the same aggregated gradients through these functions):
//   * Element arithmetic is done in T (float for f32 variables), never promoted to double, using
//     only +, -, *, / and sqrt, each correctly rounded by IEEE 754, in exactly the order written
//     in the formulas below (left to right, parentheses as shown).
//   * Every element is updated independently of its neighbours, so the result for an element does
//     not depend on n, on the address (SIMD peeling), on how a variable is split into shards or
//     rows, or on whether the vectorised path (apply_dense) or the scalar loop
//     (apply_dense_reference) ran. Both paths are bit-identical; tests/unit/optimizer_test.cc
//     checks this.
//   * That requires no FMA contraction of a*b + c (strata is built with -ffp-contract=off for any
//     STRATA_ARCH, cmake/StrataArch.cmake, and native has FMA on most machines; src/ps/optimizer.cc
//     refuses to compile for an FMA target without it) and Eigen's exact vector sqrt:
//     optimizer.cc sets EIGEN_FAST_MATH=0, because Eigen 3.4's default replaces float sqrt by
//     rsqrt plus one Newton step (1-2 ulp off, denormals flushed to zero), which would also make
//     results depend on shard boundaries.
//   * Per-call scalar coefficients are computed in T as the TF kernels do. Adam's beta^t uses
//     std::pow(T, T), which the C++ standard does not require to be correctly rounded: results are
//     bit-identical across processes that share the same libm (one cluster image), not across
//     arbitrary platforms. The same holds for FTRL with a learning_rate_power other than -0.5,
//     which takes std::pow of every element (-0.5 uses sqrt).
//   * NaN and Inf in gradients are not checked; they propagate like any IEEE operand.
//
// Update rules, per element (g: gradient, w: variable, lr = T(learning_rate), t = step):
//   sgd       w = w - g*lr
//   momentum  a = a*momentum - g*lr                                   (slot "momentum")
//             w = w + a                          (nesterov: w = w + (a*momentum - g*lr))
//   adagrad   a = a + g*g                                             (slot "accumulator")
//             w = w - (g*lr) / (sqrt(a) + epsilon)
//   adam      alpha = (lr * sqrt(1 - beta2^t)) / (1 - beta1^t)        (scalar, once per call)
//             m = m + (g - m)*(1 - beta1)                             (slot "m")
//             v = v + (g*g - v)*(1 - beta2)                           (slot "v")
//             w = w - (m*alpha) / (sqrt(v) + epsilon)
//   rmsprop   r = r*rho + (g*g)*(1 - rho)                             (slot "rms")
//             w = w - (g*lr) / (sqrt(r) + epsilon)
//   ftrl      (TF's ApplyFtrl / ApplyFtrlV2 kernels, which Keras' Ftrl calls; slots "accumulator"
//             a and "linear" z; p = -learning_rate_power; pw(x) = sqrt(x) when p is 0.5, else
//             std::pow(x, p); l2' = l2 + beta/(2*lr) and two_l2 = 2*l2' are scalars, as Keras
//             folds beta into l2)
//             gs = g + (2*l2_shrinkage)*w              (gs = g when l2_shrinkage is 0: ApplyFtrl)
//             na = a + g*g                             (the accumulator takes g, not gs)
//             z  = z + (gs - ((pw(na) - pw(a)) / lr)*w)
//             w  = |z| > l1 ? (sign(z)*l1 - z) / (pw(na)/lr + two_l2) : 0
//             a  = na
// Adam's epsilon is Keras' "epsilon hat": added to sqrt(v), not to sqrt(v_hat). The update equals
// lr*m_hat / (sqrt(v_hat) + epsilon/sqrt(1 - beta2^t)) with m_hat = m/(1 - beta1^t) and
// v_hat = v/(1 - beta2^t), which is not the paper's Algorithm 1 (a different epsilon).
// RMSprop is Keras' RMSprop with momentum=0 and centered=False (its defaults): one slot, "rms".
// FTRL's defaults are Keras' (learning_rate 0.001, learning_rate_power -0.5, initial accumulator
// 0.1, l1 = l2 = l2_shrinkage = beta = 0). l2_shrinkage applies to every updated element, dense
// and sparse pushes alike, as in TF's ApplyFtrlV2 and SparseApplyFtrlV2. The new weight is a
// function of z and the accumulator (the old weight enters through z only), so FTRL replaces a
// weight's initial value at its first update, as TF does, and a weight with |z| <= l1 is exactly 0.
//
// Thread-safety: every function here is reentrant and keeps no shared state (the sparse path keeps
// a thread_local scratch buffer). Callers serialise applications to the same variable and slots;
// different variables may be updated concurrently from different threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::ps {

enum class OptimizerKind { kSgd, kMomentum, kAdagrad, kAdam, kRmsProp, kFtrl };

// "sgd", "momentum", "adagrad", "adam", "rmsprop", "ftrl" (exact, lower case); ConfigError otherwise.
OptimizerKind parse_optimizer_kind(std::string_view name);
const char* to_string(OptimizerKind kind);

// Hyper-parameters. Fields that do not apply to `kind` are ignored. The defaults are Keras'
// defaults; learning_rate has none here (0 is rejected by validate()) because Keras' default
// depends on the optimizer: parse() and defaults() fill it.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  double learning_rate = 0.0;
  double momentum = 0.9;             // momentum: in [0, 1]
  bool nesterov = false;             // momentum only
  double initial_accumulator = 0.1;  // adagrad, ftrl: >= 0
  double beta1 = 0.9;                // adam: in [0, 1)
  double beta2 = 0.999;              // adam: in [0, 1)
  double epsilon = 1e-7;             // adagrad, adam, rmsprop: > 0
  double rho = 0.9;                  // rmsprop: in [0, 1)
  double learning_rate_power = -0.5;  // ftrl: <= 0
  double l1 = 0.0;                    // ftrl: >= 0
  double l2 = 0.0;                    // ftrl: >= 0
  double l2_shrinkage = 0.0;          // ftrl: >= 0
  double beta = 0.0;                  // ftrl: >= 0

  // Throws ConfigError (one line naming the optimizer, the field and the value) when a field that
  // applies to `kind` is out of range or not finite. epsilon must be > 0 (Keras accepts 0, which
  // turns a zero gradient on a zero slot into 0/0 = NaN).
  void validate() const;

  // The Keras defaults for `kind`, learning_rate included (sgd, momentum 0.01; adagrad, adam,
  // rmsprop, ftrl 0.001).
  static OptimizerConfig defaults(OptimizerKind kind);

  // Parses "NAME" or "NAME:KEY=VALUE,KEY=VALUE..." (e.g. "adam", "adam:lr=0.001,beta1=0.9",
  // "momentum:lr=0.1,momentum=0.9,nesterov=1"), starting from defaults(NAME), then validates.
  // Keys accepted per optimizer (Keras spellings in brackets are aliases):
  //   all: lr [learning_rate];  momentum: momentum, nesterov;  adagrad: initial_accumulator
  //   [initial_accumulator_value], epsilon;  adam: beta1 [beta_1], beta2 [beta_2], epsilon;
  //   rmsprop: rho, epsilon;  ftrl: initial_accumulator [initial_accumulator_value], lr_power
  //   [learning_rate_power], l1 [l1_regularization_strength], l2 [l2_regularization_strength],
  //   l2_shrinkage [l2_shrinkage_regularization_strength], beta.
  // Strict: an unknown or inapplicable key, a repeated key, an empty field, a missing '=', a bad
  // number or boolean (common/parse.h rules: no spaces) is a ConfigError naming it.
  static OptimizerConfig parse(std::string_view spec);
};

// Canonical spec with every applicable key, numbers printed to round-trip exactly:
// parse(to_string(c)) reproduces c's applicable fields. For logs and checkpoint attributes.
std::string to_string(const OptimizerConfig& config);

// Slots per variable, in the order apply_* expects them in `slots`, named as Keras names them:
// sgd: none; momentum: "momentum"; adagrad: "accumulator"; adam: "m", "v"; rmsprop: "rms";
// ftrl: "accumulator", "linear".
int num_slots(OptimizerKind kind);
std::vector<std::string> slot_names(OptimizerKind kind);
// Initial value of every element of slot `slot` (0 <= slot < num_slots): initial_accumulator for
// Adagrad's and FTRL's accumulator (slot 0), 0 otherwise. Callers store T(value). Throws
// strata::Error on a bad index.
double slot_initial_value(const OptimizerConfig& config, int slot);

// Applies one update to n contiguous elements: var[i], slots[k][i] and grad[i] for i < n.
// `config` must have passed validate() (not re-checked here, this is the hot path). `step` is the
// 1-based count of applications to this variable including this one (Adam's bias correction uses
// it; the other optimizers ignore it); step < 1 throws strata::Error. `slots` points to
// num_slots(config.kind) arrays (may be null for sgd). Arrays must not overlap. n == 0 is a no-op.
// Vectorised with Eigen; allocates nothing.
void apply_dense(const OptimizerConfig& config, std::int64_t step, float* var, float* const* slots,
                 const float* grad, std::size_t n);
void apply_dense(const OptimizerConfig& config, std::int64_t step, double* var, double* const* slots,
                 const double* grad, std::size_t n);

// The same update as a plain scalar loop, without Eigen: the oracle the tests compare apply_dense
// with, bit for bit.
void apply_dense_reference(const OptimizerConfig& config, std::int64_t step, float* var,
                           float* const* slots, const float* grad, std::size_t n);
void apply_dense_reference(const OptimizerConfig& config, std::int64_t step, double* var,
                           double* const* slots, const double* grad, std::size_t n);

// Applies an IndexedSlices-style gradient: grads holds num_rows rows of row_elems elements, row i
// belonging to variable row rows[i]. var and every slot are whole row-major variables (row r at
// r*row_elems). The caller has bounds-checked rows (0 <= rows[i] < the variable's row count);
// nothing is checked here.
//
// Semantics (TF's _deduplicate_indexed_slices): the gradients of a row listed several times are
// summed first, in order of appearance ((g_a + g_b) + g_c, ...), then each distinct row receives
// exactly one update, bit-identical to apply_dense on that row's row_elems elements with the summed
// gradient. Rows not listed are not touched, slots included ("lazy" updates). That is TF's
// behaviour for sgd, momentum, adagrad and ftrl; TF's Keras Adam and RMSprop also decay the slots of
// unlisted rows (and Adam moves their values): to get that, densify the gradient (zeros elsewhere)
// and call apply_dense on the whole shard.
//
// Allocates only to grow its thread_local scratch (duplicates present, rows out of order); calls
// with sizes already seen on this thread allocate nothing.
void apply_sparse_rows(const OptimizerConfig& config, std::int64_t step, float* var,
                       float* const* slots, std::size_t row_elems, const std::int64_t* rows,
                       const float* grads, std::size_t num_rows);
void apply_sparse_rows(const OptimizerConfig& config, std::int64_t step, double* var,
                       double* const* slots, std::size_t row_elems, const std::int64_t* rows,
                       const double* grads, std::size_t num_rows);

// Applies one update to each of num_rows rows addressed one by one, for row stores that keep a
// row's values and slots side by side (the PS's dynamic tables): row i's values are the row_elems
// elements at rows[i], its slot k the row_elems elements at rows[i] + (k + 1) * slot_stride, its
// gradient the row_elems elements at grads[i]. Each row's result is bit-identical to apply_dense
// on that row alone (the per-call coefficients are computed once, as apply_sparse_rows does). The
// rows must be distinct and must not overlap their gradients (not checked: the hot path); the
// caller sums duplicate gradients first. step < 1 throws strata::Error; num_rows == 0 is a no-op.
void apply_rows(const OptimizerConfig& config, std::int64_t step, float* const* rows, std::size_t slot_stride,
                std::size_t row_elems, const float* const* grads, std::size_t num_rows);

}  // namespace strata::ps
