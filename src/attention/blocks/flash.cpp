#include "numattn/attention/blocks/flash.h"

#include "attention/blocks/flash_ops.h"
#include "numattn/core/cpu.h"

namespace numattn::blocks {

namespace {

/// The variant of the library's CPU path (core/cpu.h).
const flash::Ops& ops() {
  return *pick_isa_variant(flash::portable::ops(), flash::avx2::ops(), flash::avx512::ops());
}

}  // namespace

void flash_attention(const AttentionProblem& p, const FlashConfig& cfg, const ExecContext& ctx) {
  ops().forward(p, cfg, ctx);
}

std::size_t flash_workspace_bytes(const AttentionProblem& p, const FlashConfig& cfg, int threads) {
  return ops().workspace_bytes(p, cfg, threads);
}

void flash_attention_selected(const AttentionProblem& p, const SelectKeys& select, const FlashConfig& cfg,
                              const ExecContext& ctx) {
  ops().forward_selected(p, select, cfg, ctx);
}

}  // namespace numattn::blocks
