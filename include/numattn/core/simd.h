/// @file simd.h
/// Vectorisable elementwise helpers used by the float32 kernels.
///
/// `exp_f32` is written so that GCC/Clang auto-vectorise loops over it (no calls, no
/// branches): Cody–Waite range reduction x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial
/// for e^r, and 2^n built in the exponent bits. Relative error ≤ 2 ulp on [-87, 88];
/// below -87.3 (including -inf) the result is exactly 0, above 88 it saturates at e^88.
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
  const float n = __builtin_roundevenf(xc * log2e);
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

/// `y[i] = exp(x[i])`, in place allowed.
inline void exp_f32(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = exp_f32(x[i]);
}

}  // namespace numattn::simd
