#include "numattn/analysis/predict.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "numattn/analysis/metrics.h"
#include "numattn/attention/registry.h"
#include "numattn/core/error.h"

namespace numattn::analysis {

Budget method_budget(const AttentionMethod& m, std::int64_t nq, std::int64_t nk, std::int64_t window) {
  const std::string& name = m.info().name;
  const ParamValues& pv = m.params();
  Budget b;
  b.causal = m.info().caps.causal ? Causal::kBottomRight : Causal::kNone;
  const auto ranges = visible_ranges(nq, nk, b.causal, window);
  // A window that leaves every row all its keys is no window (the method runs without one).
  for (const KeyRange& r : ranges) b.window = std::max(b.window, r.begin > 0 ? window : 0);
  const auto vis = range_sizes(ranges);
  if (name == "lowrank.svd" || name == "lowrank.nystrom") {
    const char* key = name == "lowrank.svd" ? "rank" : "landmarks";
    b.kind = BudgetKind::kRank;
    b.rank = pv.get_int(key);
    b.param = fmt::format("{}={}", key, b.rank);
  } else if (name == "sparse.topk") {
    b.kind = BudgetKind::kKeysPerRow;
    b.keys_per_row = fixed_k(vis, pv.get_int("k"));
    b.param = fmt::format("k={}", pv.get_int("k"));
  } else if (name == "lowrank.loki") {
    // Loki keeps ceil(topk_frac·visible) keys, at least one (its own rule, lowrank/loki.cpp).
    b.kind = BudgetKind::kKeysPerRow;
    b.keys_per_row = fraction_k(vis, pv.get_float("topk_frac"));
    for (std::size_t i = 0; i < vis.size(); ++i) b.keys_per_row[i] = std::min(vis[i], std::max<std::int64_t>(1, b.keys_per_row[i]));
    b.param = fmt::format("topk_frac={}", pv.get_float("topk_frac"));
  } else if (name == "sparse.window") {
    // Causal: the band [i + off − left, i + off] plus the first `sinks` keys before it, each only
    // where row i sees it ([lo, hi): a window narrows the band and hides the sinks it excludes).
    const std::int64_t left = pv.get_int("left"), sinks = pv.get_int("sinks"), off = nk - nq;
    b.kind = BudgetKind::kKeysPerRow;
    b.keys_per_row.resize(vis.size());
    for (std::int64_t i = 0; i < nq; ++i) {
      const KeyRange r = ranges[static_cast<std::size_t>(i)];
      const std::int64_t first = std::max<std::int64_t>(r.begin, i + off - left);
      const std::int64_t band = std::max<std::int64_t>(0, r.end - first);
      const std::int64_t sink = std::max<std::int64_t>(0, std::min({sinks, first, r.end}) - r.begin);
      b.keys_per_row[static_cast<std::size_t>(i)] = band + sink;
    }
    b.param = fmt::format("left={},sinks={}", left, sinks);
  } else {
    NUMATTN_CHECK(false,
                  "{} has no budget that bounds its error from the structure of P; predictions are made for "
                  "lowrank.svd, lowrank.nystrom (rank), sparse.topk, lowrank.loki, sparse.window (keys per row)",
                  name);
  }
  return b;
}

std::vector<std::string> default_predict_specs() {
  return {"lowrank.svd(rank=8)",     "lowrank.svd(rank=32)",         "lowrank.nystrom(landmarks=16)",
          "lowrank.nystrom(landmarks=64)", "sparse.topk(k=8)",      "sparse.topk(k=32)",
          "lowrank.loki",            "sparse.window(left=32,sinks=4)"};
}

std::vector<PredictRow> predict_head(const Matrix& q, const Matrix& k, const Matrix& v, double scale,
                                     const std::vector<std::string>& specs, const ExecContext& ctx,
                                     std::int64_t window) {
  NUMATTN_CHECK(k.rows() == v.rows(), "predict_head: K has {} rows, V has {}", k.rows(), v.rows());
  const std::int64_t nq = q.rows(), nk = k.rows(), d = q.cols();
  // float32 copies of Q and K, the method's inputs; V = I in the probe.
  std::vector<float> qf(static_cast<std::size_t>(nq * d)), kf(static_cast<std::size_t>(nk * d));
  for (std::int64_t i = 0; i < nq; ++i)
    for (std::int64_t c = 0; c < d; ++c) qf[static_cast<std::size_t>(i * d + c)] = static_cast<float>(q(i, c));
  for (std::int64_t j = 0; j < nk; ++j)
    for (std::int64_t c = 0; c < d; ++c) kf[static_cast<std::size_t>(j * d + c)] = static_cast<float>(k(j, c));
  std::vector<float> unused_v(static_cast<std::size_t>(nk)), unused_out(static_cast<std::size_t>(nq));

  // P, σ(P) and the exact output P·V, per causal rule (computed once, when a method needs it),
  // on the keys the window leaves (the budget's window: `window`, or 0 where it hides nothing).
  struct Exact {
    bool done = false;
    Matrix p, pv;
    Vector sigma;
  };
  Exact ex[2];
  auto exact = [&](Causal c, std::int64_t w) -> Exact& {
    Exact& e = ex[c == Causal::kNone ? 0 : 1];
    if (!e.done) {
      e.p = head_matrices(q, k, scale, c, w).p;
      e.pv = e.p * v;
      e.sigma = singular_values(e.p, "P");
      e.done = true;
    }
    return e;
  };

  std::vector<PredictRow> rows;
  for (const std::string& spec : specs) {
    const auto method = create_method(spec);
    const Budget b = method_budget(*method, nq, nk, window);
    AttentionProblem p;
    p.q = TensorView<const float>::contiguous(qf.data(), {1, 1, nq, d});
    p.k = TensorView<const float>::contiguous(kf.data(), {1, 1, nk, d});
    p.v = TensorView<const float>::contiguous(unused_v.data(), {1, 1, nk, 1});
    p.out = TensorView<float>::contiguous(unused_out.data(), {1, 1, nq, 1});
    p.scale = scale;
    p.causal = b.causal;
    if (b.window > 0) p.window_left = b.window - 1;
    AttentionProbe probe(p, 0);
    PredictRow r;
    r.method = method->spec();
    r.param = b.param;
    r.causal = to_string(b.causal);
    r.window = b.window;
    if (b.window > 0) {
      // A method that cannot honour the layer's window has nothing to be measured against.
      // One whose kernel has no window runs it by the causal recursion (attention/method.h): its
      // error is then set by the recursion's blocks, not by the structure of this P the bounds use.
      Status st = method->can_run(probe.problem());
      if (st.is_ok() && method->runs_by_recursion(probe.problem()))
        st = Status::unsupported(method->info().name +
                                 " has no window of its own and runs this layer's window by the causal "
                                 "recursion, whose blocks, not the layer's P, set its error: no prediction");
      if (!st.is_ok()) {
        r.skipped = st.reason();
        r.predicted = r.measured = r.output_rel_fro = std::numeric_limits<double>::quiet_NaN();
        rows.push_back(std::move(r));
        continue;
      }
    }
    probe.run(*method, ctx);
    const Exact& e = exact(b.causal, b.window);
    Matrix ph(nq, nk);
    for (std::int64_t i = 0; i < nq; ++i)
      for (std::int64_t j = 0; j < nk; ++j) ph(i, j) = probe.row(i)[j];

    const double pv_norm = e.pv.norm();
    r.output_rel_fro = pv_norm > 0 ? ((ph - e.p) * v).norm() / pv_norm : 0;
    if (b.kind == BudgetKind::kRank) {
      r.metric = "rel_fro_P";
      r.predicted = tail_rel_fro(e.sigma, b.rank);
      r.measured = (ph - e.p).norm() / e.p.norm();
    } else {
      r.metric = "mean_row_l1_P";
      const Vector mass = topk_mass(e.p, b.keys_per_row);
      double pred = 0, meas = 0;
      r.budget_excess = -nk;
      for (std::int64_t i = 0; i < nq; ++i) {
        pred += std::max(0.0, 1.0 - mass[i]);
        meas += (ph.row(i) - e.p.row(i)).lpNorm<1>();
        const auto nz = static_cast<std::int64_t>((ph.row(i).array() != 0).count());
        r.budget_excess = std::max(r.budget_excess, nz - b.keys_per_row[static_cast<std::size_t>(i)]);
      }
      r.predicted = pred / static_cast<double>(nq);
      r.measured = meas / static_cast<double>(nq);
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace numattn::analysis
