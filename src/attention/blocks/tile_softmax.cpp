#include "numattn/attention/blocks/tile_softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "numattn/core/blas.h"
#include "numattn/core/simd.h"

namespace numattn::blocks {


void tile_softmax(const float* q, index_t ldq, index_t rows, const float* k, index_t ldk, const float* v,
                  index_t ldv, index_t keys, index_t dk, index_t dv, float scale, const TileAdjust* adjust,
                  float* out, index_t ldo, double* lse, std::vector<float>& scratch) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (rows <= 0) return;
  if (keys <= 0) {
    for (index_t r = 0; r < rows; ++r) {
      std::fill(out + r * ldo, out + r * ldo + dv, 0.f);
      if (lse) lse[r] = -std::numeric_limits<double>::infinity();
    }
    return;
  }
  scratch.resize(static_cast<std::size_t>(rows * keys));
  float* s = scratch.data();
  if (dk > 0)
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, keys, dk, scale, q, ldq, k, ldk, 0.f, s, keys);
  else
    std::fill(s, s + rows * keys, 0.f);
  std::vector<double> inv(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) {
    float* row = s + r * keys;
    if (adjust) (*adjust)(r, row);
    const float m = simd::max_f32(row, keys);
    if (std::isnan(m) || m == std::numeric_limits<float>::infinity()) {  // carried to the output as NaN
      std::fill(row, row + keys, 0.f);
      inv[static_cast<std::size_t>(r)] = std::numeric_limits<double>::quiet_NaN();
      if (lse) lse[r] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (m == kNegInf) {  // every key hidden: an empty row
      std::fill(row, row + keys, 0.f);
      inv[static_cast<std::size_t>(r)] = 0;
      if (lse) lse[r] = -std::numeric_limits<double>::infinity();
      continue;
    }
    const double z = simd::exp_shift(row, keys, -m);
    inv[static_cast<std::size_t>(r)] = 1.0 / z;
    if (lse) lse[r] = static_cast<double>(m) + std::log(z);
  }
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, keys, 1.f, s, keys, v, ldv, 0.f, out, ldo);
  for (index_t r = 0; r < rows; ++r) {
    float* o = out + r * ldo;
    const double f = inv[static_cast<std::size_t>(r)];
    if (std::isnan(f)) std::fill(o, o + dv, std::numeric_limits<float>::quiet_NaN());
    else if (f == 0) std::fill(o, o + dv, 0.f);
    else
      for (index_t c = 0; c < dv; ++c) o[c] = static_cast<float>(o[c] * f);
  }
}

}  // namespace numattn::blocks
