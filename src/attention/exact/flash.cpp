#include "attention/exact/flash.h"

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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Tiles {
  index_t bq, bk;
};

Tiles choose_tiles(const AttentionProblem& p, const ParamValues& pv) {
  index_t bq = pv.get_int("block_q"), bk = pv.get_int("block_k");
  return {std::min(bq, p.n_q()), std::min(bk, p.n_kv())};
}

/// Running state of one block of query rows.
struct RowState {
  std::vector<float> m, l, acc, s;
  void reset(index_t rows, index_t dv, index_t bk) {
    m.assign(static_cast<std::size_t>(rows), kNegInf);
    l.assign(static_cast<std::size_t>(rows), 0.f);
    acc.assign(static_cast<std::size_t>(rows * dv), 0.f);
    s.resize(static_cast<std::size_t>(rows * bk));
  }
};

/// Processes keys [k0, k1) for query rows [i0, i0 + rows) of (b, h) into `st`.
void attend_range(const AttentionProblem& p, index_t b, index_t h, index_t i0, index_t rows,
                  index_t k0, index_t k1, index_t bk, RowState& st) {
  const index_t hk = h / p.group(), dk = p.d_qk(), dv = p.d_v();
  const float scale = static_cast<float>(p.effective_scale());
  // Union of the rows' visible key ranges: tiles outside it are skipped whole.
  index_t lo = k1, hi = k0;
  for (index_t r = 0; r < rows; ++r) {
    KeyRange kr = p.key_range(i0 + r);
    if (kr.empty()) continue;
    lo = std::min(lo, kr.begin);
    hi = std::max(hi, kr.end);
  }
  lo = std::max(lo, k0);
  hi = std::min(hi, k1);
  for (index_t j0 = lo; j0 < hi; j0 += bk) {
    const index_t cols = std::min(bk, hi - j0);
    float* s = st.s.data();
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, rows, cols, dk, scale, p.q.row(b, h, i0),
                p.q.stride[2], p.k.row(b, hk, j0), p.k.stride[2], 0.f, s, cols);
    const bool masked = detail::tile_needs_mask(p, i0, i0 + rows, j0, j0 + cols);
    for (index_t r = 0; r < rows; ++r) {
      float* srow = s + r * cols;
      if (masked) detail::mask_row(p, i0 + r, j0, j0 + cols, srow);
      float mt = kNegInf;
      for (index_t j = 0; j < cols; ++j) mt = std::max(mt, srow[j]);
      const float m_old = st.m[r];
      const float m_new = std::max(m_old, mt);
      float* arow = st.acc.data() + r * dv;
      if (m_new == kNegInf) {  // nothing visible yet: P row is all zero
        std::fill(srow, srow + cols, 0.f);
        continue;
      }
      const float corr = simd::exp_f32(m_old - m_new);
      for (index_t j = 0; j < cols; ++j) srow[j] -= m_new;
      simd::exp_f32(srow, srow, cols);
      float sum = 0;
      for (index_t j = 0; j < cols; ++j) sum += srow[j];
      st.l[r] = st.l[r] * corr + sum;
      st.m[r] = m_new;
      if (corr != 1.f)
        for (index_t d = 0; d < dv; ++d) arow[d] *= corr;
    }
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, dv, cols, 1.f, s, cols,
                p.v.row(b, hk, j0), p.v.stride[2], 1.f, st.acc.data(), dv);
  }
}

void finish_rows(const AttentionProblem& p, index_t b, index_t h, index_t i0, index_t rows,
                 const RowState& st) {
  const index_t dv = p.d_v();
  for (index_t r = 0; r < rows; ++r) {
    float* o = p.out.row(b, h, i0 + r);
    const float l = st.l[r];
    const float inv = l > 0 ? 1.f / l : 0.f;
    const float* a = st.acc.data() + r * dv;
    for (index_t d = 0; d < dv; ++d) o[d] = a[d] * inv;
    if (!p.lse.empty()) p.lse(b, h, i0 + r, 0) = l > 0 ? st.m[r] + std::log(l) : kNegInf;
  }
}

}  // namespace

const MethodInfo& FlashAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "exact.flash";
    m.family = "exact";
    m.summary = "tiled online-softmax attention in float32, never forms Nq×Nk; split-KV decode";
    m.citation = "Dao et al., FlashAttention, NeurIPS 2022";
    m.time_complexity = "O(Nq·Nk·(Dk+Dv)), about half with causal";
    m.memory_complexity = "O(threads·(block_q+block_k)·(Dk+Dv))";
    m.params = {
        {"block_q", ParamType::kInt, "64", 1, 4096, {}, "query rows per tile"},
        {"block_k", ParamType::kInt, "256", 1, 65536, {}, "keys per tile"},
        {"split_kv", ParamType::kInt, "0", 0, 1024,
         {}, "key-range splits per query block (0 = automatic: split when query blocks < 2×threads)"},
    };
    m.caps = {.exact = true, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = true};
    return m;
  }();
  return info;
}

Status FlashAttention::can_run(const AttentionProblem& p) const { return AttentionMethod::can_run(p); }

namespace {
index_t choose_splits(const AttentionProblem& p, const ParamValues& pv, index_t work, int threads,
                      index_t bk) {
  index_t s = pv.get_int("split_kv");
  if (s == 0) {
    s = 1;
    if (work < 2 * threads) s = std::max<index_t>(1, (2 * threads + work - 1) / work);
  }
  // Each split needs at least one key tile.
  return std::clamp<index_t>(s, 1, std::max<index_t>(1, (p.n_kv() + bk - 1) / bk));
}
}  // namespace

std::size_t FlashAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  const Tiles t = choose_tiles(p, params_);
  const index_t nqb = (p.n_q() + t.bq - 1) / t.bq;
  const index_t work = p.batch() * p.heads() * nqb;
  const index_t splits = choose_splits(p, params_, work, ctx.num_threads(), t.bk);
  const std::size_t per_thread = 4 * static_cast<std::size_t>(t.bq * (t.bk + p.d_v() + 2));
  std::size_t partial = 0;
  if (splits > 1) partial = 4 * static_cast<std::size_t>(work * splits * t.bq * (p.d_v() + 2));
  return per_thread * static_cast<std::size_t>(ctx.num_threads()) + partial;
}

void FlashAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const Tiles t = choose_tiles(p, params_);
  const index_t nqb = (p.n_q() + t.bq - 1) / t.bq;
  const index_t work = p.batch() * p.heads() * nqb;
  const int threads = ctx.num_threads();
  const index_t splits = choose_splits(p, params_, work, threads, t.bk);
  const index_t dv = p.d_v();
  std::vector<RowState> states(static_cast<std::size_t>(threads));

  auto decode_item = [&](index_t w, index_t& b, index_t& h, index_t& i0, index_t& rows) {
    const index_t qb = w % nqb, bh = w / nqb;
    b = bh / p.heads();
    h = bh % p.heads();
    i0 = qb * t.bq;
    rows = std::min(t.bq, p.n_q() - i0);
  };

  if (splits == 1) {
    parallel_for(ctx, work, [&](std::int64_t w) {
      index_t b, h, i0, rows;
      decode_item(w, b, h, i0, rows);
      RowState& st = states[static_cast<std::size_t>(thread_index())];
      st.reset(rows, dv, t.bk);
      attend_range(p, b, h, i0, rows, 0, p.n_kv(), t.bk, st);
      finish_rows(p, b, h, i0, rows, st);
    });
    return;
  }

  // Split-KV: item (w, s) handles keys of chunk s; partial results merge through LSE.
  const index_t chunk = ((p.n_kv() + splits - 1) / splits + t.bk - 1) / t.bk * t.bk;
  std::vector<RowState> parts(static_cast<std::size_t>(work * splits));
  parallel_for(ctx, work * splits, [&](std::int64_t ws) {
    const index_t w = ws / splits, s = ws % splits;
    index_t b, h, i0, rows;
    decode_item(w, b, h, i0, rows);
    RowState& st = parts[static_cast<std::size_t>(ws)];
    st.reset(rows, dv, t.bk);
    const index_t k0 = std::min(p.n_kv(), s * chunk), k1 = std::min(p.n_kv(), k0 + chunk);
    attend_range(p, b, h, i0, rows, k0, k1, t.bk, st);
    st.s.clear();
    st.s.shrink_to_fit();
  });
  parallel_for(ctx, work, [&](std::int64_t w) {
    index_t b, h, i0, rows;
    decode_item(w, b, h, i0, rows);
    RowState& out = parts[static_cast<std::size_t>(w * splits)];
    for (index_t s = 1; s < splits; ++s) {
      const RowState& ps = parts[static_cast<std::size_t>(w * splits + s)];
      for (index_t r = 0; r < rows; ++r) {
        const float m_new = std::max(out.m[r], ps.m[r]);
        if (m_new == kNegInf) continue;
        const float c0 = simd::exp_f32(out.m[r] - m_new), c1 = simd::exp_f32(ps.m[r] - m_new);
        out.l[r] = out.l[r] * c0 + ps.l[r] * c1;
        float* a = out.acc.data() + r * dv;
        const float* pa = ps.acc.data() + r * dv;
        for (index_t d = 0; d < dv; ++d) a[d] = a[d] * c0 + pa[d] * c1;
        out.m[r] = m_new;
      }
    }
    finish_rows(p, b, h, i0, rows, out);
  });
}

NUMATTN_DEFINE_METHOD(FlashAttention)

}  // namespace numattn
