#include "numattn/attention/blocks/performer_features.h"

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "numattn/decomp/random_features.h"

namespace numattn::blocks {

std::vector<double> performer_directions(index_t m, index_t d, std::uint64_t seed,
                                         std::uint64_t stream, bool orthogonal) {
  using Key = std::tuple<index_t, index_t, std::uint64_t, std::uint64_t, bool>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const std::vector<double>>> cache;
  const Key key{m, d, seed, stream, orthogonal};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return *it->second;
  }
  auto w = std::make_shared<const std::vector<double>>(
      orthogonal ? decomp::orthogonal_features(m, d, seed, stream) : decomp::gaussian_features(m, d, seed, stream));
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= 32) cache.clear();  // bounded: at most 32 draws of ≤ 1024·Dk doubles
  cache.emplace(key, w);
  return *w;
}

}  // namespace numattn::blocks
