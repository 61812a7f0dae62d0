// Internal: the entry points of the flash block's instruction-set variants (flash_impl.h).
#pragma once

#include <cstddef>

#include "core/isa_dispatch.h"
#include "numattn/attention/blocks/flash.h"

namespace numattn::flash {

struct Ops {
  std::size_t (*workspace_bytes)(const AttentionProblem& p, const blocks::FlashConfig& cfg, int threads);
  void (*forward)(const AttentionProblem& p, const blocks::FlashConfig& cfg, const ExecContext& ctx);
  void (*forward_selected)(const AttentionProblem& p, const blocks::SelectKeys& select, const blocks::FlashConfig& cfg,
                           const ExecContext& ctx);
};

NUMATTN_DECLARE_ISA_VARIANTS(const Ops*, ops)

}  // namespace numattn::flash
