// Internal: the body of the two AVX-512 kernel-table translation units, qgemv_avx512.cpp
// (NUMATTN_QGEMV_VNNI 0) and qgemv_avx512vnni.cpp (1), each of which defines that macro and
// includes this file once. The lane traits for 16 floats (V512) feed qgemv_simd.h's kernels;
// with VNNI the 8-bit-activation kernels' byte dot products are one vpdpbusd. Compiled for
// AVX-512 F/BW/VL/DQ (+ VNNI) + F16C + FMA by the pragma below whatever the build's -march;
// a table is used only when cpuid says the CPU has its features (qgemv.cpp). Nothing here
// has external linkage but the table getter: see qgemv_kernels.h for why.
#include "qgemv_kernels.h"

#if !defined(NUMATTN_QGEMV_VNNI)
#error "define NUMATTN_QGEMV_VNNI (0 or 1) before including qgemv_avx512_impl.h"
#endif

// NUMATTN_QGEMV_EMULATED 1: the tests' build of the same code over SIMDe's portable
// intrinsics, which the includer has already included (tests/support/qgemv_emulated.h): no target
// pragma, no <immintrin.h>, and the getter is emulated_avx512[vnni]_table().
#if !defined(NUMATTN_QGEMV_EMULATED)
#define NUMATTN_QGEMV_EMULATED 0
#endif

#if NUMATTN_QGEMV_EMULATED || (defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
#include <string.h>

#if NUMATTN_QGEMV_EMULATED
#elif defined(__clang__)
#if NUMATTN_QGEMV_VNNI
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma,avx2"))), apply_to = function)
#else
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2"))), apply_to = function)
#endif
#else
#pragma GCC push_options
#if NUMATTN_QGEMV_VNNI
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma,avx2")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2")
#endif
// GCC 12 reports the deliberately undefined pass-through operand of its own AVX-512
// intrinsics (_mm512_undefined_*) as uninitialized when they are inlined under a target pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if !NUMATTN_QGEMV_EMULATED
#include <immintrin.h>
#endif

#include "qgemv_simd.h"

namespace numattn::qkern {
namespace {

template <bool kVnni>
struct V512 {
  static constexpr int kLanes = 16;
  using F = __m512;
  using I = __m512i;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static I u8(const std::uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I s8(const std::uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I band(I a, int c) { return _mm512_and_si512(a, _mm512_set1_epi32(c)); }
  static I bor(I a, I b) { return _mm512_or_si512(a, b); }
  static I isub(I a, int c) { return _mm512_sub_epi32(a, _mm512_set1_epi32(c)); }
  template <int kN>
  static I srl(I a) { return _mm512_srli_epi32(a, kN); }
  template <int kN>
  static I sll(I a) { return _mm512_slli_epi32(a, kN); }
  static F f16(const std::uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F bf16(const std::uint8_t* p) {  // bf16 = the top half of a float32
    const I h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
  static float half(const std::uint8_t* p) {
    unsigned short h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
  static void halves2(const std::uint8_t* p, F& a, F& b) {
    int v;
    memcpy(&v, p, 4);
    const __m128 h = _mm_cvtph_ps(_mm_cvtsi32_si128(v));
    a = _mm512_broadcastss_ps(h);
    b = _mm512_broadcastss_ps(_mm_movehdup_ps(h));
  }
  static I or16(I q, std::uint32_t bits) {
    return _mm512_mask_or_epi32(q, static_cast<__mmask16>(bits & 0xffffu), q, _mm512_set1_epi32(16));
  }
  static F join8(F a, F b) { return _mm512_insertf32x8(a, _mm512_castps512_ps256(b), 1); }
  // Integer kernels: two blocks of 32 bytes per step, lanes 0-7 the first block's, 8-15 the
  // second's.
  static constexpr int kQBlocks = 2;
  static I qload(const std::int8_t* p) { return _mm512_loadu_si512(p); }
  static I q8w(const std::uint8_t* p, std::int64_t stride) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + stride));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  static I q4w(const std::uint8_t* p, std::int64_t stride) {
    // [nibbles of block 0 | of block 1] -> low and high halves -> 128-bit lanes reordered to
    // lo0, hi0, lo1, hi1.
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride)), 1);
    const __m256i m = _mm256_set1_epi8(15);
    const __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m)),
                                         _mm256_and_si256(_mm256_srli_epi16(v, 4), m), 1);
    return _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(3, 1, 2, 0));
  }
  static I sub_i8(I a, int c) { return _mm512_sub_epi8(a, _mm512_set1_epi8(static_cast<char>(c))); }
  static I abs_i8(I a) { return _mm512_abs_epi8(a); }
  static I sign_i8(I x, I w) {  // AVX-512 has no vpsignb: negate under the mask of w's sign bits
    return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
  }
  // Σ of four u8·s8 products per int32 lane. VNNI's vpdpbusd does it in one instruction and
  // without the int16 pair sums of vpmaddubsw (which the operands never saturate: see
  // qgemv_simd.h), so both give the same integers.
  static I dot_u8i8(I u, I s) {
    if constexpr (kVnni) {
      return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
    } else {
      return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
    }
  }
  static F scales(const float* s) {
    return _mm512_insertf32x8(_mm512_set1_ps(s[0]), _mm256_set1_ps(s[1]), 1);
  }
  using M = __m128;  // lanes 1 and 3 accumulate m·s of the two blocks
  static M mzero() { return _mm_setzero_ps(); }
  static float msum(M m) {
    return _mm_cvtss_f32(_mm_add_ss(_mm_shuffle_ps(m, m, 1), _mm_shuffle_ps(m, m, 3)));
  }
  static F scales_min(const std::uint8_t* p, std::int64_t stride, const float* xd, const float* xs, M& acc) {
    int a, b;
    memcpy(&a, p, 4);
    memcpy(&b, p + stride, 4);
    const __m128 t = _mm_mul_ps(_mm_cvtph_ps(_mm_setr_epi32(a, b, 0, 0)), _mm_setr_ps(xd[0], xs[0], xd[1], xs[1]));
    acc = _mm_add_ps(acc, t);
    // d0·xd0 over lanes 0-7, d1·xd1 over lanes 8-15
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                                 _mm512_castps128_ps512(t));
  }
};

constexpr KernelTable kTable = simd::make_table<V512<NUMATTN_QGEMV_VNNI != 0>>();

}  // namespace
}  // namespace numattn::qkern

// Outside the pragma: the getter runs on any CPU (to learn the path exists), so it must not
// be compiled for AVX-512 itself.
#if NUMATTN_QGEMV_EMULATED
#elif defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace numattn::qkern {
#if NUMATTN_QGEMV_EMULATED && NUMATTN_QGEMV_VNNI
const KernelTable* emulated_avx512vnni_table() { return &kTable; }
#elif NUMATTN_QGEMV_EMULATED
const KernelTable* emulated_avx512_table() { return &kTable; }
#elif NUMATTN_QGEMV_VNNI
const KernelTable* avx512vnni_table() { return &kTable; }
#else
const KernelTable* avx512_table() { return &kTable; }
#endif
}  // namespace numattn::qkern

#else  // not x86-64 GCC/Clang: the path does not exist
namespace numattn::qkern {
#if NUMATTN_QGEMV_VNNI
const KernelTable* avx512vnni_table() { return nullptr; }
#else
const KernelTable* avx512_table() { return nullptr; }
#endif
}  // namespace numattn::qkern
#endif
