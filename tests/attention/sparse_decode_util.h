// Decode checks shared by the sparse.window and sparse.topk tests: the tiny Llama of
// tests/support run with an attention spec by prefill and by KV-cache decoding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "numattn/core/rng.h"
#include "numattn/model/llama.h"
#include "numattn/model/ppl.h"
#include "support/tiny_llama.h"

namespace numattn::test {

inline std::vector<std::int32_t> decode_tokens(std::size_t n, std::uint64_t seed) {
  CounterRng r(seed, 0);
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>(r.uniform(i) * 64) % 64;
  return t;
}

/// Log-probabilities of the last position's vocabulary row.
inline std::vector<double> last_logprobs(const std::vector<float>& logits) {
  std::vector<double> out;
  log_softmax(logits.data() + logits.size() - 64, 64, out);
  return out;
}

/// The last token's log-probabilities when `toks` are (a) prefilled at once and (b) prefilled
/// up to `split` then decoded one token at a time through the KV cache, both with `spec`.
struct DecodeRun {
  std::vector<double> prefill, decode;
};
inline DecodeRun prefill_vs_decode(const LlamaModel& m, const std::string& spec,
                                   const std::vector<std::int32_t>& toks, std::size_t split) {
  ExecContext ctx{2};
  ForwardOptions o;
  o.attention = make_attention_methods(spec, m.hparams().n_layer);
  DecodeRun r;
  KvCache full = m.make_cache(static_cast<std::int64_t>(toks.size()));
  r.prefill = last_logprobs(m.forward(toks, full, ctx, o));
  KvCache c = m.make_cache(static_cast<std::int64_t>(toks.size()));
  std::vector<float> lg = m.forward(std::vector<std::int32_t>(toks.begin(), toks.begin() + split), c, ctx, o);
  for (std::size_t i = split; i < toks.size(); ++i) lg = m.forward({toks[i]}, c, ctx, o);
  r.decode = last_logprobs(lg);
  return r;
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e;
}

}  // namespace numattn::test
