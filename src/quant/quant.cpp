// ggml block formats: fp16/bf16 conversion, dequantization, reference quantizers.
// Layouts follow ggml-common.h (block structs) and ggml-quants.c (dequantize_row_*); the code is
// written from the formulas documented in quant.h.
#include "numattn/quant/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "numattn/core/error.h"

namespace numattn {

// ---- half and bfloat16 -----------------------------------------------------------------------

namespace {
std::uint32_t f2u(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float u2f(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t load_u16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }
void store_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v & 0xff);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
float load_f16(const std::uint8_t* p) { return fp16_to_fp32(load_u16(p)); }
}  // namespace

float fp16_to_fp32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant · 2^-24, exact in float.
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13));  // inf / NaN (payload kept)
  return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

std::uint16_t fp32_to_fp16(float f) {
  std::uint32_t x = f2u(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u)  // inf or NaN (keep NaN quiet)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0u));
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (x < 0x38800000u) {
    // Below the smallest normal half: a multiple of 2^-24; nearbyint rounds half to even.
    const float scaled = u2f(x) * 16777216.0f;  // exact (power-of-two scaling)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  std::uint32_t h = (((x >> 23) - 112u) << 10) | ((x >> 13) & 0x3ffu);
  const std::uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may bump the exponent: fine
  return static_cast<std::uint16_t>(sign | h);
}

float bf16_to_fp32(std::uint16_t h) { return u2f(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t fp32_to_bf16(float f) {
  const std::uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---- dequantization --------------------------------------------------------------------------

namespace {

void deq_q4_0(const std::uint8_t* b, float* y) {
  const float d = load_f16(b);
  const std::uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 15) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void deq_q4_1(const std::uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const std::uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 15) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

std::uint32_t load_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// Q5_0 / Q5_1: the fifth bit of element j is bit j of the little-endian u32 qh.
void deq_q5(const std::uint8_t* b, float* y, bool has_min) {
  const float d = load_f16(b);
  const float m = has_min ? load_f16(b + 2) : 0.f;
  const std::uint8_t* p = b + (has_min ? 4 : 2);
  const std::uint32_t qh = load_u32(p);
  const std::uint8_t* qs = p + 4;
  const int off = has_min ? 0 : 16;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    // No "+ 0" for Q5_0: it would turn ggml's -0.0 (0 times a negative d) into +0.0.
    y[j] = has_min ? static_cast<float>(lo) * d + m : static_cast<float>(lo - off) * d;
    y[j + 16] = has_min ? static_cast<float>(hi) * d + m : static_cast<float>(hi - off) * d;
  }
}

void deq_q8_0(const std::uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j])) * d;
}

// 6-bit scale and min of sub-block j (0..7) packed in 12 bytes (Q4_K / Q5_K).
void scale_min_k4(int j, const std::uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void deq_q4_k(const std::uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* q = b + 16;
  // Each 64 values: 32 bytes, low nibbles first (sub-block 2i), then high nibbles (2i+1).
  for (int i = 0; i < 4; ++i) {
    int sc1, m1, sc2, m2;
    scale_min_k4(2 * i, scales, &sc1, &m1);
    scale_min_k4(2 * i + 1, scales, &sc2, &m2);
    const float d1 = d * static_cast<float>(sc1), mm1 = dmin * static_cast<float>(m1);
    const float d2 = d * static_cast<float>(sc2), mm2 = dmin * static_cast<float>(m2);
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 15) - mm1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>(q[l] >> 4) - mm2;
    q += 32;
    y += 64;
  }
}

// Q5_K: Q4_K's scales and nibbles (qs at byte 48) plus a fifth bit per value: element l of
// sub-block s (0..7) takes bit s of qh[l] (qh: 32 bytes at byte 16) as its bit 4.
void deq_q5_k(const std::uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* qh = b + 16;
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    scale_min_k4(s, scales, &sc, &m);
    const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(m);
    const std::uint8_t* q = b + 48 + 32 * (s / 2);
    const int shift = 4 * (s & 1);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 15) | (((qh[l] >> s) & 1) << 4);
      y[32 * s + l] = ds * static_cast<float>(v) - ms;
    }
  }
}

void deq_q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, std::int64_t n) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  NUMATTN_CHECK(ti.dequantizable, "dequantization of {} tensors is not supported (supported: F32, "
                "F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", ti.name);
  NUMATTN_CHECK(n >= 0 && n % ti.block_elems == 0,
                "dequantize_row: {} elements is not a multiple of the {} block size {}", n, ti.name,
                ti.block_elems);
  if (n == 0) return;  // zero-element tensors exist; their pointers may be null
  const auto* p = static_cast<const std::uint8_t*>(src);
  const std::int64_t nb = n / ti.block_elems;
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, p, static_cast<std::size_t>(n) * 4); return;
    case GgmlType::F16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = load_f16(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(p + 2 * i));
      return;
    default: break;
  }
  for (std::int64_t i = 0; i < nb; ++i) {
    const std::uint8_t* b = p + i * ti.block_bytes;
    float* y = dst + i * ti.block_elems;
    switch (type) {
      case GgmlType::Q4_0: deq_q4_0(b, y); break;
      case GgmlType::Q4_1: deq_q4_1(b, y); break;
      case GgmlType::Q5_0: deq_q5(b, y, false); break;
      case GgmlType::Q5_1: deq_q5(b, y, true); break;
      case GgmlType::Q8_0: deq_q8_0(b, y); break;
      case GgmlType::Q4_K: deq_q4_k(b, y); break;
      case GgmlType::Q5_K: deq_q5_k(b, y); break;
      case GgmlType::Q6_K: deq_q6_k(b, y); break;
      default: NUMATTN_ASSERT(false);
    }
  }
}

// ---- quantization ----------------------------------------------------------------------------

namespace {

// round(v) clamped to [lo, hi]; NaN maps to `lo` (never a float->int overflow).
int round_clamp(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::lround(v));
}

// Scales are rounded to fp16 *before* quantizing with them, so the stored scale is the one the
// quantized values were computed for (ggml's reference uses the unrounded scale instead).
void q8_0_block(const float* x, std::uint8_t* b) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const std::uint16_t dh = fp32_to_fp16(amax / 127.f);
  const float d = fp16_to_fp32(dh);
  const float id = d != 0.f ? 1.f / d : 0.f;
  store_u16(b, dh);
  for (int j = 0; j < 32; ++j)
    b[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(round_clamp(x[j] * id, -127, 127)));
}

void q4_0_block(const float* x, std::uint8_t* b) {
  // The value of largest magnitude maps to -8, so the full range [-8, 7] is used.
  float amax = 0.f, vmax = 0.f;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      vmax = x[j];
    }
  const std::uint16_t dh = fp32_to_fp16(vmax / -8.f);
  const float d = fp16_to_fp32(dh);
  const float id = d != 0.f ? 1.f / d : 0.f;
  store_u16(b, dh);
  for (int j = 0; j < 16; ++j) {
    const int lo = round_clamp(x[j] * id, -8, 7) + 8;
    const int hi = round_clamp(x[j + 16] * id, -8, 7) + 8;
    b[2 + j] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

void q4_1_block(const float* x, std::uint8_t* b) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const std::uint16_t dh = fp32_to_fp16((hi - lo) / 15.f);
  const std::uint16_t mh = fp32_to_fp16(lo);
  const float d = fp16_to_fp32(dh), m = fp16_to_fp32(mh);
  const float id = d != 0.f ? 1.f / d : 0.f;
  store_u16(b, dh);
  store_u16(b + 2, mh);
  for (int j = 0; j < 16; ++j) {
    const int a = round_clamp((x[j] - m) * id, 0, 15);
    const int c = round_clamp((x[j + 16] - m) * id, 0, 15);
    b[4 + j] = static_cast<std::uint8_t>(a | (c << 4));
  }
}

}  // namespace

void quantize_row(GgmlType type, const float* src, void* dst, std::int64_t n) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  NUMATTN_CHECK(ti.quantizable, "quantization to {} is not supported (supported: F32, F16, BF16, "
                "Q8_0, Q4_0, Q4_1)", ti.name);
  NUMATTN_CHECK(n >= 0 && n % ti.block_elems == 0,
                "quantize_row: {} elements is not a multiple of the {} block size {}", n, ti.name,
                ti.block_elems);
  if (n == 0) return;
  auto* p = static_cast<std::uint8_t*>(dst);
  const std::int64_t nb = n / ti.block_elems;
  for (std::int64_t i = 0; i < nb; ++i) {
    const float* x = src + i * ti.block_elems;
    std::uint8_t* b = p + i * ti.block_bytes;
    switch (type) {
      case GgmlType::F32: std::memcpy(b, x, 4); break;
      case GgmlType::F16: store_u16(b, fp32_to_fp16(*x)); break;
      case GgmlType::BF16: store_u16(b, fp32_to_bf16(*x)); break;
      case GgmlType::Q8_0: q8_0_block(x, b); break;
      case GgmlType::Q4_0: q4_0_block(x, b); break;
      case GgmlType::Q4_1: q4_1_block(x, b); break;
      default: NUMATTN_ASSERT(false);
    }
  }
}

std::vector<std::uint8_t> quantize(GgmlType type, const float* src, std::int64_t n) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(ggml_row_bytes(type, n)));
  quantize_row(type, src, out.data(), n);
  return out;
}

}  // namespace numattn
