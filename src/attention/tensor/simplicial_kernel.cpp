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

#include "attention/tensor/simplicial_rows.h"
#include "numattn/attention/simplicial.h"
#include "numattn/core/cpu.h"
#include "numattn/core/error.h"
#include "numattn/core/simd.h"

namespace numattn {

namespace {

using namespace simplicial_rows;

const bool kRegistered = (register_kernel_family("tensor.simplicial", CpuPath::kAvx512), true);

// ---------------------------------------------------------------------------------------------
// Portable kernel: the same algorithm in plain loops (auto-vectorised where the compiler can).

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

/// The row kernel of the library's CPU path (core/cpu.h).
RowFn row_kernel() { return pick_isa_variant<RowFn>(row_portable, avx2::row_fn(), avx512::row_fn()); }

}  // namespace

std::size_t simplicial_workspace_bytes(const AttentionProblem& p, index_t w1, index_t w2, int threads) {
  const index_t dk = p.d_qk(), dvp = round_up(std::max<index_t>(p.d_v(), 1), kL);
  const index_t nkp = round_up(std::min(w2, p.n_kv()), kL);
  const index_t ju = std::min(kQB + w1, p.n_kv()), ku = std::min(kQB + w2, p.n_kv());
  const std::size_t floats = static_cast<std::size_t>(dk * (ku + kL) + (ju + ku) * dvp + dk * nkp + kTJ * nkp + 2 * dvp);
  return (floats * sizeof(float) + static_cast<std::size_t>(ju) * sizeof(float*)) * static_cast<std::size_t>(threads);
}

void simplicial_attention(const AttentionProblem& p, const TensorView<const float>& k2,
                          const TensorView<const float>& v2, index_t w1, index_t w2, const ExecContext& ctx) {
  validate(p);
  NUMATTN_CHECK(w1 >= 1 && w2 >= 1, "2-simplicial attention: windows w1 = {} and w2 = {} must be ≥ 1", w1, w2);
  NUMATTN_CHECK(p.mask.kind == MaskKind::kNone, "2-simplicial attention takes no boolean or additive mask");
  NUMATTN_CHECK(k2.shape == p.k.shape, "2-simplicial attention: K' must have K's shape");
  NUMATTN_CHECK(v2.shape == p.v.shape, "2-simplicial attention: V' must have V's shape (Dv of V and V' must agree)");
  NUMATTN_CHECK(k2.stride[3] == 1 && v2.stride[3] == 1, "2-simplicial attention: K' and V' rows must be contiguous");
  const index_t B = p.batch(), H = p.heads(), nq = p.n_q(), dk = p.d_qk(), dv = p.d_v();
  const index_t dvp = round_up(std::max<index_t>(dv, 1), kL), blocks = (nq + kQB - 1) / kQB;
  const float scale = static_cast<float>(p.effective_scale());
  const RowFn row = row_kernel();
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
    // Largest finite |value| of each packed row: a row's output is a convex combination of
    // products v_j ⊙ v'_k over its own windows, accumulated with weights up to |J_i|·|K_i| before
    // the normalisation, so each row checks that bound over the values it reads (a non-finite one
    // reaches its output as NaN instead, and run names it).
    const auto row_max = [dv](const float* x) {
      float m = 0.0f;
      for (index_t d = 0; d < dv; ++d)
        if (std::isfinite(x[d])) m = std::max(m, std::abs(x[d]));
      return static_cast<double>(m);
    };
    std::vector<double> m1(static_cast<std::size_t>(nju)), m2(static_cast<std::size_t>(nku));
    for (index_t j = 0; j < nju; ++j) m1[static_cast<std::size_t>(j)] = row_max(v1p.data() + j * dvp);
    for (index_t k = 0; k < nku; ++k) m2[static_cast<std::size_t>(k)] = row_max(v2p.data() + k * dvp);
    RowScratch sc;
    for (index_t i = i0; i < i1; ++i) {
      float* out = p.out.row(b, h, i);
      const KeyRange J = simplicial_range(p, i, w1), K = simplicial_range(p, i, w2);
      if (J.empty() || K.empty()) {
        std::fill(out, out + dv, 0.0f);
        if (!p.lse.empty()) p.lse(b, h, i, 0) = kNegInf;
        continue;
      }
      double a1 = 0, a2 = 0;
      for (index_t j = J.begin; j < J.end; ++j) a1 = std::max(a1, m1[static_cast<std::size_t>(j - jl)]);
      for (index_t k = K.begin; k < K.end; ++k) a2 = std::max(a2, m2[static_cast<std::size_t>(k - kl)]);
      const double bound = a1 * a2 * static_cast<double>((J.end - J.begin) * (K.end - K.begin));
      NUMATTN_CHECK(!(bound > 1e37),
                    "2-simplicial attention: query row [b,h,i] = [{},{},{}] combines values v_j ⊙ v'_k up to "
                    "max|v|·max|v'| = {:.3g} over its windows ({}·{} pairs): beyond the float32 range of its sums "
                    "(bound 1e37); reduce the magnitude of v",
                    b, h, i, a1 * a2, J.end - J.begin, K.end - K.begin);
      RowJob job{p.q.row(b, h, i), krows.data() + (J.begin - jl), kt.data() + (K.begin - kl), ldkt,
                 v1p.data() + (J.begin - jl) * dvp, v2p.data() + (K.begin - kl) * dvp, J.end - J.begin,
                 K.end - K.begin, dk, dvp, scale};
      RowResult r;
      r = row(job, sc);
      const float inv = 1.0f / r.l;
      for (index_t d = 0; d < dv; ++d) out[d] = sc.acc[static_cast<std::size_t>(d)] * inv;
      if (!p.lse.empty()) p.lse(b, h, i, 0) = r.m + std::log(r.l);
    }
  });
}

}  // namespace numattn
