#include "numattn/core/npy.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <regex>

#include "numattn/core/error.h"

namespace numattn::npy {

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::vector<float> Array::as_f32() const {
  switch (dtype) {
    case DType::kFloat32: return f32;
    case DType::kFloat64: return std::vector<float>(f64.begin(), f64.end());
    case DType::kInt64: return std::vector<float>(i64.begin(), i64.end());
  }
  return {};
}

std::vector<double> Array::as_f64() const {
  switch (dtype) {
    case DType::kFloat32: return std::vector<double>(f32.begin(), f32.end());
    case DType::kFloat64: return f64;
    case DType::kInt64: return std::vector<double>(i64.begin(), i64.end());
  }
  return {};
}

Array read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  NUMATTN_CHECK(in.good(), "cannot open .npy file '{}'", path);
  char magic[8];
  in.read(magic, 8);
  NUMATTN_CHECK(in.gcount() == 8 && std::memcmp(magic, "\x93NUMPY", 6) == 0,
                "'{}' is not a .npy file (bad magic)", path);
  const int major = static_cast<unsigned char>(magic[6]);
  NUMATTN_CHECK(major >= 1 && major <= 3, "'{}': unsupported .npy version {}", path, major);
  std::uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<std::uint32_t>(b[3]) << 24);
  }
  NUMATTN_CHECK(in.good() && hlen < (1u << 20), "'{}': truncated or oversized .npy header", path);
  std::string header(hlen, '\0');
  in.read(header.data(), hlen);
  NUMATTN_CHECK(static_cast<std::uint32_t>(in.gcount()) == hlen, "'{}': truncated .npy header",
                path);

  std::smatch m;
  NUMATTN_CHECK(std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([^']*)')")),
                "'{}': .npy header has no descr", path);
  const std::string descr = m[1];
  Array a;
  std::size_t elem = 0;
  if (descr == "<f4") a.dtype = DType::kFloat32, elem = 4;
  else if (descr == "<f8") a.dtype = DType::kFloat64, elem = 8;
  else if (descr == "<i8") a.dtype = DType::kInt64, elem = 8;
  else
    throw Error(fmt::format("'{}': unsupported .npy dtype '{}' (supported: <f4, <f8, <i8; "
                            "convert with arr.astype(np.float32))", path, descr));
  NUMATTN_CHECK(std::regex_search(header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))")),
                "'{}': .npy header has no fortran_order", path);
  NUMATTN_CHECK(m[1] == "False",
                "'{}': Fortran-order .npy is not supported (save np.ascontiguousarray(arr))", path);
  NUMATTN_CHECK(std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")),
                "'{}': .npy header has no shape", path);
  const std::string dims = m[1];
  std::int64_t total = 1;
  static const std::regex kDim(R"(\d+)");
  for (std::sregex_iterator it(dims.begin(), dims.end(), kDim), end; it != end; ++it) {
    std::int64_t d = std::stoll(it->str());
    NUMATTN_CHECK(d >= 0 && (d == 0 || total <= std::numeric_limits<std::int64_t>::max() / 8 / d),
                  "'{}': .npy shape too large", path);
    a.shape.push_back(d);
    total *= d;
  }
  // Check the payload size against the file before allocating.
  auto pos = in.tellg();
  in.seekg(0, std::ios::end);
  auto fsize = in.tellg();
  in.seekg(pos);
  NUMATTN_CHECK(static_cast<std::int64_t>(fsize - pos) >= total * static_cast<std::int64_t>(elem),
                "'{}': .npy payload truncated ({} bytes, need {})", path,
                static_cast<std::int64_t>(fsize - pos), total * static_cast<std::int64_t>(elem));
  auto rd = [&](auto& vec) {
    vec.resize(static_cast<std::size_t>(total));
    in.read(reinterpret_cast<char*>(vec.data()), total * static_cast<std::int64_t>(elem));
  };
  if (a.dtype == DType::kFloat32) rd(a.f32);
  else if (a.dtype == DType::kFloat64) rd(a.f64);
  else rd(a.i64);
  NUMATTN_CHECK(in.good(), "'{}': error reading .npy payload", path);
  return a;
}

namespace {
void write_impl(const std::string& path, const std::vector<std::int64_t>& shape, const void* data,
                const char* descr, std::size_t elem) {
  std::string dims;
  std::int64_t total = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dims += (i ? ", " : "") + std::to_string(shape[i]);
    total *= shape[i];
  }
  if (shape.size() == 1) dims += ",";
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, dims);
  // Pad with spaces so that the data starts on a 64-byte boundary; header ends with '\n'.
  std::size_t total_len = 10 + header.size() + 1;
  header.append((64 - total_len % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  NUMATTN_CHECK(out.good(), "cannot write .npy file '{}'", path);
  out.write("\x93NUMPY\x01\x00", 8);
  std::uint16_t hl = static_cast<std::uint16_t>(header.size());
  char hb[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  out.write(hb, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(total * elem));
  NUMATTN_CHECK(out.good(), "error writing .npy file '{}'", path);
}
}  // namespace

void write(const std::string& path, const std::vector<std::int64_t>& shape, const float* data) {
  write_impl(path, shape, data, "<f4", 4);
}
void write(const std::string& path, const std::vector<std::int64_t>& shape, const double* data) {
  write_impl(path, shape, data, "<f8", 8);
}
void write(const std::string& path, const std::vector<std::int64_t>& shape,
           const std::int64_t* data) {
  write_impl(path, shape, data, "<i8", 8);
}

}  // namespace numattn::npy
