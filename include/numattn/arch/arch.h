/// @file arch.h
/// The architectures numattn runs, and the GGUF keys of their hyper-parameters.
///
/// A GGUF file names its architecture in `general.architecture` and keeps its hyper-parameters
/// under that name (`llama.embedding_length`, ...; llama.cpp's LLM_KV_* names). numattn's own
/// files of converted models (model/mla_convert.h, model/tensor_convert.h) keep the llama keys
/// under their own name, so that llama.cpp refuses them instead of running them wrongly.
/// Each architecture belongs to a block family: the builder of model/ that turns its tensors
/// into a stack of blocks (model/blocks/block.h; the table is in model/llama.cpp).
///
/// read_model_hparams reads and validates the keys (ModelHParams::validate) without reading
/// or sizing any tensor but token_embd's shape (the vocabulary); the family's builder then
/// checks every tensor against them.
///
/// Gemma 3 (`gemma3`; Team Gemma, "Gemma 3 Technical Report", 2025), as llama.cpp reads it:
/// RoPE over halves (NEOX), GeGLU with tanh GELU, per-head q/k RMSNorm, post-norms, embeddings
/// times √E (as float32), softmax scale 1/√D (1/√(E/Hq) for the 62-layer 27B model), optional
/// final logit soft-capping (`gemma3.final_logit_softcapping`). With
/// `gemma3.attention.sliding_window` = W > 0, layer ℓ is local unless ℓ mod P = P − 1 (P =
/// `gemma3.attention.sliding_window_pattern`, default 6: five local layers, then one global);
/// local layers use RoPE base `gemma3.rope.freq_base_swa` (default 10 000), global ones
/// `gemma3.rope.freq_base`.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "numattn/arch/hparams.h"

namespace numattn {

class GgufFile;

/// One architecture numattn runs.
struct ArchSpec {
  std::string_view name;     ///< `general.architecture`
  std::string_view family;   ///< the block family whose builder makes the model ("llama")
  std::string_view summary;  ///< one line for messages and `numattn gguf-info`
  /// Sets what the architecture adds to the Llama form (ModelHParams: RoPE layout, gate,
  /// norms, scales, local layers), reading its own keys; nullptr = plain Llama.
  void (*features)(const GgufFile& f, ModelHParams& hp) = nullptr;
};

/// Every architecture numattn runs.
std::span<const ArchSpec> architectures();
/// The architecture called `name`, or nullptr.
const ArchSpec* find_architecture(std::string_view name);
/// "'llama' (…), 'numattn-mla' (…), …": the list an error message gives.
std::string supported_architectures();
/// The GGUF key of hyper-parameter `field` (a hparam_key constant) of architecture `arch`:
/// "<arch>.<field>".
std::string arch_key(std::string_view arch, std::string_view field);

/// The hyper-parameters of a file of a known architecture, validated (ModelHParams::validate,
/// errors naming the file and the key): the counts, the head dim (attention.key_length, or
/// embedding_length / head_count, which must then divide), n_rot (default the head dim),
/// rope.freq_base (default 10000), the RMS epsilon (default 1e-5), the trained context
/// (required, as in llama.cpp), the vocabulary (token_embd's rows), then the architecture's
/// features (ArchSpec::features). Refuses an unknown
/// architecture, a value length other than the key length and any RoPE scaling but "none".
ModelHParams read_model_hparams(const GgufFile& f);

}  // namespace numattn
