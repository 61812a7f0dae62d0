/// @file accuracy.h
/// The accuracy contract: the one definition of the float32 tolerance of exact methods, and what
/// every method promises in its `MethodInfo::accuracy`. The registry-wide conformance test
/// (tests/support/conformance.h) holds each registered method to its own promise, so a new
/// method is checked by filling in this struct; docs/numerics.md states the same formulas.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "numattn/attention/problem.h"

namespace numattn {

class ParamValues;

/// float32 machine epsilon 2^-23, the `ε` of every tolerance below.
inline constexpr double kEpsF32 = 1.1920928955078125e-07;

/// Tolerances of an exact float32 method against the float64 reference, as functions of `L`, the
/// logit magnitude of the checked rows (`ErrorMetrics::logit_magnitude`: the largest
/// |scale|·Σ_d|q_d·k_d| + |mask| over keys that carry weight, see reference.h): a float32 logit
/// is off by up to about ε·L, and exp turns that absolute error into a relative weight error,
/// so every bound grows with L.
struct ExactTolerance {
  double max_scaled_error;   ///< 64·ε·(1 + L): elementwise |ô − o| / max(1, |o|)
  double rel_fro_error;      ///< 1e-5·(1 + L/10): ‖Ô − O‖_F / ‖O‖_F
  double lse_max_abs_error;  ///< 64·ε·(1 + L): |lsê − lse|
};
ExactTolerance exact_f32_tolerance(double logit_magnitude);

/// Parameter values as spec text, e.g. {{"landmarks", "64"}}; applied over the defaults.
using ParamOverrides = std::vector<std::pair<std::string, std::string>>;

/// What an error budget may depend on.
struct BudgetInput {
  const ParamValues& params;        ///< the method's bound parameters
  const AttentionProblem& problem;  ///< shapes, scale, causal rule, masks
  double logit_magnitude;           ///< L of the checked rows
};

/// A method's promise about its error against its target (`AttentionMethod::target()`, softmax
/// attention unless the method replaces it), computed exactly by the float64 reference.
///
/// The conformance harness checks, for every parameter set it runs (defaults, `samples`, each
/// parameter's range ends), every problem of its matrix and 1, 2 and 3 threads:
/// - `rel_fro_error ≤ max_rel_fro_error(...)` (for randomized methods: the median over seeds);
/// - exact methods (`Capabilities::exact`) and `limit_case` parameters: all of
///   `exact_f32_tolerance` (elementwise, Frobenius and LSE);
/// - along `convergence.values`, the median error does not grow and ends below where it began;
/// - hostile inputs (non-finite q/k/v, mask entries, overflow) follow problem.h.
struct AccuracyContract {
  /// Largest allowed rel_fro_error (ggml's max_nmse_err, as a Frobenius ratio: nmse = this²).
  /// Every method sets it; exact methods use `exact()`.
  std::function<double(const BudgetInput&)> max_rel_fro_error;
  /// Parameters at which the method equals exact attention on `p` (e.g. landmarks = Nk, window ≥
  /// Nk, top-k = Nk). Unset: no limit case (exact methods are exact at every parameter set).
  std::function<ParamOverrides(const AttentionProblem& p)> limit_case;
  /// The parameter that buys accuracy, and which way.
  struct Convergence {
    std::string param;                    ///< empty: none
    bool error_falls_as_it_grows = true;  ///< false: error falls as the parameter shrinks
    /// Values to sweep on `p`, in increasing order of the parameter (at least two).
    std::function<std::vector<std::string>(const AttentionProblem& p)> values;
  } convergence;
  /// Non-default parameter sets worth running (branches the defaults do not reach).
  std::vector<ParamOverrides> samples;

  /// The contract of an exact float32 method: budget `exact_f32_tolerance(L).rel_fro_error`.
  static AccuracyContract exact(std::vector<ParamOverrides> samples = {});
};

}  // namespace numattn
