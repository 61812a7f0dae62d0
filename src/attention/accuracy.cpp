#include "numattn/attention/accuracy.h"

namespace numattn {

ExactTolerance exact_f32_tolerance(double L) {
  return {64.0 * kEpsF32 * (1.0 + L), 1e-5 * (1.0 + L / 10.0), 64.0 * kEpsF32 * (1.0 + L)};
}

AccuracyContract AccuracyContract::exact(std::vector<ParamOverrides> samples) {
  AccuracyContract c;
  c.max_rel_fro_error = [](const BudgetInput& in) {
    return exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
  };
  c.samples = std::move(samples);
  return c;
}

}  // namespace numattn
