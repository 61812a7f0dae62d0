#include "numattn/attention/blocks/dense_softmax.h"

#include "attention/exact/flash.h"
#include "numattn/attention/registry.h"

namespace numattn::blocks {

void dense_softmax_attention(const AttentionProblem& sub, const ExecContext& ctx) {
  // One configured instance (its defaults); forward is const and may run concurrently.
  static const std::unique_ptr<AttentionMethod> flash = create_method("exact.flash");
  flash->forward(sub, ctx);
}

}  // namespace numattn::blocks
