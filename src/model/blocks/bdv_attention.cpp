#include "numattn/model/blocks/bdv_attention.h"

#include "numattn/model/llama.h"

namespace numattn {

BdvAttention::BdvAttention(const LlamaLayer& layer, const ModelHParams& hp) : GqaAttention(layer, hp) {}

std::int64_t BdvAttention::extra_weights() const { return L_->v_bd->weight_params(); }

void BdvAttention::project_values(const ForwardStep&, const float* xn, std::int64_t t0, std::int64_t t1, float* rows,
                                  std::int64_t ld) const {
  // V' through the fused BD projection, into the value slots of the Q|K rows.
  L_->v_bd->project(xn + t0 * E_, t1 - t0, E_, rows + (Hq_ + Hkv_) * D_, ld, transform::InputOrder::kOriginal,
                    ExecContext{1});
}

}  // namespace numattn
