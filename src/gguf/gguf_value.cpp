// GgufValue: construction, typed access with type checks, printing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "numattn/gguf/gguf.h"

namespace numattn {

namespace {

template <class T>
constexpr GgufType type_of() {
  if constexpr (std::is_same_v<T, std::uint8_t>) return GgufType::U8;
  else if constexpr (std::is_same_v<T, std::int8_t>) return GgufType::I8;
  else if constexpr (std::is_same_v<T, std::uint16_t>) return GgufType::U16;
  else if constexpr (std::is_same_v<T, std::int16_t>) return GgufType::I16;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return GgufType::U32;
  else if constexpr (std::is_same_v<T, std::int32_t>) return GgufType::I32;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return GgufType::U64;
  else if constexpr (std::is_same_v<T, std::int64_t>) return GgufType::I64;
  else if constexpr (std::is_same_v<T, float>) return GgufType::F32;
  else if constexpr (std::is_same_v<T, double>) return GgufType::F64;
  else if constexpr (std::is_same_v<T, bool>) return GgufType::BOOL;
  else static_assert(sizeof(T) == 0, "not a GGUF scalar type");
}

bool is_unsigned_int(GgufType t) {
  return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64 ||
         t == GgufType::BOOL;
}
bool is_signed_int(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

// "a string", "a u32", "an array of f64": what a value is, for type errors.
std::string describe(GgufType t, GgufType elem) {
  if (t == GgufType::ARRAY) return "an array of " + gguf_type_name(elem);
  const std::string n = gguf_type_name(t);
  return (n == "i8" || n == "i16" || n == "i32" || n == "i64" || n == "f32" || n == "f64" ? "an " : "a ") + n;
}

}  // namespace

std::string gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return fmt::format("type#{}", static_cast<std::uint32_t>(t));
}

// ---- construction ----------------------------------------------------------------------------

#define NUMATTN_SCALAR_CTOR(fn, T, TAG, STORE)      \
  GgufValue GgufValue::fn(T v) {                    \
    GgufValue r;                                    \
    r.type_ = GgufType::TAG;                        \
    r.v_ = static_cast<STORE>(v);                   \
    return r;                                       \
  }
NUMATTN_SCALAR_CTOR(u8, std::uint8_t, U8, std::uint64_t)
NUMATTN_SCALAR_CTOR(i8, std::int8_t, I8, std::int64_t)
NUMATTN_SCALAR_CTOR(u16, std::uint16_t, U16, std::uint64_t)
NUMATTN_SCALAR_CTOR(i16, std::int16_t, I16, std::int64_t)
NUMATTN_SCALAR_CTOR(u32, std::uint32_t, U32, std::uint64_t)
NUMATTN_SCALAR_CTOR(i32, std::int32_t, I32, std::int64_t)
NUMATTN_SCALAR_CTOR(u64, std::uint64_t, U64, std::uint64_t)
NUMATTN_SCALAR_CTOR(i64, std::int64_t, I64, std::int64_t)
NUMATTN_SCALAR_CTOR(f32, float, F32, double)
NUMATTN_SCALAR_CTOR(f64, double, F64, double)
NUMATTN_SCALAR_CTOR(boolean, bool, BOOL, std::uint64_t)
#undef NUMATTN_SCALAR_CTOR

GgufValue GgufValue::string(std::string v) {
  GgufValue r;
  r.type_ = GgufType::STRING;
  r.v_ = std::move(v);
  return r;
}

template <class T>
GgufValue GgufValue::array(std::vector<T> v) {
  GgufValue r;
  r.type_ = GgufType::ARRAY;
  r.elem_ = type_of<T>();
  r.v_ = std::move(v);
  return r;
}

GgufValue GgufValue::bool_array(const std::vector<bool>& v) {
  GgufValue r;
  r.type_ = GgufType::ARRAY;
  r.elem_ = GgufType::BOOL;
  std::vector<std::uint8_t> b(v.begin(), v.end());
  r.v_ = std::move(b);
  return r;
}

GgufValue GgufValue::string_array(std::vector<std::string> v) {
  GgufValue r;
  r.type_ = GgufType::ARRAY;
  r.elem_ = GgufType::STRING;
  r.v_ = std::move(v);
  return r;
}

GgufValue GgufValue::array_of_arrays(std::vector<GgufValue> items) {
  for (const auto& it : items)
    NUMATTN_CHECK(it.is_array(), "array_of_arrays: every item must be an array, got {}",
                  gguf_type_name(it.type()));
  GgufValue r;
  r.type_ = GgufType::ARRAY;
  r.elem_ = GgufType::ARRAY;
  r.v_ = std::move(items);
  return r;
}

// ---- access ------------------------------------------------------------------------------------

GgufType GgufValue::array_type() const {
  NUMATTN_CHECK(is_array(), "the value is {}, expected an array", describe(type_, elem_));
  return elem_;
}

std::size_t GgufValue::array_size() const {
  NUMATTN_CHECK(is_array(), "the value is {}, expected an array", describe(type_, elem_));
  return std::visit(
      [](const auto& x) -> std::size_t {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::uint64_t> || std::is_same_v<X, std::int64_t> ||
                      std::is_same_v<X, double> || std::is_same_v<X, std::string>)
          return 0;
        else
          return x.size();
      },
      v_);
}

template <class T>
T GgufValue::get() const {
  constexpr GgufType want = type_of<T>();
  NUMATTN_CHECK(type_ == want, "the value is {}, expected {}", describe(type_, elem_),
                describe(want, want));
  if constexpr (std::is_same_v<T, bool>) return std::get<std::uint64_t>(v_) != 0;
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(std::get<double>(v_));
  else if constexpr (std::is_unsigned_v<T>) return static_cast<T>(std::get<std::uint64_t>(v_));
  else return static_cast<T>(std::get<std::int64_t>(v_));
}

std::int64_t GgufValue::as_int() const {
  if (is_signed_int(type_)) return std::get<std::int64_t>(v_);
  if (is_unsigned_int(type_)) {
    const std::uint64_t u = std::get<std::uint64_t>(v_);
    NUMATTN_CHECK(u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                  "GGUF value {} does not fit in int64", u);
    return static_cast<std::int64_t>(u);
  }
  throw Error(fmt::format("the value is {}, expected an integer", describe(type_, elem_)));
}

std::uint64_t GgufValue::as_uint() const {
  if (is_unsigned_int(type_)) return std::get<std::uint64_t>(v_);
  if (is_signed_int(type_)) {
    const std::int64_t s = std::get<std::int64_t>(v_);
    NUMATTN_CHECK(s >= 0, "GGUF value {} is negative, requested an unsigned integer", s);
    return static_cast<std::uint64_t>(s);
  }
  throw Error(fmt::format("the value is {}, expected an unsigned integer", describe(type_, elem_)));
}

double GgufValue::as_double() const {
  if (type_ == GgufType::F32 || type_ == GgufType::F64) return std::get<double>(v_);
  if (is_signed_int(type_)) return static_cast<double>(std::get<std::int64_t>(v_));
  if (is_unsigned_int(type_) && type_ != GgufType::BOOL)
    return static_cast<double>(std::get<std::uint64_t>(v_));
  throw Error(fmt::format("the value is {}, expected a number", describe(type_, elem_)));
}

const std::string& GgufValue::as_string() const {
  NUMATTN_CHECK(type_ == GgufType::STRING, "the value is {}, expected a string", describe(type_, elem_));
  return std::get<std::string>(v_);
}

template <class T>
std::span<const T> GgufValue::array_view() const {
  constexpr GgufType want = type_of<T>();
  NUMATTN_CHECK(is_array() && elem_ == want, "the value is {}, expected an array of {}",
                describe(type_, elem_), gguf_type_name(want));
  const auto& v = std::get<std::vector<T>>(v_);
  return {v.data(), v.size()};
}

std::span<const std::uint8_t> GgufValue::bool_array_view() const {
  NUMATTN_CHECK(is_array() && elem_ == GgufType::BOOL, "the value is {}, expected an array of bool",
                describe(type_, elem_));
  const auto& v = std::get<std::vector<std::uint8_t>>(v_);
  return {v.data(), v.size()};
}

const std::vector<std::string>& GgufValue::string_array_view() const {
  NUMATTN_CHECK(is_array() && elem_ == GgufType::STRING, "the value is {}, expected an array of string",
                describe(type_, elem_));
  return std::get<std::vector<std::string>>(v_);
}

const std::vector<GgufValue>& GgufValue::nested_array_view() const {
  NUMATTN_CHECK(is_array() && elem_ == GgufType::ARRAY, "the value is {}, expected an array of arrays",
                describe(type_, elem_));
  return std::get<std::vector<GgufValue>>(v_);
}

namespace {
template <class Out, class V, class F>
std::vector<Out> convert_array(const V& v, F ok) {
  return std::visit(
      [&](const auto& x) -> std::vector<Out> {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::uint64_t> || std::is_same_v<X, std::int64_t> ||
                      std::is_same_v<X, double> || std::is_same_v<X, std::string> ||
                      std::is_same_v<X, std::vector<std::string>> ||
                      std::is_same_v<X, std::vector<GgufValue>>) {
          throw Error("GGUF array is not numeric");
        } else {
          std::vector<Out> out;
          out.reserve(x.size());
          for (auto e : x) out.push_back(ok(e));
          return out;
        }
      },
      v);
}
}  // namespace

std::vector<std::int64_t> GgufValue::int_array() const {
  NUMATTN_CHECK(is_array() && (is_signed_int(elem_) || is_unsigned_int(elem_)),
                "the value is {}, expected an array of integers", describe(type_, elem_));
  return convert_array<std::int64_t>(v_, [](auto e) -> std::int64_t {
    if constexpr (std::is_same_v<decltype(e), std::uint64_t>)
      NUMATTN_CHECK(e <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                    "GGUF array value {} does not fit in int64", e);
    if constexpr (std::is_integral_v<decltype(e)>) return static_cast<std::int64_t>(e);
    else return 0;
  });
}

std::vector<double> GgufValue::double_array() const {
  NUMATTN_CHECK(is_array() && elem_ != GgufType::BOOL && elem_ != GgufType::STRING &&
                    elem_ != GgufType::ARRAY,
                "the value is {}, expected an array of numbers", describe(type_, elem_));
  return convert_array<double>(v_, [](auto e) { return static_cast<double>(e); });
}

namespace {
std::string quote(const std::string& s, std::size_t max_chars) {
  std::string out = "\"";
  std::size_t n = 0;
  for (unsigned char c : s) {
    if (n++ >= max_chars) {
      out += "...";
      break;
    }
    if (c == '\n') out += "\\n";
    else if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out + (n > max_chars ? "" : "\"");
}
}  // namespace

std::string GgufValue::to_string(std::size_t max_chars) const {
  switch (type_) {
    case GgufType::STRING: return quote(as_string(), max_chars);
    case GgufType::BOOL: return as_bool() ? "true" : "false";
    case GgufType::F32:
    case GgufType::F64: return fmt::format("{}", std::get<double>(v_));
    case GgufType::ARRAY: break;
    default:
      return is_signed_int(type_) ? fmt::format("{}", std::get<std::int64_t>(v_))
                                  : fmt::format("{}", std::get<std::uint64_t>(v_));
  }
  const std::size_t n = array_size();
  std::string out = fmt::format("[{}; {}]", gguf_type_name(elem_), n);
  const std::size_t show = std::min<std::size_t>(n, 6);
  std::vector<double> nums;
  if (elem_ != GgufType::STRING && elem_ != GgufType::ARRAY && elem_ != GgufType::BOOL)
    nums = double_array();
  for (std::size_t i = 0; i < show; ++i) {
    out += i == 0 ? " " : ", ";
    if (elem_ == GgufType::STRING) out += quote(string_array_view()[i], 24);
    else if (elem_ == GgufType::ARRAY) out += nested_array_view()[i].to_string(24);
    else if (elem_ == GgufType::BOOL) out += bool_array_view()[i] ? "true" : "false";
    else out += fmt::format("{}", nums[i]);
  }
  if (show < n) out += ", ...";
  return out;
}

// Explicit instantiations of the templates declared in gguf.h.
#define NUMATTN_INST(T)                                           \
  template GgufValue GgufValue::array<T>(std::vector<T>);         \
  template std::span<const T> GgufValue::array_view<T>() const;   \
  template T GgufValue::get<T>() const;
NUMATTN_INST(std::uint8_t)
NUMATTN_INST(std::int8_t)
NUMATTN_INST(std::uint16_t)
NUMATTN_INST(std::int16_t)
NUMATTN_INST(std::uint32_t)
NUMATTN_INST(std::int32_t)
NUMATTN_INST(std::uint64_t)
NUMATTN_INST(std::int64_t)
NUMATTN_INST(float)
NUMATTN_INST(double)
#undef NUMATTN_INST
template bool GgufValue::get<bool>() const;

}  // namespace numattn
