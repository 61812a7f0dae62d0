// The model headers must not pull Eigen into their users (~20 translation units did, through
// llama.h -> transform/bd_projection.h): the runtime BdProjection is float-only and the
// Eigen-based builder has its own header. This file includes the model-facing headers first
// and fails to compile if any of them brings Eigen along.
#include "numattn/model/llama.h"
#include "numattn/model/ppl.h"
#include "numattn/transform/bd_projection.h"

#ifdef EIGEN_WORLD_VERSION
#error "a model header includes Eigen: keep it behind transform/bd_projection_builder.h"
#endif

#include <gtest/gtest.h>

namespace numattn {
namespace {

TEST(ModelHeaders, RuntimeBdProjectionNeedsNoEigen) {
  // The runtime type is usable from here without the builder: a dense projection runs.
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};  // d_in 2, 1 head of dim 3
  const auto p = transform::BdProjection::dense(2, 1, 3, w);
  const float x[2] = {1, -1};
  float y[3] = {};
  p.project(x, 1, 2, y, 3, transform::InputOrder::kOriginal, ExecContext{1});
  EXPECT_FLOAT_EQ(y[0], -3);
  EXPECT_FLOAT_EQ(y[1], -3);
  EXPECT_FLOAT_EQ(y[2], -3);
}

}  // namespace
}  // namespace numattn
