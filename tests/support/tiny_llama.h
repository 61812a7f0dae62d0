// A tiny random Llama model written as GGUF, shared by the model-layer tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "numattn/gguf/gguf.h"
#include "numattn/model/llama.h"
#include "numattn/quant/quant.h"

namespace numattn::test {

// A tiny random Llama: 2 layers, GQA (4 query heads over 2 KV heads), vocabulary 64.
ModelHParams tiny_hparams();

/// n seeded N(0, scale²) values (seed 1234, stream `stream`).
std::vector<float> randn(std::size_t n, std::uint64_t stream, float scale);

// Tensors in GGUF naming, each as [out rows][in] floats.
struct TinyTensors {
  ModelHParams hp;
  std::string arch = "llama";  ///< general.architecture (the hyper-parameter keys' prefix)
  std::vector<std::pair<std::string, GgufValue>> extra_keys;  ///< written after the standard ones
  std::vector<std::pair<std::string, std::vector<float>>> t;  // name, data
  std::vector<std::pair<std::int64_t, std::int64_t>> shape;   // {in, out}
  const std::vector<float>& get(const std::string& n) const;
};

/// Random weights of the tiny model (tied: no output.weight).
TinyTensors make_tiny(bool tied);
/// The same with other hyper-parameters (any valid ones).
TinyTensors make_tiny(bool tied, const ModelHParams& hp);

/// A tiny random Gemma 3 (arch gemma3): 3 layers (0 and 2 local with a window of 4 keys and RoPE
/// base 100, layer 1 global with base 10000), 4 query heads over 1 KV head of dimension 16
/// (key_length ≠ E/Hq), q/k norms, post-norms, final logit soft-cap 30, tied embeddings.
TinyTensors make_tiny_gemma();

/// Writes the tiny model to temp_path(name) with 2-d weights stored as `type`.
std::string write_gguf(const TinyTensors& T, const std::string& name, GgmlType type = GgmlType::F32);

/// Changes to a GGUF file, for crafting hostile variants of a valid one.
struct GgufEdit {
  /// Metadata to set (added at the end if new); std::nullopt drops the key.
  std::vector<std::pair<std::string, std::optional<GgufValue>>> keys;
  /// Tensors to replace (or add) with float32 data of shape `ne` stored as `type`.
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> ne;
    std::vector<float> data;
    GgmlType type = GgmlType::F32;
  };
  std::vector<Tensor> tensors;
  std::vector<std::string> drop_tensors;
};

/// A copy of the GGUF file `src` with `edit` applied, written to temp_path(name).
std::string rewrite_gguf(const std::string& src, const GgufEdit& edit, const std::string& name);

/// make_tiny(false), made once.
const TinyTensors& tiny_tensors();

/// The characters of the tiny model's vocabulary: token 2 + i is kTinyChars[i] (0 is BOS, 1 EOS).
extern const std::string kTinyChars;

/// The tiny model (tiny_tensors) with a 64-token vocabulary, BOS, EOS and one token per character
/// (byte-level BPE symbols, no merges, add_bos_token set), so that text commands (`capture`,
/// `analyze`, `ppl`) run on it. Written once per process.
std::string tiny_model_with_vocab();

/// The tiny model file `base` with that vocabulary, written to temp_path(name).
std::string add_tiny_vocab(const std::string& base, const std::string& name, const std::string& model_name);

/// The first n characters of repeated English prose in that vocabulary.
std::string tiny_text(std::size_t n);

}  // namespace numattn::test
