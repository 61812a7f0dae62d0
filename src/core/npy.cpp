#include "numattn/core/npy.h"

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>

#include "numattn/core/error.h"
#include "numattn/core/file_io.h"
#include "numattn/core/memory.h"

namespace numattn::npy {

namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
// numpy's own maximum (NPY_MAXDIMS); a header claiming more is not a numpy file.
constexpr std::size_t kMaxDims = 64;
// Three keys and at most 64 dimensions fit in 2 KiB; the limit only bounds allocation.
constexpr std::uint32_t kMaxHeaderBytes = 1u << 20;

// A short, printable rendering of untrusted header text for error messages.
std::string show(std::string_view t) {
  constexpr std::size_t kShown = 40;
  std::string out;
  for (std::size_t k = 0; k < t.size() && k < kShown; ++k) {
    const auto c = static_cast<unsigned char>(t[k]);
    if (c >= 0x20 && c < 0x7F)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (t.size() > kShown) out += fmt::format("... ({} bytes)", t.size());
  return out;
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// The header is a Python dict literal with three flat values, so a single forward scan with
// no recursion and no backtracking parses it in time linear in its length.
class HeaderParser {
 public:
  HeaderParser(std::string_view s, const std::string& name) : s_(s), name_(name) {}

  Header parse() {
    Header h;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    ws();
    expect('{', "'{' opening the header dict");
    for (;;) {
      ws();
      if (eat('}')) break;
      const std::size_t key_at = i_;
      const std::string_view key = string_literal("a quoted key");
      ws();
      expect(':', fmt::format("':' after the key '{}'", show(key)));
      ws();
      auto once = [&](bool& seen) {
        if (seen) fail_at(key_at, fmt::format("key '{}' appears twice", show(key)));
        seen = true;
      };
      if (key == "descr") {
        once(seen_descr);
        if (peek() == '[')
          fail(
              "'descr' is a list: structured dtypes are not supported (supported: <f4, <f8, "
              "<i8)");
        h.descr = std::string(string_literal("the 'descr' string"));
      } else if (key == "fortran_order") {
        once(seen_fortran);
        h.fortran_order = boolean();
      } else if (key == "shape") {
        once(seen_shape);
        h.shape = shape();
      } else {
        fail_at(key_at, fmt::format("unknown key '{}' (a .npy header has exactly 'descr', "
                                    "'fortran_order' and 'shape')",
                                    show(key)));
      }
      ws();
      if (eat(',')) continue;
      expect('}', "',' or '}' after a value");
      break;
    }
    ws();
    if (i_ < s_.size())
      fail(fmt::format("unexpected text after the header dict: '{}'", show(rest())));
    for (auto [seen, key] :
         {std::pair{seen_descr, "descr"}, std::pair{seen_fortran, "fortran_order"},
          std::pair{seen_shape, "shape"}})
      NUMATTN_CHECK(seen, "'{}': .npy header has no '{}' key", name_, key);
    return h;
  }

 private:
  [[noreturn]] void fail_at(std::size_t at, const std::string& why) const {
    throw Error(fmt::format("'{}': bad .npy header at byte {}: {}", name_, at, why));
  }
  [[noreturn]] void fail(const std::string& why) const { fail_at(i_, why); }

  std::string_view rest() const { return s_.substr(i_); }
  int peek() const { return i_ < s_.size() ? static_cast<unsigned char>(s_[i_]) : -1; }
  bool eat(char c) {
    if (peek() != static_cast<unsigned char>(c)) return false;
    ++i_;
    return true;
  }
  // What follows the current position, quoted, for "expected X, found Y" messages.
  std::string found() const {
    return i_ < s_.size() ? fmt::format("'{}'", show(rest())) : std::string("end of header");
  }
  void expect(char c, const std::string& expected) {
    if (!eat(c)) fail(fmt::format("expected {}, found {}", expected, found()));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  static bool digit(int c) { return c >= '0' && c <= '9'; }

  std::string_view string_literal(const std::string& what) {
    const int q = peek();
    if (q != '\'' && q != '"') fail(fmt::format("expected {}, found {}", what, found()));
    const std::size_t start = ++i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') fail("escape sequences in header strings are not supported");
      if (s_[i_] == '\n') break;
      ++i_;
    }
    if (i_ >= s_.size() || s_[i_] != q) fail_at(start - 1, "unterminated string");
    return s_.substr(start, i_++ - start);
  }

  bool boolean() {
    for (auto [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (rest().substr(0, word.size()) == word) {
        const std::size_t end = i_ + word.size();
        const int next = end < s_.size() ? static_cast<unsigned char>(s_[end]) : -1;
        if (!(std::isalnum(next) || next == '_')) {
          i_ = end;
          return value;
        }
      }
    }
    fail(fmt::format("'fortran_order' must be True or False, found {}", found()));
  }

  std::int64_t dimension(std::size_t index) {
    const std::size_t at = i_;
    const bool negative = eat('-');
    const std::size_t b = i_;
    while (digit(peek())) ++i_;
    const std::string_view digits = s_.substr(b, i_ - b);
    if (digits.empty()) {
      i_ = at;
      fail(fmt::format("shape dimension {}: expected a non-negative integer, found {}", index,
                       found()));
    }
    if (negative)
      fail_at(at, fmt::format("shape dimension {} is negative (-{})", index, show(digits)));
    if (peek() == 'L' || peek() == 'l') ++i_;  // Python 2 long literal, as old numpy wrote
    std::int64_t v = 0;
    for (char c : digits) {
      const int d = c - '0';
      if (v > (kInt64Max - d) / 10)
        fail_at(at, fmt::format("shape dimension {} ({}, {} digits) does not fit in int64 "
                                "(max {})",
                                index, show(digits), digits.size(), kInt64Max));
      v = v * 10 + d;
    }
    return v;
  }

  std::vector<std::int64_t> shape() {
    std::vector<std::int64_t> dims;
    expect('(', "'(' opening the 'shape' tuple");
    ws();
    if (eat(')')) return dims;
    for (;;) {
      if (dims.size() == kMaxDims) fail(fmt::format("shape has more than {} dimensions", kMaxDims));
      dims.push_back(dimension(dims.size()));
      ws();
      if (eat(')')) {
        if (dims.size() == 1) fail("shape (n) is not a tuple: a 1-d shape is written (n,)");
        return dims;
      }
      expect(',', "',' or ')' in the 'shape' tuple");
      ws();
      if (eat(')')) return dims;
    }
  }

  std::string_view s_;
  const std::string& name_;
  std::size_t i_ = 0;
};

// Bytes from a file, read piecewise so that the payload is read once, into its vector.
class FileSource {
 public:
  // A regular file only; its size is what the header must account for, byte for byte.
  explicit FileSource(const std::string& path)
      : in_(path, ".npy file", kSizedByHeader), left_(in_.size()) {}
  std::uint64_t left() const { return left_; }
  bool read(void* dst, std::size_t n) {
    if (n > left_) return false;
    in_.read_at(dst, n, at_);
    at_ += n;
    left_ -= n;
    return true;
  }

 private:
  InputFile in_;
  std::uint64_t left_ = 0, at_ = 0;
};

class MemorySource {
 public:
  MemorySource(const void* data, std::size_t size)
      : p_(static_cast<const unsigned char*>(data)), left_(size) {}
  std::uint64_t left() const { return left_; }
  bool read(void* dst, std::size_t n) {
    if (n > left_) return false;
    if (n) std::memcpy(dst, p_, n);
    p_ += n;
    left_ -= n;
    return true;
  }

 private:
  const unsigned char* p_;
  std::size_t left_;
};

template <class Source>
Array read_from(Source& src, const std::string& name, Info* info_only = nullptr) {
  unsigned char magic[8];
  NUMATTN_CHECK(src.read(magic, 8) && std::memcmp(magic, "\x93NUMPY", 6) == 0,
                "'{}' is not a .npy file (bad magic)", name);
  const int major = magic[6], minor = magic[7];
  NUMATTN_CHECK(major >= 1 && major <= 3 && minor == 0,
                "'{}': unsupported .npy version {}.{} (supported: 1.0, 2.0, 3.0)", name, major,
                minor);
  unsigned char b[4] = {0, 0, 0, 0};
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  NUMATTN_CHECK(src.read(b, len_bytes), "'{}': truncated .npy header", name);
  const std::uint32_t hlen =
      b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<std::uint32_t>(b[3]) << 24);
  NUMATTN_CHECK(hlen <= kMaxHeaderBytes,
                "'{}': .npy header length {} exceeds the limit of {} bytes", name, hlen,
                kMaxHeaderBytes);
  NUMATTN_CHECK(hlen <= src.left(),
                "'{}': .npy header length {} exceeds the {} bytes left in the file (truncated)",
                name, hlen, src.left());
  std::string text(hlen, '\0');
  NUMATTN_CHECK(src.read(text.data(), hlen), "'{}': truncated .npy header", name);
  const Header h = HeaderParser(text, name).parse();

  Array a;
  std::size_t elem = 0;
  if (h.descr == "<f4")
    a.dtype = DType::kFloat32, elem = 4;
  else if (h.descr == "<f8")
    a.dtype = DType::kFloat64, elem = 8;
  else if (h.descr == "<i8")
    a.dtype = DType::kInt64, elem = 8;
  else if (!h.descr.empty() && h.descr[0] == '>')
    throw Error(
        fmt::format("'{}': big-endian .npy dtype '{}' is not supported (save "
                    "arr.astype(arr.dtype.newbyteorder('<')))",
                    name, show(h.descr)));
  else
    throw Error(
        fmt::format("'{}': unsupported .npy dtype '{}' (supported: <f4, <f8, <i8; "
                    "convert with arr.astype(np.float32))",
                    name, show(h.descr)));
  NUMATTN_CHECK(!h.fortran_order,
                "'{}': Fortran-order .npy is not supported (save np.ascontiguousarray(arr))", name);
  // The nonzero dimensions are bounded even when a zero makes the array empty, so that any
  // product of dimensions (numel(), strides) fits in int64.
  std::int64_t nonzero = 1;
  bool empty = false;
  for (auto d : h.shape) {
    empty |= d == 0;
    if (d == 0) continue;
    NUMATTN_CHECK(nonzero <= kInt64Max / static_cast<std::int64_t>(elem) / d,
                  "'{}': .npy shape {} of {} is too large (its nonzero dimensions multiply to more "
                  "than 2^63 bytes)",
                  name, shape_str(h.shape), h.descr);
    nonzero *= d;
  }
  const std::int64_t total = empty ? 0 : nonzero;
  a.shape = h.shape;
  const std::uint64_t need = static_cast<std::uint64_t>(total) * elem;
  NUMATTN_CHECK(src.left() >= need,
                "'{}': .npy payload truncated: shape {} of {} needs {} bytes, the file has {}",
                name, shape_str(a.shape), h.descr, need, src.left());
  NUMATTN_CHECK(src.left() == need,
                "'{}': {} unexpected bytes after the .npy payload (shape {} of {} is {} bytes)",
                name, src.left() - need, shape_str(a.shape), h.descr, need);
  if (info_only) {  // header checked; the payload starts after magic, length field and header
    info_only->dtype = a.dtype;
    info_only->shape = a.shape;
    info_only->data_offset = 8 + len_bytes + hlen;
    return a;
  }
  auto rd = [&](auto& vec) {
    check_memory(need, fmt::format("the payload of .npy file '{}'", name));
    vec.resize(static_cast<std::size_t>(total));
    NUMATTN_CHECK(src.read(vec.data(), static_cast<std::size_t>(need)),
                  "'{}': error reading the .npy payload", name);
  };
  if (a.dtype == DType::kFloat32)
    rd(a.f32);
  else if (a.dtype == DType::kFloat64)
    rd(a.f64);
  else
    rd(a.i64);
  return a;
}

void write_impl(const std::string& path,
                const std::vector<std::int64_t>& shape,
                const void* data,
                const char* descr,
                std::size_t elem) {
  NUMATTN_CHECK(shape.size() <= kMaxDims, "cannot write .npy file '{}': {} dimensions (max {})",
                path, shape.size(), kMaxDims);
  std::int64_t total = 1;
  for (auto d : shape) {
    NUMATTN_CHECK(d >= 0, "cannot write .npy file '{}': negative dimension in shape {}", path,
                  shape_str(shape));
    NUMATTN_CHECK(d == 0 || total <= kInt64Max / static_cast<std::int64_t>(elem) / d,
                  "cannot write .npy file '{}': shape {} is too large", path, shape_str(shape));
    total *= d;
  }
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   descr, shape_str(shape));
  // Pad with spaces so that the data starts on a 64-byte boundary; header ends with '\n'.
  const std::size_t total_len = 10 + header.size() + 1;
  header.append((64 - total_len % 64) % 64, ' ');
  header.push_back('\n');
  AtomicFile out(path, ".npy file");
  out.write("\x93NUMPY\x01\x00", 8);
  const auto hl = static_cast<std::uint16_t>(header.size());
  const char hb[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  out.write(hb, 2);
  out.write(header);
  out.write(data, static_cast<std::size_t>(total) * elem);
  out.commit();
}

}  // namespace

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::vector<float> Array::as_f32() const {
  switch (dtype) {
    case DType::kFloat32:
      return f32;
    case DType::kFloat64:
      return std::vector<float>(f64.begin(), f64.end());
    case DType::kInt64:
      return std::vector<float>(i64.begin(), i64.end());
  }
  return {};
}

std::vector<double> Array::as_f64() const {
  switch (dtype) {
    case DType::kFloat32:
      return std::vector<double>(f32.begin(), f32.end());
    case DType::kFloat64:
      return f64;
    case DType::kInt64:
      return std::vector<double>(i64.begin(), i64.end());
  }
  return {};
}

Array read(const std::string& path) {
  FileSource src(path);
  return read_from(src, path);
}

Info read_info(const std::string& path) {
  FileSource src(path);
  Info info;
  read_from(src, path, &info);
  return info;
}

Array read_bytes(const void* data, std::size_t size, const std::string& name) {
  MemorySource src(data, size);
  return read_from(src, name);
}

void write(const std::string& path, const std::vector<std::int64_t>& shape, const float* data) {
  write_impl(path, shape, data, "<f4", 4);
}
void write(const std::string& path, const std::vector<std::int64_t>& shape, const double* data) {
  write_impl(path, shape, data, "<f8", 8);
}
void write(const std::string& path,
           const std::vector<std::int64_t>& shape,
           const std::int64_t* data) {
  write_impl(path, shape, data, "<i8", 8);
}

}  // namespace numattn::npy
