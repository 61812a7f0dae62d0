// AVX-512 kernels of quant_gemv (model/qgemv.h): one row of blocks times a float32 vector,
// each block's values rebuilt in 16-lane registers (zero-extend, mask, convert) and multiplied
// by x with FMAs. Compiled for AVX-512 F/BW/VL/DQ + F16C + FMA by the pragma below whatever
// the build's -march; called only when cpuid says the CPU has them (qgemv.cpp).
// Nothing here has external linkage but avx512_table(): see qgemv_kernels.h for why.
#include "qgemv_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2")
// GCC 12 reports the deliberately undefined pass-through operand of its own AVX-512
// intrinsics (_mm512_undefined_*) as uninitialized when they are inlined under a target pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

namespace numattn::qkern {
namespace {

float half(const std::uint8_t* p) {
  unsigned short h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

__mmask16 tail_mask(std::int64_t r) { return static_cast<__mmask16>((1u << r) - 1u); }

float dot_f32(const float* a, const float* b, std::int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

float dot_f32_row(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  return dot_f32(reinterpret_cast<const float*>(row), x, cols);
}

float dot_f16(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  std::int64_t i = 0;
  for (; i + 32 <= cols; i += 32) {
    const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
    const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i + 32)));
    s0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), s0);
    s1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), s1);
  }
  for (; i < cols; i += 16) {
    const __mmask16 m = cols - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(cols - i);
    const __m512 w = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
    s0 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

float dot_bf16(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  __m512 s0 = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < cols; i += 16) {
    const __mmask16 m = cols - i >= 16 ? static_cast<__mmask16>(0xFFFF) : tail_mask(cols - i);
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * i));
    const __m512 w = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));  // bf16 = top half of f32
    s0 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x + i), s0);
  }
  return _mm512_reduce_add_ps(s0);
}

// Q8_0: d·Σ q_j x_j, blocks of 34 bytes (fp16 d, int8 q[32]).
float dot_q8_0(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  const std::int64_t nb = cols / 32;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  auto block = [&](std::int64_t b, __m512& acc) {
    const std::uint8_t* p = row + b * 34;
    const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2))));
    const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18))));
    __m512 t = _mm512_mul_ps(q0, _mm512_loadu_ps(x + 32 * b));
    t = _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + 32 * b + 16), t);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(half(p)), t, acc);
  };
  std::int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block(b, acc0);
    block(b + 1, acc1);
  }
  if (b < nb) block(b, acc0);
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// Q4_0 and Q4_1: 16 bytes of nibbles (low = elements 0..15, high = 16..31) zero-extended to
// 16 lanes, each value rebuilt as dequantize_row does ((q − 8)·d, or q·d + m in one FMA) and
// then multiplied by x. Factoring d and m out of the block (d·Σqx + m·Σx) would save an
// operation but lets the two sums cancel, giving errors relative to |m|·Σ|x| instead of Σ|w·x|.
template <bool kMin>
float dot_q4(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  constexpr std::int64_t kBytes = kMin ? 20 : 18, kQs = kMin ? 4 : 2;
  const std::int64_t nb = cols / 32;
  const __m512i m15 = _mm512_set1_epi32(15), c8 = _mm512_set1_epi32(8);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* p = row + b * kBytes;
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQs)));
    __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_srli_epi32(v, 4);
    const __m512 d = _mm512_set1_ps(half(p));
    __m512 w0, w1;
    if constexpr (kMin) {
      const __m512 m = _mm512_set1_ps(half(p + 2));
      w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), d, m);
      w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), d, m);
    } else {
      lo = _mm512_sub_epi32(lo, c8);
      hi = _mm512_sub_epi32(hi, c8);
      w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d);
      w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d);
    }
    acc0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + 32 * b), acc0);
    acc1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 32 * b + 16), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

float dot_q4_0(const std::uint8_t* r, const float* x, const float* xs, std::int64_t c) { return dot_q4<false>(r, x, xs, c); }
float dot_q4_1(const std::uint8_t* r, const float* x, const float* xs, std::int64_t c) { return dot_q4<true>(r, x, xs, c); }

// Q6_K: super-blocks of 256 (ql[128], qh[64], int8 scales[16], fp16 d). In each half of 128
// values, element l (0..31) of the four 32-runs takes its low 4 bits from ql[l] / ql[l+32]
// (low, low, high, high nibble) and its top 2 bits from qh[l] bits 0-1, 2-3, 4-5, 6-7; every
// 16 values share one scale. Lanes here are 16 consecutive l, so each vector has one scale.
float dot_q6_k(const std::uint8_t* row, const float* x, const float*, std::int64_t cols) {
  const std::int64_t nb = cols / 256;
  const __m512i m15 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3), c32 = _mm512_set1_epi32(32);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* p = row + b * 210;
    const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
    const float d = half(p + 208);
    const float* xb = x + 256 * b;
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* ql = p + 64 * h;
      const std::uint8_t* qh = p + 128 + 32 * h;
      const std::int8_t* s = sc + 8 * h;
      const float* xh = xb + 128 * h;
      for (int c = 0; c < 2; ++c) {
        const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 16 * c)));
        const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 32 + 16 * c)));
        const __m512i hb = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * c)));
        const __m512i q1 = _mm512_or_si512(_mm512_and_si512(a, m15), _mm512_slli_epi32(_mm512_and_si512(hb, m3), 4));
        const __m512i q2 = _mm512_or_si512(_mm512_and_si512(e, m15),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2), m3), 4));
        const __m512i q3 = _mm512_or_si512(_mm512_srli_epi32(a, 4),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 4), m3), 4));
        const __m512i q4 = _mm512_or_si512(_mm512_srli_epi32(e, 4), _mm512_slli_epi32(_mm512_srli_epi32(hb, 6), 4));
        const int l0 = 16 * c;
        auto term = [&](__m512i q, int off, int si, __m512& acc) {
          const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, c32)), _mm512_loadu_ps(xh + off + l0));
          acc = _mm512_fmadd_ps(_mm512_set1_ps(d * static_cast<float>(s[si + c])), t, acc);
        };
        term(q1, 0, 0, acc0);
        term(q2, 32, 2, acc1);
        term(q3, 64, 4, acc0);
        term(q4, 96, 6, acc1);
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void deq_q8_0(const std::uint8_t* row, float* dst, std::int64_t cols) {
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const std::uint8_t* p = row + b * 34;
    const __m512 d = _mm512_set1_ps(half(p));
    for (int k = 0; k < 2; ++k) {
      const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + 16 * k)));
      _mm512_storeu_ps(dst + 32 * b + 16 * k, _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
    }
  }
}

void deq_q4_1(const std::uint8_t* row, float* dst, std::int64_t cols) {
  const __m512i m15 = _mm512_set1_epi32(15);
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const std::uint8_t* p = row + b * 20;
    const __m512 d = _mm512_set1_ps(half(p)), m = _mm512_set1_ps(half(p + 2));
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4)));
    _mm512_storeu_ps(dst + 32 * b, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, m15)), d, m));
    _mm512_storeu_ps(dst + 32 * b + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d, m));
  }
}

}  // namespace

}  // namespace numattn::qkern

// Outside the pragma: this runs on any CPU (to learn the path exists), so it must not be
// compiled for AVX-512 itself.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace numattn::qkern {
const KernelTable* avx512_table() {
  static const KernelTable t{dot_f32,  dot_f32_row, dot_f16,  dot_bf16, dot_q8_0,
                             dot_q4_0, dot_q4_1,    dot_q6_k, deq_q8_0, deq_q4_1};
  return &t;
}
}  // namespace numattn::qkern

#else
namespace numattn::qkern {
const KernelTable* avx512_table() { return nullptr; }
}  // namespace numattn::qkern
#endif
