/// @file pipeline.h
/// Model transforms as spec strings: the transform registry and the pipeline `a(..)|b(..)`.
///
/// A transform is named and configured like an attention method (attention/registry.h): a name
/// and `key=value` parameters, `mla(rank=128,rope_heads=1)`, parsed by the same parser
/// (parse_spec) and bound by the same schema machinery (ParamSpec, bind_params): each transform
/// declares its parameters once (name, type, default, range or choices, doc) in a MethodInfo
/// (family `mla`, `bda` or `tensor`; summary, citation, time_complexity as for methods), and
/// validation happens here and nowhere else. A pipeline is stages separated by `|` outside
/// parentheses (split_specs), applied left to right:
///
///   pipeline := stage { "|" stage }            e.g. mla(rank=128)|bda(pairs=qk)
///
/// Registered transforms (`numattn transforms` lists them with their parameters):
/// - `mla(rank, rope_heads, rope_dims, freqfold, budget, calib, calib_tokens, calib_mode, exec,
///   weights)`: GQA → MLA conversion (TransMLA; transform/mla.h, model/mla_convert.h), calibrated
///   on the last `calib_tokens` tokens of the text `calib` (`calib_mode`: two_pass, sequential or
///   one_pass); `rope_heads` h is rope_dims = h·n_rot; `budget` (a cache fraction) instead of rank,
///   rope_dims and freqfold searches them on the calibration tokens (model/transform_model.h);
///   `exec` = how the MLA layers run, `weights` = how the absorbed execution stores the converted
///   projections (model/mla_model.h).
/// - `bda(pairs, coef)`: BD Attention (transform/bda.h, model/bda_model.h).
/// - `tensor.vo_cp`, `tensor.qk_cp`, `tensor.tucker_qkvo`, `tensor.tucker_ffn`,
///   `tensor.tucker_heads`: the tensor compressions of transform/tensor_heads.h
///   (model/tensor_model.h); `rank2 = 0` means R2 = rank, `layers`/`heads` = 0 all slices.
///
/// Compositions: each transform at most once; `mla` first; `bda` and `tensor.*` not together;
/// after `mla` only `tensor.qk_cp` (on the NoPE part). Whatever the model itself refuses
/// (e.g. `bda(pairs=qk)` on RoPE dimensions of a GQA model) is refused when it is applied.
///
/// The canonical string (`TransformPipeline::canonical`, every default filled, stages in order)
/// is the identity of a model experiment: `parse_transforms(p.canonical())` gives `p` back. It
/// is printed in the result rows of `ppl`, `bench-model`, `generate` and stored by `convert`
/// under the GGUF key `numattn.transform` (kTransformKey).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "numattn/attention/method.h"
#include "numattn/transform/mla.h"
#include "numattn/transform/tensor_heads.h"

namespace numattn::transform {

/// The GGUF metadata key under which `convert` records the canonical pipeline of a file.
inline constexpr const char* kTransformKey = "numattn.transform";

/// Every registered transform's description (schema in `params`), in catalogue order.
const std::vector<const MethodInfo*>& list_transforms();
/// The description of `name`, or nullptr.
const MethodInfo* find_transform(std::string_view name);

/// `mla(...)`, bound.
struct MlaStage {
  MlaOptions options;        ///< rank (-1 with a budget), freqfold, rope_dims / rope_heads,
                             ///< balance (0 = chosen on the calibration tokens)
  double budget = 0;         ///< > 0: cache fraction; rank, rope_dims, freqfold are searched
  std::string calib;         ///< calibration text path, or "default"
  std::int64_t calib_tokens = 2048;
  std::string calib_mode;    ///< "sequential" or "one_pass" (model/mla_convert.h parse_mla_calib_mode)
  std::string exec;          ///< "absorbed" or "naive" (model/mla_model.h parse_mla_exec)
  std::string weights = "source";  ///< "source", "q8_0" or "f32" (model/mla_model.h parse_mla_weights)
};

/// `bda(...)`, bound.
struct BdaStage {
  std::string pairs;  ///< "vo", "qk" or "qkvo" (model/bda_model.h apply_bda)
  std::string coef;   ///< "q8_0", "source" or "f32" (parse_bda_coef)
};

/// One stage: its transform and validated parameters.
struct TransformStage {
  const MethodInfo* info = nullptr;
  ParamValues params;
  /// `name(k=v,...)` with every default filled in.
  std::string spec() const;
};

/// A parsed pipeline; `mla`, `bda`, `tensor` are the typed forms of its stages.
struct TransformPipeline {
  std::vector<TransformStage> stages;
  std::optional<MlaStage> mla;
  std::optional<BdaStage> bda;
  std::optional<TensorSpec> tensor;
  bool empty() const { return stages.empty(); }
  /// The stages' specs joined by "|" ("" when empty).
  std::string canonical() const;
};

/// Parses and validates a pipeline ("" or blank: no transform). Throws numattn::Error quoting
/// the pipeline for: an empty stage (leading, trailing or doubled `|`), unbalanced parentheses,
/// an unknown transform (listing the registered ones), an unknown, mistyped, out-of-range or
/// missing required parameter (listing the transform's parameters), and a composition the
/// model layer cannot run (above).
TransformPipeline parse_transforms(std::string_view pipeline);

/// The `tensor.*` stage equal to a spec of the older `--tensor` grammar (parse_tensor_spec).
std::string tensor_transform_spec(const TensorSpec& spec);

}  // namespace numattn::transform
