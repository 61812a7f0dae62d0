// core/simd.h's array functions: the portable variant (src/core/simd_kernels.h) and the
// dispatch to the variant of default_cpu_path().
#define NUMATTN_ISA 0
#include "core/simd_kernels.h"

#include "numattn/core/cpu.h"

namespace numattn::simd {

namespace {

const bool kRegistered = (register_kernel_family("simd (exp, softmax rows, norms)", CpuPath::kAvx512), true);

const Ops& ops_now() { return *pick_isa_variant(portable::ops(), avx2::ops(), avx512::ops()); }

}  // namespace

void exp_f32(const float* x, float* y, std::int64_t n) { ops_now().exp(x, y, n); }
void silu_mul(const float* g, const float* u, float* a, std::int64_t n) { ops_now().silu_mul(g, u, a, n); }
void gelu_tanh_mul(const float* g, const float* u, float* a, std::int64_t n) { ops_now().gelu_mul(g, u, a, n); }
double sum_squares_f64(const float* x, std::int64_t n) { return ops_now().sum_squares(x, n); }
float max_f32(const float* x, std::int64_t n) { return ops_now().max(x, n); }
double exp_shift(float* x, std::int64_t n, float shift, float add) { return ops_now().exp_shift(x, n, shift, add); }
float dot_f32(const float* x, const float* y, std::int64_t n) { return ops_now().dot(x, y, n); }

}  // namespace numattn::simd
