// SIMDe's portable AVX-512 / F16C intrinsics under their Intel names, plus those that SIMDe
// 0.7.4 lacks, for the emulated kernel tables (qgemv_emulated.h) and for the whole-tree
// emulated AVX-512 build (scripts/check_avx512_emulated.sh, through emulated_avx512/immintrin.h).
// Include only from a translation unit that includes nothing else using <immintrin.h>.
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
// A 512-bit vector of 16 int32 / float lanes, lane i converted from v[i].
template <class Lanes>
static inline simde__m512i emu_i32x16(const Lanes& v) {
  simde__m512i_private r;
  for (int i = 0; i < 16; ++i) r.i32[i] = static_cast<int32_t>(v[i]);
  return simde__m512i_from_private(r);
}
template <class Lanes>
static inline simde__m512 emu_f32x16(const Lanes& v) {
  simde__m512_private r;
  for (int i = 0; i < 16; ++i) r.f32[i] = static_cast<simde_float32>(v[i]);
  return simde__m512_from_private(r);
}
static inline simde__m512 _mm512_cvtepi32_ps(simde__m512i a) { return emu_f32x16(simde__m512i_to_private(a).i32); }
static inline simde__m512i _mm512_cvtepu8_epi32(simde__m128i a) { return emu_i32x16(simde__m128i_to_private(a).u8); }
static inline simde__m512i _mm512_cvtepi8_epi32(simde__m128i a) { return emu_i32x16(simde__m128i_to_private(a).i8); }
static inline simde__m512i _mm512_cvtepu16_epi32(simde__m256i a) { return emu_i32x16(simde__m256i_to_private(a).u16); }
static inline simde__m512 _mm512_cvtph_ps(simde__m256i a) {
  const simde__m256i_private a_ = simde__m256i_to_private(a);
  simde_float32 f[16];
  for (int i = 0; i < 16; ++i) f[i] = simde_float16_to_float32(simde_uint16_as_float16(a_.u16[i]));
  return emu_f32x16(f);
}
static inline float _cvtsh_ss(unsigned short h) {
  return simde_float16_to_float32(simde_uint16_as_float16(h));
}
static inline simde__m512d _mm512_cvtps_pd(simde__m256 a) {
  const simde__m256_private a_ = simde__m256_to_private(a);
  simde__m512d_private r;
  for (int i = 0; i < 8; ++i) r.f64[i] = a_.f32[i];
  return simde__m512d_from_private(r);
}
// The reductions in the order of GCC's own (upper half onto lower, halving): only NaN
// propagation and rounding could tell orders apart.
static inline double _mm512_reduce_add_pd(simde__m512d a) {
  simde__m512d_private v = simde__m512d_to_private(a);
  for (int h = 4; h >= 1; h /= 2)
    for (int i = 0; i < h; ++i) v.f64[i] = v.f64[i + h] + v.f64[i];
  return v.f64[0];
}
static inline float _mm512_reduce_add_ps(simde__m512 a) {
  simde__m512_private v = simde__m512_to_private(a);
  for (int h = 8; h >= 1; h /= 2)
    for (int i = 0; i < h; ++i) v.f32[i] = v.f32[i + h] + v.f32[i];
  return v.f32[0];
}
static inline float _mm512_reduce_max_ps(simde__m512 a) {  // maxps(hi, lo): lo where either is NaN
  simde__m512_private v = simde__m512_to_private(a);
  for (int h = 8; h >= 1; h /= 2)
    for (int i = 0; i < h; ++i) v.f32[i] = v.f32[i + h] > v.f32[i] ? v.f32[i + h] : v.f32[i];
  return v.f32[0];
}
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
typedef simde__mmask16 __mmask16;
typedef simde__mmask8 __mmask8;
#define _mm512_mask_cmp_ps_mask(k, a, b, imm) \
  (static_cast<__mmask16>((k) & simde_mm512_cmp_ps_mask((a), (b), (imm))))
static inline simde__m512 _mm512_maskz_loadu_ps(__mmask16 k, const void* p) {  // reads set lanes only
  simde__m512_private r;
  const float* f = static_cast<const float*>(p);
  for (int i = 0; i < 16; ++i) r.f32[i] = ((k >> i) & 1) ? f[i] : 0.f;
  return simde__m512_from_private(r);
}
