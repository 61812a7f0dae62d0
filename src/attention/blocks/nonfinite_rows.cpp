#include "numattn/attention/blocks/nonfinite_rows.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "numattn/core/simd.h"

namespace numattn::blocks {

namespace {

bool head_rows_finite(const TensorView<const float>& t, index_t b, index_t h) {
  for (index_t n = 0; n < t.shape[2]; ++n)
    if (!simd::all_finite(t.row(b, h, n), t.shape[3])) return false;
  return true;
}

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

bool mark_rows_reading_nonfinite(const AttentionProblem& p, const ExecContext& ctx) {
  const index_t B = p.batch(), H = p.heads(), Hk = p.kv_heads();
  // Fast path: every input finite and no +inf mask entry.
  std::atomic<bool> any_bad{false};
  parallel_for(ctx, B * (H + Hk), [&](std::int64_t t) {
    const index_t b = t / (H + Hk), r = t % (H + Hk);
    const bool ok = r < H ? head_rows_finite(p.q, b, r)
                          : head_rows_finite(p.k, b, r - H) && head_rows_finite(p.v, b, r - H);
    if (!ok) any_bad.store(true, std::memory_order_relaxed);
  });
  bool mask_inf = false;
  if (p.mask.kind == MaskKind::kAdditive) {
    // A shared mask is one [Nq, Nk] block; otherwise every (b, h) has its own rows.
    const index_t nb = p.mask.stride_b ? B : 1, nh = p.mask.stride_h ? H : 1;
    for (index_t b = 0; b < nb && !mask_inf; ++b)
      for (index_t h = 0; h < nh && !mask_inf; ++h)
        for (index_t i = 0; i < p.n_q() && !mask_inf; ++i) {
          const float* a = p.mask_row(b, h, i).additive;
          mask_inf = std::find(a, a + p.n_kv(), kInf) != a + p.n_kv();
        }
  }
  if (!any_bad.load() && !mask_inf) return false;

  const index_t nq = p.n_q(), nk = p.n_kv(), dv = p.d_v();
  // Whether query i of (b, h) sees key j: problem.h's rule plus the additive mask's hiding entries.
  auto sees = [&](index_t b, index_t h, index_t i, index_t j) {
    if (!p.visible(b, h, i, j)) return false;
    if (p.mask.kind == MaskKind::kAdditive && !(p.mask_row(b, h, i).additive[j] > -kInf)) return false;
    return true;
  };
  std::vector<char> row_bad(static_cast<std::size_t>(B * H * nq));
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H, hk = h / p.group();
    std::vector<char> bad_key(static_cast<std::size_t>(nk));
    for (index_t j = 0; j < nk; ++j)
      bad_key[static_cast<std::size_t>(j)] =
          !simd::all_finite(p.k.row(b, hk, j), p.d_qk()) || !simd::all_finite(p.v.row(b, hk, j), dv);
    for (index_t i = 0; i < nq; ++i) {
      const bool q_ok = simd::all_finite(p.q.row(b, h, i), p.d_qk());
      bool reads_bad = false;
      for (index_t j = 0; j < nk && !reads_bad; ++j) {
        if (!sees(b, h, i, j)) continue;  // a row that sees no key reads nothing, not even its q
        reads_bad = bad_key[static_cast<std::size_t>(j)] || !q_ok ||
                    (p.mask.kind == MaskKind::kAdditive && p.mask_row(b, h, i).additive[j] == kInf);
      }
      row_bad[static_cast<std::size_t>(t * nq + i)] = reads_bad;
    }
  });
  if (std::none_of(row_bad.begin(), row_bad.end(), [](char c) { return c != 0; })) return false;
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H;
    for (index_t i = 0; i < nq; ++i) {
      const bool bad = row_bad[static_cast<std::size_t>(t * nq + i)] != 0;
      float* o = p.out.row(b, h, i);
      std::fill(o, o + dv, bad ? std::numeric_limits<float>::quiet_NaN() : 0.f);
      if (!p.lse.empty()) p.lse(b, h, i, 0) = bad ? std::numeric_limits<float>::quiet_NaN() : -kInf;
    }
  });
  return true;
}

}  // namespace numattn::blocks
