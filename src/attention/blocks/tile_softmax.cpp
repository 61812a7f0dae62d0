#include "numattn/attention/blocks/tile_softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "numattn/core/blas.h"
#include "numattn/core/simd.h"

namespace numattn::blocks {

namespace {

/// max_j x_j, NaN if any x_j is NaN (a NaN logit must reach the output).
float row_max(const float* x, index_t n) {
  index_t j = 0;
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
#if defined(__AVX512F__)
  __m512 acc = _mm512_set1_ps(m);
  __mmask16 bad = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    acc = _mm512_max_ps(acc, v);
  }
  m = _mm512_reduce_max_ps(acc);
  nan = bad != 0;
#endif
  for (; j < n; ++j) {
    m = x[j] > m ? x[j] : m;
    nan |= std::isnan(x[j]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

/// x_j ← exp(x_j − m); returns Σ_j x_j (16 float lanes, then float64: a fixed order).
double exp_shift_sum(float* x, index_t n, float m) {
  index_t j = 0;
  double z = 0;
#if defined(__AVX512F__)
  const __m512 sh = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) {
    const __m512 e = simd::exp_f32(_mm512_sub_ps(_mm512_loadu_ps(x + j), sh));
    _mm512_storeu_ps(x + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  for (float l : lanes) z += l;
#endif
  for (; j < n; ++j) {
    x[j] = simd::exp_f32(x[j] - m);
    z += x[j];
  }
  return z;
}

}  // namespace

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
    const float m = row_max(row, keys);
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
    const double z = exp_shift_sum(row, keys, m);
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
