// Float32 kernel of 2-simplicial attention (simplicial.h). Per task: one (batch, head) and a
// block of kQB query rows. The block packs what its rows read once: K' rows transposed
// (kt[d][k], so a query's window of k is a contiguous run of lanes), V and V' rows padded to a
// multiple of 16 floats. Per query row:
//   W[d][k] = (s·q_d)·k'_kd                         (Dk × |K_i|, lanes past |K_i| = 0)
//   per tile of ≤ kTJ keys j of J_i:
//     S[j][k] = Σ_d k_jd · W[d][k]                  (broadcast k_jd, FMA a W row: K read in place)
//     online softmax over the tile's pairs (running max m, normaliser l, rescale by e^{m−m'})
//     U_j = Σ_k P[j][k] · v'_k ;  acc += v_j ⊙ U_j
// so every pair costs one Dk-long FMA chain for its logit and one Dv-long one for its value,
// which is the FLOP model of simplicial_flops. Only rows in J_i and K_i are read for row i
// (padding lanes come from W's zeros, not from other rows), so a non-finite value in a key that
// another row of the block reads does not leak into this one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "numattn/attention/simplicial.h"
#include "numattn/core/error.h"
#include "numattn/core/simd.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace numattn {

namespace {

constexpr index_t kQB = 64;  // query rows per task
constexpr index_t kTJ = 64;  // keys j per online-softmax tile
constexpr index_t kL = 16;   // lanes of one k chunk
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

index_t round_up(index_t x, index_t m) { return (x + m - 1) / m * m; }

/// Everything one row's computation needs, pointing into the block's packed buffers.
struct RowJob {
  const float* q;          // Dk
  const float* const* kj;  // kj[r] = caller's K row of key J.begin + r (|J| entries)
  const float* kt;         // packed K'ᵀ, column 0 = key K.begin, leading dimension ldkt
  index_t ldkt;
  const float* v1;         // packed V rows, row 0 = key J.begin (ld dvp)
  const float* v2;         // packed V' rows, row 0 = key K.begin (ld dvp)
  index_t nj, nk, dk, dvp;
  float scale;
};

struct RowResult {
  float m = kNegInf, l = 0;
};

/// Buffers of one row's computation (reused across rows of a task).
struct RowScratch {
  std::vector<float> w, s, acc, u;
};

// ---------------------------------------------------------------------------------------------
// Portable kernel: the same algorithm in plain loops (auto-vectorised where the compiler can).

float exp_nan(float x) { return std::isnan(x) ? x : simd::exp_f32(x); }

RowResult row_portable(const RowJob& job, RowScratch& sc) {
  const index_t nkp = round_up(job.nk, kL), dk = job.dk, dvp = job.dvp;
  sc.w.assign(static_cast<std::size_t>(dk * nkp), 0.0f);
  sc.s.resize(static_cast<std::size_t>(kTJ * nkp));
  sc.acc.assign(static_cast<std::size_t>(dvp), 0.0f);
  sc.u.resize(static_cast<std::size_t>(dvp));
  for (index_t d = 0; d < dk; ++d) {
    const float sq = job.scale * job.q[d];
    for (index_t k = 0; k < job.nk; ++k) sc.w[static_cast<std::size_t>(d * nkp + k)] = sq * job.kt[d * job.ldkt + k];
  }
  RowResult res;
  for (index_t j0 = 0; j0 < job.nj; j0 += kTJ) {
    const index_t nt = std::min(kTJ, job.nj - j0);
    float tmax = kNegInf;
    bool nan = false;
    for (index_t r = 0; r < nt; ++r) {
      float* srow = sc.s.data() + r * nkp;
      std::fill(srow, srow + nkp, 0.0f);
      const float* kr = job.kj[j0 + r];
      for (index_t d = 0; d < dk; ++d) {
        const float x = kr[d];
        const float* wr = sc.w.data() + d * nkp;
        for (index_t k = 0; k < nkp; ++k) srow[k] += x * wr[k];
      }
      for (index_t k = 0; k < job.nk; ++k) {
        nan |= std::isnan(srow[k]);
        tmax = std::max(tmax, srow[k]);
      }
    }
    if (nan) tmax = std::numeric_limits<float>::quiet_NaN();
    const float mn = std::isnan(tmax) ? tmax : std::max(res.m, tmax);
    const float alpha = res.m == kNegInf ? 0.0f : exp_nan(res.m - mn);
    res.l *= alpha;
    for (index_t d = 0; d < dvp; ++d) sc.acc[static_cast<std::size_t>(d)] *= alpha;
    for (index_t r = 0; r < nt; ++r) {
      const float* srow = sc.s.data() + r * nkp;
      std::fill(sc.u.begin(), sc.u.end(), 0.0f);
      for (index_t k = 0; k < job.nk; ++k) {
        const float pk = exp_nan(srow[k] - mn);
        res.l += pk;
        const float* vk = job.v2 + k * dvp;
        for (index_t d = 0; d < dvp; ++d) sc.u[static_cast<std::size_t>(d)] += pk * vk[d];
      }
      const float* vj = job.v1 + (j0 + r) * dvp;
      for (index_t d = 0; d < dvp; ++d) sc.acc[static_cast<std::size_t>(d)] += vj[d] * sc.u[static_cast<std::size_t>(d)];
    }
    res.m = mn;
  }
  return res;
}

#if defined(__AVX512F__)
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

RowResult row_avx512(const RowJob& job, RowScratch& sc) {
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

constexpr auto row_vector = row_avx512;
#elif defined(__AVX2__) && defined(__FMA__)
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

RowResult row_avx2(const RowJob& job, RowScratch& sc) {
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

constexpr auto row_vector = row_avx2;
#endif

}  // namespace

std::size_t simplicial_workspace_bytes(const AttentionProblem& p, index_t w1, index_t w2, int threads) {
  const index_t dk = p.d_qk(), dvp = round_up(std::max<index_t>(p.d_v(), 1), kL);
  const index_t nkp = round_up(std::min(w2, p.n_kv()), kL);
  const index_t ju = std::min(kQB + w1, p.n_kv()), ku = std::min(kQB + w2, p.n_kv());
  const std::size_t floats = static_cast<std::size_t>(dk * (ku + kL) + (ju + ku) * dvp + dk * nkp + kTJ * nkp + 2 * dvp);
  return (floats * sizeof(float) + static_cast<std::size_t>(ju) * sizeof(float*)) * static_cast<std::size_t>(threads);
}

void simplicial_attention(const AttentionProblem& p, const TensorView<const float>& k2,
                          const TensorView<const float>& v2, index_t w1, index_t w2, const ExecContext& ctx,
                          SimplicialKernel kernel) {
  validate(p);
  NUMATTN_CHECK(w1 >= 1 && w2 >= 1, "2-simplicial attention: windows w1 = {} and w2 = {} must be ≥ 1", w1, w2);
  NUMATTN_CHECK(p.mask.kind == MaskKind::kNone, "2-simplicial attention takes no boolean or additive mask");
  NUMATTN_CHECK(k2.shape == p.k.shape, "2-simplicial attention: K' must have K's shape");
  NUMATTN_CHECK(v2.shape == p.v.shape, "2-simplicial attention: V' must have V's shape (Dv of V and V' must agree)");
  NUMATTN_CHECK(k2.stride[3] == 1 && v2.stride[3] == 1, "2-simplicial attention: K' and V' rows must be contiguous");
  const index_t B = p.batch(), H = p.heads(), nq = p.n_q(), dk = p.d_qk(), dv = p.d_v();
  const index_t dvp = round_up(std::max<index_t>(dv, 1), kL), blocks = (nq + kQB - 1) / kQB;
  const float scale = static_cast<float>(p.effective_scale());
  const bool portable = kernel == SimplicialKernel::kPortable;
#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__))
  (void)portable;  // without AVX-512 or AVX2 the portable loops are the only kernel
#endif
  parallel_for(ctx, B * H * blocks, [&](std::int64_t task) {
    const index_t b = task / (H * blocks), h = (task / blocks) % H, blk = task % blocks, hk = h / p.group();
    const index_t i0 = blk * kQB, i1 = std::min(nq, i0 + kQB);
    index_t jl = std::numeric_limits<index_t>::max(), jh = 0, kl = jl, kh = 0;
    for (index_t i = i0; i < i1; ++i) {
      const KeyRange J = simplicial_range(p, i, w1), K = simplicial_range(p, i, w2);
      if (J.empty() || K.empty()) continue;
      jl = std::min(jl, J.begin);
      jh = std::max(jh, J.end);
      kl = std::min(kl, K.begin);
      kh = std::max(kh, K.end);
    }
    const index_t nju = jh > jl ? jh - jl : 0, nku = kh > kl ? kh - kl : 0, ldkt = nku + kL;
    std::vector<float> kt(static_cast<std::size_t>(dk * ldkt), 0.0f), v1p(static_cast<std::size_t>(nju * dvp), 0.0f),
        v2p(static_cast<std::size_t>(nku * dvp), 0.0f);
    std::vector<const float*> krows(static_cast<std::size_t>(nju));
    for (index_t k = 0; k < nku; ++k) {
      const float* src = k2.row(b, hk, kl + k);
      for (index_t d = 0; d < dk; ++d) kt[static_cast<std::size_t>(d * ldkt + k)] = src[d];
      std::copy(v2.row(b, hk, kl + k), v2.row(b, hk, kl + k) + dv, v2p.data() + k * dvp);
    }
    for (index_t j = 0; j < nju; ++j) {
      krows[static_cast<std::size_t>(j)] = p.k.row(b, hk, jl + j);
      std::copy(p.v.row(b, hk, jl + j), p.v.row(b, hk, jl + j) + dv, v1p.data() + j * dvp);
    }
    RowScratch sc;
    for (index_t i = i0; i < i1; ++i) {
      float* out = p.out.row(b, h, i);
      const KeyRange J = simplicial_range(p, i, w1), K = simplicial_range(p, i, w2);
      if (J.empty() || K.empty()) {
        std::fill(out, out + dv, 0.0f);
        if (!p.lse.empty()) p.lse(b, h, i, 0) = kNegInf;
        continue;
      }
      RowJob job{p.q.row(b, h, i), krows.data() + (J.begin - jl), kt.data() + (K.begin - kl), ldkt,
                 v1p.data() + (J.begin - jl) * dvp, v2p.data() + (K.begin - kl) * dvp, J.end - J.begin,
                 K.end - K.begin, dk, dvp, scale};
      RowResult r;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
      r = portable ? row_portable(job, sc) : row_vector(job, sc);
#else
      r = row_portable(job, sc);
#endif
      const float inv = 1.0f / r.l;
      for (index_t d = 0; d < dv; ++d) out[d] = sc.acc[static_cast<std::size_t>(d)] * inv;
      if (!p.lse.empty()) p.lse(b, h, i, 0) = r.m + std::log(r.l);
    }
  });
}

}  // namespace numattn
