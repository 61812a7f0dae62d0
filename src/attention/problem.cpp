#include "numattn/attention/problem.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "numattn/core/memory.h"
#include "numattn/quant/quant.h"

namespace numattn {

const char* to_string(Causal c) {
  switch (c) {
    case Causal::kNone: return "none";
    case Causal::kTopLeft: return "top-left";
    case Causal::kBottomRight: return "bottom-right";
  }
  return "?";
}

Causal parse_causal(const std::string& s) {
  if (s == "none") return Causal::kNone;
  if (s == "top-left" || s == "top_left") return Causal::kTopLeft;
  if (s == "bottom-right" || s == "bottom_right") return Causal::kBottomRight;
  throw Error(fmt::format("unknown causal mode '{}' (valid: none, top-left, bottom-right)", s));
}

Layout parse_layout(const std::string& s) {
  std::string l = s;
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "bhnd") return Layout::kBHND;
  if (l == "bnhd") return Layout::kBNHD;
  throw Error(fmt::format("unknown layout '{}' (valid: bhnd, [B,H,N,D]; bnhd, [B,N,H,D])", s));
}

const char* to_string(Layout l) { return l == Layout::kBNHD ? "bnhd" : "bhnd"; }

const char* to_string(KvType t) {
  switch (t) {
    case KvType::kF32: return "f32";
    case KvType::kF16: return "f16";
    case KvType::kBf16: return "bf16";
  }
  return "?";
}

KvType parse_kv_type(const std::string& s) {
  if (s == "f32") return KvType::kF32;
  if (s == "f16") return KvType::kF16;
  if (s == "bf16") return KvType::kBf16;
  throw Error(fmt::format("unknown KV element type '{}' (valid: f16, bf16, f32)", s));
}

void widen_row(const std::uint16_t* src, KvType type, index_t n, float* out) {
  index_t d = 0;
  if (type == KvType::kBf16) {
    // bfloat16 is float32's upper half.
    for (; d < n; ++d) {
      const std::uint32_t bits = static_cast<std::uint32_t>(src[d]) << 16;
      std::memcpy(out + d, &bits, sizeof bits);
    }
    return;
  }
#if defined(__F16C__)
  // F16C is in the x86-64-v3 baseline: eight exact conversions per instruction.
  for (; d + 8 <= n; d += 8)
    _mm256_storeu_ps(out + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d))));
#endif
  for (; d < n; ++d) out[d] = fp16_to_fp32(src[d]);
}

WidenedKv widen_kv(const AttentionProblem& p) {
  WidenedKv w;
  w.problem = p;
  if (!p.half_kv()) return w;
  const index_t B = p.batch(), H = p.kv_heads(), N = p.n_kv(), dk = p.d_qk(), dv = p.d_v();
  index_t lo = N, hi = 0;  // the keys some row sees
  for (index_t i = 0; i < p.n_q(); ++i) {
    const KeyRange r = p.key_range(i);
    if (!r.empty()) lo = std::min(lo, r.begin), hi = std::max(hi, r.end);
  }
  check_memory(static_cast<std::uint64_t>(B * H * N * (dk + dv)) * 4,
               fmt::format("a float32 copy of half-precision K/V ({})", p.describe()));
  w.k.assign(static_cast<std::size_t>(B * H * N * dk), 0.f);
  w.v.assign(static_cast<std::size_t>(B * H * N * dv), 0.f);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t j = lo; j < hi; ++j) {
        widen_row(p.k16_row(b, h, j), p.half.type, dk, w.k.data() + ((b * H + h) * N + j) * dk);
        widen_row(p.v16_row(b, h, j), p.half.type, dv, w.v.data() + ((b * H + h) * N + j) * dv);
      }
  w.problem.k = TensorView<const float>::contiguous(w.k.data(), {B, H, N, dk});
  w.problem.v = TensorView<const float>::contiguous(w.v.data(), {B, H, N, dv});
  w.problem.half = HalfKv{};
  return w;
}

void narrow_row(const float* src, KvType type, index_t n, std::uint16_t* out) {
  index_t d = 0;
  if (type == KvType::kBf16) {
    for (; d < n; ++d) out[d] = fp32_to_bf16(src[d]);
    return;
  }
#if defined(__F16C__)
  for (; d + 8 <= n; d += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + d),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; d < n; ++d) out[d] = fp32_to_fp16(src[d]);
}

WidenedIo widen_io(const AttentionProblem& p) {
  WidenedIo w;
  w.problem = p;
  const index_t B = p.batch(), H = p.heads(), N = p.n_q(), dk = p.d_qk(), dv = p.d_v();
  const std::uint64_t bytes = static_cast<std::uint64_t>(B * H * N) *
                              static_cast<std::uint64_t>((p.has_half_q() ? dk : 0) + (p.has_half_out() ? dv : 0)) * 4;
  if (bytes == 0) return w;
  check_memory(bytes, fmt::format("a float32 copy of half-precision Q / output ({})", p.describe()));
  if (p.has_half_q()) {
    w.q.resize(static_cast<std::size_t>(B * H * N * dk));
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < N; ++i)
          widen_row(p.q16_row(b, h, i), p.half_q.type, dk, w.q.data() + ((b * H + h) * N + i) * dk);
    w.problem.q = TensorView<const float>::contiguous(w.q.data(), {B, H, N, dk});
    w.problem.half_q = HalfQ{};
  }
  if (p.has_half_out()) {
    w.out.resize(static_cast<std::size_t>(B * H * N * dv));
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < N; ++i)
          widen_row(p.out16_row(b, h, i), p.half_out.type, dv, w.out.data() + ((b * H + h) * N + i) * dv);
    w.problem.out = TensorView<float>::contiguous(w.out.data(), {B, H, N, dv});
    w.problem.half_out = HalfOut{};
  }
  return w;
}

void WidenedIo::store_out(const AttentionProblem& p) const {
  if (!p.has_half_out()) return;
  for (index_t b = 0; b < p.batch(); ++b)
    for (index_t h = 0; h < p.heads(); ++h)
      for (index_t i = 0; i < p.n_q(); ++i)
        narrow_row(problem.out.row(b, h, i), p.half_out.type, p.d_v(), p.out16_row(b, h, i));
}

KeyRange AttentionProblem::key_range(index_t i) const {
  const index_t nk = n_kv();
  const index_t d = i + diag_offset();
  index_t lo = 0, hi = nk;
  if (causal != Causal::kNone) hi = std::min(hi, d + 1);
  if (window_left >= 0) lo = std::max(lo, d - window_left);
  if (window_right >= 0) hi = std::min(hi, d + window_right + 1);
  lo = std::clamp<index_t>(lo, 0, nk);
  hi = std::clamp<index_t>(hi, 0, nk);
  return {lo, std::max(lo, hi)};
}

bool AttentionProblem::visible(index_t b, index_t h, index_t i, index_t j) const {
  KeyRange r = key_range(i);
  if (j < r.begin || j >= r.end) return false;
  if (mask.kind == MaskKind::kBool) return mask_row(b, h, i).allowed[j] != 0;
  return true;
}

bool AttentionProblem::visible(index_t i, index_t j) const {
  NUMATTN_ASSERT(mask.shared());
  return visible(0, 0, i, j);
}

std::string AttentionProblem::describe() const {
  std::string s = fmt::format("B={} Hq={} Hkv={} Nq={} Nk={} Dk={} Dv={} causal={}", batch(), heads(),
                              kv_heads(), n_q(), n_kv(), d_qk(), d_v(), to_string(causal));
  if (mask.kind != MaskKind::kNone)
    s += fmt::format(" mask={}(ld={} stride_b={} stride_h={})", mask.kind == MaskKind::kBool ? "bool" : "additive",
                     mask.ld, mask.stride_b, mask.stride_h);
  if (half_kv()) s += fmt::format(" kv={}", to_string(half.type));
  if (has_half_q()) s += fmt::format(" q={}", to_string(half_q.type));
  if (has_half_out()) s += fmt::format(" out={}", to_string(half_out.type));
  return s;
}

double attention_flops(const AttentionProblem& p) {
  double pairs = 0;
  for (index_t i = 0; i < p.n_q(); ++i) {
    const KeyRange r = p.key_range(i);
    pairs += static_cast<double>(r.end - r.begin);
  }
  return 2.0 * pairs * static_cast<double>(p.d_qk() + p.d_v()) *
         static_cast<double>(p.batch() * p.heads());
}

namespace {
void check_rank4(const char* name, const TensorView<const float>& t, bool half = false) {
  NUMATTN_CHECK(t.data != nullptr || t.numel() == 0 || half, "attention: tensor '{}' has no data", name);
  for (int i = 0; i < 4; ++i)
    NUMATTN_CHECK(t.shape[i] >= 0, "attention: tensor '{}' has a negative dimension", name);
  NUMATTN_CHECK(t.stride[3] == 1,
                "attention: the last dimension of '{}' must be contiguous (stride 1), got {}", name,
                t.stride[3]);
}
}  // namespace

void validate(const AttentionProblem& p) {
  check_rank4("q", p.q, p.has_half_q());
  check_rank4("k", p.k, p.half_kv());
  check_rank4("v", p.v, p.half_kv());
  if (p.half_kv())
    NUMATTN_CHECK(p.half.k != nullptr && p.half.v != nullptr && p.k.data == nullptr && p.v.data == nullptr,
                  "attention: half-precision K/V ({}) need their data in `half` and none in `k` and `v`",
                  to_string(p.half.type));
  if (p.has_half_q())
    NUMATTN_CHECK(p.half_q.data != nullptr && p.q.data == nullptr,
                  "attention: half-precision Q ({}) needs its data in `half_q.data` and none in `q` ({})",
                  to_string(p.half_q.type), p.describe());
  check_rank4("out", p.out, p.has_half_out());
  if (p.has_half_out())
    NUMATTN_CHECK(p.half_out.data != nullptr && p.out.data == nullptr,
                  "attention: half-precision output ({}) needs its buffer in `half_out.data` and none in "
                  "`out` ({})",
                  to_string(p.half_out.type), p.describe());
  const index_t B = p.batch(), Hq = p.heads(), Hkv = p.kv_heads();
  NUMATTN_CHECK(B >= 1 && Hq >= 1 && Hkv >= 1, "attention: batch and head counts must be >= 1 ({})",
                p.describe());
  NUMATTN_CHECK(p.n_q() >= 1 && p.n_kv() >= 1, "attention: Nq and Nk must be >= 1 ({})",
                p.describe());
  NUMATTN_CHECK(p.d_qk() >= 1 && p.d_v() >= 1, "attention: Dk and Dv must be >= 1 ({})",
                p.describe());
  NUMATTN_CHECK(p.k.shape[0] == B && p.v.shape[0] == B,
                "attention: q, k, v must have the same batch ({})", p.describe());
  NUMATTN_CHECK(Hq % Hkv == 0,
                "attention: query heads ({}) must be a multiple of kv heads ({}) for GQA/MQA", Hq,
                Hkv);
  NUMATTN_CHECK(p.v.shape[1] == Hkv, "attention: k has {} heads but v has {}", Hkv, p.v.shape[1]);
  NUMATTN_CHECK(p.v.shape[2] == p.n_kv(), "attention: k has {} keys but v has {}", p.n_kv(),
                p.v.shape[2]);
  NUMATTN_CHECK(p.k.shape[3] == p.d_qk(), "attention: q has Dk={} but k has Dk={}", p.d_qk(),
                p.k.shape[3]);
  NUMATTN_CHECK(p.out.shape == (std::array<index_t, 4>{B, Hq, p.n_q(), p.d_v()}),
                "attention: out must be [B, Hq, Nq, Dv] = [{}, {}, {}, {}]", B, Hq, p.n_q(),
                p.d_v());
  if (!p.lse.empty()) {
    NUMATTN_CHECK(p.lse.shape[0] == B && p.lse.shape[1] == Hq && p.lse.shape[2] == p.n_q(),
                  "attention: lse must be [B, Hq, Nq, 1]");
  }
  if (p.mask.kind != MaskKind::kNone) {
    const char* kind = p.mask.kind == MaskKind::kBool ? "bool" : "additive";
    NUMATTN_CHECK(p.mask.kind == MaskKind::kBool ? p.mask.allowed != nullptr : p.mask.additive != nullptr,
                  "attention: {} mask has no data ({})", kind, p.describe());
    NUMATTN_CHECK(p.mask.stride_b >= 0 && p.mask.stride_h >= 0 && p.mask.ld >= 0,
                  "attention: {} mask strides must be >= 0 (0 = broadcast), got ld={} stride_b={} stride_h={}",
                  kind, p.mask.ld, p.mask.stride_b, p.mask.stride_h);
    // Read only, so heads and batches may share entries (any strides >= 0); a row is Nk
    // entries, so rows of one (b, h) are either one row for every query (ld = 0, as an
    // expanded [.., 1, Nk] tensor) or disjoint.
    NUMATTN_CHECK(p.mask.ld == 0 || p.mask.ld >= p.n_kv(),
                  "attention: {} mask row stride ld={} is shorter than Nk={}: rows of [Nq, Nk] would overlap; "
                  "use ld >= Nk, or 0 for one row shared by every query ({})",
                  kind, p.mask.ld, p.n_kv(), p.describe());
  }
  // Any other negative value would silently mean "unbounded" to the kernels (they test >= 0).
  NUMATTN_CHECK(p.window_left >= -1 && p.window_right >= -1,
                "attention: window_left = {} and window_right = {}: each must be >= 0 (keys on "
                "that side of the diagonal) or -1 (unbounded)",
                p.window_left, p.window_right);
  NUMATTN_CHECK(!p.scale || (std::isfinite(*p.scale) &&
                              std::abs(*p.scale) <= std::numeric_limits<float>::max()),
                "attention: scale {} must be finite and at most {:.4g} in magnitude (float32)",
                p.scale ? *p.scale : 0.0, std::numeric_limits<float>::max());
}

namespace {
std::string index_text(const std::vector<index_t>& idx) {
  std::string s = "[";
  for (std::size_t t = 0; t < idx.size(); ++t) {
    if (t) s += ',';
    s += std::to_string(idx[t]);
  }
  return s + ']';
}
}  // namespace

NonFiniteInput::NonFiniteInput(std::string tensor, std::vector<index_t> index, float value)
    : Error(tensor == "mask"
                ? fmt::format("attention: additive mask{} is {}: +inf is refused (finite values add "
                              "to the logit, -inf and NaN hide the key)",
                              index_text(index), value)
                : fmt::format("attention: {}{} is {}: q, k and v must be finite wherever a query "
                              "reads them",
                              tensor, index_text(index), value)),
      tensor_(std::move(tensor)),
      index_(std::move(index)) {}

void check_finite_row(const char* tensor, const float* x, index_t n, std::vector<index_t> row_index) {
  for (index_t d = 0; d < n; ++d) {
    if (std::isfinite(x[d])) continue;
    row_index.push_back(d);
    throw NonFiniteInput(tensor, std::move(row_index), x[d]);
  }
}

}  // namespace numattn
