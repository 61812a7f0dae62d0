#include "attention/exact/naive.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/exact/row_mask.h"
#include "attention/method_def.h"
#include "numattn/core/blas.h"
#include "numattn/core/simd.h"

namespace numattn {

namespace {
constexpr index_t kRowBlock = 256;
}

const MethodInfo& NaiveAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "exact.naive";
    m.family = "exact";
    m.summary = "float32 softmax attention with materialised scores (BLAS GEMMs)";
    m.citation = "Vaswani et al., Attention Is All You Need, NeurIPS 2017";
    m.time_complexity = "O(Nq·Nk·(Dk+Dv))";
    m.memory_complexity = "O(threads·256·Nk)";
    m.caps = {.exact = true, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = false, .head_mask = true};
    m.accuracy = AccuracyContract::exact();
    return m;
  }();
  return info;
}

std::size_t NaiveAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  return static_cast<std::size_t>(ctx.num_threads()) * 4 *
         static_cast<std::size_t>(std::min(kRowBlock, p.n_q()) * p.n_kv() + 2 * kRowBlock);
}

void NaiveAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const index_t nq = p.n_q(), nk = p.n_kv(), dk = p.d_qk(), dv = p.d_v();
  const index_t nblk = (nq + kRowBlock - 1) / kRowBlock;
  const float scale = static_cast<float>(p.effective_scale());
  const int nt = std::min<int>(ctx.num_threads(), static_cast<int>(p.batch() * p.heads() * nblk));
  std::vector<std::vector<float>> ws(static_cast<std::size_t>(std::max(nt, 1)));
  ExecContext inner{nt};
  parallel_for(inner, p.batch() * p.heads() * nblk, [&](std::int64_t t) {
    const index_t blk = t % nblk, bh = t / nblk, b = bh / p.heads(), h = bh % p.heads();
    const index_t hk = h / p.group();
    const index_t i0 = blk * kRowBlock, rows = std::min(kRowBlock, nq - i0);
    // Only the keys some row of the block sees: a key no row sees (beyond the causal frontier,
    // outside the window) is never read, so its values, even NaN, cannot reach the output.
    index_t jb = nk, je = 0;
    for (index_t r = 0; r < rows; ++r) {
      const KeyRange kr = p.key_range(i0 + r);
      if (kr.begin < kr.end) jb = std::min(jb, kr.begin), je = std::max(je, kr.end);
    }
    const index_t nkk = je > jb ? je - jb : 0;
    std::vector<float>& s = ws[worker_slot(ws.size())];
    s.resize(static_cast<std::size_t>(rows * std::max<index_t>(nkk, 1)));
    if (nkk > 0)
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, nkk, dk, scale, p.q.row(b, h, i0),
                  p.q.stride[2], p.k.row(b, hk, jb), p.k.stride[2], 0.f, s.data(), nkk);
    std::vector<float> row_sum(static_cast<std::size_t>(rows)), row_max(static_cast<std::size_t>(rows));
    for (index_t r = 0; r < rows; ++r) {
      float* srow = s.data() + r * nkk;
      const bool finite = detail::mask_row(p, b, h, i0 + r, jb, jb + nkk, srow);
      float m = -std::numeric_limits<float>::infinity();
      for (index_t j = 0; j < nkk; ++j) m = std::max(m, srow[j]);
      row_max[r] = m;
      if (!finite || m == -std::numeric_limits<float>::infinity()) {
        // A non-finite logit makes the row NaN (settled by run()); none visible: an empty row.
        std::fill(srow, srow + nkk, 0.f);
        row_sum[r] = finite ? 0.f : std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      for (index_t j = 0; j < nkk; ++j) srow[j] -= m;
      simd::exp_f32(srow, srow, nkk);
      float sum = 0;
      for (index_t j = 0; j < nkk; ++j) sum += srow[j];
      row_sum[r] = sum;
    }
    float* o = p.out.row(b, h, i0);
    if (nkk > 0) {
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, nkk, 1.f, s.data(), nkk,
                  p.v.row(b, hk, jb), p.v.stride[2], 0.f, o, p.out.stride[2]);
    } else {
      for (index_t r = 0; r < rows; ++r) std::fill(o + r * p.out.stride[2], o + r * p.out.stride[2] + dv, 0.f);
    }
    for (index_t r = 0; r < rows; ++r) {
      float* orow = o + r * p.out.stride[2];
      // row_sum is ≥ 1 (the maximum's own weight), 0 for an empty row or NaN for a settled one.
      const float inv = row_sum[r] == 0.f ? 0.f : 1.f / row_sum[r];
      for (index_t d = 0; d < dv; ++d) orow[d] *= inv;
      if (!p.lse.empty())
        p.lse(b, h, i0 + r, 0) = row_sum[r] == 0.f ? -std::numeric_limits<float>::infinity()
                                                   : row_max[r] + std::log(row_sum[r]);
    }
  });
}

NUMATTN_DEFINE_METHOD(NaiveAttention)

}  // namespace numattn
