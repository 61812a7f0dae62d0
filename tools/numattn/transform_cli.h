// --transform PIPELINE (transform/pipeline.h), the one model-transform option of ppl, bench-model,
// generate, convert and capture, and its deprecated aliases (--mla-rank and the MLA flags,
// --bda/--bda-coef, --tensor), which are mapped onto the pipeline string.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "mla_cli.h"
#include "numattn/transform/pipeline.h"

namespace numattn::cli {

struct TransformCliOptions {
  std::string transform;  ///< --transform
  // The deprecated aliases.
  MlaCliOptions mla;
  std::string bda = "none", bda_coef = "q8_0", tensor;
};

/// Which aliases a command had before --transform (those it accepts still).
struct TransformAliases {
  bool mla = true, bda = true, tensor = true;
};

/// Adds --transform and the aliases to `sub`.
void add_transform_options(CLI::App& sub, TransformCliOptions& o, TransformAliases aliases = {});

/// The pipeline of --transform, or of the aliases (then one line on stderr naming the equivalent
/// --transform string). Giving both is refused; so is --mla-exec next to an `mla` stage of
/// --transform (its exec= says it). Errors are OptionError("transform", ...).
transform::TransformPipeline resolve_transforms(const CLI::App& sub, const TransformCliOptions& o);

}  // namespace numattn::cli
