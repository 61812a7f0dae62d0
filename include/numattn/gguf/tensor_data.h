/// @file tensor_data.h
/// The data of a GGUF tensor as numbers: the block math of quant/ (dequantize_row, QuantMatrix)
/// applied to a GgufTensorInfo, with errors that name the tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/gguf/gguf.h"
#include "numattn/quant/qgemv.h"
#include "numattn/quant/quant.h"

namespace numattn {

/// Dequantizes rows `[row_begin, row_begin + row_count)` of `t` into `dst`
/// (`row_count · t.row_elems()` floats). Handy for embedding lookups.
void dequantize_rows(const GgufTensorInfo& t, std::int64_t row_begin, std::int64_t row_count,
                     float* dst);

/// What dequantize_tensor does with NaN and ±Inf values (a file may hold them in F32/F16
/// data or in a block scale).
enum class NonFinite {
  kKeep,    ///< copy them (inspection tools)
  kRefuse,  ///< throw numattn::Error naming the tensor, the first non-finite element as
            ///< [row, column] (GGUF order: column < ne[0]) and its value (model loading)
};

/// Dequantizes the whole tensor into `dst` (`t.n_elements()` floats, ne[0] fastest), rows in
/// parallel over `ctx`. With NonFinite::kRefuse each chunk is scanned right after it is
/// written (while it is in cache); the error names the lowest offending index whatever the
/// thread count.
void dequantize_tensor(const GgufTensorInfo& t, float* dst, const ExecContext& ctx = {},
                       NonFinite non_finite = NonFinite::kKeep);
/// Same, into a new vector.
std::vector<float> dequantize_tensor(const GgufTensorInfo& t, const ExecContext& ctx = {});

/// Appends the rows of 2-D tensor `t` (ne = {cols, rows}; trailing dims of 1 allowed) to `m`
/// (QuantMatrix::append, with the tensor named in its errors). The parts point into the file's
/// mapping: the GgufFile must outlive `m`. Throws numattn::Error when `t` has more than two
/// dimensions, its row length differs from `m.cols` (set by the first part), its type cannot be
/// dequantized or it has no data.
void append_tensor(QuantMatrix& m, const GgufTensorInfo& t);

}  // namespace numattn
