#include "numattn/arch/arch.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "numattn/core/error.h"
#include "numattn/gguf/gguf.h"
#include "numattn/gguf/gguf_keys.h"

namespace numattn {

namespace {

void gemma3_features(const GgufFile& f, ModelHParams& hp) {
  const std::string arch = f.architecture();
  auto K = [&](const char* field) { return arch_key(arch, field); };
  const GgufKeyReader keys(f);
  hp.rope_layout = RopeLayout::kHalves;
  hp.ffn_gate = FfnGate::kGeluTanh;
  hp.qk_norm = true;
  hp.post_norms = true;
  hp.embed_scale = static_cast<double>(std::sqrt(static_cast<float>(hp.n_embd)));
  // query_pre_attn_scalar: the head dim, except the 27B model's E / Hq (gemma_pytorch's config).
  hp.attn_scale = 1.0 / std::sqrt(static_cast<double>(hp.n_layer == 62 && hp.n_head > 0 ? hp.n_embd / hp.n_head
                                                                                         : hp.head_dim));
  hp.logit_softcap = keys.has(K(hparam_key::kLogitSoftcap))
                         ? keys.number(K(hparam_key::kLogitSoftcap), 0, false, 1e30, "a soft cap, >= 0 (0 = none)")
                         : 0.0;
  hp.sliding_window = keys.integer_or(K(hparam_key::kSlidingWindow), 0, 0, kMaxContextLength,
                                      "keys a local layer sees (0 = no local layers)");
  if (hp.sliding_window > 0) {
    NUMATTN_CHECK(!(keys.has(K(hparam_key::kSlidingWindowPattern)) && f.find(K(hparam_key::kSlidingWindowPattern))->is_array()),
                  "{}: {} is a per-layer array; numattn reads the integer period only", f.path(),
                  K(hparam_key::kSlidingWindowPattern));
    const std::int64_t period = keys.integer_or(K(hparam_key::kSlidingWindowPattern), 6, 0, hp.n_layer + 1,
                                                "the period of local and global layers (0 = every layer local)");
    hp.local_layers.assign(static_cast<std::size_t>(std::max<std::int64_t>(hp.n_layer, 0)), 0);
    for (std::int64_t l = 0; l < hp.n_layer; ++l)
      hp.local_layers[static_cast<std::size_t>(l)] = period == 0 || l % period < period - 1;
    hp.rope_base_local = keys.has(K(hparam_key::kRopeBaseLocal))
                             ? keys.number(K(hparam_key::kRopeBaseLocal), 0, true, 1e30, "a RoPE base, > 0")
                             : 10000.0;
  }
}

constexpr std::array<ArchSpec, 4> kArchitectures{{
    {"llama", "llama", "Llama: GQA with RoPE, SwiGLU, RMSNorm"},
    {"gemma3", "llama",
     "Gemma 3: GQA with q/k norms, interleaved sliding-window and global layers, GeGLU, post-norms",
     &gemma3_features},
    {"numattn-mla", "llama", "numattn's Llama converted to multi-head latent attention (model/mla_convert.h)"},
    {"numattn-tensor", "llama", "numattn's Llama with tensor-compressed weights (model/tensor_convert.h)"},
}};

}  // namespace

std::span<const ArchSpec> architectures() { return kArchitectures; }

const ArchSpec* find_architecture(std::string_view name) {
  for (const ArchSpec& a : kArchitectures)
    if (a.name == name) return &a;
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const ArchSpec& a : kArchitectures)
    s += fmt::format("{}'{}' ({})", s.empty() ? "" : ", ", a.name, a.summary);
  return s;
}

std::string arch_key(std::string_view arch, std::string_view field) {
  return fmt::format("{}.{}", arch, field);
}

ModelHParams read_model_hparams(const GgufFile& f) {
  const std::string arch = f.architecture();
  NUMATTN_CHECK(find_architecture(arch) != nullptr, "{}: architecture '{}' is not supported; numattn runs {}",
                f.path(), arch, supported_architectures());
  auto K = [&](const char* field) { return arch_key(arch, field); };
  NUMATTN_CHECK(!f.has(K(hparam_key::kRopeScaling)) || f.get_string(K(hparam_key::kRopeScaling)) == "none",
                "{}: {} = '{}': RoPE scaling is not supported (only 'none')", f.path(), K(hparam_key::kRopeScaling),
                f.get_string(K(hparam_key::kRopeScaling), ""));
  ModelHParams hp;
  hp.arch = arch;
  hp.n_embd = f.get_int(K(hparam_key::kEmbd));
  hp.n_layer = f.get_int(K(hparam_key::kBlocks));
  hp.n_ff = f.get_int(K(hparam_key::kFf));
  hp.n_head = f.get_int(K(hparam_key::kHeads));
  hp.n_head_kv = f.get_int(K(hparam_key::kHeadsKv), hp.n_head);
  if (f.has(K(hparam_key::kKeyLength))) {
    hp.head_dim = f.get_int(K(hparam_key::kKeyLength));
  } else {
    NUMATTN_CHECK(hp.n_head >= 1 && hp.n_embd % hp.n_head == 0,
                  "{}: {} = {} is not a multiple of {} = {}, and there is no {} to give the head dim", f.path(),
                  K(hparam_key::kEmbd), hp.n_embd, K(hparam_key::kHeads), hp.n_head, K(hparam_key::kKeyLength));
    hp.head_dim = hp.n_embd / hp.n_head;
  }
  NUMATTN_CHECK(f.get_int(K(hparam_key::kValueLength), hp.head_dim) == hp.head_dim,
                "{}: {} = {} differs from the key length {}; that is not supported", f.path(),
                K(hparam_key::kValueLength), f.get_int(K(hparam_key::kValueLength), hp.head_dim), hp.head_dim);
  hp.n_rot = f.get_int(K(hparam_key::kRot), hp.head_dim);
  hp.rope_base = f.get_double(K(hparam_key::kRopeBase), 10000.0);
  hp.rms_eps = f.get_double(K(hparam_key::kRmsEps), 1e-5);
  hp.n_ctx_train = f.get_int(K(hparam_key::kContext));  // required, as in llama.cpp
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  NUMATTN_CHECK(emb != nullptr, "{}: tensor token_embd.weight is missing (it gives the vocabulary)", f.path());
  hp.n_vocab = emb->ne.size() >= 2 ? emb->ne[1] : 0;
  hp.validate(f.path());  // the counts first: the features read them
  if (const ArchSpec* a = find_architecture(arch); a->features != nullptr) {
    a->features(f, hp);
    hp.validate(f.path());
  }
  return hp;
}

}  // namespace numattn
