// attention/blocks/select_gather.h: the portable variant of its loops
// (select_gather_kernels.h), the dispatch, and the selection algorithm over them.
#define NUMATTN_ISA 0
#include "attention/blocks/select_gather_kernels.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>

#include "attention/blocks/select_gather.h"
#include "numattn/core/cpu.h"
#include "numattn/core/error.h"
#include "numattn/core/simd.h"

namespace numattn::blocks {

namespace {

using select_gather_ops::Ops;

const bool kRegistered = (register_kernel_family("attention.select_gather (top-k selection, gathered softmax)", CpuPath::kAvx512), true);

const Ops& ops_now() {
  return *pick_isa_variant(select_gather_ops::portable::ops(), select_gather_ops::avx2::ops(),
                           select_gather_ops::avx512::ops());
}

constexpr float kLow = -FLT_MAX;  // s ≥ kLow: every entry but −inf and NaN
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr index_t kSlack = 16;     // the split loop stores whole vectors
constexpr index_t kSample = 64;    // entries sampled to bracket the k-th largest
constexpr index_t kSmall = 128;    // rows this short: one nth_element over a copy
constexpr std::int64_t kChunk = 128;  // keys per chunk of attend_chosen: 32 KB of k (or v) rows at Dk = 64

/// The positions (base + u, increasing) of the k largest entries of s when thr is the k-th largest
/// value and `above` entries exceed it: every entry above thr, and the first of those equal to it.
/// `spare` has room for n + 16 entries (every entry may equal thr).
index_t take_at_threshold(const Ops& o, const float* s, index_t n, index_t k, float thr, index_t above,
                          std::int32_t base, std::int32_t* out, std::int32_t* spare) {
  index_t unused = 0;
  const index_t c = o.split(s, n, thr, thr, base, spare, out, &unused);  // nothing is in [thr, thr)
  if (c == k) {
    std::copy(spare, spare + k, out);
    return k;
  }
  index_t ties = k - above, kept = 0;  // more entries equal thr than needed: the first ones
  for (index_t t = 0; t < c; ++t) {
    const float x = s[spare[t] - base];
    if (x > thr) out[kept++] = spare[t];
    else if (ties > 0) out[kept++] = spare[t], --ties;
  }
  return kept;
}

}  // namespace

index_t select_top(const float* s, index_t n, index_t k, std::int32_t base, std::int32_t* out, SelectScratch& w) {
  if (k <= 0 || n <= 0) return 0;
  const Ops& o = ops_now();
  // band: n entries (+ slack); behind it, room for a second list the split loop may write.
  w.band.resize(static_cast<std::size_t>(2 * (n + kSlack)));
  std::int32_t* spare = w.band.data() + n + kSlack;
  index_t nb = 0;
  if (k >= n) return o.split(s, n, kLow, kLow, base, out, spare, &nb);  // every entry but −inf and NaN
  // Bracket the k-th largest: a with c(a) = #{s ≥ a} ≥ k, b with c(b) < k (b = +inf: c(b) counts
  // the +inf entries). Short rows: the whole row is the band. Longer ones: a sample places both
  // ends about two standard deviations of the sample rank either side of k·m/n.
  float a = kLow, b = kInf;
  if (n > kSmall) {
    w.vals.clear();
    for (index_t j = 0; j < kSample; ++j) {
      const float x = s[(2 * j + 1) * n / (2 * kSample)];
      if (x > -kInf && x < kInf) w.vals.push_back(x);
    }
    const auto mv = static_cast<index_t>(w.vals.size());
    if (mv >= 8) {
      const double rho = static_cast<double>(k) * static_cast<double>(kSample) / static_cast<double>(n);
      const double margin = 2 * std::sqrt(rho) + 2;
      const auto r_lo = static_cast<index_t>(std::ceil(rho + margin));
      const auto r_hi = static_cast<index_t>(std::floor(rho - margin));
      // The r_lo-th largest first; the r_hi-th (r_hi < r_lo) is then among the values before it.
      auto hi_end = w.vals.end();
      if (r_lo <= mv) {
        std::nth_element(w.vals.begin(), w.vals.begin() + (r_lo - 1), w.vals.end(), std::greater<float>());
        a = w.vals[static_cast<std::size_t>(r_lo - 1)];
        hi_end = w.vals.begin() + (r_lo - 1);
      }
      if (r_hi >= 1) {
        std::nth_element(w.vals.begin(), w.vals.begin() + (r_hi - 1), hi_end, std::greater<float>());
        b = w.vals[static_cast<std::size_t>(r_hi - 1)];
      }
    }
  }
  index_t ca = 0, cb = 0;
  o.count2(s, n, a, b, &ca, &cb);
  if (cb >= k && b < kInf) {  // b too low: the k-th largest is at or above it
    a = b, ca = cb;
    b = kInf;
    index_t unused = 0;
    o.count2(s, n, b, b, &cb, &unused);
  } else if (ca < k && a > kLow) {  // a too high
    b = a, cb = ca;
    a = kLow;
    index_t unused = 0;
    o.count2(s, n, a, a, &ca, &unused);
  }
  // Exactly k entries at or above a (or fewer than k left at all, a = kLow): all of them.
  if (ca <= k) return o.split(s, n, a, a, base, out, spare, &nb);
  if (cb >= k) {  // k or more +inf entries: the first k of them
    o.split(s, n, kInf, kInf, base, spare, w.band.data(), &nb);
    std::copy(spare, spare + k, out);
    return k;
  }
  if (b == kInf && ca - k > 48) {  // a finite upper end for the interpolation below
    const float mx = simd::max_f32(s, n);
    if (mx > kLow && mx < kInf) b = std::nextafter(mx, kInf);
  }
  // Narrow the bracket by interpolating the count between its ends (two probes per pass).
  for (int it = 0; it < 3 && ca - cb > 48 && a > kLow && b < kInf; ++it) {
    const double f = static_cast<double>(ca - k) / static_cast<double>(ca - cb), d = 0.15;
    const float t1 = static_cast<float>(a + (static_cast<double>(b) - a) * std::max(0.0, f - d));
    const float t2 = static_cast<float>(a + (static_cast<double>(b) - a) * std::min(1.0, f + d));
    index_t c1 = 0, c2 = 0;
    o.count2(s, n, t1, t2, &c1, &c2);
    if (c1 >= k) a = t1, ca = c1;
    else if (t1 < b) b = t1, cb = c1;
    if (c2 >= k) a = std::max(a, t2), ca = std::min(ca, c2);
    else if (t2 < b) b = t2, cb = c2;
  }
  // The k-th largest is the (k − cb)-th largest of the band [a, b).
  w.vals.resize(static_cast<std::size_t>(ca - cb + kSlack));
  const index_t nv = o.band_values(s, n, a, b, w.vals.data());
  const index_t need = k - cb;
  NUMATTN_ASSERT(nv == ca - cb && need >= 1 && need <= nv);
  const auto vb = w.vals.begin();
  std::nth_element(vb, vb + (need - 1), vb + nv, std::greater<float>());
  const float thr = w.vals[static_cast<std::size_t>(need - 1)];
  index_t above = cb;
  for (index_t t = 0; t < need - 1; ++t) above += w.vals[static_cast<std::size_t>(t)] > thr;
  return take_at_threshold(o, s, n, k, thr, above, base, out, spare);
}

void pack_key_panels(const float* k, index_t ldk, index_t nk, index_t dk, float* kt) {
  const index_t np = (nk + 15) / 16;
  for (index_t p = 0; p < np; ++p) {
    float* dst = kt + p * 16 * dk;
    for (index_t c = 0; c < 16; ++c) {
      const index_t j = 16 * p + c;
      if (j < nk)
        for (index_t d = 0; d < dk; ++d) dst[16 * d + c] = k[j * ldk + d];
      else
        for (index_t d = 0; d < dk; ++d) dst[16 * d + c] = 0.f;
    }
  }
}

void panel_scores(const float* q, index_t ldq, index_t m, index_t dk, const float* kt, index_t npanel, float scale,
                  float* s, index_t lds) {
  if (m > 0 && npanel > 0) ops_now().panel_scores(q, ldq, m, dk, kt, npanel, scale, s, lds);
}

void gather_logits(const float* q, index_t dk, const float* k, index_t ldk, const std::int32_t* idx, index_t n,
                   float scale, float* l) {
  if (n > 0) ops_now().logits(q, dk, k, ldk, idx, n, scale, l);
}

void gather_rows(const float* src, index_t ld, const std::int32_t* idx, index_t n, index_t d, float* dst) {
  // A row copy: memcpy is already as fast as the memory allows, no kernel per instruction set.
  for (index_t t = 0; t < n; ++t) std::copy_n(src + static_cast<index_t>(idx[t]) * ld, d, dst + t * d);
}

float softmax_gather_values(float* l, index_t n, const float* v, index_t ldv, index_t dv, const std::int32_t* idx,
                            float* out) {
  if (n == 0) {
    std::fill(out, out + dv, 0.f);
    return -kInf;
  }
  const float m = simd::max_f32(l, n);  // NaN when a logit is NaN
  if (!(std::abs(m) < kInf)) {          // NaN, +inf (overflow), or every chosen logit −inf
    std::fill(out, out + dv, std::numeric_limits<float>::quiet_NaN());
    return std::numeric_limits<float>::quiet_NaN();
  }
  const double z = simd::exp_shift(l, n, -m);  // ≥ 1: the maximum's own weight
  std::fill(out, out + dv, 0.f);
  ops_now().accumulate(l, n, v, ldv, dv, idx, out);
  const auto inv = static_cast<float>(1.0 / z);
  for (index_t c = 0; c < dv; ++c) out[c] *= inv;
  return m + static_cast<float>(std::log(z));
}

void attend_chosen(const ChosenRow* rows, index_t nrows, const float* k, index_t ldk, const float* v, index_t ldv,
                   index_t dk, index_t dv, float scale, AttendScratch& w) {
  const Ops& o = ops_now();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  w.off.resize(static_cast<std::size_t>(nrows + 1));
  w.off[0] = 0;
  std::int32_t lo = std::numeric_limits<std::int32_t>::max(), hi = -1;
  for (index_t r = 0; r < nrows; ++r) {
    const ChosenRow& row = rows[r];
    w.off[static_cast<std::size_t>(r + 1)] = w.off[static_cast<std::size_t>(r)] + row.n;
    if (row.n > 0) lo = std::min(lo, row.keys[0]), hi = std::max(hi, row.keys[row.n - 1]);
  }
  w.l.resize(static_cast<std::size_t>(w.off[static_cast<std::size_t>(nrows)]));
  w.acc.assign(static_cast<std::size_t>(nrows * dv), 0.f);
  w.z.resize(static_cast<std::size_t>(nrows));
  w.cur.resize(static_cast<std::size_t>(nrows));
  // One pass over the chosen keys in chunks of kChunk keys, every row's share of a chunk in turn:
  // `step(r, t, len)` handles row r's chosen keys t..t+len (all in the chunk).
  const auto by_chunks = [&](auto&& step) {
    std::fill(w.cur.begin(), w.cur.end(), 0);
    for (std::int64_t c0 = lo - lo % kChunk; c0 <= hi; c0 += kChunk) {
      const auto c1 = static_cast<std::int32_t>(std::min<std::int64_t>(c0 + kChunk, hi + std::int64_t{1}));
      for (index_t r = 0; r < nrows; ++r) {
        const ChosenRow& row = rows[r];
        index_t& t = w.cur[static_cast<std::size_t>(r)];
        index_t e = t;
        while (e < row.n && row.keys[e] < c1) ++e;
        if (e > t) step(r, t, e - t);
        t = e;
      }
    }
  };
  by_chunks([&](index_t r, index_t t, index_t len) {
    o.logits(rows[r].q, dk, k, ldk, rows[r].keys + t, len, scale, w.l.data() + w.off[static_cast<std::size_t>(r)] + t);
  });
  for (index_t r = 0; r < nrows; ++r) {
    const ChosenRow& row = rows[r];
    float* l = w.l.data() + w.off[static_cast<std::size_t>(r)];
    if (row.add)
      for (index_t t = 0; t < row.n; ++t) l[t] += row.add[row.keys[t]];
    const float m = row.n > 0 ? simd::max_f32(l, row.n) : -kInf;
    float& z = w.z[static_cast<std::size_t>(r)];
    if (row.n == 0) {
      z = 0;
    } else if (!(std::abs(m) < kInf)) {  // NaN, +inf (overflow), or every chosen logit −inf
      z = kNaN;
    } else {
      z = static_cast<float>(simd::exp_shift(l, row.n, -m));
      if (row.lse) *row.lse = m + std::log(z);
    }
  }
  by_chunks([&](index_t r, index_t t, index_t len) {
    if (!(w.z[static_cast<std::size_t>(r)] > 0)) return;
    o.accumulate(w.l.data() + w.off[static_cast<std::size_t>(r)] + t, len, v, ldv, dv, rows[r].keys + t,
                 w.acc.data() + r * dv);
  });
  for (index_t r = 0; r < nrows; ++r) {
    const ChosenRow& row = rows[r];
    const float z = w.z[static_cast<std::size_t>(r)];
    const float* a = w.acc.data() + r * dv;
    if (z > 0) {
      const float inv = 1.f / z;
      for (index_t c = 0; c < dv; ++c) row.out[c] = a[c] * inv;
    } else {
      std::fill(row.out, row.out + dv, z == 0 ? 0.f : kNaN);
      if (row.lse) *row.lse = z == 0 ? -kInf : kNaN;
    }
  }
}

}  // namespace numattn::blocks
