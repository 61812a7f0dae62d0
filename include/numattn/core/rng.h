/// @file rng.h
/// Seeded counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
///
/// A number is a pure function of (seed, stream, counter), so a tensor filled in parallel gets
/// the same values for any thread count: element `i` of stream `s` is always the same.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace numattn {

/// Philox4x32-10 block: four 32-bit words from a 128-bit counter and a 64-bit key.
std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key);

/// Stateless generator for one (seed, stream).
class CounterRng {
 public:
  CounterRng(std::uint64_t seed, std::uint64_t stream) : seed_(seed), stream_(stream) {}
  /// Four uniform 32-bit words for counter `i`.
  std::array<std::uint32_t, 4> bits(std::uint64_t i) const;
  /// Uniform in [0, 1) (53-bit resolution) for index `i`.
  double uniform(std::uint64_t i) const;
  /// Standard normal for index `i` (Box–Muller on one Philox block).
  double normal(std::uint64_t i) const;

 private:
  std::uint64_t seed_, stream_;
};

/// Fills `out` with N(0, 1) (or U[-1, 1) if `uniform`) values of stream `stream`;
/// `out[i]` depends only on (seed, stream, i).
void fill_normal(std::span<float> out, std::uint64_t seed, std::uint64_t stream);
void fill_normal(std::span<double> out, std::uint64_t seed, std::uint64_t stream);
void fill_uniform(std::span<float> out, std::uint64_t seed, std::uint64_t stream, double lo,
                  double hi);

}  // namespace numattn
