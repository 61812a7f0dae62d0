/// @file timing.h
/// Wall-clock medians, the one way numattn times anything it compares (ratios in one run).
#pragma once

#include <functional>
#include <vector>

namespace numattn {

/// Median of `v` (mean of the two middle values for an even count); `v` must not be empty.
double median(std::vector<double> v);

/// Median wall time of `fn` over max(1, `reps`) runs, in seconds (no warm-up: the caller's).
double median_seconds(int reps, const std::function<void()>& fn);

}  // namespace numattn
