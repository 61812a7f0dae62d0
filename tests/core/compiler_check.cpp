// The compiler's own code generation for the one loop shape known to be miscompiled where the
// library runs: a signed × signed byte dot product whose signed bytes were loaded as unsigned
// and converted, Σ int8(p)·int8(x) (how a GGUF block's quants are read).
//
// GCC 12.2 with AVX-512 VNNI or AVX-VNNI enabled vectorises that loop into vpdpbusd, which reads
// its first operand as unsigned, so every negative int8(p) counts as p + 256 (32 terms of
// (−1)·1 sum to 8160; at -O2 with 32 terms, at -O3 also with a run-time length). The SIMDe emulation of the kernels cannot see this (it swaps intrinsics, not the
// compiler's vectoriser). cmake/NumattnCompilerChecks.cmake runs this program at configure time
// with -march=native alone and adds the flags that avoid the bug where it fails; ctest
// compiler.int8_dot runs it again compiled with every flag of the build, and it fails loudly,
// naming the compiler and those flags, wherever the code the build's flags produce is wrong. It then runs the form the quantized kernels use instead (qgemv_simd.h's
// unsigned × signed terms) compiled under the AVX-512 VNNI target of their kernel table, where
// the CPU has VNNI. Exit status: 0 pass, 1 miscompiled.
#include <cstdint>
#include <cstdio>
#include <initializer_list>

#include "quant/qgemv_kernels.h"

#ifndef NUMATTN_CHECK_FLAGS
#define NUMATTN_CHECK_FLAGS "(not recorded)"
#endif

namespace {

// noinline, and inputs the caller fills at run time, keep the sums from being folded.
__attribute__((noinline)) int dot_plain32(const std::uint8_t* p, const std::int8_t* x) {
  int s = 0;
  for (int j = 0; j < 32; ++j) s += static_cast<std::int8_t>(p[j]) * x[j];
  return s;
}

__attribute__((noinline)) int dot_plain(const std::uint8_t* p, const std::int8_t* x, int n) {
  int s = 0;
  for (int j = 0; j < n; ++j) s += static_cast<std::int8_t>(p[j]) * x[j];
  return s;
}

}  // namespace

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NUMATTN_CHECK_VNNI 1
// As qgemv_avx512_impl.h compiles the VNNI kernel table.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,avx2")
#endif
#include "quant/qgemv_simd.h"

namespace {

struct VnniTag {};  // a lane-traits stand-in: dot_s8_s8 uses its V only for linkage

__attribute__((noinline)) int dot_kernel_form_vnni(const std::int8_t* w, const std::int8_t* x) {
  return numattn::qkern::simd::dot_s8_s8<VnniTag, 32>(w, x);
}

__attribute__((noinline)) int dot_plain_vnni(const std::uint8_t* p, const std::int8_t* x) {
  int s = 0;
  for (int j = 0; j < 32; ++j) s += static_cast<std::int8_t>(p[j]) * x[j];
  return s;
}

}  // namespace

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace {

const char* compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "GCC " __VERSION__;
#else
  return "an unknown compiler";
#endif
}

// Weights −128..−1 as bytes (pattern 0: all −1, x all 1; then x signed), and the expected sum
// in plain 64-bit arithmetic.
void fill(std::uint8_t* p, std::int8_t* x, int n, int pattern) {
  for (int j = 0; j < n; ++j) {
    p[j] = static_cast<std::uint8_t>(pattern == 0 ? 0xff : 0xff - (j * 37 + pattern) % 128);
    x[j] = static_cast<std::int8_t>(pattern == 0 ? 1 : (j * 53 + 3 * pattern) % 255 - 127);
  }
}

long long expected(const std::uint8_t* p, const std::int8_t* x, int n) {
  long long s = 0;
  for (int j = 0; j < n; ++j) s += static_cast<long long>(p[j] >= 128 ? p[j] - 256 : p[j]) * x[j];
  return s;
}

}  // namespace

int main() {
  std::uint8_t w[64];
  std::int8_t x[64];
  int failures = 0;
  for (int pattern = 0; pattern < 4; ++pattern)
    for (int n : {0, 32, 64, 17}) {  // 0: the 32-term function
      fill(w, x, n ? n : 32, pattern);
      const long long want = expected(w, x, n ? n : 32);
      const int got = n ? dot_plain(w, x, n) : dot_plain32(w, x);
      if (got != want) {
        if (failures++ == 0)
          std::printf(
              "compiler_check: FAILED: %s, with this build's flags (%s), computes a signed x signed "
              "int8 dot product (bytes loaded unsigned, then converted) of %d terms as %d instead of %lld.\n  The vectoriser uses vpdpbusd, "
              "which reads its first operand as unsigned (a negative w counts as w + 256), so any such "
              "loop in numattn or the code it inlines is wrong on this CPU.\n  Avoid it with "
              "-mno-avx512vnni -mno-avxvnni (cmake/NumattnCompilerChecks.cmake adds them when its "
              "configure-time run of this program fails; this build's run did not), or -fno-tree-vectorize, "
              "or another compiler (clang computes it right).\n",
              compiler(), NUMATTN_CHECK_FLAGS, n ? n : 32, got, want);
      }
    }
  std::printf("compiler_check: %s; signed int8 dot product with this build's flags (%s): %s\n", compiler(),
              NUMATTN_CHECK_FLAGS, failures ? "WRONG" : "correct");
#if defined(NUMATTN_CHECK_VNNI)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    int kernel_bad = 0, plain_bad = 0;
    for (int pattern = 0; pattern < 4; ++pattern) {
      fill(w, x, 32, pattern);
      const long long want = expected(w, x, 32);
      kernel_bad += dot_kernel_form_vnni(reinterpret_cast<const std::int8_t*>(w), x) != want;
      plain_bad += dot_plain_vnni(w, x) != want;
    }
    std::printf("compiler_check: under the VNNI kernel table's target: the kernels' unsigned x signed form %s; "
                "the plain signed x signed loop (which numattn does not use there) %s\n",
                kernel_bad ? "WRONG" : "correct", plain_bad ? "is miscompiled by this compiler" : "correct");
    if (kernel_bad) {
      std::printf("compiler_check: FAILED: %s miscompiles qgemv_simd.h's dot_s8_s8 under the VNNI target\n",
                  compiler());
      ++failures;
    }
  } else {
    std::printf("compiler_check: this CPU has no AVX-512 VNNI: the VNNI-target forms were not run\n");
  }
#endif
  return failures ? 1 : 0;
}
