/// @file bda_eval.h
/// Accuracy of a BDA layer in float32 against the float64 reference (tests, `numattn bd-study`).
///
/// Protocol: random inputs X_q ∈ R^{n×d_model} (and X_kv ∈ R^{n×d_kv}, = X_q when d_kv =
/// d_model), N(0, 1). Reference: Q, K, V computed in float64 from the float32 weights, rounded
/// once to float32, attention by the float64 oracle (`reference_all`), then ·W_o + b_o in
/// float64. Two float32 pipelines are compared with it, both with exact.flash attention:
///   plain: Q, K, V, W_o products in float32 sgemm;
///   BDA:   Q' = X·W_q' + b_q', K' and V' from the fused BD kernel, out = A'·W_o' + b_o'.
/// Errors are relative Frobenius norms of the layer output [n, d_model] and, for the QK pair,
/// of the logits Q·Kᵀ of all heads (without scale), against float64 values.
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/core/exec.h"
#include "numattn/transform/bda.h"

namespace numattn::transform {

/// Owns random float32 layer weights, N(0, 1/in) entries (variance-preserving), kInOut layout.
struct RandomLayer {
  index_t d_model = 0, d_kv = 0, heads = 0, kv_heads = 0, head_dim = 0;
  std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo;
  /// View for bda_transform (rope_dims = 0).
  AttentionLayerWeights view() const;
};
/// d_kv = 0 means d_model. Biases N(0, 0.1²) when `biases`.
RandomLayer random_layer(index_t d_model, index_t d_kv, index_t heads, index_t kv_heads,
                         index_t head_dim, bool biases, std::uint64_t seed);

struct BdaAccuracy {
  double out_err_plain = 0, out_err_bda = 0;      ///< layer output, rel. Frobenius
  double logit_err_plain = 0, logit_err_bda = 0;  ///< Q·Kᵀ (0 when QK is not applied)
  double kappa_max = 1;                           ///< max over applied pairs' BD heads
  index_t tokens = 0;
};

/// Runs both float32 pipelines on `tokens` random tokens and measures them against the float64
/// reference. `w` must be kInOut (as produced by random_layer) and `layer = bda_transform(w,…)`.
BdaAccuracy evaluate_bda(const AttentionLayerWeights& w, const BdaLayer& layer, index_t tokens,
                         std::uint64_t seed, const ExecContext& ctx,
                         Causal causal = Causal::kTopLeft);

}  // namespace numattn::transform
