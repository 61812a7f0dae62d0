/// @file tensor_convert.h
/// Tensor-compressed models (model/tensor_model.h) stored as GGUF: architecture `numattn-tensor`,
/// written by `numattn convert --tensor SPEC --out X.gguf`, read back by LlamaModel::load.
///
/// The file stores the float32 factors (TensorFactors) and copies every tensor the scheme does
/// not replace byte for byte (embeddings, norms, the untouched attention or FFN matrices keep
/// the source's encoding, e.g. Q4_1). Loading rebuilds the compressed model with
/// build_tensor_model from those factors, the same function `ppl --tensor` runs, so the loaded
/// model's logits equal the `ppl --tensor` model's (bitwise when both read the same dequantized
/// source values).
///
/// Layout (docs/tensor.md "The numattn-tensor GGUF architecture"):
/// - `general.architecture = "numattn-tensor"`; every `llama.*` key of the source renamed
///   `numattn-tensor.*` (the source's hyper-parameters: head dim D, not the execution's max(D, R));
/// - `numattn-tensor.tensor.scheme` (string: vo-cp, qk-cp, tucker-qkvo, tucker-ffn, tucker-heads),
///   `numattn-tensor.tensor.rank` (u32; CP: the rank R of the factors, 1 ≤ R ≤ Hq·D, the exact
///   block form written as R = Hq·D; Tucker: R1), `numattn-tensor.tensor.rank2` (u32, Tucker R2),
///   `numattn-tensor.tensor.layers` (u32, Tucker stack rank ℓ, 0 = shared factors;
///   tucker-heads: the head-mode rank),
///   `numattn-tensor.tensor.exec` (string, optional: `factored` runs vo-cp as factored VO layers,
///   absent or `embedded` as the head-dim-max(D, R) embedding),
///   `numattn-tensor.tensor.spec` (string, the canonical spec, informational);
/// - CP schemes (`S` = `vo_cp` or `qk_cp`), per layer ℓ, F32 tensors (GGUF ne order {cols, rows}):
///   `blk.ℓ.attn_S.left` {R, E}, `blk.ℓ.attn_S.right` {R, E}, `blk.ℓ.attn_S.mix` {R, Hq}
///   (TensorFactors::Cp); vo-cp drops `attn_v`, `attn_output`; qk-cp drops `attn_q`, `attn_k`;
/// - Tucker schemes, per weight kind K (attn_q, attn_k, attn_v, attn_output | ffn_gate, ffn_up,
///   ffn_down; rows × cols the kind's matrix, R1 = min(rank, rows), R2 = min(rank2, cols)):
///   `tucker.K.left` {R1, rows}, `tucker.K.right` {R2, cols}, `tucker.K.cores` {R2, R1, B}
///   (B = ℓ, or L for shared factors), and with 1 ≤ ℓ < L `tucker.K.coef` {ℓ, L}; the kinds'
///   per-layer tensors are dropped. tucker-heads: the same four tensors per layer ℓ and kind K
///   (attn_q, attn_k, attn_v, attn_output), named `blk.ℓ.tucker_heads.K.{left,right,cores,coef}`,
///   slices = the kind's heads (rows = E, cols = D; `tensor.layers` is the head-mode rank, at
///   most Hq, 0 or ≥ the kind's heads = one core per head); attention tensors dropped.
/// Sizes: a CP layer stores R·(2E + Hq) floats against the dropped (Hkv·D + Hq·D)·E source
/// weights; a Tucker kind rows·R1 + cols·R2 + B·R1·R2 (+ ℓ·L) against L·rows·cols. The factors are
/// float32 while a source such as SmolLM2's is Q4_1 (5 bits a weight), so a file is smaller than
/// its source only when the parameters kept are below about 5/32 of the replaced ones.
///
/// Validation (read_tensor_file_layout, before any allocation): the scheme string, every key's
/// range (errors name the key), the factor tensors' presence, type (F32) and shape (errors name
/// the tensor and the keys that give the expected shape); non-finite factors are refused at load.
#pragma once

#include <string>

#include "numattn/core/exec.h"
#include "numattn/model/llama.h"
#include "numattn/model/tensor_model.h"

namespace numattn {

class GgufFile;

/// What a numattn-tensor file replaces (validated keys and factor shapes).
struct TensorFileLayout {
  TensorFactors spec_only;  ///< spec (scheme, rank, rank2, layers) with no factors read
  std::int64_t cp_rank = 0;
  /// True for a per-layer tensor kind ("attn_v", "ffn_up", ...) the file does not store.
  bool drops(const std::string& kind) const;
  /// True for a per-layer tensor kind build_tensor_model rebuilds (the loaders skip it).
  bool rebuilds(const std::string& kind) const;
};

/// Reads and validates the numattn-tensor keys and factor tensors of `f` against `hp` (the
/// file's renamed llama hyper-parameters). Throws numattn::Error naming the key or tensor.
TensorFileLayout read_tensor_file_layout(const GgufFile& f, const ModelHParams& hp);

/// The model of a numattn-tensor file: `w` holds everything but the rebuilt kinds (loaded by
/// LlamaModel::load in either storage); the factors are read from `f` and build_tensor_model runs.
LlamaModel finish_tensor_model(const GgufFile& f, const ModelHParams& hp, LlamaWeights w, const ExecContext& ctx);

/// Writes the compressed model given by `factors` (from compress_model_tensor on the model of
/// `source`) as a numattn-tensor file, atomically; refuses `path` == the source file, a source
/// that is not a plain `llama` file, and factors that do not match its hyper-parameters.
/// `transform`: the canonical transform pipeline it was made with (transform/pipeline.h), stored
/// under `numattn.transform` when not empty.
void write_tensor_gguf(const GgufFile& source, const TensorFactors& factors, const std::string& path,
                       const std::string& transform = "");

}  // namespace numattn
