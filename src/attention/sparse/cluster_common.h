// Private helpers shared by the clustering methods (sparse.routing, sparse.clustered,
// sparse.multipole): the input-range guard and a row softmax with its log-sum-exp.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "numattn/attention/blocks/linear_attention.h"
#include "numattn/attention/problem.h"
#include "numattn/core/error.h"
#include "numattn/core/simd.h"

namespace numattn::cluster_detail {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Clustering runs in float32 on raw (multipole, clustered) or normalised (routing) rows and the
/// partial results are float32: refuse inputs whose squared norms, logits or value sums leave
/// float32 (the edge rules of problem.h allow an approximate method to refuse them with an Error).
inline void refuse_out_of_range(const AttentionProblem& p, const char* name, const ExecContext& ctx) {
  const blocks::InputNorms n = blocks::input_norms(p, ctx);
  const double logit = std::abs(p.effective_scale()) * n.q * n.k;
  NUMATTN_CHECK(n.q <= 1e18 && n.k <= 1e18 && logit <= 1e37 && n.v <= 1e36,
                "{} works in float32 and needs max‖q‖, max‖k‖ ≤ 1e18 (squared distances), |scale|·‖q‖·‖k‖ ≤ 1e37 "
                "(logits) and max|v| ≤ 1e36 (value sums); got ‖q‖ = {:.3g}, ‖k‖ = {:.3g}, logits up to {:.3g}, "
                "max|v| = {:.3g}: rescale the inputs or use exact.flash",
                name, n.q, n.k, logit, n.v);
}

/// Row softmax of `rows` × `cols` logits in place (row stride `ld`): e ← exp(s − max), returns
/// nothing; `inv[r]` = 1/Σ e and `lse[r]` = max + log Σ e (−inf and inv 0 for an all −inf row).
inline void softmax_rows(float* s, index_t rows, index_t cols, index_t ld, float* inv, double* lse) {
  for (index_t r = 0; r < rows; ++r) {
    float* x = s + r * ld;
    // Max in 16 fixed lanes (vectorised); the sum in simd::exp_shift's fixed order per path.
    float ml[16], m = kNegInf;
    std::fill(ml, ml + 16, kNegInf);
    index_t c = 0;
    for (; c + 16 <= cols; c += 16)
      for (int l = 0; l < 16; ++l) ml[l] = ml[l] > x[c + l] ? ml[l] : x[c + l];
    for (; c < cols; ++c) m = std::max(m, x[c]);
    for (int l = 0; l < 16; ++l) m = std::max(m, ml[l]);
    if (!(m > kNegInf)) {
      std::fill(x, x + cols, 0.f);
      inv[r] = 0.f;
      lse[r] = -std::numeric_limits<double>::infinity();
      continue;
    }
    const double z = simd::exp_shift(x, cols, -m);
    inv[r] = static_cast<float>(1 / z);
    lse[r] = m + std::log(z);
  }
}

}  // namespace numattn::cluster_detail
