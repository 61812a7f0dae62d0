// 8-bit activations of the quantized products (quant/qgemv.h, Activations::kQ8):
// ActivationsQ8 against its rule written out here; the integer kernels of Q8_0, Q4_0 and Q4_1
// on every CPU path against a float64 transcription of Σ_blocks d_w·d_x·Σ q_w·q_x (+ m_w·s_x)
// read from the raw blocks, and against the float32-activation product within the bound of x's
// rounding; other types inside the same product; zero, huge, tiny and non-finite x; quant_linear
// split over threads. A whole tiny model with them: tests/model/llama_activations_q8_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/quant/qgemv.h"
#include "numattn/quant/quant.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr double kU = 0x1p-24;  // unit roundoff of float32

double half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

void put_half(std::uint8_t* p, float v) {
  const std::uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Random blocks with finite scales (and mins of both signs for Q4_1); Q8_0, Q4_0, Q4_1, Q6_K.
std::vector<std::uint8_t> random_rows(GgmlType type, std::int64_t rows, std::int64_t cols, std::mt19937& g) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  const std::int64_t rb = ggml_row_bytes(type, cols);
  std::vector<std::uint8_t> b(static_cast<std::size_t>(rows * rb));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : b) v = static_cast<std::uint8_t>(byte(g));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < cols / ti.block_elems; ++k) {
      std::uint8_t* p = b.data() + r * rb + k * ti.block_bytes;
      if (type == GgmlType::Q6_K) {
        put_half(p + 208, 0.001f * u(g));
        continue;
      }
      put_half(p, type == GgmlType::Q4_1 ? 0.1f * std::abs(u(g)) : 0.05f * u(g));
      if (type == GgmlType::Q4_1) put_half(p + 2, u(g));
    }
  return b;
}

// The quants of one block of 32 as signed integers, its scale and its min (0 but for Q4_1),
// transcribed from the GGUF block layouts.
struct Block {
  int q[32];
  double d = 0, m = 0;
};

Block read_block(GgmlType type, const std::uint8_t* p) {
  Block b;
  b.d = half_at(p);
  if (type == GgmlType::Q8_0) {
    for (int j = 0; j < 32; ++j) b.q[j] = static_cast<std::int8_t>(p[2 + j]);
    return b;
  }
  const bool q41 = type == GgmlType::Q4_1;
  const std::uint8_t* qs = p + (q41 ? 4 : 2);
  if (q41) b.m = half_at(p + 2);
  for (int j = 0; j < 16; ++j) {
    b.q[j] = (qs[j] & 15) - (q41 ? 0 : 8);
    b.q[16 + j] = (qs[j] >> 4) - (q41 ? 0 : 8);
  }
  return b;
}

// ActivationsQ8's rule for one block, written apart from the library.
struct QBlock {
  std::vector<int> q;
  float d = 0, s = 0;
};

QBlock quantize_block(const float* x, std::int64_t m) {
  QBlock b;
  b.q.assign(32, 0);
  float amax = 0;
  for (std::int64_t j = 0; j < m; ++j) {
    if (!std::isfinite(x[j])) {
      b.d = b.s = std::numeric_limits<float>::quiet_NaN();
      return b;
    }
    amax = std::max(amax, std::fabs(x[j]));
  }
  b.d = amax / 127.f;
  long sum = 0;
  for (std::int64_t j = 0; j < m && amax > 0; ++j) {
    const float quotient = x[j] / b.d;  // rounded to float32 first, then to the nearest integer
    b.q[static_cast<std::size_t>(j)] = static_cast<int>(std::clamp(std::nearbyint(quotient), -127.f, 127.f));
    sum += b.q[static_cast<std::size_t>(j)];
  }
  b.s = b.d * static_cast<float>(sum);
  return b;
}

struct Ref {
  double value = 0;  // Σ_b d_w·d_x·Σ q_w·q_x + m_w·s_x, float64
  double bound = 0;  // the kernels' float32 rounding of it
  double exact = 0;  // Σ w·x with float32-activation x (float64)
  double xbound = 0; // |exact − value| bound from x's rounding
};

Ref reference(GgmlType type, const std::uint8_t* row, const float* x, std::int64_t cols) {
  const std::int64_t nb = cols / 32, bb = ggml_type_info(type).block_bytes;
  Ref r;
  double mag = 0, tiny = 0, wx_mag = 0;
  for (std::int64_t b = 0; b < nb; ++b) {
    const Block w = read_block(type, row + b * bb);
    const QBlock xb = quantize_block(x + 32 * b, 32);
    double isum = 0, iabs = 0, wabs = 0;
    for (int j = 0; j < 32; ++j) {
      isum += static_cast<double>(w.q[j]) * xb.q[static_cast<std::size_t>(j)];
      iabs += std::abs(static_cast<double>(w.q[j]) * xb.q[static_cast<std::size_t>(j)]);
      const double wj = w.d * w.q[j] + w.m;
      wabs += std::abs(wj);
      r.exact += wj * x[32 * b + j];
      wx_mag += std::abs(wj * x[32 * b + j]);
    }
    r.value += w.d * xb.d * isum + w.m * xb.s;
    mag += std::abs(w.d * xb.d) * iabs + std::abs(w.m * xb.s);
    tiny += iabs + 16;
    // |x − d·q| <= d·(1/2 + 128u): the quotient x/d is rounded to float32 before the integer.
    r.xbound += xb.d * (0.5 + 128 * kU) * wabs + std::abs(w.m * xb.s) * kU;
  }
  // Each block term: d_w·d_x rounded once, one rounding per accumulation (<= nb), <= 8 in the
  // horizontal and final sums; a subnormal d_w·d_x is off by up to 2^-150 per unit of |Σqq|.
  r.bound = static_cast<double>(nb + 8) * kU * mag + tiny * 0x1p-149;
  r.xbound += r.bound + static_cast<double>(cols) * kU * wx_mag;
  return r;
}

const GgmlType kIntTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1};

TEST(QGemvQ8, ActivationsFollowTheRule) {
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::int64_t n = 3, cols = 32 * 4 + 13, ldx = cols + 3;  // a short last block
  std::vector<float> x(static_cast<std::size_t>(n * ldx));
  for (auto& v : x) v = nd(g);
  // Vector 1: block 0 zero, block 1 huge, block 2 tiny (subnormal scale), block 3 with a NaN;
  // vector 2: an Inf in the short last block.
  for (int j = 0; j < 32; ++j) {
    x[static_cast<std::size_t>(ldx + j)] = 0;
    x[static_cast<std::size_t>(ldx + 32 + j)] *= 1e36f;
    x[static_cast<std::size_t>(ldx + 64 + j)] *= 1e-40f;
  }
  x[static_cast<std::size_t>(ldx + 100)] = std::numeric_limits<float>::quiet_NaN();
  x[static_cast<std::size_t>(2 * ldx + 130)] = -std::numeric_limits<float>::infinity();
  ActivationsQ8 a;
  a.quantize(x.data(), n, ldx, cols);
  ASSERT_EQ(a.blocks, 5);
  std::vector<float> xhat(static_cast<std::size_t>(n * cols));
  a.dequantize(xhat.data(), cols);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t b = 0; b < a.blocks; ++b) {
      SCOPED_TRACE(::testing::Message() << "r=" << r << " b=" << b);
      const std::int64_t m = std::min<std::int64_t>(32, cols - 32 * b);
      const QBlock e = quantize_block(x.data() + r * ldx + 32 * b, m);
      const std::size_t i = static_cast<std::size_t>(r * a.blocks + b);
      if (std::isnan(e.d)) {
        EXPECT_TRUE(std::isnan(a.d[i]) && std::isnan(a.s[i]));
      } else {
        EXPECT_EQ(a.d[i], e.d);
        EXPECT_EQ(a.s[i], e.s);
      }
      for (int j = 0; j < 32; ++j) {
        EXPECT_EQ(a.q[static_cast<std::size_t>((r * a.blocks + b) * 32 + j)], e.q[static_cast<std::size_t>(j)]);
        if (j >= m) continue;
        const float xv = x[static_cast<std::size_t>(r * ldx + 32 * b + j)];
        const float h = xhat[static_cast<std::size_t>(r * cols + 32 * b + j)];
        if (std::isnan(e.d)) {
          EXPECT_TRUE(std::isnan(h));
        } else {
          EXPECT_LE(std::abs(static_cast<double>(h) - xv), e.d * (0.5 + 256 * kU) + 0x1p-149);
        }
      }
    }
  // The zero block is exactly zero; the others are not all-zero.
  EXPECT_EQ(a.d[static_cast<std::size_t>(a.blocks)], 0.f);
  EXPECT_GT(a.d[static_cast<std::size_t>(a.blocks + 1)], 1e34f);
  EXPECT_GT(a.d[static_cast<std::size_t>(a.blocks + 2)], 0.f);
  EXPECT_THROW(a.quantize(x.data(), 1, cols - 1, cols), Error);
  EXPECT_EQ(parse_activations("q8"), Activations::kQ8);
  EXPECT_STREQ(activations_name(Activations::kF32), "f32");
  EXPECT_THROW(parse_activations("int8"), Error);
}

TEST(QGemvQ8, EveryIntegerTypeEveryPathMatchesFloat64) {
  std::mt19937 g(2026);
  std::normal_distribution<float> nd(0.f, 1.f);
  // Scales of x: ordinary, huge, tiny (d_x subnormal and d_w·d_x underflowing).
  for (float scale : {1.f, 1e30f, 1e-38f})
    for (GgmlType type : kIntTypes)
      for (std::int64_t cols : {32, 96, 576, 608}) {  // 608: an odd block count (tail of a 2-block step)
        const std::int64_t rows = 37, n = 3, ldy = rows + 2;
        const auto data = random_rows(type, rows, cols, g);
        const std::int64_t rb = ggml_row_bytes(type, cols);
        QuantMatrix m;
        m.cols = cols;
        m.parts.push_back({type, data.data(), rows, rb});
        std::vector<float> x(static_cast<std::size_t>(n * cols));
        for (auto& v : x) v = scale * nd(g);
        std::fill(x.begin() + 32, x.begin() + 64, 0.f);  // a zero block in vector 0 (cols > 32)
        ActivationsQ8 a;
        a.quantize(x.data(), n, cols, cols);
        std::vector<Ref> ref;
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t o = 0; o < rows; ++o) ref.push_back(reference(type, data.data() + o * rb, x.data() + r * cols, cols));
        for (CpuPath path : available_cpu_paths()) {
          SCOPED_TRACE(::testing::Message() << ggml_type_name(type) << " cols=" << cols << " scale=" << scale
                                            << " path=" << cpu_path_name(path));
          std::vector<float> y(static_cast<std::size_t>(n * ldy), 7.f);
          quant_gemv(m, 0, rows, a, y.data(), ldy, false, path);
          for (std::int64_t r = 0; r < n; ++r) {
            for (std::int64_t o = 0; o < rows; ++o) {
              const Ref& e = ref[static_cast<std::size_t>(r * rows + o)];
              const double got = y[static_cast<std::size_t>(r * ldy + o)];
              ASSERT_NEAR(got, e.value, e.bound) << "r=" << r << " o=" << o;
              ASSERT_NEAR(got, e.exact, e.xbound) << "r=" << r << " o=" << o;
            }
            for (std::int64_t o = rows; o < ldy; ++o) ASSERT_EQ(y[static_cast<std::size_t>(r * ldy + o)], 7.f);
          }
          // A row range with accumulation.
          std::vector<float> z(static_cast<std::size_t>(n * ldy), 1.f);
          quant_gemv(m, 5, 22, a, z.data(), ldy, true, path);
          for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t o = 0; o < rows; ++o) {
              const double got = z[static_cast<std::size_t>(r * ldy + o)];
              if (o < 5 || o >= 22) {
                ASSERT_EQ(got, 1.0);
              } else {
                const Ref& e = ref[static_cast<std::size_t>(r * rows + o)];
                ASSERT_NEAR(got, 1.0 + e.value, e.bound + 2 * kU * (1 + std::abs(e.value)));
              }
            }
        }
      }
}

TEST(QGemvQ8, NonFiniteAndZeroActivations) {
  std::mt19937 g(3);
  const std::int64_t cols = 96, rows = 9;
  for (GgmlType type : kIntTypes) {
    const auto data = random_rows(type, rows, cols, g);
    QuantMatrix m;
    m.cols = cols;
    m.parts.push_back({type, data.data(), rows, ggml_row_bytes(type, cols)});
    std::vector<float> x(static_cast<std::size_t>(3 * cols), 0.f);
    x[static_cast<std::size_t>(cols + 40)] = std::numeric_limits<float>::infinity();
    x[static_cast<std::size_t>(2 * cols + 95)] = std::numeric_limits<float>::quiet_NaN();
    ActivationsQ8 a;
    a.quantize(x.data(), 3, cols, cols);
    for (CpuPath path : available_cpu_paths()) {
      SCOPED_TRACE(::testing::Message() << ggml_type_name(type) << " path=" << cpu_path_name(path));
      std::vector<float> y(static_cast<std::size_t>(3 * rows), 5.f);
      quant_gemv(m, 0, rows, a, y.data(), rows, false, path);
      for (std::int64_t o = 0; o < rows; ++o) {
        EXPECT_EQ(y[static_cast<std::size_t>(o)], 0.f);  // x = 0: exactly 0 (d_x = s_x = 0)
        EXPECT_TRUE(std::isnan(y[static_cast<std::size_t>(rows + o)]));
        EXPECT_TRUE(std::isnan(y[static_cast<std::size_t>(2 * rows + o)]));
      }
    }
  }
}

// Negative weights through the scalar block sums (the portable path, and the blocks after the
// last whole vector step of the wide paths: every block count 1..9). A compiler that turns a
// signed × signed byte loop into vpdpbusd (unsigned × signed) counts each negative quant as
// q + 256; see qgemv_simd.h. Weights: every Q8_0 quant −1, −128 or random negative; Q4_0
// nibbles 0..7 (quants −8..−1); Q4_1 with a negative min (w = q·d + m < 0). x: all ones, and
// signed random values.
TEST(QGemvQ8, ScalarBlockSumsWithNegativeWeightsEveryBlockCount) {
  std::mt19937 g(41);
  std::uniform_int_distribution<int> neg(-128, -1), nib(0, 7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (GgmlType type : kIntTypes)
    for (int fill = 0; fill < 3; ++fill)
      for (std::int64_t nb = 1; nb <= 9; ++nb) {
        const std::int64_t cols = 32 * nb, rows = 5, rb = ggml_row_bytes(type, cols);
        std::vector<std::uint8_t> data(static_cast<std::size_t>(rows * rb));
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t b = 0; b < nb; ++b) {
            std::uint8_t* p = data.data() + r * rb + b * ggml_type_info(type).block_bytes;
            put_half(p, 1.f);
            if (type == GgmlType::Q8_0) {
              for (int j = 0; j < 32; ++j)
                p[2 + j] = static_cast<std::uint8_t>(fill == 0 ? -1 : fill == 1 ? -128 : neg(g));
            } else {
              const int off = type == GgmlType::Q4_1 ? 4 : 2;
              if (type == GgmlType::Q4_1) put_half(p + 2, -8.f);
              for (int j = 0; j < 16; ++j)
                p[off + j] = static_cast<std::uint8_t>(fill == 0 ? 0 : fill == 1 ? 0x77 : nib(g) | nib(g) << 4);
            }
          }
        QuantMatrix m;
        m.cols = cols;
        m.parts.push_back({type, data.data(), rows, rb});
        for (int xs = 0; xs < 2; ++xs) {
          std::vector<float> x(static_cast<std::size_t>(cols), 1.f);
          if (xs == 1)
            for (auto& v : x) v = nd(g);
          ActivationsQ8 a;
          a.quantize(x.data(), 1, cols, cols);
          for (CpuPath path : available_cpu_paths()) {
            SCOPED_TRACE(::testing::Message() << ggml_type_name(type) << " fill=" << fill << " blocks=" << nb
                                              << " x=" << (xs ? "random" : "ones") << " path=" << cpu_path_name(path));
            std::vector<float> y(static_cast<std::size_t>(rows), 3.f);
            quant_gemv(m, 0, rows, a, y.data(), rows, false, path);
            for (std::int64_t o = 0; o < rows; ++o) {
              const Ref e = reference(type, data.data() + o * rb, x.data(), cols);
              ASSERT_NEAR(y[static_cast<std::size_t>(o)], e.value, e.bound) << "row " << o;
              if (xs == 0) ASSERT_LT(y[static_cast<std::size_t>(o)], 0.f) << "row " << o;  // every w·x < 0
            }
          }
        }
      }
}

// A stack of integer and float-kernel types: the float parts multiply x̂ (what every part of
// the product then sees); quant_linear's few-vector regime with 8-bit activations, on one
// thread and split over two (the matrix is over the default 8 MiB split threshold).
TEST(QGemvQ8, MixedPartsAndQuantLinear) {
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  const std::int64_t cols = 4096;
  const GgmlType types[] = {GgmlType::Q4_1, GgmlType::Q6_K, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0};
  const std::int64_t rows[] = {2001, 5, 3, 1203, 11};
  std::vector<std::vector<std::uint8_t>> data;
  QuantMatrix m;
  m.cols = cols;
  for (int i = 0; i < 5; ++i) {
    const std::int64_t rb = ggml_row_bytes(types[i], cols);
    std::vector<std::uint8_t> b;
    if (types[i] == GgmlType::F16) {
      std::vector<float> v(static_cast<std::size_t>(rows[i] * cols));
      for (auto& e : v) e = 0.05f * nd(g);
      b.resize(static_cast<std::size_t>(rows[i] * rb));
      quantize_row(types[i], v.data(), b.data(), rows[i] * cols);
    } else {
      b = random_rows(types[i], rows[i], cols, g);
    }
    data.push_back(std::move(b));
    m.parts.push_back({types[i], data.back().data(), rows[i], rb});
  }
  ASSERT_GE(m.bytes(), std::uint64_t{8} << 20);
  const std::int64_t R = m.rows();
  std::vector<float> wf(static_cast<std::size_t>(R * cols));
  m.dequantize_rows(0, R, wf.data());
  for (std::int64_t n : {1, 3}) {
    std::vector<float> x(static_cast<std::size_t>(n * cols));
    for (auto& v : x) v = nd(g);
    ActivationsQ8 a;
    a.quantize(x.data(), n, cols, cols);
    std::vector<float> xhat(x.size());
    a.dequantize(xhat.data(), cols);
    for (CpuPath path : available_cpu_paths())
      for (int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " path=" << cpu_path_name(path) << " threads=" << threads);
        std::vector<float> y(static_cast<std::size_t>(n * R), 0.5f);
        quant_linear(ExecContext{threads}, m, x.data(), n, y.data(), true, 0, path, Activations::kQ8);
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t o = 0; o < R; ++o) {
            double ref = 0.5, mag = 0.5;
            for (std::int64_t j = 0; j < cols; ++j) {
              const double w = wf[static_cast<std::size_t>(o * cols + j)];
              const double xv = xhat[static_cast<std::size_t>(r * cols + j)];
              ref += w * xv;
              mag += std::abs(w * xv);
            }
            // Summation order, the rounding of d_w·d_x and of x̂ itself, and the blocks'
            // offsets in the rounding (|m| <= 1 for Q4_1, 8·|d| <= 0.4 for Q4_0, 32·|d·sc| <= 4.1
            // for Q6_K), with |x̂| <= 2 on average.
            const double bound = (cols + 64) * kU * (mag + 8.0 * cols);
            ASSERT_NEAR(y[static_cast<std::size_t>(r * R + o)], ref, bound) << "r=" << r << " o=" << o;
          }
      }
  }
  ActivationsQ8 wrong;
  std::vector<float> x(100, 1.f);
  wrong.quantize(x.data(), 1, 100, 100);
  std::vector<float> y(static_cast<std::size_t>(R));
  EXPECT_THROW(quant_gemv(m, 0, R, wrong, y.data(), R, false, default_cpu_path()), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
