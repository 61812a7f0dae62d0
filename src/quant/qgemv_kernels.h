// Internal: the per-instruction-set kernel tables behind quant_gemv (quant/qgemv.h).
//
// Each vector path lives in its own translation unit compiled for its instruction set by a
// target pragma (not by the build's -march), so a portable build still carries the AVX2 and
// AVX-512 kernels and picks one at run time. Those files include only C headers and
// <immintrin.h> after the pragma and define nothing with external linkage except their table
// getter: an inline function or template compiled there for AVX-512 could otherwise be chosen
// by the linker for a caller on a CPU without it.
#pragma once

#include <cstdint>

namespace numattn {
enum class CpuPath;  // numattn/quant/qgemv.h
}

namespace numattn::qkern {

// out[i] = (out[i] if accumulate, else 0) + Σ_j w_ij·x_j for `rows` consecutive rows of
// `row_bytes` bytes each, starting at `row`, every row `cols` elements in its block encoding.
using DotFn = void (*)(const std::uint8_t* row, std::int64_t row_bytes, std::int64_t rows,
                       const float* x, std::int64_t cols, float* out, bool accumulate);
using DotF32Fn = float (*)(const float* a, const float* b, std::int64_t n);
// Dequantizes `cols` values (whole blocks) of one row into dst, as dequantize_row does.
using DeqFn = void (*)(const std::uint8_t* row, float* dst, std::int64_t cols);

// The same rows against activations rounded to int8 (ActivationsQ8 of one vector: quants xq
// [ceil(cols/32)·32], scales xd and block sums xs [ceil(cols/32)]); cols is a multiple of 32
// (the block of every type that has such a kernel).
using DotQ8Fn = void (*)(const std::uint8_t* row, std::int64_t row_bytes, std::int64_t rows,
                         const std::int8_t* xq, const float* xd, const float* xs, std::int64_t cols,
                         float* out, bool accumulate);

// One path's kernels; nullptr = the generic kernel (dequantize a piece, then dot_f32).
struct KernelTable {
  DotF32Fn dot_f32 = nullptr;  // required
  DotFn f32 = nullptr, f16 = nullptr, bf16 = nullptr, q8_0 = nullptr, q4_0 = nullptr,
        q4_1 = nullptr, q5_0 = nullptr, q5_1 = nullptr, q4_k = nullptr, q5_k = nullptr,
        q6_k = nullptr;
  // Vector dequantizers for the prefill's panels (nullptr = dequantize_row), each giving
  // dequantize_row's floats bit for bit.
  DeqFn deq_q8_0 = nullptr, deq_q4_1 = nullptr, deq_q5_0 = nullptr, deq_q4_k = nullptr,
        deq_q5_k = nullptr, deq_q6_k = nullptr;
  // Integer kernels against ActivationsQ8 (all three set on every path).
  DotQ8Fn q8_0_q8 = nullptr, q4_0_q8 = nullptr, q4_1_q8 = nullptr;
};

// nullptr when the path was not compiled (another architecture than x86-64).
const KernelTable* avx2_table();
const KernelTable* avx512_table();
const KernelTable* avx512vnni_table();

// For tests: `path` runs table `t` (nullptr: its own again) and counts as available, whatever
// the CPU; default_cpu_path() never picks such a path. tests/support/qgemv_emulated.h puts the
// AVX-512 tables, compiled over SIMDe's portable intrinsics, in place on CPUs without AVX-512,
// so the kernel tests check them on every machine.
void set_test_table(CpuPath path, const KernelTable* t);
// The table a test put in place for `path` (nullptr: none).
const KernelTable* test_table(CpuPath path);

}  // namespace numattn::qkern
