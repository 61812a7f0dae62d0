/// @file qgemv.h
/// Matrix-vector and small-batch products with weights kept in their GGUF block encoding.
///
/// A decode step multiplies every weight once per token, so its speed is the rate at which the
/// weights can be read: 4.5–8.5 bits per weight for the quantized types instead of the 32 of a
/// float32 copy. These kernels read the blocks where they lie (usually the memory-mapped file),
/// rebuild each block's values in registers and multiply them by float32 activations, so the
/// result equals the float32 product of the dequantized weights up to summation order (there is
/// no quantization of the activations: see docs/model-runner.md for the error bound).
///
/// Code paths, chosen at run time from the CPU's features (cpuid, with the OS's support of the
/// vector state), never only at compile time:
/// | path | needs | specialised kernels |
/// |---|---|---|
/// | avx512 | AVX-512 F/BW/VL/DQ, F16C, FMA | F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q6_K |
/// | avx2 | AVX2, F16C, FMA | F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q6_K |
/// | portable | C++ only | none: every type by the generic kernel |
/// The generic kernel (every dequantizable type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
/// Q4_K, Q6_K) dequantizes one piece of a row at a time (at most 512 values, on the stack) with
/// quant.h and multiplies it by x with the path's float32 dot product; the types without a
/// specialised kernel on a vector path use it too. `NUMATTN_CPU_PATH=portable|avx2|avx512` in
/// the environment lowers the default path (tests, benchmarks); a path the CPU lacks is refused.
///
/// The vector paths share one kernel template (src/model/qgemv_simd.h) instantiated for 8 and
/// 16 lanes: four rows per pass share each load of x and keep eight independent FMA chains,
/// and each group of four prefetches the rows two groups ahead.
///
/// Cost: one read of the selected weight bytes per call (rows go in chunks of about 16 KiB,
/// each reused from L1/L2 by the n vectors); about 2 flops per weight per vector.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numattn/core/exec.h"
#include "numattn/model/gguf.h"

namespace numattn {

/// Instruction-set path of the quantized kernels.
enum class CpuPath { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
/// "portable", "avx2", "avx512".
const char* cpu_path_name(CpuPath p);
/// Parses a path name; throws numattn::Error naming the choices.
CpuPath parse_cpu_path(const std::string& name);
/// True when `p` was compiled in and this CPU (and OS) can run it.
bool cpu_path_available(CpuPath p);
/// Every path this machine can run, portable first.
std::vector<CpuPath> available_cpu_paths();
/// The widest available path, or the one NUMATTN_CPU_PATH names (throws if this CPU cannot
/// run it). Read once per process.
CpuPath default_cpu_path();

/// A row-major matrix `[rows, cols]` held in GGUF block encoding: a vertical stack of parts
/// (e.g. Wq, Wk, Wv of one layer, each a tensor of its own type), each `rows` rows of
/// `row_bytes` bytes at `data`. The bytes are not owned: they live in a GgufFile (its mapping)
/// that the owner of the matrix keeps alive.
struct QuantMatrix {
  struct Part {
    GgmlType type = GgmlType::F32;
    const std::uint8_t* data = nullptr;
    std::int64_t rows = 0;
    std::int64_t row_bytes = 0;
  };
  std::int64_t cols = 0;
  std::vector<Part> parts;

  /// Appends the rows of 2-D tensor `t` (ne = {cols, rows}; trailing dims of 1 allowed).
  /// Throws numattn::Error when its row length differs from `cols` (set by the first part),
  /// its type cannot be dequantized or it has no data.
  void append(const GgufTensorInfo& t);
  bool empty() const { return parts.empty(); }
  std::int64_t rows() const;
  /// Bytes of all parts (what one product reads).
  std::uint64_t bytes() const;
  /// Dequantizes rows [r0, r1) into `dst` ((r1 − r0)·cols floats, row-major).
  void dequantize_rows(std::int64_t r0, std::int64_t r1, float* dst) const;
  /// Every row dequantized: rows()·cols floats, row-major (a transform's float32 copy).
  std::vector<float> dequantize() const;
  /// The first `r` rows (0 <= r <= rows()), same bytes: parts past them dropped, the last one
  /// shortened (rows are independent, so any row is a valid boundary).
  QuantMatrix first_rows(std::int64_t r) const;
  /// "Q4_1" or "Q4_1+Q6_K" (the distinct part types).
  std::string type_string() const;
};

/// y[r·ldy + o] = (y[r·ldy + o] if accumulate, else 0) + Σ_j W[o, j]·x[r·ldx + j]
/// for rows o in [o0, o1) and vectors r in [0, n), on the calling thread, with path `path`
/// (which must be available). Summation order differs from a float32 GEMM, nothing else.
void quant_gemv(const QuantMatrix& w, std::int64_t o0, std::int64_t o1, const float* x,
                std::int64_t n, std::int64_t ldx, float* y, std::int64_t ldy, bool accumulate,
                CpuPath path);

/// y = x·Wᵀ (+ y when accumulate) for x `[n, cols]` (leading dimension cols) and y `[n, rows]`
/// (leading dimension ldy, 0 = rows). Few vectors (n <= kQuantGemvMaxBatch): quant_gemv, split
/// over `ctx`'s threads by rows when the matrix has at least 8 MiB (NUMATTN_GEMV_SPLIT=<bytes>
/// in the environment changes that; each split is a fork/join, costly on a busy machine).
/// More: W is dequantized in panels of rows into a float32 tile of up to 8 MiB (one per
/// thread, kept between calls) and each panel is one single-threaded sgemm against all n rows
/// of x; a product large enough to split has at least one equal panel per thread. Throws
/// numattn::Error when the matrix is empty.
void quant_linear(const ExecContext& ctx, const QuantMatrix& w, const float* x, std::int64_t n,
                  float* y, bool accumulate, std::int64_t ldy = 0,
                  CpuPath path = default_cpu_path());

/// Largest batch that quant_linear computes with quant_gemv (each vector re-decodes the
/// blocks, so past a few vectors a dequantized tile and a GEMM are cheaper).
inline constexpr std::int64_t kQuantGemvMaxBatch = 4;

}  // namespace numattn
