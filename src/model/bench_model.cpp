#include "numattn/model/bench_model.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/memory.h"
#include "numattn/core/timing.h"

namespace numattn {

std::uint64_t peak_resident_bytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<std::uint64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

std::uint64_t last_level_cache_bytes() {
  std::uint64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string s;
    if (!(f >> s) || s.empty()) continue;
    std::uint64_t mult = 1;
    if (s.back() == 'K') mult = 1024;
    if (s.back() == 'M') mult = 1024 * 1024;
    if (mult != 1) s.pop_back();
    try {
      best = std::max<std::uint64_t>(best, std::stoull(s) * mult);
    } catch (...) {
    }
  }
  return best;
}

double measure_read_bandwidth(std::uint64_t bytes, int reps, const ExecContext& ctx) {
  NUMATTN_CHECK(bytes >= (1u << 20), "read bandwidth buffer of {} bytes: use at least 1 MiB", bytes);
  NUMATTN_CHECK(reps >= 1, "read bandwidth: reps must be at least 1, got {}", reps);
  check_memory(bytes, "the read-bandwidth buffer");
  const std::int64_t n = static_cast<std::int64_t>(bytes / 4);
  const int nt = ctx.num_threads();
  std::vector<float> buf(static_cast<std::size_t>(n));
  // Each thread writes its own slice, so the pages lie near it (first touch).
  parallel_for(ctx, nt, [&](std::int64_t p) {
    for (std::int64_t i = n * p / nt; i < n * (p + 1) / nt; ++i) buf[static_cast<std::size_t>(i)] = 1.f;
  });
  std::vector<double> secs;
  std::vector<float> sink(static_cast<std::size_t>(nt));
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(ctx, nt, [&](std::int64_t p) {
      const float* a = buf.data();
      float s[16] = {};
      std::int64_t i = n * p / nt;
      const std::int64_t e = n * (p + 1) / nt;
      for (; i + 16 <= e; i += 16)
        for (int k = 0; k < 16; ++k) s[k] += a[i + k];
      for (; i < e; ++i) s[0] += a[i];
      float t = 0;
      for (float v : s) t += v;
      sink[static_cast<std::size_t>(p)] = t;  // keeps the loop from being removed
    });
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  float total = 0;
  for (float v : sink) total += v;
  NUMATTN_ASSERT(total > 0);
  return static_cast<double>(bytes) / median(std::move(secs));
}

}  // namespace numattn
