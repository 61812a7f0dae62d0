/// @file quant.h
/// ggml block formats: dequantization to float32 and (for a few types) quantization.
///
/// Block layouts (ggml-common.h; element j of a block, fp16 = IEEE binary16, little-endian):
/// | type | elems | bytes | layout | value |
/// |---|---|---|---|---|
/// | F32/F16/BF16 | 1 | 4/2/2 | — | BF16 = top 16 bits of an f32 |
/// | Q4_0 | 32 | 18 | fp16 d; u8 qs[16] | j<16: ((qs[j]&15)-8)·d; j>=16: ((qs[j-16]>>4)-8)·d |
/// | Q4_1 | 32 | 20 | fp16 d, m; u8 qs[16] | (nibble as in Q4_0)·d + m |
/// | Q5_0 | 32 | 22 | fp16 d; u8 qh[4]; u8 qs[16] | (nibble \| bit_j(qh)<<4) − 16, times d |
/// | Q5_1 | 32 | 24 | fp16 d, m; u8 qh[4]; u8 qs[16] | (nibble \| bit_j(qh)<<4)·d + m |
/// | Q8_0 | 32 | 34 | fp16 d; i8 qs[32] | qs[j]·d |
/// | Q4_K | 256 | 144 | fp16 d, dmin; u8 scales[12]; u8 qs[128] | 8 sub-blocks of 32 with 6-bit scale/min: d·sc·q − dmin·m |
/// | Q5_K | 256 | 176 | fp16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] | as Q4_K with q = nibble \| (bit s of qh[l])<<4 |
/// | Q6_K | 256 | 210 | u8 ql[128]; u8 qh[64]; i8 scales[16]; fp16 d | d·scales[s]·(q6 − 32) |
/// Low nibbles are elements 0..15 of a 32-block and high nibbles 16..31 (not interleaved).
/// Q4_K / Q5_K: each 64 values (sub-blocks 2i, 2i+1) share 32 bytes of qs, low nibbles for 2i and
/// high for 2i+1; element l (0..31) of sub-block s has scale/min sc_s, m_s (6 bits each: s < 4
/// in the low 6 bits of scales[s] / scales[s+4]; s >= 4 in the nibbles of scales[s+4] with the
/// top 2 bits of scales[s−4] / scales[s]) and, for Q5_K, its fifth bit in bit s of qh[l].
/// Q6_K: in half h of 128 values (ql, qh, scales from ql + 64h, qh + 32h, scales + 8h),
/// element l of the 32-runs k = 0..3 has low 4 bits from
/// ql[l] (k = 0, 2: low, high nibble) or ql[l+32] (k = 1, 3), top 2 bits from qh[l] bits 2k..2k+1,
/// and scale scales[l/16 + 2k].
///
/// All functions take element counts that must be multiples of the block size and throw
/// numattn::Error otherwise or for a type they do not support.
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/quant/ggml_types.h"

namespace numattn {

/// IEEE half <-> float (round-to-nearest-even; overflow gives ±inf, NaN stays NaN).
float fp16_to_fp32(std::uint16_t h);
std::uint16_t fp32_to_fp16(float f);
/// bfloat16 <-> float (round-to-nearest-even on the way in; NaN stays NaN).
float bf16_to_fp32(std::uint16_t h);
std::uint16_t fp32_to_bf16(float f);

/// Dequantizes `n` elements (a multiple of the block size) of type `type` at `src` into `dst`.
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K. Every quantized
/// value is d·q (an fp16 scale, at most 11 significant bits, times an integer of at most 13:
/// exact in float32) or the sum of two such terms rounded once (Q4_1, Q5_1, Q4_K, Q5_K), so a
/// fused and a separate multiply-add give the same float, and so does a vector kernel.
void dequantize_row(GgmlType type, const void* src, float* dst, std::int64_t n);

/// Quantizes `n` floats (a multiple of the block size) into `dst` (ggml_row_bytes(type, n)
/// bytes). Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1. Scales are chosen as in ggml's
/// reference quantizers (Q8_0: d = amax/127; Q4_0: d = max/−8 with the signed extreme;
/// Q4_1: d = (max−min)/15, m = min), so dequantize(quantize(x)) is within half a step per
/// element (plus fp16 rounding of the scales).
void quantize_row(GgmlType type, const float* src, void* dst, std::int64_t n);
/// Same, into a new byte vector.
std::vector<std::uint8_t> quantize(GgmlType type, const float* src, std::int64_t n);

}  // namespace numattn
