// Internal: the SIMD forms of simd::exp_f32 for instruction-set variant code (core/isa_begin.h).
//
// Included after core/isa_begin.h by the variants that need them. Everything is `static`: each
// translation unit compiles its own copy for its own target, so no copy compiled for AVX-512
// can be linked into an AVX2 caller.
// Its includer has included numattn/core/simd.h before core/isa_begin.h (as every header it
// needs), so that simd.h's inline functions keep the baseline target.
#pragma once

#if !defined(NUMATTN_ISA_COMPILED)
#error "include core/isa_begin.h before core/simd_vec.h"
#endif

namespace numattn::simd {

#if NUMATTN_ISA_COMPILED && NUMATTN_ISA >= 2
/// The core of the 16-lane exp, for callers that clamp and mask their own way (the flash
/// kernel's cut-off exp): for xc in [-87.4, 88], e^xc = p · 2^n with the reduction and
/// polynomial of `exp_f32(float)`; apply 2^n with `_mm512_scalef_ps(p, n)`.
static inline __m512 exp_mantissa(__m512 xc, __m512* n_out) {
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
static inline __m512 exp_f32(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3365447505531f);
  // max(lo, x)/min(hi, ·) return their second operand for NaN, so NaN propagates.
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(lo, x));
  __m512 n;
  const __m512 p = exp_mantissa(xc, &n);
  return _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), _mm512_scalef_ps(p, n));
}
#endif

#if NUMATTN_ISA_COMPILED && NUMATTN_ISA >= 1
/// The core of the 8-lane exp, for callers that clamp and mask their own way (the flash
/// kernel's cut-off exp): e^xc for xc in [-87.3, 88] with the reduction and polynomial of
/// `exp_f32(float)`. n = roundeven(xc·log2 e) plus 1.5·2^23 + 127 (exact) leaves n + 127 in the
/// low mantissa bits, ready to shift into the exponent of 2^n (n + 127 stays in [1, 254] on
/// that range, so the bias never borrows). The explicit rounding keeps n, and the result, equal
/// to the scalar form's: adding the constant to the product itself would be contracted into an
/// FMA by GCC, whose unrounded product rounds differently near ties.
static inline __m256 exp_core(__m256 xc) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 t = _mm256_add_ps(n, _mm256_set1_ps(12583039.0f));  // 1.5·2^23 + 127
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}

/// 8 lanes of `exp_f32(float)` (same reduction and polynomial, 2^n built in the exponent bits).
static inline __m256 exp_f32(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365447505531f);
  const __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), exp_core(xc));
}
#endif

}  // namespace numattn::simd
