// Internal: the dispatch table of the array functions of core/simd.h, one per instruction-set
// variant (src/core/simd_kernels.h compiled by simd.cpp, simd_avx2.cpp, simd_avx512.cpp).
#pragma once

#include <cstdint>

#include "core/isa_dispatch.h"

namespace numattn::simd {

struct Ops {
  void (*exp)(const float* x, float* y, std::int64_t n);
  void (*silu_mul)(const float* g, const float* u, float* a, std::int64_t n);
  void (*gelu_mul)(const float* g, const float* u, float* a, std::int64_t n);
  double (*sum_squares)(const float* x, std::int64_t n);
  float (*max)(const float* x, std::int64_t n);
  double (*exp_shift)(float* x, std::int64_t n, float shift, float add);
  float (*dot)(const float* x, const float* y, std::int64_t n);
};

NUMATTN_DECLARE_ISA_VARIANTS(const Ops*, ops)

}  // namespace numattn::simd
