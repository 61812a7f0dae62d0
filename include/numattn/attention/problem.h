/// @file problem.h
/// The attention problem every method solves.
///
/// Shapes (strided views, so BHND and BNHD buffers both work without copies):
/// - q   `[B, Hq,  Nq, Dk]`
/// - k   `[B, Hkv, Nk, Dk]`
/// - v   `[B, Hkv, Nk, Dv]`
/// - out `[B, Hq,  Nq, Dv]`, lse (optional) `[B, Hq, Nq, 1]`
///
/// GQA/MQA: `Hq % Hkv == 0`; query head `h` reads kv head `h / (Hq / Hkv)`.
///
/// Semantics (one definition, shared by every method and the float64 reference):
/// - logits `s_ij = scale · q_i·k_j (+ additive_mask_ij)`; scale defaults to `1/sqrt(Dk)`.
/// - key `j` is visible from query `i` iff all of: the causal rule, the sliding window and the
///   boolean mask allow it, and the additive mask is not `-inf`.
/// - causal, with diagonal offset `off = 0` (`kTopLeft`) or `off = Nk - Nq` (`kBottomRight`,
///   what a KV-cache decode needs): `j <= i + off`. The two agree when `Nq == Nk`.
/// - sliding window (`window_left`, `window_right`, -1 = unbounded), about the same diagonal
///   (offset 0 when causal is `kNone`): `i + off - window_left <= j <= i + off + window_right`.
/// - `out_i = Σ_j softmax(s_i)_j v_j`; `lse_i = log Σ_j exp(s_ij)` (natural log).
/// - a row with no visible key gives `out_i = 0` and `lse_i = -inf`, never NaN.
///
/// Edges (docs/numerics.md, "Non-finite inputs and overflow"), the same for every method and the
/// float64 reference, enforced once by `AttentionMethod::run`:
/// - what a query reads must be finite: its q row (when it sees a key) and the k and v rows of
///   every key it sees. A NaN or ±inf there raises `NonFiniteInput` naming the tensor and the
///   first such index. Keys no query sees are never read (unused KV-cache slots may hold
///   anything).
/// - additive mask entries: finite values add to the logit; `-inf` and NaN hide the key; `+inf`
///   (infinite weight for one key, NaN between two) raises `NonFiniteInput` naming mask [i, j].
/// - `scale` must be finite with |scale| ≤ FLT_MAX (float32 kernels hold it as a float).
/// - finite inputs whose logits or partial sums leave the float32 range (|x| > FLT_MAX, e.g. a
///   huge scale, |q|·|k| near 1e38 or values near FLT_MAX summed) still give the right answer:
///   exact methods compute those rows in float64; approximate methods refuse them with an
///   `Error` giving the bounds. The output is a convex combination of v rows, so it is always
///   representable; an LSE beyond ±FLT_MAX is not, and requesting it raises an `Error` with the
///   row and its value.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/core/tensor.h"

namespace numattn {

/// Alignment of the causal mask when Nq != Nk.
enum class Causal { kNone, kTopLeft, kBottomRight };

/// "none", "top-left", "bottom-right".
const char* to_string(Causal c);
/// Parses the names above (also accepts "top_left", "bottom_right"); throws on anything else.
Causal parse_causal(const std::string& s);

/// Memory order of a Q/K/V tensor handed over by a caller: [B, H, N, D] (`bhnd`) or
/// [B, N, H, D] (`bnhd`, as Hugging Face and FlashAttention store activations).
enum class Layout { kBHND, kBNHD };
/// "bhnd" / "bnhd" (any case); throws Error naming the valid values.
Layout parse_layout(const std::string& s);
const char* to_string(Layout l);

enum class MaskKind { kNone, kBool, kAdditive };

/// Optional boolean or additive mask, `[Nq, Nk]` per (batch, query head).
///
/// Entry (b, h, i, j) — batch b, *query* head h, query i, key j — is at element
/// `b·stride_b + h·stride_h + i·ld + j` of `allowed` (kBool) or `additive` (kAdditive). A stride
/// of 0 broadcasts over that axis, so the defaults describe one `[Nq, Nk]` mask shared by all
/// batches and heads; a padding mask `[B, 1, Nq, Nk]` has `stride_h = 0`, a per-head bias
/// (ALiBi) `[1, Hq, Nq, Nk]` has `stride_b = 0`. (A `[B, 1, 1, Nk]` padding mask broadcast
/// over queries as well is materialised to `[B, 1, Nq, Nk]` or given `ld = 0`.) Strides are
/// elements, non-negative. Every reader goes through `AttentionProblem::mask_row`; a method
/// that cannot honour a mask varying over (b, h) leaves `Capabilities::head_mask` unset and
/// `can_run` refuses such a mask with the reason.
struct Mask {
  MaskKind kind = MaskKind::kNone;
  const std::uint8_t* allowed = nullptr;  ///< kBool: nonzero = the key is visible
  const float* additive = nullptr;        ///< kAdditive: added to the logit; -inf hides the key
  index_t ld = 0;                         ///< between query rows (0: one row for every query)
  index_t stride_b = 0, stride_h = 0;     ///< between batches / query heads (0 = broadcast)
  /// The same `[Nq, Nk]` mask for every batch and head (or no mask).
  bool shared() const { return stride_b == 0 && stride_h == 0; }
};

/// Row i of the mask of one (batch, query head): `Nk` entries, of the mask's kind (the other
/// pointer is null; both are null without a mask).
struct MaskRow {
  const std::uint8_t* allowed = nullptr;
  const float* additive = nullptr;
};

/// Half-open range of key indices.
struct KeyRange {
  index_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
};

/// Element type of a problem's keys and values (a KV cache's storage), and of its half-precision
/// queries and output (HalfQ, HalfOut).
enum class KvType { kF32, kF16, kBf16 };
/// "f32", "f16", "bf16".
const char* to_string(KvType t);
/// Parses the names above; throws `numattn::Error` naming the choices otherwise.
KvType parse_kv_type(const std::string& s);
/// Bytes of one element: 4 or 2.
inline int kv_type_bytes(KvType t) { return t == KvType::kF32 ? 4 : 2; }

/// Keys and values held in half precision (IEEE binary16, or bfloat16: the top 16 bits of a
/// float32), read in place. When `type` is not kF32, the problem's `k` and `v` views give the
/// shapes and strides (in elements) and their `data` is null; element (b, h, j, d) of K is
/// `k[b·k.stride[0] + h·k.stride[1] + j·k.stride[2] + d]`, likewise for V. Only methods whose
/// `Capabilities::half_kv` is set accept such a problem (`can_run` refuses the others with the
/// reason); `widen_kv` turns it into a float32 problem for the rest.
struct HalfKv {
  KvType type = KvType::kF32;
  const std::uint16_t* k = nullptr;
  const std::uint16_t* v = nullptr;
};

/// Queries held in half precision (f16 or bf16), read in place: when `type` is not kF32 the
/// problem's `q` view gives the shape and strides (elements) and its `data` is null; element
/// (b, h, i, d) is `data[b·q.stride[0] + h·q.stride[1] + i·q.stride[2] + d]`.
///
/// Every method accepts it. Methods with `Capabilities::half_io` (exact.flash: each query tile
/// is converted to float32 as it is loaded, no whole-tensor copy) read it natively;
/// `AttentionMethod::run` gives the others a float32 copy of Q (exact: every half value is a
/// float32). Non-finite half values are refused as float32 ones are (problem.h, "Edges").
struct HalfQ {
  KvType type = KvType::kF32;
  const std::uint16_t* data = nullptr;
};

/// Output written in half precision (f16 or bf16), each element rounded once from the float32
/// result, to nearest, ties to even (overflow to ±inf in f16, which only a |v| near the f16
/// limit 65504 can cause). The problem's `out` view gives the shape and strides, its `data` is
/// null. `half_io` methods round the rows as they write them; `AttentionMethod::run` gives the
/// others a float32 output buffer and rounds it after. The LSE stays float32.
struct HalfOut {
  KvType type = KvType::kF32;
  std::uint16_t* data = nullptr;
};

struct AttentionProblem {
  TensorView<const float> q, k, v;
  TensorView<float> out;
  TensorView<float> lse;  ///< optional; empty view = not requested
  std::optional<double> scale;
  Causal causal = Causal::kNone;
  Mask mask;
  index_t window_left = -1, window_right = -1;
  /// Half-precision K/V (see HalfKv); default: float32 in `k` and `v`.
  HalfKv half;
  /// Half-precision Q / output (see HalfQ, HalfOut); default: float32 in `q` / `out`.
  HalfQ half_q;
  HalfOut half_out;

  bool half_kv() const { return half.type != KvType::kF32; }
  bool has_half_q() const { return half_q.type != KvType::kF32; }
  bool has_half_out() const { return half_out.type != KvType::kF32; }
  /// Row (b, h, i) of the half-precision queries / output.
  const std::uint16_t* q16_row(index_t b, index_t h, index_t i) const {
    return half_q.data + b * q.stride[0] + h * q.stride[1] + i * q.stride[2];
  }
  std::uint16_t* out16_row(index_t b, index_t h, index_t i) const {
    return half_out.data + b * out.stride[0] + h * out.stride[1] + i * out.stride[2];
  }
  /// Row i of the mask of batch b and query head h (Mask): the one way every method reads it.
  MaskRow mask_row(index_t b, index_t h, index_t i) const {
    const index_t off = b * mask.stride_b + h * mask.stride_h + i * mask.ld;
    if (mask.kind == MaskKind::kBool) return {mask.allowed + off, nullptr};
    if (mask.kind == MaskKind::kAdditive) return {nullptr, mask.additive + off};
    return {};
  }
  /// Row (b, h, j) of the half-precision keys / values.
  const std::uint16_t* k16_row(index_t b, index_t h, index_t j) const {
    return half.k + b * k.stride[0] + h * k.stride[1] + j * k.stride[2];
  }
  const std::uint16_t* v16_row(index_t b, index_t h, index_t j) const {
    return half.v + b * v.stride[0] + h * v.stride[1] + j * v.stride[2];
  }
  index_t batch() const { return q.shape[0]; }
  index_t heads() const { return q.shape[1]; }
  index_t kv_heads() const { return k.shape[1]; }
  index_t n_q() const { return q.shape[2]; }
  index_t n_kv() const { return k.shape[2]; }
  index_t d_qk() const { return q.shape[3]; }
  index_t d_v() const { return v.shape[3]; }
  index_t group() const { return heads() / kv_heads(); }
  double effective_scale() const {
    return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d_qk() > 0 ? d_qk() : 1));
  }
  /// Diagonal offset of the causal rule and the window.
  index_t diag_offset() const { return causal == Causal::kBottomRight ? n_kv() - n_q() : 0; }
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  /// Keys that the causal rule and the window leave visible to query row `i` (the mask may
  /// hide more inside the range).
  KeyRange key_range(index_t i) const;
  /// Whether key `j` is visible from query `i` of batch b and query head h by causal rule,
  /// window and boolean mask (an additive `-inf` is handled by the logit itself).
  bool visible(index_t b, index_t h, index_t i, index_t j) const;
  /// The same for a mask shared by all batches and heads (`mask.shared()`, asserted).
  bool visible(index_t i, index_t j) const;
  /// A short description for error messages: "B=1 Hq=8 Hkv=2 Nq=.. Nk=.. Dk=.. Dv=..", plus the
  /// mask's kind and strides and the half-precision element types when there are any.
  std::string describe() const;
};

/// A float32 copy of a half-precision problem's K/V: `k` and `v` hold `[B, Hkv, Nk, D]`
/// contiguous rows, of which only the keys some query row sees (by causal rule and window) are
/// converted (O(B·Hkv·visible·(Dk + Dv)), against the O(Nq·Nk·D) of the attention itself in a
/// prefill); `problem` is `p` reading them. Conversion is exact (every half value is a float32).
struct WidenedKv {
  WidenedKv() = default;
  WidenedKv(const WidenedKv&) = delete;  // `problem` points into this object's own vectors
  WidenedKv(WidenedKv&&) = default;
  std::vector<float> k, v;
  AttentionProblem problem;
};
/// `p` itself (copied) when it is float32; throws `numattn::Error` when the copy does not fit in
/// the available memory.
WidenedKv widen_kv(const AttentionProblem& p);
/// out[0, n) = the n half-precision values at `src` (type f16 or bf16) as float32, exactly: the
/// one conversion of cache rows that every reader outside the flash kernels uses.
void widen_row(const std::uint16_t* src, KvType type, index_t n, float* out);

/// n float32 values rounded to half precision (type f16 or bf16), to nearest, ties to even (f16
/// overflow gives ±inf, NaN stays NaN): the one conversion of every half-precision output row.
void narrow_row(const float* src, KvType type, index_t n, std::uint16_t* out);

/// A float32 problem standing for one with half-precision Q and/or output (HalfQ, HalfOut): `q`
/// holds a contiguous float32 copy of Q (O(B·Hq·Nq·Dk), exact), `out` a contiguous float32 copy of
/// the current half output (exact), and `problem` is `p` reading and writing them (K/V as in `p`).
/// `store_out` rounds `out` into `p`'s half output. `p` itself when it has neither.
struct WidenedIo {
  WidenedIo() = default;
  WidenedIo(const WidenedIo&) = delete;  // `problem` points into this object's own vectors
  WidenedIo(WidenedIo&&) = default;
  std::vector<float> q, out;
  AttentionProblem problem;
  /// Rounds the float32 output rows into `p.half_out` (nothing when `p` has no half output).
  void store_out(const AttentionProblem& p) const;
};
/// Throws `numattn::Error` when the copies do not fit in the available memory.
WidenedIo widen_io(const AttentionProblem& p);

/// FLOPs of exact attention on `p` under the project's FLOP model: 2·(visible query–key pairs
/// by causal rule and window)·(Dk + Dv), summed over batch and query heads — 2·Nq·Nk·(Dk+Dv)
/// per head without masking, about half of it for causal. GFLOP/s in every report use it.
double attention_flops(const AttentionProblem& p);

/// Throws `numattn::Error` naming the offending tensor when shapes are inconsistent, or when
/// `scale` is not finite or beyond the float32 range.
void validate(const AttentionProblem& p);

/// A value the problem semantics refuse (see the file comment): NaN or ±inf in q, k or v, or
/// +inf in an additive mask, at an element a query reads. `tensor()` is "q", "k", "v" or
/// "mask"; `index()` is [b, h, n, d] in that tensor's own shape ([i, j] for a mask shared by every
/// batch and head, [b, h, i, j] for one that varies over them; h is the query head).
class NonFiniteInput : public Error {
 public:
  NonFiniteInput(std::string tensor, std::vector<index_t> index, float value);
  const std::string& tensor() const { return tensor_; }
  const std::vector<index_t>& index() const { return index_; }

 private:
  std::string tensor_;
  std::vector<index_t> index_;
};

/// Throws `NonFiniteInput` for the first non-finite value of `x[0..n)`, a row whose first
/// element has index `row_index` + [0] in `tensor`.
void check_finite_row(const char* tensor, const float* x, index_t n, std::vector<index_t> row_index);

}  // namespace numattn
