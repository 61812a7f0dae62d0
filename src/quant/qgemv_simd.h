// Internal: the vector kernels of quant_gemv written once, instantiated per instruction set.
//
// qgemv_avx2.cpp and qgemv_avx512.cpp each include this file after their target pragma and
// define a lane traits struct V (8 or 16 float lanes) in an unnamed namespace. Every
// instantiation takes that V, a type with internal linkage, so it has internal linkage too:
// the linker can never hand an AVX-512 instantiation to a caller of the AVX2 table (see
// qgemv_kernels.h). This file includes nothing; it relies on <cstdint> and on V:
//   kLanes; F (float vector), I (int32 vector); zero(), load(const float*), store, add, mul,
//   fmadd(a, b, c) = a·b + c, set1(float), hsum(F); cvt(I) -> F; u8(p) / s8(p): kLanes bytes
//   zero- / sign-extended to int32 lanes; band(I, int), bor, srl<n>, sll<n>, isub(I, int);
//   f16(p) / bf16(p): kLanes halves -> F; half(p): one fp16 -> float; halves2(p, a, b): the
//   two fp16 at p and p + 2 in every lane of a and b (reads exactly the 4 bytes at p);
//   or16(I q, bits): q | 16 in the lanes i whose bit i of `bits` is set (the fifth bit of a
//   5-bit quant); join8(F a, F b): lanes 0-7 of a, the lanes from 8 on of b (a itself for 8
//   lanes). A
//   block's d and m with one load and one conversion: GCC 12's AVX2 Q4_1 loop then takes 23
//   instructions per block and row instead of 29, and bench_qgemv's in-cache Q4_1 row ran
//   5–10% more GB/s on Zen 3 (three interleaved runs).
// The integer kernels (8-bit activations) use a byte vector of kQBlocks = kLanes/8 blocks of
// 32 in an I: qload(const int8_t*) (kQBlocks·32 bytes), q8w(p, stride) (kQBlocks runs of 32
// bytes, stride bytes apart), q4w(p, stride) (kQBlocks runs of 16 bytes of nibbles, each
// unpacked to 32 bytes: low nibbles, then high), sub_i8(I, int), abs_i8, sign_i8(x, w) (x
// negated where w < 0), dot_u8i8(u, s) (int32 lanes, lane i = Σ of bytes 4i..4i+3 of u·s,
// u unsigned, s signed, no saturation for |u·s| <= 16256), scales(const float*) (kQBlocks
// floats, each over 8 lanes), and for Q4_1 scales_min(p, stride, xd, xs, M& m): the kQBlocks
// blocks' fp16 (d, m) pairs at p converted at once, d·xd as scales() gives it, m·xs added to
// m (type M, mzero(), msum(M) -> float). The portable path instantiates only q8_rows_scalar, with a V
// that has half() alone.
//
// Why several rows at a time: one row of SmolLM2's matrices has only 18–48 blocks, and one
// row's sum is a chain of dependent FMAs (4 cycles each), so a one-row kernel waits on FMA
// latency and pays a horizontal sum every 576 values. Four rows share each load of x and keep
// eight independent accumulators in flight (docs/model-runner.md has the measurements: about
// 1.2× one-thread decode on SmolLM2 Q4_1, with the prefetch below).
#pragma once

namespace numattn::qkern::simd {

// One encoding: kElems values in kBytes bytes per block, and `block(p, x, acc)` adding the
// block's Σ w_j·x_j into acc[0] and acc[1] (two chains per row). Float encodings treat
// 2·kLanes values as a block and finish a row's last cols % kElems values in scalar code
// (their `value(row, j)`).

// One fp16 at p in every lane (reads the 4 bytes at p: only where they lie inside a block).
template <class V>
typename V::F half_lanes(const std::uint8_t* p) {
  typename V::F a, b;
  V::halves2(p, a, b);
  return a;
}

// Q8_0: fp16 d, int8 q[32]; d·Σ q·x (d·q is exact in float32, so factoring d out of a block
// only rescales the block's rounded sum).
template <class V>
struct Q8_0 {
  static constexpr std::int64_t kElems = 32, kBytes = 34;
  static void block(const std::uint8_t* p, const float* x, typename V::F* acc) {
    constexpr int kVec = 32 / V::kLanes;
    typename V::F t[2] = {V::zero(), V::zero()};
    for (int k = 0; k < kVec; ++k)
      t[k & 1] = V::fmadd(V::cvt(V::s8(p + 2 + k * V::kLanes)), V::load(x + k * V::kLanes), t[k & 1]);
    const typename V::F d = half_lanes<V>(p);  // d and the first two quants: inside the block
    acc[0] = V::fmadd(d, t[0], acc[0]);
    acc[1] = V::fmadd(d, t[1], acc[1]);
  }
};

// Q4_0 (fp16 d, 16 bytes of nibbles: w = (q − 8)·d) and Q4_1 (fp16 d, fp16 m: w = q·d + m in
// one FMA), low nibbles = elements 0..15, high = 16..31. Each value is rebuilt as
// dequantize_row does and then multiplied by x. Factoring d and m out of the block
// (d·Σqx + m·Σx) would save an operation but lets the two sums cancel, giving errors relative
// to |m|·Σ|x| instead of Σ|w·x|.
template <class V, bool kMin>
struct Q4 {
  static constexpr std::int64_t kElems = 32, kBytes = kMin ? 20 : 18;
  static void block(const std::uint8_t* p, const float* x, typename V::F* acc) {
    constexpr int kQs = kMin ? 4 : 2, kVec = 16 / V::kLanes;
    // Q4_0's (q − 8)·d as q·d + (−8·d) in one FMA: (q − 8)·d has at most 15 significant bits,
    // so both are exact and equal, and the two integer subtractions are saved. (Only an
    // infinite d differs: the block's terms become NaN, where dequantize_row gives ±Inf and
    // NaN; the product is non-finite either way.)
    typename V::F d, m;
    V::halves2(p, d, m);  // Q4_0: d and two bytes of nibbles
    if constexpr (!kMin) m = V::mul(d, V::set1(-8.f));
    for (int k = 0; k < kVec; ++k) {
      const typename V::I v = V::u8(p + kQs + k * V::kLanes);
      const typename V::I lo = V::band(v, 15), hi = V::template srl<4>(v);
      const typename V::F wl = V::fmadd(V::cvt(lo), d, m);
      const typename V::F wh = V::fmadd(V::cvt(hi), d, m);
      acc[0] = V::fmadd(wl, V::load(x + k * V::kLanes), acc[0]);
      acc[1] = V::fmadd(wh, V::load(x + 16 + k * V::kLanes), acc[1]);
    }
  }
};

// Q6_K: super-blocks of 256 (ql[128], qh[64], int8 scales[16], fp16 d). In each half of 128
// values, element l (0..31) of the four 32-runs takes its low 4 bits from ql[l] / ql[l+32]
// (low, low, high, high nibble) and its top 2 bits from qh[l] bits 0-1, 2-3, 4-5, 6-7; every
// 16 values share one scale. Lanes are consecutive l (8 or 16 of them), so each vector has
// one scale.
template <class V>
struct Q6_K {
  static constexpr std::int64_t kElems = 256, kBytes = 210;
  static void block(const std::uint8_t* p, const float* x, typename V::F* acc) {
    const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
    const float d = V::half(p + 208);
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* ql = p + 64 * h;
      const std::uint8_t* qh = p + 128 + 32 * h;
      const std::int8_t* s = sc + 8 * h;
      const float* xh = x + 128 * h;
      for (int l0 = 0; l0 < 32; l0 += V::kLanes) {
        const typename V::I a = V::u8(ql + l0), e = V::u8(ql + 32 + l0), hb = V::u8(qh + l0);
        const typename V::I q[4] = {
            V::bor(V::band(a, 15), V::template sll<4>(V::band(hb, 3))),
            V::bor(V::band(e, 15), V::template sll<4>(V::band(V::template srl<2>(hb), 3))),
            V::bor(V::template srl<4>(a), V::template sll<4>(V::band(V::template srl<4>(hb), 3))),
            V::bor(V::template srl<4>(e), V::template sll<4>(V::template srl<6>(hb)))};
        for (int k = 0; k < 4; ++k) {
          const typename V::F t = V::mul(V::cvt(V::isub(q[k], 32)), V::load(xh + 32 * k + l0));
          acc[k & 1] = V::fmadd(V::set1(d * static_cast<float>(s[2 * k + l0 / 16])), t, acc[k & 1]);
        }
      }
    }
  }
};

// Q5_0 (fp16 d, u32 qh, 16 bytes of nibbles: w = (q − 16)·d) and Q5_1 (fp16 d, m, qh, nibbles:
// w = q·d + m), q = nibble | bit j of qh << 4 for element j. Each value rebuilt as
// dequantize_row gives it and then multiplied by x, as Q4 does; Q5_0's (q − 16)·d as q·d +
// (−16·d): both exact (16 significant bits at most), so equal but for the sign of a zero.
template <class V, bool kMin>
struct Q5 {
  static constexpr std::int64_t kElems = 32, kBytes = kMin ? 24 : 22;
  static void block(const std::uint8_t* p, const float* x, typename V::F* acc) {
    constexpr int kQh = kMin ? 4 : 2, kVec = 16 / V::kLanes;
    typename V::F d, m;
    V::halves2(p, d, m);  // Q5_0: d and two bytes of qh
    if constexpr (!kMin) m = V::mul(d, V::set1(-16.f));
    std::uint32_t qh;
    __builtin_memcpy(&qh, p + kQh, 4);
    for (int k = 0; k < kVec; ++k) {
      const typename V::I v = V::u8(p + kQh + 4 + k * V::kLanes);
      const typename V::I lo = V::or16(V::band(v, 15), qh >> (k * V::kLanes));
      const typename V::I hi = V::or16(V::template srl<4>(v), qh >> (16 + k * V::kLanes));
      acc[0] = V::fmadd(V::fmadd(V::cvt(lo), d, m), V::load(x + k * V::kLanes), acc[0]);
      acc[1] = V::fmadd(V::fmadd(V::cvt(hi), d, m), V::load(x + 16 + k * V::kLanes), acc[1]);
    }
  }
};

// Q4_K / Q5_K: the 16 floats d·sc_s (s = 0..7) and −dmin·m_s of a super-block at p, into out.
// The 6-bit fields are unpacked four at a time from the three little-endian words of scales[12]
// (quant.h): sc_0..3 and m_0..3 are the low 6 bits of words 0 and 1; sc_4..7 / m_4..7 take
// their low 4 bits from the low / high nibbles of word 2 and bits 4-5 from the top 2 bits of
// each byte of word 0 / 1. d·sc and dmin·m are exact (at most 17 significant bits).
// Always inlined: GCC 12 otherwise calls it out of line from the four-row kernels, which then
// pass through vzeroupper and spill their accumulators once per block and row.
template <class V>
[[gnu::always_inline]] inline void k_scales(const std::uint8_t* p, float* out) {
  std::uint32_t w[3];
  __builtin_memcpy(w, p + 4, 12);
  const std::uint32_t b[4] = {w[0] & 0x3f3f3f3fu, (w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u),
                              w[1] & 0x3f3f3f3fu, ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u)};
  std::uint8_t bytes[16];
  __builtin_memcpy(bytes, b, 16);
  typename V::F d, dmin;
  V::halves2(p, d, dmin);
  const typename V::F nm = V::mul(dmin, V::set1(-1.f));
  for (int k = 0; k < 16; k += V::kLanes)
    V::store(out + k, V::mul(V::cvt(V::u8(bytes + k)), k == 0 ? V::join8(d, nm) : nm));
  // The kernels broadcast out[s] as loads from memory after this (one load each); without it,
  // GCC 12 builds each broadcast from the vector register (two shuffles on AVX2) and ran the
  // Q4_K and Q5_K decode kernels 5–9% slower in bench_qgemv (three interleaved runs each).
  asm("" : "+m"(*reinterpret_cast<float(*)[16]>(out)));
}

// The fifth bit of sub-block s (0..7) of Q5_K, bit s of each qh byte in hb, as 16 or 0.
template <class V, int kS>
typename V::I k_bit(typename V::I hb) {
  if constexpr (kS <= 4) {
    return V::band(V::template sll<4 - kS>(hb), 16);
  } else {
    return V::band(V::template srl<kS - 4>(hb), 16);
  }
}

// Q4_K (kHigh false) and Q5_K (true): super-blocks of 256, eight sub-blocks of 32 with their own
// scale and min (quant.h); w = d·sc·q − dmin·m in one FMA (d·sc·q is exact, so this is
// dequantize_row's value), then multiplied by x. Lanes are consecutive elements of a sub-block.
// values(p, sd, use) calls use(j, chain, w) for the kLanes values from element j on (chain:
// 0 for the even sub-blocks, 1 for the odd ones), sd being k_scales of the block.
template <class V, bool kHigh>
struct QK {
  static constexpr std::int64_t kElems = 256, kBytes = kHigh ? 176 : 144;
  static constexpr int kQs = kHigh ? 48 : 16;
  template <int kI, class Use>
  [[gnu::always_inline]] static void pair(const std::uint8_t* p, const float* sd, Use& use) {
    const typename V::F d0 = V::set1(sd[2 * kI]), m0 = V::set1(sd[8 + 2 * kI]);
    const typename V::F d1 = V::set1(sd[2 * kI + 1]), m1 = V::set1(sd[9 + 2 * kI]);
    for (int l0 = 0; l0 < 32; l0 += V::kLanes) {
      const typename V::I v = V::u8(p + kQs + 32 * kI + l0);
      typename V::I lo = V::band(v, 15), hi = V::template srl<4>(v);
      if constexpr (kHigh) {
        const typename V::I hb = V::u8(p + 16 + l0);
        lo = V::bor(lo, k_bit<V, 2 * kI>(hb));
        hi = V::bor(hi, k_bit<V, 2 * kI + 1>(hb));
      }
      use(64 * kI + l0, 0, V::fmadd(V::cvt(lo), d0, m0));
      use(64 * kI + 32 + l0, 1, V::fmadd(V::cvt(hi), d1, m1));
    }
  }
  template <class Use>
  [[gnu::always_inline]] static void values(const std::uint8_t* p, const float* sd, Use use) {
    pair<0>(p, sd, use);
    pair<1>(p, sd, use);
    pair<2>(p, sd, use);
    pair<3>(p, sd, use);
  }
  // Always inlined (as k_scales): GCC 12 calls Q5_K's out of line from the four-row kernel.
  [[gnu::always_inline]] static void block(const std::uint8_t* p, const float* x, typename V::F* acc) {
    alignas(64) float sd[16];
    k_scales<V>(p, sd);
    values(p, sd, [&](int j, int c, typename V::F w) { acc[c] = V::fmadd(w, V::load(x + j), acc[c]); });
  }
};

// Float encodings: blocks of 2·kLanes values, the rest of the row in `tail`.
template <class V>
struct F32 {
  static constexpr std::int64_t kElems = 2 * V::kLanes, kBytes = 4 * kElems;
  static void block(const std::uint8_t* p, const float* x, typename V::F* acc) {
    const auto* w = reinterpret_cast<const float*>(p);
    acc[0] = V::fmadd(V::load(w), V::load(x), acc[0]);
    acc[1] = V::fmadd(V::load(w + V::kLanes), V::load(x + V::kLanes), acc[1]);
  }
  static float value(const std::uint8_t* row, std::int64_t j) {
    return reinterpret_cast<const float*>(row)[j];
  }
};

template <class V>
struct F16 {
  static constexpr std::int64_t kElems = 2 * V::kLanes, kBytes = 2 * kElems;
  static void block(const std::uint8_t* p, const float* x, typename V::F* acc) {
    acc[0] = V::fmadd(V::f16(p), V::load(x), acc[0]);
    acc[1] = V::fmadd(V::f16(p + 2 * V::kLanes), V::load(x + V::kLanes), acc[1]);
  }
  static float value(const std::uint8_t* row, std::int64_t j) { return V::half(row + 2 * j); }
};

template <class V>
struct BF16 {
  static constexpr std::int64_t kElems = 2 * V::kLanes, kBytes = 2 * kElems;
  static void block(const std::uint8_t* p, const float* x, typename V::F* acc) {
    acc[0] = V::fmadd(V::bf16(p), V::load(x), acc[0]);
    acc[1] = V::fmadd(V::bf16(p + 2 * V::kLanes), V::load(x + V::kLanes), acc[1]);
  }
  static float value(const std::uint8_t* row, std::int64_t j) {
    const std::uint32_t u = static_cast<std::uint32_t>(row[2 * j] | (row[2 * j + 1] << 8)) << 16;
    float w;
    __builtin_memcpy(&w, &u, 4);
    return w;
  }
};

template <class K>
concept HasTail = requires(const std::uint8_t* r) { K::value(r, 0); };

// kR rows (row, row + row_bytes, ...) times x: out[i] = (out[i] if accumulate) + Σ. While it
// reads them, it prefetches the `pf_bytes` bytes at `pf` (the rows after them), spread over
// its blocks: four rows are four interleaved streams, which the hardware prefetcher follows
// worse than one (measured: the 30 MB Q8_0 output matrix read at half the one-row kernel's
// speed without this).
template <class V, class K, int kR>
void rows_kernel(const std::uint8_t* row, std::int64_t row_bytes, const float* x, std::int64_t cols,
                 float* out, bool accumulate, const std::uint8_t* pf = nullptr,
                 std::int64_t pf_bytes = 0) {
  typename V::F acc[kR][2];
  for (auto& a : acc) a[0] = a[1] = V::zero();
  const std::int64_t nb = cols / K::kElems;
  const std::int64_t pf_step = nb > 0 ? (pf_bytes / nb + 63) / 64 * 64 : 0;
  for (std::int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * K::kElems;
    for (std::int64_t o = b * pf_step; o < (b + 1) * pf_step && o < pf_bytes; o += 64)
      __builtin_prefetch(pf + o, 0, 0);
    for (int r = 0; r < kR; ++r) K::block(row + r * row_bytes + b * K::kBytes, xb, acc[r]);
  }
  for (int r = 0; r < kR; ++r) {
    float s = V::hsum(V::add(acc[r][0], acc[r][1]));
    if constexpr (HasTail<K>) {
      for (std::int64_t j = nb * K::kElems; j < cols; ++j) s += K::value(row + r * row_bytes, j) * x[j];
    }
    out[r] = accumulate ? out[r] + s : s;
  }
}

// A row count as a type (a tag: no code).
template <int kN>
struct RowCount {
  static constexpr int value = kN;
};

// `rows` consecutive rows in groups of four (each prefetching the group kPfGroups ahead), the
// rest one at a time: run(RowCount<kR>, first row, prefetch start, bytes).
template <class Run>
void in_row_groups(const std::uint8_t* row, std::int64_t row_bytes, std::int64_t rows, Run run) {
  constexpr std::int64_t kPfGroups = 2;
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const std::int64_t left = rows - r - 4 * kPfGroups, ahead = left < 4 ? left : 4;
    run(RowCount<4>{}, r, ahead > 0 ? row + (r + 4 * kPfGroups) * row_bytes : nullptr,
        ahead > 0 ? ahead * row_bytes : 0);
  }
  for (; r < rows; ++r) run(RowCount<1>{}, r, nullptr, 0);
}

template <class V, class K>
void rows_dot(const std::uint8_t* row, std::int64_t row_bytes, std::int64_t rows, const float* x,
              std::int64_t cols, float* out, bool accumulate) {
  in_row_groups(row, row_bytes, rows, [&](auto kr, std::int64_t r, const std::uint8_t* pf, std::int64_t pfb) {
    rows_kernel<V, K, decltype(kr)::value>(row + r * row_bytes, row_bytes, x, cols, out + r, accumulate, pf, pfb);
  });
}

// Σ a·b with two chains, the rest scalar (the generic kernel's dot product).
template <class V>
float dot_f32(const float* a, const float* b, std::int64_t n) {
  float s = 0;
  rows_kernel<V, F32<V>, 1>(reinterpret_cast<const std::uint8_t*>(a), 0, b, n, &s, false);
  return s;
}

// Prefill panels: values as dequantize_row gives them (q·d + m in one rounding for Q4_1).
// The blocks come from the mapped file, cold at every forward pass (the file is larger than
// the cache), and the hardware prefetcher restarts at each 4 KiB page: prefetching one page
// ahead measured the output matrix's panels (Q8_0, 28 M weights, 4 MiB tiles, one thread)
// at ≈ 8.5–9.5 ms per pass against 10–12 ms without or 256 bytes ahead (docs/model-runner.md).
constexpr std::int64_t kDeqAhead = 4096;

template <class V>
void deq_q8_0(const std::uint8_t* row, float* dst, std::int64_t cols) {
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const std::uint8_t* p = row + b * 34;
    __builtin_prefetch(p + kDeqAhead, 0, 3);
    const typename V::F d = half_lanes<V>(p);
    for (int k = 0; k < 32; k += V::kLanes) V::store(dst + 32 * b + k, V::mul(V::cvt(V::s8(p + 2 + k)), d));
  }
}

template <class V>
void deq_q4_1(const std::uint8_t* row, float* dst, std::int64_t cols) {
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const std::uint8_t* p = row + b * 20;
    __builtin_prefetch(p + kDeqAhead, 0, 3);
    typename V::F d, m;
    V::halves2(p, d, m);
    for (int k = 0; k < 16; k += V::kLanes) {
      const typename V::I v = V::u8(p + 4 + k);
      V::store(dst + 32 * b + k, V::fmadd(V::cvt(V::band(v, 15)), d, m));
      V::store(dst + 32 * b + 16 + k, V::fmadd(V::cvt(V::template srl<4>(v)), d, m));
    }
  }
}

// The blocks of the larger encodings span several cache lines: each block prefetches all of its
// lines one page ahead.
template <std::int64_t kBytes>
void prefetch_block_ahead(const std::uint8_t* p) {
  for (std::int64_t o = 0; o < kBytes; o += 64) __builtin_prefetch(p + kDeqAhead + o, 0, 3);
}

// Q5_0: (q − 16)·d, the integer subtraction first as dequantize_row does it (the sign of a zero
// value is d's, bit for bit).
template <class V>
void deq_q5_0(const std::uint8_t* row, float* dst, std::int64_t cols) {
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const std::uint8_t* p = row + b * 22;
    __builtin_prefetch(p + kDeqAhead, 0, 3);
    const typename V::F d = half_lanes<V>(p);
    std::uint32_t qh;
    __builtin_memcpy(&qh, p + 2, 4);
    for (int k = 0; k < 16; k += V::kLanes) {
      const typename V::I v = V::u8(p + 6 + k);
      const typename V::I lo = V::or16(V::band(v, 15), qh >> k);
      const typename V::I hi = V::or16(V::template srl<4>(v), qh >> (16 + k));
      V::store(dst + 32 * b + k, V::mul(V::cvt(V::isub(lo, 16)), d));
      V::store(dst + 32 * b + 16 + k, V::mul(V::cvt(V::isub(hi, 16)), d));
    }
  }
}

// Q4_K / Q5_K: QK's values (d·sc·q − dmin·m in one FMA: dequantize_row's value), stored.
template <class V, bool kHigh>
void deq_qk(const std::uint8_t* row, float* dst, std::int64_t cols) {
  using K = QK<V, kHigh>;
  for (std::int64_t b = 0; b < cols / 256; ++b) {
    const std::uint8_t* p = row + b * K::kBytes;
    prefetch_block_ahead<K::kBytes>(p);
    alignas(64) float sd[16];
    k_scales<V>(p, sd);
    float* y = dst + 256 * b;
    K::values(p, sd, [&](int j, int, typename V::F w) { V::store(y + j, w); });
  }
}

// Q6_K: (d·sc)·(q − 32), as dequantize_row (every product exact).
template <class V>
void deq_q6_k(const std::uint8_t* row, float* dst, std::int64_t cols) {
  for (std::int64_t b = 0; b < cols / 256; ++b) {
    const std::uint8_t* p = row + b * 210;
    prefetch_block_ahead<210>(p);
    alignas(64) float sd[16];
    const typename V::F d = V::set1(V::half(p + 208));
    for (int k = 0; k < 16; k += V::kLanes) V::store(sd + k, V::mul(V::cvt(V::s8(p + 192 + k)), d));
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* ql = p + 64 * h;
      const std::uint8_t* qh = p + 128 + 32 * h;
      float* y = dst + 256 * b + 128 * h;
      for (int l0 = 0; l0 < 32; l0 += V::kLanes) {
        const typename V::I a = V::u8(ql + l0), e = V::u8(ql + 32 + l0), hb = V::u8(qh + l0);
        const typename V::I q[4] = {
            V::bor(V::band(a, 15), V::template sll<4>(V::band(hb, 3))),
            V::bor(V::band(e, 15), V::template sll<4>(V::band(V::template srl<2>(hb), 3))),
            V::bor(V::template srl<4>(a), V::template sll<4>(V::band(V::template srl<4>(hb), 3))),
            V::bor(V::template srl<4>(e), V::template sll<4>(V::template srl<6>(hb)))};
        for (int k = 0; k < 4; ++k)
          V::store(y + 32 * k + l0, V::mul(V::cvt(V::isub(q[k], 32)), V::set1(sd[8 * h + 2 * k + l0 / 16])));
      }
    }
  }
}

// ---- integer kernels: rows against ActivationsQ8 --------------------------------------------
//
// The scalar block sums below write every term as an unsigned byte times a signed byte, never
// as signed × signed int8. GCC 12.2, with AVX-512 VNNI or AVX-VNNI enabled (-march=native on
// such a CPU, or a VNNI target pragma), vectorises a plain `Σ int8(w)·int8(x)` loop into
// vpdpbusd, which reads its first operand as UNSIGNED: every negative w then counts as w + 256
// (32 terms of (−1)·1 sum to 8160). `tests/core/compiler_check` compiles that pattern with the
// project's flags and fails where the toolchain does this. An unsigned × signed loop is exactly
// what vpdpbusd computes, so whatever the vectoriser makes of the forms here is exact. Do not
// "simplify" them back to signed × signed.

// Σ_{j<kN} w_j·x_j for signed bytes w (any value) and x (|x_j| <= 127, ActivationsQ8's range):
// each term as |w_j| · (sign(w_j)·x_j), |w_j| <= 128 unsigned and −x_j a valid int8.
template <class V, int kN>
int dot_s8_s8(const std::int8_t* w, const std::int8_t* x) {
  int s = 0;
  for (int j = 0; j < kN; ++j) {
    const int wj = w[j];
    const auto a = static_cast<std::uint8_t>(wj < 0 ? -wj : wj);
    const auto b = static_cast<std::int8_t>(wj < 0 ? -x[j] : x[j]);
    s += a * b;
  }
  return s;
}

// Σ_{j<16} (lo_j·x_j + hi_j·x_{16+j}) for the 4-bit quants of 16 bytes of nibbles (lo = low
// nibbles, elements 0..15; hi = high, 16..31): unsigned quants (0..15) times signed bytes.
template <class V>
int dot_u4_s8(const std::uint8_t* q, const std::int8_t* x) {
  int s = 0;
  for (int j = 0; j < 16; ++j) {
    const auto lo = static_cast<std::uint8_t>(q[j] & 15), hi = static_cast<std::uint8_t>(q[j] >> 4);
    s += lo * x[j] + hi * x[16 + j];
  }
  return s;
}

// Σ_{j<32} x_j (for Q4_0's offset: Σ (q − 8)·x = Σ q·x − 8·Σ x, exact in int).
template <class V>
int sum_s8(const std::int8_t* x) {
  int s = 0;
  for (int j = 0; j < 32; ++j) s += x[j];
  return s;
}
//
// Per block of 32 the exact integer Σ q_w·q_x (vpmaddubsw takes one unsigned operand: a signed
// weight w goes in as |w| with x's sign flipped where w < 0; pairs of products stay below
// 2·128·127 < 2^15, so nothing saturates), converted to float lanes (exact: below 2^24) and
// scaled by d_w·d_x in one FMA. Q4_1 adds m_w·s_x per block (s_x = d_x·Σq_x): the min term
// needs no per-value work. K provides kBytes, kQs (offset of the quants in a block), kMin,
// dot(p, x) (int32 lanes of V::kQBlocks blocks at p, block stride kBytes) and scalar(p, x)
// (one block's Σ q_w·q_x in int).
template <class V>
struct Q8_0x8 {
  static constexpr std::int64_t kBytes = 34;
  static constexpr bool kMin = false;
  static typename V::I dot(const std::uint8_t* p, typename V::I x) {
    const typename V::I w = V::q8w(p + 2, kBytes);
    return V::dot_u8i8(V::abs_i8(w), V::sign_i8(x, w));
  }
  static int scalar(const std::uint8_t* p, const std::int8_t* x) {
    return dot_s8_s8<V, 32>(reinterpret_cast<const std::int8_t*>(p + 2), x);
  }
};

// Q4_0 (quants q − 8, signed: the Q8_0 sign trick) and Q4_1 (quants q in 0..15, unsigned).
template <class V, bool kMinTerm>
struct Q4x8 {
  static constexpr std::int64_t kBytes = kMinTerm ? 20 : 18;
  static constexpr bool kMin = kMinTerm;
  static constexpr int kQs = kMin ? 4 : 2, kOff = kMin ? 0 : 8;
  static typename V::I dot(const std::uint8_t* p, typename V::I x) {
    const typename V::I u = V::q4w(p + kQs, kBytes);
    if constexpr (kMin) {
      return V::dot_u8i8(u, x);
    } else {
      const typename V::I w = V::sub_i8(u, 8);
      return V::dot_u8i8(V::abs_i8(w), V::sign_i8(x, w));
    }
  }
  static int scalar(const std::uint8_t* p, const std::int8_t* x) {
    const int s = dot_u4_s8<V>(p + kQs, x);
    return kOff == 0 ? s : s - kOff * sum_s8<V>(x);
  }
};

// One block's d_w·d_x·Σq_w·q_x (+ m_w·s_x): the scalar form of a step, for the portable path
// and for a row's last blocks when they do not fill a step.
template <class V, class K>
float q8_block_scalar(const std::uint8_t* p, const std::int8_t* xq, float xd, float xs) {
  float t = V::half(p) * xd * static_cast<float>(K::scalar(p, xq));
  if constexpr (K::kMin) t += V::half(p + 2) * xs;
  return t;
}

template <class V, class K>
void q8_rows_scalar(const std::uint8_t* row, std::int64_t row_bytes, std::int64_t rows,
                    const std::int8_t* xq, const float* xd, const float* xs, std::int64_t cols,
                    float* out, bool accumulate) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float s = 0;
    for (std::int64_t b = 0; b < cols / 32; ++b)
      s += q8_block_scalar<V, K>(row + r * row_bytes + b * K::kBytes, xq + 32 * b, xd[b], xs[b]);
    out[r] = accumulate ? out[r] + s : s;
  }
}

// kR rows (one accumulator each: the integer ops, not the FMA latency, bound a step), with the
// prefetch of rows_kernel.
template <class V, class K, int kR>
void q8_rows_kernel(const std::uint8_t* row, std::int64_t row_bytes, const std::int8_t* xq,
                    const float* xd, const float* xs, std::int64_t cols, float* out, bool accumulate,
                    const std::uint8_t* pf = nullptr, std::int64_t pf_bytes = 0) {
  constexpr int kQB = V::kQBlocks;
  typename V::F acc[kR];
  typename V::M mins[kR];  // the Q4_1 min terms m_w·s_x, summed by V::msum
  for (int r = 0; r < kR; ++r) {
    acc[r] = V::zero();
    mins[r] = V::mzero();
  }
  const std::int64_t nb = cols / 32, steps = nb / kQB;
  const std::int64_t pf_step = steps > 0 ? (pf_bytes / steps + 63) / 64 * 64 : 0;
  for (std::int64_t t = 0; t < steps; ++t) {
    for (std::int64_t o = t * pf_step; o < (t + 1) * pf_step && o < pf_bytes; o += 64)
      __builtin_prefetch(pf + o, 0, 0);
    const std::int64_t b0 = t * kQB;
    const typename V::I xv = V::qload(xq + 32 * b0);
    for (int r = 0; r < kR; ++r) {
      const std::uint8_t* p = row + r * row_bytes + b0 * K::kBytes;
      if constexpr (K::kMin) {
        acc[r] = V::fmadd(V::cvt(K::dot(p, xv)), V::scales_min(p, K::kBytes, xd + b0, xs + b0, mins[r]), acc[r]);
      } else {
        float sc[kQB];
        for (int k = 0; k < kQB; ++k) sc[k] = V::half(p + k * K::kBytes) * xd[b0 + k];
        acc[r] = V::fmadd(V::cvt(K::dot(p, xv)), V::scales(sc), acc[r]);
      }
    }
  }
  for (int r = 0; r < kR; ++r) {
    float s = V::hsum(acc[r]) + V::msum(mins[r]);
    for (std::int64_t b = steps * kQB; b < nb; ++b)
      s += q8_block_scalar<V, K>(row + r * row_bytes + b * K::kBytes, xq + 32 * b, xd[b], xs[b]);
    out[r] = accumulate ? out[r] + s : s;
  }
}

template <class V, class K>
void q8_rows_dot(const std::uint8_t* row, std::int64_t row_bytes, std::int64_t rows,
                 const std::int8_t* xq, const float* xd, const float* xs, std::int64_t cols,
                 float* out, bool accumulate) {
  in_row_groups(row, row_bytes, rows, [&](auto kr, std::int64_t r, const std::uint8_t* pf, std::int64_t pfb) {
    q8_rows_kernel<V, K, decltype(kr)::value>(row + r * row_bytes, row_bytes, xq, xd, xs, cols, out + r,
                                              accumulate, pf, pfb);
  });
}

// The table of one path.
// constexpr: the getter outside the target pragma returns a constant-initialised table, so no
// code compiled for the path runs before the CPU was checked.
template <class V>
constexpr KernelTable make_table() {
  KernelTable t;
  t.dot_f32 = dot_f32<V>;
  t.f32 = rows_dot<V, F32<V>>;
  t.f16 = rows_dot<V, F16<V>>;
  t.bf16 = rows_dot<V, BF16<V>>;
  t.q8_0 = rows_dot<V, Q8_0<V>>;
  t.q4_0 = rows_dot<V, Q4<V, false>>;
  t.q4_1 = rows_dot<V, Q4<V, true>>;
  t.q6_k = rows_dot<V, Q6_K<V>>;
  t.q4_k = rows_dot<V, QK<V, false>>;
  t.q5_k = rows_dot<V, QK<V, true>>;
  t.q5_0 = rows_dot<V, Q5<V, false>>;
  t.q5_1 = rows_dot<V, Q5<V, true>>;
  t.deq_q8_0 = deq_q8_0<V>;
  t.deq_q4_1 = deq_q4_1<V>;
  t.deq_q5_0 = deq_q5_0<V>;
  t.deq_q4_k = deq_qk<V, false>;
  t.deq_q5_k = deq_qk<V, true>;
  t.deq_q6_k = deq_q6_k<V>;
  t.q8_0_q8 = q8_rows_dot<V, Q8_0x8<V>>;
  t.q4_0_q8 = q8_rows_dot<V, Q4x8<V, false>>;
  t.q4_1_q8 = q8_rows_dot<V, Q4x8<V, true>>;
  return t;
}

}  // namespace numattn::qkern::simd
