// Internal: the entry points of exact.flash's instruction-set variants (flash_impl.h).
#pragma once

#include <cstddef>

#include "core/isa_dispatch.h"
#include "numattn/attention/method.h"

namespace numattn::flash {

struct Ops {
  std::size_t (*workspace_bytes)(const AttentionProblem& p, const ParamValues& params, int threads);
  void (*forward)(const AttentionProblem& p, const ParamValues& params, const ExecContext& ctx);
};

NUMATTN_DECLARE_ISA_VARIANTS(const Ops*, ops)

}  // namespace numattn::flash
