/// @file simd.h
/// Elementwise helpers used by the float32 kernels.
///
/// `exp_f32`: Cody–Waite range reduction x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial
/// for e^r, and 2^n built in the exponent bits. Relative error ≤ 2 ulp on [-87, 88];
/// below -87.3 (including -inf) the result is exactly 0, above 88 it saturates at e^88.
/// The scalar form has no calls and no branches, but GCC 12 does not vectorise loops over it
/// ("control flow in loop"), so the array functions below run 8- or 16-lane forms of the same
/// reduction and polynomial (src/core/simd_vec.h), chosen at run time like every SIMD kernel
/// (core/cpu.h: portable, avx2, avx512), then the scalar form for the tail. The vector paths
/// give the same values as the scalar form; the sums (`sum_squares_f64`, `exp_shift`, `dot_f32`)
/// are in a fixed order per path (lanes, then the lanes in order, then the tail), so a result is
/// reproducible for a given path. SmolLM2's SwiGLU gate ran 8× faster on AVX2 than the scalar loop.
#pragma once

#include <bit>
#include <cstdint>

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

/// `y[i] = exp_f32(x[i])`, in place allowed.
void exp_f32(const float* x, float* y, std::int64_t n);

/// SwiGLU's gate: `a[i] = g[i]·σ(g[i])·u[i] = g[i] / (1 + e^{−g[i]}) · u[i]`, with `exp_f32`'s
/// exponential. A gate below −88 gives g/(1 + e^88) (tiny, not NaN); NaN propagates.
void silu_mul(const float* g, const float* u, float* a, std::int64_t n);

/// GeGLU's gate with the tanh form of GELU (Hendrycks, Gimpel, "Gaussian Error Linear Units",
/// 2016): `a[i] = gelu(g[i])·u[i]`, gelu(x) = x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³))), computed
/// as x / (1 + e^{−2z}) with `exp_f32`'s exponential (z the tanh's argument). Large negative
/// gates give −0 or a tiny value (never NaN), large positive ones x; NaN propagates.
void gelu_tanh_mul(const float* g, const float* u, float* a, std::int64_t n);

/// Σ x[i]² accumulated in double (the RMS norm's sum of squares): 4 or 8 double lanes, then
/// scalar. The order differs from a sequential sum by far less than a float32 ulp of the norm.
double sum_squares_f64(const float* x, std::int64_t n);

/// max_i x[i]: -inf for n = 0, NaN when any x[i] is NaN (a NaN logit must reach the output).
float max_f32(const float* x, std::int64_t n);

/// `x[i] ← exp_f32(x[i] + shift) + add`, returning Σ_i x[i] (new values) summed in float32
/// lanes, then the lanes and the tail in double. The softmax numerator with shift = −max.
double exp_shift(float* x, std::int64_t n, float shift, float add = 0.f);

/// Σ x[i]·y[i] in float32 (vector lanes, then the lanes in order, then the tail).
float dot_f32(const float* x, const float* y, std::int64_t n);

}  // namespace numattn::simd
