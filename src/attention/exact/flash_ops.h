// Internal: the entry points of exact.flash's instruction-set variants (flash_impl.h).
#pragma once

#include <cstddef>

#include "numattn/attention/method.h"

namespace numattn::flash {

struct Ops {
  std::size_t (*workspace_bytes)(const AttentionProblem& p, const ParamValues& params, int threads);
  void (*forward)(const AttentionProblem& p, const ParamValues& params, const ExecContext& ctx);
};

// nullptr where the variant was not compiled (core/isa_begin.h).
namespace portable {
const Ops* ops();
}
namespace avx2 {
const Ops* ops();
}
namespace avx512 {
const Ops* ops();
}

}  // namespace numattn::flash
