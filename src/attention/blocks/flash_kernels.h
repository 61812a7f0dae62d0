// Register-blocked micro-kernels of exact.flash (private header; see flash.h for the method).
//
// Layout ("query lanes"): a block of up to 4 SIMD vectors of query rows is processed at once,
// and every per-block buffer keeps the query rows in the SIMD lanes:
//   qt [Dk][BR]  the block's queries, transposed and pre-multiplied by the softmax scale,
//   s  [Bk][BR]  logits, then probabilities, of one key tile (row = key, lane = query),
//   ot [Dv][BR]  the unnormalised output accumulator (row = value dim, lane = query),
// with BR = CI·W rows (CI vectors of W lanes). Then
//   S-tile:  s[j][:]  = Σ_d K[j][d] · qt[d][:]   (broadcast a K element, FMA a qt vector)
//   O-tile:  ot[d][:] = Σ_j V[j][d] · s[j][:]    (broadcast a V element, FMA an s vector)
// so K and V are read straight from the caller's strided rows (no packing, no transpose),
// the re-read operands (qt, s) are block-sized and stay in L1, and the softmax statistics
// (running max, normaliser, rescale factors) are per-lane vectors: row maxima and sums are
// vertical vector ops, never horizontal reductions. This is the same work as the textbook
// FlashAttention forward pass, transposed so that CPU SIMD lanes run over queries.
//
// Included by flash_impl.h after core/isa_begin.h: everything here belongs to one
// instruction-set variant (NUMATTN_ISA picks the lane type below).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "numattn/core/tensor.h"

#if !defined(NUMATTN_ISA_NS)
#error "flash_kernels.h is included by flash_impl.h, after core/isa_begin.h"
#endif

#if defined(__clang__)
#define NUMATTN_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define NUMATTN_UNROLL _Pragma("GCC unroll 64")
#else
#define NUMATTN_UNROLL
#endif

namespace numattn::flash::NUMATTN_ISA_NS {

/// Probabilities below exp(kExpCut) relative to the running maximum are flushed to 0. Their
/// total weight is < Nk·e^-64 ≈ 1.6e-28·Nk of the row's (which holds at least one 1), far
/// below float32 resolution, and flushing keeps P·V products out of the subnormal range, whose
/// microcode assists would cost ~100 cycles each on x86.
constexpr float kExpCut = -64.0f;

#if NUMATTN_ISA == 2

/// AVX-512: 16 lanes.
struct Vec {
  using R = __m512;
  static constexpr int W = 16;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, R v) { _mm512_store_ps(p, v); }
  static R loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, R v) { _mm512_storeu_ps(p, v); }
  /// out[i] = Σ lanes of a[i], i < 4.
  static void hsum4(const R* a, float* out) {
    __m256 h[4];
    // Zero-masked extracts: GCC 12's plain extract (and the 512→256 cast built on it) reads
    // an undefined register and warns (bug 105593).
    for (int i = 0; i < 4; ++i) {
      const __m512d x = _mm512_castps_pd(a[i]);
      h[i] = _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, x, 0)),
                           _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, x, 1)));
    }
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
  static float hsum(R a) { return _mm512_reduce_add_ps(a); }
  static R fmadd(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R min(R a, R b) { return _mm512_min_ps(a, b); }
  /// x where x is not -inf, else 0.
  static R neginf_to_zero(R x) {
    const __mmask16 m = _mm512_cmp_ps_mask(x, set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm512_mask_mov_ps(x, m, zero());
  }
  /// NaN where x is -inf, else 0.
  static R nan_where_neginf(R x) {
    const __mmask16 m = _mm512_cmp_ps_mask(x, set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm512_maskz_mov_ps(m, set1(std::numeric_limits<float>::quiet_NaN()));
  }
  /// exp(x) for x ≤ 0 (including -inf), flushed to 0 below kExpCut, NaN for NaN:
  /// simd::exp_mantissa (≤ 2 ulp) without the upper clamp it does not need here, the mask fused
  /// into the scaling. max(cut, x) returns its second operand, x, for NaN.
  static R exp_cut(R x) {
    const R cut = set1(kExpCut);
    R n;
    const R p = simd::exp_mantissa(_mm512_max_ps(cut, x), &n);
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, cut, _CMP_NLT_UQ), p, n);
  }
};

#elif NUMATTN_ISA == 1

/// AVX2 + FMA: 8 lanes.
struct Vec {
  using R = __m256;
  static constexpr int W = 8;
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_load_ps(p); }
  static void store(float* p, R v) { _mm256_store_ps(p, v); }
  static R loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, R v) { _mm256_storeu_ps(p, v); }
  static void hsum4(const R* a, float* out) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
  static float hsum(R a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
  static R fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R min(R a, R b) { return _mm256_min_ps(a, b); }
  static R neginf_to_zero(R x) {
    const R m = _mm256_cmp_ps(x, set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm256_andnot_ps(m, x);
  }
  static R nan_where_neginf(R x) {
    const R m = _mm256_cmp_ps(x, set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm256_and_ps(m, set1(std::numeric_limits<float>::quiet_NaN()));
  }
  /// As the AVX-512 form: simd::exp_core without the clamps of exp_f32 that x ≤ 0 does not need
  /// (NaN reaches the core, whose result is then NaN, and the mask keeps it).
  static R exp_cut(R x) {
    const R cut = set1(kExpCut);
    return _mm256_and_ps(_mm256_cmp_ps(x, cut, _CMP_NLT_UQ), simd::exp_core(_mm256_max_ps(cut, x)));
  }
};

#else

/// Portable: 4 lanes in a plain array (the compiler may auto-vectorise the lane loops for the
/// build's baseline).
struct Vec {
  struct R {
    float v[4];
  };
  static constexpr int W = 4;
  static R zero() { return set1(0.f); }
  static R set1(float x) { return R{{x, x, x, x}}; }
  static R load(const float* p) { return R{{p[0], p[1], p[2], p[3]}}; }
  static void store(float* p, R a) {
    for (int i = 0; i < 4; ++i) p[i] = a.v[i];
  }
  static R loadu(const float* p) { return load(p); }
  static void storeu(float* p, R a) { store(p, a); }
  static void hsum4(const R* a, float* out) {
    for (int i = 0; i < 4; ++i) out[i] = (a[i].v[0] + a[i].v[1]) + (a[i].v[2] + a[i].v[3]);
  }
  static float hsum(R a) { return (a.v[0] + a.v[1]) + (a.v[2] + a.v[3]); }
  static R fmadd(R a, R b, R c) {
    for (int i = 0; i < 4; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static R mul(R a, R b) {
    for (int i = 0; i < 4; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static R add(R a, R b) {
    for (int i = 0; i < 4; ++i) a.v[i] += b.v[i];
    return a;
  }
  static R sub(R a, R b) {
    for (int i = 0; i < 4; ++i) a.v[i] -= b.v[i];
    return a;
  }
  static R max(R a, R b) {
    for (int i = 0; i < 4; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return a;
  }
  static R min(R a, R b) {
    for (int i = 0; i < 4; ++i) a.v[i] = a.v[i] < b.v[i] ? a.v[i] : b.v[i];
    return a;
  }
  static R neginf_to_zero(R a) {
    for (int i = 0; i < 4; ++i)
      if (a.v[i] == -std::numeric_limits<float>::infinity()) a.v[i] = 0.f;
    return a;
  }
  static R nan_where_neginf(R a) {
    for (int i = 0; i < 4; ++i)
      a.v[i] = a.v[i] == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::quiet_NaN() : 0.f;
    return a;
  }
  static R exp_cut(R a) {
    for (int i = 0; i < 4; ++i)
      a.v[i] = std::isnan(a.v[i]) ? a.v[i] : a.v[i] >= kExpCut ? simd::exp_f32(a.v[i]) : 0.f;
    return a;
  }
};

#endif

using R = Vec::R;
constexpr int W = Vec::W;

// ---- Key and value elements (the key-lane kernels read a KV cache in its own type) ----
//
// float32, IEEE binary16 (F16C's vcvtph2ps, exact) or bfloat16 (the top 16 bits of a float32:
// zero-extend and shift left by 16, exact). Every half value is a float32, so the kernels'
// arithmetic is the float32 kernels' on the widened values.

/// The storage element of keys and values of type T.
template <KvType T>
using kv_elem = std::conditional_t<T == KvType::kF32, float, std::uint16_t>;

/// One element as float32.
template <KvType T>
inline float kv_f32(kv_elem<T> x) {
  if constexpr (T == KvType::kF32) return x;
  else if constexpr (T == KvType::kF16) return fp16_to_fp32(x);
  else return bf16_to_fp32(x);
}

/// W consecutive elements (unaligned) as a vector.
template <KvType T>
inline R load_kv(const kv_elem<T>* p) {
  if constexpr (T == KvType::kF32) {
    return Vec::loadu(p);
  } else {
#if NUMATTN_ISA == 2
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (T == KvType::kF16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif NUMATTN_ISA == 1
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (T == KvType::kF16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = kv_f32<T>(p[i]);
    return r;
#endif
  }
}
/// Most query vectors a block holds (64 rows on AVX-512: 4 vectors).
constexpr int kMaxCI = 64 / W;

/// Query vectors in one register tile. A block of CI vectors is processed kRegCI at a time, so
/// that the accumulators fit the register file: all of a 64-row block (4 vectors) on AVX-512's
/// 32 registers, 2 of its 8 vectors on AVX2's 16 (a 6 × 8 tile of 48 accumulators spilled to
/// the stack at every FMA).
constexpr int kRegCI = W == 8 ? 2 : 4;

/// Register tile of the two kernels for CI query vectors (CI ≤ kRegCI): RJ keys (S-tile) or RD
/// value dims (O-tile) by CI vectors. AVX-512: about 24 accumulators of the 32 registers, which
/// leaves room for the CI operand vectors and a broadcast; loads per FMA (RJ + CI)/(RJ·CI),
/// 10/24 for CI = 4 (Sapphire Rapids issues two FMAs and up to three loads per cycle). AVX2:
/// 12 accumulators, 2 operand vectors and a broadcast of the 16 registers.
constexpr int rows_for(int ci) {
  if (W == 8) return ci >= 2 ? 6 : 12;
  return ci >= 4 ? 6 : ci == 3 ? 8 : ci == 2 ? 12 : ci == 1 ? 16 : 1;
}

/// s[r][:] = Σ_d k_r[d]·qt[d][:] for RJ keys k_r = k + r·ldk and CI query vectors of a block
/// of BR lanes (qt and s rows BR floats apart); vmax[c] = max(vmax[c], s[·][c]),
/// vmin[c] = min(vmin[c], s[·][c]) (a -inf logit, which the softmax would silently drop, shows
/// there; NaN and +inf need no check, they propagate).
template <int RJ, int CI, int BR>
inline void qk_kernel(const float* __restrict qt, index_t dk, const float* k, index_t ldk,
                      float* __restrict s, R* vmax, R* vmin) {
  R acc[RJ][CI];
  NUMATTN_UNROLL for (int r = 0; r < RJ; ++r) NUMATTN_UNROLL for (int c = 0; c < CI; ++c) acc[r][c] = Vec::zero();
  const float* kr[RJ];
  NUMATTN_UNROLL for (int r = 0; r < RJ; ++r) kr[r] = k + r * ldk;
  for (index_t d = 0; d < dk; ++d) {
    R q[CI];
    NUMATTN_UNROLL for (int c = 0; c < CI; ++c) q[c] = Vec::load(qt + d * BR + c * W);
    NUMATTN_UNROLL for (int r = 0; r < RJ; ++r) {
      const R kb = Vec::set1(kr[r][d]);
      NUMATTN_UNROLL for (int c = 0; c < CI; ++c) acc[r][c] = Vec::fmadd(kb, q[c], acc[r][c]);
    }
  }
  NUMATTN_UNROLL for (int r = 0; r < RJ; ++r) NUMATTN_UNROLL for (int c = 0; c < CI; ++c) {
    Vec::store(s + r * BR + c * W, acc[r][c]);
    vmax[c] = Vec::max(vmax[c], acc[r][c]);
    vmin[c] = Vec::min(vmin[c], acc[r][c]);
  }
}

/// The S-tile for `cols` keys and a block of CI query vectors: groups of NJ keys (full register
/// tiles, then 8/4/2/1-key tails), each group through the block's register tiles of kRegCI
/// vectors (its keys stay in L1 from one register tile to the next).
template <int CI>
inline void qk_tile(const float* qt, index_t dk, const float* k, index_t ldk, index_t cols,
                    float* s, R* vmax, R* vmin) {
  constexpr int BR = CI * W, CR = CI < kRegCI ? CI : kRegCI, CT = CI % CR, RJ = rows_for(CR);
  auto group = [&]<int NJ>(index_t j) {
    for (int c0 = 0; c0 + CR <= CI; c0 += CR)
      qk_kernel<NJ, CR, BR>(qt + c0 * W, dk, k + j * ldk, ldk, s + j * BR + c0 * W, vmax + c0, vmin + c0);
    if constexpr (CT > 0)
      qk_kernel<NJ, CT, BR>(qt + (CI - CT) * W, dk, k + j * ldk, ldk, s + j * BR + (CI - CT) * W,
                            vmax + (CI - CT), vmin + (CI - CT));
  };
  index_t j = 0;
  for (; j + RJ <= cols; j += RJ) group.template operator()<RJ>(j);
  if constexpr (RJ > 8)
    if (j + 8 <= cols) group.template operator()<8>(j), j += 8;
  if (j + 4 <= cols) group.template operator()<4>(j), j += 4;
  if (j + 2 <= cols) group.template operator()<2>(j), j += 2;
  if (j < cols) group.template operator()<1>(j);
}

/// ot[d0+r][:] = (rescale ? corr·ot : ot) + Σ_j v_j[d0+r]·p[j][:] for RD dims, `cols` keys and
/// CI query vectors of a block of BR lanes. The tile's sum starts from zero and is added to the
/// old accumulator once (one FMA that also applies the rescale): a blocked summation, so the
/// rounding error grows with block_k + Nk/block_k rather than with Nk.
template <int RD, int CI, int BR>
inline void pv_kernel(const float* __restrict p, index_t cols, const float* v, index_t ldv,
                      float* __restrict ot, const R* corr, bool rescale) {
  R acc[RD][CI];
  NUMATTN_UNROLL for (int r = 0; r < RD; ++r) NUMATTN_UNROLL for (int c = 0; c < CI; ++c) acc[r][c] = Vec::zero();
  for (index_t j = 0; j < cols; ++j) {
    R pv[CI];
    NUMATTN_UNROLL for (int c = 0; c < CI; ++c) pv[c] = Vec::load(p + j * BR + c * W);
    const float* vr = v + j * ldv;
    NUMATTN_UNROLL for (int r = 0; r < RD; ++r) {
      const R vb = Vec::set1(vr[r]);
      NUMATTN_UNROLL for (int c = 0; c < CI; ++c) acc[r][c] = Vec::fmadd(vb, pv[c], acc[r][c]);
    }
  }
  NUMATTN_UNROLL for (int r = 0; r < RD; ++r) NUMATTN_UNROLL for (int c = 0; c < CI; ++c) {
    float* o = ot + r * BR + c * W;
    Vec::store(o, rescale ? Vec::fmadd(Vec::load(o), corr[c], acc[r][c]) : Vec::add(Vec::load(o), acc[r][c]));
  }
}

/// The O-tile over all `dv` value dims: groups of ND dims (full register tiles, then 8/4/2/1-dim
/// tails), each through the block's register tiles of kRegCI vectors.
template <int CI>
inline void pv_tile(const float* p, index_t cols, const float* v, index_t ldv, index_t dv,
                    float* ot, const R* corr, bool rescale) {
  constexpr int BR = CI * W, CR = CI < kRegCI ? CI : kRegCI, CT = CI % CR, RD = rows_for(CR);
  auto group = [&]<int ND>(index_t d) {
    for (int c0 = 0; c0 + CR <= CI; c0 += CR)
      pv_kernel<ND, CR, BR>(p + c0 * W, cols, v + d, ldv, ot + d * BR + c0 * W, corr + c0, rescale);
    if constexpr (CT > 0)
      pv_kernel<ND, CT, BR>(p + (CI - CT) * W, cols, v + d, ldv, ot + d * BR + (CI - CT) * W, corr + (CI - CT),
                            rescale);
  };
  index_t d = 0;
  for (; d + RD <= dv; d += RD) group.template operator()<RD>(d);
  if constexpr (RD > 8)
    if (d + 8 <= dv) group.template operator()<8>(d), d += 8;
  if (d + 4 <= dv) group.template operator()<4>(d), d += 4;
  if (d + 2 <= dv) group.template operator()<2>(d), d += 2;
  if (d < dv) group.template operator()<1>(d);
}

/// Keys ahead of the one being read that the key-lane kernels prefetch. Decoding streams the
/// KV cache from memory once per step (each layer's rows were evicted by the weights read since),
/// and one core's outstanding misses on the hardware prefetcher's stream alone left an MLA layer's
/// latent rows at 4 GB/s per core on a 2-core Xeon VM (a plain prefetched read reaches 14 GB/s):
/// 32 rows ahead took a 9-head MLA decode step at Nk = 4096 over 30 layers' caches from 199 to
/// 145 µs on 2 threads. 64 rows: a GQA group's key and value passes spend only a few ns per row,
/// and 32 of them are shorter than a memory latency.
constexpr index_t kPrefetchKeys = 64;

/// Prefetches into L1 the lines of the n elements that start `row` rows of stride ld after p. A
/// hint: it never faults, so rows past the cache's end are harmless; the address is formed as an
/// integer, since a pointer that far past its array would be undefined.
template <KvType T>
inline void prefetch_row(const kv_elem<T>* p, index_t row, index_t ld, index_t n) {
  constexpr auto sz = static_cast<std::uintptr_t>(sizeof(kv_elem<T>));
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(row * ld) * sz;
  const std::uintptr_t end = a + static_cast<std::uintptr_t>(n) * sz;
  for (std::uintptr_t l = a & ~std::uintptr_t{63}; l < end; l += 64) __builtin_prefetch(reinterpret_cast<const void*>(l), 0, 3);
}

// ---- Key lanes: blocks of few rows (decoding) ----
//
// A decode step of a GQA group is G rows (3 for SmolLM2, 4 for Llama-3-8B): in query lanes
// most of a vector's lanes would be padding, and every K and V element is broadcast once per
// block whatever the number of rows. Here the lanes run over the head dimension instead and
// each row is a row of scratch:
//   q  [n][Dk]   the rows' queries, pre-multiplied by the scale,
//   s  [n][lds]  logits, then probabilities, of one key tile (row = query row, column = key),
//   o  [n][Dv]   the unnormalised output,
//   S-tile:  s[r][j] = Σ_d q[r][d]·K[j][d]   (a K row loaded once for all rows; one horizontal
//                                            sum per logit, four at a time)
//   O-tile:  o[r][:] += Σ_j s[r][j]·V[j][:]  (a V row loaded once, a probability broadcast)
// so the work per key is ~(Dk + Dv)·n/W FMAs instead of (Dk + Dv) broadcasts and FMAs.

/// Most rows a key-lane kernel holds in registers (rows beyond run in further passes over
/// the tile, which is then in cache): n·4 accumulators + n query vectors + 1 key vector fit
/// the 16 AVX2 registers for n = 3 and the 32 AVX-512 registers for n = 4.
constexpr int kRowsPerPass = W >= 16 ? 4 : 3;

/// s[r·lds + jj] = Σ_d q[r·ldq + d]·k[jj·ldk + d] for NR rows and KJ (1..4) keys of type T.
template <int NR, int KJ, KvType T>
inline void qk_rows_kernel(const float* q, index_t ldq, index_t dk, const kv_elem<T>* k, index_t ldk,
                           float* s, index_t lds) {
  static_assert(KJ >= 1 && KJ <= 4);
  R acc[NR][4];
  NUMATTN_UNROLL for (int r = 0; r < NR; ++r) NUMATTN_UNROLL for (int j = 0; j < 4; ++j) acc[r][j] = Vec::zero();
  NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) prefetch_row<T>(k, j + kPrefetchKeys, ldk, dk);
  index_t d = 0;
  for (; d + W <= dk; d += W) {
    R qv[NR];
    NUMATTN_UNROLL for (int r = 0; r < NR; ++r) qv[r] = Vec::loadu(q + r * ldq + d);
    NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) {
      const R kv = load_kv<T>(k + j * ldk + d);
      NUMATTN_UNROLL for (int r = 0; r < NR; ++r) acc[r][j] = Vec::fmadd(qv[r], kv, acc[r][j]);
    }
  }
  NUMATTN_UNROLL for (int r = 0; r < NR; ++r) {
    float sum[4];
    if constexpr (KJ == 1) {
      sum[0] = Vec::hsum(acc[r][0]);
    } else {
      Vec::hsum4(acc[r], sum);  // unused accumulators are zero
    }
    for (index_t t = d; t < dk; ++t)
      NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) sum[j] = std::fma(q[r * ldq + t], kv_f32<T>(k[j * ldk + t]), sum[j]);
    NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) s[r * lds + j] = sum[j];
  }
}

/// The S-tile of NR rows for `cols` keys, KJ keys at a time: NR·KJ accumulators, NR query
/// vectors and a key vector stay in registers (3 × 3 on AVX2's 16, whose 3 × 4 made GCC reload
/// the queries at every FMA; 4 × 4 on AVX-512's 32), so a key vector load feeds NR FMAs.
template <int NR, KvType T>
inline void qk_rows_tile(const float* q, index_t ldq, index_t dk, const kv_elem<T>* k, index_t ldk,
                         index_t cols, float* s, index_t lds) {
  constexpr int KJ = W >= 16 || NR < 3 ? 4 : 3;
  index_t j = 0;
  for (; j + KJ <= cols; j += KJ) qk_rows_kernel<NR, KJ, T>(q, ldq, dk, k + j * ldk, ldk, s + j, lds);
  for (; j < cols; ++j) qk_rows_kernel<NR, 1, T>(q, ldq, dk, k + j * ldk, ldk, s + j, lds);
}

/// o[r][c·W + ·] = (rescale ? corr[r]·o : o) + Σ_j p[r·ldp + j]·v_j[c·W + ·] for NR rows and DC
/// vectors of value dims (the tile's sum is added once: blocked summation, as pv_kernel); the
/// first `prefetch` elements of the row kPrefetchKeys ahead are prefetched (the tile's first
/// block of dims streams the rows, the others find them in cache).
template <int NR, int DC, KvType T>
inline void pv_rows_kernel(const float* p, index_t ldp, index_t cols, const kv_elem<T>* v, index_t ldv,
                           float* o, index_t ldo, const float* corr, bool rescale, index_t prefetch = 0) {
  R acc[NR][DC];
  NUMATTN_UNROLL for (int r = 0; r < NR; ++r) NUMATTN_UNROLL for (int c = 0; c < DC; ++c) acc[r][c] = Vec::zero();
  for (index_t j = 0; j < cols; ++j) {
    if (prefetch > 0) prefetch_row<T>(v, j + kPrefetchKeys, ldv, prefetch);
    R vv[DC];
    NUMATTN_UNROLL for (int c = 0; c < DC; ++c) vv[c] = load_kv<T>(v + j * ldv + c * W);
    NUMATTN_UNROLL for (int r = 0; r < NR; ++r) {
      const R pb = Vec::set1(p[r * ldp + j]);
      NUMATTN_UNROLL for (int c = 0; c < DC; ++c) acc[r][c] = Vec::fmadd(pb, vv[c], acc[r][c]);
    }
  }
  NUMATTN_UNROLL for (int r = 0; r < NR; ++r) NUMATTN_UNROLL for (int c = 0; c < DC; ++c) {
    float* oo = o + r * ldo + c * W;
    Vec::storeu(oo, rescale ? Vec::fmadd(Vec::loadu(oo), Vec::set1(corr[r]), acc[r][c])
                            : Vec::add(Vec::loadu(oo), acc[r][c]));
  }
}

/// The O-tile of NR rows over all `dv` value dims: blocks of DC vectors, NR·DC accumulators
/// with DC value vectors in registers (AVX2: 8, 4, 3 vectors for 1, 2, 3 rows; AVX-512: 4 up to
/// 6 rows, ⌊27/NR⌋ for the wide kernels' 7 to 12), then two and single vectors, then a scalar
/// tail of dv mod W dims.
template <int NR, KvType T>
inline void pv_rows_tile(const float* p, index_t ldp, index_t cols, const kv_elem<T>* v, index_t ldv,
                         index_t dv, float* o, index_t ldo, const float* corr, bool rescale) {
  constexpr int DC = W >= 16 ? (27 / NR < 4 ? 27 / NR : 4) : NR == 1 ? 8 : NR == 2 ? 4 : 3;
  index_t d = 0;
  for (; d + DC * W <= dv; d += DC * W)
    pv_rows_kernel<NR, DC, T>(p, ldp, cols, v + d, ldv, o + d, ldo, corr, rescale, d == 0 ? dv : 0);
  if constexpr (DC > 2)
    if (d + 2 * W <= dv)
      pv_rows_kernel<NR, 2, T>(p, ldp, cols, v + d, ldv, o + d, ldo, corr, rescale, d == 0 ? dv : 0), d += 2 * W;
  for (; d + W <= dv; d += W)
    pv_rows_kernel<NR, 1, T>(p, ldp, cols, v + d, ldv, o + d, ldo, corr, rescale, d == 0 ? dv : 0);
  for (; d < dv; ++d)
    for (int r = 0; r < NR; ++r) {
      float sum = 0.f;
      // Explicit FMAs: the compiler's own contraction choice could differ per element type.
      for (index_t j = 0; j < cols; ++j) sum = std::fma(p[r * ldp + j], kv_f32<T>(v[j * ldv + d]), sum);
      float& od = o[r * ldo + d];
      od = rescale ? std::fma(od, corr[r], sum) : od + sum;
    }
}

#if NUMATTN_ISA == 2

// ---- Key lanes, many rows per kv head (AVX-512) ----
//
// Five to twelve rows of one kv head (an MLA layer's query heads over its one latent head, or a
// GQA group of G ≥ 5) in one pass, so that every key and value element is loaded and widened
// once per tile instead of once per pass of kRowsPerPass rows. The S-tile keeps NR·KJ
// accumulators (three keys up to 9 rows, two beyond; each query vector loaded once for them),
// spills them unreduced to a scratch of [NR][16 keys] vectors, and reduces sixteen of them at
// once into a vector of sixteen logits (reduce16: 45 shuffles and adds for 16 sums, against ~6
// per sum for one-by-one horizontal sums). The O-tile is pv_rows_tile's, NR·DC ≤ 27 accumulators.

/// Most rows of one pass of the wide kernels; more run in balanced passes.
constexpr int kMaxWideRows = 12;

/// (a.B0 + a.B1, a.B2 + a.B3, b.B0 + b.B1, b.B2 + b.B3) of the 128-bit blocks B of a and b (the
/// integer form of the block shuffle, which SIMDe's emulation also has).
inline __m512 add_block_pairs(__m512 a, __m512 b) {
  const __m512i x = _mm512_castps_si512(a), y = _mm512_castps_si512(b);
  return _mm512_add_ps(_mm512_castsi512_ps(_mm512_shuffle_i32x4(x, y, 0x88)),
                       _mm512_castsi512_ps(_mm512_shuffle_i32x4(x, y, 0xDD)));
}

/// Lane i of the result = Σ lanes of a[i], i < 16 (a[i] 64-byte aligned, consecutive).
inline __m512 reduce16(const float* a) {
  __m512 l1[8], l2[4], l3[2];
  // Level 1: within each 128-bit block, lanes (0+2, 1+3) of a pair's vectors, interleaved.
  for (int i = 0; i < 8; ++i) {
    const __m512 x = _mm512_load_ps(a + 32 * i), y = _mm512_load_ps(a + 32 * i + 16);
    l1[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  // Level 2: each 128-bit block holds one partial sum of four inputs.
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(l1[2 * i]), y = _mm512_castps_pd(l1[2 * i + 1]);
    l2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // Level 3: blocks 0+1 and 2+3 of two vectors; level 4: the last pair of blocks.
  for (int i = 0; i < 2; ++i) l3[i] = add_block_pairs(l2[2 * i], l2[2 * i + 1]);
  return add_block_pairs(l3[0], l3[1]);
}

/// The first n (< 16) elements of type T at p as a vector (the rest 0), reading no further.
template <KvType T>
inline R load_kv_tail(const kv_elem<T>* p, int n) {
  if constexpr (T == KvType::kF32) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
  } else {
    kv_elem<T> b[16] = {};
    std::copy_n(p, n, b);
    return load_kv<T>(b);
  }
}

/// part[(r·16 + j)·16 + ·] = lane partials of q_r · k_j for NR rows and KJ (1..3) keys.
template <int NR, int KJ, KvType T>
inline void qk_wide_kernel(const float* q, index_t ldq, index_t dk, const kv_elem<T>* k, index_t ldk,
                           float* part) {
  R acc[NR][KJ];
  NUMATTN_UNROLL for (int r = 0; r < NR; ++r) NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) acc[r][j] = Vec::zero();
  NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) prefetch_row<T>(k, j + kPrefetchKeys, ldk, dk);
  index_t d = 0;
  for (; d + W <= dk; d += W) {
    R kv[KJ];
    NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) kv[j] = load_kv<T>(k + j * ldk + d);
    NUMATTN_UNROLL for (int r = 0; r < NR; ++r) {
      R qv = Vec::loadu(q + r * ldq + d);
      // One load per query vector for all KJ keys (GCC otherwise folds it into every FMA and the
      // loop runs out of load ports before FMA ports).
#if !defined(NUMATTN_EMULATE_AVX512)
      if constexpr (KJ > 1) __asm__("" : "+v"(qv));
#endif
      NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) acc[r][j] = Vec::fmadd(qv, kv[j], acc[r][j]);
    }
  }
  if (d < dk) {
    const int n = static_cast<int>(dk - d);
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
    R kv[KJ];
    NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) kv[j] = load_kv_tail<T>(k + j * ldk + d, n);
    NUMATTN_UNROLL for (int r = 0; r < NR; ++r) {
      const R qv = _mm512_maskz_loadu_ps(m, q + r * ldq + d);
      NUMATTN_UNROLL for (int j = 0; j < KJ; ++j) acc[r][j] = Vec::fmadd(qv, kv[j], acc[r][j]);
    }
  }
  NUMATTN_UNROLL for (int r = 0; r < NR; ++r) NUMATTN_UNROLL for (int j = 0; j < KJ; ++j)
    Vec::store(part + (r * 16 + j) * 16, acc[r][j]);
}

/// The S-tile of NR (5..kMaxWideRows) rows for `cols` keys: s[r·lds + j] = Σ_d q[r·ldq + d]·k[j·ldk + d].
template <int NR, KvType T>
inline void qk_wide_tile(const float* q, index_t ldq, index_t dk, const kv_elem<T>* k, index_t ldk,
                         index_t cols, float* s, index_t lds) {
  alignas(64) float part[NR * 16 * 16];
  for (index_t j0 = 0; j0 < cols; j0 += 16) {
    const int nb = static_cast<int>(std::min<index_t>(16, cols - j0));
    int jj = 0;
    constexpr int KJ = NR <= 9 ? 3 : 2;
    for (; jj + KJ <= nb; jj += KJ) qk_wide_kernel<NR, KJ, T>(q, ldq, dk, k + (j0 + jj) * ldk, ldk, part + jj * 16);
    if constexpr (KJ == 3)
      if (jj + 2 <= nb) qk_wide_kernel<NR, 2, T>(q, ldq, dk, k + (j0 + jj) * ldk, ldk, part + jj * 16), jj += 2;
    if (jj < nb) qk_wide_kernel<NR, 1, T>(q, ldq, dk, k + (j0 + jj) * ldk, ldk, part + jj * 16);
    for (int r = 0; r < NR; ++r) {
      float* pr = part + r * 256;
      for (int j = nb; j < 16; ++j) Vec::store(pr + j * 16, Vec::zero());
      const R sums = reduce16(pr);
      if (nb == 16) {
        Vec::storeu(s + r * lds + j0, sums);
      } else {
        alignas(64) float b[16];
        Vec::store(b, sums);
        std::copy_n(b, nb, s + r * lds + j0);
      }
    }
  }
}

#else

constexpr int kMaxWideRows = kRowsPerPass;

#endif

}  // namespace numattn::flash::NUMATTN_ISA_NS
