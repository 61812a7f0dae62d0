/// @file simd.h
/// Vectorisable elementwise helpers used by the float32 kernels.
///
/// `exp_f32`: Cody–Waite range reduction x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial
/// for e^r, and 2^n built in the exponent bits. Relative error ≤ 2 ulp on [-87, 88];
/// below -87.3 (including -inf) the result is exactly 0, above 88 it saturates at e^88.
/// The scalar form has no calls and no branches, but GCC 12 does not vectorise loops over it
/// ("control flow in loop"), so the array forms below run the 8- and 16-lane overloads
/// explicitly (the scalar one for the tail): SmolLM2's SwiGLU gate ran 8× faster on AVX2.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace numattn::simd {

inline float exp_f32(float x) {
  const float hi_clamp = 88.0f;  // keeps n <= 127
  const float lo_cut = -87.3365447505531f;
  float xc = x > hi_clamp ? hi_clamp : x;
  xc = xc < lo_cut ? lo_cut : xc;
  const float log2e = 1.44269504088896341f;
#if defined(__clang__)
  // Clang 14 has no __builtin_roundevenf; rint rounds half to even in the default rounding
  // mode, so the result is the same (and it vectorises to vroundps as well).
  const float n = __builtin_rintf(xc * log2e);
#else
  const float n = __builtin_roundevenf(xc * log2e);
#endif
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t e = (static_cast<std::int32_t>(n) + 127) << 23;
  const float res = p * std::bit_cast<float>(e);
  return x < lo_cut ? 0.0f : res;
}

/// Whether no `x[i]` is NaN or ±inf. An integer max over the magnitude bits (all-ones exponent
/// = not finite), which compilers vectorise without reassociating floating-point sums.
inline bool all_finite(const float* x, std::int64_t n) {
  std::uint32_t worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t a = std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffu;
    worst = a > worst ? a : worst;
  }
  return worst < 0x7f800000u;
}

#if defined(__AVX512F__)
/// The core of the 16-lane exp, for callers that clamp and mask their own way (the flash
/// kernel's cut-off exp): for xc in [-87.4, 88], e^xc = p · 2^n with the reduction and
/// polynomial of `exp_f32(float)`; apply 2^n with `_mm512_scalef_ps(p, n)`.
inline __m512 exp_mantissa(__m512 xc, __m512* n_out) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  *n_out = n;
  return _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
}

/// 16 lanes of `exp_f32(float)`: the same reduction and polynomial (so the same ≤ 2 ulp bound
/// and the same saturation), 2^n applied with `vscalefps`; NaN stays NaN.
inline __m512 exp_f32(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3365447505531f);
  // max(lo, x)/min(hi, ·) return their second operand for NaN, so NaN propagates.
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(lo, x));
  __m512 n;
  const __m512 p = exp_mantissa(xc, &n);
  return _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_scalef_ps(p, n));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/// 8 lanes of `exp_f32(float)` (same reduction and polynomial, 2^n built in the exponent bits).
inline __m256 exp_f32(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365447505531f);
  const __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), res);
}
#endif

/// `y[i] = exp(x[i])`, in place allowed: the widest vector form this build has, then scalar.
inline void exp_f32(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp_f32(_mm512_loadu_ps(x + i)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_f32(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) y[i] = exp_f32(x[i]);
}

/// SwiGLU's gate: `a[i] = g[i]·σ(g[i])·u[i] = g[i] / (1 + e^{−g[i]}) · u[i]`, vectorised as
/// `exp_f32`. A gate below −88 gives g/(1 + e^88) (tiny, not NaN); NaN propagates.
inline void silu_mul(const float* g, const float* u, float* a, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 one16 = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 e = exp_f32(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    _mm512_storeu_ps(a + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one16, e)), _mm512_loadu_ps(u + i)));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 one8 = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp_f32(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one8, e)), _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; ++i) a[i] = g[i] / (1.f + exp_f32(-g[i])) * u[i];
}

/// Σ x[i]² accumulated in double (the RMS norm's sum of squares): 4 or 8 double lanes, then
/// scalar. The order differs from a sequential sum by far less than a float32 ulp of the norm.
inline double sum_squares_f64(const float* x, std::int64_t n) {
  std::int64_t i = 0;
  double s = 0;
#if defined(__AVX512F__)
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  const __m256d a = _mm256_add_pd(a0, a1);
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  s = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
#endif
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace numattn::simd
