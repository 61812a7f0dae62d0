#include "numattn/attention/blocks/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/simd.h"

namespace numattn::blocks {

namespace {

/// Keys row i sees: [0, E(i)).
index_t seen(const AttentionProblem& p, index_t i) {
  if (p.causal == Causal::kNone) return p.n_kv();
  return std::clamp<index_t>(i + p.diag_offset() + 1, 0, p.n_kv());
}

/// Key rows per state segment without a causal rule (only the total state is needed there).
constexpr index_t kFlatSegment = 1024;

/// Segment boundaries of the key states without a causal rule: every kFlatSegment keys.
std::vector<index_t> boundaries(const AttentionProblem& p) {
  const index_t nk = keys_read(p);
  std::vector<index_t> b{0};
  for (index_t j = kFlatSegment; j < nk; j += kFlatSegment) b.push_back(j);
  if (nk > 0) b.push_back(nk);
  return b;
}

/// φ rows from ψ rows: ψ itself, or ψ ⊗ ψ (row-major m × m) when self-tensoring.
const float* expand(const LinearAttentionConfig& cfg, const float* psi, index_t rows, std::vector<float>& buf) {
  if (!cfg.self_tensor) return psi;
  const index_t m = cfg.feature_dim, mm = m * m;
  buf.resize(static_cast<std::size_t>(rows * mm));
  for (index_t r = 0; r < rows; ++r) {
    const float* x = psi + r * m;
    float* y = buf.data() + r * mm;
    for (index_t a = 0; a < m; ++a)
      for (index_t c = 0; c < m; ++c) y[a * m + c] = x[a] * x[c];
  }
  return buf.data();
}

/// [V | 1] for keys [j0, j0 + rows) of (b, hk): rows × (Dv + 1).
void augment_values(const AttentionProblem& p, index_t b, index_t hk, index_t j0, index_t rows,
                    std::vector<float>& buf) {
  const index_t dv = p.d_v(), ld = dv + 1;
  buf.resize(static_cast<std::size_t>(rows * ld));
  for (index_t r = 0; r < rows; ++r) {
    const float* v = p.v.row(b, hk, j0 + r);
    std::copy(v, v + dv, buf.data() + r * ld);
    buf[static_cast<std::size_t>(r * ld + dv)] = 1.f;
  }
}

/// out = num / (c + den) from an augmented row [num | den].
void finish_row(const Denominator& den, const float* aug, index_t dv, float* out) {
  double d = aug[dv];
  if (den.clamp_nonneg && d < 0) d = 0;  // NaN stays NaN
  d += den.shift;
  if (d == 0) {
    std::fill(out, out + dv, 0.f);
    return;
  }
  const double inv = 1.0 / d;
  for (index_t k = 0; k < dv; ++k) out[k] = static_cast<float>(aug[k] * inv);
}

/// Whether v rows [j0, j1) of (b, hk) are all finite.
bool values_finite(const AttentionProblem& p, index_t b, index_t hk, index_t j0, index_t j1) {
  for (index_t j = j0; j < j1; ++j)
    if (!simd::all_finite(p.v.row(b, hk, j), p.d_v())) return false;
  return true;
}

/// Per-worker scratch.
struct Scratch {
  std::vector<float> phi, psi, aug, vals, scores, kt;
};

struct Layout {
  index_t m, mm, dv1, nk;  // ψ columns, φ columns, Dv + 1, keys read
  std::size_t state_floats() const { return static_cast<std::size_t>(mm * dv1); }
};

Layout layout(const AttentionProblem& p, const LinearAttentionConfig& cfg) {
  const index_t m = cfg.feature_dim;
  return {m, cfg.self_tensor ? m * m : m, p.d_v() + 1, keys_read(p)};
}

/// A key state, M·(Dv+1) floats: S = φ(K)ᵀ V (M × Dv, row-major) then z = φ(K)ᵀ 1 (M). Kept apart
/// rather than as [V | 1]: GEMMs of width Dv (64) run much faster than of width Dv + 1.
void state_gemm(const AttentionProblem& p, const Layout& L, index_t b, index_t hk, const float* phi, index_t j0,
                index_t rows, float* out, bool accumulate = false) {
  const index_t dv = p.d_v();
  blas::sgemm(blas::Trans::kYes, blas::Trans::kNo, L.mm, dv, rows, 1.f, phi, L.mm, p.v.row(b, hk, j0), p.v.stride[2],
              accumulate ? 1.f : 0.f, out, dv);
  float* z = out + L.mm * dv;
  if (!accumulate) std::fill(z, z + L.mm, 0.f);
  for (index_t r = 0; r < rows; ++r) {
    const float* f = phi + r * L.mm;
    for (index_t a = 0; a < L.mm; ++a) z[a] += f[a];
  }
}

/// aug (rows × (Dv+1)) = [φ_Q S | φ_Q z].
void apply_state(const Layout& L, index_t dv, const float* qphi, index_t rows, const float* state, float* aug) {
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, L.mm, 1.f, qphi, L.mm, state, dv, 0.f, aug, L.dv1);
  const float* z = state + L.mm * dv;
  for (index_t r = 0; r < rows; ++r) aug[r * L.dv1 + dv] = simd::dot_f32(qphi + r * L.mm, z, L.mm);
}

/// The prefix-sum recurrence (CausalAlgo::kPrefix), one query head per work item.
void prefix_scan(const AttentionProblem& p, const LinearAttentionConfig& cfg, const FeatureFn& query,
                 const float* keys, const ExecContext& ctx) {
  const Layout L = layout(p, cfg);
  const index_t nq = p.n_q(), dv = p.d_v(), chunk = std::max<index_t>(cfg.chunk, 1);
  const int nt = std::max(1, std::min<int>(ctx.num_threads(), static_cast<int>(p.batch() * p.heads())));
  std::vector<Scratch> ws(static_cast<std::size_t>(nt));
  parallel_for(ExecContext{nt}, p.batch() * p.heads(), [&](std::int64_t t) {
    const index_t b = t / p.heads(), h = t % p.heads(), hk = h / p.group();
    Scratch& s = ws[worker_slot(ws.size())];
    std::vector<double> state(L.state_floats(), 0.0);
    std::vector<float> kphi_buf;
    const float* kbase = keys + (b * p.kv_heads() + hk) * L.nk * L.m;
    index_t added = 0;
    for (index_t i0 = 0; i0 < nq; i0 += chunk) {
      const index_t rows = std::min(chunk, nq - i0);
      s.psi.resize(static_cast<std::size_t>(rows * L.m));
      query(b, h, i0, rows, s.psi.data());
      const float* qphi = expand(cfg, s.psi.data(), rows, s.phi);
      for (index_t r = 0; r < rows; ++r) {
        const index_t e = seen(p, i0 + r);
        for (; added < e; ++added) {
          const float* kphi = expand(cfg, kbase + added * L.m, 1, kphi_buf);
          const float* v = p.v.row(b, hk, added);
          for (index_t a = 0; a < L.mm; ++a) {
            const double f = kphi[a];
            double* srow = state.data() + a * L.dv1;
            for (index_t d = 0; d < dv; ++d) srow[d] += f * v[d];
            srow[dv] += f;
          }
        }
        s.aug.assign(static_cast<std::size_t>(L.dv1), 0.f);
        std::vector<double> acc(static_cast<std::size_t>(L.dv1), 0.0);
        const float* f = qphi + r * L.mm;
        for (index_t a = 0; a < L.mm; ++a) {
          const double fa = f[a];
          const double* srow = state.data() + a * L.dv1;
          for (index_t d = 0; d < L.dv1; ++d) acc[static_cast<std::size_t>(d)] += fa * srow[d];
        }
        for (index_t d = 0; d < L.dv1; ++d) s.aug[static_cast<std::size_t>(d)] = static_cast<float>(acc[static_cast<std::size_t>(d)]);
        finish_row(cfg.den, s.aug.data(), dv, p.out.row(b, h, i0 + r));
      }
    }
  });
}

/// Masked diagonal block of query rows [i0, i0 + rows): adds tril-masked (ψ_Q ψ_Kᵀ)[V | 1] over
/// keys [E(i0), E(i0 + rows − 1)) to `aug` (rows × (Dv+1)).
void diagonal_block(const AttentionProblem& p, const LinearAttentionConfig& cfg, const Layout& L, index_t b,
                    index_t hk, index_t i0, index_t rows, const float* psi, const float* kbase, Scratch& s) {
  const index_t j0 = seen(p, i0), j1 = seen(p, i0 + rows - 1);
  if (j1 <= j0) return;
  const index_t nd = j1 - j0;
  s.scores.resize(static_cast<std::size_t>(rows * nd));
  // ψ_K of the block transposed first: OpenBLAS runs this small NN product faster than the NT one.
  s.kt.resize(static_cast<std::size_t>(L.m * nd));
  for (index_t j = 0; j < nd; ++j) {
    const float* k = kbase + (j0 + j) * L.m;
    for (index_t a = 0; a < L.m; ++a) s.kt[static_cast<std::size_t>(a * nd + j)] = k[a];
  }
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, nd, L.m, 1.f, psi, L.m, s.kt.data(), nd, 0.f,
              s.scores.data(), nd);
  for (index_t r = 0; r < rows; ++r) {
    float* a = s.scores.data() + r * nd;
    const index_t vis = seen(p, i0 + r) - j0;
    if (cfg.self_tensor)
      for (index_t j = 0; j < vis; ++j) a[j] *= a[j];
    std::fill(a + std::max<index_t>(vis, 0), a + nd, 0.f);  // assigned, so a NaN there vanishes too
  }
  const index_t dv = p.d_v();
  for (index_t r = 0; r < rows; ++r) {  // the denominators: row sums of the masked block
    const float* a = s.scores.data() + r * nd;
    float sum = 0;
    for (index_t j = 0; j < nd; ++j) sum += a[j];
    s.aug[static_cast<std::size_t>(r * L.dv1 + dv)] += sum;
  }
  if (values_finite(p, b, hk, j0, j1)) {
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, nd, 1.f, s.scores.data(), nd, p.v.row(b, hk, j0),
                p.v.stride[2], 1.f, s.aug.data(), L.dv1);
    return;
  }
  // A non-finite value must reach only the rows that see it: 0·NaN in a GEMM would leak it.
  for (index_t r = 0; r < rows; ++r) {
    const index_t vis = seen(p, i0 + r) - j0;
    float* o = s.aug.data() + r * L.dv1;
    for (index_t j = 0; j < vis; ++j) {
      const float w = s.scores[static_cast<std::size_t>(r * nd + j)];
      const float* v = p.v.row(b, hk, j0 + j);
      for (index_t d = 0; d < dv; ++d) o[d] += w * v[d];
    }
  }
}

/// run += φ(K[j0, j1))ᵀ [V | 1], one GEMM per piece of `piece` keys, accumulated in float64.
void add_keys(const AttentionProblem& p, const LinearAttentionConfig& cfg, const Layout& L, index_t b, index_t hk,
              const float* kbase, index_t j0, index_t j1, index_t piece, std::vector<double>& run, Scratch& s) {
  for (index_t a = j0; a < j1; a += piece) {
    const index_t rows = std::min(piece, j1 - a);
    const float* phi = expand(cfg, kbase + a * L.m, rows, s.phi);
    s.scores.resize(L.state_floats());
    state_gemm(p, L, b, hk, phi, a, rows, s.scores.data());
    for (std::size_t e = 0; e < run.size(); ++e) run[e] += s.scores[e];
  }
}

/// Query chunks per super-segment count: chosen from the problem alone (never the thread count),
/// so that about kItems work items exist even for one head.
constexpr index_t kItems = 8;

/// Causal block algorithm. Query chunks of b rows are grouped into S super-segments per head;
/// (1) the key state up to each super-segment's first chunk is a float64 sum of per-piece GEMMs,
/// scanned over super-segments; (2) each (head, super-segment) walks its chunks in order: the
/// carried state (float32, GEMM-accumulated in chunk order) times φ(Q_c), plus the masked
/// diagonal, then the state takes the chunk's keys.
void causal_blocks(const AttentionProblem& p, const LinearAttentionConfig& cfg, const FeatureFn& query,
                   const float* keys, const ExecContext& ctx) {
  const Layout L = layout(p, cfg);
  const index_t nq = p.n_q(), dv = p.d_v(), chunk = std::max<index_t>(cfg.chunk, 1);
  const index_t nqc = (nq + chunk - 1) / chunk, nbh = p.batch() * p.heads(), nbk = p.batch() * p.kv_heads();
  const index_t S = std::clamp<index_t>((kItems + nbh - 1) / nbh, 1, nqc);
  const index_t per = (nqc + S - 1) / S;  // chunks per super-segment (the last may hold fewer)
  const index_t nsup = (nqc + per - 1) / per;
  auto first_key = [&](index_t sg) { return seen(p, sg * per * chunk); };  // keys before super-segment sg
  const std::size_t sf = L.state_floats();
  std::vector<std::vector<double>> pre(static_cast<std::size_t>(nbk * nsup));
  std::vector<Scratch> ws(static_cast<std::size_t>(std::max(1, ctx.num_threads())));
  // 1. Key states of [first_key(sg−1), first_key(sg)) (sg = 0: [0, first_key(0))), then the scan.
  parallel_for(ctx, nbk * nsup, [&](std::int64_t t) {
    const index_t bk = t / nsup, sg = t % nsup, b = bk / p.kv_heads(), hk = bk % p.kv_heads();
    std::vector<double>& run = pre[static_cast<std::size_t>(t)];
    run.assign(sf, 0.0);
    const index_t j0 = sg == 0 ? 0 : first_key(sg - 1), j1 = first_key(sg);
    add_keys(p, cfg, L, b, hk, keys + bk * L.nk * L.m, j0, j1, chunk, run, ws[worker_slot(ws.size())]);
  });
  parallel_for(ctx, nbk, [&](std::int64_t bk) {
    for (index_t sg = 1; sg < nsup; ++sg) {
      std::vector<double>& cur = pre[static_cast<std::size_t>(bk * nsup + sg)];
      const std::vector<double>& prev = pre[static_cast<std::size_t>(bk * nsup + sg - 1)];
      for (std::size_t e = 0; e < sf; ++e) cur[e] += prev[e];
    }
  });
  // 2. Each (query head, super-segment) in chunk order.
  parallel_for(ctx, nbh * nsup, [&](std::int64_t t) {
    const index_t bh = t / nsup, sg = t % nsup, b = bh / p.heads(), h = bh % p.heads(), hk = h / p.group();
    const index_t bk = b * p.kv_heads() + hk;
    const float* kbase = keys + bk * L.nk * L.m;
    Scratch& s = ws[worker_slot(ws.size())];
    const std::vector<double>& pre_sg = pre[static_cast<std::size_t>(bk * nsup + sg)];
    std::vector<float> state(pre_sg.begin(), pre_sg.end());
    const index_t c_end = std::min(nqc, (sg + 1) * per);
    // Query features for several chunks at a time: a larger projection GEMM is more efficient.
    const index_t batch_chunks = std::max<index_t>(1, 512 / chunk);
    std::vector<float> qpsi;
    index_t q_first = -1;
    for (index_t c = sg * per; c < c_end; ++c) {
      const index_t i0 = c * chunk, rows = std::min(chunk, nq - i0);
      if (q_first < 0 || c >= q_first + batch_chunks) {
        q_first = c;
        const index_t qrows = std::min(batch_chunks * chunk, std::min(c_end * chunk, nq) - i0);
        qpsi.resize(static_cast<std::size_t>(qrows * L.m));
        query(b, h, i0, qrows, qpsi.data());
      }
      const float* psi = qpsi.data() + (c - q_first) * chunk * L.m;
      s.psi.assign(psi, psi + rows * L.m);
      const float* qphi = expand(cfg, s.psi.data(), rows, s.phi);
      s.aug.assign(static_cast<std::size_t>(rows * L.dv1), 0.f);
      if (seen(p, i0) > 0) apply_state(L, dv, qphi, rows, state.data(), s.aug.data());
      diagonal_block(p, cfg, L, b, hk, i0, rows, s.psi.data(), kbase, s);
      for (index_t r = 0; r < rows; ++r) finish_row(cfg.den, s.aug.data() + r * L.dv1, dv, p.out.row(b, h, i0 + r));
      if (c + 1 < c_end) {  // the chunk's keys join the state (float32 GEMM accumulation, fixed order)
        const index_t a0 = seen(p, i0), a1 = seen(p, i0 + chunk);
        if (a1 > a0) state_gemm(p, L, b, hk, expand(cfg, kbase + a0 * L.m, a1 - a0, s.phi), a0, a1 - a0, state.data(), true);
      }
    }
  });
}

}  // namespace

index_t keys_read(const AttentionProblem& p) {
  if (p.n_q() == 0) return 0;
  return seen(p, p.n_q() - 1);
}

std::vector<float> key_features(const AttentionProblem& p, index_t feature_dim, const FeatureFn& fn,
                                const ExecContext& ctx) {
  const index_t nk = keys_read(p), heads = p.batch() * p.kv_heads();
  std::vector<float> out(static_cast<std::size_t>(heads * nk * feature_dim));
  const index_t seg = 512, nseg = (nk + seg - 1) / seg;
  parallel_for(ctx, heads * nseg, [&](std::int64_t t) {
    const index_t bk = t / nseg, s = t % nseg, j0 = s * seg, rows = std::min(seg, nk - j0);
    fn(bk / p.kv_heads(), bk % p.kv_heads(), j0, rows, out.data() + (bk * nk + j0) * feature_dim);
  });
  return out;
}

InputNorms input_norms(const AttentionProblem& p, const ExecContext& ctx) {
  const index_t nk = keys_read(p);
  const index_t items = p.batch() * p.heads() + p.batch() * p.kv_heads();
  std::vector<InputNorms> per(static_cast<std::size_t>(items));
  auto norm = [](const float* x, index_t n) {  // four partial sums: pipelines without reassociation flags
    double s[4] = {0, 0, 0, 0};
    index_t d = 0;
    for (; d + 4 <= n; d += 4)
      for (int u = 0; u < 4; ++u) s[u] += static_cast<double>(x[d + u]) * x[d + u];
    for (; d < n; ++d) s[0] += static_cast<double>(x[d]) * x[d];
    return std::sqrt((s[0] + s[1]) + (s[2] + s[3]));
  };
  parallel_for(ctx, items, [&](std::int64_t t) {
    InputNorms& r = per[static_cast<std::size_t>(t)];
    if (t < p.batch() * p.heads()) {
      const index_t b = t / p.heads(), h = t % p.heads();
      for (index_t i = 0; i < p.n_q(); ++i) {
        const double n = norm(p.q.row(b, h, i), p.d_qk());
        if (std::isfinite(n)) r.q = std::max(r.q, n);
      }
    } else {
      const index_t u = t - p.batch() * p.heads(), b = u / p.kv_heads(), hk = u % p.kv_heads();
      for (index_t j = 0; j < nk; ++j) {
        const double n = norm(p.k.row(b, hk, j), p.d_qk());
        if (std::isfinite(n)) r.k = std::max(r.k, n);
        const float* v = p.v.row(b, hk, j);
        for (index_t d = 0; d < p.d_v(); ++d)
          if (std::isfinite(v[d])) r.v = std::max(r.v, std::abs(static_cast<double>(v[d])));
      }
    }
  });
  InputNorms all;
  for (const InputNorms& r : per) {
    all.q = std::max(all.q, r.q);
    all.k = std::max(all.k, r.k);
    all.v = std::max(all.v, r.v);
  }
  return all;
}

void poison_nonfinite_rows(const TensorView<const float>& x, index_t b, index_t h, index_t row0, index_t rows,
                           float* psi, index_t m) {
  for (index_t i = 0; i < rows; ++i)
    if (!simd::all_finite(x.row(b, h, row0 + i), x.shape[3]))
      std::fill(psi + i * m, psi + (i + 1) * m, std::numeric_limits<float>::quiet_NaN());
}

double max_row_norm(const float* x, index_t rows, index_t m) {
  double best = 0;
  for (index_t r = 0; r < rows; ++r) {
    double s = 0;
    for (index_t a = 0; a < m; ++a) s += static_cast<double>(x[r * m + a]) * x[r * m + a];
    if (std::isfinite(s)) best = std::max(best, std::sqrt(s));
  }
  return best;
}

std::size_t linear_attention_workspace(const AttentionProblem& p, const LinearAttentionConfig& cfg,
                                       const ExecContext& ctx) {
  const Layout L = layout(p, cfg);
  const index_t chunk = std::max<index_t>(cfg.chunk, 1);
  const std::size_t nbk = static_cast<std::size_t>(p.batch() * p.kv_heads());
  std::size_t states = 0;  // bytes
  if (p.causal == Causal::kNone) states = 4 * nbk * boundaries(p).size() * L.state_floats();
  else if (cfg.causal_algo == CausalAlgo::kBlock) states = 8 * nbk * static_cast<std::size_t>(kItems) * L.state_floats();
  const index_t seg = p.causal == Causal::kNone ? kFlatSegment : chunk;
  const std::size_t per_thread = static_cast<std::size_t>(seg * (L.mm + L.m + 2 * L.dv1 + chunk)) + 3 * L.state_floats();
  return states + 4 * static_cast<std::size_t>(ctx.num_threads()) * per_thread;
}

void linear_attention(const AttentionProblem& p, const LinearAttentionConfig& cfg, const FeatureFn& query,
                      const float* keys, const ExecContext& ctx) {
  NUMATTN_ASSERT(cfg.feature_dim > 0);
  NUMATTN_ASSERT(p.mask.kind == MaskKind::kNone && !p.has_window());
  if (p.causal != Causal::kNone && cfg.causal_algo == CausalAlgo::kPrefix) {
    prefix_scan(p, cfg, query, keys, ctx);
    return;
  }
  if (p.causal != Causal::kNone) {
    causal_blocks(p, cfg, query, keys, ctx);
    return;
  }
  const Layout L = layout(p, cfg);
  // Without a causal rule the chunk size only sets GEMM shapes: at least 256 query rows at a time.
  const index_t nq = p.n_q(), dv = p.d_v(), chunk = std::max<index_t>(cfg.chunk, 256);
  const std::vector<index_t> bnd = boundaries(p);
  const index_t nseg = static_cast<index_t>(bnd.size()) - 1;
  const index_t nbk = p.batch() * p.kv_heads();
  const std::size_t sf = L.state_floats();
  // Without a causal rule (the causal paths return above). states[bk][t]: after the scan,
  // Σ φ(k_j)[v_j | 1]ᵀ over keys j < bnd[t]; every query chunk reads the total, t = nseg.
  std::vector<float> states(static_cast<std::size_t>(nbk * (nseg + 1)) * sf, 0.f);
  auto state = [&](index_t bk, index_t t) { return states.data() + static_cast<std::size_t>(bk * (nseg + 1) + t) * sf; };
  std::vector<Scratch> ws(static_cast<std::size_t>(std::max(1, ctx.num_threads())));

  // 1. One GEMM per key segment: φ(K_s)ᵀ V_s and φ(K_s)ᵀ 1 into slot s + 1.
  parallel_for(ctx, nbk * nseg, [&](std::int64_t t) {
    const index_t bk = t / nseg, sg = t % nseg, b = bk / p.kv_heads(), hk = bk % p.kv_heads();
    const index_t j0 = bnd[static_cast<std::size_t>(sg)], rows = bnd[static_cast<std::size_t>(sg) + 1] - j0;
    Scratch& s = ws[worker_slot(ws.size())];
    const float* phi = expand(cfg, keys + (bk * L.nk + j0) * L.m, rows, s.phi);
    state_gemm(p, L, b, hk, phi, j0, rows, state(bk, sg + 1));
  });
  // 2. Exclusive scan over segments in float64, a fixed order whatever the thread count.
  parallel_for(ctx, nbk, [&](std::int64_t bk) {
    std::vector<double> run(sf, 0.0);
    for (index_t t = 1; t <= nseg; ++t) {
      float* st = state(bk, t);
      for (std::size_t e = 0; e < sf; ++e) {
        run[e] += st[e];
        st[e] = static_cast<float>(run[e]);
      }
    }
  });
  // 3. Query chunks: the total state times φ(Q_c).
  const index_t nqc = (nq + chunk - 1) / chunk;
  parallel_for(ctx, p.batch() * p.heads() * nqc, [&](std::int64_t t) {
    const index_t c = t % nqc, bh = t / nqc, b = bh / p.heads(), h = bh % p.heads(), hk = h / p.group();
    const index_t bk = b * p.kv_heads() + hk;
    const index_t i0 = c * chunk, rows = std::min(chunk, nq - i0);
    Scratch& s = ws[worker_slot(ws.size())];
    s.psi.resize(static_cast<std::size_t>(rows * L.m));
    query(b, h, i0, rows, s.psi.data());
    const float* qphi = expand(cfg, s.psi.data(), rows, s.phi);
    s.aug.assign(static_cast<std::size_t>(rows * L.dv1), 0.f);
    if (nseg > 0) apply_state(L, dv, qphi, rows, state(bk, nseg), s.aug.data());
    for (index_t r = 0; r < rows; ++r) finish_row(cfg.den, s.aug.data() + r * L.dv1, dv, p.out.row(b, h, i0 + r));
  });
}

void exact_polynomial_attention(const AttentionProblem& p, int degree, double shift, const ExecContext& ctx) {
  NUMATTN_ASSERT(p.mask.kind == MaskKind::kNone && !p.has_window() && degree >= 0);
  const double s = p.effective_scale();
  const InputNorms n = input_norms(p, ctx);
  // Every weight is at most (|s|·max‖q‖·max‖k‖)^p; Nk of them times max|v| must stay in float32.
  const double lw = degree * std::log10(std::max(std::abs(s) * n.q * n.k, 1e-300));
  const double bound = lw + std::log10(static_cast<double>(std::max<index_t>(p.n_kv(), 1)) * std::max(1.0, n.v));
  NUMATTN_CHECK(bound <= 36, "exact polynomial attention of degree {}: (|scale|·max‖q‖·max‖k‖)^p·Nk·max(1,|v|) = "
                "1e{:.1f} exceeds the float32 bound 1e36; reduce the scale or the magnitude of q, k, v",
                degree, bound);
  const index_t nq = p.n_q(), dk = p.d_qk(), dv = p.d_v(), dv1 = dv + 1;
  constexpr index_t kRows = 64;
  const index_t nqc = (nq + kRows - 1) / kRows;
  std::vector<Scratch> ws(static_cast<std::size_t>(std::max(1, ctx.num_threads())));
  parallel_for(ctx, p.batch() * p.heads() * nqc, [&](std::int64_t t) {
    const index_t c = t % nqc, bh = t / nqc, b = bh / p.heads(), h = bh % p.heads(), hk = h / p.group();
    const index_t i0 = c * kRows, rows = std::min(kRows, nq - i0);
    const index_t nk = seen(p, i0 + rows - 1), full = seen(p, i0);
    Scratch& w = ws[worker_slot(ws.size())];
    w.aug.assign(static_cast<std::size_t>(rows * dv1), 0.f);
    if (nk > 0) {
      w.scores.resize(static_cast<std::size_t>(rows * nk));
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, nk, dk, static_cast<float>(s), p.q.row(b, h, i0),
                  p.q.stride[2], p.k.row(b, hk, 0), p.k.stride[2], 0.f, w.scores.data(), nk);
      for (index_t r = 0; r < rows; ++r) {
        float* a = w.scores.data() + r * nk;
        const index_t vis = seen(p, i0 + r);
        for (index_t j = 0; j < vis; ++j) {
          const float x = a[j];
          float y = 1.f;
          for (int e = 0; e < degree; ++e) y *= x;
          a[j] = y;
        }
        std::fill(a + vis, a + nk, 0.f);
      }
      augment_values(p, b, hk, 0, nk, w.vals);
      if (simd::all_finite(w.vals.data() + full * dv1, (nk - full) * dv1)) {
        blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv1, nk, 1.f, w.scores.data(), nk, w.vals.data(), dv1,
                    0.f, w.aug.data(), dv1);
      } else {  // see linear_attention: keep a non-finite value to the rows that see it
        for (index_t r = 0; r < rows; ++r) {
          const index_t vis = seen(p, i0 + r);
          float* o = w.aug.data() + r * dv1;
          for (index_t j = 0; j < vis; ++j) {
            const float wt = w.scores[static_cast<std::size_t>(r * nk + j)];
            for (index_t d = 0; d < dv1; ++d) o[d] += wt * w.vals[static_cast<std::size_t>(j * dv1 + d)];
          }
        }
      }
    }
    const Denominator den{shift, false};
    for (index_t r = 0; r < rows; ++r) finish_row(den, w.aug.data() + r * dv1, dv, p.out.row(b, h, i0 + r));
  });
}

std::size_t exact_polynomial_workspace(const AttentionProblem& p, const ExecContext& ctx) {
  return 4 * static_cast<std::size_t>(ctx.num_threads()) *
         static_cast<std::size_t>(64 * (p.n_kv() + p.d_v() + 1) + p.n_kv() * (p.d_v() + 1));
}

std::size_t sketched_polynomial_workspace(const AttentionProblem& p, const LinearAttentionConfig& cfg,
                                          const ExecContext& ctx) {
  return 4 * static_cast<std::size_t>(p.batch() * p.kv_heads() * keys_read(p) * cfg.feature_dim) +
         linear_attention_workspace(p, cfg, ctx);
}

void sketched_polynomial_attention(const AttentionProblem& p, const LinearAttentionConfig& cfg, const SketchFn& phi,
                                   const char* name, const ExecContext& ctx) {
  const index_t m = cfg.feature_dim;
  auto guarded = [&](const TensorView<const float>& x, index_t b, index_t h, index_t hk, index_t r0, index_t rows,
                     float* out) {
    phi(x, b, h, hk, r0, rows, out);
    poison_nonfinite_rows(x, b, h, r0, rows, out, m);
  };
  const std::vector<float> keys = key_features(
      p, m, [&](index_t b, index_t hk, index_t r0, index_t rows, float* out) { guarded(p.k, b, hk, hk, r0, rows, out); },
      ctx);
  // The running maxima of ‖ψ(k_j)‖ and of max_d |v_jd| over j' ≤ j per (batch, kv head), finite
  // inputs only (a non-finite k or v reaches the rows that see it through the sums); a sketch of a
  // finite key that overflowed counts as +inf. Each query row checks the float32 bound of its own
  // sums against the keys it sees, so a key it does not see can neither change nor refuse it.
  const index_t nk = keys_read(p), nbk = p.batch() * p.kv_heads();
  std::vector<double> kmax(static_cast<std::size_t>(nbk * nk), 0.0), vmax(static_cast<std::size_t>(nbk * nk), 0.0);
  parallel_for(ctx, nbk, [&](std::int64_t bk) {
    const index_t b = bk / p.kv_heads(), hk = bk % p.kv_heads();
    double kr = 0, vr = 0;
    for (index_t j = 0; j < nk; ++j) {
      const float* x = keys.data() + (bk * nk + j) * m;
      double s2 = 0;
      for (index_t a = 0; a < m; ++a) s2 += static_cast<double>(x[a]) * x[a];
      if (std::isfinite(s2)) kr = std::max(kr, std::sqrt(s2));
      else if (simd::all_finite(p.k.row(b, hk, j), p.d_qk())) kr = std::numeric_limits<double>::infinity();
      const float* v = p.v.row(b, hk, j);
      for (index_t d = 0; d < p.d_v(); ++d)
        if (std::isfinite(v[d])) vr = std::max(vr, static_cast<double>(std::abs(v[d])));
      kmax[static_cast<std::size_t>(bk * nk + j)] = kr;
      vmax[static_cast<std::size_t>(bk * nk + j)] = vr;
    }
  });
  // No scaling of ψ_Q or ψ_K (a scale from the largest key feature would make every row depend
  // on every key): the weights are ⟨ψ(q), ψ(k)⟩ (squared when self-tensored) and the shift is the
  // target's 1.
  const double e = cfg.self_tensor ? 2 : 1;
  const FeatureFn qphi = [&](index_t b, index_t h, index_t r0, index_t rows, float* out) {
    guarded(p.q, b, h, h / p.group(), r0, rows, out);
    const index_t bk = b * p.kv_heads() + h / p.group();
    for (index_t r = 0; r < rows; ++r) {
      const index_t seen = p.causal == Causal::kNone ? nk : p.key_range(r0 + r).end;
      if (seen <= 0) continue;
      const std::size_t last = static_cast<std::size_t>(bk * nk + seen - 1);
      const double qn = max_row_norm(out + r * m, 1, m);
      const double bound = static_cast<double>(seen) * std::max(1.0, std::pow(qn * kmax[last], e)) * std::max(1.0, vmax[last]);
      NUMATTN_CHECK(!(bound > 1e36),
                    "{}: query row [b,h,i] = [{},{},{}]: (keys seen)·max(1, (‖ψ(q)‖·max‖ψ(k)‖)^{})·max(1, max|v|) = "
                    "{:.3g} over the keys it sees exceeds the float32 bound 1e36 of its weighted sums; reduce the "
                    "scale or the magnitude of q, k, v",
                    name, b, h, r0 + r, static_cast<int>(e), bound);
    }
  };
  LinearAttentionConfig plain = cfg;
  plain.den.shift = 1;
  linear_attention(p, plain, qphi, keys.data(), ctx);
}

}  // namespace numattn::blocks
