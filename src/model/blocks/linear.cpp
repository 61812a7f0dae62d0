#include "model/blocks/linear.h"

#include <algorithm>
#include <cmath>

#include "numattn/core/blas.h"
#include "numattn/core/simd.h"

namespace numattn::blocks {

// y[o] (+)= W[o,:]·x for rows o in [o0, o1): a decode step's matrix-vector product. Written
// out because BLAS GEMM with one row still packs all of W (an extra pass over memory), and this
// is memory-bound anyway; 16 independent partial sums let the compiler vectorise the dot
// product without reassociation.
static void gemv_rows(const float* x, std::int64_t in, const float* w, std::int64_t o0, std::int64_t o1,
               float* y, bool accumulate) {
  for (std::int64_t o = o0; o < o1; ++o) {
    const float* wr = w + o * in;
    float acc[16] = {};
    std::int64_t i = 0;
    for (; i + 16 <= in; i += 16)
      for (int k = 0; k < 16; ++k) acc[k] += wr[i + k] * x[i + k];
    float sum = 0;
    for (; i < in; ++i) sum += wr[i] * x[i];
    for (int k = 0; k < 16; ++k) sum += acc[k];
    y[o] = accumulate ? y[o] + sum : sum;
  }
}

void linear(const ExecContext& ctx, const float* x, std::int64_t n, std::int64_t in,
            const float* w, std::int64_t out, float* y, bool accumulate, std::int64_t ldy) {
  if (ldy <= 0) ldy = out;
  const float beta = accumulate ? 1.f : 0.f;
  const int nt = ctx.num_threads();
  const bool split = nt > 1 && n * in * out >= (std::int64_t{1} << 23);
  if (n <= 2) {
    auto rows = [&](std::int64_t o0, std::int64_t o1) {
      for (std::int64_t r = 0; r < n; ++r) gemv_rows(x + r * in, in, w, o0, o1, y + r * ldy, accumulate);
    };
    if (!split) {
      rows(0, out);
    } else {
      parallel_for(ctx, nt, [&](std::int64_t p) { rows(out * p / nt, out * (p + 1) / nt); });
    }
    return;
  }
  // Blocks of 64 features keep each slice's width a multiple of the BLAS micro-kernel.
  const std::int64_t blocks = (out + 63) / 64;
  const std::int64_t parts = std::min<std::int64_t>(nt, blocks);
  if (parts <= 1 || !split) {
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, out, in, 1.f, x, in, w, in, beta, y, ldy);
    return;
  }
  parallel_for(ctx, parts, [&](std::int64_t p) {
    const std::int64_t o0 = std::min(out, blocks * p / parts * 64);
    const std::int64_t o1 = std::min(out, blocks * (p + 1) / parts * 64);
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, o1 - o0, in, 1.f, x, in, w + o0 * in, in,
                beta, y + o0, ldy);
  });
}

std::uint64_t Weight::bytes() const {
  return q != nullptr && !q->empty() ? q->bytes() : 4 * static_cast<std::uint64_t>(out * in);
}

void linear(const ExecContext& ctx, Activations act, const float* x, std::int64_t n, const Weight& w, float* y,
            bool accumulate, std::int64_t ldy) {
  if (w.q != nullptr && !w.q->empty()) {
    if (act == Activations::kQ8 && n > kQuantGemvMaxBatch) {
      thread_local std::vector<float> xhat;
      xhat.assign(x, x + n * w.in);
      round_activations_q8(xhat.data(), n, w.in);
      quant_linear(ctx, *w.q, xhat.data(), n, y, accumulate, ldy);
    } else {
      quant_linear(ctx, *w.q, x, n, y, accumulate, ldy, default_cpu_path(), act);
    }
  } else {
    linear(ctx, x, n, w.in, w.f32->data(), w.out, y, accumulate, ldy);
  }
}

void rms_norm_rows(const float* x, const float* w, float* y, std::int64_t n, std::int64_t e,
                   double eps) {
  for (std::int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * e;
    float* yr = y + t * e;
    const double ss = simd::sum_squares_f64(xr, e);
    const auto r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(e) + eps));
    for (std::int64_t i = 0; i < e; ++i) yr[i] = xr[i] * r * w[i];
  }
}

}  // namespace numattn::blocks
