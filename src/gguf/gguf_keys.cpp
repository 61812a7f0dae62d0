// Checked metadata reads (gguf/gguf_keys.h): one place that turns a key's type, range and set
// of values into errors naming the key and the file.
#include "numattn/gguf/gguf_keys.h"

#include <cmath>

#include "numattn/core/error.h"

namespace numattn {

namespace {

bool is_integer_type(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}
bool is_number_type(GgufType t) { return is_integer_type(t) || t == GgufType::F32 || t == GgufType::F64; }

std::string type_of(const GgufValue& v) {
  return v.is_array() ? "an array of " + gguf_type_name(v.array_type()) : gguf_type_name(v.type());
}

std::string range(double lo, bool lo_open, double hi) {
  if (hi == std::numeric_limits<double>::infinity()) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
  return fmt::format("{}{}, {}]", lo_open ? "(" : "[", lo, hi);
}
std::string range(std::int64_t lo, std::int64_t hi) {
  if (hi == std::numeric_limits<std::int64_t>::max()) return fmt::format(">= {}", lo);
  return fmt::format("between {} and {}", lo, hi);
}
std::string because(std::string_view why) { return why.empty() ? "" : fmt::format(" ({})", why); }

std::string set_str(std::initializer_list<std::string_view> allowed) {
  std::string s;
  for (std::string_view a : allowed) s += (s.empty() ? "" : ", ") + std::string(a);
  return s;
}

}  // namespace

void GgufKeyReader::refuse(std::string_view key, std::string_view reason) const {
  const GgufValue* v = f_.find(key);
  if (v == nullptr) throw Error(fmt::format("{}: metadata key {} is missing: {}", f_.path(), key, reason));
  throw Error(fmt::format("{}: {} = {}: {}", f_.path(), key, v->to_string(), reason));
}

void GgufKeyReader::wrong_type(std::string_view key, const GgufValue& v, std::string_view expected) const {
  throw Error(fmt::format("{}: {} has type {} (value {}), expected {}", f_.path(), key, type_of(v),
                          v.to_string(), expected));
}

const GgufValue& GgufKeyReader::require(std::string_view key, std::string_view expected, std::string_view why) const {
  const GgufValue* v = f_.find(key);
  if (v == nullptr)
    throw Error(fmt::format("{}: metadata key {} is missing (expected {}{})", f_.path(), key, expected, because(why)));
  return *v;
}

std::int64_t GgufKeyReader::integer(std::string_view key, std::int64_t lo, std::int64_t hi, std::string_view why) const {
  const std::string expected = fmt::format("an integer {}", range(lo, hi));
  const GgufValue& v = require(key, expected, why);
  if (!is_integer_type(v.type())) wrong_type(key, v, expected);
  // An unsigned value past int64 is out of any range.
  if (v.type() == GgufType::U64 && v.as_uint() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    refuse(key, fmt::format("must be {}{}", range(lo, hi), because(why)));
  const std::int64_t x = v.as_int();
  if (x < lo || x > hi) refuse(key, fmt::format("must be {}{}", range(lo, hi), because(why)));
  return x;
}

std::int64_t GgufKeyReader::integer_or(std::string_view key, std::int64_t def, std::int64_t lo, std::int64_t hi,
                                       std::string_view why) const {
  return has(key) ? integer(key, lo, hi, why) : def;
}

double GgufKeyReader::number(std::string_view key, double lo, bool lo_open, double hi, std::string_view why) const {
  const std::string expected = fmt::format("a finite number {}", range(lo, lo_open, hi));
  const GgufValue& v = require(key, expected, why);
  if (!is_number_type(v.type())) wrong_type(key, v, expected);
  const double x = v.type() == GgufType::U64 ? static_cast<double>(v.as_uint()) : v.as_double();
  if (!std::isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
    refuse(key, fmt::format("must be {}{}", expected.substr(2), because(why)));
  return x;
}

std::string GgufKeyReader::one_of(std::string_view key, std::initializer_list<std::string_view> allowed,
                                  std::string_view why) const {
  const std::string expected = fmt::format("a string, one of {}", set_str(allowed));
  const GgufValue& v = require(key, expected, why);
  if (v.type() != GgufType::STRING) wrong_type(key, v, expected);
  for (std::string_view a : allowed)
    if (v.as_string() == a) return v.as_string();
  refuse(key, fmt::format("is not one of {}{}", set_str(allowed), because(why)));
}

std::string GgufKeyReader::one_of_or(std::string_view key, std::string_view def,
                                     std::initializer_list<std::string_view> allowed, std::string_view why) const {
  return has(key) ? one_of(key, allowed, why) : std::string(def);
}

std::int64_t GgufKeyReader::version(std::string_view key, std::int64_t newest, std::int64_t def) const {
  if (!has(key) && def > 0) return def;
  const std::string expected = fmt::format("a format version, an integer between 1 and {}", newest);
  const GgufValue& v = require(key, expected, "");
  if (!is_integer_type(v.type())) wrong_type(key, v, expected);
  if (v.type() == GgufType::U64 || v.as_int() > newest)
    refuse(key, fmt::format("the file was written by a newer numattn (this build reads versions 1 to {}); "
                            "convert the model again with this numattn, or use a newer one", newest));
  if (v.as_int() < 1) refuse(key, fmt::format("must be between 1 and {} (a format version)", newest));
  return v.as_int();
}

std::vector<double> GgufKeyReader::numbers(std::string_view key, std::size_t count, double lo, bool lo_open,
                                           double hi, std::string_view why) const {
  const std::string each = fmt::format("finite and {}", range(lo, lo_open, hi));
  const std::string expected = fmt::format("an array of {} numbers, each {}", count, each);
  const GgufValue& v = require(key, expected, why);
  if (!v.is_array() || !is_number_type(v.array_type())) wrong_type(key, v, expected);
  if (v.array_size() != count)
    refuse(key, fmt::format("has {} values, expected {}{}", v.array_size(), count, because(why)));
  std::vector<double> out = v.double_array();
  for (std::size_t i = 0; i < out.size(); ++i)
    if (!std::isfinite(out[i]) || out[i] < lo || (lo_open && out[i] == lo) || out[i] > hi)
      refuse(key, fmt::format("element {} = {} must be {}{}", i, out[i], each, because(why)));
  return out;
}

std::vector<std::int64_t> GgufKeyReader::integers(std::string_view key, std::size_t min_count, std::size_t max_count,
                                                  std::int64_t lo, std::int64_t hi, std::string_view why) const {
  const std::string count = min_count == max_count ? std::to_string(min_count)
                                                   : fmt::format("{} to {}", min_count, max_count);
  const std::string expected = fmt::format("an array of {} integers, each {}", count, range(lo, hi));
  const GgufValue& v = require(key, expected, why);
  if (!v.is_array() || !is_integer_type(v.array_type())) wrong_type(key, v, expected);
  if (v.array_size() < min_count || v.array_size() > max_count)
    refuse(key, fmt::format("has {} values, expected {}{}", v.array_size(), count, because(why)));
  if (v.array_type() == GgufType::U64)
    for (std::uint64_t u : v.array_view<std::uint64_t>())
      if (u > static_cast<std::uint64_t>(hi < 0 ? 0 : hi))
        refuse(key, fmt::format("value {} must be {}{}", u, range(lo, hi), because(why)));
  std::vector<std::int64_t> out = v.int_array();
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] < lo || out[i] > hi)
      refuse(key, fmt::format("element {} = {} must be {}{}", i, out[i], range(lo, hi), because(why)));
  return out;
}

}  // namespace numattn
