// Quantized products (quant/qgemv.h): every dequantizable type × every CPU path this machine
// runs equals the float64 product of the dequantized weights within a summation-order bound;
// odd row counts, row lengths that are not a multiple of the vector width where the format
// allows it, row ranges, batches with strides, accumulation, stacked parts of two types, and
// the panel (prefill) path of quant_linear.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/quant/qgemv.h"
#include "numattn/quant/quant.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

void put_half(std::uint8_t* p, float v) {
  const std::uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Random rows of `type`: random bytes, with every scale field overwritten by a finite value of
// either sign (so no block decodes to NaN/Inf, and min/offset terms of both signs occur).
std::vector<std::uint8_t> random_rows(GgmlType type, std::int64_t rows, std::int64_t cols,
                                      std::mt19937& g) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  const std::int64_t rb = ggml_row_bytes(type, cols), nb = cols / ti.block_elems;
  std::vector<std::uint8_t> b(static_cast<std::size_t>(rows * rb));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : b) v = static_cast<std::uint8_t>(byte(g));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto scale = [&](float mag) { return mag * u(g); };
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < nb; ++k) {
      std::uint8_t* p = b.data() + r * rb + k * ti.block_bytes;
      switch (type) {
        case GgmlType::F32: {
          const float v = u(g);
          std::memcpy(p, &v, 4);
          break;
        }
        case GgmlType::F16: put_half(p, u(g)); break;
        case GgmlType::BF16: {
          const std::uint16_t h = fp32_to_bf16(u(g));
          std::memcpy(p, &h, 2);
          break;
        }
        case GgmlType::Q8_0: put_half(p, scale(0.01f)); break;
        case GgmlType::Q4_0: case GgmlType::Q5_0: put_half(p, scale(0.1f)); break;
        case GgmlType::Q4_1: case GgmlType::Q5_1:
          put_half(p, std::abs(scale(0.1f)));
          put_half(p + 2, scale(1.f));
          break;
        case GgmlType::Q4_K: case GgmlType::Q5_K:
          put_half(p, std::abs(scale(0.01f)));
          put_half(p + 2, std::abs(scale(0.01f)));
          break;
        case GgmlType::Q6_K: put_half(p + 208, scale(0.001f)); break;
        default: ADD_FAILURE() << "type " << ti.name;
      }
    }
  return b;
}

// Magnitude of the offset every value of block k carries besides its scaled quant (the term
// that cancels: m for Q4_1/Q5_1, 8d / 16d for Q4_0 / Q5_0, up to 63·dmin for Q4_K, 32·d·|sc|
// for Q6_K); rounding errors scale with |d·q| + |offset|, not with the value.
double block_offset(GgmlType type, const std::uint8_t* p) {
  auto h = [](const std::uint8_t* q) {
    std::uint16_t v;
    std::memcpy(&v, q, 2);
    return std::abs(static_cast<double>(fp16_to_fp32(v)));
  };
  switch (type) {
    case GgmlType::Q4_0: return 8 * h(p);
    case GgmlType::Q5_0: return 16 * h(p);
    case GgmlType::Q4_1: case GgmlType::Q5_1: return h(p + 2);
    case GgmlType::Q4_K: case GgmlType::Q5_K: return 63 * h(p + 2);
    case GgmlType::Q6_K: return 32 * 128 * h(p + 208);
    default: return 0;
  }
}

struct Ref {
  double value = 0, bound = 0;
};

// float64 product of one dequantized row with x, and the bound the kernels must meet:
// (cols + 64)·u·Σ (|w_i| + offset_i)·|x_i| with u = 2^-24 — a summation-order bound (any
// order of cols float32 additions) plus a few roundings per element for the block decode.
Ref reference(GgmlType type, const std::uint8_t* row, const float* x, std::int64_t cols) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  std::vector<float> w(static_cast<std::size_t>(cols));
  dequantize_row(type, row, w.data(), cols);
  Ref r;
  double mag = 0;
  for (std::int64_t i = 0; i < cols; ++i) {
    const double off = block_offset(type, row + i / ti.block_elems * ti.block_bytes);
    r.value += static_cast<double>(w[static_cast<std::size_t>(i)]) * x[i];
    mag += (std::abs(static_cast<double>(w[static_cast<std::size_t>(i)])) + off) * std::abs(x[i]);
  }
  r.bound = static_cast<double>(cols + 64) * std::ldexp(1.0, -24) * mag + 1e-30;
  return r;
}

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                           GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// Row lengths: several block counts; for the one-element types lengths that leave a tail
// after every vector width (16, 32) too.
std::vector<std::int64_t> lengths(GgmlType t) {
  const std::int64_t be = ggml_type_info(t).block_elems;
  if (be == 1) return {1, 7, 17, 45, 579};
  if (be == 32) return {32, 96, 576};
  return {256, 768};
}

TEST(QGemv, PathsAreNamedAndPortableAlwaysRuns) {
  const auto paths = available_cpu_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), CpuPath::kPortable);
  EXPECT_TRUE(cpu_path_available(default_cpu_path()));
  for (CpuPath p : {CpuPath::kPortable, CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAvx512Vnni})
    EXPECT_EQ(parse_cpu_path(cpu_path_name(p)), p);
  // VNNI is an extension of the AVX-512 path: never available without it.
  if (cpu_path_available(CpuPath::kAvx512Vnni)) EXPECT_TRUE(cpu_path_available(CpuPath::kAvx512));
  EXPECT_THROW(parse_cpu_path("sse9"), Error);
  // A path the CPU lacks is refused, never run.
  for (CpuPath p : {CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAvx512Vnni}) {
    if (cpu_path_available(p)) continue;
    QuantMatrix m;
    m.cols = 1;
    const float w = 1, x = 1;
    m.parts.push_back({GgmlType::F32, reinterpret_cast<const std::uint8_t*>(&w), 1, 4});
    float y = 0;
    EXPECT_THROW(quant_gemv(m, 0, 1, &x, 1, 1, &y, 1, false, p), Error);
  }
}

TEST(QGemv, EveryTypeEveryPathMatchesFloat64) {
  std::mt19937 g(2024);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (GgmlType type : kTypes) {
    for (std::int64_t cols : lengths(type)) {
      const std::int64_t rows = 37;  // odd: the row split and any row blocking see a remainder
      const auto data = random_rows(type, rows, cols, g);
      const std::int64_t rb = ggml_row_bytes(type, cols);
      QuantMatrix m;
      m.cols = cols;
      m.parts.push_back({type, data.data(), rows, rb});
      // Three vectors with a leading dimension larger than cols; y with a stride too.
      const std::int64_t n = 3, ldx = cols + 5, ldy = rows + 3;
      std::vector<float> x(static_cast<std::size_t>(n * ldx));
      for (auto& v : x) v = nd(g);
      std::vector<Ref> ref;
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t o = 0; o < rows; ++o)
          ref.push_back(reference(type, data.data() + o * rb, x.data() + r * ldx, cols));
      for (CpuPath path : available_cpu_paths()) {
        SCOPED_TRACE(::testing::Message() << ggml_type_name(type) << " cols=" << cols << " path="
                                          << cpu_path_name(path));
        std::vector<float> y(static_cast<std::size_t>(n * ldy), 7.f);
        quant_gemv(m, 0, rows, x.data(), n, ldx, y.data(), ldy, false, path);
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t o = 0; o < rows; ++o) {
            const Ref& e = ref[static_cast<std::size_t>(r * rows + o)];
            ASSERT_NEAR(y[static_cast<std::size_t>(r * ldy + o)], e.value, e.bound) << "r=" << r << " o=" << o;
          }
        // The padding between rows of y is untouched.
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t o = rows; o < ldy; ++o) ASSERT_EQ(y[static_cast<std::size_t>(r * ldy + o)], 7.f);
        // A row range with accumulation adds to what is there and leaves the rest alone.
        std::vector<float> z(static_cast<std::size_t>(n * ldy), 1.f);
        quant_gemv(m, 5, 22, x.data(), n, ldx, z.data(), ldy, true, path);
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t o = 0; o < rows; ++o) {
            const float got = z[static_cast<std::size_t>(r * ldy + o)];
            if (o < 5 || o >= 22) {
              ASSERT_EQ(got, 1.f);
            } else {
              const Ref& e = ref[static_cast<std::size_t>(r * rows + o)];
              ASSERT_NEAR(got, 1.0 + e.value, e.bound + 1e-7) << "r=" << r << " o=" << o;
            }
          }
      }
    }
  }
}

// Wq|Wk|Wv-like stacks: parts of different types under one row index, and quant_linear's two
// regimes (row-split GEMV for a few vectors, dequantized panels + sgemm for more) against it.
TEST(QGemv, StackedPartsAndQuantLinearBothRegimes) {
  std::mt19937 g(77);
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::int64_t cols = 512;
  const GgmlType types[] = {GgmlType::Q4_1, GgmlType::Q6_K, GgmlType::Q8_0};
  const std::int64_t rows[] = {45, 3, 211};
  std::vector<std::vector<std::uint8_t>> data;
  QuantMatrix m;
  m.cols = cols;
  for (int i = 0; i < 3; ++i) {
    data.push_back(random_rows(types[i], rows[i], cols, g));
    m.parts.push_back({types[i], data.back().data(), rows[i], ggml_row_bytes(types[i], cols)});
  }
  const std::int64_t R = m.rows();
  ASSERT_EQ(R, 259);
  EXPECT_EQ(m.type_string(), "Q4_1+Q6_K+Q8_0");
  EXPECT_EQ(m.bytes(), static_cast<std::uint64_t>(45 * 320 + 3 * 420 + 211 * 544));
  std::vector<float> wf(static_cast<std::size_t>(R * cols));
  m.dequantize_rows(0, R, wf.data());
  // dequantize_rows over a range that straddles two part boundaries.
  std::vector<float> mid(static_cast<std::size_t>(10 * cols));
  m.dequantize_rows(44, 54, mid.data());
  for (std::int64_t i = 0; i < 10 * cols; ++i)
    ASSERT_EQ(mid[static_cast<std::size_t>(i)], wf[static_cast<std::size_t>(44 * cols + i)]);
  const QuantMatrix head = m.first_rows(47);
  EXPECT_EQ(head.rows(), 47);
  EXPECT_EQ(head.parts.size(), 2u);
  EXPECT_EQ(head.parts[1].rows, 2);
  // n = 64 is large enough (n·cols·rows >= 2^23) for the dequantized-panel regime to split its
  // tiles over two threads.
  for (std::int64_t n : {1, 2, 4, 5, 37, 64}) {
    std::vector<float> x(static_cast<std::size_t>(n * cols));
    for (auto& v : x) v = nd(g);
    for (CpuPath path : available_cpu_paths())
      for (int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " path=" << cpu_path_name(path)
                                          << " threads=" << threads);
        std::vector<float> y(static_cast<std::size_t>(n * R), 0.5f);
        quant_linear(ExecContext{threads}, m, x.data(), n, y.data(), true, 0, path);
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t o = 0; o < R; ++o) {
            double ref = 0.5, mag = 0.5;
            for (std::int64_t j = 0; j < cols; ++j) {
              const double w = wf[static_cast<std::size_t>(o * cols + j)], xv = x[static_cast<std::size_t>(r * cols + j)];
              ref += w * xv;
              mag += std::abs(w * xv);
            }
            // Offsets of Q4_1 (|m| <= 1 here) enter the kernels' rounding as well.
            const double bound = (cols + 64) * std::ldexp(1.0, -24) * (mag + 1.0 * cols * 4);
            ASSERT_NEAR(y[static_cast<std::size_t>(r * R + o)], ref, bound) << "r=" << r << " o=" << o;
          }
      }
  }
  EXPECT_THROW(quant_linear(ExecContext{1}, QuantMatrix{}, nullptr, 1, nullptr, false), Error);
  EXPECT_THROW(m.first_rows(R + 1), Error);
}

// The prefill's panels: QuantMatrix::dequantize_rows (the default path's vector dequantizers
// where it has them) equals dequantize_row bit for bit (every path: tests/quant/kquant_test.cpp).
TEST(QGemv, PanelDequantizationEqualsDequantizeRow) {
  std::mt19937 g(5);
  for (GgmlType type : kTypes)
    for (std::int64_t cols : lengths(type)) {
      const std::int64_t rows = 9;
      const auto data = random_rows(type, rows, cols, g);
      const std::int64_t rb = ggml_row_bytes(type, cols);
      QuantMatrix m;
      m.cols = cols;
      m.parts.push_back({type, data.data(), rows, rb});
      std::vector<float> got(static_cast<std::size_t>(rows * cols)), want(got.size());
      m.dequantize_rows(0, rows, got.data());
      dequantize_row(type, data.data(), want.data(), rows * cols);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << ggml_type_name(type);
    }
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
