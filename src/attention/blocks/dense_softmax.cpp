#include "numattn/attention/blocks/dense_softmax.h"

#include "numattn/attention/blocks/flash.h"

namespace numattn::blocks {

void dense_softmax_attention(const AttentionProblem& sub, const ExecContext& ctx) {
  flash_attention(sub, FlashConfig{}, ctx);
}

std::size_t dense_softmax_workspace_bytes(const AttentionProblem& sub, int threads) {
  return flash_workspace_bytes(sub, FlashConfig{}, threads);
}

}  // namespace numattn::blocks
