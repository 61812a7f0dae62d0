#include "attention/lowrank/svd.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/method_def.h"
#include "numattn/attention/blocks/nonfinite_rows.h"
#include "numattn/core/memory.h"
#include "numattn/decomp/dense.h"

namespace numattn {

namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr float kInfF = std::numeric_limits<float>::infinity();

/// Bytes one head needs: P, a copy inside the SVD, U and V (thin), the logits.
std::size_t head_bytes(index_t nq, index_t nk) {
  const auto e = static_cast<std::size_t>(nq) * static_cast<std::size_t>(nk);
  const auto k = static_cast<std::size_t>(std::min(nq, nk));
  // P, LAPACK's copy of it, U and Vᵀ, and dgesdd's workspace (about 4·k² + 7·k doubles, 5·k²
  // when one side is much longer).
  return sizeof(double) * (2 * e + k * static_cast<std::size_t>(nq + nk) + 5 * k * k + 16 * k);
}

double svd_budget(const BudgetInput& in) {
  const AttentionProblem& p = in.problem;
  const index_t r = in.params.get_int("rank");
  if (r >= std::min(p.n_q(), p.n_kv())) return exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  // ‖P − P_r‖_F² (the tail energy) is at most (1 − r/n)·‖P‖_F² (the tail holds the n − r smallest
  // of n singular values); the factor 2 covers ‖·V‖ relative to ‖PV‖, calibrated on the
  // conformance matrix (largest measured: 0.98 at r = 1 with logits ×100, 0.93 at r = 1 with a
  // window, 0.35 at r = 24 of 48; the limit r ≥ n is exact).
  const double n = static_cast<double>(std::min(p.n_q(), p.n_kv()));
  return 2.0 * std::sqrt(1.0 - static_cast<double>(r) / n);
}

}  // namespace

const MethodInfo& SvdAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "lowrank.svd";
    m.family = "lowrank";
    m.summary = "best rank-r approximation of the softmax matrix P (float64 truncated SVD): the low-rank oracle";
    m.citation = "Eckart & Young, The approximation of one matrix by another of lower rank, Psychometrika 1936";
    m.time_complexity = "O(Nq·Nk·(Dk+Dv) + Nq·Nk·min(Nq,Nk))";
    m.memory_complexity = "O(threads·Nq·Nk) doubles";
    m.params = {{"rank", ParamType::kInt, "64", 1, 1 << 20, {}, "rank r of the approximation of P (≥ min(Nq,Nk): exact)"}};
    // Causal rules and windows by the causal recursion (svd.h): a native form would take the SVD
    // of the whole masked P, whose rank-r truncation mixes every row with the later rows.
    m.caps = {.exact = false, .causal = false, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = false, .lse = false, .decode = false, .head_mask = true};
    m.accuracy.max_rel_fro_error = svd_budget;
    m.accuracy.limit_case = [](const AttentionProblem& p) {
      return ParamOverrides{{"rank", std::to_string(std::max<index_t>(1, std::min(p.n_q(), p.n_kv())))}};
    };
    m.accuracy.convergence.param = "rank";
    m.accuracy.convergence.values = [](const AttentionProblem& p) {
      std::vector<std::string> v;
      const index_t full = std::max<index_t>(1, std::min(p.n_q(), p.n_kv()));
      for (index_t x : {2, 8, 24}) if (x < full) v.push_back(std::to_string(x));
      v.push_back(std::to_string(full));
      return v;
    };
    m.accuracy.samples = {{{"rank", "8"}}};
    return m;
  }();
  return info;
}

Status SvdAttention::can_run(const AttentionProblem& p) const {
  // It reads q: judge the float32 problem run() makes of half-precision Q / output.
  if (p.has_half_q() || p.has_half_out()) return can_run(widen_io(p).problem);
  const std::int64_t e = static_cast<std::int64_t>(p.n_q()) * p.n_kv();
  if (e > kMaxEntries)
    return Status::unsupported(fmt::format(
        "lowrank.svd materialises P per head in float64 and takes its SVD: Nq·Nk = {}·{} = {} entries "
        "({:.0f} MiB) exceeds its bound of 4096·4096 = {} entries (128 MiB); use fewer rows",
        p.n_q(), p.n_kv(), e, static_cast<double>(e) * 8 / (1 << 20), kMaxEntries));
  return AttentionMethod::can_run(p);
}

std::size_t SvdAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const int nt = std::max(1, std::min<int>(ctx.num_threads(), static_cast<int>(p.batch() * p.heads())));
  return static_cast<std::size_t>(nt) * head_bytes(p.n_q(), p.n_kv());
}

void SvdAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  if (blocks::mark_rows_reading_nonfinite(p, ctx)) return;
  const index_t nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v(), H = p.heads();
  const index_t rank = params_.get_int("rank");
  const double s = p.effective_scale();
  const int nt = std::max(1, std::min<int>(ctx.num_threads(), static_cast<int>(p.batch() * H)));
  check_memory(static_cast<std::uint64_t>(nt) * head_bytes(nq, nk), "lowrank.svd (P and its SVD per thread)");

  // Whether query i sees key j (problem.h), and the additive term when it does.
  auto sees = [&](index_t b, index_t h, index_t i, index_t j) {
    if (!p.visible(b, h, i, j)) return false;
    return !(p.mask.kind == MaskKind::kAdditive && !(p.mask_row(b, h, i).additive[j] > -kInfF));
  };
  parallel_for(ExecContext{nt}, p.batch() * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H, hk = h / p.group();
    // Rows that see a key, keys that a row sees: the SVD runs on that block only.
    std::vector<index_t> rows, cols;
    std::vector<char> col_used(static_cast<std::size_t>(nk), 0);
    for (index_t i = 0; i < nq; ++i) {
      bool any = false;
      const KeyRange kr = p.key_range(i);
      for (index_t j = kr.begin; j < kr.end; ++j)
        if (sees(b, h, i, j)) {
          any = true;
          col_used[static_cast<std::size_t>(j)] = 1;
        }
      if (any) rows.push_back(i);
      else std::fill(p.out.row(b, h, i), p.out.row(b, h, i) + dv, 0.f);
    }
    for (index_t j = 0; j < nk; ++j)
      if (col_used[static_cast<std::size_t>(j)]) cols.push_back(j);
    const auto nr = static_cast<Eigen::Index>(rows.size()), nc = static_cast<Eigen::Index>(cols.size());
    if (nr == 0) return;
    Mat q(nr, dk), k(nc, dk), v(nc, dv);
    for (Eigen::Index r = 0; r < nr; ++r)
      for (index_t d = 0; d < dk; ++d) q(r, d) = p.q.row(b, h, rows[static_cast<std::size_t>(r)])[d];
    for (Eigen::Index c = 0; c < nc; ++c) {
      const index_t j = cols[static_cast<std::size_t>(c)];
      for (index_t d = 0; d < dk; ++d) k(c, d) = p.k.row(b, hk, j)[d];
      for (index_t d = 0; d < dv; ++d) v(c, d) = p.v.row(b, hk, j)[d];
    }
    // P in float64: logits of visible pairs only (a hidden entry is never read), max-subtracted.
    Mat pm = (q * k.transpose()) * s;
    for (Eigen::Index r = 0; r < nr; ++r) {
      const index_t i = rows[static_cast<std::size_t>(r)];
      double mx = -std::numeric_limits<double>::infinity();
      for (Eigen::Index c = 0; c < nc; ++c) {
        const index_t j = cols[static_cast<std::size_t>(c)];
        if (!sees(b, h, i, j)) {
          pm(r, c) = -std::numeric_limits<double>::infinity();
          continue;
        }
        if (p.mask.kind == MaskKind::kAdditive) pm(r, c) += p.mask_row(b, h, i).additive[j];
        mx = std::max(mx, pm(r, c));
      }
      double sum = 0;
      for (Eigen::Index c = 0; c < nc; ++c) sum += pm(r, c) = std::exp(pm(r, c) - mx);
      pm.row(r) /= sum;
    }
    Mat out;
    if (rank >= std::min(nr, nc)) {
      out = pm * v;  // P_r = P
    } else {
      // A non-finite P (only a +inf additive mask entry can make one) gives NaN factors
      // (info kInvalidInput), hence NaN rows: never a silently wrong number.
      // The SVD of Pᵀ (the row-major P read as column-major: no copy), Pᵀ = U'ΣV'ᵀ, so
      // P = V'·Σ·U'ᵀ: U_r = V'ᵀ[:r]ᵀ and V_r = U'[:, :r].
      const decomp::dense::Svd svd = decomp::dense::svd(pm.transpose());
      const auto r = static_cast<Eigen::Index>(rank);
      const Eigen::MatrixXd w = svd.s.head(r).asDiagonal() * (svd.u.leftCols(r).transpose() * v);
      out = svd.vt.topRows(r).transpose() * w;
    }
    for (Eigen::Index r = 0; r < nr; ++r) {
      float* o = p.out.row(b, h, rows[static_cast<std::size_t>(r)]);
      for (index_t d = 0; d < dv; ++d) o[d] = static_cast<float>(out(r, d));
    }
  });
}

double SvdAttention::flops(const AttentionProblem& p) const {
  // The dense probabilities (softmax attention's work) and one full SVD of each head's Nq×Nk
  // matrix (about 4·m·n·min(m, n), Golub–Van Loan's bidiagonalisation), then the rank-r product.
  const double bh = static_cast<double>(p.batch() * p.heads()), nq = static_cast<double>(p.n_q()),
               nk = static_cast<double>(p.n_kv()), r = static_cast<double>(std::min<index_t>(params_.get_int("rank"), std::min(p.n_q(), p.n_kv())));
  return attention_flops(p) + bh * (4 * nq * nk * std::min(nq, nk) + 2 * r * (nq + nk) * p.d_v());
}

NUMATTN_DEFINE_METHOD(SvdAttention)

}  // namespace numattn
