// The --tensor alias (tensor compression at load, model/tensor_model.h; now a tensor.* stage of
// --transform) and the columns a tensor stage adds to the ppl and convert rows (`convert --tensor` writes a numattn-tensor GGUF).
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "numattn/model/tensor_model.h"

namespace numattn::cli {

/// Adds --tensor SPEC to `sub`, the deprecated alias of --transform "tensor.SCHEME(...)" (help
/// text: the older grammar).
void add_tensor_alias_option(CLI::App& sub, std::string& spec);

/// The report's columns: tensor (canonical spec), tensor_params_before/_after/_kept (fraction),
/// tensor_fit_min, tensor_fit_mean, tensor_not_converged, tensor_exec_head_dim, tensor_s, and,
/// in JSON, tensor_parts (name, fit, iterations, info, ranks, params per decomposition).
void add_tensor_columns(Row& row, const TensorModelReport& rep, bool json);

}  // namespace numattn::cli
