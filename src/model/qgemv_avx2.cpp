// AVX2 kernels of quant_gemv (model/qgemv.h): the AVX-512 ones (qgemv_avx512.cpp) at 8 lanes.
// Compiled for AVX2 + F16C + FMA by the pragma below whatever the build's -march; called only
// when cpuid says the CPU has them. Nothing has external linkage but avx2_table().
#include "qgemv_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
#endif
#include <immintrin.h>

namespace numattn::qkern {
namespace {

float half(const std::uint8_t* p) {
  unsigned short h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__m256i u8x8(const std::uint8_t* p) {  // 8 bytes -> 8 int32 lanes
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

__m256 s8f(__m128i bytes) {  // the low 8 signed bytes -> 8 floats
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

float dot_f32(const float* a, const float* b, std::int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float t = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

float dot_f32_row(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  return dot_f32(reinterpret_cast<const float*>(row), x, cols);
}

float dot_f16(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 16 <= cols; i += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i + 16)));
    s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), s1);
  }
  float t = hsum(_mm256_add_ps(s0, s1));
  for (; i < cols; ++i) t += half(row + 2 * i) * x[i];
  return t;
}

float dot_bf16(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  __m256 s0 = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 8 <= cols; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
    s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), _mm256_loadu_ps(x + i), s0);
  }
  float t = hsum(s0);
  for (; i < cols; ++i) {
    unsigned short h;
    memcpy(&h, row + 2 * i, 2);
    const unsigned u = static_cast<unsigned>(h) << 16;
    float w;
    memcpy(&w, &u, 4);
    t += w * x[i];
  }
  return t;
}

float dot_q8_0(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  const std::int64_t nb = cols / 32;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* p = row + b * 34;
    const float* xb = x + 32 * b;
    __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
    for (int k = 0; k < 4; k += 2) {
      const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * k))));
      const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 10 + 8 * k))));
      t0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xb + 8 * k), t0);
      t1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xb + 8 * k + 8), t1);
    }
    const __m256 d = _mm256_set1_ps(half(p));
    acc0 = _mm256_fmadd_ps(d, t0, acc0);
    acc1 = _mm256_fmadd_ps(d, t1, acc1);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// Q4_0 / Q4_1 as in the AVX-512 file (values rebuilt as dequantize_row does, then times x).
template <bool kMin>
float dot_q4(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  constexpr std::int64_t kBytes = kMin ? 20 : 18, kQs = kMin ? 4 : 2;
  const std::int64_t nb = cols / 32;
  const __m128i m15 = _mm_set1_epi8(15), c8 = _mm_set1_epi8(8);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* p = row + b * kBytes;
    const float* xb = x + 32 * b;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQs));
    __m128i lo = _mm_and_si128(v, m15), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m15);
    const __m256 d = _mm256_set1_ps(half(p));
    const __m256 m = _mm256_set1_ps(kMin ? half(p + 2) : 0.f);
    if constexpr (!kMin) {
      lo = _mm_sub_epi8(lo, c8);
      hi = _mm_sub_epi8(hi, c8);
    }
    __m256 q[4] = {s8f(lo), s8f(_mm_srli_si128(lo, 8)), s8f(hi), s8f(_mm_srli_si128(hi, 8))};
    for (int k = 0; k < 4; ++k) {
      const __m256 w = kMin ? _mm256_fmadd_ps(q[k], d, m) : _mm256_mul_ps(q[k], d);
      if (k % 2 == 0) {
        acc0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(xb + 8 * k), acc0);
      } else {
        acc1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(xb + 8 * k), acc1);
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

float dot_q4_0(const std::uint8_t* r, const float* x, const float* xs, std::int64_t c) { return dot_q4<false>(r, x, xs, c); }
float dot_q4_1(const std::uint8_t* r, const float* x, const float* xs, std::int64_t c) { return dot_q4<true>(r, x, xs, c); }

// Q6_K as in the AVX-512 file, 8 consecutive l per vector (scale index l / 16).
float dot_q6_k(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  const std::int64_t nb = cols / 256;
  const __m256i m15 = _mm256_set1_epi32(15), m3 = _mm256_set1_epi32(3), c32 = _mm256_set1_epi32(32);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* p = row + b * 210;
    const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
    const float d = half(p + 208);
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* ql = p + 64 * h;
      const std::uint8_t* qh = p + 128 + 32 * h;
      const std::int8_t* s = sc + 8 * h;
      const float* xh = x + 256 * b + 128 * h;
      for (int c = 0; c < 4; ++c) {
        const int l0 = 8 * c, is = c / 2;
        const __m256i a = u8x8(ql + l0), e = u8x8(ql + 32 + l0), hb = u8x8(qh + l0);
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m15), _mm256_slli_epi32(_mm256_and_si256(hb, m3), 4));
        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(e, m15),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 2), m3), 4));
        const __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 4), m3), 4));
        const __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(e, 4), _mm256_slli_epi32(_mm256_srli_epi32(hb, 6), 4));
        auto term = [&](__m256i q, int off, int si, __m256& acc) {
          const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, c32)), _mm256_loadu_ps(xh + off + l0));
          acc = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(s[si + is])), t, acc);
        };
        term(q1, 0, 0, acc0);
        term(q2, 32, 2, acc1);
        term(q3, 64, 4, acc0);
        term(q4, 96, 6, acc1);
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

void deq_q8_0(const std::uint8_t* row, float* dst, std::int64_t cols) {
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const std::uint8_t* p = row + b * 34;
    const __m256 d = _mm256_set1_ps(half(p));
    for (int k = 0; k < 4; ++k)
      _mm256_storeu_ps(dst + 32 * b + 8 * k, _mm256_mul_ps(s8f(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * k))), d));
  }
}

void deq_q4_1(const std::uint8_t* row, float* dst, std::int64_t cols) {
  const __m128i m15 = _mm_set1_epi8(15);
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const std::uint8_t* p = row + b * 20;
    const __m256 d = _mm256_set1_ps(half(p)), m = _mm256_set1_ps(half(p + 2));
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    const __m128i lo = _mm_and_si128(v, m15), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m15);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(dst + 32 * b + 8 * k, _mm256_fmadd_ps(s8f(parts[k]), d, m));
  }
}

}  // namespace
}  // namespace numattn::qkern

// Outside the pragma: runs on any CPU.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace numattn::qkern {
const KernelTable* avx2_table() {
  static const KernelTable t{dot_f32,  dot_f32_row, dot_f16,  dot_bf16, dot_q8_0,
                             dot_q4_0, dot_q4_1,    dot_q6_k, deq_q8_0, deq_q4_1};
  return &t;
}
}  // namespace numattn::qkern

#else
namespace numattn::qkern {
const KernelTable* avx2_table() { return nullptr; }
}  // namespace numattn::qkern
#endif
