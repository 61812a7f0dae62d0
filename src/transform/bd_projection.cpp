#include "numattn/transform/bd_projection.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"

namespace numattn::transform {

BdProjection BdProjection::dense(index_t d_in, index_t heads, index_t head_dim,
                                 std::span<const float> w, std::span<const float> bias) {
  NUMATTN_CHECK(d_in >= 1 && heads >= 1 && head_dim >= 1,
                "projection needs d_in, heads, head_dim >= 1 (got {}, {}, {})", d_in, heads,
                head_dim);
  const index_t out = heads * head_dim;
  NUMATTN_CHECK(static_cast<index_t>(w.size()) == d_in * out,
                "projection weight has {} values, expected d_in·heads·head_dim = {}", w.size(),
                d_in * out);
  NUMATTN_CHECK(bias.empty() || static_cast<index_t>(bias.size()) == out,
                "projection bias has {} values, expected {}", bias.size(), out);
  BdProjection p;
  p.d_ = d_in;
  p.heads_ = heads;
  p.dh_ = head_dim;
  p.r_ = 0;
  p.perm_.resize(static_cast<std::size_t>(d_in));
  for (index_t i = 0; i < d_in; ++i) p.perm_[static_cast<std::size_t>(i)] = i;
  p.dense_.assign(static_cast<std::size_t>(heads), 1);
  for (index_t h = 0; h < heads; ++h) p.dense_list_.push_back(h);
  p.full_.assign(w.begin(), w.end());
  p.bias_.assign(bias.begin(), bias.end());
  return p;
}

BdProjection::Parts BdProjection::parts() const {
  Parts q;
  q.d_in = d_;
  q.heads = heads_;
  q.head_dim = dh_;
  q.rank = r_;
  q.perm = perm_;
  q.dense_heads = dense_list_;
  q.rest = r_ > 0 ? rest_ : full_;
  q.top = top_;
  q.bias = bias_;
  return q;
}

BdProjection BdProjection::from_parts(Parts q) {
  NUMATTN_CHECK(q.d_in >= 1 && q.heads >= 1 && q.head_dim >= 1 && q.d_in < (1 << 24) &&
                    q.heads < (1 << 16) && q.head_dim < (1 << 16),
                "BD projection: bad sizes d_in={} heads={} head_dim={}", q.d_in, q.heads, q.head_dim);
  NUMATTN_CHECK(q.rank == 0 || q.rank == q.head_dim,
                "BD projection: rank {} must be 0 (dense) or head_dim {}", q.rank, q.head_dim);
  const index_t out = q.heads * q.head_dim, r = q.rank;
  NUMATTN_CHECK(static_cast<index_t>(q.perm.size()) == q.d_in,
                "BD projection: permutation has {} entries, expected {}", q.perm.size(), q.d_in);
  std::vector<char> seen(static_cast<std::size_t>(q.d_in), 0);
  for (index_t v : q.perm) {
    NUMATTN_CHECK(v >= 0 && v < q.d_in && !seen[static_cast<std::size_t>(v)],
                  "BD projection: the channel permutation is not a permutation of 0..{}", q.d_in - 1);
    seen[static_cast<std::size_t>(v)] = 1;
  }
  for (std::size_t k = 0; k < q.dense_heads.size(); ++k)
    NUMATTN_CHECK(q.dense_heads[k] >= 0 && q.dense_heads[k] < q.heads &&
                      (k == 0 || q.dense_heads[k] > q.dense_heads[k - 1]),
                  "BD projection: dense head list must be ascending head indices < {}", q.heads);
  const index_t nd = static_cast<index_t>(q.dense_heads.size());
  NUMATTN_CHECK(static_cast<index_t>(q.rest.size()) == (q.d_in - r) * out,
                "BD projection: coefficient matrix has {} values, expected {}", q.rest.size(),
                (q.d_in - r) * out);
  NUMATTN_CHECK(static_cast<index_t>(q.top.size()) == (r > 0 ? r * nd * q.head_dim : 0),
                "BD projection: dense-head block has {} values, expected {}", q.top.size(),
                r * nd * q.head_dim);
  NUMATTN_CHECK(q.bias.empty() || static_cast<index_t>(q.bias.size()) == out,
                "BD projection: bias has {} values, expected {}", q.bias.size(), out);
  BdProjection p;
  p.d_ = q.d_in;
  p.heads_ = q.heads;
  p.dh_ = q.head_dim;
  p.r_ = r;
  p.perm_ = std::move(q.perm);
  p.dense_.assign(static_cast<std::size_t>(q.heads), 0);
  for (index_t h : q.dense_heads) p.dense_[static_cast<std::size_t>(h)] = 1;
  p.dense_list_ = std::move(q.dense_heads);
  if (r > 0) {
    p.rest_ = std::move(q.rest);
    p.top_ = std::move(q.top);
  } else {
    p.full_ = std::move(q.rest);
  }
  p.bias_ = std::move(q.bias);
  return p;
}

index_t BdProjection::weight_params() const {
  return static_cast<index_t>(full_.size() + rest_.size() + top_.size());
}

std::vector<float> BdProjection::effective_weight() const {
  const index_t out = out_dim();
  if (r_ == 0) return full_;
  std::vector<float> w(static_cast<std::size_t>(d_ * out), 0.f);
  const index_t nd = dense_head_count();
  std::vector<index_t> slot(static_cast<std::size_t>(heads_), -1);
  for (index_t k = 0; k < nd; ++k) slot[static_cast<std::size_t>(dense_list_[static_cast<std::size_t>(k)])] = k;
  for (index_t h = 0; h < heads_; ++h) {
    const index_t k = slot[static_cast<std::size_t>(h)];
    for (index_t i = 0; i < r_; ++i) {
      float* row = w.data() + perm_[static_cast<std::size_t>(i)] * out + h * dh_;
      if (k < 0)
        row[i] = 1.f;
      else
        for (index_t j = 0; j < dh_; ++j) row[j] = top_[static_cast<std::size_t>(i * nd * dh_ + k * dh_ + j)];
    }
  }
  for (index_t i = 0; i < d_ - r_; ++i)
    std::memcpy(w.data() + perm_[static_cast<std::size_t>(r_ + i)] * out,
                rest_.data() + i * out, sizeof(float) * out);
  return w;
}

index_t BdProjection::macs_per_token() const {
  if (r_ == 0) return d_ * out_dim();
  return (d_ - r_) * out_dim() + r_ * dense_head_count() * dh_;
}

void BdProjection::fill_basis(const float* xs, index_t tokens, index_t ldxs, float* y, index_t ldy) const {
  NUMATTN_CHECK(r_ > 0, "fill_basis: the projection is dense (no basis)");
  // Identity part X[:,S] (+ b') for BD heads, b (or 0) for dense heads.
  for (index_t t = 0; t < tokens; ++t) {
    const float* xr = xs + t * ldxs;
    float* yr = y + t * ldy;
    for (index_t h = 0; h < heads_; ++h) {
      float* yh = yr + h * dh_;
      const float* bh = bias_.empty() ? nullptr : bias_.data() + h * dh_;
      if (!dense_[static_cast<std::size_t>(h)]) {
        if (bh)
          for (index_t j = 0; j < dh_; ++j) yh[j] = xr[j] + bh[j];
        else
          std::memcpy(yh, xr, sizeof(float) * dh_);
      } else if (bh) {
        std::memcpy(yh, bh, sizeof(float) * dh_);
      } else {
        std::memset(yh, 0, sizeof(float) * dh_);
      }
    }
  }
  // Dense heads: add X[:,S]·W_h[S,:].
  const index_t nd = dense_head_count();
  for (index_t k = 0; k < nd; ++k) {
    const index_t h = dense_list_[static_cast<std::size_t>(k)];
    blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, tokens, dh_, r_, 1.f, xs, ldxs, top_.data() + k * dh_, nd * dh_,
                1.f, y + h * dh_, ldy);
  }
}

void BdProjection::project(const float* x, index_t tokens, index_t ldx, float* y, index_t ldy,
                           InputOrder order, const ExecContext& ctx) const {
  NUMATTN_CHECK(d_ > 0, "BdProjection is empty (build it with dense() or build_bd_projection())");
  NUMATTN_CHECK(ldx >= d_ && ldy >= out_dim(), "project: ldx {} < d_in {} or ldy {} < out {}",
                ldx, d_, ldy, out_dim());
  if (tokens <= 0) return;
  const index_t nt = ctx.num_threads();
  const index_t rows = block_rows_ > 0 ? block_rows_ : (tokens + nt - 1) / nt;
  const index_t nblocks = (tokens + rows - 1) / rows;
  const index_t out = out_dim();

  parallel_for(ctx, nblocks, [&](std::int64_t blk) {
    const index_t lo = blk * rows, n = std::min(rows, tokens - lo);
    float* yb = y + lo * ldy;
    if (r_ == 0) {
      // Dense: Y = X·W (+ b). Same blocking as the BD path, so timings compare like with like.
      float beta = 0.f;
      if (!bias_.empty()) {
        for (index_t t = 0; t < n; ++t) std::memcpy(yb + t * ldy, bias_.data(), sizeof(float) * out);
        beta = 1.f;
      }
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, n, out, d_, 1.f, x + lo * ldx, ldx,
                  full_.data(), out, beta, yb, ldy);
      return;
    }
    const float* xb = x + lo * ldx;
    index_t ldb = ldx;
    std::vector<float> gathered;
    if (order == InputOrder::kOriginal) {
      gathered.resize(static_cast<std::size_t>(n * d_));
      for (index_t t = 0; t < n; ++t) {
        const float* src = xb + t * ldx;
        float* dst = gathered.data() + t * d_;
        for (index_t k = 0; k < d_; ++k) dst[k] = src[perm_[static_cast<std::size_t>(k)]];
      }
      xb = gathered.data();
      ldb = d_;
    }
    fill_basis(xb, n, ldb, yb, ldy);
    // The one GEMM with inner dimension d − r, accumulated onto the pre-filled output.
    if (d_ > r_)
      blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, n, out, d_ - r_, 1.f, xb + r_, ldb,
                  rest_.data(), out, 1.f, yb, ldy);
  });
}

}  // namespace numattn::transform
