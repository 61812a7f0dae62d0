// GGUF reader/writer: round trips, typed access, and corrupt/truncated/hostile files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <set>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "numattn/gguf/gguf.h"
#include "numattn/gguf/tensor_data.h"
#include "numattn/model/data.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

// ---- a raw little-endian byte builder for hand-made (often broken) files ----------------------

struct Bytes {
  std::vector<std::uint8_t> b;
  template <class T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& u32(std::uint32_t v) { return put(v); }
  Bytes& u64(std::uint64_t v) { return put(v); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& pad(std::size_t a = 32) {
    while (b.size() % a) b.push_back(0);
    return *this;
  }
  Bytes& zeros(std::size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
  // A tensor info record.
  Bytes& tensor(const std::string& name, std::vector<std::uint64_t> ne, std::uint32_t type,
                std::uint64_t offset) {
    str(name).u32(static_cast<std::uint32_t>(ne.size()));
    for (auto d : ne) u64(d);
    return u32(type).u64(offset);
  }
};

GgufFile parse(const std::vector<std::uint8_t>& b) { return GgufFile::from_bytes(b.data(), b.size(), "test.gguf"); }

// Expects parsing to throw numattn::Error whose message contains `needle`.
void expect_corrupt(const std::vector<std::uint8_t>& b, const std::string& needle) {
  try {
    parse(b);
    ADD_FAILURE() << "expected numattn::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test.gguf"), std::string::npos) << e.what();
  }
}

GgufWriter writer_with_every_type() {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("t.u8", GgufValue::u8(200));
  w.set("t.i8", GgufValue::i8(-100));
  w.set("t.u16", GgufValue::u16(60000));
  w.set("t.i16", GgufValue::i16(-30000));
  w.set("t.u32", GgufValue::u32(4000000000u));
  w.set("t.i32", GgufValue::i32(-2000000000));
  w.set("t.u64", GgufValue::u64(18000000000000000000ull));
  w.set("t.i64", GgufValue::i64(-9000000000000000000ll));
  w.set("t.f32", GgufValue::f32(1.5e-5f));
  w.set("t.f64", GgufValue::f64(-2.718281828459045));
  w.set("t.bool_t", GgufValue::boolean(true));
  w.set("t.bool_f", GgufValue::boolean(false));
  w.set("t.str", GgufValue::string("h\xc3\xa9llo | \"w\"\n"));
  w.set("t.str_empty", GgufValue::string(""));
  w.set("t.a_u8", GgufValue::array<std::uint8_t>({0, 1, 255}));
  w.set("t.a_i8", GgufValue::array<std::int8_t>({-128, 0, 127}));
  w.set("t.a_u16", GgufValue::array<std::uint16_t>({1, 65535}));
  w.set("t.a_i16", GgufValue::array<std::int16_t>({-32768, 32767}));
  w.set("t.a_u32", GgufValue::array<std::uint32_t>({7, 4294967295u}));
  w.set("t.a_i32", GgufValue::array<std::int32_t>({3, -3, 1 << 30}));
  w.set("t.a_u64", GgufValue::array<std::uint64_t>({0, ~0ull}));
  w.set("t.a_i64", GgufValue::array<std::int64_t>({std::numeric_limits<std::int64_t>::min(), 5}));
  w.set("t.a_f32", GgufValue::array<float>({0.25f, -1e30f}));
  w.set("t.a_f64", GgufValue::array<double>({1e-300, 3.0}));
  w.set("t.a_bool", GgufValue::bool_array({true, false, true}));
  w.set("t.a_str", GgufValue::string_array({"Ġ t", "", "<|im_start|>"}));
  w.set("t.a_empty", GgufValue::array<std::int32_t>({}));
  w.set("t.a_nested", GgufValue::array_of_arrays({GgufValue::array<std::int32_t>({1, 2}),
                                                  GgufValue::string_array({"x"}),
                                                  GgufValue::array<float>({})}));
  return w;
}

TEST(Gguf, MetadataRoundTripEveryType) {
  const auto bytes = writer_with_every_type().to_bytes();
  const GgufFile f = parse(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.tensors().size(), 0u);
  ASSERT_EQ(f.metadata().size(), 29u);
  EXPECT_EQ(f.metadata()[0].first, "general.architecture");  // file order is kept
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.get<std::uint8_t>("t.u8"), 200);
  EXPECT_EQ(f.get<std::int8_t>("t.i8"), -100);
  EXPECT_EQ(f.get<std::uint16_t>("t.u16"), 60000);
  EXPECT_EQ(f.get<std::int16_t>("t.i16"), -30000);
  EXPECT_EQ(f.get<std::uint32_t>("t.u32"), 4000000000u);
  EXPECT_EQ(f.get<std::int32_t>("t.i32"), -2000000000);
  EXPECT_EQ(f.get<std::uint64_t>("t.u64"), 18000000000000000000ull);
  EXPECT_EQ(f.get<std::int64_t>("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get<float>("t.f32"), 1.5e-5f);
  EXPECT_EQ(f.get<double>("t.f64"), -2.718281828459045);
  EXPECT_TRUE(f.get<bool>("t.bool_t"));
  EXPECT_FALSE(f.get_bool("t.bool_f", true));
  EXPECT_TRUE(f.get_bool("t.missing", true));
  EXPECT_EQ(f.get_string("t.str"), "h\xc3\xa9llo | \"w\"\n");
  EXPECT_EQ(f.get_string("t.str_empty"), "");
  EXPECT_EQ(f.at("t.u8").type(), GgufType::U8);

  auto eq = [](auto span, auto expected) {
    return std::vector<typename decltype(expected)::value_type>(span.begin(), span.end()) == expected;
  };
  EXPECT_TRUE(eq(f.at("t.a_u8").array_view<std::uint8_t>(), std::vector<std::uint8_t>{0, 1, 255}));
  EXPECT_TRUE(eq(f.at("t.a_i8").array_view<std::int8_t>(), std::vector<std::int8_t>{-128, 0, 127}));
  EXPECT_TRUE(eq(f.at("t.a_u16").array_view<std::uint16_t>(), std::vector<std::uint16_t>{1, 65535}));
  EXPECT_TRUE(eq(f.at("t.a_i16").array_view<std::int16_t>(), std::vector<std::int16_t>{-32768, 32767}));
  EXPECT_TRUE(eq(f.at("t.a_u32").array_view<std::uint32_t>(), std::vector<std::uint32_t>{7, 4294967295u}));
  EXPECT_TRUE(eq(f.at("t.a_i32").array_view<std::int32_t>(), std::vector<std::int32_t>{3, -3, 1 << 30}));
  EXPECT_TRUE(eq(f.at("t.a_u64").array_view<std::uint64_t>(), std::vector<std::uint64_t>{0, ~0ull}));
  EXPECT_TRUE(eq(f.at("t.a_i64").array_view<std::int64_t>(),
                 std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), 5}));
  EXPECT_TRUE(eq(f.at("t.a_f32").array_view<float>(), std::vector<float>{0.25f, -1e30f}));
  EXPECT_TRUE(eq(f.at("t.a_f64").array_view<double>(), std::vector<double>{1e-300, 3.0}));
  EXPECT_TRUE(eq(f.at("t.a_bool").bool_array_view(), std::vector<std::uint8_t>{1, 0, 1}));
  EXPECT_EQ(f.at("t.a_str").string_array_view(), (std::vector<std::string>{"Ġ t", "", "<|im_start|>"}));
  EXPECT_EQ(f.at("t.a_str").array_type(), GgufType::STRING);
  EXPECT_EQ(f.at("t.a_empty").array_size(), 0u);
  EXPECT_EQ(f.at("t.a_empty").array_type(), GgufType::I32);
  const auto& nested = f.at("t.a_nested").nested_array_view();
  ASSERT_EQ(nested.size(), 3u);
  EXPECT_EQ(nested[0].int_array(), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(nested[1].string_array_view(), (std::vector<std::string>{"x"}));
  EXPECT_EQ(nested[2].array_type(), GgufType::F32);
  EXPECT_EQ(nested[2].array_size(), 0u);

  // Lenient numeric access.
  EXPECT_EQ(f.get_int("t.u8"), 200);
  EXPECT_EQ(f.get_int("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get_int("t.missing", 7), 7);
  EXPECT_DOUBLE_EQ(f.get_double("t.i16"), -30000.0);
  EXPECT_DOUBLE_EQ(f.get_double("t.f32"), static_cast<double>(1.5e-5f));
  EXPECT_EQ(f.at("t.a_u16").int_array(), (std::vector<std::int64_t>{1, 65535}));
  EXPECT_EQ(f.at("t.a_f64").double_array(), (std::vector<double>{1e-300, 3.0}));
  EXPECT_EQ(f.get_string("t.missing", "d"), "d");

  // The writer's output is reproduced byte for byte by rewriting what was read.
  GgufWriter w2;
  for (const auto& [k, v] : f.metadata()) w2.set(k, v);
  EXPECT_EQ(w2.to_bytes(), bytes);
}

TEST(Gguf, TypeMismatchAndMissingKeysThrow) {
  const auto bytes = writer_with_every_type().to_bytes();
  const GgufFile f = parse(bytes);
  EXPECT_THROW(f.get<std::uint32_t>("t.u8"), Error);
  EXPECT_THROW(f.get<float>("t.f64"), Error);
  EXPECT_THROW(f.get<bool>("t.u8"), Error);
  EXPECT_THROW(f.get_string("t.u32"), Error);
  EXPECT_THROW(f.get_int("t.str"), Error);
  EXPECT_THROW(f.get_int("t.f32"), Error);
  EXPECT_THROW(f.get_int("t.u64"), Error);  // 1.8e19 does not fit in int64
  EXPECT_THROW(f.get_double("t.a_f32"), Error);
  EXPECT_THROW(f.at("t.a_i32").array_view<std::uint32_t>(), Error);
  EXPECT_THROW(f.at("t.a_i32").string_array_view(), Error);
  EXPECT_THROW(f.at("t.a_str").int_array(), Error);
  EXPECT_THROW(f.at("t.u8").array_size(), Error);
  EXPECT_THROW(f.at("t.missing"), Error);
  EXPECT_THROW(f.tensor("nope"), Error);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_EQ(f.find("nope"), nullptr);
  try {
    f.get_string("t.u32");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.u32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("u32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GgufValue::array_of_arrays({GgufValue::u8(1)}), Error);
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = d(g);
  return x;
}

TEST(Gguf, TensorRoundTripAndAlignment) {
  for (std::uint32_t alignment : {32u, 64u, 8u}) {
    GgufWriter w(alignment);
    w.set("general.architecture", GgufValue::string("test"));
    const auto x = random_floats(64 * 3 * 2, 1);
    const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16,
                              GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1};
    for (GgmlType t : types)
      w.add_tensor_f32("w." + ggml_type_name(t), {64, 3, 2}, x.data(), t);
    // Raw bytes of types the writer cannot quantize (k-quants) travel unchanged.
    std::vector<std::uint8_t> raw(144 * 2);
    for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::uint8_t>(i * 7 + 3);
    w.add_tensor("w.q4k", GgmlType::Q4_K, {256, 2}, raw);
    w.add_tensor("w.one", GgmlType::F32, {1}, std::vector<std::uint8_t>(4, 0));
    EXPECT_THROW(w.add_tensor("w.one", GgmlType::F32, {1}, std::vector<std::uint8_t>(4)), Error);
    EXPECT_THROW(w.add_tensor("w.bad", GgmlType::F32, {2}, std::vector<std::uint8_t>(4)), Error);
    EXPECT_THROW(w.add_tensor_f32("w.bad", {33}, x.data(), GgmlType::Q8_0), Error);

    const auto bytes = w.to_bytes();
    const GgufFile f = parse(bytes);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.has("general.alignment"), alignment != 32);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    ASSERT_EQ(f.tensors().size(), 8u);
    for (GgmlType t : types) {
      const GgufTensorInfo& ti = f.tensor("w." + ggml_type_name(t));
      EXPECT_EQ(ti.type, t);
      EXPECT_EQ(ti.ne, (std::vector<std::int64_t>{64, 3, 2}));
      EXPECT_EQ(ti.n_elements(), 384);
      EXPECT_EQ(ti.n_rows(), 6);
      EXPECT_EQ(ti.offset % alignment, 0u);
      EXPECT_EQ(ti.size_bytes, static_cast<std::uint64_t>(ggml_row_bytes(t, 64) * 6));
      const auto y = dequantize_tensor(ti);
      ASSERT_EQ(y.size(), x.size());
      double max_err = 0;
      for (std::size_t i = 0; i < x.size(); ++i) max_err = std::max(max_err, std::fabs(double(y[i]) - x[i]));
      EXPECT_LT(max_err, t == GgmlType::F32 ? 1e-30 : 0.6) << ggml_type_name(t);
      EXPECT_EQ(ti.row(1), ti.data + ti.row_bytes());
    }
    const GgufTensorInfo& q4k = f.tensor("w.q4k");
    EXPECT_EQ(std::vector<std::uint8_t>(q4k.data, q4k.data + q4k.size_bytes), raw);
    EXPECT_EQ(f.tensor("w.one").shape_string(), "[1]");
    EXPECT_THROW(f.tensor("w.one").row(1), Error);
  }
  EXPECT_THROW(GgufWriter(12), Error);
  EXPECT_THROW(GgufWriter(4), Error);
}

TEST(Gguf, OpenFromDiskMatchesMemory) {
  GgufWriter w = writer_with_every_type();
  const auto x = random_floats(32 * 4, 2);
  w.add_tensor_f32("t", {32, 4}, x.data(), GgmlType::Q4_1);
  const test::ScratchDir scratch;
  const auto& dir = scratch.path();
  const std::string path = scratch.file("model.gguf");
  w.write(path);
  {
    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.file_size(), w.to_bytes().size());
    EXPECT_EQ(f.metadata().size(), 29u);
    const GgufFile g = parse(w.to_bytes());
    EXPECT_EQ(dequantize_tensor(f.tensor("t")), dequantize_tensor(g.tensor("t")));
    GgufFile moved = std::move(f);  // data stays valid after a move
    EXPECT_EQ(dequantize_tensor(moved.tensor("t")), dequantize_tensor(g.tensor("t")));
  }
  std::filesystem::remove(path);
  EXPECT_THROW(GgufFile::open(path), Error);
  EXPECT_THROW(GgufFile::open(dir.string()), Error);  // a directory
  // An empty and a 7-byte file.
  std::vector<std::uint8_t> empty;
  EXPECT_THROW(GgufFile::from_bytes(empty.data(), 0), Error);
  EXPECT_THROW(GgufFile::from_bytes("GGUF\3\0\0", 7), Error);
}

// ---- corrupt, truncated and hostile files -----------------------------------------------------

TEST(GgufCorrupt, EveryTruncationThrows) {
  GgufWriter w = writer_with_every_type();
  const auto x = random_floats(32 * 2, 3);
  w.add_tensor_f32("a", {32, 2}, x.data(), GgmlType::Q8_0);
  w.add_tensor_f32("b", {32}, x.data(), GgmlType::F16);
  const auto bytes = w.to_bytes();
  const GgufFile full = parse(bytes);
  const GgufTensorInfo& last = full.tensors().back();
  const std::size_t needed = full.data_offset() + last.offset + last.size_bytes;
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    if (n < needed) {
      EXPECT_THROW(parse(cut), Error) << "prefix of " << n << " bytes";
    } else {
      EXPECT_NO_THROW(parse(cut)) << "only trailing padding is missing at " << n;
    }
  }
}

TEST(GgufCorrupt, BadMagicAndVersion) {
  auto good = Bytes().header(0, 0).b;
  EXPECT_NO_THROW(parse(good));
  auto b = good;
  b[0] = 'X';
  expect_corrupt(b, "not a GGUF file");
  expect_corrupt(Bytes().header(0, 0, 0).b, "unsupported GGUF version 0");
  expect_corrupt(Bytes().header(0, 0, 4).b, "unsupported GGUF version 4");
  expect_corrupt(Bytes().header(0, 0, 0x03000000).b, "big-endian");
  // Version 1 stores counts as u32.
  auto v1 = Bytes().u32(0x46554747).u32(1).u32(0).u32(1).u32(3).b;
  v1.insert(v1.end(), {'a', 'b', 'c'});
  Bytes tail;
  tail.u32(4).u32(42);
  v1.insert(v1.end(), tail.b.begin(), tail.b.end());
  const GgufFile f1 = parse(v1);
  EXPECT_EQ(f1.version(), 1u);
  EXPECT_EQ(f1.get<std::uint32_t>("abc"), 42u);
}

TEST(GgufCorrupt, HostileCounts) {
  // Counts far beyond the file size are refused before any allocation.
  expect_corrupt(Bytes().header(0, ~0ull).b, "metadata_kv_count");
  expect_corrupt(Bytes().header(~0ull, 0).b, "tensor_count");
  expect_corrupt(Bytes().header(1ull << 40, 0).zeros(100).b, "tensor_count");
  // A key length of 2^64-1 and one that is 1 byte too long.
  expect_corrupt(Bytes().header(0, 1).u64(~0ull).zeros(16).b, "truncated");
  expect_corrupt(Bytes().header(0, 1).u64(40).zeros(20).b, "truncated");
  // Too few bytes left for even one minimal key/value.
  expect_corrupt(Bytes().header(0, 1).u64(0).b, "metadata_kv_count = 1 cannot fit");
  // A string value whose length overruns.
  expect_corrupt(Bytes().header(0, 1).str("k").u32(8).u64(1ull << 62).b, "truncated");
  // Arrays: huge counts of u64, of strings, of nested arrays.
  expect_corrupt(Bytes().header(0, 1).str("k").u32(9).u32(10).u64(1ull << 61).zeros(64).b,
                 "array length");
  expect_corrupt(Bytes().header(0, 1).str("k").u32(9).u32(8).u64(~0ull).zeros(64).b, "array length");
  expect_corrupt(Bytes().header(0, 1).str("k").u32(9).u32(9).u64(100).zeros(64).b, "array length");
  // 9 strings need 72 bytes of length fields: 71 available.
  expect_corrupt(Bytes().header(0, 1).str("k").u32(9).u32(8).u64(9).zeros(71).b, "array length");
  EXPECT_NO_THROW(parse(Bytes().header(0, 1).str("k").u32(9).u32(8).u64(9).zeros(72).b));
}

TEST(GgufCorrupt, BadValues) {
  expect_corrupt(Bytes().header(0, 1).str("k").u32(13).u32(0).b, "unknown metadata value type 13");
  expect_corrupt(Bytes().header(0, 1).str("k").u32(9).u32(77).u64(0).b, "unknown array element type 77");
  expect_corrupt(Bytes().header(0, 1).str("k").u32(7).put<std::uint8_t>(2).b, "bool value 2");
  expect_corrupt(Bytes().header(0, 1).str("k").u32(9).u32(7).u64(2).put<std::uint8_t>(1).put<std::uint8_t>(5).b,
                 "bool value 5");
  expect_corrupt(Bytes().header(0, 2).str("k").u32(0).put<std::uint8_t>(1).str("k").u32(0).put<std::uint8_t>(1).b,
                 "duplicate metadata key 'k'");
  // Arrays nested 100 deep are refused (no stack exhaustion).
  Bytes deep;
  deep.header(0, 1).str("k").u32(9);
  for (int i = 0; i < 100; ++i) deep.u32(9).u64(1);
  deep.u32(0).u64(0);
  expect_corrupt(deep.b, "nested deeper");
}

TEST(GgufCorrupt, BadAlignment) {
  expect_corrupt(Bytes().header(0, 1).str("general.alignment").u32(4).u32(48).b, "not a power of two");
  expect_corrupt(Bytes().header(0, 1).str("general.alignment").u32(4).u32(0).b, "not a power of two");
  expect_corrupt(Bytes().header(0, 1).str("general.alignment").u32(10).u64(32).b, "must be a u32");
}

// One F32 [8] tensor at offset `off`, with `data_bytes` bytes after the aligned header.
std::vector<std::uint8_t> one_tensor(std::vector<std::uint64_t> ne, std::uint32_t type,
                                     std::uint64_t off, std::size_t data_bytes) {
  Bytes b;
  b.header(1, 0).tensor("t", std::move(ne), type, off).pad().zeros(data_bytes);
  return b.b;
}

TEST(GgufCorrupt, BadTensorInfos) {
  EXPECT_NO_THROW(parse(one_tensor({8}, 0, 0, 32)));
  EXPECT_NO_THROW(parse(one_tensor({8}, 0, 32, 64)));
  expect_corrupt(one_tensor({8}, 0, 32, 63), "outside");           // one byte short
  expect_corrupt(one_tensor({8}, 0, 16, 64), "not a multiple of the alignment");
  expect_corrupt(one_tensor({8}, 0, ~0ull - 31, 64), "outside");    // offset + size wraps
  expect_corrupt(one_tensor({8}, 0, 1ull << 62, 64), "outside");
  expect_corrupt(one_tensor({8}, 99, 0, 64), "unknown ggml type id 99");
  expect_corrupt(one_tensor({33}, 8, 0, 64), "not a multiple of the Q8_0 block size 32");
  expect_corrupt(one_tensor({}, 0, 0, 64), "0 dimensions");
  expect_corrupt(one_tensor({1, 1, 1, 1, 1}, 0, 0, 64), "5 dimensions");
  // Element-count overflow (2^32 · 2^32) and byte-size overflow (2^62 elements of F32).
  expect_corrupt(one_tensor({1ull << 32, 1ull << 32}, 0, 0, 64), "overflows");
  expect_corrupt(one_tensor({1ull << 31, 1ull << 31}, 0, 0, 64), "overflows");
  expect_corrupt(one_tensor({~0ull}, 0, 0, 64), "overflows");
  // A zero dimension makes the total 0, but the other dimensions must still not overflow
  // (found by the fuzzer: n_rows() overflowed).
  expect_corrupt(one_tensor({0, 1ull << 41, 1ull << 53}, 0, 0, 64), "overflows");
  {
    const GgufFile f = parse(one_tensor({0, 1ull << 62}, 0, 0, 0));
    const GgufTensorInfo& t = f.tensor("t");
    EXPECT_EQ(t.n_elements(), 0);
    EXPECT_EQ(t.size_bytes, 0u);
    EXPECT_TRUE(dequantize_tensor(t).empty());  // returns at once, no loop over 2^62 rows
    dequantize_rows(t, 5, 1, nullptr);
  }
  // A huge but representable size that does not fit in the file.
  expect_corrupt(one_tensor({1ull << 20, 1ull << 20}, 0, 0, 64), "outside");
  // Duplicate tensor names.
  Bytes d;
  d.header(2, 0).tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32).pad().zeros(64);
  expect_corrupt(d.b, "duplicate tensor name 't'");
  // Tensor data section missing entirely.
  Bytes m;
  m.header(1, 0).tensor("t", {8}, 0, 0);
  expect_corrupt(m.b, "");
}

TEST(GgufCorrupt, RandomMutationsNeverCrash) {
  GgufWriter w = writer_with_every_type();
  const auto x = random_floats(64, 4);
  w.add_tensor_f32("a", {32, 2}, x.data(), GgmlType::Q4_0);
  const auto bytes = w.to_bytes();
  std::mt19937 g(5);
  int errors = 0;
  for (int it = 0; it < 3000; ++it) {
    auto b = bytes;
    const int flips = 1 + static_cast<int>(g() % 4);
    for (int k = 0; k < flips; ++k) b[g() % b.size()] = static_cast<std::uint8_t>(g());
    try {
      const GgufFile f = parse(b);
      for (const auto& t : f.tensors())
        if (ggml_type_info(t.type).dequantizable) (void)dequantize_tensor(t);
      for (const auto& [k, v] : f.metadata()) (void)v.to_string();
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

// ---- the real default model (skipped when not cached) -----------------------------------------

TEST(GgufDefaultModel, HeaderFacts) {
  std::string path;
  try {
    path = default_model_path();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f.get_int("llama.rope.dimension_count"), 64);
  EXPECT_DOUBLE_EQ(f.get_double("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.at("tokenizer.ggml.tokens").string_array_view().size(), 49152u);
  EXPECT_EQ(f.at("tokenizer.ggml.merges").array_size(), 48900u);
  EXPECT_EQ(f.tensors().size(), 272u);  // 30 × 9 + token_embd + output_norm (output is tied)
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  std::set<std::string> types;
  for (const auto& t : f.tensors()) types.insert(ggml_type_name(t.type));
  EXPECT_EQ(types, (std::set<std::string>{"F32", "Q4_1", "Q8_0"}));
  const GgufTensorInfo& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.ne, (std::vector<std::int64_t>{576, 49152}));
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").ne, (std::vector<std::int64_t>{576, 192}));
  EXPECT_EQ(f.tensor("blk.29.ffn_down.weight").type, GgmlType::Q4_1);
  EXPECT_EQ(f.tensor("blk.29.ffn_norm.weight").type, GgmlType::F32);
  const auto e = dequantize_tensor(emb, ExecContext{2});
  ASSERT_EQ(e.size(), 576u * 49152u);
  double ss = 0;
  for (float v : e) {
    ASSERT_TRUE(std::isfinite(v));
    ss += double(v) * v;
  }
  const double rms = std::sqrt(ss / static_cast<double>(e.size()));
  EXPECT_GT(rms, 0.01);
  EXPECT_LT(rms, 10.0);
  // Rows: one embedding row equals the slice of the whole tensor.
  std::vector<float> row(576);
  dequantize_rows(emb, 1234, 1, row.data());
  EXPECT_TRUE(std::equal(row.begin(), row.end(), e.begin() + 1234 * 576));
}

TEST(GgufDefaultModel, RewriteIsByteIdentical) {
  // The writer reproduces llama.cpp's output exactly: same metadata encoding, tensor order,
  // offsets and padding. A strong check of both the reader and the writer.
  std::string path;
  try {
    path = default_model_path();
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  const GgufFile f = GgufFile::open(path);
  GgufWriter w(static_cast<std::uint32_t>(f.alignment()));
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  for (const auto& t : f.tensors())
    w.add_tensor(t.name, t.type, t.ne, std::vector<std::uint8_t>(t.data, t.data + t.size_bytes));
  const auto bytes = w.to_bytes();
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> orig((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), orig.size());
  EXPECT_EQ(std::memcmp(bytes.data(), orig.data(), bytes.size()), 0);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn

// ---- numattn gguf-info ------------------------------------------------------------------------

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

TEST(GgufInfoCli, JsonAndErrors) {
  GgufWriter w = writer_with_every_type();
  const auto x = random_floats(32 * 3, 9);
  w.add_tensor_f32("blk.0.w", {32, 3}, x.data(), GgmlType::Q4_1);
  const test::ScratchDir scratch;
  const std::string path = scratch.file("model.gguf");
  w.write(path);
  std::string out;
  ASSERT_EQ(test::run_command(std::string(NUMATTN_CLI_PATH) + " gguf-info --model " + path +
                                  " --format json --stats 2>/dev/null", &out), 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["tensor_count"], 1);
  EXPECT_EQ(j["metadata"]["general.architecture"]["value"], "llama");
  EXPECT_EQ(j["metadata"]["t.a_str"]["type"], "array[string]");
  EXPECT_EQ(j["metadata"]["t.i8"]["value"], -100);
  EXPECT_EQ(j["tensors"][0]["type"], "Q4_1");
  EXPECT_EQ(j["tensors"][0]["shape"], "[32, 3]");
  EXPECT_TRUE(j["tensors"][0]["rms"].is_number());
  EXPECT_EQ(test::run_command(std::string(NUMATTN_CLI_PATH) + " gguf-info --model " + path + " 2>&1", &out), 0);
  EXPECT_NE(out.find("| t.str |"), std::string::npos) << out;
  // A corrupt file: non-zero exit and an error line.
  auto bytes = w.to_bytes();
  bytes.resize(bytes.size() / 2);
  GgufWriter().write(path);  // overwrite, then truncate by hand
  {
    std::ofstream o(path, std::ios::binary | std::ios::trunc);
    o.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  EXPECT_NE(test::run_command(std::string(NUMATTN_CLI_PATH) + " gguf-info --model " + path + " 2>&1", &out), 0);
  EXPECT_NE(out.find("error:"), std::string::npos) << out;
  EXPECT_NE(out.find("corrupt GGUF"), std::string::npos) << out;
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
