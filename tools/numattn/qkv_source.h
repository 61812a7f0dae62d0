// Captured Q/K/V (`numattn capture`) as the problem of `run` and `bench` (`--qkv DIR --layer L`).
//
// A capture directory holds, per layer L, `layerL_q.npy` `[Hq, N, D]`, `layerL_k.npy` and
// `layerL_v.npy` `[Hkv, N, D]` (float32, C order) and one `manifest.json` (written last) that
// names the model, the text window, the layers, the head counts, the RoPE state and the scale
// the model uses. Reading checks the manifest against the files: the layer is listed, every
// array has the shape the manifest states, Hq is a multiple of Hkv (the GQA ratio).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numattn/analysis/report.h"
#include "numattn/attention/problem.h"
#include "numattn/attention/random_problem.h"

namespace numattn::cli {

/// "layer{L}_{t}.npy" for t in q, k, v.
std::string qkv_file_name(std::int64_t layer, const std::string& t);

/// One layer of a capture, read and checked.
struct CapturedLayer {
  std::string dir;
  std::int64_t layer = 0;
  Row manifest;
  index_t heads = 0, kv_heads = 0, n = 0, d = 0;
  std::vector<float> q, k, v;  ///< [H, N, D] row-major
  /// The paths of the three files.
  std::string q_path, k_path, v_path;
  /// "capture DIR layer L" (the `source` column of run/bench rows).
  std::string source() const;
};

/// Reads layer `layer` of the capture in `dir`. Throws numattn::Error naming the file and the
/// manifest key for anything inconsistent (OptionError "layer" for a layer not captured, with
/// the captured ones).
CapturedLayer read_capture(const std::string& dir, std::int64_t layer);

/// A problem over file data (a capture), with the problem flags that apply to given inputs:
/// causal alignment, scale, logit scale (q multiplied by X), sliding window, memory layout.
/// Owns its buffers; not copyable (the views point into it).
class FileProblem {
 public:
  /// `q` `[B,Hq,N,Dk]`, `k` `[B,Hkv,Nk,Dk]`, `v` `[B,Hkv,Nk,Dv]` row-major data (copied into
  /// `cfg.layout`); shape fields of `cfg` are ignored, the rest applies.
  FileProblem(const std::vector<float>& q, std::array<index_t, 4> qs, const std::vector<float>& k,
              std::array<index_t, 4> ks, const std::vector<float>& v, std::array<index_t, 4> vs,
              const ProblemConfig& cfg);
  FileProblem(const FileProblem&) = delete;
  FileProblem& operator=(const FileProblem&) = delete;
  AttentionProblem& problem() { return p_; }
  const ProblemConfig& config() const { return cfg_; }
  void set_lse(bool on);

 private:
  ProblemConfig cfg_;
  std::vector<float> q_, k_, v_, out_, lse_;
  AttentionProblem p_;
};

}  // namespace numattn::cli
