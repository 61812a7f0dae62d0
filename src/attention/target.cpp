#include "numattn/attention/target.h"

#include <fmt/format.h>

namespace numattn {

Target Target::gaussian() {
  Target t;
  t.kind = TargetKind::kGaussian;
  return t;
}

Target Target::polynomial(int degree, double denominator_shift) {
  Target t;
  t.kind = TargetKind::kPolynomial;
  t.degree = degree;
  t.denominator_shift = denominator_shift;
  return t;
}

Target Target::feature(std::string name, FeatureMapFn phi, std::function<index_t(index_t)> dim,
                       double denominator_shift, bool normalised) {
  Target t;
  t.kind = TargetKind::kFeatureMap;
  t.feature_name = std::move(name);
  t.feature_map = std::move(phi);
  t.feature_dim = std::move(dim);
  t.denominator_shift = denominator_shift;
  t.normalised = normalised;
  return t;
}

Target Target::simplicial(index_t w1, index_t w2) {
  Target t;
  t.kind = TargetKind::kSimplicial;
  t.window1 = w1;
  t.window2 = w2;
  return t;
}

std::string Target::name() const {
  std::string n;
  switch (kind) {
    case TargetKind::kSoftmax: n = "softmax"; break;
    case TargetKind::kGaussian: n = "gaussian"; break;
    case TargetKind::kPolynomial: n = fmt::format("polynomial(p={},c={:g})", degree, denominator_shift); break;
    case TargetKind::kFeatureMap:
      n = fmt::format("feature-map({}{})", feature_name,
                      denominator_shift != 0 ? fmt::format(",c={:g}", denominator_shift) : "");
      break;
    case TargetKind::kSimplicial: n = fmt::format("2-simplicial(w1={},w2={})", window1, window2); break;
  }
  return normalised ? n : n + ",unnormalised";
}

}  // namespace numattn
