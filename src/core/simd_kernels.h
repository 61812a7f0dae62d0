// Internal: the array functions of core/simd.h, written once and compiled per instruction-set
// variant. The including file defines NUMATTN_ISA (core/isa_begin.h) and includes this file
// once; it defines numattn::simd::<variant>::ops().
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/simd_ops.h"
#include "numattn/core/simd.h"

#include "core/isa_begin.h"
#include "core/simd_vec.h"

namespace numattn::simd::NUMATTN_ISA_NS {

#if NUMATTN_ISA_COMPILED

namespace {

#if NUMATTN_ISA == 2
// 16 float lanes.
struct L {
  using F = __m512;
  static constexpr int W = 16;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F zero() { return _mm512_setzero_ps(); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F exp(F x) { return exp_f32(x); }
  static bool any_nan(F v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }
};
#elif NUMATTN_ISA == 1
// 8 float lanes.
struct L {
  using F = __m256;
  static constexpr int W = 8;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F zero() { return _mm256_setzero_ps(); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F exp(F x) { return exp_f32(x); }
  static bool any_nan(F v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }
};
#endif

void exp_array(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
#if NUMATTN_ISA >= 1
  for (; i + L::W <= n; i += L::W) L::store(y + i, L::exp(L::load(x + i)));
#endif
  for (; i < n; ++i) y[i] = exp_f32(x[i]);
}

void silu_mul_array(const float* g, const float* u, float* a, std::int64_t n) {
  std::int64_t i = 0;
#if NUMATTN_ISA >= 1
  const L::F one = L::set1(1.f);
  for (; i + L::W <= n; i += L::W) {
    const L::F gv = L::load(g + i);
    const L::F e = L::exp(L::sub(L::zero(), gv));
    L::store(a + i, L::mul(L::div(gv, L::add(one, e)), L::load(u + i)));
  }
#endif
  for (; i < n; ++i) a[i] = g[i] / (1.f + exp_f32(-g[i])) * u[i];
}

// gelu_tanh(g) = g/2·(1 + tanh(z)) = g·σ(2z), z = √(2/π)·(g + 0.044715·g³): SiLU's shape with
// 2z in place of g, so one exponential per value.
void gelu_mul_array(const float* g, const float* u, float* a, std::int64_t n) {
  constexpr float c1 = -2.f * 0.7978845608028654f, c3 = -2.f * 0.7978845608028654f * 0.044715f;
  std::int64_t i = 0;
#if NUMATTN_ISA >= 1
  const L::F one = L::set1(1.f), k1 = L::set1(c1), k3 = L::set1(c3);
  for (; i + L::W <= n; i += L::W) {
    const L::F gv = L::load(g + i);
    const L::F m2z = L::mul(gv, L::fmadd(L::mul(gv, gv), k3, k1));  // −2z
    L::store(a + i, L::mul(L::div(gv, L::add(one, L::exp(m2z))), L::load(u + i)));
  }
#endif
  for (; i < n; ++i) {
    const float m2z = g[i] * ((g[i] * g[i]) * c3 + c1);
    a[i] = g[i] / (1.f + exp_f32(m2z)) * u[i];
  }
}

double sum_squares(const float* x, std::int64_t n) {
  std::int64_t i = 0;
  double s = 0;
#if NUMATTN_ISA == 2
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#elif NUMATTN_ISA == 1
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

float max_array(const float* x, std::int64_t n) {
  std::int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
#if NUMATTN_ISA >= 1
  L::F acc = L::set1(m);
  for (; i + L::W <= n; i += L::W) {
    const L::F v = L::load(x + i);
    nan |= L::any_nan(v);
    acc = L::max(acc, v);
  }
  alignas(64) float lanes[L::W];
  L::store(lanes, acc);
  for (float l : lanes) m = l > m ? l : m;
#endif
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= std::isnan(x[i]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

double exp_shift_array(float* x, std::int64_t n, float shift, float add) {
  std::int64_t i = 0;
  double z = 0;
#if NUMATTN_ISA >= 1
  const L::F sh = L::set1(shift), ad = L::set1(add);
  L::F acc = L::zero();
  for (; i + L::W <= n; i += L::W) {
    const L::F e = L::add(L::exp(L::add(L::load(x + i), sh)), ad);
    L::store(x + i, e);
    acc = L::add(acc, e);
  }
  alignas(64) float lanes[L::W];
  L::store(lanes, acc);
  for (float l : lanes) z += l;
#endif
  for (; i < n; ++i) {
    x[i] = exp_f32(x[i] + shift) + add;
    z += x[i];
  }
  return z;
}

float dot_array(const float* x, const float* y, std::int64_t n) {
  std::int64_t i = 0;
  float r = 0;
#if NUMATTN_ISA >= 1
  L::F acc = L::zero();
  for (; i + L::W <= n; i += L::W) acc = L::fmadd(L::load(x + i), L::load(y + i), acc);
  alignas(64) float lanes[L::W];
  L::store(lanes, acc);
  for (float l : lanes) r += l;
#endif
  for (; i < n; ++i) r += x[i] * y[i];
  return r;
}

}  // namespace

#endif  // NUMATTN_ISA_COMPILED

}  // namespace numattn::simd::NUMATTN_ISA_NS

#include "core/isa_end.h"

// The getter after the target's end: it runs before anyone knows the CPU can run the variant.
namespace numattn::simd::NUMATTN_ISA_NS {
const Ops* ops() {
#if NUMATTN_ISA_COMPILED
  static constexpr Ops k{exp_array, silu_mul_array, gelu_mul_array, sum_squares, max_array, exp_shift_array, dot_array};
  return &k;
#else
  return nullptr;
#endif
}
}  // namespace numattn::simd::NUMATTN_ISA_NS
