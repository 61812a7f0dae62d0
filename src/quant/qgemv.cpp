// Quantized matrix-vector products (quant/qgemv.h): run-time path selection, the generic and
// portable kernels, and the two drivers (quant_gemv for decode, quant_linear adding the
// dequantized-panel GEMM for prefill).
#include "numattn/quant/qgemv.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/quant/quant.h"
#include "qgemv_kernels.h"
#include "qgemv_simd.h"

namespace numattn {

namespace {

// ---- portable and generic kernels ---------------------------------------------------------

// Eight partial sums: the compiler may vectorise them without reassociating anything.
float dot_f32_portable(const float* a, const float* b, std::int64_t n) {
  float acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float v : acc) s += v;
  return s;
}

// The portable integer kernels: qgemv_simd.h's scalar form, which needs only half().
struct PortableLanes {
  using I = int;  // named by the vector members of the block types, which it never instantiates
  static float half(const std::uint8_t* p) {
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return fp16_to_fp32(h);
  }
};

const qkern::KernelTable* portable_table() {
  static const qkern::KernelTable t = [] {
    qkern::KernelTable k{dot_f32_portable};
    using L = PortableLanes;
    k.q8_0_q8 = qkern::simd::q8_rows_scalar<L, qkern::simd::Q8_0x8<L>>;
    k.q4_0_q8 = qkern::simd::q8_rows_scalar<L, qkern::simd::Q4x8<L, false>>;
    k.q4_1_q8 = qkern::simd::q8_rows_scalar<L, qkern::simd::Q4x8<L, true>>;
    return k;
  }();
  return &t;
}

// Tables the tests put in place of a path's own (qkern::set_test_table): index = CpuPath.
std::atomic<const qkern::KernelTable*> g_test_tables[4] = {};

const qkern::KernelTable* own_table(CpuPath p) {
  switch (p) {
#if defined(NUMATTN_EMULATE_AVX512)
    // The emulation build (core/isa_begin.h): the tests put SIMDe tables in their place.
    case CpuPath::kAvx512Vnni:
    case CpuPath::kAvx512: return nullptr;
#else
    case CpuPath::kAvx512Vnni: return qkern::avx512vnni_table();
    case CpuPath::kAvx512: return qkern::avx512_table();
#endif
    case CpuPath::kAvx2: return qkern::avx2_table();
    case CpuPath::kPortable: return portable_table();
  }
  return nullptr;
}

const qkern::KernelTable* test_table(CpuPath p) {
  return g_test_tables[static_cast<int>(p)].load(std::memory_order_acquire);
}

// The table of p, or where this build has none for a path the CPU runs (the AVX-512 emulation
// build's CLI, core/isa_begin.h), the widest below it: a family runs its widest variant at or
// below the library's path (core/cpu.h).
const qkern::KernelTable* table(CpuPath p) {
  for (int i = static_cast<int>(p); i > 0; --i) {
    const auto q = static_cast<CpuPath>(i);
    if (const qkern::KernelTable* t = test_table(q)) return t;
    if (cpu_can_run(q))
      if (const qkern::KernelTable* t = own_table(q)) return t;
  }
  const qkern::KernelTable* t = test_table(CpuPath::kPortable);
  return t != nullptr ? t : portable_table();
}

qkern::DotQ8Fn special_q8(const qkern::KernelTable& t, GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return t.q8_0_q8;
    case GgmlType::Q4_0: return t.q4_0_q8;
    case GgmlType::Q4_1: return t.q4_1_q8;
    default: return nullptr;
  }
}

qkern::DotFn special(const qkern::KernelTable& t, GgmlType type) {
  switch (type) {
    case GgmlType::F32: return t.f32;
    case GgmlType::F16: return t.f16;
    case GgmlType::BF16: return t.bf16;
    case GgmlType::Q8_0: return t.q8_0;
    case GgmlType::Q4_0: return t.q4_0;
    case GgmlType::Q4_1: return t.q4_1;
    case GgmlType::Q5_0: return t.q5_0;
    case GgmlType::Q5_1: return t.q5_1;
    case GgmlType::Q4_K: return t.q4_k;
    case GgmlType::Q5_K: return t.q5_k;
    case GgmlType::Q6_K: return t.q6_k;
    default: return nullptr;
  }
}

qkern::DeqFn special_deq(const qkern::KernelTable& t, GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return t.deq_q8_0;
    case GgmlType::Q4_1: return t.deq_q4_1;
    case GgmlType::Q5_0: return t.deq_q5_0;
    case GgmlType::Q4_K: return t.deq_q4_k;
    case GgmlType::Q5_K: return t.deq_q5_k;
    case GgmlType::Q6_K: return t.deq_q6_k;
    default: return nullptr;
  }
}

// Decode products of at least this many bytes are always split over the threads (quant_linear).
constexpr std::uint64_t kGemvSplitBytes = std::uint64_t{8} << 20;

// NUMATTN_GEMV_SPLIT: unset, empty or "auto" → 0 (the tuner); digits → a fixed threshold.
std::uint64_t fixed_split_bytes() {
  static const std::uint64_t v = [] {
    const char* e = std::getenv("NUMATTN_GEMV_SPLIT");
    if (e == nullptr || *e == '\0' || std::strcmp(e, "auto") == 0) return std::uint64_t{0};
    char* end = nullptr;
    errno = 0;
    const unsigned long long b = std::strtoull(e, &end, 10);
    NUMATTN_CHECK(*e >= '0' && *e <= '9' && *end == '\0' && errno == 0 && b > 0,
                  "NUMATTN_GEMV_SPLIT must be 'auto' or a positive byte count, got '{}'",
                  std::string(e).substr(0, 40));
    return static_cast<std::uint64_t>(b);
  }();
  return v;
}

thread_local GemvSplitStats t_split_stats;

// Pieces of at most 512 values (whole blocks) dequantized onto the stack, then one dot.
constexpr std::int64_t kPiece = 512;

float dot_generic(const GgmlTypeInfo& ti, GgmlType type, const std::uint8_t* row, const float* x,
                  std::int64_t cols, qkern::DotF32Fn dot) {
  alignas(64) float buf[kPiece];
  const std::int64_t step = kPiece / ti.block_elems * ti.block_elems;
  float s = 0;
  for (std::int64_t j = 0; j < cols; j += step) {
    const std::int64_t m = std::min(step, cols - j);
    dequantize_row(type, row + j / ti.block_elems * ti.block_bytes, buf, m);
    s += dot(buf, x + j, m);
  }
  return s;
}

}  // namespace

namespace {
// Narrowest first, as available_cpu_paths() lists them.
constexpr CpuPath kAllPaths[] = {CpuPath::kPortable, CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAvx512Vnni};

// The CPU (and the build) can run p's own table.
bool cpu_runs(CpuPath p) { return own_table(p) != nullptr && cpu_can_run(p); }

const bool kRegistered = (register_kernel_family("quant_gemv", CpuPath::kAvx512Vnni), true);
}  // namespace

bool cpu_path_available(CpuPath p) { return test_table(p) != nullptr || cpu_runs(p); }

std::vector<CpuPath> available_cpu_paths() {
  std::vector<CpuPath> v;
  for (CpuPath p : kAllPaths)
    if (cpu_path_available(p)) v.push_back(p);
  return v;
}

namespace qkern {
void set_test_table(CpuPath path, const KernelTable* t) {
  g_test_tables[static_cast<int>(path)].store(t, std::memory_order_release);
}
const KernelTable* test_table(CpuPath path) { return numattn::test_table(path); }
}  // namespace qkern

// ---- QuantMatrix ---------------------------------------------------------------------------

void QuantMatrix::append(GgmlType type, const std::uint8_t* data, std::int64_t rows, std::int64_t cols,
                         std::string_view what) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  NUMATTN_CHECK(ti.dequantizable, "{} has type {}, which numattn cannot multiply", what, ti.name);
  NUMATTN_CHECK(parts.empty() || cols == this->cols, "{} has rows of {} values, stacked under rows of {}",
                what, cols, this->cols);
  NUMATTN_CHECK(rows >= 0 && cols >= 0, "{} has {} rows of {} values", what, rows, cols);
  NUMATTN_CHECK(data != nullptr || rows == 0 || cols == 0, "{} has no data", what);
  const std::int64_t row_bytes = ggml_row_bytes(type, cols);
  this->cols = cols;
  parts.push_back({type, data, rows, row_bytes});
}

std::int64_t QuantMatrix::rows() const {
  std::int64_t r = 0;
  for (const Part& p : parts) r += p.rows;
  return r;
}

std::uint64_t QuantMatrix::bytes() const {
  std::uint64_t b = 0;
  for (const Part& p : parts) b += static_cast<std::uint64_t>(p.rows * p.row_bytes);
  return b;
}

std::vector<float> QuantMatrix::dequantize() const {
  std::vector<float> out(static_cast<std::size_t>(rows() * cols));
  dequantize_rows(0, rows(), out.data());
  return out;
}

void QuantMatrix::dequantize_rows(std::int64_t r0, std::int64_t r1, float* dst, CpuPath path) const {
  NUMATTN_CHECK(r0 >= 0 && r0 <= r1 && r1 <= rows(), "rows [{}, {}) outside a matrix of {} rows",
                r0, r1, rows());
  NUMATTN_CHECK(cpu_path_available(path) || cpu_can_run(path), "CPU path {} is not available on this machine",
                cpu_path_name(path));
  const qkern::KernelTable& kt = *table(path);
  std::int64_t base = 0;
  for (const Part& p : parts) {
    const std::int64_t a = std::max(r0, base), b = std::min(r1, base + p.rows);
    if (a < b) {
      const std::uint8_t* src = p.data + (a - base) * p.row_bytes;
      float* out = dst + (a - r0) * cols;
      // The path's vector dequantizer for the type, if any: the same floats as dequantize_row
      // (every value is one product, exact, or one rounding of an exact sum: quant.h).
      const qkern::DeqFn fn = special_deq(kt, p.type);
      if (fn != nullptr) {
        fn(src, out, (b - a) * cols);  // rows are contiguous: one call for all of them
      } else {
        dequantize_row(p.type, src, out, (b - a) * cols);
      }
    }
    base += p.rows;
  }
}

QuantMatrix QuantMatrix::first_rows(std::int64_t r) const {
  NUMATTN_CHECK(r >= 0 && r <= rows(), "first {} rows of a matrix of {} rows", r, rows());
  QuantMatrix m;
  m.cols = cols;
  for (const Part& p : parts) {
    if (r == 0) break;
    Part q = p;
    q.rows = std::min(p.rows, r);
    r -= q.rows;
    m.parts.push_back(q);
  }
  return m;
}

std::string QuantMatrix::type_string() const {
  std::string s;
  std::vector<GgmlType> seen;
  for (const Part& p : parts) {
    if (std::find(seen.begin(), seen.end(), p.type) != seen.end()) continue;
    seen.push_back(p.type);
    if (!s.empty()) s += '+';
    s += ggml_type_name(p.type);
  }
  return s;
}

// ---- drivers -------------------------------------------------------------------------------

void quant_gemv(const QuantMatrix& w, std::int64_t o0, std::int64_t o1, const float* x,
                std::int64_t n, std::int64_t ldx, float* y, std::int64_t ldy, bool accumulate,
                CpuPath path) {
  NUMATTN_CHECK(cpu_path_available(path) || cpu_can_run(path), "CPU path {} is not available on this machine",
                cpu_path_name(path));
  NUMATTN_CHECK(o0 >= 0 && o0 <= o1 && o1 <= w.rows() && n >= 0,
                "quant_gemv: rows [{}, {}) of a matrix of {} rows, {} vectors", o0, o1, w.rows(), n);
  if (o0 == o1 || n == 0) return;
  const qkern::KernelTable& kt = *table(path);
  const std::int64_t cols = w.cols;
  std::int64_t base = 0;
  for (const QuantMatrix::Part& p : w.parts) {
    const std::int64_t a = std::max(o0, base), b = std::min(o1, base + p.rows);
    if (a < b) {
      const GgmlTypeInfo& ti = ggml_type_info(p.type);
      const qkern::DotFn fn = special(kt, p.type);
      // Chunks of rows small enough to stay in L1/L2 while each of the n vectors reads them.
      const std::int64_t chunk = n == 1 ? b - a : std::max<std::int64_t>(4, (16 << 10) / p.row_bytes / 4 * 4);
      for (std::int64_t c0 = a; c0 < b; c0 += chunk) {
        const std::int64_t c1 = std::min(b, c0 + chunk);
        const std::uint8_t* rows = p.data + (c0 - base) * p.row_bytes;
        for (std::int64_t r = 0; r < n; ++r) {
          const float* xr = x + r * ldx;
          float* yr = y + r * ldy + c0;
          if (fn != nullptr) {
            fn(rows, p.row_bytes, c1 - c0, xr, cols, yr, accumulate);
            continue;
          }
          for (std::int64_t o = 0; o < c1 - c0; ++o) {
            const float s = dot_generic(ti, p.type, rows + o * p.row_bytes, xr, cols, kt.dot_f32);
            yr[o] = accumulate ? yr[o] + s : s;
          }
        }
      }
    }
    base += p.rows;
  }
}

int GemvSplitTuner::group_of(std::uint64_t bytes) { return std::bit_width(bytes); }

void GemvSplitTuner::Arm::add(double v) {
  window[samples % kWindow] = v;
  ++samples;
}

double GemvSplitTuner::Arm::estimate() const {
  const std::uint32_t n = std::min(samples, kWindow);
  if (n == 0) return 0;
  double sum = 0, top = window[0];
  for (std::uint32_t i = 0; i < n; ++i) {
    sum += window[i];
    top = std::max(top, window[i]);
  }
  return n < kTrimFrom ? sum / n : (sum - top) / (n - 1);
}

bool GemvSplitTuner::choose(std::uint64_t bytes) {
  Group& g = groups_[group_of(bytes)];
  if (g.trial_left > 0) return g.trial_split;
  if (g.arm[0].samples < kWarmup || g.arm[1].samples < kWarmup) {
    return g.arm[1].samples <= g.arm[0].samples;
  }
  const bool best = g.arm[1].estimate() <= g.arm[0].estimate();
  if (++g.since >= g.interval) {
    g.since = 0;
    g.trial_left = kTrial;
    g.trial_split = !best;
    // The other choice's samples are old news: the trial's products replace them.
    g.arm[g.trial_split ? 1 : 0].samples = 0;
    return !best;
  }
  return best;
}

void GemvSplitTuner::record(std::uint64_t bytes, bool split, double seconds) {
  Group& g = groups_[group_of(bytes)];
  Arm& a = g.arm[split ? 1 : 0];
  a.add(seconds / static_cast<double>(std::max<std::uint64_t>(bytes, 1)));
  if (g.trial_left > 0 && split == g.trial_split && --g.trial_left == 0) {
    const bool won = a.estimate() < g.arm[split ? 0 : 1].estimate();
    g.interval = won ? kMinInterval : std::min(kMaxInterval, 2 * g.interval);
  }
}

double GemvSplitTuner::mean_seconds_per_byte(std::uint64_t bytes, bool split) const {
  return groups_[group_of(bytes)].arm[split ? 1 : 0].estimate();
}

void check_quant_environment() {
  (void)default_cpu_path();
  (void)fixed_split_bytes();
}

GemvSplitStats gemv_split_stats() { return t_split_stats; }
void reset_gemv_split_stats() { t_split_stats = GemvSplitStats{}; }

void quant_gemv(const QuantMatrix& w, std::int64_t o0, std::int64_t o1, const ActivationsQ8& x,
                float* y, std::int64_t ldy, bool accumulate, CpuPath path) {
  NUMATTN_CHECK(cpu_path_available(path) || cpu_can_run(path), "CPU path {} is not available on this machine",
                cpu_path_name(path));
  NUMATTN_CHECK(x.cols == w.cols, "quant_gemv: activations of {} values for rows of {}", x.cols, w.cols);
  NUMATTN_CHECK(o0 >= 0 && o0 <= o1 && o1 <= w.rows(),
                "quant_gemv: rows [{}, {}) of a matrix of {} rows", o0, o1, w.rows());
  const std::int64_t n = x.n;
  if (o0 == o1 || n == 0) return;
  const qkern::KernelTable& kt = *table(path);
  // Parts without an integer kernel multiply x̂ with their float kernel.
  thread_local std::vector<float> xhat;
  bool need_float = false;
  std::int64_t base = 0;
  for (const QuantMatrix::Part& p : w.parts) {
    need_float |= std::max(o0, base) < std::min(o1, base + p.rows) && special_q8(kt, p.type) == nullptr;
    base += p.rows;
  }
  if (need_float) {
    xhat.resize(static_cast<std::size_t>(n * w.cols));
    x.dequantize(xhat.data(), w.cols);
  }
  base = 0;
  for (const QuantMatrix::Part& p : w.parts) {
    const std::int64_t a = std::max(o0, base), b = std::min(o1, base + p.rows);
    if (a < b) {
      const qkern::DotQ8Fn fn = special_q8(kt, p.type);
      if (fn == nullptr) {
        quant_gemv(w, a, b, xhat.data(), n, w.cols, y, ldy, accumulate, path);
        base += p.rows;
        continue;
      }
      // Chunks of rows as in the float32 overload.
      const std::int64_t chunk = n == 1 ? b - a : std::max<std::int64_t>(4, (16 << 10) / p.row_bytes / 4 * 4);
      for (std::int64_t c0 = a; c0 < b; c0 += chunk) {
        const std::int64_t c1 = std::min(b, c0 + chunk);
        const std::uint8_t* rows = p.data + (c0 - base) * p.row_bytes;
        for (std::int64_t r = 0; r < n; ++r)
          fn(rows, p.row_bytes, c1 - c0, x.q.data() + r * x.blocks * ActivationsQ8::kBlock,
             x.d.data() + r * x.blocks, x.s.data() + r * x.blocks, w.cols, y + r * ldy + c0, accumulate);
      }
    }
    base += p.rows;
  }
}

void quant_linear(const ExecContext& ctx, const QuantMatrix& w, const float* x, std::int64_t n,
                  float* y, bool accumulate, std::int64_t ldy, CpuPath path, Activations act) {
  NUMATTN_CHECK(!w.empty(), "quant_linear: empty matrix");
  const std::int64_t out = w.rows(), in = w.cols;
  if (ldy <= 0) ldy = out;
  if (n <= 0 || out == 0) return;
  const int nt = ctx.num_threads();
  if (n <= kQuantGemvMaxBatch) {
    // 8-bit activations: x quantized once, before any split; the slices share it.
    thread_local ActivationsQ8 xq_buf;
    const ActivationsQ8* xq = nullptr;
    if (act == Activations::kQ8) {
      xq_buf.quantize(x, n, in, in);
      xq = &xq_buf;
    }
    auto gemv = [&](std::int64_t a, std::int64_t b) {
      if (xq != nullptr) {
        quant_gemv(w, a, b, *xq, y, ldy, accumulate, path);
      } else {
        quant_gemv(w, a, b, x, n, in, y, ldy, accumulate, path);
      }
    };
    // Row slices in multiples of 16 (cache lines of y, whole rows of the kernels).
    const std::uint64_t bytes = w.bytes() * static_cast<std::uint64_t>(n);
    const std::uint64_t fixed = fixed_split_bytes();
    // One tuner per activation precision: their products take different times per byte.
    thread_local GemvSplitTuner tuners[2];
    thread_local int tuner_threads = 0;
    GemvSplitTuner& tuner = tuners[act == Activations::kQ8 ? 1 : 0];
    bool tuned = false, split = false;
    if (nt > 1 && out >= 32) {
      if (fixed > 0) {
        split = bytes >= fixed;
      } else if (bytes >= kGemvSplitBytes) {
        split = true;
      } else {
        if (tuner_threads != nt) {  // measurements of another team size do not carry over
          tuners[0] = tuners[1] = GemvSplitTuner();
          tuner_threads = nt;
        }
        tuned = true;
        split = tuner.choose(bytes);
      }
    }
    ++(split ? t_split_stats.split : t_split_stats.single);
    const auto t0 = tuned ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (!split) {
      gemv(0, out);
    } else {
      const std::int64_t units = (out + 15) / 16;
      const std::int64_t parts = std::min<std::int64_t>(nt, units);
      parallel_for(ctx, parts, [&](std::int64_t p) {
        const std::int64_t a = std::min(out, units * p / parts * 16);
        const std::int64_t b = std::min(out, units * (p + 1) / parts * 16);
        gemv(a, b);
      });
    }
    if (tuned) {
      tuner.record(bytes, split,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return;
  }
  // Panels of rows dequantized into a float32 tile of up to 8 MiB, each one sgemm; rows in
  // multiples of 16 (the BLAS micro-kernel). The BLAS packs the tile into its own cache-sized
  // panels anyway, so the tile need not fit a cache; what matters is that each sgemm call
  // re-packs all n rows of x and makes a pass over its slice of y, so few, wide tiles are
  // faster: measured on SmolLM2's FFN (K = 576 and 1536), 256 KiB tiles ran prefill about 25%
  // slower than the float32 path, and (thread CPU time, 256 tokens, medians of 15 interleaved
  // runs) W_gate|W_up (3072×576) cut in two 4 MiB tiles spent 3–5% more in sgemm than the one
  // float32 call, in one 7 MiB tile the same. 8 MiB holds every layer matrix of SmolLM2 whole.
  //
  // A split product has at least one tile per thread, in equal shares: with tiles only as
  // large as 4 MiB allowed, SmolLM2's Wq|Wk|Wv, Wo and W_down were one tile each and ran on one
  // thread of two (prefill about 10% below the float32 path, which splits every product).
  constexpr std::int64_t kTileFloats = std::int64_t{1} << 21;
  const std::int64_t cap_rows = std::clamp<std::int64_t>(kTileFloats / in / 16 * 16, 16, 4096);
  const bool split = nt > 1 && out > 16 && n * in * out >= (std::int64_t{1} << 23);
  std::int64_t tiles = (out + cap_rows - 1) / cap_rows;
  if (split) tiles = (tiles + nt - 1) / nt * nt;
  const std::int64_t tile_rows = ((out + tiles - 1) / tiles + 15) / 16 * 16;
  tiles = (out + tile_rows - 1) / tile_rows;
  const float beta = accumulate ? 1.f : 0.f;
  auto run = [&](std::int64_t t0, std::int64_t t1) {
    // One buffer per thread, kept between calls and only ever grown: a std::vector resized up
    // again after a smaller matrix would zero the floats it adds (up to megabytes per product)
    // before the dequantizer overwrites them.
    thread_local std::unique_ptr<float[]> tile;
    thread_local std::size_t capacity = 0;
    const auto need = static_cast<std::size_t>(tile_rows * in);
    if (capacity < need) {
      tile.reset();
      tile = std::make_unique_for_overwrite<float[]>(need);
      capacity = need;
    }
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t a = t * tile_rows, b = std::min(out, a + tile_rows);
      w.dequantize_rows(a, b, tile.get(), path);
      blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, b - a, in, 1.f, x, in, tile.get(), in,
                  beta, y + a, ldy);
    }
  };
  if (!split || tiles == 1) {
    run(0, tiles);
    return;
  }
  const std::int64_t parts = std::min<std::int64_t>(nt, tiles);
  parallel_for(ctx, parts, [&](std::int64_t p) { run(tiles * p / parts, tiles * (p + 1) / parts); });
}

}  // namespace numattn
