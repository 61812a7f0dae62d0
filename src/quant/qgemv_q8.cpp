// 8-bit activations of the quantized products (quant/qgemv.h): ActivationsQ8, the rounding
// of x that the integer kernels multiply, and the names of the `--activations` choices.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "numattn/core/error.h"
#include "numattn/quant/qgemv.h"

namespace numattn {

const char* activations_name(Activations a) { return a == Activations::kQ8 ? "q8" : "f32"; }

Activations parse_activations(const std::string& name) {
  if (name == "f32") return Activations::kF32;
  if (name == "q8") return Activations::kQ8;
  throw Error(fmt::format("unknown activation precision '{}': use f32 (float32 activations) or "
                          "q8 (rounded to int8 per block of 32)",
                          name));
}

void ActivationsQ8::quantize(const float* x, std::int64_t n_vec, std::int64_t ldx, std::int64_t n_cols) {
  NUMATTN_CHECK(n_vec >= 0 && n_cols >= 0 && ldx >= n_cols,
                "ActivationsQ8: {} vectors of {} values with leading dimension {}", n_vec, n_cols, ldx);
  n = n_vec;
  cols = n_cols;
  blocks = (cols + kBlock - 1) / kBlock;
  q.assign(static_cast<std::size_t>(n * blocks * kBlock), 0);
  d.resize(static_cast<std::size_t>(n * blocks));
  s.resize(d.size());
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * ldx + b * kBlock;
      const std::int64_t m = std::min(kBlock, cols - b * kBlock);
      std::int8_t* qb = q.data() + (r * blocks + b) * kBlock;
      const std::size_t i = static_cast<std::size_t>(r * blocks + b);
      float amax = 0;
      bool finite = true;
      for (std::int64_t j = 0; j < m; ++j) {
        finite = finite && std::isfinite(xb[j]);
        amax = std::max(amax, std::abs(xb[j]));
      }
      if (!finite) {  // q stays 0: the NaN scale carries the block's poison into every product
        d[i] = s[i] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float db = amax / 127.f;
      int sum = 0;
      if (amax > 0) {
        for (std::int64_t j = 0; j < m; ++j) {
          // A subnormal db may carry fewer bits than amax, so |x/db| can pass 127 slightly.
          const float v = std::clamp(std::nearbyint(xb[j] / db), -127.f, 127.f);
          qb[j] = static_cast<std::int8_t>(v);
          sum += qb[j];
        }
      }
      d[i] = db;
      s[i] = db * static_cast<float>(sum);
    }
}

void ActivationsQ8::dequantize(float* out, std::int64_t ldo) const {
  NUMATTN_CHECK(ldo >= cols, "ActivationsQ8::dequantize: leading dimension {} < {} values", ldo, cols);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::size_t b = static_cast<std::size_t>(r * blocks + j / kBlock);
      out[r * ldo + j] = d[b] * static_cast<float>(q[static_cast<std::size_t>(r * blocks * kBlock + j)]);
    }
}

void round_activations_q8(float* x, std::int64_t n, std::int64_t cols) {
  thread_local ActivationsQ8 a;
  a.quantize(x, n, cols, cols);
  a.dequantize(x, cols);
}

}  // namespace numattn
