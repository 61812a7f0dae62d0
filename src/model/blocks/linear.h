// Internal: the products and the normalisation the model's blocks share.
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/quant/qgemv.h"

namespace numattn::blocks {

/// A linear layer's weight `[out, in]` row-major: float32 values or (in place) the QuantMatrix
/// beside them, never both (model/llama.h LlamaLayer).
struct Weight {
  const std::vector<float>* f32 = nullptr;
  const QuantMatrix* q = nullptr;
  std::int64_t out = 0, in = 0;
  /// Encoded bytes (in place) or 4 per weight.
  std::uint64_t bytes() const;
};

/// y = x·Wᵀ (+ y when accumulate) for x [n, in] row-major, W [out, in] float32, y rows ldy
/// apart (0: out). Large products are split over `ctx`'s threads by contiguous blocks of output
/// features, each a single-threaded BLAS GEMM; small ones stay on the calling thread, because
/// waking the team costs more than they do (a scheduler time slice on a loaded machine).
void linear(const ExecContext& ctx, const float* x, std::int64_t n, std::int64_t in, const float* w,
            std::int64_t out, float* y, bool accumulate, std::int64_t ldy = 0);

/// The same product with a weight held either way. With 8-bit activations a decode product runs
/// quant_linear's integer kernels, and a prefill rounds x to the same x̂ before its float32
/// panels, so that prefill and decode still agree up to float32 summation order (and ppl, which
/// prefills, measures what decode computes).
void linear(const ExecContext& ctx, Activations act, const float* x, std::int64_t n, const Weight& w, float* y,
            bool accumulate, std::int64_t ldy = 0);

/// y[t] = x[t] / sqrt(mean(x[t]²) + eps) ⊙ w for n rows of width e (sum of squares in float64).
void rms_norm_rows(const float* x, const float* w, float* y, std::int64_t n, std::int64_t e, double eps);

}  // namespace numattn::blocks
