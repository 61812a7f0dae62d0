// The K-quants and the 5-bit encodings read in place (quant/quant.h, quant/qgemv.h): Q4_K, Q5_K,
// Q6_K, Q5_0, Q5_1 (and Q8_0, Gemma 3's fourth encoding) on random valid blocks and on edge
// blocks (zero, negative, the largest and the smallest fp16 scales):
// - dequantize_row equals the block formula evaluated in float64 from the raw bytes (written
//   here from the layouts, not calling the library), rounded once to float32;
// - quant_gemv on every available CPU path (and the emulated AVX-512 tables where this CPU runs
//   AVX-512 itself) equals the float64 product of the dequantized weights within the
//   summation-order bound of docs/numerics.md, for row counts that are not multiples of four,
//   rows of several blocks, 1 to 4 vectors, with and without accumulation;
// - matrices stacking parts of several of these types, through quant_gemv and quant_linear;
// - the prefill's panel dequantizers (QuantMatrix::dequantize_rows) equal dequantize_row bit
//   for bit on every path, for every dequantizable type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "numattn/quant/qgemv.h"
#include "numattn/quant/quant.h"
#include "quant/qgemv_kernels.h"
#include "support/qgemv_emulated.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

constexpr double kU = 0x1p-24;  // unit roundoff of float32

const GgmlType kTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                           GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0};

double half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

void put_half_bits(std::uint8_t* p, std::uint16_t h) { std::memcpy(p, &h, 2); }

// Offsets of the fp16 scale fields of one block.
std::vector<int> scale_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q6_K: return {208};
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: return {0, 2};  // d, m
    case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};  // d, dmin
    default: return {};                                       // F32, F16, BF16: random bytes
  }
}

// A random finite fp16: either sign, magnitude 2^e·(1 + f) with e in [−14, 3] (normal), or now
// and then a subnormal, zero or the largest finite one.
std::uint16_t random_half(std::mt19937& g) {
  std::uniform_int_distribution<int> pick(0, 19), e(-14, 3);
  std::uniform_real_distribution<float> f(1.f, 2.f);
  const int k = pick(g);
  const std::uint16_t sign = (g() & 1) ? 0x8000 : 0;
  if (k == 0) return sign;                                              // ±0
  if (k == 1) return static_cast<std::uint16_t>(sign | (1 + g() % 1023));  // subnormal
  if (k == 2) return static_cast<std::uint16_t>(sign | 0x7bff);        // 65504
  return static_cast<std::uint16_t>(sign | fp32_to_fp16(std::ldexp(f(g), e(g))));
}

// Random valid rows: random bytes for quants and packed scales, every fp16 scale field a random
// finite value (so no value is NaN or infinite).
std::vector<std::uint8_t> random_rows(GgmlType type, std::int64_t rows, std::int64_t cols, std::mt19937& g) {
  const GgmlTypeInfo& ti = ggml_type_info(type);
  const std::int64_t rb = ggml_row_bytes(type, cols);
  std::vector<std::uint8_t> b(static_cast<std::size_t>(rows * rb));
  for (auto& v : b) v = static_cast<std::uint8_t>(g());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < cols / ti.block_elems; ++k)
      for (int f : scale_fields(type)) put_half_bits(b.data() + r * rb + k * ti.block_bytes + f, random_half(g));
  return b;
}

// 6-bit scale (which = 0) or min (1) of sub-block s of a Q4_K / Q5_K block's scales[12].
int k_field(const std::uint8_t* sc, int s, int which) {
  if (s < 4) return sc[s + 4 * which] & 63;
  return which == 0 ? (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4) : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
}

// Element e of the block at p, from the layouts (float64; exact for every type here), and the
// magnitude of its cancelling term (docs/numerics.md: 16d, m, 63·dmin, 32·|d·sc|).
struct Value {
  double w = 0, offset = 0;
};

Value block_value(GgmlType t, const std::uint8_t* p, int e) {
  switch (t) {
    case GgmlType::Q8_0: return {half_at(p) * static_cast<std::int8_t>(p[2 + e]), 0};
    case GgmlType::Q5_0: case GgmlType::Q5_1: {
      const bool m = t == GgmlType::Q5_1;
      const std::uint8_t* qh = p + (m ? 4 : 2);
      const std::uint8_t* qs = qh + 4;
      const int nib = e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4);
      const int q = nib | (((qh[e / 8] >> (e % 8)) & 1) << 4);
      const double d = half_at(p);
      if (m) return {d * q + half_at(p + 2), std::abs(half_at(p + 2))};
      return {d * (q - 16), 16 * std::abs(d)};
    }
    case GgmlType::Q4_K: case GgmlType::Q5_K: {
      const bool five = t == GgmlType::Q5_K;
      const int s = e / 32, l = e % 32;
      const std::uint8_t byte = p[(five ? 48 : 16) + 32 * (s / 2) + l];
      int q = s % 2 == 0 ? (byte & 15) : (byte >> 4);
      if (five) q += 16 * ((p[16 + l] >> s) & 1);
      const double d = half_at(p), dmin = half_at(p + 2);
      return {d * k_field(p + 4, s, 0) * q - dmin * k_field(p + 4, s, 1), 63 * std::abs(dmin)};
    }
    case GgmlType::Q6_K: {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const std::uint8_t lb = p[64 * h + l + (k % 2 == 1 ? 32 : 0)];
      const int lo = k < 2 ? (lb & 15) : (lb >> 4);
      const int hi = (p[128 + 32 * h + l] >> (2 * k)) & 3;
      const int sc = static_cast<std::int8_t>(p[192 + 8 * h + l / 16 + 2 * k]);
      const double ds = half_at(p + 208) * sc;
      return {ds * ((lo | (hi << 4)) - 32), 32 * std::abs(ds)};
    }
    default: ADD_FAILURE() << ggml_type_name(t); return {};
  }
}

Value row_value(GgmlType t, const std::uint8_t* row, std::int64_t j) {
  const GgmlTypeInfo& ti = ggml_type_info(t);
  return block_value(t, row + j / ti.block_elems * ti.block_bytes, static_cast<int>(j % ti.block_elems));
}

std::vector<std::int64_t> lengths(GgmlType t) {
  if (ggml_type_info(t).block_elems == 256) return {256, 768, 2048};
  return {32, 96, 640};
}

std::vector<float> normal(std::int64_t n, std::mt19937& g) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = nd(g);
  return v;
}

TEST(KQuant, DequantizeRowEqualsTheBlockFormulaInFloat64) {
  std::mt19937 g(31);
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(ggml_type_name(t));
    const std::int64_t cols = lengths(t).back(), rows = 8;
    const auto data = random_rows(t, rows, cols, g);
    const std::int64_t rb = ggml_row_bytes(t, cols);
    std::vector<float> y(static_cast<std::size_t>(rows * cols));
    dequantize_row(t, data.data(), y.data(), rows * cols);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < cols; ++j) {
        // d·q and d·sc·q are exact in float64 and float32; the difference of two such terms is
        // exact in float64 for these exponents: float32 rounds it once, as dequantize_row must.
        const double w = row_value(t, data.data() + r * rb, j).w;
        ASSERT_EQ(y[static_cast<std::size_t>(r * cols + j)], static_cast<float>(w)) << "row " << r << " elem " << j;
      }
  }
}

// y = W·x for n vectors on `path` against float64 Σ w·x (w: dequantize_row's floats, equal to
// the formula by the test above), within (cols + 64)·u·Σ(|w| + offset)·|x| (docs/numerics.md),
// with and without accumulation.
void check_gemv(GgmlType t, CpuPath path, std::mt19937& g) {
  for (std::int64_t cols : lengths(t))
    for (std::int64_t rows : {1, 3, 6, 37}) {
      const auto data = random_rows(t, rows, cols, g);
      const std::int64_t rb = ggml_row_bytes(t, cols);
      QuantMatrix m;
      m.append(t, data.data(), rows, cols);
      std::vector<float> w(static_cast<std::size_t>(rows * cols));
      dequantize_row(t, data.data(), w.data(), rows * cols);
      for (std::int64_t n = 1; n <= 4; ++n) {
        SCOPED_TRACE(::testing::Message() << ggml_type_name(t) << " path=" << cpu_path_name(path)
                                          << " cols=" << cols << " rows=" << rows << " n=" << n);
        const std::int64_t ldx = cols + 3, ldy = rows + 2;
        const auto x = normal(n * ldx, g);
        const auto y0 = normal(n * ldy, g);
        for (bool acc : {false, true}) {
          std::vector<float> y = y0;
          quant_gemv(m, 0, rows, x.data(), n, ldx, y.data(), ldy, acc, path);
          for (std::int64_t r = 0; r < n; ++r) {
            for (std::int64_t o = 0; o < rows; ++o) {
              double ref = 0, mag = 0;
              for (std::int64_t j = 0; j < cols; ++j) {
                const double wj = w[static_cast<std::size_t>(o * cols + j)], xj = x[static_cast<std::size_t>(r * ldx + j)];
                ref += wj * xj;
                mag += (std::abs(wj) + row_value(t, data.data() + o * rb, j).offset) * std::abs(xj);
              }
              double bound = static_cast<double>(cols + 64) * kU * mag;
              const double before = y0[static_cast<std::size_t>(r * ldy + o)];
              if (acc) {
                ref += before;
                bound += 2 * kU * (std::abs(before) + std::abs(ref));
              }
              ASSERT_NEAR(y[static_cast<std::size_t>(r * ldy + o)], ref, bound) << "vector " << r << " row " << o << " acc " << acc;
            }
            for (std::int64_t o = rows; o < ldy; ++o)  // the padding of y untouched
              ASSERT_EQ(y[static_cast<std::size_t>(r * ldy + o)], y0[static_cast<std::size_t>(r * ldy + o)]);
          }
        }
      }
    }
}

// dequantize_rows on `path` against dequantize_row, bit for bit (zero signs included), on
// random rows and on edge blocks.
void check_deq(GgmlType t, CpuPath path, std::mt19937& g) {
  const GgmlTypeInfo& ti = ggml_type_info(t);
  const std::int64_t cols = ti.block_elems == 256 ? 512 : ti.block_elems == 32 ? 96 : 37, rows = 9;
  auto data = random_rows(t, rows, cols, g);
  // Edge blocks in the last row: every scale field +0, −0, −65504, the smallest subnormal.
  const std::uint16_t edges[] = {0x0000, 0x8000, 0xfbff, 0x0001};
  if (ti.block_elems > 1)
    for (std::int64_t k = 0; k < cols / ti.block_elems; ++k)
      for (int f : scale_fields(t))
        put_half_bits(data.data() + (rows - 1) * ggml_row_bytes(t, cols) + k * ti.block_bytes + f, edges[(k + f) % 4]);
  QuantMatrix m;
  m.append(t, data.data(), rows, cols);
  std::vector<float> got(static_cast<std::size_t>(rows * cols), -1.f), want(got.size());
  m.dequantize_rows(0, rows, got.data(), path);
  dequantize_row(t, data.data(), want.data(), rows * cols);
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << ggml_type_name(t) << " path " << cpu_path_name(path);
  // A range of rows from the middle.
  std::vector<float> mid(static_cast<std::size_t>(4 * cols));
  m.dequantize_rows(3, 7, mid.data(), path);
  ASSERT_EQ(std::memcmp(mid.data(), want.data() + 3 * cols, mid.size() * sizeof(float)), 0)
      << ggml_type_name(t) << " path " << cpu_path_name(path);
}

const GgmlType kAllDequantizable[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                                      GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                      GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

TEST(KQuant, GemvEveryPathMatchesFloat64) {
  std::mt19937 g(32);
  for (GgmlType t : kTypes)
    for (CpuPath path : available_cpu_paths()) check_gemv(t, path, g);
}

TEST(KQuant, PanelDequantizersEqualDequantizeRowBitForBit) {
  std::mt19937 g(33);
  for (GgmlType t : kAllDequantizable)
    for (CpuPath path : available_cpu_paths()) check_deq(t, path, g);
}

// Gemma-like stacks: Q4_K, Q6_K, Q5_0, Q8_0, Q5_K and Q5_1 parts under one row index (rows of
// 512 values: whole super-blocks), through quant_gemv over row ranges that cross the part
// boundaries and through quant_linear (row-split decode for up to 4 vectors, dequantized
// panels and sgemm for more), on every path, 1 and 2 threads.
TEST(KQuant, MixedPartsEveryPath) {
  std::mt19937 g(34);
  const std::int64_t cols = 512;
  const GgmlType types[] = {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0,
                            GgmlType::Q8_0, GgmlType::Q5_K, GgmlType::Q5_1};
  const std::int64_t rows[] = {7, 5, 13, 2, 9, 3};
  std::vector<std::vector<std::uint8_t>> data;
  QuantMatrix m;
  for (int i = 0; i < 6; ++i) {
    data.push_back(random_rows(types[i], rows[i], cols, g));
    m.append(types[i], data.back().data(), rows[i], cols);
  }
  EXPECT_EQ(m.type_string(), "Q4_K+Q6_K+Q5_0+Q8_0+Q5_K+Q5_1");
  const std::int64_t R = m.rows();
  std::vector<float> w(static_cast<std::size_t>(R * cols));
  std::vector<double> offset(w.size());
  {
    std::int64_t base = 0;
    for (int i = 0; i < 6; ++i) {
      const std::int64_t rb = ggml_row_bytes(types[i], cols);
      dequantize_row(types[i], data[static_cast<std::size_t>(i)].data(), w.data() + base * cols, rows[i] * cols);
      for (std::int64_t o = 0; o < rows[i]; ++o)
        for (std::int64_t j = 0; j < cols; ++j)
          offset[static_cast<std::size_t>((base + o) * cols + j)] =
              row_value(types[i], data[static_cast<std::size_t>(i)].data() + o * rb, j).offset;
      base += rows[i];
    }
  }
  auto expect = [&](const std::vector<float>& x, std::int64_t r, std::int64_t o, double before, float got) {
    double ref = before, mag = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double wj = w[static_cast<std::size_t>(o * cols + j)], xj = x[static_cast<std::size_t>(r * cols + j)];
      ref += wj * xj;
      mag += (std::abs(wj) + offset[static_cast<std::size_t>(o * cols + j)]) * std::abs(xj);
    }
    // The panels' sgemm sums in yet another order: the same summation-order bound, doubled.
    const double bound = 2 * static_cast<double>(cols + 64) * kU * mag + 2 * kU * (std::abs(before) + std::abs(ref));
    EXPECT_NEAR(got, ref, bound) << "vector " << r << " row " << o;
  };
  for (CpuPath path : available_cpu_paths()) {
    for (std::int64_t n = 1; n <= 4; ++n) {
      SCOPED_TRACE(::testing::Message() << "path=" << cpu_path_name(path) << " n=" << n);
      const auto x = normal(n * cols, g);
      // Rows 5..31 cross five part boundaries; accumulating onto 0.25.
      std::vector<float> y(static_cast<std::size_t>(n * R), 0.25f);
      quant_gemv(m, 5, 31, x.data(), n, cols, y.data(), R, true, path);
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t o = 0; o < R; ++o) {
          const float got = y[static_cast<std::size_t>(r * R + o)];
          if (o < 5 || o >= 31) {
            ASSERT_EQ(got, 0.25f);
          } else {
            expect(x, r, o, 0.25, got);
          }
        }
    }
    for (std::int64_t n : {1, 3, 4, 9}) {
      const auto x = normal(n * cols, g);
      for (int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << "quant_linear path=" << cpu_path_name(path) << " n=" << n
                                          << " threads=" << threads);
        std::vector<float> y(static_cast<std::size_t>(n * R));
        quant_linear(ExecContext{threads}, m, x.data(), n, y.data(), false, 0, path);
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t o = 0; o < R; ++o) expect(x, r, o, 0, y[static_cast<std::size_t>(r * R + o)]);
      }
    }
  }
}

// Where this CPU runs AVX-512 itself, the emulated AVX-512 tables (support/qgemv_emulated.h) are
// not installed, so the checks above do not see them: run them with each emulated table put in
// place of the path's own for the duration, so the same code is checked lane by lane. (Where
// they are installed, on a CPU without AVX-512, the tests above cover them.)
TEST(KQuant, EmulatedAvx512TablesWhereTheCpuHasAvx512) {
  if (!qkern::emulated_tables_built()) GTEST_SKIP() << "built without SIMDe's headers (libsimde-dev)";
  const struct {
    CpuPath path;
    const qkern::KernelTable* table;
  } emulated[] = {{CpuPath::kAvx512, qkern::emulated_avx512_table()},
                  {CpuPath::kAvx512Vnni, qkern::emulated_avx512vnni_table()}};
  bool ran = false;
  std::mt19937 g(35);
  for (const auto& e : emulated) {
    const qkern::KernelTable* before = qkern::test_table(e.path);
    if (before == e.table) continue;  // already the path's table: the tests above ran it
    struct Restore {
      CpuPath p;
      const qkern::KernelTable* t;
      ~Restore() { qkern::set_test_table(p, t); }
    } restore{e.path, before};
    qkern::set_test_table(e.path, e.table);
    for (GgmlType t : kTypes) {
      check_gemv(t, e.path, g);
      check_deq(t, e.path, g);
    }
    ran = true;
  }
  if (!ran) GTEST_SKIP() << "the emulated tables are already the AVX-512 paths' own here";
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
