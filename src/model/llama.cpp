#include "numattn/model/llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "numattn/attention/registry.h"
#include "numattn/core/blas.h"
#include "numattn/core/error.h"
#include "numattn/core/memory.h"
#include "numattn/core/simd.h"
#include "numattn/gguf/gguf.h"
#include "numattn/gguf/gguf_keys.h"
#include "numattn/gguf/tensor_data.h"
#include "numattn/model/mla_model.h"
#include "numattn/model/tensor_convert.h"
#include "numattn/transform/mla.h"

namespace numattn {

namespace {

using Clock = std::chrono::steady_clock;

// Adds the seconds since `t0` to `*slot` (when profiling) and restarts the clock.
struct PhaseTimer {
  ForwardProfile* prof;
  Clock::time_point t0 = Clock::now();
  void lap(double ForwardProfile::*slot) {
    if (!prof) return;
    const auto t1 = Clock::now();
    prof->*slot += std::chrono::duration<double>(t1 - t0).count();
    t0 = t1;
  }
};

// y[o] (+)= W[o,:]·x for rows o in [o0, o1): a decode step's matrix-vector product. Written
// out because BLAS GEMM with one row still packs all of W (an extra pass over memory), and this
// is memory-bound anyway; 16 independent partial sums let the compiler vectorise the dot
// product without reassociation.
void gemv_rows(const float* x, std::int64_t in, const float* w, std::int64_t o0, std::int64_t o1,
               float* y, bool accumulate) {
  for (std::int64_t o = o0; o < o1; ++o) {
    const float* wr = w + o * in;
    float acc[16] = {};
    std::int64_t i = 0;
    for (; i + 16 <= in; i += 16)
      for (int k = 0; k < 16; ++k) acc[k] += wr[i + k] * x[i + k];
    float sum = 0;
    for (; i < in; ++i) sum += wr[i] * x[i];
    for (int k = 0; k < 16; ++k) sum += acc[k];
    y[o] = accumulate ? y[o] + sum : sum;
  }
}

// y = x·Wᵀ (+ y when accumulate) for x [n, in], W [out, in] row-major. Large products are
// split over `ctx`'s threads by contiguous blocks of output features, each a single-threaded
// BLAS GEMM; small ones stay on the calling thread, because waking the team costs more than
// they do (a scheduler time slice on a loaded machine).
void linear(const ExecContext& ctx, const float* x, std::int64_t n, std::int64_t in,
            const float* w, std::int64_t out, float* y, bool accumulate, std::int64_t ldy = 0) {
  if (ldy <= 0) ldy = out;
  const float beta = accumulate ? 1.f : 0.f;
  const int nt = ctx.num_threads();
  const bool split = nt > 1 && n * in * out >= (std::int64_t{1} << 23);
  if (n <= 2) {
    auto rows = [&](std::int64_t o0, std::int64_t o1) {
      for (std::int64_t r = 0; r < n; ++r) gemv_rows(x + r * in, in, w, o0, o1, y + r * ldy, accumulate);
    };
    if (!split) {
      rows(0, out);
    } else {
      parallel_for(ctx, nt, [&](std::int64_t p) { rows(out * p / nt, out * (p + 1) / nt); });
    }
    return;
  }
  // Blocks of 64 features keep each slice's width a multiple of the BLAS micro-kernel.
  const std::int64_t blocks = (out + 63) / 64;
  const std::int64_t parts = std::min<std::int64_t>(nt, blocks);
  if (parts <= 1 || !split) {
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, out, in, 1.f, x, in, w, in, beta, y, ldy);
    return;
  }
  parallel_for(ctx, parts, [&](std::int64_t p) {
    const std::int64_t o0 = std::min(out, blocks * p / parts * 64);
    const std::int64_t o1 = std::min(out, blocks * (p + 1) / parts * 64);
    blas::sgemm(blas::Trans::kNo, blas::Trans::kYes, n, o1 - o0, in, 1.f, x, in, w + o0 * in, in,
                beta, y + o0, ldy);
  });
}

// The same product with a weight held either way (LlamaLayer: float32 or in place). With 8-bit
// activations a decode product runs quant_linear's integer kernels, and a prefill rounds x to
// the same x̂ before its float32 panels, so that prefill and decode still agree up to float32
// summation order (and ppl, which prefills, measures what decode computes).
void linear(const ExecContext& ctx, Activations act, const float* x, std::int64_t n, std::int64_t in,
            const std::vector<float>& wf, const QuantMatrix& wq, std::int64_t out, float* y,
            bool accumulate, std::int64_t ldy = 0) {
  if (!wq.empty()) {
    if (act == Activations::kQ8 && n > kQuantGemvMaxBatch) {
      thread_local std::vector<float> xhat;
      xhat.assign(x, x + n * in);
      round_activations_q8(xhat.data(), n, in);
      quant_linear(ctx, wq, xhat.data(), n, y, accumulate, ldy);
    } else {
      quant_linear(ctx, wq, x, n, y, accumulate, ldy, default_cpu_path(), act);
    }
  } else {
    linear(ctx, x, n, in, wf.data(), out, y, accumulate, ldy);
  }
}

void rms_norm_rows(const float* x, const float* w, float* y, std::int64_t n, std::int64_t e,
                   double eps) {
  for (std::int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * e;
    float* yr = y + t * e;
    const double ss = simd::sum_squares_f64(xr, e);
    const auto r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(e) + eps));
    for (std::int64_t i = 0; i < e; ++i) yr[i] = xr[i] * r * w[i];
  }
}

// GGUF keys of the hyper-parameters (llama.cpp's LLM_KV_* names for arch "llama").
constexpr const char* kKeyEmbd = "llama.embedding_length";
constexpr const char* kKeyBlocks = "llama.block_count";
constexpr const char* kKeyFf = "llama.feed_forward_length";
constexpr const char* kKeyHeads = "llama.attention.head_count";
constexpr const char* kKeyHeadsKv = "llama.attention.head_count_kv";
constexpr const char* kKeyKeyLen = "llama.attention.key_length";
constexpr const char* kKeyValueLen = "llama.attention.value_length";
constexpr const char* kKeyRot = "llama.rope.dimension_count";
constexpr const char* kKeyRopeBase = "llama.rope.freq_base";
constexpr const char* kKeyEps = "llama.attention.layer_norm_rms_epsilon";
constexpr const char* kKeyCtx = "llama.context_length";
constexpr const char* kKeyVocab = "llama.vocab_size";
// Tensors per layer (norms, q, k, v or its BD form, o, gate, up, down).
constexpr std::int64_t kTensorsPerLayer = 9;

// Tensor `name` must exist, have ne = {in} (out == 0: a vector) or {in, out} (GGUF order; any
// trailing dimensions 1, as llama.cpp accepts) and a type numattn can dequantize. `why` says
// which keys give the expected shape, so a disagreement names both sides.
void check_tensor(const GgufFile& f, const std::string& name, std::int64_t in, std::int64_t out,
                  const std::string& why) {
  const GgufTensorInfo* t = f.find_tensor(name);
  NUMATTN_CHECK(t != nullptr, "{}: tensor {} is missing (the llama hyper-parameters need it)",
                f.path(), name);
  auto dim = [&](std::size_t i) { return i < t->ne.size() ? t->ne[i] : 1; };
  NUMATTN_CHECK(dim(0) == in && dim(1) == (out == 0 ? 1 : out) && dim(2) == 1 && dim(3) == 1,
                "{}: tensor {} has shape {}, but the hyper-parameters give {} ({}): the file's "
                "metadata disagrees with its tensors",
                f.path(), name, t->shape_string(),
                out == 0 ? fmt::format("[{}]", in) : fmt::format("[{}, {}]", in, out), why);
  NUMATTN_CHECK(ggml_type_info(t->type).dequantizable,
                "{}: tensor {} has type {}, which numattn cannot dequantize", f.path(), name,
                ggml_type_name(t->type));
}

// Dequantizes a tensor that read_hparams has checked, refusing non-finite weights.
void load_tensor(const GgufFile& f, const std::string& name, std::vector<float>& dst,
                 std::int64_t n, const ExecContext& ctx) {
  const GgufTensorInfo& t = f.tensor(name);
  NUMATTN_ASSERT(t.n_elements() == n);
  dst.resize(static_cast<std::size_t>(n));
  dequantize_tensor(t, dst.data(), ctx, NonFinite::kRefuse);
}
void load_tensor(const GgufFile& f, const std::string& name, float* dst, std::int64_t n,
                 const ExecContext& ctx) {
  const GgufTensorInfo& t = f.tensor(name);
  NUMATTN_ASSERT(t.n_elements() == n);
  dequantize_tensor(t, dst, ctx, NonFinite::kRefuse);
}

// The BDA keys of a llama file (model/bda_model.h): `numattn.bda.version` (the layout this build
// reads: 1), `numattn.bda.pairs` (the pairs the layout stores: only "vo"; QK forms of MLA models are
// made at load), and per BD layer the channel permutation and the dense-head list, which must
// come with the layer's `attn_v_bd.coef` tensor and it with them.
constexpr std::int64_t kBdaFormatVersion = 1;
constexpr const char* kBdaVersion = "numattn.bda.version";
constexpr const char* kBdaPairs = "numattn.bda.pairs";

// Refuses BDA keys or tensors where they do not belong and checks the file-wide keys of a BDA
// file. Returns whether the file is one.
bool check_bda_file(const GgufFile& f, const std::string& arch, std::int64_t n_layer) {
  const GgufKeyReader keys(f);
  std::string coef;  // the first layer's BD tensor, if any
  for (std::int64_t l = 0; l < n_layer && coef.empty(); ++l)
    if (f.find_tensor("blk." + std::to_string(l) + ".attn_v_bd.coef")) coef = "blk." + std::to_string(l) + ".attn_v_bd.coef";
  const bool keyed = keys.has(kBdaVersion) || keys.has(kBdaPairs);
  if (coef.empty() && !keyed) return false;
  if (arch != "llama")
    throw Error(fmt::format("{}: {} in a '{}' file: BD Attention files are llama files (model/bda_model.h); "
                            "apply BDA to this model at load instead", f.path(),
                            keyed ? (keys.has(kBdaVersion) ? kBdaVersion : kBdaPairs) : "tensor " + coef, arch));
  keys.version(kBdaVersion, kBdaFormatVersion);
  keys.one_of(kBdaPairs, {"vo"},
              "the pairs whose BD form the file stores; this layout stores the VO pair only (qk and qkvo are "
              "applied at load)");
  return true;
}

// The validated permutation and dense-head list of BD layer prefix `p` (E channels, Hkv heads).
struct BdaLayerKeys {
  std::vector<std::int64_t> perm, dense;
};
BdaLayerKeys read_bda_layer(const GgufFile& f, const std::string& p, std::int64_t E, std::int64_t Hkv) {
  const GgufKeyReader keys(f);
  const std::string pk = p + "attn_v_bd.perm", dk = p + "attn_v_bd.dense";
  BdaLayerKeys k;
  k.perm = keys.integers(pk, static_cast<std::size_t>(E), static_cast<std::size_t>(E), 0, E - 1,
                         "the input channels in [S, S^c] order: a permutation of 0 .. embedding_length − 1");
  std::vector<char> seen(static_cast<std::size_t>(E), 0);
  for (std::int64_t c : k.perm)
    if (seen[static_cast<std::size_t>(c)]++)
      keys.refuse(pk, fmt::format("lists channel {} twice: not a permutation of 0 .. {}", c, E - 1));
  k.dense = keys.integers(dk, 0, static_cast<std::size_t>(Hkv), 0, Hkv - 1,
                          "the KV heads kept dense, each at most once, at most head_count_kv of them");
  for (std::size_t i = 1; i < k.dense.size(); ++i)
    if (k.dense[i] <= k.dense[i - 1]) keys.refuse(dk, "must list KV heads in increasing order, each once");
  return k;
}

// The fused BD projection of the VO pair a BDA file stores for layer prefix `p` instead of
// attn_v (model/bda_model.h); float32 in both weight storages.
std::shared_ptr<const transform::BdProjection> load_v_bd(const GgufFile& f, const std::string& p, std::int64_t E,
                                                        std::int64_t Hkv, std::int64_t D, const ExecContext& ctx) {
  transform::BdProjection::Parts parts;
  parts.d_in = E;
  parts.heads = Hkv;
  parts.head_dim = D;
  parts.rank = D;
  const BdaLayerKeys k = read_bda_layer(f, p, E, Hkv);
  for (std::int64_t c : k.perm) parts.perm.push_back(c);
  for (std::int64_t c : k.dense) parts.dense_heads.push_back(c);
  load_tensor(f, p + "attn_v_bd.coef", parts.rest, (E - D) * Hkv * D, ctx);
  const auto nd = static_cast<std::int64_t>(parts.dense_heads.size());
  if (nd > 0) load_tensor(f, p + "attn_v_bd.top", parts.top, D * nd * D, ctx);
  return std::make_shared<const transform::BdProjection>(transform::BdProjection::from_parts(std::move(parts)));
}

// The MLA keys of a `numattn-mla` file (model/mla_convert.h), each read through GgufKeyReader
// with its range, then checked against each other and against the file's GQA hyper-parameters
// `hp` the way convert_layer_to_mla relates them: d_v = D, d_rope = rope_heads·n_rot,
// d_nope = Hkv·D − d_rope, r = the latent width d_nope + Hkv·D cut to rank_option, softmax
// scale 1/sqrt(D). So the informational options and the renamed GQA keys (head_count_kv,
// rope.dimension_count, which size KV-cache comparisons) cannot disagree with the layers.
struct MlaFileDims {
  std::int64_t rank = 0, d_nope = 0, d_rope = 0, d_v = 0;
  std::int64_t freqfold = 1, rope_heads = 1, rank_option = 0;
  double scale = 0;
};
constexpr std::int64_t kMaxMlaDim = std::int64_t{1} << 20;
// The numattn-mla layout this build reads (1: model/mla_convert.h).
constexpr std::int64_t kMlaFormatVersion = 1;
constexpr const char* kMla = "numattn-mla.mla.";
std::string mla_key(const char* k) { return std::string(kMla) + k; }

MlaFileDims read_mla_dims(const GgufFile& f, const LlamaHParams& hp) {
  const GgufKeyReader keys(f);
  MlaFileDims d;
  keys.version(mla_key("version"), kMlaFormatVersion, 1);  // files before the key are version 1
  const std::int64_t D = hp.head_dim, Hkv = hp.n_head_kv, pairs = hp.n_rot / 2;
  const std::string dims = fmt::format("an MLA dimension, at most {}", kMaxMlaDim);
  d.rank = keys.integer(mla_key("kv_lora_rank"), 1, kMaxMlaDim, dims);
  d.d_nope = keys.integer(mla_key("nope_dim"), 0, kMaxMlaDim, dims);
  d.d_rope = keys.integer(mla_key("rope_dim"), 0, kMaxMlaDim, dims);
  d.d_v = keys.integer(mla_key("value_dim"), 1, kMaxMlaDim, dims);
  d.scale = keys.number(mla_key("softmax_scale"), 0, true, std::numeric_limits<double>::infinity(), "");
  d.freqfold = keys.integer(mla_key("freqfold"), 1, std::max<std::int64_t>(1, pairs),
                            fmt::format("RoPE frequencies folded together, at most the n_rot/2 = {} of "
                                        "numattn-mla.rope.dimension_count", pairs));
  d.rope_heads = keys.integer(mla_key("rope_heads"), 1, Hkv,
                              "KV heads' worth of RoPE dims kept, at most numattn-mla.attention.head_count_kv");
  d.rank_option = keys.integer(mla_key("rank_option"), 0, std::numeric_limits<std::int64_t>::max(),
                               "the conversion's rank, 0 = the full latent width");
  if (pairs % d.freqfold != 0)
    keys.refuse(mla_key("freqfold"), fmt::format("does not divide the {} RoPE frequencies (n_rot/2, "
                                                 "numattn-mla.rope.dimension_count = {})", pairs, hp.n_rot));
  if (d.d_v != D)
    keys.refuse(mla_key("value_dim"), fmt::format("must equal the head dim {} (numattn-mla.attention.key_length, or "
                                                  "numattn-mla.embedding_length / numattn-mla.attention.head_count): "
                                                  "the conversion keeps W_o", D));
  if (d.d_rope % 2 != 0) keys.refuse(mla_key("rope_dim"), "must be even (RoPE rotates pairs)");
  if (d.d_rope != d.rope_heads * hp.n_rot)
    keys.refuse(mla_key("rope_dim"), fmt::format("must be rope_heads × n_rot = {} × {} = {} ({} and "
                                                 "numattn-mla.rope.dimension_count)",
                                                 d.rope_heads, hp.n_rot, d.rope_heads * hp.n_rot, mla_key("rope_heads")));
  if (d.d_nope != Hkv * D - d.d_rope)
    keys.refuse(mla_key("nope_dim"), fmt::format("must be head_count_kv × head dim − rope_dim = {} × {} − {} = {} "
                                                 "(numattn-mla.attention.head_count_kv = {})",
                                                 Hkv, D, d.d_rope, Hkv * D - d.d_rope, Hkv));
  if (d.d_nope + d.d_rope < 1) keys.refuse(mla_key("nope_dim"), "nope_dim + rope_dim = 0: the keys would be empty");
  const std::int64_t full = d.d_nope + Hkv * D;
  const std::int64_t want = d.rank_option == 0 || d.rank_option > full ? full : d.rank_option;
  if (d.rank != want)
    keys.refuse(mla_key("kv_lora_rank"), fmt::format("must be {} ({} = {} of the latent width nope_dim + "
                                                     "head_count_kv × head dim = {}; 0 or more = all of it)",
                                                     want, mla_key("rank_option"), d.rank_option, full));
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  if (std::abs(d.scale - scale) > 1e-12 * scale)
    keys.refuse(mla_key("softmax_scale"), fmt::format("must be 1/sqrt(head dim {}) = {}, the GQA model's scale", D, scale));
  return d;
}

// The per-layer RoPE frequencies `numattn-mla.mla.rope_theta.ℓ`: d_rope/2 values, those the
// conversion derives from rope.freq_base, rope.dimension_count, freqfold and rope_heads.
std::vector<double> read_mla_theta(const GgufFile& f, std::int64_t l, const LlamaHParams& hp, const MlaFileDims& d) {
  const GgufKeyReader keys(f);
  const std::string k = mla_key("rope_theta.") + std::to_string(l);
  const std::vector<double> th = keys.numbers(k, static_cast<std::size_t>(d.d_rope / 2), 0, true,
                                              std::numeric_limits<double>::infinity(),
                                              "one frequency per RoPE pair, rope_dim / 2 of them");
  const std::vector<double> want = transform::mla_rope_theta(hp, static_cast<int>(d.freqfold), d.rope_heads);
  for (std::size_t i = 0; i < th.size(); ++i)
    if (std::abs(th[i] - want[i]) > 1e-12 * want[i])
      keys.refuse(k, fmt::format("element {} = {} must be {}, the frequency {} = {} and {} = {} give from "
                                 "numattn-mla.rope.freq_base = {} and numattn-mla.rope.dimension_count = {}",
                                 i, th[i], want[i], mla_key("freqfold"), d.freqfold, mla_key("rope_heads"),
                                 d.rope_heads, hp.rope_base, hp.n_rot));
  return th;
}

// One MLA layer of a numattn-mla file (shapes checked by read_hparams), in float32.
std::shared_ptr<const MlaLayer> load_mla_layer(const GgufFile& f, std::int64_t l, const LlamaHParams& hp,
                                               const MlaFileDims& d, const ExecContext& ctx) {
  const std::string p = "blk." + std::to_string(l) + ".";
  const std::int64_t E = hp.n_embd, H = hp.n_head, r = d.rank, dn = d.d_nope, dr = d.d_rope, dv = d.d_v;
  MlaLayer M;
  M.n_head = H;
  M.rank = r;
  M.d_nope = dn;
  M.d_rope = dr;
  M.d_v = dv;
  M.softmax_scale = d.scale;
  M.rope_theta = read_mla_theta(f, l, hp, d);
  M.w_in.resize(static_cast<std::size_t>(M.in_rows() * E));
  load_tensor(f, p + "attn_kv_a_mqa.weight", M.w_in.data(), (r + dr) * E, ctx);
  std::vector<float> q, kvb;
  load_tensor(f, p + "attn_q.weight", q, H * (dn + dr) * E, ctx);
  float* qn = M.w_in.data() + (r + dr) * E;
  float* qr = qn + H * dn * E;
  for (std::int64_t h = 0; h < H; ++h) {
    std::copy_n(q.data() + h * (dn + dr) * E, dn * E, qn + h * dn * E);
    std::copy_n(q.data() + (h * (dn + dr) + dn) * E, dr * E, qr + h * dr * E);
  }
  load_tensor(f, p + "attn_kv_b.weight", kvb, H * (dn + dv) * r, ctx);
  M.w_uk.resize(static_cast<std::size_t>(H * dn * r));
  M.w_uv.resize(static_cast<std::size_t>(H * dv * r));
  for (std::int64_t h = 0; h < H; ++h) {
    std::copy_n(kvb.data() + h * (dn + dv) * r, dn * r, M.w_uk.data() + h * dn * r);
    std::copy_n(kvb.data() + (h * (dn + dv) + dn) * r, dv * r, M.w_uv.data() + h * dv * r);
  }
  return std::make_shared<const MlaLayer>(std::move(M));
}

}  // namespace

double ForwardProfile::total() const {
  return embed + norm + qkv_gemm + rope + attention + o_gemm + ffn_gemm + ffn_act + output_gemm +
         sync;
}

std::int64_t LlamaHParams::layer_weights() const {
  return qkv_rows() * n_embd + n_embd * n_head * head_dim + 3 * n_ff * n_embd;
}

std::int64_t LlamaHParams::weight_count(bool tied) const {
  constexpr const char* what =
      "llama weight count from embedding_length, block_count, feed_forward_length, head_count, "
      "head_count_kv, key_length and the vocabulary";
  auto mul = [&](std::int64_t a, std::int64_t b) { return checked_mul(a, b, what); };
  auto add = [&](std::int64_t a, std::int64_t b) { return checked_add(a, b, what); };
  const std::int64_t qkv = mul(add(n_head, mul(2, n_head_kv)), head_dim);
  std::int64_t layer = add(mul(2, n_embd), mul(qkv, n_embd));      // norms, Wq|Wk|Wv
  layer = add(layer, mul(n_embd, mul(n_head, head_dim)));         // Wo
  layer = add(layer, mul(3, mul(n_ff, n_embd)));                  // gate, up, down
  const std::int64_t emb = mul(n_vocab, n_embd);
  return add(add(add(emb, n_embd), mul(n_layer, layer)), tied ? 0 : emb);
}

void LlamaHParams::validate(const std::string& source, const std::string& arch) const {
  const std::string at = source.empty() ? "" : source + ": ";
  // numattn's own architectures keep the llama keys under their own prefix.
  auto key = [&](const char* llama_key) {
    return arch == "llama" ? std::string(llama_key) : arch + "." + std::string(llama_key + 6);
  };
  auto at_least_1 = [&](std::int64_t v, const std::string& k, const char* field) {
    NUMATTN_CHECK(v >= 1, "{}{} ({}) = {}: must be at least 1", at, k, field, v);
  };
  at_least_1(n_vocab, "rows of token_embd.weight", "n_vocab");
  at_least_1(n_embd, key(kKeyEmbd), "n_embd");
  at_least_1(n_layer, key(kKeyBlocks), "n_layer");
  at_least_1(n_ff, key(kKeyFf), "n_ff");
  at_least_1(n_head, key(kKeyHeads), "n_head");
  at_least_1(n_head_kv, key(kKeyHeadsKv), "n_head_kv");
  at_least_1(head_dim, key(kKeyKeyLen), "head_dim");
  NUMATTN_CHECK(n_head % n_head_kv == 0,
                "{}{} = {} is not a multiple of {} = {}: grouped-query attention needs whole groups",
                at, key(kKeyHeads), n_head, key(kKeyHeadsKv), n_head_kv);
  NUMATTN_CHECK(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= head_dim,
                "{}{} (n_rot) = {}: must be even and between 0 and the head dim {}", at, key(kKeyRot),
                n_rot, head_dim);
  NUMATTN_CHECK(std::isfinite(rms_eps) && rms_eps > 0 && rms_eps < 1,
                "{}{} (rms_eps) = {}: must be finite and in (0, 1)", at, key(kKeyEps), rms_eps);
  NUMATTN_CHECK(std::isfinite(rope_base) && rope_base > 0,
                "{}{} (rope_base) = {}: must be finite and positive", at, key(kKeyRopeBase), rope_base);
  NUMATTN_CHECK(n_ctx_train >= 1 && n_ctx_train <= kMaxContextLength,
                "{}{} (n_ctx_train) = {}: must be between 1 and {}", at, key(kKeyCtx), n_ctx_train,
                kMaxContextLength);
  weight_count(false);  // every weight size fits in 64 bits (throws otherwise)
}

KvCache::KvCache(const LlamaHParams& hp, std::int64_t max_tokens)
    : KvCache(hp, max_tokens, std::vector<std::int64_t>(static_cast<std::size_t>(hp.n_layer), 0)) {}

KvCache::KvCache(const LlamaHParams& hp, std::int64_t max_tokens,
                 const std::vector<std::int64_t>& latent_width, const std::vector<std::int64_t>& value_width)
    : capacity_(max_tokens),
      latent_(latent_width),
      value_(value_width.empty() ? std::vector<std::int64_t>(latent_width.size(), 0) : value_width) {
  NUMATTN_CHECK(max_tokens > 0, "KV cache capacity must be positive, got {}", max_tokens);
  NUMATTN_CHECK(static_cast<std::int64_t>(latent_width.size()) == hp.n_layer && value_.size() == latent_.size(),
                "KV cache: {} layer widths ({} value widths) for {} layers", latent_width.size(), value_.size(),
                hp.n_layer);
  constexpr const char* what = "KV cache size";
  const std::int64_t gqa = checked_mul(checked_mul(2, hp.n_head_kv, what), hp.head_dim, what);
  std::int64_t per_token = 0;
  for (std::size_t l = 0; l < latent_.size(); ++l) {
    const std::int64_t w = latent_[l], vw = value_[l];
    NUMATTN_CHECK(w >= 0 && vw >= 0 && (w == 0 || vw == 0), "KV cache: layer {} widths {} (latent), {} (value)", l, w,
                  vw);
    per_token = checked_add(per_token, w > 0 ? w : vw > 0 ? checked_add(gqa / 2, vw, what) : gqa, what);
  }
  const std::int64_t bytes = checked_mul(checked_mul(per_token, max_tokens, what), 4, what);
  bytes_per_token_ = checked_mul(per_token, 4, what);
  const bool mla = std::any_of(latent_width.begin(), latent_width.end(), [](std::int64_t w) { return w > 0; });
  check_memory(static_cast<std::uint64_t>(bytes),
               mla ? fmt::format("a KV cache of {} positions ({} floats per position over {} layers, "
                                 "MLA latent layers included, float32)",
                                 max_tokens, per_token, hp.n_layer)
                   : fmt::format("a KV cache of {} positions ({} layers × K,V × {} KV heads × {} dims, "
                                 "float32)",
                                 max_tokens, hp.n_layer, hp.n_head_kv, hp.head_dim));
  k_.resize(static_cast<std::size_t>(hp.n_layer));
  v_.resize(static_cast<std::size_t>(hp.n_layer));
  for (std::size_t l = 0; l < latent_width.size(); ++l) {
    const std::int64_t w = latent_width[l];
    k_[l].resize(static_cast<std::size_t>(max_tokens * (w > 0 ? w : gqa / 2)));
    if (w == 0) v_[l].resize(static_cast<std::size_t>(max_tokens * (value_[l] > 0 ? value_[l] : gqa / 2)));
  }
}

AttentionMethods make_attention_methods(const std::string& spec, std::int64_t n_layer) {
  const auto specs = split_spec_list(spec);
  NUMATTN_CHECK(n_layer <= 0 || specs.size() == 1 || static_cast<std::int64_t>(specs.size()) == n_layer,
                "attention spec list has {} entries; give one for all layers or one per layer ({})",
                specs.size(), n_layer);
  AttentionMethods a;
  for (const auto& sp : specs) a.push_back(create_method(sp));
  // One instance per layer even for one spec: a method may keep per-instance state (auto.select
  // remembers its layer's choice).
  if (n_layer > 0 && a.size() == 1)
    for (std::int64_t l = 1; l < n_layer; ++l) a.push_back(create_method(specs.front()));
  return a;
}

std::string attention_spec(const AttentionMethods& methods) {
  NUMATTN_CHECK(!methods.empty(), "no attention methods");
  std::string first = methods.front()->spec(), all;
  bool same = true;
  for (std::size_t l = 0; l < methods.size(); ++l) {
    const std::string sp = methods[l]->spec();
    same = same && sp == first;
    all += (l ? ";" : "") + sp;
  }
  return same ? first : all;
}

std::vector<std::string> split_spec_list(const std::string& specs) {
  return split_specs(specs, ",;");
}

LlamaModel::LlamaModel(LlamaHParams hp, LlamaWeights w) : hp_(hp), w_(std::move(w)) {
  hp_.validate();
  check_shapes();
  mla_exec_ = MlaExec::kAbsorbed;
  rope_inv_freq_.resize(static_cast<std::size_t>(hp_.n_rot / 2));
  for (std::int64_t i = 0; i < hp_.n_rot / 2; ++i)
    rope_inv_freq_[static_cast<std::size_t>(i)] =
        std::pow(hp_.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(hp_.n_rot));
  set_attention("exact.flash");
}

void LlamaModel::check_shapes() const {
  const auto& h = hp_;  // validated: the products below cannot overflow
  auto need = [](const std::vector<float>& v, std::int64_t n, const std::string& what) {
    NUMATTN_CHECK(static_cast<std::int64_t>(v.size()) == n, "{} has {} values, expected {}", what,
                  v.size(), n);
  };
  // A matrix [out, in]: float32 of out·in values, or in place with those rows and columns.
  auto mat = [&](const std::vector<float>& v, const QuantMatrix& q, std::int64_t out,
                 std::int64_t in, const std::string& what) {
    if (q.empty()) return need(v, out * in, what);
    NUMATTN_CHECK(v.empty(), "{} is held both as float32 and in place", what);
    NUMATTN_CHECK(q.rows() == out && q.cols == in, "{} is [{}, {}] in place, expected [{}, {}]",
                  what, q.rows(), q.cols, out, in);
    NUMATTN_CHECK(w_.file != nullptr, "{} is held in place without its file", what);
  };
  mat(w_.token_embd, w_.token_embd_q, h.n_vocab, h.n_embd, "token_embd");
  need(w_.output_norm, h.n_embd, "output_norm");
  if (!w_.tied()) mat(w_.output, w_.output_q, h.n_vocab, h.n_embd, "output");
  NUMATTN_CHECK(static_cast<std::int64_t>(w_.layers.size()) == h.n_layer, "{} layers given, expected {}",
                w_.layers.size(), h.n_layer);
  for (std::size_t l = 0; l < w_.layers.size(); ++l) {
    const auto& L = w_.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    need(L.attn_norm, h.n_embd, p + "attn_norm");
    if (L.mla) {
      const MlaLayer& M = *L.mla;
      NUMATTN_CHECK(L.wqkv.empty() && L.wqkv_q.empty() && !L.v_bd,
                    "{}is an MLA layer but also holds Q/K/V weights", p);
      NUMATTN_CHECK(M.n_head == h.n_head, "{}MLA layer has {} heads, the model {}", p, M.n_head, h.n_head);
      NUMATTN_CHECK(M.rank >= 1 && M.d_v >= 1 && M.d_nope >= 0 && M.d_rope >= 0 && M.d_rope % 2 == 0 &&
                        M.d_nope + M.d_rope >= 1 && std::isfinite(M.softmax_scale) && M.softmax_scale > 0 &&
                        static_cast<std::int64_t>(M.rope_theta.size()) == M.d_rope / 2,
                    "{}MLA layer has inconsistent sizes (rank {}, d_nope {}, d_rope {}, d_v {})", p,
                    M.rank, M.d_nope, M.d_rope, M.d_v);
      need(M.w_in, M.in_rows() * h.n_embd, p + "MLA input projections");
      need(M.w_uk, M.n_head * M.d_nope * M.rank, p + "MLA W_uk");
      need(M.w_uv, M.n_head * M.d_v * M.rank, p + "MLA W_uv");
      NUMATTN_CHECK(M.uv_bd.empty() || static_cast<std::int64_t>(M.uv_bd.size()) == M.n_head,
                    "{}MLA layer has {} BD value projections for {} heads", p, M.uv_bd.size(), M.n_head);
      for (const transform::BdProjection& b : M.uv_bd)
        NUMATTN_CHECK(b.d_in() == M.rank && b.heads() == 1 && b.head_dim() == M.d_v,
                      "{}MLA BD value projection is {}→{}×{}, expected {}→1×{}", p, b.d_in(),
                      b.heads(), b.head_dim(), M.rank, M.d_v);
      mat(L.wo, L.wo_q, h.n_embd, h.n_head * M.d_v, p + "wo");
      need(L.ffn_norm, h.n_embd, p + "ffn_norm");
      mat(L.w_gate_up, L.w_gate_up_q, 2 * h.n_ff, h.n_embd, p + "w_gate_up");
      mat(L.w_down, L.w_down_q, h.n_embd, h.n_ff, p + "w_down");
      continue;
    }
    const std::int64_t vr = L.vo_rank;
    NUMATTN_CHECK(vr == 0 || (!L.v_bd && static_cast<std::int64_t>(L.vo_mix.size()) == h.n_head * vr),
                  "{}factored VO layer has {} mixing values (not Hq × R) or a BD projection", p, L.vo_mix.size());
    mat(L.wqkv, L.wqkv_q,
        vr > 0    ? (h.n_head + h.n_head_kv) * h.head_dim + vr
        : L.v_bd ? (h.n_head + h.n_head_kv) * h.head_dim
                  : h.qkv_rows(),
        h.n_embd, p + "wqkv");
    if (L.v_bd)
      NUMATTN_CHECK(L.v_bd->d_in() == h.n_embd && L.v_bd->heads() == h.n_head_kv &&
                        L.v_bd->head_dim() == h.head_dim,
                    "{}BD value projection is {}→{}×{}, expected {}→{}×{}", p, L.v_bd->d_in(),
                    L.v_bd->heads(), L.v_bd->head_dim(), h.n_embd, h.n_head_kv, h.head_dim);
    mat(L.wo, L.wo_q, h.n_embd, vr > 0 ? vr : h.n_head * h.head_dim, p + "wo");
    need(L.ffn_norm, h.n_embd, p + "ffn_norm");
    mat(L.w_gate_up, L.w_gate_up_q, 2 * h.n_ff, h.n_embd, p + "w_gate_up");
    mat(L.w_down, L.w_down_q, h.n_embd, h.n_ff, p + "w_down");
  }
}

void LlamaModel::set_activations(Activations a) {
  NUMATTN_CHECK(a == Activations::kF32 || w_.in_place(),
                "8-bit activations (q8) need weights held in their GGUF encoding (--weights gguf): "
                "this model's weights are float32 (--weights f32, the exactness reference), whose "
                "products always take float32 activations");
  act_ = a;
}

const char* weight_storage_name(WeightStorage s) {
  return s == WeightStorage::kF32 ? "f32" : "gguf";
}

WeightStorage parse_weight_storage(const std::string& name) {
  if (name == "gguf") return WeightStorage::kInPlace;
  if (name == "f32") return WeightStorage::kF32;
  throw Error(fmt::format("unknown weight storage '{}': use gguf (in place, the file's encoding) "
                          "or f32 (dequantized at load)", name));
}

LlamaModel LlamaModel::load(const std::string& path, const ExecContext& ctx, WeightStorage storage) {
  return load(std::make_shared<const GgufFile>(GgufFile::open(path)), ctx, storage);
}

LlamaModel LlamaModel::load(std::shared_ptr<const GgufFile> file, const ExecContext& ctx,
                            WeightStorage storage) {
  NUMATTN_CHECK(file != nullptr, "LlamaModel::load: no file");
  if (storage == WeightStorage::kF32) return load(*file, ctx);
  const GgufFile& f = *file;
  const LlamaHParams hp = read_hparams(f);  // shapes and types of every tensor below checked
  const std::int64_t E = hp.n_embd, D = hp.head_dim, Hkv = hp.n_head_kv;
  const bool mla = f.architecture() == "numattn-mla";
  const MlaFileDims md = mla ? read_mla_dims(f, hp) : MlaFileDims{};
  // A numattn-tensor file (model/tensor_convert.h): the kinds it rebuilds are left to it.
  const bool tens = f.architecture() == "numattn-tensor";
  const TensorFileLayout tl = tens ? read_tensor_file_layout(f, hp) : TensorFileLayout{};
  auto keep = [&](const char* kind) { return !tens || !tl.rebuilds(kind); };
  LlamaWeights w;
  auto q = [&](QuantMatrix& m, const std::string& name) { append_tensor(m, f.tensor(name)); };
  q(w.token_embd_q, "token_embd.weight");
  load_tensor(f, "output_norm.weight", w.output_norm, E, ctx);
  if (f.find_tensor("output.weight")) q(w.output_q, "output.weight");
  w.layers.resize(static_cast<std::size_t>(hp.n_layer));
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    auto& L = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    load_tensor(f, p + "attn_norm.weight", L.attn_norm, E, ctx);
    load_tensor(f, p + "ffn_norm.weight", L.ffn_norm, E, ctx);
    if (mla) {
      // MLA projections are float32 arithmetic of their own (model/mla_model.h).
      L.mla = load_mla_layer(f, l, hp, md, ctx);
    } else if (keep("attn_q")) {
      q(L.wqkv_q, p + "attn_q.weight");
      q(L.wqkv_q, p + "attn_k.weight");
      if (f.find_tensor(p + "attn_v_bd.coef")) {
        // The BD projection is float32 arithmetic of its own (transform/bd_projection.h).
        L.v_bd = load_v_bd(f, p, E, Hkv, D, ctx);
      } else {
        q(L.wqkv_q, p + "attn_v.weight");
      }
    }
    if (keep("attn_output")) q(L.wo_q, p + "attn_output.weight");
    if (keep("ffn_gate")) {
      q(L.w_gate_up_q, p + "ffn_gate.weight");
      q(L.w_gate_up_q, p + "ffn_up.weight");
      q(L.w_down_q, p + "ffn_down.weight");
    }
  }
  w.file = file;
  if (tens) return finish_tensor_model(*file, hp, std::move(w), ctx);
  return LlamaModel(hp, std::move(w));
}

LlamaHParams LlamaModel::read_hparams(const GgufFile& f) {
  const std::string arch = f.architecture();
  NUMATTN_CHECK(arch == "llama" || arch == "numattn-mla" || arch == "numattn-tensor",
                "{}: architecture '{}' is not supported; the forward pass implements 'llama' (and "
                "numattn's own 'numattn-mla', model/mla_convert.h, and 'numattn-tensor', "
                "model/tensor_convert.h)",
                f.path(), arch);
  // numattn-mla and numattn-tensor files keep the llama keys under their own prefix.
  auto K = [&](const char* llama_key) {
    return arch == "llama" ? std::string(llama_key) : arch + "." + std::string(llama_key + 6);
  };
  NUMATTN_CHECK(!f.has(K("llama.rope.scaling.type")) ||
                    f.get_string(K("llama.rope.scaling.type")) == "none",
                "{}: {} = '{}': RoPE scaling is not supported (only 'none')", f.path(), K("llama.rope.scaling.type"),
                f.get_string(K("llama.rope.scaling.type"), ""));
  LlamaHParams hp;
  hp.n_embd = f.get_int(K(kKeyEmbd));
  hp.n_layer = f.get_int(K(kKeyBlocks));
  hp.n_ff = f.get_int(K(kKeyFf));
  hp.n_head = f.get_int(K(kKeyHeads));
  hp.n_head_kv = f.get_int(K(kKeyHeadsKv), hp.n_head);
  if (f.has(K(kKeyKeyLen))) {
    hp.head_dim = f.get_int(K(kKeyKeyLen));
  } else {
    NUMATTN_CHECK(hp.n_head >= 1 && hp.n_embd % hp.n_head == 0,
                  "{}: {} = {} is not a multiple of {} = {}, and there is no {} to give the head "
                  "dim",
                  f.path(), K(kKeyEmbd), hp.n_embd, K(kKeyHeads), hp.n_head, K(kKeyKeyLen));
    hp.head_dim = hp.n_embd / hp.n_head;
  }
  NUMATTN_CHECK(f.get_int(K(kKeyValueLen), hp.head_dim) == hp.head_dim,
                "{}: {} = {} differs from the key length {}; that is not supported", f.path(),
                K(kKeyValueLen), f.get_int(K(kKeyValueLen), hp.head_dim), hp.head_dim);
  hp.n_rot = f.get_int(K(kKeyRot), hp.head_dim);
  hp.rope_base = f.get_double(K(kKeyRopeBase), 10000.0);
  hp.rms_eps = f.get_double(K(kKeyEps), 1e-5);
  hp.n_ctx_train = f.get_int(K(kKeyCtx));  // required, as in llama.cpp
  const GgufTensorInfo& emb = f.tensor("token_embd.weight");
  hp.n_vocab = emb.ne.size() >= 2 ? emb.ne[1] : 0;
  hp.validate(f.path(), arch);

  const std::int64_t E = hp.n_embd, D = hp.head_dim, F = hp.n_ff, Hq = hp.n_head,
                     Hkv = hp.n_head_kv, V = hp.n_vocab;
  NUMATTN_CHECK(f.get_int(K(kKeyVocab), V) == V, "{}: {} = {} disagrees with the {} rows of tensor "
                "token_embd.weight", f.path(), K(kKeyVocab), f.get_int(K(kKeyVocab), V), V);
  if (const GgufValue* toks = f.find("tokenizer.ggml.tokens"); toks && toks->is_array())
    NUMATTN_CHECK(static_cast<std::int64_t>(toks->array_size()) == V,
                  "{}: the vocabulary tokenizer.ggml.tokens has {} tokens, but tensor "
                  "token_embd.weight has {} rows: token ids would index past the embeddings",
                  f.path(), toks->array_size(), V);
  // Each layer needs its own tensors: a cheap bound before looking for them one by one.
  const auto n_tensors = static_cast<std::int64_t>(f.tensors().size());
  const bool tens = arch == "numattn-tensor";
  // A numattn-tensor file keeps at least the two norms and three matrices of a layer.
  const std::int64_t per_layer = tens ? 5 : kTensorsPerLayer;
  NUMATTN_CHECK(hp.n_layer <= (n_tensors - 2) / per_layer,
                "{}: {} = {}, but the file has only {} tensors ({} per layer are needed)", f.path(),
                K(kKeyBlocks), hp.n_layer, n_tensors, per_layer);
  // Its own keys and factor tensors (validated there); the per-layer tensors it drops are not checked.
  const TensorFileLayout tl = tens ? read_tensor_file_layout(f, hp) : TensorFileLayout{};
  auto stored = [&](const char* kind) { return !tens || !tl.drops(kind); };

  const bool mla = arch == "numattn-mla";
  const MlaFileDims md = mla ? read_mla_dims(f, hp) : MlaFileDims{};
  const bool bda = check_bda_file(f, arch, hp.n_layer);
  const std::string e_why = fmt::format("{} = {}", K(kKeyEmbd), E);
  const std::string hd = f.has(K(kKeyKeyLen)) ? std::string(K(kKeyKeyLen)) : "embedding_length / head_count";
  const std::string q_why = fmt::format("{}; {} = {} × head dim {} ({})", e_why, K(kKeyHeads), Hq, D, hd);
  const std::string kv_why = fmt::format("{}; {} = {} × head dim {} ({})", e_why, K(kKeyHeadsKv), Hkv, D, hd);
  const std::string f_why = fmt::format("{}; {} = {}", e_why, K(kKeyFf), F);
  check_tensor(f, "token_embd.weight", E, V, e_why);
  check_tensor(f, "output_norm.weight", E, 0, e_why);
  if (f.find_tensor("output.weight")) check_tensor(f, "output.weight", E, V, e_why + ", vocabulary of token_embd.weight");
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    check_tensor(f, p + "attn_norm.weight", E, 0, e_why);
    check_tensor(f, p + "ffn_norm.weight", E, 0, e_why);
    if (mla) {
      const std::int64_t r = md.rank, dn = md.d_nope, dr = md.d_rope, dv = md.d_v;
      const std::string m_why = fmt::format("{}; numattn-mla.mla.* r = {}, d_nope = {}, d_rope = {}, d_v = {}, "
                                            "{} heads", e_why, r, dn, dr, dv, Hq);
      check_tensor(f, p + "attn_kv_a_mqa.weight", E, r + dr, m_why);
      check_tensor(f, p + "attn_q.weight", E, Hq * (dn + dr), m_why);
      check_tensor(f, p + "attn_kv_b.weight", r, Hq * (dn + dv), m_why);
      check_tensor(f, p + "attn_output.weight", Hq * dv, E, m_why);
      read_mla_theta(f, l, hp, md);
      check_tensor(f, p + "ffn_gate.weight", E, F, f_why);
      check_tensor(f, p + "ffn_up.weight", E, F, f_why);
      check_tensor(f, p + "ffn_down.weight", F, E, f_why);
      continue;
    }
    if (stored("attn_q")) check_tensor(f, p + "attn_q.weight", E, Hq * D, q_why);
    if (stored("attn_k")) check_tensor(f, p + "attn_k.weight", E, Hkv * D, kv_why);
    if (bda && f.find_tensor(p + "attn_v_bd.coef")) {
      // A BDA layer (model/bda_model.h).
      NUMATTN_CHECK(E > D, "{}: BDA layer {} needs {} > head dim ({} <= {})", f.path(), l, K(kKeyEmbd), E, D);
      check_tensor(f, p + "attn_v_bd.coef", Hkv * D, E - D, kv_why + " (BD coefficients)");
      const auto nd = static_cast<std::int64_t>(read_bda_layer(f, p, E, Hkv).dense.size());
      if (nd > 0) check_tensor(f, p + "attn_v_bd.top", nd * D, D, kv_why + " (BD dense heads)");
    } else if (bda && (f.has(p + "attn_v_bd.perm") || f.has(p + "attn_v_bd.dense"))) {
      throw Error(fmt::format("{}: {} is set, but tensor {}attn_v_bd.coef, the layer's BD coefficients, is missing",
                              f.path(), f.has(p + "attn_v_bd.perm") ? p + "attn_v_bd.perm" : p + "attn_v_bd.dense", p));
    } else if (stored("attn_v")) {
      check_tensor(f, p + "attn_v.weight", E, Hkv * D, kv_why);
    }
    if (stored("attn_output")) check_tensor(f, p + "attn_output.weight", Hq * D, E, q_why);
    if (stored("ffn_gate")) {
      check_tensor(f, p + "ffn_gate.weight", E, F, f_why);
      check_tensor(f, p + "ffn_up.weight", E, F, f_why);
      check_tensor(f, p + "ffn_down.weight", F, E, f_why);
    }
  }
  return hp;
}

LlamaModel LlamaModel::load(const GgufFile& f, const ExecContext& ctx) {
  const LlamaHParams hp = read_hparams(f);
  const bool tied = f.find_tensor("output.weight") == nullptr;
  // Every size below is a checked tensor's: weight_count(tied) bounds them all.
  check_memory(static_cast<std::uint64_t>(checked_mul(hp.weight_count(tied), 4, "model weight bytes")),
               fmt::format("loading {} ({} float32 weights)", f.path(), hp.weight_count(tied)));

  LlamaWeights w;
  const std::int64_t E = hp.n_embd, D = hp.head_dim, F = hp.n_ff, Hq = hp.n_head, Hkv = hp.n_head_kv;
  const bool mla = f.architecture() == "numattn-mla";
  const MlaFileDims md = mla ? read_mla_dims(f, hp) : MlaFileDims{};
  const bool tens = f.architecture() == "numattn-tensor";
  const TensorFileLayout tl = tens ? read_tensor_file_layout(f, hp) : TensorFileLayout{};
  auto keep = [&](const char* kind) { return !tens || !tl.rebuilds(kind); };
  load_tensor(f, "token_embd.weight", w.token_embd, hp.n_vocab * E, ctx);
  load_tensor(f, "output_norm.weight", w.output_norm, E, ctx);
  if (!tied) load_tensor(f, "output.weight", w.output, hp.n_vocab * E, ctx);
  w.layers.resize(static_cast<std::size_t>(hp.n_layer));
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    auto& L = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    load_tensor(f, p + "attn_norm.weight", L.attn_norm, E, ctx);
    load_tensor(f, p + "ffn_norm.weight", L.ffn_norm, E, ctx);
    if (mla) {
      L.mla = load_mla_layer(f, l, hp, md, ctx);
      load_tensor(f, p + "attn_output.weight", L.wo, E * Hq * md.d_v, ctx);
      L.w_gate_up.resize(static_cast<std::size_t>(2 * F * E));
      load_tensor(f, p + "ffn_gate.weight", L.w_gate_up.data(), F * E, ctx);
      load_tensor(f, p + "ffn_up.weight", L.w_gate_up.data() + F * E, F * E, ctx);
      load_tensor(f, p + "ffn_down.weight", L.w_down, E * F, ctx);
      continue;
    }
    if (keep("attn_q")) {
      // A BDA file (model/bda_model.h) stores the VO pair's fused projection instead of attn_v.
      const bool bd = f.find_tensor(p + "attn_v_bd.coef") != nullptr;
      L.wqkv.resize(static_cast<std::size_t>((bd ? Hq + Hkv : Hq + 2 * Hkv) * D * E));
      float* q = L.wqkv.data();
      float* k = q + Hq * D * E;
      load_tensor(f, p + "attn_q.weight", q, Hq * D * E, ctx);
      load_tensor(f, p + "attn_k.weight", k, Hkv * D * E, ctx);
      if (bd) {
        L.v_bd = load_v_bd(f, p, E, Hkv, D, ctx);
      } else {
        load_tensor(f, p + "attn_v.weight", k + Hkv * D * E, Hkv * D * E, ctx);
      }
      load_tensor(f, p + "attn_output.weight", L.wo, E * Hq * D, ctx);
    }
    if (keep("ffn_gate")) {
      L.w_gate_up.resize(static_cast<std::size_t>(2 * F * E));
      load_tensor(f, p + "ffn_gate.weight", L.w_gate_up.data(), F * E, ctx);
      load_tensor(f, p + "ffn_up.weight", L.w_gate_up.data() + F * E, F * E, ctx);
      load_tensor(f, p + "ffn_down.weight", L.w_down, E * F, ctx);
    }
  }
  if (tens) return finish_tensor_model(f, hp, std::move(w), ctx);
  return LlamaModel(hp, std::move(w));
}

const float* LlamaModel::output_matrix() const {
  if (!w_.output.empty()) return w_.output.data();
  return w_.output_q.empty() && !w_.token_embd.empty() ? w_.token_embd.data() : nullptr;
}

std::uint64_t LlamaModel::weight_bytes_per_token(bool with_output) const {
  auto bytes = [](const std::vector<float>& v, const QuantMatrix& q) {
    return q.empty() ? 4 * static_cast<std::uint64_t>(v.size()) : q.bytes();
  };
  std::uint64_t b = 0;
  for (const LlamaLayer& L : w_.layers) {
    b += bytes(L.wqkv, L.wqkv_q) + bytes(L.wo, L.wo_q) + bytes(L.w_gate_up, L.w_gate_up_q) +
         bytes(L.w_down, L.w_down_q);
    if (L.v_bd) b += 4 * static_cast<std::uint64_t>(L.v_bd->weight_params());
    if (L.mla) b += 4 * static_cast<std::uint64_t>(L.mla->weights(hp_.n_embd));
    b += 4 * static_cast<std::uint64_t>(L.vo_mix.size());
  }
  if (with_output)
    b += w_.tied() ? bytes(w_.token_embd, w_.token_embd_q) : bytes(w_.output, w_.output_q);
  return b;
}

KvCache LlamaModel::make_cache(std::int64_t max_tokens) const {
  std::vector<std::int64_t> lat, val;
  for (const LlamaLayer& L : w_.layers) {
    lat.push_back(L.mla ? L.mla->cache_width() : 0);
    val.push_back(L.mla ? 0 : L.vo_rank);
  }
  return KvCache(hp_, max_tokens, lat, val);
}

std::int64_t LlamaModel::kv_bytes_per_token() const {
  std::int64_t b = 0;
  const std::int64_t kv = hp_.n_head_kv * hp_.head_dim;
  for (const LlamaLayer& L : w_.layers)
    b += 4 * (L.mla ? L.mla->cache_width() : L.vo_rank > 0 ? kv + L.vo_rank : 2 * kv);
  return b;
}

bool LlamaModel::has_mla() const {
  return std::any_of(w_.layers.begin(), w_.layers.end(), [](const LlamaLayer& L) { return L.mla != nullptr; });
}

std::int64_t LlamaModel::body_weights() const {
  const std::int64_t E = hp_.n_embd;
  std::int64_t b = 0;
  const std::int64_t qk = (hp_.n_head + hp_.n_head_kv) * hp_.head_dim * E;
  for (const LlamaLayer& L : w_.layers) {
    const std::int64_t vr = L.vo_rank;
    b += L.mla     ? L.mla->weights(E) + E * hp_.n_head * L.mla->d_v + 3 * hp_.n_ff * E
         : vr > 0 ? qk + vr * (2 * E + hp_.n_head) + 3 * hp_.n_ff * E
                   : hp_.layer_weights();
  }
  return b;
}

void LlamaModel::set_attention(const std::string& spec) {
  attn_ = make_attention_methods(spec, hp_.n_layer);
}

std::string LlamaModel::attention_spec() const { return numattn::attention_spec(attn_); }

std::vector<float> LlamaModel::forward(const std::vector<std::int32_t>& tokens, KvCache& cache,
                                       const ExecContext& ctx, const ForwardOptions& opt) const {
  const auto& h = hp_;
  const std::int64_t N = static_cast<std::int64_t>(tokens.size());
  NUMATTN_CHECK(N > 0, "forward needs at least one token");
  NUMATTN_CHECK(static_cast<std::int64_t>(cache.k_.size()) == h.n_layer &&
                    static_cast<std::int64_t>(cache.latent_.size()) == h.n_layer,
                "KV cache was made for another model");
  for (std::int64_t l = 0; l < h.n_layer; ++l) {
    const auto& M = w_.layers[static_cast<std::size_t>(l)].mla;
    NUMATTN_CHECK(cache.latent_[static_cast<std::size_t>(l)] == (M ? M->cache_width() : 0),
                  "KV cache was made for another model (layer {} is {} here, {} in the cache)", l,
                  M ? "MLA" : "GQA", cache.latent_[static_cast<std::size_t>(l)] > 0 ? "MLA" : "GQA");
    NUMATTN_CHECK(cache.value_[static_cast<std::size_t>(l)] == w_.layers[static_cast<std::size_t>(l)].vo_rank,
                  "KV cache was made for another model (layer {}: value width {} here, {} in the cache)", l,
                  w_.layers[static_cast<std::size_t>(l)].vo_rank, cache.value_[static_cast<std::size_t>(l)]);
  }
  const std::int64_t p0 = cache.n_past_;
  NUMATTN_CHECK(p0 + N <= cache.capacity_, "KV cache holds {} positions; {} + {} do not fit",
                cache.capacity_, p0, N);
  NUMATTN_CHECK(opt.logits_begin >= 0 && opt.logits_begin <= N, "logits_begin {} outside [0, {}]",
                opt.logits_begin, N);
  for (std::int32_t t : tokens)
    NUMATTN_CHECK(t >= 0 && t < h.n_vocab, "token id {} outside the vocabulary of {}", t, h.n_vocab);
  const AttentionMethods& attn = opt.attention.empty() ? attn_ : opt.attention;
  NUMATTN_CHECK(static_cast<std::int64_t>(attn.size()) == h.n_layer,
                "forward: {} attention methods given for {} layers (make_attention_methods)",
                attn.size(), h.n_layer);
  const std::int64_t E = h.n_embd, D = h.head_dim, Hq = h.n_head, Hkv = h.n_head_kv, F = h.n_ff;
  // Row stride of the qkv buffer: a factored VO layer's rows are Q|K|U ((Hq+Hkv)·D + R).
  std::int64_t R = h.qkv_rows(), vo_max = 0;
  for (const LlamaLayer& L : w_.layers) vo_max = std::max(vo_max, L.vo_rank);
  R = std::max(R, (Hq + Hkv) * D + vo_max);
  const std::int64_t half = h.n_rot / 2;
  const std::int64_t n_out = N - opt.logits_begin;
  // MLA layers: the widest of their per-token buffers (projections, query rows, attention
  // output, latent output), and of the W_o input.
  const MlaExec mexec = mla_exec_;
  std::int64_t m_proj = 0, m_q = 0, m_lat = 0, att_w = Hq * D;
  for (const LlamaLayer& L : w_.layers)
    if (L.mla) {
      m_proj = std::max(m_proj, L.mla->in_rows());
      m_q = std::max(m_q, mla_query_width(*L.mla, mexec));
      m_lat = std::max(m_lat, mla_out_width(*L.mla, mexec));
      att_w = std::max(att_w, Hq * L.mla->d_v);
    }
  att_w = std::max(att_w, Hq * vo_max);
  {
    // Activations (x, xn, qkv, att, gate|up, act, captures, cos|sin, MLA buffers) and the logits.
    constexpr const char* what = "forward activation size";
    const std::int64_t per_token = 2 * E + R + att_w + 3 * F + 2 * half + m_proj + m_q + m_lat + vo_max +
                                   (opt.capture ? (Hq + Hkv) * D : 0);
    const std::int64_t floats = checked_add(checked_mul(N, per_token, what),
                                            checked_mul(n_out, h.n_vocab, what), what);
    check_memory(static_cast<std::uint64_t>(checked_mul(floats, 4, what)),
                 fmt::format("a forward pass of {} tokens ({} rows of logits)", N, n_out));
  }
  PhaseTimer timer{opt.profile};

  std::vector<float> x(static_cast<std::size_t>(N * E)), xn(x.size());
  std::vector<float> qkv(static_cast<std::size_t>(N * R)), att(static_cast<std::size_t>(N * att_w));
  std::vector<float> mproj(static_cast<std::size_t>(N * m_proj)), mq(static_cast<std::size_t>(N * m_q)),
      mlat(static_cast<std::size_t>(N * m_lat)), vz(static_cast<std::size_t>(N * vo_max));
  std::vector<float> gu(static_cast<std::size_t>(N * 2 * F)), act(static_cast<std::size_t>(N * F));
  std::vector<float> qpre, kpre;
  if (opt.capture) {
    qpre.resize(static_cast<std::size_t>(N * Hq * D));
    kpre.resize(static_cast<std::size_t>(N * Hkv * D));
  }
  for (std::int64_t t = 0; t < N; ++t) {
    const std::int64_t id = tokens[static_cast<std::size_t>(t)];
    if (w_.token_embd_q.empty()) {
      std::copy_n(w_.token_embd.data() + id * E, E, x.data() + t * E);
    } else {
      w_.token_embd_q.dequantize_rows(id, id + 1, x.data() + t * E);
    }
  }
  // cos/sin of every (token, frequency) of this call, shared by all layers.
  std::vector<float> cs(static_cast<std::size_t>(N * half)), sn(cs.size());
  for (std::int64_t t = 0; t < N; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      const double th = static_cast<double>(p0 + t) * rope_inv_freq_[static_cast<std::size_t>(i)];
      cs[static_cast<std::size_t>(t * half + i)] = static_cast<float>(std::cos(th));
      sn[static_cast<std::size_t>(t * half + i)] = static_cast<float>(std::sin(th));
    }
  timer.lap(&ForwardProfile::embed);

  // Work on the token rows [t0, t1). Two shapes of parallelism use these:
  // - prefill (many tokens): each thread owns a contiguous block of tokens and runs everything
  //   but attention for it, GEMMs included (single-threaded BLAS on its rows), so a layer has
  //   only two synchronisation points: before attention (which needs every token's K/V) and
  //   after it;
  // - decode (few tokens): one thread runs the elementwise work and the GEMMs are split over
  //   output features instead (linear()).
  const int nt = ctx.num_threads();
  const bool by_tokens = nt > 1 && N >= 16 * nt;
  const ExecContext gemm_ctx = by_tokens ? ExecContext{1} : ctx;
  auto gemm = [&](const float* xr, std::int64_t rows, std::int64_t in, const std::vector<float>& wf,
                  const QuantMatrix& wq, std::int64_t out, float* y, bool acc) {
    linear(gemm_ctx, act_, xr, rows, in, wf, wq, out, y, acc);
  };
  // The timer only follows the first thread: other threads do the same work in parallel.
  auto lap = [&](bool main, double ForwardProfile::*slot) {
    if (main) timer.lap(slot);
  };

  auto pre = [&](std::int64_t l, std::int64_t t0, std::int64_t t1, bool main) {
    const LlamaLayer& L = w_.layers[static_cast<std::size_t>(l)];
    const std::int64_t n = t1 - t0;
    rms_norm_rows(x.data() + t0 * E, L.attn_norm.data(), xn.data() + t0 * E, n, E, h.rms_eps);
    lap(main, &ForwardProfile::norm);
    if (L.mla) {
      const MlaLayer& M = *L.mla;
      const std::int64_t cw = M.cache_width();
      mla_project(M, mexec, xn.data() + t0 * E, n, E, p0 + t0,
                  cache.k_[static_cast<std::size_t>(l)].data() + (p0 + t0) * cw,
                  mq.data() + t0 * mla_query_width(M, mexec), mproj.data() + t0 * M.in_rows(), gemm_ctx);
      lap(main, &ForwardProfile::qkv_gemm);
      return;
    }
    const std::int64_t vr = L.vo_rank;  // factored VO: the value row is U = V'·xn (R wide)
    if (!L.v_bd) {
      linear(gemm_ctx, act_, xn.data() + t0 * E, n, E, L.wqkv, L.wqkv_q, vr > 0 ? (Hq + Hkv) * D + vr : h.qkv_rows(),
             qkv.data() + t0 * R, false, R);
    } else {
      // BDA: Q|K through the stacked GEMM, V' through the fused BD projection, both written
      // into their slots of the same qkv rows.
      linear(gemm_ctx, act_, xn.data() + t0 * E, n, E, L.wqkv, L.wqkv_q, (Hq + Hkv) * D,
             qkv.data() + t0 * R, false, R);
      L.v_bd->project(xn.data() + t0 * E, n, E, qkv.data() + t0 * R + (Hq + Hkv) * D, R,
                      transform::InputOrder::kOriginal, ExecContext{1});
    }
    lap(main, &ForwardProfile::qkv_gemm);
    float* kc = cache.k_[static_cast<std::size_t>(l)].data();
    float* vc = cache.v_[static_cast<std::size_t>(l)].data();
    for (std::int64_t t = t0; t < t1; ++t) {
      float* row = qkv.data() + t * R;
      if (opt.capture) {
        std::copy_n(row, Hq * D, qpre.data() + t * Hq * D);
        std::copy_n(row + Hq * D, Hkv * D, kpre.data() + t * Hkv * D);
      }
      // RoPE, adjacent pairs, on the Q and K heads of the token, in place.
      const float* c = cs.data() + t * half;
      const float* s = sn.data() + t * half;
      for (std::int64_t hh = 0; hh < Hq + Hkv; ++hh) {
        float* v = row + hh * D;
        for (std::int64_t i = 0; i < half; ++i) {
          const float a = v[2 * i], b = v[2 * i + 1];
          v[2 * i] = a * c[i] - b * s[i];
          v[2 * i + 1] = a * s[i] + b * c[i];
        }
      }
      // Append the token's key and value to the cache ([pos, Hkv, D] rows).
      std::copy_n(row + Hq * D, Hkv * D, kc + (p0 + t) * Hkv * D);
      const std::int64_t vw = vr > 0 ? vr : Hkv * D;
      std::copy_n(row + (Hq + Hkv) * D, vw, vc + (p0 + t) * vw);
    }
    lap(main, &ForwardProfile::rope);
  };
  auto post = [&](std::int64_t l, std::int64_t t0, std::int64_t t1, bool main) {
    const LlamaLayer& L = w_.layers[static_cast<std::size_t>(l)];
    const std::int64_t n = t1 - t0;
    const std::int64_t vr = L.vo_rank;
    const std::int64_t aw = L.mla ? Hq * L.mla->d_v : vr > 0 ? Hq * vr : Hq * D;
    if (L.mla && mexec == MlaExec::kAbsorbed) {
      mla_up_values(*L.mla, mlat.data() + t0 * mla_out_width(*L.mla, mexec), n, att.data() + t0 * aw);
      lap(main, &ForwardProfile::attention);
    }
    if (vr > 0) {
      // Factored VO: z = Σ_h μ_h ⊙ o_h (Hq·R per token), then O'·z (E·R) instead of W_o.
      for (std::int64_t t = t0; t < t1; ++t) {
        float* z = vz.data() + t * vr;
        std::fill_n(z, vr, 0.f);
        for (std::int64_t hh = 0; hh < Hq; ++hh) {
          const float* o = att.data() + t * aw + hh * vr;
          const float* mu = L.vo_mix.data() + hh * vr;
          for (std::int64_t i = 0; i < vr; ++i) z[i] += mu[i] * o[i];
        }
      }
      gemm(vz.data() + t0 * vr, n, vr, L.wo, L.wo_q, E, x.data() + t0 * E, true);
    } else {
      gemm(att.data() + t0 * aw, n, aw, L.wo, L.wo_q, E, x.data() + t0 * E, true);
    }
    lap(main, &ForwardProfile::o_gemm);
    rms_norm_rows(x.data() + t0 * E, L.ffn_norm.data(), xn.data() + t0 * E, n, E, h.rms_eps);
    lap(main, &ForwardProfile::norm);
    gemm(xn.data() + t0 * E, n, E, L.w_gate_up, L.w_gate_up_q, 2 * F, gu.data() + t0 * 2 * F, false);
    lap(main, &ForwardProfile::ffn_gemm);
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* g = gu.data() + t * 2 * F;
      const float* u = g + F;
      float* a = act.data() + t * F;
      simd::silu_mul(g, u, a, F);
    }
    lap(main, &ForwardProfile::ffn_act);
    gemm(act.data() + t0 * F, n, F, L.w_down, L.w_down_q, E, x.data() + t0 * E, true);
    lap(main, &ForwardProfile::ffn_gemm);
  };
  // Runs `f(t0, t1, main)` on each thread's token block (or once on all tokens), and books the
  // time the first thread then waits for the others as synchronisation.
  auto region = [&](const std::function<void(std::int64_t, std::int64_t, bool)>& f) {
    if (!by_tokens) {
      f(0, N, true);
      return;
    }
    parallel_for(ctx, nt, [&](std::int64_t p) {
      f(N * p / nt, N * (p + 1) / nt, p == 0);
    });
    timer.lap(&ForwardProfile::sync);
  };

  region([&](std::int64_t t0, std::int64_t t1, bool main) { pre(0, t0, t1, main); });
  for (std::int64_t l = 0; l < h.n_layer; ++l) {
    const std::int64_t nk = p0 + N;
    float* kc = cache.k_[static_cast<std::size_t>(l)].data();
    float* vc = cache.v_[static_cast<std::size_t>(l)].data();
    const LlamaLayer& Ll = w_.layers[static_cast<std::size_t>(l)];
    if (Ll.mla) {
      if (opt.capture) {
        QkvCapture c;
        c.layer = static_cast<int>(l);
        c.pos0 = p0;
        c.xn = xn.data();
        opt.capture(c);
      }
      // Naive execution rebuilds keys and values of all nk tokens: worth the team even in decode.
      const bool team = by_tokens || mexec == MlaExec::kNaive;
      mla_attend(*Ll.mla, mexec, mq.data(), N, kc, nk, *attn[static_cast<std::size_t>(l)],
                 team ? ctx : ExecContext{1}, mexec == MlaExec::kAbsorbed ? mlat.data() : att.data());
      timer.lap(&ForwardProfile::attention);
      region([&](std::int64_t t0, std::int64_t t1, bool main) {
        post(l, t0, t1, main);
        if (l + 1 < h.n_layer) pre(l + 1, t0, t1, main);
      });
      continue;
    }
    const std::int64_t vr = Ll.vo_rank, vw = vr > 0 ? vr : D;
    if (opt.capture && vr > 0) {
      // A factored VO layer has no per-head values of width D: the capture carries xn only.
      QkvCapture c;
      c.layer = static_cast<int>(l);
      c.pos0 = p0;
      c.xn = xn.data();
      opt.capture(c);
    } else if (opt.capture) {
      QkvCapture c;
      c.layer = static_cast<int>(l);
      c.pos0 = p0;
      c.xn = xn.data();
      c.q_pre = TensorView<const float>(qpre.data(), {1, Hq, N, D}, {N * Hq * D, D, Hq * D, 1});
      c.k_pre = TensorView<const float>(kpre.data(), {1, Hkv, N, D}, {N * Hkv * D, D, Hkv * D, 1});
      c.q_post = TensorView<const float>(qkv.data(), {1, Hq, N, D}, {N * R, D, R, 1});
      c.k_post = TensorView<const float>(qkv.data() + Hq * D, {1, Hkv, N, D}, {N * R, D, R, 1});
      c.v = TensorView<const float>(qkv.data() + (Hq + Hkv) * D, {1, Hkv, N, D}, {N * R, D, R, 1});
      opt.capture(c);
    }
    AttentionProblem p;
    p.q = TensorView<const float>(qkv.data(), {1, Hq, N, D}, {N * R, D, R, 1});
    p.k = TensorView<const float>(kc, {1, Hkv, nk, D}, {nk * Hkv * D, D, Hkv * D, 1});
    // Factored VO: every KV head reads the one shared R-wide value row (head stride 0).
    p.v = vr > 0 ? TensorView<const float>(vc, {1, Hkv, nk, vr}, {nk * vr, 0, vr, 1})
                 : TensorView<const float>(vc, {1, Hkv, nk, D}, {nk * Hkv * D, D, Hkv * D, 1});
    p.out = TensorView<float>(att.data(), {1, Hq, N, vw}, {N * Hq * vw, vw, Hq * vw, 1});
    p.causal = Causal::kBottomRight;
    // A decode step's attention gets the team only from ~1 MFLOP of exact attention on (Nk ≈
    // 430 for SmolLM2), where reading the KV cache with every core pays for waking them; below,
    // a method that forks per head would spend more on the fork than on the work. exact.flash
    // applies the same bound itself.
    const double att_flops = 2.0 * static_cast<double>(Hq * N * nk * (D + vw));
    attn[static_cast<std::size_t>(l)]->run(p, by_tokens || att_flops >= 1e6 ? ctx : ExecContext{1});
    timer.lap(&ForwardProfile::attention);
    region([&](std::int64_t t0, std::int64_t t1, bool main) {
      post(l, t0, t1, main);
      if (l + 1 < h.n_layer) pre(l + 1, t0, t1, main);
    });
  }
  std::vector<float> logits(static_cast<std::size_t>(n_out * h.n_vocab));
  if (n_out > 0) {
    rms_norm_rows(x.data() + opt.logits_begin * E, w_.output_norm.data(), xn.data(), n_out, E,
                  h.rms_eps);
    timer.lap(&ForwardProfile::norm);
    // Split over the vocabulary: each thread streams its half of the output matrix once.
    if (w_.tied()) {
      linear(ctx, act_, xn.data(), n_out, E, w_.token_embd, w_.token_embd_q, h.n_vocab, logits.data(), false);
    } else {
      linear(ctx, act_, xn.data(), n_out, E, w_.output, w_.output_q, h.n_vocab, logits.data(), false);
    }
    timer.lap(&ForwardProfile::output_gemm);
  }
  // float32 weights are finite (checked at load), so a NaN/Inf here comes from the attention
  // method, an overflow, or (in place, where load scans nothing) a non-finite weight; a perplexity or a greedy choice made from it would be garbage that
  // looks like a result. One pass over the logits, small next to the GEMM that made them.
  const auto bad = std::find_if(logits.begin(), logits.end(), [](float v) { return !std::isfinite(v); });
  if (bad != logits.end()) {
    const auto i = static_cast<std::int64_t>(bad - logits.begin());
    const std::int64_t row = opt.logits_begin + i / h.n_vocab;
    throw Error(fmt::format(
        "non-finite logit {} at position {} (token {} of this call), vocabulary index {}, with "
        "attention {}: the forward pass overflowed, the attention method returned a "
        "non-finite value, or a weight is not finite (--weights f32 scans them at load)",
        *bad, p0 + row, row, i % h.n_vocab, numattn::attention_spec(attn)));
  }
  cache.n_past_ = p0 + N;  // only now: after a throw the cache still ends where it did
  return logits;
}

void check_generation(std::int64_t max_tokens, std::int64_t prompt_tokens, const LlamaHParams* hp) {
  NUMATTN_CHECK_OPTION(max_tokens >= 1, "max_tokens", "must be at least 1, got {}", max_tokens);
  if (hp == nullptr || prompt_tokens < 0) return;
  NUMATTN_CHECK_OPTION(prompt_tokens >= 1, "prompt", "is empty (it encodes to no token)");
  const std::int64_t n_ctx = hp->n_ctx_train;
  NUMATTN_CHECK_OPTION(prompt_tokens < n_ctx, "prompt",
                       "has {} tokens, but the model's trained context ({}) is {} tokens and "
                       "generation needs room for at least one more",
                       prompt_tokens, kKeyCtx, n_ctx);
  NUMATTN_CHECK_OPTION(max_tokens <= n_ctx - prompt_tokens, "max_tokens",
                       "{} new tokens after a prompt of {} exceed the model's trained context ({}) "
                       "of {} tokens; at most {} fit",
                       max_tokens, prompt_tokens, kKeyCtx, n_ctx, n_ctx - prompt_tokens);
}

std::vector<std::int32_t> generate_greedy(const LlamaModel& m, const std::vector<std::int32_t>& prompt,
                                          std::int64_t max_tokens, std::int32_t eos_id,
                                          const ExecContext& ctx,
                                          const std::function<void(std::int32_t)>& on_token,
                                          ForwardProfile* profile) {
  check_generation(max_tokens, static_cast<std::int64_t>(prompt.size()), &m.hparams());
  std::vector<std::int32_t> out;
  KvCache cache = m.make_cache(static_cast<std::int64_t>(prompt.size()) + max_tokens);
  const std::int64_t V = m.hparams().n_vocab;
  ForwardOptions opt;
  opt.logits_begin = static_cast<std::int64_t>(prompt.size()) - 1;
  opt.profile = profile;
  std::vector<float> logits = m.forward(prompt, cache, ctx, opt);
  for (std::int64_t i = 0; i < max_tokens; ++i) {
    const auto best = static_cast<std::int32_t>(
        std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
    out.push_back(best);
    if (on_token) on_token(best);
    if (best == eos_id || i + 1 == max_tokens) break;
    ForwardOptions one;
    one.profile = profile;
    logits = m.forward({best}, cache, ctx, one);
  }
  return out;
}

}  // namespace numattn
