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

/// Applies causal rule, window and masks to logits `s[j - j0]` of query row `i` of batch b and
/// query head h, keys [j0, j1):
/// hidden keys become -inf (an additive -inf or NaN hides its key), additive entries are added.
/// Returns false when a logit of a key the row sees is not finite (NaN or ±inf from the inputs,
/// float32 overflow, a +inf mask entry): the row must be settled by `AttentionMethod::run`.
inline bool mask_row(const AttentionProblem& p, index_t b, index_t h, index_t i, index_t j0, index_t j1, float* s) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const KeyRange r = p.key_range(i);
  const MaskRow m = p.mask_row(b, h, i);
  bool finite = true;
  for (index_t j = j0; j < j1; ++j) {
    float& x = s[j - j0];
    if (j < r.begin || j >= r.end) {
      x = ninf;
      continue;
    }
    if (m.allowed) {
      if (!m.allowed[j]) {
        x = ninf;
        continue;
      }
    } else if (m.additive) {
      const float a = m.additive[j];
      if (!(a > ninf)) {
        x = ninf;
        continue;
      }
      x += a;
    }
    finite &= std::isfinite(x);
  }
  return finite;
}

}  // namespace numattn::detail
