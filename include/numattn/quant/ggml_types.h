/// @file ggml_types.h
/// ggml tensor element types: the type ids (as stored in GGUF and ggml), each type's block size
/// and bytes per block, and its name. The block layouts themselves are in quant.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace numattn {

/// ggml tensor element types (ids as stored in GGUF). Only some are dequantizable (quant.h).
enum class GgmlType : std::uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

/// Storage facts of a ggml type: `block_elems` elements are stored in `block_bytes` bytes.
struct GgmlTypeInfo {
  const char* name = "?";
  std::int64_t block_elems = 0;
  std::int64_t block_bytes = 0;
  bool dequantizable = false;  ///< `dequantize_row` supports it (quant.h)
  bool quantizable = false;    ///< `quantize_row` supports it (quant.h)
};

/// Facts of type id `t`, or nullptr when the id is not a known ggml type.
const GgmlTypeInfo* ggml_type_info(std::uint32_t t);
/// Facts of `t`; throws numattn::Error for an unknown id.
const GgmlTypeInfo& ggml_type_info(GgmlType t);
/// "Q4_1", "F32", ... ("type#N" for an unknown id).
std::string ggml_type_name(GgmlType t);
/// Parses a type name ("q8_0", "F16", case-insensitive); throws on an unknown name.
GgmlType parse_ggml_type(std::string_view name);
/// Bytes of a row of `ne0` elements of type `t`. Throws when `ne0` is not a multiple of the
/// block size or the type is unknown.
std::int64_t ggml_row_bytes(GgmlType t, std::int64_t ne0);

}  // namespace numattn
