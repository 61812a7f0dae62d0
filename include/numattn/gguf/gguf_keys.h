/// @file gguf_keys.h
/// Checked reads of GGUF metadata keys: each read knows the key's name, its type, its allowed
/// range or set of values, and the file, so every refusal names the key, the file, the value
/// found and what was expected. numattn's own architectures (numattn-mla, numattn-tensor, the
/// BDA keys of a llama file) read every key they use through it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "numattn/gguf/gguf.h"

namespace numattn {

class GgufKeyReader {
 public:
  explicit GgufKeyReader(const GgufFile& f) : f_(f) {}
  const GgufFile& file() const { return f_; }
  bool has(std::string_view key) const { return f_.has(key); }

  /// An integer key (any integer type; bool, float and string refused) in [lo, hi]. `why`
  /// says where the bounds come from; it is part of every error. Missing: refused.
  std::int64_t integer(std::string_view key, std::int64_t lo, std::int64_t hi, std::string_view why) const;
  /// The same, `def` when the key is missing.
  std::int64_t integer_or(std::string_view key, std::int64_t def, std::int64_t lo, std::int64_t hi,
                          std::string_view why) const;
  /// A finite number key (float or integer type) in [lo, hi], or in (lo, hi] with `lo_open`.
  double number(std::string_view key, double lo, bool lo_open, double hi, std::string_view why) const;
  /// A string key whose value is one of `allowed`.
  std::string one_of(std::string_view key, std::initializer_list<std::string_view> allowed,
                     std::string_view why) const;
  /// The same, `def` when the key is missing.
  std::string one_of_or(std::string_view key, std::string_view def,
                        std::initializer_list<std::string_view> allowed, std::string_view why) const;
  /// A format version (integer key): 1..`newest` is read by this build; a larger one was written
  /// by a newer numattn and is refused as such. Missing: `def` (0 = required).
  std::int64_t version(std::string_view key, std::int64_t newest, std::int64_t def = 0) const;
  /// A numeric array of exactly `count` elements, each finite and in [lo, hi] ((lo, hi] with
  /// `lo_open`).
  std::vector<double> numbers(std::string_view key, std::size_t count, double lo, bool lo_open, double hi,
                              std::string_view why) const;
  /// An integer array of `min_count`..`max_count` elements, each in [lo, hi].
  std::vector<std::int64_t> integers(std::string_view key, std::size_t min_count, std::size_t max_count,
                                     std::int64_t lo, std::int64_t hi, std::string_view why) const;

  /// Refuses `key` for a reason found by the caller (a disagreement with other keys or with a
  /// tensor): "<file>: <key> = <value>: <reason>".
  [[noreturn]] void refuse(std::string_view key, std::string_view reason) const;

 private:
  const GgufValue& require(std::string_view key, std::string_view expected, std::string_view why) const;
  [[noreturn]] void wrong_type(std::string_view key, const GgufValue& v, std::string_view expected) const;
  const GgufFile& f_;
};

}  // namespace numattn
