#include "numattn/core/rng.h"

#include <cmath>

namespace numattn {

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> c,
                                        std::array<std::uint32_t, 2> k) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c[0];
    std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c[2];
    std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

std::array<std::uint32_t, 4> CounterRng::bits(std::uint64_t i) const {
  return philox4x32({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
                     static_cast<std::uint32_t>(stream_), static_cast<std::uint32_t>(stream_ >> 32)},
                    {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)});
}

namespace {
double to_unit(std::uint32_t a, std::uint32_t b) {
  std::uint64_t x = (static_cast<std::uint64_t>(a) << 21) ^ (b >> 11);
  return static_cast<double>(x & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}
}  // namespace

double CounterRng::uniform(std::uint64_t i) const {
  auto r = bits(i);
  return to_unit(r[0], r[1]);
}

double CounterRng::normal(std::uint64_t i) const {
  auto r = bits(i);
  double u1 = 1.0 - to_unit(r[0], r[1]);  // (0, 1]
  double u2 = to_unit(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

template <class T>
static void fill_normal_impl(std::span<T> out, std::uint64_t seed, std::uint64_t stream) {
  CounterRng rng(seed, stream);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(rng.normal(i));
}

void fill_normal(std::span<float> out, std::uint64_t seed, std::uint64_t stream) {
  fill_normal_impl(out, seed, stream);
}
void fill_normal(std::span<double> out, std::uint64_t seed, std::uint64_t stream) {
  fill_normal_impl(out, seed, stream);
}
void fill_uniform(std::span<float> out, std::uint64_t seed, std::uint64_t stream, double lo,
                  double hi) {
  CounterRng rng(seed, stream);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(lo + (hi - lo) * rng.uniform(i));
}

}  // namespace numattn
