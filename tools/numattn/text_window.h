// The setup shared by the commands that run a model on a window of a text and look at what its
// attention layers see (`capture`, `analyze`): the --model/--text/--tokens/--offset/--bos/--layers
// flags, their checks (all before the weights are read), the token window as `numattn ppl` cuts
// it, and one forward pass that collects each chosen layer's Q, K, V.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "numattn/core/cancel.h"
#include "numattn/core/exec.h"
#include "numattn/transform/pipeline.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/llama.h"

namespace numattn::cli {

/// The flags; `add_to` registers them (--layers with `layers_help`).
struct TextWindowFlags {
  std::string model = "default", text = "default", layers = "0", bos = "auto";
  std::int64_t tokens = 2048, offset = 0;
  bool no_progress = false;
  void add_to(CLI::App& app, const std::string& layers_help);
};

/// "0,15,29" or "all" (every index in [0, count)), sorted and deduplicated; throws OptionError
/// `option` for anything else or an index out of [0, count). `what` names the items ("layer"),
/// `count_name` the count ("n_layer").
std::vector<std::int64_t> parse_index_list(const std::string& s, const char* option, std::int64_t count,
                                           const char* what, const char* count_name);

/// The model's header, the text, and the token window, checked.
struct TextWindow {
  std::string model_path, text_path;
  GgufFile file;
  ModelHParams hp;
  std::vector<std::int64_t> layers;
  std::vector<std::int32_t> tokens;  ///< the window (BOS substituted when asked)
  std::int64_t text_tokens = 0;      ///< tokens of the whole text
  bool bos_replaced = false;
};

/// Resolves and opens --model and --text, checks that `out` (a directory) is neither of them
/// and, if it exists, is a directory; parses --layers against the model; runs
/// `before_tokenize` (the caller's own checks: output files, memory); checks --tokens against
/// the trained context and, after tokenizing the whole text as `numattn ppl` does,
/// --offset + --tokens against its length.
/// `label` prefixes progress notes on stderr ("capture"), off with --no-progress.
TextWindow open_text_window(const TextWindowFlags& f, const std::string& out, const char* label,
                            const std::function<void(const TextWindow&)>& before_tokenize = {});

/// One layer's Q, K, V, float32 [H, N, D] row-major (q: query heads; k, v: KV heads). The
/// pre-RoPE arrays are filled only when asked for.
struct LayerTensors {
  std::vector<float> q_pre, k_pre, q_post, k_post, v;
};
enum class RopeState { kPost, kPre, kBoth };

/// Loads the weights, applies `transforms` (transform/pipeline.h; its stages must keep GQA
/// layers of the file's head width: see capture_refusal), and runs one forward pass over the
/// window, keeping the layers of `w.layers` (in that order). A progress bar `label` over the layers
/// on a terminal (none with --no-progress). `cancel` (core/cancel.h) is checked after each layer.
std::vector<LayerTensors> capture_layers(const TextWindow& w, RopeState rope, bool progress, const char* label,
                                         const ExecContext& ctx, const transform::TransformPipeline& transforms = {},
                                         const CancelToken* cancel = nullptr);

/// Why capture_layers cannot capture the model that `p` makes ("" when it can): the q, k, v it
/// writes are those of GQA layers of the file's head width, which the mla and bda stages replace
/// by layers of other forms, and tensor.vo_cp / tensor.qk_cp by wider heads; the tensor.tucker_*
/// stages keep them.
std::string capture_refusal(const transform::TransformPipeline& p);

}  // namespace numattn::cli
