// SIMDe's portable AVX-512 / F16C intrinsics under their Intel names, for the emulated
// kernel tables (qgemv_emulated.h), plus those that SIMDe 0.7.4 does not have. Include only
// from a translation unit that includes nothing else using <immintrin.h>.
#pragma once

// (SIMDe passes 64-byte vectors by value, about which GCC warns without AVX-512: tests/CMakeLists.txt
// compiles the two files that include this one with -Wno-psabi.)
#define SIMDE_ENABLE_NATIVE_ALIASES
#define SIMDE_NO_NATIVE  // every operation in portable code, whatever the build's -march
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

// SIMDe 0.7.4 aliases _mm512_madd_epi16 to its masked form (four operands): the plain one.
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)

// The missing ones, each lane as the instruction defines it.
static inline simde__m512i _mm512_shuffle_i64x2(simde__m512i a, simde__m512i b, int imm) {
  // 128-bit lanes 0-1 of the result from a, 2-3 from b, each picked by two bits of imm.
  const simde__m512i_private a_ = simde__m512i_to_private(a), b_ = simde__m512i_to_private(b);
  simde__m512i_private r;
  for (int k = 0; k < 4; ++k) {
    const simde__m512i_private& src = k < 2 ? a_ : b_;
    const int lane = (imm >> (2 * k)) & 3;
    r.i64[2 * k] = src.i64[2 * lane];
    r.i64[2 * k + 1] = src.i64[2 * lane + 1];
  }
  return simde__m512i_from_private(r);
}
static inline simde__m512 _mm512_cvtepi32_ps(simde__m512i a) {
  const simde__m512i_private a_ = simde__m512i_to_private(a);
  simde__m512_private r;
  for (int i = 0; i < 16; ++i) r.f32[i] = static_cast<simde_float32>(a_.i32[i]);
  return simde__m512_from_private(r);
}
static inline simde__m512i _mm512_cvtepu8_epi32(simde__m128i a) {
  const simde__m128i_private a_ = simde__m128i_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 16; ++i) r.i32[i] = a_.u8[i];
  return simde__m512i_from_private(r);
}
static inline simde__m512i _mm512_cvtepi8_epi32(simde__m128i a) {
  const simde__m128i_private a_ = simde__m128i_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 16; ++i) r.i32[i] = a_.i8[i];
  return simde__m512i_from_private(r);
}
static inline simde__m512i _mm512_cvtepu16_epi32(simde__m256i a) {
  const simde__m256i_private a_ = simde__m256i_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 16; ++i) r.i32[i] = a_.u16[i];
  return simde__m512i_from_private(r);
}
static inline simde__m512 _mm512_cvtph_ps(simde__m256i a) {
  const simde__m256i_private a_ = simde__m256i_to_private(a);
  simde__m512_private r;
  for (int i = 0; i < 16; ++i) r.f32[i] = simde_float16_to_float32(simde_uint16_as_float16(a_.u16[i]));
  return simde__m512_from_private(r);
}
static inline float _mm512_reduce_add_ps(simde__m512 a) {
  const simde__m512_private a_ = simde__m512_to_private(a);
  float s = 0;
  for (int i = 0; i < 16; ++i) s += a_.f32[i];
  return s;
}
static inline float _cvtsh_ss(unsigned short h) {
  return simde_float16_to_float32(simde_uint16_as_float16(h));
}
