// Internal: Quest's page scoring (sparse/quest.h), written once and compiled per instruction-set
// variant (core/isa_begin.h). The including file defines NUMATTN_ISA and includes this file
// once; it defines numattn::quest_ops::<variant>::ops().
//
// A page's bound Σ_d max(q_d·m_d, q_d·M_d) equals Σ_d q⁺_d·M_d + q⁻_d·m_d with q⁺ = max(q, 0),
// q⁻ = min(q, 0) (as m ≤ M): one dot product of [q⁺ | q⁻] with the page's summary row [M | m].
// Scoring a decode step's pages is then the logits of G queries against the summary rows, read
// once for the whole group, in the summaries' own element type.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/isa_dispatch.h"
#include "numattn/attention/problem.h"
#include "numattn/core/tensor.h"
#include "numattn/quant/quant.h"

namespace numattn::quest_ops {

struct Ops {
  /// out[P] = max_{g < G} Σ_{d < w} qpm[g·w + d] · s[P·w + d] for P < n: rows of width w in the
  /// element type `t` (f32: `s` points to floats; f16 / bf16: to 16-bit values).
  void (*bounds)(const void* s, KvType t, index_t n, index_t w, const float* qpm, index_t G, float* out);
};

NUMATTN_DECLARE_ISA_VARIANTS(const Ops*, ops)

}  // namespace numattn::quest_ops

#include "core/isa_begin.h"

namespace numattn::quest_ops::NUMATTN_ISA_NS {

#if NUMATTN_ISA_COMPILED

namespace {

constexpr index_t kQ = 4;  // queries scored per pass over a row (accumulators live in registers)

/// Element `at` of a summary row as float32 (the scalar tails).
template <KvType T>
inline float scalar_at(const void* s, index_t at) {
  if constexpr (T == KvType::kF32) return static_cast<const float*>(s)[at];
  else if constexpr (T == KvType::kF16) return fp16_to_fp32(static_cast<const std::uint16_t*>(s)[at]);
  else return bf16_to_fp32(static_cast<const std::uint16_t*>(s)[at]);
}

#if NUMATTN_ISA == 2
template <KvType T>
inline __m512 load16(const void* s, index_t at, __mmask16 m) {
  if constexpr (T == KvType::kF32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(s) + at);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const std::uint16_t*>(s) + at);
    if constexpr (T == KvType::kF16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <KvType T>
void bounds_t(const void* s, index_t n, index_t w, const float* qpm, index_t G, float* out) {
  const index_t full = w / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (w - full)) - 1u);
  for (index_t P = 0; P < n; ++P) {
    float best = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (index_t g0 = 0; g0 < G; g0 += kQ) {
      const index_t m = std::min(kQ, G - g0);
      __m512 acc[kQ] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      const float* q = qpm + g0 * w;
      for (index_t d = 0; d < w; d += 16) {
        const __mmask16 msk = d < full ? static_cast<__mmask16>(0xffff) : tail;
        const __m512 x = load16<T>(s, P * w + d, msk);
        for (index_t g = 0; g < m; ++g) acc[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(msk, q + g * w + d), x, acc[g]);
      }
      for (index_t g = 0; g < m; ++g) {
        const float v = _mm512_reduce_add_ps(acc[g]);
        nan |= v != v;
        best = std::max(best, v);
      }
    }
    out[P] = nan ? std::numeric_limits<float>::quiet_NaN() : best;
  }
}
#elif NUMATTN_ISA == 1
template <KvType T>
inline __m256 load8(const void* s, index_t at) {
  if constexpr (T == KvType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(s) + at);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(s) + at));
    if constexpr (T == KvType::kF16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

inline float hsum(__m256 v) {
  const __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

template <KvType T>
void bounds_t(const void* s, index_t n, index_t w, const float* qpm, index_t G, float* out) {
  const index_t full = w / 8 * 8;
  for (index_t P = 0; P < n; ++P) {
    float best = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (index_t g0 = 0; g0 < G; g0 += kQ) {
      const index_t m = std::min(kQ, G - g0);
      __m256 acc[kQ] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      const float* q = qpm + g0 * w;
      for (index_t d = 0; d < full; d += 8) {
        const __m256 x = load8<T>(s, P * w + d);
        for (index_t g = 0; g < m; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * w + d), x, acc[g]);
      }
      for (index_t g = 0; g < m; ++g) {
        float v = hsum(acc[g]);
        for (index_t d = full; d < w; ++d) v += q[g * w + d] * scalar_at<T>(s, P * w + d);
        nan |= v != v;
        best = std::max(best, v);
      }
    }
    out[P] = nan ? std::numeric_limits<float>::quiet_NaN() : best;
  }
}
#else
template <KvType T>
void bounds_t(const void* s, index_t n, index_t w, const float* qpm, index_t G, float* out) {
  // Independent partial sums per lane, so that the compiler can vectorise the dot products.
  constexpr int kLanes = 8;
  for (index_t P = 0; P < n; ++P) {
    float best = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (index_t g = 0; g < G; ++g) {
      const float* q = qpm + g * w;
      float acc[kLanes] = {};
      index_t d = 0;
      for (; d + kLanes <= w; d += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += q[d + l] * scalar_at<T>(s, P * w + d + l);
      float v = 0.f;
      for (; d < w; ++d) v += q[d] * scalar_at<T>(s, P * w + d);
      for (float a : acc) v += a;
      nan |= v != v;
      best = std::max(best, v);
    }
    out[P] = nan ? std::numeric_limits<float>::quiet_NaN() : best;
  }
}
#endif

void bounds(const void* s, KvType t, index_t n, index_t w, const float* qpm, index_t G, float* out) {
  switch (t) {
    case KvType::kF32: return bounds_t<KvType::kF32>(s, n, w, qpm, G, out);
    case KvType::kF16: return bounds_t<KvType::kF16>(s, n, w, qpm, G, out);
    case KvType::kBf16: return bounds_t<KvType::kBf16>(s, n, w, qpm, G, out);
  }
}

}  // namespace

#endif  // NUMATTN_ISA_COMPILED

}  // namespace numattn::quest_ops::NUMATTN_ISA_NS

#include "core/isa_end.h"

namespace numattn::quest_ops::NUMATTN_ISA_NS {
const Ops* ops() {
#if NUMATTN_ISA_COMPILED
  static constexpr Ops k{bounds};
  return &k;
#else
  return nullptr;
#endif
}
}  // namespace numattn::quest_ops::NUMATTN_ISA_NS
