// The --tensor flag of `numattn ppl` (tensor compression at load, model/tensor_model.h) and the
// columns it adds to the ppl and convert rows (`convert --tensor` writes a numattn-tensor GGUF).
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "numattn/model/tensor_model.h"

namespace numattn::cli {

/// Adds --tensor SPEC to `sub` (help text: the spec grammar).
void add_tensor_option(CLI::App& sub, std::string& spec);

/// The spec of --tensor (nullopt when empty), checked against the other model options before any
/// model is read: refused with --bda, and with --mla-rank for any scheme but qk-cp
/// (OptionError "tensor").
std::optional<transform::TensorSpec> parse_tensor_option(const std::string& spec, const std::string& bda,
                                                         bool mla_requested);

/// The report's columns: tensor (canonical spec), tensor_params_before/_after/_kept (fraction),
/// tensor_fit_min, tensor_fit_mean, tensor_not_converged, tensor_exec_head_dim, tensor_s, and,
/// in JSON, tensor_parts (name, fit, iterations, info, ranks, params per decomposition).
void add_tensor_columns(Row& row, const TensorModelReport& rep, bool json);

}  // namespace numattn::cli
