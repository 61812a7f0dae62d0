// Float64 check of a sharded result on sampled rows, the reference computed as the K/V shards
// pass around the ring (context_parallel.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "dist/ring_detail.h"
#include "numattn/attention/accuracy.h"
#include "numattn/core/rng.h"

namespace numattn::dist {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// One sampled row's float64 online softmax: running max m, normaliser l, output acc (in units
/// of exp(m)), and its logit magnitude L (accuracy.h; here over every visible key, which can
/// only loosen the bound).
struct RowRef {
  index_t b, h, i, local;
  double m = kNegInf, l = 0, L = 0;
  std::vector<double> acc;
};

}  // namespace

DistCheck check_sharded(Comm& comm, const ShardedProblem& sp, index_t count, std::uint64_t seed,
                        const ExecContext& ctx) {
  const AttentionProblem& p = sp.local;
  const AttentionProblem g = sp.global_shape();
  const index_t B = p.batch(), H = p.heads(), Hk = p.kv_heads(), G = p.group(), dk = p.d_qk(), dv = p.d_v();
  const index_t total = B * H * sp.n_q;
  DistCheck res;
  if (count <= 0) return res;
  // The same seeded sample on every rank: distinct global rows (all when count ≥ total).
  std::vector<index_t> picks;
  if (count >= total) {
    for (index_t x = 0; x < total; ++x) picks.push_back(x);
  } else {
    const CounterRng rng(seed, 7);
    std::set<index_t> seen;
    for (std::uint64_t k = 0; static_cast<index_t>(seen.size()) < count; ++k)
      seen.insert(std::min<index_t>(total - 1, static_cast<index_t>(rng.uniform(k) * static_cast<double>(total))));
    picks.assign(seen.begin(), seen.end());
  }
  // Keep the rows in this rank's shard, with their local row index.
  std::vector<RowRef> rows;
  for (index_t x : picks) {
    const index_t b = x / (H * sp.n_q), h = x / sp.n_q % H, i = x % sp.n_q;
    index_t local = 0;
    for (const Segment& s : sp.q_rows) {
      if (i >= s.begin && i < s.end) {
        rows.push_back({b, h, i, local + i - s.begin, kNegInf, 0, 0, std::vector<double>(static_cast<std::size_t>(dv), 0.0)});
        break;
      }
      local += s.size();
    }
  }
  const double scale = g.effective_scale();
  DistStats st;
  KvRing ring(comm, sp);
  for (index_t hk = 0; hk < Hk; ++hk)
    for (int piece = 0; piece < ring.pieces(); ++piece) {
    ring.rotate(hk, piece, [&](int, const std::vector<Segment>& segs, TensorView<const float> k, TensorView<const float> v) {
      parallel_for(ctx, static_cast<std::int64_t>(rows.size()), [&](std::int64_t ri) {
        RowRef& r = rows[static_cast<std::size_t>(ri)];
        if (r.h / G != hk) return;
        const float* q = p.q.row(r.b, r.h, r.local);
        index_t koff = 0;
        for (const Segment& s : segs) {
          for (index_t j = s.begin; j < s.end; ++j) {
            if (!g.visible(r.b, r.h, r.i, j)) continue;
            double add = 0;
            if (g.mask.kind == MaskKind::kAdditive) {
              add = g.mask_row(r.b, r.h, r.i).additive[j];
              if (!(add > kNegInf)) continue;  // -inf and NaN hide the key
            }
            const float* kr = k.row(r.b, 0, koff + j - s.begin);
            double dot = 0, mag = 0;
            for (index_t d = 0; d < dk; ++d) {
              dot += static_cast<double>(q[d]) * kr[d];
              mag += std::abs(static_cast<double>(q[d]) * kr[d]);
            }
            const double logit = scale * dot + add;
            r.L = std::max(r.L, std::abs(scale) * mag + std::abs(add));
            const float* vr = v.row(r.b, 0, koff + j - s.begin);
            if (logit > r.m) {
              const double c = r.m == kNegInf ? 0.0 : std::exp(r.m - logit);
              r.l *= c;
              for (double& a : r.acc) a *= c;
              r.m = logit;
            }
            const double w = std::exp(logit - r.m);
            r.l += w;
            for (index_t d = 0; d < dv; ++d) r.acc[static_cast<std::size_t>(d)] += w * vr[d];
          }
          koff += s.size();
        }
      });
    }, st);
  }
  // Errors of this rank's rows, then reduced over ranks.
  double sums[4] = {0, 0, 0, 0};  // Σ (ô−o)², Σ o², rows, non-finite
  double maxes[4] = {0, 0, 0, 0};  // max |ô−o|, max |lsê−lse|, L, max scaled error
  for (const RowRef& r : rows) {
    const float* o = p.out.row(r.b, r.h, r.local);
    const double lse = r.l > 0 ? r.m + std::log(r.l) : kNegInf;
    for (index_t d = 0; d < dv; ++d) {
      const double ref = r.l > 0 ? r.acc[static_cast<std::size_t>(d)] / r.l : 0.0;
      const double e = std::abs(static_cast<double>(o[d]) - ref);
      if (!std::isfinite(o[d])) sums[3] += 1;
      sums[0] += e * e;
      sums[1] += ref * ref;
      maxes[0] = std::max(maxes[0], e);
      maxes[3] = std::max(maxes[3], e / std::max(1.0, std::abs(ref)));
    }
    if (!p.lse.empty()) {
      const double got = p.lse(r.b, r.h, r.local, 0);
      const double e = (got == lse) ? 0.0 : std::abs(got - lse);  // both -inf: no error
      if (std::isnan(e)) sums[3] += 1;
      else maxes[1] = std::max(maxes[1], e);
    }
    maxes[2] = std::max(maxes[2], r.L);
    sums[2] += 1;
  }
  comm.allreduce(sums, 4, ReduceOp::kSum);
  comm.allreduce(maxes, 4, ReduceOp::kMax);
  res.rows_checked = static_cast<index_t>(sums[2]);
  res.finite = sums[3] == 0;
  res.rel_fro_error = sums[1] > 0 ? std::sqrt(sums[0] / sums[1]) : std::sqrt(sums[0]);
  res.nmse = sums[1] > 0 ? sums[0] / sums[1] : sums[0];
  res.max_abs_error = maxes[0];
  res.lse_max_abs_error = p.lse.empty() ? std::numeric_limits<double>::quiet_NaN() : maxes[1];
  res.logit_magnitude = maxes[2];
  const ExactTolerance tol = exact_f32_tolerance(res.logit_magnitude);
  res.passed = res.finite && res.rel_fro_error <= tol.rel_fro_error && maxes[3] <= tol.max_scaled_error &&
               (p.lse.empty() || res.lse_max_abs_error <= tol.lse_max_abs_error);
  return res;
}

}  // namespace numattn::dist
