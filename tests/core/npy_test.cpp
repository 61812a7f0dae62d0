// The .npy reader against hostile headers: every refusal names the problem, every numpy
// spelling of a valid header is accepted, and nothing is parsed by recursion (60k headers).
#include "numattn/core/npy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "support/test_util.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

// A .npy file: magic, version, little-endian header length (2 bytes for 1.0, else 4), header.
std::string npy_bytes(const std::string& header,
                      const std::string& payload = "",
                      int major = 1,
                      int minor = 0) {
  std::string s = "\x93NUMPY";
  s += static_cast<char>(major);
  s += static_cast<char>(minor);
  const std::uint32_t n = static_cast<std::uint32_t>(header.size());
  s += static_cast<char>(n & 0xff);
  s += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) {
    s += static_cast<char>((n >> 16) & 0xff);
    s += static_cast<char>((n >> 24) & 0xff);
  }
  return s + header + payload;
}

std::string f32_payload(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

class NpyReader : public ::testing::Test {
 protected:
  // Both entry points (file and memory) must agree on every input.
  npy::Array read_both(const std::string& bytes) {
    const std::string p = scratch.file("a.npy");
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    npy::Array mem = npy::read_bytes(bytes.data(), bytes.size(), "mem.npy");
    npy::Array file = npy::read(p);
    EXPECT_EQ(mem.shape, file.shape);
    EXPECT_EQ(mem.dtype, file.dtype);
    return file;
  }
  // Refused by both entry points, with `needle` in a message of bounded length.
  void expect_refused(const std::string& bytes, const std::string& needle) {
    const std::string p = scratch.file("bad.npy");
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    for (int via_file = 0; via_file < 2; ++via_file) {
      try {
        if (via_file)
          npy::read(p);
        else
          npy::read_bytes(bytes.data(), bytes.size(), "mem.npy");
        ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(needle), std::string::npos) << msg;
        EXPECT_NE(msg.find(via_file ? p : std::string("mem.npy")), std::string::npos) << msg;
        EXPECT_LT(msg.size(), 400u) << "messages quote untrusted text only in part";
      }
    }
  }
  test::ScratchDir scratch;
};

const std::string kF32x6 = f32_payload({1, 2, 3, 4, 5, 6});

TEST_F(NpyReader, AcceptsEveryNumpySpellingOfTheHeader) {
  // What numpy writes (version 1.0, padded with spaces and a newline).
  auto a =
      read_both(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
                          "          \n",
                          kF32x6));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.f32, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // Keys in any order, double quotes, no trailing comma, no spaces, tabs.
  a = read_both(npy_bytes("{\"shape\":(6,),\"fortran_order\":False,\"descr\":\"<f4\"}", kF32x6));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{6}));
  a = read_both(npy_bytes(
      "{ 'fortran_order' :\tFalse , 'descr' : '<f4' , 'shape' : ( 3 , 2 , ) , }\n", kF32x6));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3, 2}));
  // Python 2 era numpy wrote long literals.
  a = read_both(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", kF32x6));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  // A 0-d array holds one value; a zero dimension holds none.
  a = read_both(npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (), }",
                          std::string("\x07\0\0\0\0\0\0\0", 8)));
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.i64, (std::vector<std::int64_t>{7}));
  a = read_both(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 5), }"));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{0, 5}));
  EXPECT_TRUE(a.f64.empty());
  // Versions 2.0 and 3.0 have a 4-byte header length.
  for (int major : {2, 3}) {
    a = read_both(
        npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", kF32x6, major));
    EXPECT_EQ(a.f32.size(), 6u);
  }
}

TEST_F(NpyReader, RefusesBadDimensionsByName) {
  const std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  expect_refused(npy_bytes(h + "(-4, 32), }", std::string(4 * 4 * 32, '\0')),
                 "shape dimension 0 is negative (-4)");
  expect_refused(npy_bytes(h + "(2, -0), }"), "shape dimension 1 is negative");
  expect_refused(npy_bytes(h + "(12345678901234567890123,), }"),
                 "shape dimension 0 (12345678901234567890123, 23 digits) does not fit in int64");
  expect_refused(npy_bytes(h + "(9223372036854775808,), }"), "does not fit in int64");
  expect_refused(npy_bytes(h + "(4294967296, 4294967296), }"), "multiply to more than 2^63 bytes");
  expect_refused(npy_bytes(h + "(2305843009213693952,), }"), "multiply to more than 2^63 bytes");
  // Empty, but numel() of it overflowed int64 (found by fuzz/npy_fuzz.cpp).
  expect_refused(npy_bytes(h + "(4294967296, 4294967296, 0), }"),
                 "shape (4294967296, 4294967296, 0) of <f4 is too large");
  expect_refused(npy_bytes(h + "(5), }"), "a 1-d shape is written (n,)");
  expect_refused(npy_bytes(h + "(2, 3.0), }"), "expected ',' or ')'");
  expect_refused(npy_bytes(h + "(0x10,), }"), "expected ',' or ')'");
  expect_refused(npy_bytes(h + "(,), }"), "shape dimension 0: expected a non-negative integer");
  expect_refused(npy_bytes(h + "[2, 3], }"), "expected '(' opening the 'shape' tuple");
  std::string many = "(";
  for (int i = 0; i < 65; ++i) many += "1, ";
  expect_refused(npy_bytes(h + many + "), }"), "more than 64 dimensions");
}

TEST_F(NpyReader, RefusesBadKeysAndSyntaxByName) {
  const std::string ok_shape = "'shape': (6,)";
  expect_refused(
      npy_bytes("{'descr': '<f4', 'fortran_order': False, " + ok_shape + ", 'extra': 1}", kF32x6),
      "unknown key 'extra'");
  expect_refused(
      npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, " + ok_shape + "}",
                kF32x6),
      "key 'descr' appears twice");
  expect_refused(npy_bytes("{'descr': '<f4', 'fortran_order': False}", kF32x6), "no 'shape' key");
  expect_refused(npy_bytes("{'fortran_order': False, " + ok_shape + "}", kF32x6), "no 'descr' key");
  expect_refused(npy_bytes("{'descr': '<f4', " + ok_shape + "}", kF32x6), "no 'fortran_order' key");
  expect_refused(
      npy_bytes("{'descr': '<f4', 'fortran_order': False, " + ok_shape + "} junk", kF32x6),
      "unexpected text after the header dict: 'junk'");
  expect_refused(npy_bytes("{'descr': '<f4' 'fortran_order': False, " + ok_shape + "}", kF32x6),
                 "expected ',' or '}'");
  expect_refused(npy_bytes("{'descr': '<f4', 'fortran_order': Falsey, " + ok_shape + "}", kF32x6),
                 "must be True or False");
  expect_refused(npy_bytes("{'descr': '<f4', 'fortran_order': 0, " + ok_shape + "}", kF32x6),
                 "must be True or False");
  expect_refused(npy_bytes("{'descr': '<f4, 'fortran_order': False, " + ok_shape + "}", kF32x6),
                 "expected ',' or '}'");
  expect_refused(npy_bytes("{'descr': '<f4", kF32x6), "unterminated string");
  expect_refused(npy_bytes("{'descr': '<\\x66', 'fortran_order': False, " + ok_shape + "}", kF32x6),
                 "escape sequences");
  expect_refused(npy_bytes("{descr: '<f4'}", kF32x6), "expected a quoted key");
  expect_refused(npy_bytes("", kF32x6),
                 "expected '{' opening the header dict, found end of header");
  expect_refused(
      npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, " + ok_shape + "}", kF32x6),
      "structured dtypes are not supported");
  expect_refused(npy_bytes("{'descr': '>f4', 'fortran_order': False, " + ok_shape + "}", kF32x6),
                 "big-endian .npy dtype '>f4' is not supported");
  expect_refused(npy_bytes("{'descr': '<f2', 'fortran_order': False, " + ok_shape + "}", kF32x6),
                 "unsupported .npy dtype '<f2' (supported: <f4, <f8, <i8");
  expect_refused(npy_bytes("{'descr': '<f4', 'fortran_order': True, " + ok_shape + "}", kF32x6),
                 "Fortran-order .npy is not supported");
}

TEST_F(NpyReader, RefusesBadContainersByName) {
  const std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }";
  expect_refused("not numpy", "is not a .npy file (bad magic)");
  expect_refused("", "is not a .npy file (bad magic)");
  expect_refused(npy_bytes(h, kF32x6, 4), "unsupported .npy version 4.0");
  expect_refused(npy_bytes(h, kF32x6, 1, 1), "unsupported .npy version 1.1");
  expect_refused(npy_bytes(h, kF32x6).substr(0, 9), "truncated .npy header");
  expect_refused(npy_bytes(h, kF32x6).substr(0, 30), "exceeds the 20 bytes left in the file");
  std::string huge = npy_bytes(h, kF32x6, 2);
  huge[8] = 0;
  huge[9] = 0;
  huge[10] = 0x20;  // 2 MiB
  huge[11] = 0;
  expect_refused(huge, "header length 2097152 exceeds the limit of 1048576 bytes");
  expect_refused(npy_bytes(h, kF32x6.substr(0, 20)),
                 "payload truncated: shape (6,) of <f4 needs 24 bytes, the file has 20");
  expect_refused(npy_bytes(h, kF32x6 + "xx"), "2 unexpected bytes after the .npy payload");
}

// std::regex recursed once per character and overflowed the stack on these.
TEST_F(NpyReader, LongHeadersAreRefusedWithoutRecursion) {
  const std::string tail = "', 'fortran_order': False, 'shape': (6,), }";
  expect_refused(npy_bytes("{'descr': '<" + std::string(60000, 'f') + tail, kF32x6),
                 "unsupported .npy dtype '<" + std::string(39, 'f') + "... (60001 bytes)'");
  const std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  expect_refused(
      npy_bytes(h + std::string(60000, '7') + ",), }"),
      "(" + std::string(40, '7') + "... (60000 bytes), 60000 digits) does not fit in int64");
  std::string dims;
  while (dims.size() < 60000) dims += "1, ";
  expect_refused(npy_bytes(h + dims + "), }"), "more than 64 dimensions");
  expect_refused(npy_bytes(h + std::string(60000, '(') + "), }"),
                 "expected a non-negative integer");
  // Long runs of whitespace are fine (bounded by the header length only).
  auto a = read_both(npy_bytes(h + std::string(60000, ' ') + "6,), }", kF32x6));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{6}));
}

TEST_F(NpyReader, RefusesDirectoriesAndMissingFiles) {
  try {
    npy::read(scratch.path().string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(npy::read(scratch.file("missing.npy")), Error);
}

TEST_F(NpyReader, WriterRoundTripsScalarsAndRefusesNegativeShapes) {
  const double x = 2.5;
  npy::write(scratch.file("s.npy"), {}, &x);
  auto a = npy::read(scratch.file("s.npy"));
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.f64, (std::vector<double>{2.5}));
  EXPECT_THROW(npy::write(scratch.file("n.npy"), {-1, 2}, &x), Error);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
