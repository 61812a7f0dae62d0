// Internal: what a kernel family's dispatcher needs of its instruction-set variants
// (core/isa_begin.h): their getters declared in one line, and the choice among them.
#pragma once

#include "numattn/core/cpu.h"

/// Declares `Type getter();` in the namespaces of the three variants (portable, avx2, avx512) of
/// the enclosing namespace; a variant that was not compiled returns nullptr.
#define NUMATTN_DECLARE_ISA_VARIANTS(Type, getter) \
  namespace portable {                             \
  Type getter();                                   \
  }                                                \
  namespace avx2 {                                 \
  Type getter();                                   \
  }                                                \
  namespace avx512 {                               \
  Type getter();                                   \
  }

namespace numattn {

/// The variant a family with portable, avx2 and avx512 variants runs now: the one of
/// family_path(default_cpu_path(), avx512), or the next narrower one where that was not
/// compiled (nullptr); `portable` is always there.
template <class T>
T pick_isa_variant(T portable, T avx2, T avx512) {
  switch (family_path(default_cpu_path(), CpuPath::kAvx512)) {
    case CpuPath::kAvx512Vnni:
    case CpuPath::kAvx512:
      if (avx512 != nullptr) return avx512;
      [[fallthrough]];
    case CpuPath::kAvx2:
      if (avx2 != nullptr) return avx2;
      [[fallthrough]];
    case CpuPath::kPortable: break;
  }
  return portable;
}

}  // namespace numattn
