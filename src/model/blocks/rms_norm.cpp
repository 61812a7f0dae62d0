#include "numattn/model/blocks/rms_norm.h"

#include "model/blocks/linear.h"

namespace numattn {

void RmsNorm::apply(const float* x, float* y, std::int64_t n) const {
  blocks::rms_norm_rows(x, w_->data(), y, n, width(), eps_);
}

}  // namespace numattn
