#include "numattn/decomp/sketch.h"

#include <fftw3.h>

#include <cmath>
#include <complex>
#include <mutex>

#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/rng.h"

namespace numattn::decomp {

namespace {

constexpr std::uint64_t kP = (1ull << 61) - 1;  // Mersenne prime 2^61 − 1

std::uint64_t mulmod(std::uint64_t a, std::uint64_t b) {
  const unsigned __int128 z = static_cast<unsigned __int128>(a) * b;
  std::uint64_t r = static_cast<std::uint64_t>(z & kP) + static_cast<std::uint64_t>(z >> 61);
  r = (r & kP) + (r >> 61);
  return r >= kP ? r - kP : r;
}

std::uint64_t addmod(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t r = a + b;
  return r >= kP ? r - kP : r;
}

/// Uniform coefficient in [0, P) from counter `i`.
std::uint64_t coefficient(const CounterRng& rng, std::uint64_t i) {
  const auto b = rng.bits(i);
  return ((static_cast<std::uint64_t>(b[0]) << 32) | b[1]) % kP;
}

std::mutex& fftw_planner_mutex() {  // FFTW's planner is not thread-safe; execution is
  static std::mutex m;
  return m;
}

}  // namespace

CountSketch::CountSketch(index_t d, index_t r, std::uint64_t seed, std::uint64_t stream) : d_(d), r_(r) {
  NUMATTN_CHECK(d >= 1 && r >= 1, "CountSketch: d and r must be ≥ 1, got {} and {}", d, r);
  const CounterRng rng(seed, stream);
  // h(j) = ((a·j + b) mod P) mod r (2-wise independent), s(j) from the parity of a degree-3
  // polynomial mod P (4-wise independent).
  std::uint64_t a = coefficient(rng, 0);
  if (a == 0) a = 1;
  const std::uint64_t b = coefficient(rng, 1);
  const std::uint64_t c[4] = {coefficient(rng, 2), coefficient(rng, 3), coefficient(rng, 4), coefficient(rng, 5)};
  h_.resize(static_cast<std::size_t>(d));
  s_.resize(static_cast<std::size_t>(d));
  for (index_t j = 0; j < d; ++j) {
    const auto x = static_cast<std::uint64_t>(j);
    h_[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(addmod(mulmod(a, x), b) % static_cast<std::uint64_t>(r));
    std::uint64_t poly = c[3];
    for (int k = 2; k >= 0; --k) poly = addmod(mulmod(poly, x), c[k]);
    s_[static_cast<std::size_t>(j)] = (poly & 1) ? -1.0 : 1.0;
  }
}

void CountSketch::apply(const double* x, double* out) const {
  std::fill(out, out + r_, 0.0);
  for (index_t j = 0; j < d_; ++j) out[h_[static_cast<std::size_t>(j)]] += s_[static_cast<std::size_t>(j)] * x[j];
}

struct TensorSketch::Plans {
  fftw_plan r2c = nullptr, c2r = nullptr;
};

TensorSketch::TensorSketch(index_t d, index_t r, int degree, std::uint64_t seed, std::uint64_t stream)
    : d_(d), r_(r), p_(degree), plans_(std::make_unique<Plans>()) {
  NUMATTN_CHECK(degree >= 1, "TensorSketch: degree must be ≥ 1, got {}", degree);
  for (int t = 0; t < degree; ++t)
    cs_.emplace_back(d, r, seed, stream * 64 + static_cast<std::uint64_t>(t));
  std::vector<double> re(static_cast<std::size_t>(r));
  std::vector<std::complex<double>> co(static_cast<std::size_t>(r / 2 + 1));
  std::lock_guard<std::mutex> lock(fftw_planner_mutex());
  // FFTW_UNALIGNED: executed later on other (caller) buffers through the new-array interface.
  plans_->r2c = fftw_plan_dft_r2c_1d(static_cast<int>(r), re.data(), reinterpret_cast<fftw_complex*>(co.data()),
                                     FFTW_ESTIMATE | FFTW_UNALIGNED);
  plans_->c2r = fftw_plan_dft_c2r_1d(static_cast<int>(r), reinterpret_cast<fftw_complex*>(co.data()), re.data(),
                                     FFTW_ESTIMATE | FFTW_UNALIGNED);
  NUMATTN_ASSERT(plans_->r2c && plans_->c2r);
}

TensorSketch::~TensorSketch() {
  std::lock_guard<std::mutex> lock(fftw_planner_mutex());
  fftw_destroy_plan(plans_->r2c);
  fftw_destroy_plan(plans_->c2r);
}

namespace {
/// Scratch of one TensorSketch evaluation (kept across the rows of apply_rows).
struct TsScratch {
  std::vector<double> buf;
  std::vector<std::complex<double>> acc, spec;
};
}  // namespace

static void tensor_sketch_apply(const std::vector<CountSketch>& cs, fftw_plan r2c, fftw_plan c2r, index_t r,
                                const double* x, double* out, TsScratch& s) {
  const std::size_t nc = static_cast<std::size_t>(r / 2 + 1);
  s.buf.resize(static_cast<std::size_t>(r));
  s.acc.resize(nc);
  s.spec.resize(nc);
  for (std::size_t t = 0; t < cs.size(); ++t) {
    cs[t].apply(x, s.buf.data());
    fftw_execute_dft_r2c(r2c, s.buf.data(), reinterpret_cast<fftw_complex*>(t == 0 ? s.acc.data() : s.spec.data()));
    if (t > 0)
      for (std::size_t k = 0; k < nc; ++k) s.acc[k] *= s.spec[k];
  }
  // c2r overwrites its input; FFTW's inverse is unnormalised (a factor r).
  fftw_execute_dft_c2r(c2r, reinterpret_cast<fftw_complex*>(s.acc.data()), out);
  const double inv = 1.0 / static_cast<double>(r);
  for (index_t b = 0; b < r; ++b) out[b] *= inv;
}

void TensorSketch::apply(const double* x, double* out) const {
  TsScratch s;
  tensor_sketch_apply(cs_, plans_->r2c, plans_->c2r, r_, x, out, s);
}

void TensorSketch::apply_rows(const float* x, index_t ldx, index_t rows, double scale, float* out, index_t ldo) const {
  std::vector<double> xin(static_cast<std::size_t>(d_)), phi(static_cast<std::size_t>(r_));
  TsScratch s;
  for (index_t i = 0; i < rows; ++i) {
    const float* xr = x + i * ldx;
    for (index_t k = 0; k < d_; ++k) xin[static_cast<std::size_t>(k)] = scale * xr[k];
    tensor_sketch_apply(cs_, plans_->r2c, plans_->c2r, r_, xin.data(), phi.data(), s);
    float* o = out + i * ldo;
    for (index_t b = 0; b < r_; ++b) o[b] = static_cast<float>(phi[static_cast<std::size_t>(b)]);
  }
}

GaussianSketch2::GaussianSketch2(index_t d, index_t r, std::uint64_t seed, std::uint64_t stream) : d_(d), r_(r) {
  NUMATTN_CHECK(d >= 1 && r >= 1, "GaussianSketch2: d and r must be ≥ 1, got {} and {}", d, r);
  const std::size_t n = static_cast<std::size_t>(d * r);
  g1_.resize(n);
  g2_.resize(n);
  const CounterRng rng(seed, stream);
  for (std::size_t i = 0; i < n; ++i) {
    g1_[i] = rng.normal(i);
    g2_[i] = rng.normal(n + i);
  }
  g1f_.assign(g1_.begin(), g1_.end());
  g2f_.assign(g2_.begin(), g2_.end());
}

void GaussianSketch2::apply(const double* x, double* out) const {
  const double c = 1.0 / std::sqrt(static_cast<double>(r_));
  for (index_t b = 0; b < r_; ++b) {
    double u = 0, w = 0;
    for (index_t k = 0; k < d_; ++k) {
      u += x[k] * g1_[static_cast<std::size_t>(k * r_ + b)];
      w += x[k] * g2_[static_cast<std::size_t>(k * r_ + b)];
    }
    out[b] = c * u * w;
  }
}

void GaussianSketch2::apply_rows(const float* x, index_t ldx, index_t rows, float scale, float* out, index_t ldo,
                                 std::vector<float>& scratch) const {
  scratch.resize(static_cast<std::size_t>(2 * rows * r_));
  float* u = scratch.data();
  float* w = u + rows * r_;
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, r_, d_, scale, x, ldx, g1f_.data(), r_, 0.f, u, r_);
  blas::sgemm(blas::Trans::kNo, blas::Trans::kNo, rows, r_, d_, scale, x, ldx, g2f_.data(), r_, 0.f, w, r_);
  const float c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(r_)));
  for (index_t i = 0; i < rows; ++i)
    for (index_t b = 0; b < r_; ++b) out[i * ldo + b] = c * u[i * r_ + b] * w[i * r_ + b];
}

}  // namespace numattn::decomp
