// Internal: the vector row kernels of 2-simplicial attention, compiled per instruction-set
// variant (core/isa_begin.h) by simplicial_avx2.cpp and simplicial_avx512.cpp; the portable row
// kernel and the driver are in simplicial_kernel.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/tensor/simplicial_rows.h"

#include "core/isa_begin.h"
#include "core/simd_vec.h"

namespace numattn::simplicial_rows::NUMATTN_ISA_NS {

#if NUMATTN_ISA_COMPILED

namespace {

#if NUMATTN_ISA == 2
// ---------------------------------------------------------------------------------------------
// AVX-512 kernel: S tiles register-blocked 16 (or 8) keys j × 16 lanes of k, U tiles 4 keys j ×
// up to 64 value lanes.

template <int R>
inline void s_block(const float* const* kr, const float* w, index_t nkp, index_t dk, float* s) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
  for (index_t d = 0; d < dk; ++d) {
    const __m512 wd = _mm512_loadu_ps(w + d * nkp);
    for (int r = 0; r < R; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(kr[r][d]), wd, a[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(s + r * nkp, a[r]);
}

template <int NT, int R>
inline void u_block(const float* p, index_t nkp, index_t nk, const float* v2, const float* v1, index_t dvp,
                    float* acc) {
  __m512 u[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) u[r][t] = _mm512_setzero_ps();
  for (index_t k = 0; k < nk; ++k) {
    const float* vk = v2 + k * dvp;
    __m512 pk[R];
    for (int r = 0; r < R; ++r) pk[r] = _mm512_set1_ps(p[r * nkp + k]);
    for (int t = 0; t < NT; ++t) {
      const __m512 v = _mm512_loadu_ps(vk + 16 * t);
      for (int r = 0; r < R; ++r) u[r][t] = _mm512_fmadd_ps(pk[r], v, u[r][t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    __m512 a = _mm512_loadu_ps(acc + 16 * t);
    for (int r = 0; r < R; ++r) a = _mm512_fmadd_ps(_mm512_loadu_ps(v1 + r * dvp + 16 * t), u[r][t], a);
    _mm512_storeu_ps(acc + 16 * t, a);
  }
}

template <int NT>
void u_tile(const float* p, index_t nt, index_t nkp, index_t nk, const float* v2, const float* v1, index_t dvp,
            float* acc) {
  // 4 keys j at a time: per k, NT loads of v'_k and 4 broadcasts feed 4·NT FMAs.
  index_t r = 0;
  for (; r + 4 <= nt; r += 4) u_block<NT, 4>(p + r * nkp, nkp, nk, v2, v1 + r * dvp, dvp, acc);
  for (; r < nt; ++r) u_block<NT, 1>(p + r * nkp, nkp, nk, v2, v1 + r * dvp, dvp, acc);
}

RowResult row_vector(const RowJob& job, RowScratch& sc) {
  const index_t nkp = round_up(job.nk, kL), nkc = nkp / kL, dk = job.dk, dvp = job.dvp;
  sc.w.resize(static_cast<std::size_t>(dk * nkp));
  sc.s.resize(static_cast<std::size_t>(kTJ * nkp));
  sc.acc.assign(static_cast<std::size_t>(dvp), 0.0f);
  const __mmask16 tail = static_cast<__mmask16>(job.nk % kL == 0 ? 0xffff : (1u << (job.nk % kL)) - 1);
  for (index_t d = 0; d < dk; ++d) {
    const __m512 sq = _mm512_set1_ps(job.scale * job.q[d]);
    for (index_t c = 0; c < nkc; ++c) {
      const __mmask16 m = c == nkc - 1 ? tail : static_cast<__mmask16>(0xffff);
      const __m512 k = _mm512_maskz_loadu_ps(m, job.kt + d * job.ldkt + c * kL);
      _mm512_storeu_ps(sc.w.data() + d * nkp + c * kL, _mm512_mul_ps(sq, k));
    }
  }
  RowResult res;
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  for (index_t j0 = 0; j0 < job.nj; j0 += kTJ) {
    const index_t nt = std::min(kTJ, job.nj - j0);
    for (index_t c = 0; c < nkc; ++c) {
      // 16 keys j at a time: per d one W load feeds 16 FMAs (16 accumulators + W in registers).
      index_t r = 0;
      for (; r + 16 <= nt; r += 16) s_block<16>(job.kj + j0 + r, sc.w.data() + c * kL, nkp, dk, sc.s.data() + r * nkp + c * kL);
      for (; r + 8 <= nt; r += 8) s_block<8>(job.kj + j0 + r, sc.w.data() + c * kL, nkp, dk, sc.s.data() + r * nkp + c * kL);
      for (; r < nt; ++r) s_block<1>(job.kj + j0 + r, sc.w.data() + c * kL, nkp, dk, sc.s.data() + r * nkp + c * kL);
    }
    // Tile maximum over the real lanes; a NaN logit is carried separately (max drops it).
    __m512 vmax = ninf;
    __mmask16 nanm = 0;
    for (index_t r = 0; r < nt; ++r)
      for (index_t c = 0; c < nkc; ++c) {
        const __mmask16 m = c == nkc - 1 ? tail : static_cast<__mmask16>(0xffff);
        const __m512 x = _mm512_loadu_ps(sc.s.data() + r * nkp + c * kL);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, x);
        nanm |= _mm512_mask_cmp_ps_mask(m, x, x, _CMP_UNORD_Q);
      }
    float tmax = _mm512_reduce_max_ps(vmax);
    if (nanm) tmax = std::numeric_limits<float>::quiet_NaN();
    const float mn = std::isnan(tmax) ? tmax : std::max(res.m, tmax);
    const float alpha = res.m == kNegInf ? 0.0f : exp_nan(res.m - mn);
    res.l *= alpha;
    const __m512 va = _mm512_set1_ps(alpha);
    for (index_t d = 0; d < dvp; d += kL) _mm512_storeu_ps(sc.acc.data() + d, _mm512_mul_ps(va, _mm512_loadu_ps(sc.acc.data() + d)));
    const __m512 vm = _mm512_set1_ps(mn);
    __m512 lsum = _mm512_setzero_ps();
    for (index_t r = 0; r < nt; ++r)
      for (index_t c = 0; c < nkc; ++c) {
        const __mmask16 m = c == nkc - 1 ? tail : static_cast<__mmask16>(0xffff);
        float* sp = sc.s.data() + r * nkp + c * kL;
        const __m512 pr = _mm512_maskz_mov_ps(m, simd::exp_f32(_mm512_sub_ps(_mm512_loadu_ps(sp), vm)));
        lsum = _mm512_add_ps(lsum, pr);
        _mm512_storeu_ps(sp, pr);
      }
    res.l += _mm512_reduce_add_ps(lsum);
    const float* v1 = job.v1 + j0 * dvp;
    for (index_t db = 0; db < dvp; db += 64) {
      const index_t left = (dvp - db) / kL;
      float* acc = sc.acc.data() + db;
      const float* v2 = job.v2 + db;
      const float* v1b = v1 + db;
      if (left >= 4) u_tile<4>(sc.s.data(), nt, nkp, job.nk, v2, v1b, dvp, acc);
      else if (left == 3) u_tile<3>(sc.s.data(), nt, nkp, job.nk, v2, v1b, dvp, acc);
      else if (left == 2) u_tile<2>(sc.s.data(), nt, nkp, job.nk, v2, v1b, dvp, acc);
      else u_tile<1>(sc.s.data(), nt, nkp, job.nk, v2, v1b, dvp, acc);
    }
    res.m = mn;
  }
  return res;
}

#elif NUMATTN_ISA == 1
// ---------------------------------------------------------------------------------------------
// AVX2 kernel: row_avx512's algorithm on 8-lane registers (16 of them). S tiles 6 keys j × 16
// lanes of k (two halves: 12 accumulators, 2 W loads and 6 broadcasts per d), U tiles 6 keys j ×
// 16 value lanes. Lane masks come from a sliding window over kLaneMask.

alignas(32) constexpr std::int32_t kLaneMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/// First n of 8 lanes set (0 ≤ n ≤ 8).
inline __m256i first_lanes(index_t n) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLaneMask + 8 - n));
}

inline float hmax8(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum8(__m256 x) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

template <int R>
inline void s_block(const float* const* kr, const float* w, index_t nkp, index_t dk, float* s) {
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (index_t d = 0; d < dk; ++d) {
    const __m256 wl = _mm256_loadu_ps(w + d * nkp), wh = _mm256_loadu_ps(w + d * nkp + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(kr[r] + d);
      lo[r] = _mm256_fmadd_ps(x, wl, lo[r]);
      hi[r] = _mm256_fmadd_ps(x, wh, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * nkp, lo[r]);
    _mm256_storeu_ps(s + r * nkp + 8, hi[r]);
  }
}

template <int NT, int R>
inline void u_block(const float* p, index_t nkp, index_t nk, const float* v2, const float* v1, index_t dvp,
                    float* acc) {
  __m256 u[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) u[r][t] = _mm256_setzero_ps();
  for (index_t k = 0; k < nk; ++k) {
    __m256 v[NT];
    for (int t = 0; t < NT; ++t) v[t] = _mm256_loadu_ps(v2 + k * dvp + 8 * t);
    for (int r = 0; r < R; ++r) {
      const __m256 pk = _mm256_broadcast_ss(p + r * nkp + k);
      for (int t = 0; t < NT; ++t) u[r][t] = _mm256_fmadd_ps(pk, v[t], u[r][t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    __m256 a = _mm256_loadu_ps(acc + 8 * t);
    for (int r = 0; r < R; ++r) a = _mm256_fmadd_ps(_mm256_loadu_ps(v1 + r * dvp + 8 * t), u[r][t], a);
    _mm256_storeu_ps(acc + 8 * t, a);
  }
}

void u_tile(const float* p, index_t nt, index_t nkp, index_t nk, const float* v2, const float* v1, index_t dvp,
            float* acc) {
  // 6 keys j × 16 value lanes at a time: per k, 2 loads of v'_k (kept in registers) and 6
  // broadcasts feed 12 FMAs. (3 keys × 32 lanes left the compiler one free register, so it
  // folded the v'_k loads into the FMAs: 15 loads per 12 FMAs, load-bound on Zen.)
  index_t r = 0;
  for (; r + 6 <= nt; r += 6) u_block<2, 6>(p + r * nkp, nkp, nk, v2, v1 + r * dvp, dvp, acc);
  for (; r + 3 <= nt; r += 3) u_block<2, 3>(p + r * nkp, nkp, nk, v2, v1 + r * dvp, dvp, acc);
  for (; r < nt; ++r) u_block<2, 1>(p + r * nkp, nkp, nk, v2, v1 + r * dvp, dvp, acc);
}

RowResult row_vector(const RowJob& job, RowScratch& sc) {
  const index_t nkp = round_up(job.nk, kL), nkc = nkp / kL, dk = job.dk, dvp = job.dvp;
  // 8-lane pieces of k holding real keys; the last has `rem` of them.
  const index_t n8 = (job.nk + 7) / 8, rem = job.nk - (n8 - 1) * 8;
  const __m256i tail = first_lanes(rem);
  const __m256 tailf = _mm256_castsi256_ps(tail);
  sc.w.resize(static_cast<std::size_t>(dk * nkp));
  sc.s.resize(static_cast<std::size_t>(kTJ * nkp));
  sc.acc.assign(static_cast<std::size_t>(dvp), 0.0f);
  for (index_t d = 0; d < dk; ++d) {
    const __m256 sq = _mm256_set1_ps(job.scale * job.q[d]);
    const float* kd = job.kt + d * job.ldkt;
    float* wd = sc.w.data() + d * nkp;
    for (index_t c = 0; c < nkp / 8; ++c) {
      // Lanes past |K_i| must be zeros, not the next keys (which may be non-finite).
      const __m256 k = c < n8 - 1 ? _mm256_loadu_ps(kd + 8 * c)
                       : c == n8 - 1 ? _mm256_maskload_ps(kd + 8 * c, tail)
                                     : _mm256_setzero_ps();
      _mm256_storeu_ps(wd + 8 * c, _mm256_mul_ps(sq, k));
    }
  }
  RowResult res;
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  for (index_t j0 = 0; j0 < job.nj; j0 += kTJ) {
    const index_t nt = std::min(kTJ, job.nj - j0);
    for (index_t c = 0; c < nkc; ++c) {
      index_t r = 0;
      for (; r + 6 <= nt; r += 6) s_block<6>(job.kj + j0 + r, sc.w.data() + c * kL, nkp, dk, sc.s.data() + r * nkp + c * kL);
      for (; r + 3 <= nt; r += 3) s_block<3>(job.kj + j0 + r, sc.w.data() + c * kL, nkp, dk, sc.s.data() + r * nkp + c * kL);
      for (; r < nt; ++r) s_block<1>(job.kj + j0 + r, sc.w.data() + c * kL, nkp, dk, sc.s.data() + r * nkp + c * kL);
    }
    // Tile maximum over the real lanes; a NaN logit is carried separately (max drops it).
    __m256 vmax = ninf, nanv = _mm256_setzero_ps();
    for (index_t r = 0; r < nt; ++r)
      for (index_t c = 0; c < n8; ++c) {
        __m256 x = _mm256_loadu_ps(sc.s.data() + r * nkp + 8 * c);
        if (c == n8 - 1) x = _mm256_blendv_ps(ninf, x, tailf);
        vmax = _mm256_max_ps(vmax, x);
        nanv = _mm256_or_ps(nanv, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
      }
    float tmax = hmax8(vmax);
    if (_mm256_movemask_ps(nanv) != 0) tmax = std::numeric_limits<float>::quiet_NaN();
    const float mn = std::isnan(tmax) ? tmax : std::max(res.m, tmax);
    const float alpha = res.m == kNegInf ? 0.0f : exp_nan(res.m - mn);
    res.l *= alpha;
    const __m256 va = _mm256_set1_ps(alpha);
    for (index_t d = 0; d < dvp; d += 8) _mm256_storeu_ps(sc.acc.data() + d, _mm256_mul_ps(va, _mm256_loadu_ps(sc.acc.data() + d)));
    const __m256 vm = _mm256_set1_ps(mn);
    __m256 lsum = _mm256_setzero_ps();
    for (index_t r = 0; r < nt; ++r)
      for (index_t c = 0; c < n8; ++c) {
        float* sp = sc.s.data() + r * nkp + 8 * c;
        __m256 pr = simd::exp_f32(_mm256_sub_ps(_mm256_loadu_ps(sp), vm));
        if (c == n8 - 1) pr = _mm256_and_ps(pr, tailf);
        lsum = _mm256_add_ps(lsum, pr);
        _mm256_storeu_ps(sp, pr);
      }
    res.l += hsum8(lsum);
    const float* v1 = job.v1 + j0 * dvp;
    for (index_t db = 0; db < dvp; db += kL) u_tile(sc.s.data(), nt, nkp, job.nk, job.v2 + db, v1 + db, dvp, sc.acc.data() + db);
    res.m = mn;
  }
  return res;
}

#endif

}  // namespace

#endif  // NUMATTN_ISA_COMPILED

}  // namespace numattn::simplicial_rows::NUMATTN_ISA_NS

#include "core/isa_end.h"

namespace numattn::simplicial_rows::NUMATTN_ISA_NS {
RowFn row_fn() {
#if NUMATTN_ISA_COMPILED
  return row_vector;
#else
  return nullptr;
#endif
}
}  // namespace numattn::simplicial_rows::NUMATTN_ISA_NS
