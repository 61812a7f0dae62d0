// Internal: the loops of attention/blocks/select_gather.h, written once and compiled per
// instruction-set variant (core/isa_begin.h). The including file defines NUMATTN_ISA and
// includes this file once; it defines numattn::blocks::select_gather_ops::<variant>::ops().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/isa_dispatch.h"
#include "numattn/core/tensor.h"

namespace numattn::blocks::select_gather_ops {

struct Ops {
  /// c1 = #{u : s[u] ≥ t1}, c2 = #{u : s[u] ≥ t2}.
  void (*count2)(const float* s, index_t n, float t1, float t2, index_t* c1, index_t* c2);
  /// Positions (base + u, increasing) with s[u] ≥ b to `hi`, those with a ≤ s[u] < b to `band`
  /// (count in *nband). Returns the count written to `hi`. Both may be written up to 16 entries
  /// past their count.
  index_t (*split)(const float* s, index_t n, float a, float b, std::int32_t base, std::int32_t* hi,
                   std::int32_t* band, index_t* nband);
  /// The values of s in [a, b), in order, to `vals` (written up to 16 entries past the count).
  /// Returns the count.
  index_t (*band_values)(const float* s, index_t n, float a, float b, float* vals);
  /// s[r·lds + 16·p + c] = scale·(q_r · k_{16p+c}) for r < m, p < npanel, c < 16, with the keys
  /// packed in panels of 16 (select_gather.h, pack_key_panels).
  void (*panel_scores)(const float* q, index_t ldq, index_t m, index_t dk, const float* kt, index_t npanel,
                       float scale, float* s, index_t lds);
  /// l[t] = scale·(q · k_{idx[t]}).
  void (*logits)(const float* q, index_t dk, const float* k, index_t ldk, const std::int32_t* idx, index_t n,
                 float scale, float* l);
  /// out[0..dv) += Σ_t w[t]·v_{idx[t]}.
  void (*accumulate)(const float* w, index_t n, const float* v, index_t ldv, index_t dv, const std::int32_t* idx,
                     float* out);
};

NUMATTN_DECLARE_ISA_VARIANTS(const Ops*, ops)

}  // namespace numattn::blocks::select_gather_ops

#include "core/isa_begin.h"

namespace numattn::blocks::select_gather_ops::NUMATTN_ISA_NS {

#if NUMATTN_ISA_COMPILED

namespace {

#if NUMATTN_ISA == 2
// ---------------------------------------------------------------------------------------------
// AVX-512: 16 lanes; comparisons give mask registers, positions are compressed in registers and
// stored whole (hence the 16 entries of slack).

inline __mmask16 tail_mask(index_t r) { return static_cast<__mmask16>((1u << r) - 1u); }

void count2(const float* s, index_t n, float t1, float t2, index_t* c1, index_t* c2) {
  const __m512 a = _mm512_set1_ps(t1), b = _mm512_set1_ps(t2);
  index_t n1 = 0, n2 = 0, u = 0;
  for (; u + 32 <= n; u += 32) {
    const __m512 x = _mm512_loadu_ps(s + u), y = _mm512_loadu_ps(s + u + 16);
    n1 += _mm_popcnt_u32(_mm512_cmp_ps_mask(x, a, _CMP_GE_OQ)) + _mm_popcnt_u32(_mm512_cmp_ps_mask(y, a, _CMP_GE_OQ));
    n2 += _mm_popcnt_u32(_mm512_cmp_ps_mask(x, b, _CMP_GE_OQ)) + _mm_popcnt_u32(_mm512_cmp_ps_mask(y, b, _CMP_GE_OQ));
  }
  for (; u < n; u += 16) {
    const __mmask16 m = n - u >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - u);
    const __m512 x = _mm512_maskz_loadu_ps(m, s + u);
    n1 += _mm_popcnt_u32(_mm512_mask_cmp_ps_mask(m, x, a, _CMP_GE_OQ));
    n2 += _mm_popcnt_u32(_mm512_mask_cmp_ps_mask(m, x, b, _CMP_GE_OQ));
  }
  *c1 = n1;
  *c2 = n2;
}

index_t split(const float* s, index_t n, float a, float b, std::int32_t base, std::int32_t* hi, std::int32_t* band,
              index_t* nband) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  __m512i pos = _mm512_add_epi32(_mm512_set1_epi32(base),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i step = _mm512_set1_epi32(16);
  index_t nh = 0, nb = 0;
  for (index_t u = 0; u < n; u += 16) {
    const __mmask16 m = n - u >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - u);
    const __m512 x = _mm512_maskz_loadu_ps(m, s + u);
    const __mmask16 mb = _mm512_mask_cmp_ps_mask(m, x, vb, _CMP_GE_OQ);
    const __mmask16 ma = static_cast<__mmask16>(_mm512_mask_cmp_ps_mask(m, x, va, _CMP_GE_OQ) & ~mb);
    if (mb) {
      _mm512_storeu_si512(hi + nh, _mm512_maskz_compress_epi32(mb, pos));
      nh += _mm_popcnt_u32(mb);
    }
    if (ma) {
      _mm512_storeu_si512(band + nb, _mm512_maskz_compress_epi32(ma, pos));
      nb += _mm_popcnt_u32(ma);
    }
    pos = _mm512_add_epi32(pos, step);
  }
  *nband = nb;
  return nh;
}

index_t band_values(const float* s, index_t n, float a, float b, float* vals) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  index_t nb = 0;
  for (index_t u = 0; u < n; u += 16) {
    const __mmask16 m = n - u >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(n - u);
    const __m512 x = _mm512_maskz_loadu_ps(m, s + u);
    const __mmask16 ma = _mm512_mask_cmp_ps_mask(_mm512_mask_cmp_ps_mask(m, x, va, _CMP_GE_OQ), x, vb, _CMP_LT_OQ);
    if (ma) {
      _mm512_storeu_ps(vals + nb, _mm512_maskz_compress_ps(ma, x));
      nb += _mm_popcnt_u32(ma);
    }
  }
  return nb;
}

/// R rows × P panels of 16 keys: per d, P loads of k and R broadcasts of q feed R·P FMAs.
template <int R, int P>
void panel_tile(const float* q, index_t ldq, index_t dk, const float* kp, float scale, float* s, index_t lds) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < P; ++c) acc[r][c] = _mm512_setzero_ps();
  for (index_t d = 0; d < dk; ++d) {
    __m512 kv[P];
    for (int c = 0; c < P; ++c) kv[c] = _mm512_loadu_ps(kp + c * 16 * dk + 16 * d);
    for (int r = 0; r < R; ++r) {
      const __m512 qd = _mm512_set1_ps(q[r * ldq + d]);
      for (int c = 0; c < P; ++c) acc[r][c] = _mm512_fmadd_ps(qd, kv[c], acc[r][c]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < P; ++c) _mm512_storeu_ps(s + r * lds + 16 * c, _mm512_mul_ps(acc[r][c], sc));
}

template <int P>
void panel_cols(const float* q, index_t ldq, index_t m, index_t dk, const float* kp, float scale, float* s,
                index_t lds) {
  // Every row group over the same P panels, which stay in L1 (the keys stream from memory once).
  index_t r = 0;
  for (; r + 4 <= m; r += 4) panel_tile<4, P>(q + r * ldq, ldq, dk, kp, scale, s + r * lds, lds);
  for (; r < m; ++r) panel_tile<1, P>(q + r * ldq, ldq, dk, kp, scale, s + r * lds, lds);
}

void panel_scores(const float* q, index_t ldq, index_t m, index_t dk, const float* kt, index_t npanel, float scale,
                  float* s, index_t lds) {
  index_t p = 0;
  for (; p + 4 <= npanel; p += 4) panel_cols<4>(q, ldq, m, dk, kt + p * 16 * dk, scale, s + 16 * p, lds);
  for (; p < npanel; ++p) panel_cols<1>(q, ldq, m, dk, kt + p * 16 * dk, scale, s + 16 * p, lds);
}

/// Σ of the 16 lanes of each of four vectors, as lanes 0..3 of a 128-bit vector.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 512 → 256: add the halves.
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1)));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), 1)));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d), 1)));
  // Pairwise horizontal adds: [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7].
  const __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // [a, b, c, d partial | a, b, c, d partial]
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/// C chunks of 16 lanes (the last one masked by mr): q stays in registers, four keys in flight.
template <int C>
void logits_c(const float* q, const float* k, index_t ldk, const std::int32_t* idx, index_t n, float scale, float* l,
              __mmask16 mr) {
  __m512 qv[C];
  for (int c = 0; c < C; ++c) qv[c] = _mm512_maskz_loadu_ps(c == C - 1 ? mr : static_cast<__mmask16>(0xffff), q + 16 * c);
  const __m128 sc = _mm_set1_ps(scale);
  index_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const float* k0 = k + static_cast<index_t>(idx[t]) * ldk;
    const float* k1 = k + static_cast<index_t>(idx[t + 1]) * ldk;
    const float* k2 = k + static_cast<index_t>(idx[t + 2]) * ldk;
    const float* k3 = k + static_cast<index_t>(idx[t + 3]) * ldk;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < C; ++c) {
      const __mmask16 m = c == C - 1 ? mr : static_cast<__mmask16>(0xffff);
      a0 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(m, k0 + 16 * c), a0);
      a1 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(m, k1 + 16 * c), a1);
      a2 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(m, k2 + 16 * c), a2);
      a3 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(m, k3 + 16 * c), a3);
    }
    _mm_storeu_ps(l + t, _mm_mul_ps(hsum4(a0, a1, a2, a3), sc));
  }
  for (; t < n; ++t) {
    const float* kr = k + static_cast<index_t>(idx[t]) * ldk;
    __m512 a = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c)
      a = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(c == C - 1 ? mr : static_cast<__mmask16>(0xffff), kr + 16 * c), a);
    l[t] = scale * _mm512_reduce_add_ps(a);
  }
}

void logits(const float* q, index_t dk, const float* k, index_t ldk, const std::int32_t* idx, index_t n, float scale,
            float* l) {
  const index_t chunks = (dk + 15) / 16;
  const __mmask16 mr = dk % 16 ? tail_mask(dk % 16) : static_cast<__mmask16>(0xffff);
  switch (chunks) {
    case 1: return logits_c<1>(q, k, ldk, idx, n, scale, l, mr);
    case 2: return logits_c<2>(q, k, ldk, idx, n, scale, l, mr);
    case 3: return logits_c<3>(q, k, ldk, idx, n, scale, l, mr);
    case 4: return logits_c<4>(q, k, ldk, idx, n, scale, l, mr);
    case 5: return logits_c<5>(q, k, ldk, idx, n, scale, l, mr);
    case 6: return logits_c<6>(q, k, ldk, idx, n, scale, l, mr);
    case 7: return logits_c<7>(q, k, ldk, idx, n, scale, l, mr);
    case 8: return logits_c<8>(q, k, ldk, idx, n, scale, l, mr);
    default: break;
  }
  const index_t full = dk / 16, rest = dk % 16;
  for (index_t t = 0; t < n; ++t) {
    const float* kr = k + static_cast<index_t>(idx[t]) * ldk;
    __m512 a = _mm512_setzero_ps();
    for (index_t c = 0; c < full; ++c) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), _mm512_loadu_ps(kr + 16 * c), a);
    if (rest) a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mr, q + 16 * full), _mm512_maskz_loadu_ps(mr, kr + 16 * full), a);
    l[t] = scale * _mm512_reduce_add_ps(a);
  }
}

void accumulate(const float* w, index_t n, const float* v, index_t ldv, index_t dv, const std::int32_t* idx,
                float* out) {
  // Blocks of 64 value lanes (4 registers), four keys in flight (16 accumulators).
  for (index_t c0 = 0; c0 < dv; c0 += 64) {
    const index_t width = std::min<index_t>(64, dv - c0);
    __mmask16 m[4];
    for (int c = 0; c < 4; ++c) {
      const index_t r = std::clamp<index_t>(width - 16 * c, 0, 16);
      m[c] = r == 16 ? static_cast<__mmask16>(0xffff) : tail_mask(r);
    }
    __m512 acc[4][4];
    for (int s = 0; s < 4; ++s)
      for (int c = 0; c < 4; ++c) acc[s][c] = _mm512_setzero_ps();
    index_t t = 0;
    for (; t + 4 <= n; t += 4)
      for (int s = 0; s < 4; ++s) {
        const float* vr = v + static_cast<index_t>(idx[t + s]) * ldv + c0;
        const __m512 ws = _mm512_set1_ps(w[t + s]);
        for (int c = 0; c < 4; ++c) acc[s][c] = _mm512_fmadd_ps(ws, _mm512_maskz_loadu_ps(m[c], vr + 16 * c), acc[s][c]);
      }
    for (; t < n; ++t) {
      const float* vr = v + static_cast<index_t>(idx[t]) * ldv + c0;
      const __m512 ws = _mm512_set1_ps(w[t]);
      for (int c = 0; c < 4; ++c) acc[0][c] = _mm512_fmadd_ps(ws, _mm512_maskz_loadu_ps(m[c], vr + 16 * c), acc[0][c]);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0][c], acc[1][c]), _mm512_add_ps(acc[2][c], acc[3][c]));
      float* oc = out + c0 + 16 * c;
      _mm512_mask_storeu_ps(oc, m[c], _mm512_add_ps(_mm512_maskz_loadu_ps(m[c], oc), sum));
    }
  }
}

#elif NUMATTN_ISA == 1
// ---------------------------------------------------------------------------------------------
// AVX2: 8 lanes; comparison masks through movemask, positions written bit by bit.

inline __m256i tail_imask(index_t r) {
  alignas(32) static const std::int32_t kIota[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(r)), _mm256_load_si256(reinterpret_cast<const __m256i*>(kIota)));
}

void count2(const float* s, index_t n, float t1, float t2, index_t* c1, index_t* c2) {
  const __m256 a = _mm256_set1_ps(t1), b = _mm256_set1_ps(t2);
  index_t n1 = 0, n2 = 0, u = 0;
  for (; u + 8 <= n; u += 8) {
    const __m256 x = _mm256_loadu_ps(s + u);
    n1 += _mm_popcnt_u32(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(x, a, _CMP_GE_OQ))));
    n2 += _mm_popcnt_u32(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(x, b, _CMP_GE_OQ))));
  }
  for (; u < n; ++u) {
    n1 += s[u] >= t1;
    n2 += s[u] >= t2;
  }
  *c1 = n1;
  *c2 = n2;
}

index_t split(const float* s, index_t n, float a, float b, std::int32_t base, std::int32_t* hi, std::int32_t* band,
              index_t* nband) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  index_t nh = 0, nb = 0, u = 0;
  for (; u + 8 <= n; u += 8) {
    const __m256 x = _mm256_loadu_ps(s + u);
    unsigned mb = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(x, vb, _CMP_GE_OQ)));
    unsigned ma = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(x, va, _CMP_GE_OQ))) & ~mb;
    const std::int32_t p = base + static_cast<std::int32_t>(u);
    for (; mb; mb &= mb - 1) hi[nh++] = p + static_cast<std::int32_t>(_tzcnt_u32(mb));
    for (; ma; ma &= ma - 1) band[nb++] = p + static_cast<std::int32_t>(_tzcnt_u32(ma));
  }
  for (; u < n; ++u) {
    const std::int32_t p = base + static_cast<std::int32_t>(u);
    if (s[u] >= b) hi[nh++] = p;
    else if (s[u] >= a) band[nb++] = p;
  }
  *nband = nb;
  return nh;
}

index_t band_values(const float* s, index_t n, float a, float b, float* vals) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  index_t nb = 0, u = 0;
  for (; u + 8 <= n; u += 8) {
    const __m256 x = _mm256_loadu_ps(s + u);
    unsigned m = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(x, va, _CMP_GE_OQ), _mm256_cmp_ps(x, vb, _CMP_LT_OQ))));
    for (; m; m &= m - 1) vals[nb++] = s[u + _tzcnt_u32(m)];
  }
  for (; u < n; ++u)
    if (s[u] >= a && s[u] < b) vals[nb++] = s[u];
  return nb;
}

template <int R>
void panel_rows(const float* q, index_t ldq, index_t dk, const float* kt, index_t npanel, float scale, float* s,
                index_t lds) {
  const __m256 sc = _mm256_set1_ps(scale);
  for (index_t p = 0; p < npanel; ++p) {
    const float* kp = kt + p * 16 * dk;
    __m256 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (index_t d = 0; d < dk; ++d) {
      const __m256 k0 = _mm256_loadu_ps(kp + 16 * d), k1 = _mm256_loadu_ps(kp + 16 * d + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 qd = _mm256_set1_ps(q[r * ldq + d]);
        lo[r] = _mm256_fmadd_ps(qd, k0, lo[r]);
        hi[r] = _mm256_fmadd_ps(qd, k1, hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(s + r * lds + 16 * p, _mm256_mul_ps(lo[r], sc));
      _mm256_storeu_ps(s + r * lds + 16 * p + 8, _mm256_mul_ps(hi[r], sc));
    }
  }
}

void panel_scores(const float* q, index_t ldq, index_t m, index_t dk, const float* kt, index_t npanel, float scale,
                  float* s, index_t lds) {
  index_t r = 0;
  for (; r + 4 <= m; r += 4) panel_rows<4>(q + r * ldq, ldq, dk, kt, npanel, scale, s + r * lds, lds);
  for (; r < m; ++r) panel_rows<1>(q + r * ldq, ldq, dk, kt, npanel, scale, s + r * lds, lds);
}

inline float hsum8(__m256 v) {
  const __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 y = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_shuffle_ps(y, y, 1)));
}

/// Σ of the 8 lanes of each of four vectors, as a 128-bit vector.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

void logits(const float* q, index_t dk, const float* k, index_t ldk, const std::int32_t* idx, index_t n, float scale,
            float* l) {
  const index_t full = dk / 8, rest = dk % 8;
  const __m256i mr = tail_imask(rest);
  const __m256 qt = rest ? _mm256_maskload_ps(q + 8 * full, mr) : _mm256_setzero_ps();
  const __m128 sc = _mm_set1_ps(scale);
  index_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const float* k0 = k + static_cast<index_t>(idx[t]) * ldk;
    const float* k1 = k + static_cast<index_t>(idx[t + 1]) * ldk;
    const float* k2 = k + static_cast<index_t>(idx[t + 2]) * ldk;
    const float* k3 = k + static_cast<index_t>(idx[t + 3]) * ldk;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (index_t c = 0; c < full; ++c) {
      const __m256 qc = _mm256_loadu_ps(q + 8 * c);
      a0 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k0 + 8 * c), a0);
      a1 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k1 + 8 * c), a1);
      a2 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k2 + 8 * c), a2);
      a3 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k3 + 8 * c), a3);
    }
    if (rest) {
      a0 = _mm256_fmadd_ps(qt, _mm256_maskload_ps(k0 + 8 * full, mr), a0);
      a1 = _mm256_fmadd_ps(qt, _mm256_maskload_ps(k1 + 8 * full, mr), a1);
      a2 = _mm256_fmadd_ps(qt, _mm256_maskload_ps(k2 + 8 * full, mr), a2);
      a3 = _mm256_fmadd_ps(qt, _mm256_maskload_ps(k3 + 8 * full, mr), a3);
    }
    _mm_storeu_ps(l + t, _mm_mul_ps(hsum4(a0, a1, a2, a3), sc));
  }
  for (; t < n; ++t) {
    const float* kr = k + static_cast<index_t>(idx[t]) * ldk;
    __m256 a = _mm256_setzero_ps();
    for (index_t c = 0; c < full; ++c) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), _mm256_loadu_ps(kr + 8 * c), a);
    if (rest) a = _mm256_fmadd_ps(qt, _mm256_maskload_ps(kr + 8 * full, mr), a);
    l[t] = scale * hsum8(a);
  }
}

void accumulate(const float* w, index_t n, const float* v, index_t ldv, index_t dv, const std::int32_t* idx,
                float* out) {
  // Blocks of 32 value lanes (4 registers), two keys in flight (8 accumulators).
  for (index_t c0 = 0; c0 < dv; c0 += 32) {
    const index_t width = std::min<index_t>(32, dv - c0);
    __m256i m[4];
    for (int c = 0; c < 4; ++c) m[c] = tail_imask(std::clamp<index_t>(width - 8 * c, 0, 8));
    __m256 acc[2][4];
    for (int s = 0; s < 2; ++s)
      for (int c = 0; c < 4; ++c) acc[s][c] = _mm256_setzero_ps();
    index_t t = 0;
    for (; t + 2 <= n; t += 2)
      for (int s = 0; s < 2; ++s) {
        const float* vr = v + static_cast<index_t>(idx[t + s]) * ldv + c0;
        const __m256 ws = _mm256_set1_ps(w[t + s]);
        for (int c = 0; c < 4; ++c) acc[s][c] = _mm256_fmadd_ps(ws, _mm256_maskload_ps(vr + 8 * c, m[c]), acc[s][c]);
      }
    for (; t < n; ++t) {
      const float* vr = v + static_cast<index_t>(idx[t]) * ldv + c0;
      const __m256 ws = _mm256_set1_ps(w[t]);
      for (int c = 0; c < 4; ++c) acc[0][c] = _mm256_fmadd_ps(ws, _mm256_maskload_ps(vr + 8 * c, m[c]), acc[0][c]);
    }
    for (int c = 0; c < 4; ++c) {
      float* oc = out + c0 + 8 * c;
      _mm256_maskstore_ps(oc, m[c], _mm256_add_ps(_mm256_maskload_ps(oc, m[c]), _mm256_add_ps(acc[0][c], acc[1][c])));
    }
  }
}

#else
// ---------------------------------------------------------------------------------------------
// Portable: plain loops (the compiler vectorises the counting and the value sums).

void count2(const float* s, index_t n, float t1, float t2, index_t* c1, index_t* c2) {
  index_t n1 = 0, n2 = 0;
  for (index_t u = 0; u < n; ++u) {
    n1 += s[u] >= t1;
    n2 += s[u] >= t2;
  }
  *c1 = n1;
  *c2 = n2;
}

index_t split(const float* s, index_t n, float a, float b, std::int32_t base, std::int32_t* hi, std::int32_t* band,
              index_t* nband) {
  index_t nh = 0, nb = 0;
  for (index_t u = 0; u < n; ++u) {
    const std::int32_t p = base + static_cast<std::int32_t>(u);
    if (s[u] >= b) hi[nh++] = p;
    else if (s[u] >= a) band[nb++] = p;
  }
  *nband = nb;
  return nh;
}

index_t band_values(const float* s, index_t n, float a, float b, float* vals) {
  index_t nb = 0;
  for (index_t u = 0; u < n; ++u)
    if (s[u] >= a && s[u] < b) vals[nb++] = s[u];
  return nb;
}

void panel_scores(const float* q, index_t ldq, index_t m, index_t dk, const float* kt, index_t npanel, float scale,
                  float* s, index_t lds) {
  for (index_t r = 0; r < m; ++r)
    for (index_t p = 0; p < npanel; ++p) {
      const float* kp = kt + p * 16 * dk;
      float acc[16] = {};
      for (index_t d = 0; d < dk; ++d)
        for (index_t c = 0; c < 16; ++c) acc[c] += q[r * ldq + d] * kp[16 * d + c];
      for (index_t c = 0; c < 16; ++c) s[r * lds + 16 * p + c] = scale * acc[c];
    }
}

void logits(const float* q, index_t dk, const float* k, index_t ldk, const std::int32_t* idx, index_t n, float scale,
            float* l) {
  constexpr index_t kL = 16;
  for (index_t t = 0; t < n; ++t) {
    const float* kr = k + static_cast<index_t>(idx[t]) * ldk;
    float acc[kL] = {};
    index_t d = 0;
    for (; d + kL <= dk; d += kL)
      for (index_t c = 0; c < kL; ++c) acc[c] += q[d + c] * kr[d + c];
    for (index_t c = 0; d + c < dk; ++c) acc[c] += q[d + c] * kr[d + c];
    float x = 0;
    for (index_t c = 0; c < kL; ++c) x += acc[c];
    l[t] = scale * x;
  }
}

void accumulate(const float* w, index_t n, const float* v, index_t ldv, index_t dv, const std::int32_t* idx,
                float* out) {
  for (index_t t = 0; t < n; ++t) {
    const float* vr = v + static_cast<index_t>(idx[t]) * ldv;
    const float x = w[t];
    for (index_t c = 0; c < dv; ++c) out[c] += x * vr[c];
  }
}

#endif

}  // namespace

#endif  // NUMATTN_ISA_COMPILED

}  // namespace numattn::blocks::select_gather_ops::NUMATTN_ISA_NS

#include "core/isa_end.h"

// The getter after the target's end: it runs before anyone knows the CPU can run the variant.
namespace numattn::blocks::select_gather_ops::NUMATTN_ISA_NS {
const Ops* ops() {
#if NUMATTN_ISA_COMPILED
  static constexpr Ops k{count2, split, band_values, panel_scores, logits, accumulate};
  return &k;
#else
  return nullptr;
#endif
}
}  // namespace numattn::blocks::select_gather_ops::NUMATTN_ISA_NS
