// GGUF tensors as numbers: dequantize_row over a tensor's rows, with errors that name the tensor
// (append_tensor is in tensor_matrix.cpp, so that a program without the quantized products, the
// gguf fuzzer, links this file alone).
#include "numattn/gguf/tensor_data.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "numattn/core/error.h"

namespace numattn {

void dequantize_rows(const GgufTensorInfo& t, std::int64_t row_begin, std::int64_t row_count,
                     float* dst) {
  const std::int64_t rows = t.n_rows();
  NUMATTN_CHECK(row_begin >= 0 && row_count >= 0 && row_begin <= rows && row_count <= rows - row_begin,
                "tensor '{}': rows [{}, +{}) out of range (it has {} rows)", t.name, row_begin,
                row_count, rows);
  if (row_count == 0) return;
  NUMATTN_CHECK(t.data != nullptr, "tensor '{}' has no data", t.name);
  const std::int64_t rb = t.row_bytes(), ne0 = t.row_elems();
  dequantize_row(t.type, t.data + row_begin * rb, dst, row_count * ne0);
}

void dequantize_tensor(const GgufTensorInfo& t, float* dst, const ExecContext& ctx,
                       NonFinite non_finite) {
  const std::int64_t rows = t.n_rows(), ne0 = t.row_elems();
  ggml_type_info(t.type);
  if (rows == 0 || ne0 == 0) return;  // nothing to do (and no loop over 2^60 empty rows)
  // Chunks of ~64 k elements: enough work per item, and any thread count gives the same bytes.
  const std::int64_t rows_per_chunk = std::max<std::int64_t>(1, (1 << 16) / std::max<std::int64_t>(ne0, 1));
  const std::int64_t chunks = rows / rows_per_chunk + (rows % rows_per_chunk != 0);
  // Lowest non-finite element index seen by any chunk (the minimum, so the message does not
  // depend on which thread finished first).
  std::atomic<std::int64_t> first_bad{std::numeric_limits<std::int64_t>::max()};
  parallel_for(ctx, chunks, [&](std::int64_t c) {
    const std::int64_t r0 = c * rows_per_chunk;
    const std::int64_t nr = std::min(rows_per_chunk, rows - r0);
    float* out = dst + r0 * ne0;
    dequantize_rows(t, r0, nr, out);
    if (non_finite == NonFinite::kKeep) return;
    const std::int64_t n = nr * ne0;
    std::int64_t i = 0;
    while (i < n && std::isfinite(out[i])) ++i;
    if (i == n) return;
    std::int64_t seen = first_bad.load();
    while (r0 * ne0 + i < seen && !first_bad.compare_exchange_weak(seen, r0 * ne0 + i)) {
    }
  });
  const std::int64_t bad = first_bad.load();
  NUMATTN_CHECK(bad == std::numeric_limits<std::int64_t>::max(),
                "tensor {} (ne {}) holds a non-finite value: row {}, column {} (flat index {}) "
                "is {}; the file's weights are corrupt",
                t.name, t.shape_string(), bad / ne0, bad % ne0, bad, dst[bad]);
}

std::vector<float> dequantize_tensor(const GgufTensorInfo& t, const ExecContext& ctx) {
  std::vector<float> out(static_cast<std::size_t>(t.n_elements()));
  dequantize_tensor(t, out.data(), ctx);
  return out;
}

}  // namespace numattn
