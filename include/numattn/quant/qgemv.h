/// @file qgemv.h
/// Matrix-vector and small-batch products with weights kept in their GGUF block encoding.
///
/// A decode step multiplies every weight once per token, so its speed is the rate at which the
/// weights can be read: 4.5–8.5 bits per weight for the quantized types instead of the 32 of a
/// float32 copy. These kernels read the blocks where they lie (usually the memory-mapped file),
/// rebuild each block's values in registers and multiply them by float32 activations, so the
/// result equals the float32 product of the dequantized weights up to summation order (by
/// default the activations are not quantized: see docs/model-runner.md for the error bound;
/// the optional 8-bit activations are below).
///
/// Code paths, chosen at run time from the CPU's features (cpuid, with the OS's support of the
/// vector state), never only at compile time:
/// | path | needs | specialised kernels | panel dequantizers |
/// |---|---|---|---|
/// | avx512vnni | avx512 + AVX-512 VNNI | as avx512 (the integer kernels below use VNNI) | as avx512 |
/// | avx512 | AVX-512 F/BW/VL/DQ, F16C, FMA | F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K | Q8_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K |
/// | avx2 | AVX2, F16C, FMA | as avx512 | as avx512 |
/// | portable | C++ only | none: every type by the generic kernel | none: dequantize_row |
/// The generic kernel (every dequantizable type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
/// Q4_K, Q5_K, Q6_K) dequantizes one piece of a row at a time (at most 512 values, on the stack) with
/// quant.h and multiplies it by x with the path's float32 dot product; the portable path uses it
/// for every type. A specialised kernel of a block type rebuilds each weight in registers as
/// dequantize_row does (the same float: quant.h) and multiplies it by x, but for Q8_0 and
/// Q6_K, which multiply the integer quants by x and scale the block's sum (Q8_0) or each
/// product (Q6_K) by the exact d or d·sc. The panel dequantizers
/// (QuantMatrix::dequantize_rows, quant_linear's prefill panels) give dequantize_row's floats
/// bit for bit; the other types' panels are dequantize_row itself.
/// `NUMATTN_CPU_PATH=portable|avx2|avx512|avx512vnni` in the environment lowers the default
/// path (tests, benchmarks); a path the CPU lacks is refused.
///
/// The vector paths share one kernel template (src/quant/qgemv_simd.h) instantiated for 8 and
/// 16 lanes: four rows per pass share each load of x and keep eight independent FMA chains,
/// and each group of four prefetches the rows two groups ahead.
///
/// Cost: one read of the selected weight bytes per call (rows go in chunks of about 16 KiB,
/// each reused from L1/L2 by the n vectors); about 2 flops per weight per vector.
///
/// Optional 8-bit activations (Activations::kQ8, `--activations q8`, never the default): each
/// vector x is first rounded to int8 in blocks of 32 (ActivationsQ8, llama.cpp's Q8_0 rule),
/// and Q8_0, Q4_0 and Q4_1 rows are multiplied by it in integer arithmetic: per block one
/// exact integer Σ q_w·q_x (vpmaddubsw + vpmaddwd), one float FMA by d_w·d_x, and for Q4_1 the
/// min term m_w·s_x with s_x = d_x·Σ q_x. That is about a third of the instructions of the
/// float kernel per weight. The result is the float32 product of the dequantized weights with
/// x̂ (the rounded x) up to summation order; its distance to the float32-activation product is
/// |Σ w·(x − x̂)| <= Σ_blocks (d_x/2)·Σ|w| (docs/numerics.md). Every other type (F32, F16,
/// BF16, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) is multiplied by x̂ with its float kernel inside the same
/// product, so a product means the same thing whatever its parts' types.
/// | path | integer kernels (x̂: int8 blocks of 32) |
/// |---|---|
/// | avx512vnni | Q8_0, Q4_0, Q4_1: as avx512, each byte dot product one vpdpbusd (same integers) |
/// | avx512 | Q8_0, Q4_0, Q4_1: two blocks per 512-bit step (AVX-512 BW: vpmaddubsw + vpmaddwd) |
/// | avx2 | Q8_0, Q4_0, Q4_1: one block per 256-bit step |
/// | portable | Q8_0, Q4_0, Q4_1: scalar int32 sums |
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "numattn/core/cpu.h"
#include "numattn/core/exec.h"
#include "numattn/quant/ggml_types.h"

namespace numattn {

/// True when quant_gemv has a kernel table for `p` that this CPU can run (core/cpu.h), or a
/// test put a table in its place (qkern::set_test_table in src/quant/qgemv_kernels.h).
bool cpu_path_available(CpuPath p);
/// Every path quant_gemv can run here, portable first (runnable_cpu_paths() plus test tables).
std::vector<CpuPath> available_cpu_paths();

/// A row-major matrix `[rows, cols]` held in GGUF block encoding: a vertical stack of parts
/// (e.g. Wq, Wk, Wv of one layer, each a tensor of its own type), each `rows` rows of
/// `row_bytes` bytes at `data`. The bytes are not owned: they live elsewhere (usually in a
/// GgufFile's mapping) and the owner of the matrix keeps them alive.
struct QuantMatrix {
  struct Part {
    GgmlType type = GgmlType::F32;
    const std::uint8_t* data = nullptr;
    std::int64_t rows = 0;
    std::int64_t row_bytes = 0;
  };
  std::int64_t cols = 0;
  std::vector<Part> parts;

  /// Appends `rows` rows of `cols` values of type `type` at `data` (row bytes:
  /// ggml_row_bytes(type, cols)). Throws numattn::Error, naming the part as `what`, when the
  /// row length differs from `cols` (set by the first part), the type cannot be dequantized or
  /// `data` is null for a non-empty part. A GGUF tensor: append_tensor (gguf/tensor_data.h).
  void append(GgmlType type, const std::uint8_t* data, std::int64_t rows, std::int64_t cols,
              std::string_view what = "part");
  bool empty() const { return parts.empty(); }
  std::int64_t rows() const;
  /// Bytes of all parts (what one product reads).
  std::uint64_t bytes() const;
  /// Dequantizes rows [r0, r1) into `dst` ((r1 − r0)·cols floats, row-major) with path
  /// `path`'s vector dequantizers where it has one for a part's type (the table below),
  /// dequantize_row otherwise: the same floats bit for bit either way. Throws numattn::Error
  /// for a path that is not available.
  void dequantize_rows(std::int64_t r0, std::int64_t r1, float* dst,
                       CpuPath path = default_cpu_path()) const;
  /// Every row dequantized: rows()·cols floats, row-major (a transform's float32 copy).
  std::vector<float> dequantize() const;
  /// The first `r` rows (0 <= r <= rows()), same bytes: parts past them dropped, the last one
  /// shortened (rows are independent, so any row is a valid boundary).
  QuantMatrix first_rows(std::int64_t r) const;
  /// "Q4_1" or "Q4_1+Q6_K" (the distinct part types).
  std::string type_string() const;
};

/// Precision of the activations of quant_linear's decode products (`--activations f32|q8`).
enum class Activations {
  kF32 = 0,  ///< float32 x (default): the float32 product up to summation order
  kQ8 = 1,   ///< x rounded to int8 per block of 32 (ActivationsQ8); integer kernels
};
/// "f32" / "q8".
const char* activations_name(Activations a);
/// Parses "f32" or "q8"; throws numattn::Error naming both.
Activations parse_activations(const std::string& name);

/// n vectors of `cols` values rounded to 8 bits in blocks of 32 (the last block of a row may be
/// shorter, its missing quants are 0). For block b of vector r, with a = max |x_j| over it:
/// d = a/127 (float32), q_j = the nearest integer (ties to even) of the float32 quotient x_j/d,
/// clamped to [−127, 127], and s = d·Σ_j q_j (float32), the block's Σ of x̂_j = d·q_j, which the
/// Q4_1 min term needs. An all-zero block has d = s = 0, q = 0. A block holding a NaN or ±Inf
/// has d = s = NaN and q = 0, so every product with it is NaN (the float kernels would give
/// ±Inf or NaN). |x_j − d·q_j| <= d/2 (plus one rounding of d·q_j when x̂ is formed in float).
struct ActivationsQ8 {
  static constexpr std::int64_t kBlock = 32;
  std::int64_t n = 0, cols = 0, blocks = 0;  ///< blocks = ceil(cols / 32) per vector
  std::vector<std::int8_t> q;                ///< [n, blocks·32]
  std::vector<float> d, s;                   ///< [n, blocks]
  /// Quantizes x `[n, cols]` (leading dimension ldx >= cols); keeps the buffers' capacity.
  /// Cost: 3 passes over n·cols floats. Throws numattn::Error for negative sizes or ldx < cols.
  void quantize(const float* x, std::int64_t n, std::int64_t ldx, std::int64_t cols);
  /// x̂ = d·q, `[n, cols]` with leading dimension ldo >= cols.
  void dequantize(float* out, std::int64_t ldo) const;
};

/// y[r·ldy + o] = (y[r·ldy + o] if accumulate, else 0) + Σ_j W[o, j]·x[r·ldx + j]
/// for rows o in [o0, o1) and vectors r in [0, n), on the calling thread, with path `path`
/// (which must be available). Summation order differs from a float32 GEMM, nothing else.
void quant_gemv(const QuantMatrix& w, std::int64_t o0, std::int64_t o1, const float* x,
                std::int64_t n, std::int64_t ldx, float* y, std::int64_t ldy, bool accumulate,
                CpuPath path);

/// Decides, product by product, whether a decode product (a few vectors through one matrix) is
/// split over the thread team or run on the calling thread, by measuring both.
///
/// A split halves the work per thread but costs a fork and a join: a few microseconds when the
/// cores are free, a whole scheduler time slice (milliseconds) when another process holds a
/// core and a worker waits to run. Which one wins is a property of the machine's load at the
/// moment, not of the matrix, so it is measured: products are grouped by size (powers of two
/// of the bytes read), each group keeps the seconds per byte of the last `kWindow` products of
/// each choice and takes the choice with the smaller trimmed mean (the largest sample left out
/// once there are `kTrimFrom`); every `interval`-th product of the group starts a trial of the other
/// choice (`kTrial` products, which replace that choice's window). The interval doubles (up to
/// `kMaxInterval`) each time a trial loses and drops back to `kMinInterval` when it wins. So a
/// steady machine pays kTrial products in kMaxInterval, load that arrives while splitting shows
/// after two slow splits, and load that leaves is found within kMaxInterval products of the
/// group (a few tokens of a 30-layer model).
/// Why trimmed: on a virtual machine about 1% of products, split or not, stall for 0.1–1 ms
/// (the host runs something else on a vCPU); a split waits for both threads, so it meets twice
/// as many. A plain running mean let those stalls make splitting look no better than one
/// thread for SmolLM2's 0.2–1 MiB products, although their medians split are 1.5× faster and
/// splitting every product decoded 15–20% faster (docs/model-runner.md). Dropping the largest
/// of `kWindow` samples ignores an isolated stall; load that stalls a sizeable share of the
/// splits still puts two stalls in most windows and moves the choice to one thread.
/// Both choices compute every output row with the same instructions in the same order, so the
/// choice never changes a result.
///
/// Not thread-safe: quant_linear keeps one per calling thread.
class GemvSplitTuner {
 public:
  static constexpr std::uint32_t kWarmup = 3;        ///< first products of a group: alternate
  static constexpr std::uint32_t kTrial = 3;         ///< products of a trial of the other choice
  static constexpr std::uint32_t kMinInterval = 16;  ///< products between two trials
  static constexpr std::uint32_t kMaxInterval = 512;
  static constexpr std::uint32_t kWindow = 8;        ///< samples kept per choice
  static constexpr std::uint32_t kTrimFrom = 5;      ///< samples from which the largest is dropped

  /// Whether the next product reading `bytes` should be split.
  bool choose(std::uint64_t bytes);
  /// Records how long a product reading `bytes` took (`split`: as chosen; call once per choose).
  void record(std::uint64_t bytes, bool split, double seconds);
  /// Seconds per byte of a choice in the group of `bytes` as the tuner sees it: the mean of
  /// its last kWindow samples (fewer before that), without the largest one once there are
  /// kTrimFrom (a trial's kTrial samples count in full); 0 before any sample.
  double mean_seconds_per_byte(std::uint64_t bytes, bool split) const;

 private:
  struct Arm {
    double window[kWindow] = {};
    std::uint32_t samples = 0;  ///< since the last trial replaced the window
    void add(double v);
    double estimate() const;
  };
  struct Group {
    Arm arm[2];
    std::uint32_t since = 0, interval = kMinInterval, trial_left = 0;
    bool trial_split = false;
  };
  static int group_of(std::uint64_t bytes);
  Group groups_[65];
};

/// Reads the environment variables of the quantized products (NUMATTN_CPU_PATH,
/// NUMATTN_GEMV_SPLIT) and throws numattn::Error naming the variable when a value is invalid.
/// Both are otherwise read at the first product; the CLI calls this before a command runs, so a
/// bad value fails before any output.
void check_quant_environment();

/// How quant_linear splits decode products on the calling thread, counted since the last reset
/// (`numattn bench-model` reports the split share).
struct GemvSplitStats {
  std::uint64_t split = 0;   ///< products split over the threads
  std::uint64_t single = 0;  ///< products run on the calling thread
};
GemvSplitStats gemv_split_stats();
void reset_gemv_split_stats();

/// The same product with the x.n vectors of `x` (x.cols == w.cols): Q8_0, Q4_0 and Q4_1 parts
/// by the integer kernels, the others by their float kernels on x̂ (dequantized once per call).
/// Equals the float32 product of the dequantized weights with x̂ up to summation order.
void quant_gemv(const QuantMatrix& w, std::int64_t o0, std::int64_t o1, const ActivationsQ8& x,
                float* y, std::int64_t ldy, bool accumulate, CpuPath path);

/// y = x·Wᵀ (+ y when accumulate) for x `[n, cols]` (leading dimension cols) and y `[n, rows]`
/// (leading dimension ldy, 0 = rows). Few vectors (n <= kQuantGemvMaxBatch): quant_gemv over
/// row slices of ≥ 16 rows. With one thread, or fewer than 32 rows, it runs on the calling
/// thread; a product of at least 8 MiB is always split over `ctx`'s threads (one fork per
/// several milliseconds of work pays even on a busy machine); a smaller one is split or not as
/// the calling thread's GemvSplitTuner measures best. NUMATTN_GEMV_SPLIT=<bytes> in the
/// environment replaces the tuner by a fixed rule (split from that many bytes read; `auto`,
/// the default, = the tuner); any other value is an error.
/// More: W is dequantized in panels of rows (with `path`'s panel dequantizers) into a float32
/// tile of up to 8 MiB (one per thread, kept between calls) and each panel is one single-threaded sgemm against all n rows
/// of x; a product large enough to split has at least one equal panel per thread. Throws
/// numattn::Error when the matrix is empty.
/// `act` = kQ8 applies to the few-vector products only: x is quantized once (ActivationsQ8,
/// before any split) and multiplied by the integer kernels; more vectors run the float32 panels
/// as above (a caller wanting x̂ there, as LlamaModel does, rounds x itself: round_activations_q8).
void quant_linear(const ExecContext& ctx, const QuantMatrix& w, const float* x, std::int64_t n,
                  float* y, bool accumulate, std::int64_t ldy = 0,
                  CpuPath path = default_cpu_path(), Activations act = Activations::kF32);

/// x̂ of x `[n, cols]` (leading dimension cols) in place: ActivationsQ8's rounding applied
/// and undone, what the integer kernels multiply. Cost: a few passes over n·cols floats.
void round_activations_q8(float* x, std::int64_t n, std::int64_t cols);

/// Largest batch that quant_linear computes with quant_gemv (each vector re-decodes the
/// blocks, so past a few vectors a dequantized tile and a GEMM are cheaper).
inline constexpr std::int64_t kQuantGemvMaxBatch = 4;

}  // namespace numattn
