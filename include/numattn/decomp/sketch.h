/// @file sketch.h
/// Oblivious sketches of vectors and of their tensor powers.
///
/// - `CountSketch` (Charikar, Chen, Farach-Colton 2002): (Cx)_b = Σ_{h(j)=b} s(j) x_j with a
///   2-wise independent hash h: [d] → [r] and a 4-wise independent sign s (polynomials of degree
///   1 and 3 over the Mersenne prime 2^61 − 1). E⟨Cx, Cy⟩ = ⟨x, y⟩, Var ≤ 2‖x‖²‖y‖²/r.
/// - `TensorSketch` (Pham and Pagh, KDD 2013): the CountSketch of x^{⊗p} under the hash Σ h_t mod r
///   and sign Π s_t, computed as the circular convolution IFFT(Π_t FFT(C_t x)) of p independent
///   CountSketches, by real FFTs (FFTW3): O(p(d + r log r)) per vector. E⟨φ(x), φ(y)⟩ = ⟨x, y⟩^p,
///   Var ≤ (3^p − 1)‖x‖^{2p}‖y‖^{2p}/r. FFTW plans are made once per object (under a global lock,
///   planning is not thread-safe) and executed thread-safely on caller buffers.
/// - `GaussianSketch2` (PolySketchFormer's degree-2 sketch): φ₂(x) = r^{-1/2} (xG₁) ⊙ (xG₂),
///   G_i ∈ R^{d×r} i.i.d. N(0, 1), so E⟨φ₂(x), φ₂(y)⟩ = ⟨x, y⟩². (Writing G_i/√r *and* a
///   1/√r factor biases the expectation by a power of 1/r. One r^{-1/2} is the unbiased choice.)
///   Rows are sketched by two float32 GEMMs.
///
/// All draws come from the counter RNG keyed by (seed, stream): no dependence on thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "numattn/core/tensor.h"

namespace numattn::decomp {

class CountSketch {
 public:
  CountSketch(index_t d, index_t r, std::uint64_t seed, std::uint64_t stream);
  index_t in_dim() const { return d_; }
  index_t out_dim() const { return r_; }
  index_t hash(index_t j) const { return h_[static_cast<std::size_t>(j)]; }
  double sign(index_t j) const { return s_[static_cast<std::size_t>(j)]; }
  /// out[0..r) = C x.
  void apply(const double* x, double* out) const;

 private:
  index_t d_, r_;
  std::vector<std::int32_t> h_;
  std::vector<double> s_;
};

class TensorSketch {
 public:
  /// p = `degree` ≥ 1 independent CountSketches d → r (streams derived from `stream`).
  TensorSketch(index_t d, index_t r, int degree, std::uint64_t seed, std::uint64_t stream);
  ~TensorSketch();
  TensorSketch(const TensorSketch&) = delete;
  TensorSketch& operator=(const TensorSketch&) = delete;
  index_t in_dim() const { return d_; }
  index_t out_dim() const { return r_; }
  int degree() const { return p_; }
  const CountSketch& count_sketch(int t) const { return cs_[static_cast<std::size_t>(t)]; }
  /// out[0..r) = φ(x) (float64).
  void apply(const double* x, double* out) const;
  /// φ(scale·x) of `rows` float rows (stride ldx) into `out` (stride ldo), float32 results.
  void apply_rows(const float* x, index_t ldx, index_t rows, double scale, float* out, index_t ldo) const;

 private:
  struct Plans;
  index_t d_, r_;
  int p_;
  std::vector<CountSketch> cs_;
  std::unique_ptr<Plans> plans_;
};

class GaussianSketch2 {
 public:
  GaussianSketch2(index_t d, index_t r, std::uint64_t seed, std::uint64_t stream);
  index_t in_dim() const { return d_; }
  index_t out_dim() const { return r_; }
  /// G₁ and G₂, d × r row-major, N(0, 1) (float64, the float32 copies are rounded from them).
  const std::vector<double>& g(int i) const { return i == 0 ? g1_ : g2_; }
  /// out[0..r) = φ₂(x) in float64.
  void apply(const double* x, double* out) const;
  /// φ₂(scale·x) of `rows` float rows (stride ldx) into `out` (stride ldo); `scratch` grows to
  /// 2·rows·r floats. Two GEMMs and a product.
  void apply_rows(const float* x, index_t ldx, index_t rows, float scale, float* out, index_t ldo,
                  std::vector<float>& scratch) const;

 private:
  index_t d_, r_;
  std::vector<double> g1_, g2_;
  std::vector<float> g1f_, g2f_;
};

}  // namespace numattn::decomp
