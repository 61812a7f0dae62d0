// Unicode character classes needed by the byte-level BPE pre-tokenizers (\p{L}, \p{N}, \s).
// The L/N tables are generated (scripts/gen_unicode_tables.py); White_Space is short and fixed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace numattn {

struct CodeRange {
  std::uint32_t lo, hi;  // inclusive
};

namespace unicode_tables {
extern const CodeRange kLetters[];
extern const std::size_t kLetters_size;
extern const CodeRange kNumbers[];
extern const std::size_t kNumbers_size;
}  // namespace unicode_tables

/// General category L* (Lu, Ll, Lt, Lm, Lo): what `\p{L}` matches.
bool is_letter(std::uint32_t cp);
/// General category N* (Nd, Nl, No): what `\p{N}` matches.
bool is_number(std::uint32_t cp);
/// The Unicode White_Space property: what `\s` matches in Oniguruma/PCRE Unicode mode.
bool is_space(std::uint32_t cp);

}  // namespace numattn
