// GGUF tensors as numbers (gguf/tensor_data.h): whole-tensor dequantization in parallel equals
// the serial one and the row form; a tensor as a QuantMatrix part, refused with its name.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/gguf/gguf.h"
#include "numattn/gguf/tensor_data.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

// The message of the numattn::Error that `f` throws ("" when it throws none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Dequant, TensorParallelEqualsSerial) {
  std::mt19937 g(13);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(64 * 3000);
  for (auto& v : x) v = nd(g);
  GgufWriter w;
  w.add_tensor_f32("t", {64, 1000, 3}, x.data(), GgmlType::Q4_1);
  const auto bytes = w.to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes.data(), bytes.size());
  const GgufTensorInfo& t = f.tensor("t");
  const auto a = dequantize_tensor(t, ExecContext{1});
  const auto b = dequantize_tensor(t, ExecContext{3});
  EXPECT_EQ(a, b);
  std::vector<float> rows(64 * 2);
  dequantize_rows(t, 2998, 2, rows.data());
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), a.begin() + 2998 * 64));
  EXPECT_THROW(dequantize_rows(t, 2999, 2, rows.data()), Error);
  EXPECT_THROW(dequantize_rows(t, -1, 1, rows.data()), Error);
}

TEST(Dequant, AppendTensorStacksRowsAndNamesTheTensor) {
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(64 * 6);
  for (auto& v : x) v = nd(g);
  GgufWriter w;
  w.add_tensor_f32("a", {64, 2}, x.data(), GgmlType::Q8_0);
  w.add_tensor_f32("b", {64, 4, 1}, x.data() + 128, GgmlType::Q4_1);
  w.add_tensor_f32("wide", {128, 3}, x.data(), GgmlType::F32);
  w.add_tensor_f32("cube", {32, 2, 6}, x.data(), GgmlType::F32);
  w.add_tensor("q2k", GgmlType::Q2_K, {256}, std::vector<std::uint8_t>(84, 0));
  const auto bytes = w.to_bytes();
  const GgufFile f = GgufFile::from_bytes(bytes.data(), bytes.size());
  QuantMatrix m;
  append_tensor(m, f.tensor("a"));
  append_tensor(m, f.tensor("b"));  // a trailing dimension of 1 is a matrix
  EXPECT_EQ(m.cols, 64);
  EXPECT_EQ(m.rows(), 6);
  EXPECT_EQ(m.type_string(), "Q8_0+Q4_1");
  std::vector<float> want(64 * 6);
  dequantize_rows(f.tensor("a"), 0, 2, want.data());
  dequantize_rows(f.tensor("b"), 0, 4, want.data() + 128);
  EXPECT_EQ(m.dequantize(), want);
  EXPECT_NE(error_of([&] { append_tensor(m, f.tensor("wide")); })
                .find("tensor wide has rows of 128 values, stacked under rows of 64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { append_tensor(m, f.tensor("cube")); })
                .find("tensor cube has shape [32, 2, 6]: a matrix needs 2 dimensions"),
            std::string::npos);
  QuantMatrix k;
  EXPECT_NE(error_of([&] { append_tensor(k, f.tensor("q2k")); })
                .find("tensor q2k has type Q2_K, which numattn cannot multiply"),
            std::string::npos);
  EXPECT_TRUE(k.empty());
  EXPECT_EQ(m.rows(), 6);  // a refused tensor adds nothing
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
