/// @file rms_norm.h
/// RMSNorm (Zhang, Sennrich, "Root Mean Square Layer Normalization", 2019) of token rows:
/// y = x / sqrt(mean(x²) + eps) ⊙ w, the mean of squares summed in float64. The width is that of
/// w: the model width for the pre-attention and pre-FFN norms, a head dim for a per-head norm.
/// Cost: 3 FLOPs per element; no weights multiply a token (w is not counted as a linear layer).
#pragma once

#include <vector>

#include "numattn/model/blocks/block.h"

namespace numattn {

class RmsNorm final : public NormBlock {
 public:
  /// `w` must outlive the block (the model's weights).
  RmsNorm(const std::vector<float>* w, double eps) : w_(w), eps_(eps) {}
  void apply(const float* x, float* y, std::int64_t n) const override;
  std::int64_t width() const override { return static_cast<std::int64_t>(w_->size()); }
  std::string kind() const override { return "rms"; }

 private:
  const std::vector<float>* w_;
  double eps_;
};

}  // namespace numattn
