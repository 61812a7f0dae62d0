/// @file target.h
/// The mechanism a method computes or approximates: its **target**.
///
/// Most methods approximate softmax attention. Others replace it by another normalised kernel
/// (Skyformer: a Gaussian kernel; PolySketch, TensorSketch: a polynomial kernel; linear
/// attention: a fixed feature map). Every method declares its target (`AttentionMethod::target`),
/// the float64 reference computes any target exactly (reference.h), and every report gives the
/// error against the method's own target (`target_rel_fro_error`: the cost of approximating)
/// next to the error against softmax (`rel_fro_error`: approximating plus changing the model).
///
/// One definition for all targets, per query row i over the keys j the row sees (the same
/// visibility rules as softmax, problem.h), with s = `AttentionProblem::effective_scale()` and
/// m_ij the additive mask entry (0 without one):
///
///     w_ij  = κ(q_i, k_j) · exp(m_ij)
///     out_i = Σ_j w_ij v_j / (c + Σ_j w_ij)     (normalised; 0 when the denominator is 0)
///     out_i = Σ_j w_ij v_j                       (unnormalised)
///
/// | kind        | κ(q, k)                           | c                    |
/// |-------------|-----------------------------------|----------------------|
/// | softmax     | exp(s·q·k)                        | 0                    |
/// | gaussian    | exp(−s·‖q − k‖²/2)                | 0                    |
/// | polynomial  | (s·q·k)^p                         | `denominator_shift`  |
/// | feature map | φ(q)·φ(k), φ given                | `denominator_shift`  |
///
/// 2-simplicial (`kSimplicial`, Clift et al. 2019; Roy et al. 2025; tensor.simplicial) is the
/// one target that is not a kernel over single keys: a softmax over key *pairs* (j, k) with the
/// trilinear logit s·Σ_d q_d k_jd k'_kd and the value v_j ⊙ v'_k, j and k in sliding windows of
/// `window1` / `window2` keys (attention/simplicial.h has the definition; its float64 row is
/// `simplicial_reference_row`). The registered method and the reference use K' = K, V' = V.
///
/// Normalised, the Gaussian kernel is softmax with a per-key bias −s‖k‖²/2 (the ‖q‖² factor
/// cancels). The reference evaluates exponentials relative to the row's largest exponent, so no
/// target overflows in float64 for finite float32 inputs.
#pragma once

#include <functional>
#include <string>

#include "numattn/core/tensor.h"

namespace numattn {

enum class TargetKind { kSoftmax, kGaussian, kPolynomial, kFeatureMap, kSimplicial };

/// φ: writes `feature_dim(d)` doubles for one d-vector `x`; `scale` is s above.
using FeatureMapFn = std::function<void(const double* x, index_t d, double scale, double* phi)>;

struct Target {
  TargetKind kind = TargetKind::kSoftmax;
  int degree = 0;                 ///< kPolynomial: p ≥ 0
  double denominator_shift = 0;   ///< c of the normalisation (kPolynomial, kFeatureMap)
  bool normalised = true;
  FeatureMapFn feature_map;                         ///< kFeatureMap
  std::function<index_t(index_t d)> feature_dim;    ///< kFeatureMap: dimension of φ(x)
  std::string feature_name;                         ///< kFeatureMap: e.g. "elu+1"
  index_t window1 = 0, window2 = 0;                 ///< kSimplicial: key windows of j and k

  static Target softmax() { return {}; }
  static Target gaussian();
  /// (s·q·k)^p over c + Σ (PolySketch normalises with c = 1).
  static Target polynomial(int degree, double denominator_shift);
  static Target feature(std::string name, FeatureMapFn phi, std::function<index_t(index_t)> dim,
                        double denominator_shift = 0, bool normalised = true);

  /// 2-simplicial attention over pairs of keys in windows w1 (j) and w2 (k), both ≥ 1.
  static Target simplicial(index_t w1, index_t w2);

  bool is_softmax() const { return kind == TargetKind::kSoftmax; }
  /// "softmax", "gaussian", "polynomial(p=4,c=1)", "feature-map(elu+1)", "2-simplicial(w1=64,w2=16)",
  /// with ",unnormalised".
  std::string name() const;
};

}  // namespace numattn
