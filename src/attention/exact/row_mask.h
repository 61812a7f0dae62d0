// Masking of a block of float32 logits, shared by the float32 exact kernels (private header).
#pragma once

#include <cmath>
#include <limits>

#include "numattn/attention/problem.h"

namespace numattn::detail {

/// Whether rows [i0, i1) over keys [j0, j1) need per-element masking: false when every key of
/// the tile is visible from every row (no bool/additive mask, inside all rows' key ranges).
inline bool tile_needs_mask(const AttentionProblem& p, index_t i0, index_t i1, index_t j0,
                            index_t j1) {
  if (p.mask.kind != MaskKind::kNone) return true;
  for (index_t i = i0; i < i1; ++i) {
    KeyRange r = p.key_range(i);
    if (j0 < r.begin || j1 > r.end) return true;
  }
  return false;
}

/// Applies causal rule, window and masks to logits `s[j - j0]` of query row `i`, keys [j0, j1):
/// hidden keys become -inf; additive entries are added; NaN logits are hidden.
inline void mask_row(const AttentionProblem& p, index_t i, index_t j0, index_t j1, float* s) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const KeyRange r = p.key_range(i);
  for (index_t j = j0; j < j1; ++j) {
    float& x = s[j - j0];
    if (j < r.begin || j >= r.end) {
      x = ninf;
      continue;
    }
    if (p.mask.kind == MaskKind::kBool) {
      if (!p.mask.allowed[i * p.mask.ld + j]) x = ninf;
    } else if (p.mask.kind == MaskKind::kAdditive) {
      x += p.mask.additive[i * p.mask.ld + j];
    }
    if (std::isnan(x)) x = ninf;
  }
}

}  // namespace numattn::detail
