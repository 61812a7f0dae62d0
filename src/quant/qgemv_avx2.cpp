// AVX2 kernels of quant_gemv (quant/qgemv.h): the lane traits for 8 floats, the kernels
// themselves are qgemv_simd.h's. Compiled for AVX2 + F16C + FMA by the pragma below whatever
// the build's -march; called only when cpuid says the CPU has them (qgemv.cpp). Nothing has
// external linkage but avx2_table(): see qgemv_kernels.h for why.
#include "qgemv_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
#endif
#include <immintrin.h>

#include "qgemv_simd.h"

namespace numattn::qkern {
namespace {

// Byte i of row b is 16 when bit i of b is set, else 0: or16's eight fifth bits in one
// load-and-widen (measured against a variable shift of the broadcast bits: fewer instructions).
struct Bits16 {
  alignas(64) std::uint8_t v[256][8];
};
constexpr Bits16 make_bits16() {
  Bits16 t{};
  for (int b = 0; b < 256; ++b)
    for (int i = 0; i < 8; ++i) t.v[b][i] = static_cast<std::uint8_t>(((b >> i) & 1) << 4);
  return t;
}
constexpr Bits16 kBits16 = make_bits16();

struct V {
  static constexpr int kLanes = 8;
  using F = __m256;
  using I = __m256i;
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static float hsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static I u8(const std::uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I s8(const std::uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I band(I a, int c) { return _mm256_and_si256(a, _mm256_set1_epi32(c)); }
  static I bor(I a, I b) { return _mm256_or_si256(a, b); }
  static I isub(I a, int c) { return _mm256_sub_epi32(a, _mm256_set1_epi32(c)); }
  template <int kN>
  static I srl(I a) { return _mm256_srli_epi32(a, kN); }
  template <int kN>
  static I sll(I a) { return _mm256_slli_epi32(a, kN); }
  static F f16(const std::uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F bf16(const std::uint8_t* p) {  // bf16 = the top half of a float32
    const I h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
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
    a = _mm256_broadcastss_ps(h);
    b = _mm256_broadcastss_ps(_mm_movehdup_ps(h));
  }
  static I or16(I q, std::uint32_t bits) { return _mm256_or_si256(q, u8(kBits16.v[bits & 0xffu])); }
  static F join8(F a, F) { return a; }
  // Integer kernels: one block of 32 bytes per step.
  static constexpr int kQBlocks = 1;
  static I qload(const std::int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I q8w(const std::uint8_t* p, std::int64_t) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static I q4w(const std::uint8_t* p, std::int64_t) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
  }
  static I sub_i8(I a, int c) { return _mm256_sub_epi8(a, _mm256_set1_epi8(static_cast<char>(c))); }
  static I abs_i8(I a) { return _mm256_abs_epi8(a); }
  static I sign_i8(I x, I w) { return _mm256_sign_epi8(x, w); }
  static I dot_u8i8(I u, I s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)); }
  static F scales(const float* s) { return _mm256_set1_ps(s[0]); }
  using M = __m128;  // lane 1 accumulates m·s
  static M mzero() { return _mm_setzero_ps(); }
  static float msum(M m) { return _mm_cvtss_f32(_mm_shuffle_ps(m, m, 1)); }
  static F scales_min(const std::uint8_t* p, std::int64_t, const float* xd, const float* xs, M& acc) {
    int dm;
    memcpy(&dm, p, 4);
    const __m128 t = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dm)), _mm_unpacklo_ps(_mm_load_ss(xd), _mm_load_ss(xs)));
    acc = _mm_add_ps(acc, t);
    return _mm256_broadcastss_ps(t);
  }
};

constexpr KernelTable kTable = simd::make_table<V>();

}  // namespace
}  // namespace numattn::qkern

// Outside the pragma: runs on any CPU.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace numattn::qkern {
const KernelTable* avx2_table() { return &kTable; }
}  // namespace numattn::qkern

#else
namespace numattn::qkern {
const KernelTable* avx2_table() { return nullptr; }
}  // namespace numattn::qkern
#endif
