// ggml block formats: half/bfloat16 conversion, dequantization of hand-built blocks (expected
// values computed element by element from the format description), quantization error bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "numattn/core/error.h"
#include "numattn/quant/quant.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Half, EveryHalfRoundTrips) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), h) << h;
  }
}

TEST(Half, KnownValuesAndRounding) {
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0x7c00)));
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // the tie rounds to even = infinity
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even (down)
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie to even (up)
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -26)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // into normal
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(BFloat16, RoundTripAndRounding) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_fp32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_bf16(f), h);
  }
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(fp32_to_bf16(bits_to_float(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(bits_to_float(0x3f818000)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(fp32_to_bf16(bits_to_float(0x3f808001)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

// ---- hand-built blocks --------------------------------------------------------------------------

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::uint8_t> b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(g());
  return b;
}
void put_half(std::uint8_t* p, float v) {
  const std::uint16_t h = fp32_to_fp16(v);
  p[0] = static_cast<std::uint8_t>(h & 0xff);
  p[1] = static_cast<std::uint8_t>(h >> 8);
}
float half_at(const std::uint8_t* p) { return fp16_to_fp32(static_cast<std::uint16_t>(p[0] | (p[1] << 8))); }

// The low nibble of byte j holds element j, the high nibble element j + 16.
int nibble(const std::uint8_t* qs, int j) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); }

std::vector<float> deq(GgmlType t, const std::vector<std::uint8_t>& b, std::int64_t n) {
  std::vector<float> y(static_cast<std::size_t>(n));
  dequantize_row(t, b.data(), y.data(), n);
  return y;
}

TEST(Dequant, Q4_1KnownValues) {
  // d = 0.5, m = -1, element j has nibble j % 16 -> j%16 · 0.5 − 1.
  std::vector<std::uint8_t> b(20);
  put_half(&b[0], 0.5f);
  put_half(&b[2], -1.0f);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const auto y = deq(GgmlType::Q4_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f - 1.0f) << j;
    EXPECT_EQ(y[j + 16], (15 - j) * 0.5f - 1.0f) << j;
  }
}

TEST(Dequant, Q4_0Q4_1Q8_0RandomBlocks) {
  const int nb = 5;
  auto q40 = random_bytes(18 * nb, 1), q41 = random_bytes(20 * nb, 2), q80 = random_bytes(34 * nb, 3);
  for (int i = 0; i < nb; ++i) {
    put_half(&q40[18 * i], 0.125f * (i + 1));
    put_half(&q41[20 * i], 0.0625f * (i + 1));
    put_half(&q41[20 * i + 2], -0.75f + i);
    put_half(&q80[34 * i], -0.01f * (i + 1));
  }
  const auto y40 = deq(GgmlType::Q4_0, q40, 32 * nb);
  const auto y41 = deq(GgmlType::Q4_1, q41, 32 * nb);
  const auto y80 = deq(GgmlType::Q8_0, q80, 32 * nb);
  for (int i = 0; i < nb; ++i)
    for (int j = 0; j < 32; ++j) {
      const std::uint8_t* b40 = &q40[18 * i];
      const std::uint8_t* b41 = &q41[20 * i];
      const std::uint8_t* b80 = &q80[34 * i];
      EXPECT_EQ(y40[32 * i + j], (nibble(b40 + 2, j) - 8) * half_at(b40));
      EXPECT_EQ(y41[32 * i + j], nibble(b41 + 4, j) * half_at(b41) + half_at(b41 + 2));
      EXPECT_EQ(y80[32 * i + j], static_cast<std::int8_t>(b80[2 + j]) * half_at(b80));
    }
}

TEST(Dequant, Q5_0Q5_1RandomBlocks) {
  const int nb = 4;
  auto q50 = random_bytes(22 * nb, 4), q51 = random_bytes(24 * nb, 5);
  for (int i = 0; i < nb; ++i) {
    put_half(&q50[22 * i], 0.25f + i);
    put_half(&q51[24 * i], 0.5f * (i + 1));
    put_half(&q51[24 * i + 2], -3.0f + i);
  }
  const auto y50 = deq(GgmlType::Q5_0, q50, 32 * nb);
  const auto y51 = deq(GgmlType::Q5_1, q51, 32 * nb);
  for (int i = 0; i < nb; ++i)
    for (int j = 0; j < 32; ++j) {
      const std::uint8_t* b0 = &q50[22 * i];
      const std::uint8_t* b1 = &q51[24 * i];
      // Fifth bit: bit j of the little-endian 32-bit qh.
      const int h0 = (b0[2 + j / 8] >> (j % 8)) & 1;
      const int h1 = (b1[4 + j / 8] >> (j % 8)) & 1;
      EXPECT_EQ(y50[32 * i + j], ((nibble(b0 + 6, j) | (h0 << 4)) - 16) * half_at(b0)) << i << " " << j;
      EXPECT_EQ(y51[32 * i + j], (nibble(b1 + 8, j) | (h1 << 4)) * half_at(b1) + half_at(b1 + 2));
    }
}

TEST(Dequant, Q4_KRandomBlocks) {
  const int nb = 3;
  auto q = random_bytes(144 * nb, 6);
  for (int i = 0; i < nb; ++i) {
    put_half(&q[144 * i], 0.01f * (i + 1));
    put_half(&q[144 * i + 2], 0.003f * (i + 2));
  }
  const auto y = deq(GgmlType::Q4_K, q, 256 * nb);
  for (int i = 0; i < nb; ++i) {
    const std::uint8_t* b = &q[144 * i];
    const float d = half_at(b), dmin = half_at(b + 2);
    const std::uint8_t* sc = b + 4;
    const std::uint8_t* qs = b + 16;
    for (int e = 0; e < 256; ++e) {
      const int s = e / 32;  // sub-block: 64-value group e/64, low (even) or high (odd) nibbles
      int scale, mn;
      if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
      } else {
        scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
      }
      const std::uint8_t byte = qs[32 * (e / 64) + e % 32];
      const int v = (s % 2 == 0) ? (byte & 15) : (byte >> 4);
      EXPECT_FLOAT_EQ(y[256 * i + e], d * scale * v - dmin * mn) << i << " " << e;
    }
  }
}

TEST(Dequant, Q5_KRandomBlocks) {
  const int nb = 3;
  auto q = random_bytes(176 * nb, 8);
  for (int i = 0; i < nb; ++i) {
    put_half(&q[176 * i], 0.02f * (i + 1));
    put_half(&q[176 * i + 2], -0.004f * (i + 2));
  }
  const auto y = deq(GgmlType::Q5_K, q, 256 * nb);
  for (int i = 0; i < nb; ++i) {
    const std::uint8_t* b = &q[176 * i];
    const float d = half_at(b), dmin = half_at(b + 2);
    const std::uint8_t* sc = b + 4;
    const std::uint8_t* qh = b + 16;
    const std::uint8_t* qs = b + 48;
    for (int e = 0; e < 256; ++e) {
      const int s = e / 32, l = e % 32;
      int scale, mn;
      if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
      } else {
        scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
      }
      const std::uint8_t byte = qs[32 * (e / 64) + l];
      const int v = ((s % 2 == 0) ? (byte & 15) : (byte >> 4)) + 16 * ((qh[l] >> s) & 1);
      // d·scale·v is exact in float32: one rounding, of the difference.
      EXPECT_EQ(y[256 * i + e], static_cast<float>(static_cast<double>(d) * scale * v -
                                                   static_cast<double>(dmin) * mn)) << i << " " << e;
    }
  }
}

TEST(Dequant, Q6_KRandomBlocks) {
  const int nb = 3;
  auto q = random_bytes(210 * nb, 7);
  for (int i = 0; i < nb; ++i) put_half(&q[210 * i + 208], 0.02f * (i + 1));
  const auto y = deq(GgmlType::Q6_K, q, 256 * nb);
  for (int i = 0; i < nb; ++i) {
    const std::uint8_t* b = &q[210 * i];
    const std::uint8_t* ql = b;
    const std::uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
    const float d = half_at(b + 208);
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, w = e % 128, k = w / 32, l = w % 32;
      const std::uint8_t lb = ql[64 * half + l + ((k & 1) ? 32 : 0)];
      const int lo = k < 2 ? (lb & 15) : (lb >> 4);
      const int hi = (qh[32 * half + l] >> (2 * k)) & 3;
      const int s = sc[8 * half + l / 16 + 2 * k];
      EXPECT_FLOAT_EQ(y[256 * i + e], d * s * ((lo | (hi << 4)) - 32)) << i << " " << e;
    }
  }
}

TEST(Dequant, PlainTypes) {
  const std::vector<float> x = {1.5f, -2.25f, 0.f, 65504.f};
  std::vector<std::uint8_t> f32(16), f16(8), bf16(8);
  std::memcpy(f32.data(), x.data(), 16);
  for (int i = 0; i < 4; ++i) {
    put_half(&f16[2 * i], x[i]);
    const std::uint16_t h = fp32_to_bf16(x[i]);
    bf16[2 * i] = static_cast<std::uint8_t>(h & 0xff);
    bf16[2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
  }
  EXPECT_EQ(deq(GgmlType::F32, f32, 4), x);
  EXPECT_EQ(deq(GgmlType::F16, f16, 4), x);
  const auto yb = deq(GgmlType::BF16, bf16, 4);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(yb[i], x[i]);
  EXPECT_EQ(yb[3], 65536.f);  // 65504 is not a bfloat16; it rounds to 2^16
}

TEST(Dequant, RefusesWhatItCannotDo) {
  std::vector<std::uint8_t> b(400);
  std::vector<float> y(256);
  EXPECT_THROW(dequantize_row(GgmlType::Q2_K, b.data(), y.data(), 256), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q8_0, b.data(), y.data(), 31), Error);
  EXPECT_THROW(dequantize_row(static_cast<GgmlType>(99), b.data(), y.data(), 32), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q4_K, y.data(), b.data(), 256), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q4_0, y.data(), b.data(), 48), Error);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_1, 576), 18 * 20);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q6_K, 512), 420);
  EXPECT_THROW(ggml_row_bytes(GgmlType::Q6_K, 576), Error);
  EXPECT_EQ(parse_ggml_type("q4_1"), GgmlType::Q4_1);
  EXPECT_EQ(parse_ggml_type("BF16"), GgmlType::BF16);
  EXPECT_THROW(parse_ggml_type("q9"), Error);
  EXPECT_EQ(ggml_type_name(static_cast<GgmlType>(99)), "type#99");
  EXPECT_EQ(ggml_type_info(99u), nullptr);
}

// ---- quantization --------------------------------------------------------------------------------

// Max error per element allowed for `x` (one block) quantized as `t`: half a step, plus the
// effect of storing scale (and min) in fp16 (relative 2^-11 on each).
double bound(GgmlType t, const float* x, int n) {
  double lo = x[0], hi = x[0], amax = 0;
  for (int j = 0; j < n; ++j) {
    lo = std::min<double>(lo, x[j]);
    hi = std::max<double>(hi, x[j]);
    amax = std::max<double>(amax, std::fabs(x[j]));
  }
  const double u = std::ldexp(1.0, -11);
  switch (t) {
    case GgmlType::Q8_0: return amax / 127 * (0.5 + 128 * u) + 1e-30;
    case GgmlType::Q4_0: return amax / 8 * (0.5 + 9 * u) + 1e-30;
    case GgmlType::Q4_1: return (hi - lo) / 15 * (0.5 + 16 * u) + std::fabs(lo) * u + 1e-30;
    case GgmlType::F16: return amax * u;
    case GgmlType::BF16: return amax * std::ldexp(1.0, -8);
    default: return 0;
  }
}

TEST(Quant, RoundTripErrorBounds) {
  std::mt19937 g(11);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::F16, GgmlType::BF16,
                     GgmlType::F32}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x(32);
      std::normal_distribution<float> nd(trial % 3 == 0 ? 5.f : 0.f, trial % 2 ? 0.01f : 3.f);
      for (auto& v : x) v = nd(g);
      if (trial == 1) std::fill(x.begin(), x.end(), 0.f);
      if (trial == 2) std::fill(x.begin(), x.end(), -1.25f);
      if (trial == 3) x[7] = 1000.f;  // an outlier
      const auto q = quantize(t, x.data(), 32);
      ASSERT_EQ(q.size(), static_cast<std::size_t>(ggml_row_bytes(t, 32)));
      const auto y = deq(t, q, 32);
      if (t == GgmlType::F32) {
        EXPECT_EQ(y, x);
        continue;
      }
      // Per-element bounds hold per 32-element block (F16/BF16 are per element).
      for (int j = 0; j < 32; ++j) {
        double b = (t == GgmlType::F16 || t == GgmlType::BF16) ? bound(t, &x[j], 1) : bound(t, x.data(), 32);
        if (t == GgmlType::F16) b = std::max(b, std::ldexp(1.0, -25));  // subnormal spacing / 2
        if (t == GgmlType::Q4_0) {
          // The extreme maps to -8, so a value of the other sign near it clamps at +7.
          double amax = 0;
          for (float v : x) amax = std::max<double>(amax, std::fabs(v));
          b += std::max(0.0, std::fabs(x[j]) - 7.5 * amax / 8);
        }
        EXPECT_LE(std::fabs(double(y[j]) - x[j]), b) << ggml_type_name(t) << " trial " << trial << " j " << j;
      }
    }
  }
}

TEST(Quant, ErrorFallsWithBits) {
  std::mt19937 g(12);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(32 * 64);
  for (auto& v : x) v = nd(g);
  auto rms_err = [&](GgmlType t) {
    const auto y = deq(t, quantize(t, x.data(), static_cast<std::int64_t>(x.size())), static_cast<std::int64_t>(x.size()));
    double s = 0;
    for (std::size_t i = 0; i < x.size(); ++i) s += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    return std::sqrt(s / x.size());
  };
  const double e4 = rms_err(GgmlType::Q4_0), e41 = rms_err(GgmlType::Q4_1), e8 = rms_err(GgmlType::Q8_0);
  const double eh = rms_err(GgmlType::F16);
  EXPECT_LT(e8, e4 / 8);
  EXPECT_LT(e41, e4 * 1.2);
  EXPECT_LT(eh, e8 / 8);
  EXPECT_LT(e4, 0.15);
}

TEST(Quant, NonFiniteInputsDoNotCrash) {
  std::vector<float> x(32, 1.f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[5] = std::numeric_limits<float>::infinity();
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::F16, GgmlType::BF16})
    EXPECT_NO_THROW(quantize(t, x.data(), 32));
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
