/// @file tile_softmax.h
/// Exact softmax attention of a small gathered tile: every one of `rows` query rows reads every
/// one of `keys` key rows, with an optional per-row adjustment of the logits (attention-specific
/// building block).
///
/// The hashing and sampling methods (sparse.reformer, sparse.hyper) gather the rows of one bucket
/// chunk, one sorted block or one sample set into contiguous buffers and need, per tile, the pair
/// (o, lse) of softmax attention restricted to those keys, with some logits changed first: −inf
/// to hide a key (causal rule, a sampled key already counted, a token's own position), or a
/// finite bias (a duplicate count −log N_ij, an importance weight log(n/m)). `dense_softmax`
/// (the flash kernel) has no per-pair bias, so this is the GEMM form: S = scale·Q·Kᵀ (one
/// sgemm), the adjustment, row maxima, exp, P·V (one sgemm), normalisation.
///
/// Per row r: l = adjusted logits, m = max_j l_j, o_r = Σ_j exp(l_j − m)·v_j / Σ_j exp(l_j − m),
/// lse_r = m + log Σ_j exp(l_j − m) (natural log, accumulated in float64). A row whose logits are
/// all −inf gives o_r = 0 and lse_r = −inf. A NaN logit (or +inf, an overflow) gives a NaN row.
/// Cost: 2·rows·keys·(Dk + Dv) flops; scratch rows·keys floats.
#pragma once

#include <functional>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::blocks {

/// Called once per row with the `keys` scaled logits of that row, to change in place.
using TileAdjust = std::function<void(index_t row, float* logits)>;

/// q: rows × dk (row stride ldq), k: keys × dk (ldk), v: keys × dv (ldv); out: rows × dv (ldo);
/// lse: rows doubles (may be null). `adjust` may be null. `scratch` is resized as needed.
void tile_softmax(const float* q, index_t ldq, index_t rows, const float* k, index_t ldk, const float* v,
                  index_t ldv, index_t keys, index_t dk, index_t dv, float scale, const TileAdjust* adjust,
                  float* out, index_t ldo, double* lse, std::vector<float>& scratch);

}  // namespace numattn::blocks
