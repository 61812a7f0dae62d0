// Internal: what the 2-simplicial kernel's driver (simplicial_kernel.cpp) and its row kernels
// share: the blocking constants, one row's job and result, and the row kernels' entry points.
// The vector row kernels are compiled per instruction-set variant (simplicial_vec.h).
#pragma once

#include <cmath>
#include <vector>

#include "core/isa_dispatch.h"
#include "numattn/core/simd.h"
#include "numattn/core/tensor.h"

namespace numattn::simplicial_rows {

inline constexpr index_t kQB = 64;  // query rows per task
inline constexpr index_t kTJ = 64;  // keys j per online-softmax tile
inline constexpr index_t kL = 16;   // lanes of one k chunk
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline index_t round_up(index_t x, index_t m) { return (x + m - 1) / m * m; }

/// Everything one row's computation needs, pointing into the block's packed buffers.
struct RowJob {
  const float* q;          // Dk
  const float* const* kj;  // kj[r] = caller's K row of key J.begin + r (|J| entries)
  const float* kt;         // packed K'ᵀ, column 0 = key K.begin, leading dimension ldkt
  index_t ldkt;
  const float* v1;         // packed V rows, row 0 = key J.begin (ld dvp)
  const float* v2;         // packed V' rows, row 0 = key K.begin (ld dvp)
  index_t nj, nk, dk, dvp;
  float scale;
};

struct RowResult {
  float m = kNegInf, l = 0;
};

/// Buffers of one row's computation (reused across rows of a task).
struct RowScratch {
  std::vector<float> w, s, acc, u;
};

/// exp that keeps NaN (simd::exp_f32 maps NaN to NaN too, but says nothing of it).
inline float exp_nan(float x) { return std::isnan(x) ? x : simd::exp_f32(x); }

using RowFn = RowResult (*)(const RowJob& job, RowScratch& sc);

/// The vector row kernels (the portable one, row_portable, is the driver's).
namespace avx2 {
RowFn row_fn();
}
namespace avx512 {
RowFn row_fn();
}

}  // namespace numattn::simplicial_rows
