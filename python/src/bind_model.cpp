// numattn.Model: a GGUF Llama model (model/llama.h) with its tokenizer: perplexity, Q/K/V
// capture and greedy generation, each a long loop that releases the GIL and stops on Ctrl-C
// between chunks, layers or tokens.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <variant>

#include "common.h"
#include "numattn/core/cancel.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/model/ppl.h"
#include "numattn/model/text.h"
#include "numattn/model/tokenizer.h"
#include "numattn/model/transform_model.h"
#include "numattn/transform/pipeline.h"

namespace numattn::py {

namespace {

using TextArg = std::variant<std::string, std::vector<std::int32_t>>;

class PyModel {
 public:
  // What a loaded model is made of (a PyModel itself holds a mutex and cannot move).
  struct Parts {
    std::string path, name;
    LlamaModel model;
    Tokenizer tok;
    std::string transform;  ///< canonical pipeline applied at load ("" none)
  };
  static Parts load_parts(const std::string& path_arg, std::optional<int> threads, const std::string& xform) {
    return entry("numattn.Model.load", [&] {
      const ExecContext ctx{threads.value_or(0)};
      ctx.num_threads();
      // The pipeline is parsed (and refused) before the file is opened, as the CLI does.
      const transform::TransformPipeline xp = transform::parse_transforms(xform);
      const std::string path = resolve_model_path(path_arg);
      doing("loading the model " + path);
      nb::gil_scoped_release release;
      GgufFile file = GgufFile::open(path);
      check_transforms(xp, LlamaModel::read_hparams(file), file.architecture() == "numattn-mla");
      Tokenizer tok = Tokenizer::from_gguf(file);
      std::string name = file.get_string("general.name", "");
      LlamaModel model = LlamaModel::load(file, ctx);
      if (!xp.empty()) {
        doing("applying the model transforms " + xp.canonical());
        apply_transforms(model, tok, xp, ctx);
      }
      return Parts{path, std::move(name), std::move(model), std::move(tok), xp.canonical()};
    });
  }
  static std::unique_ptr<PyModel> load(const std::string& path_arg, std::optional<int> threads,
                                       const std::string& xform) {
    return std::make_unique<PyModel>(load_parts(path_arg, threads, xform));
  }
  explicit PyModel(Parts&& p)
      : path_(std::move(p.path)), name_(std::move(p.name)), model_(std::move(p.model)), tok_(std::move(p.tok)),
        transform_(std::move(p.transform)) {}

  const std::string& path() const { return path_; }
  const std::string& transform() const { return transform_; }
  const std::string& name() const { return name_; }
  const LlamaModel& model() const { return model_; }
  const Tokenizer& tokenizer() const { return tok_; }

  // A str is tokenized as `numattn ppl` and `numattn capture` do (model/text.h).
  std::vector<std::int32_t> text_tokens(const TextArg& text) const {
    if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&text)) {
      for (std::size_t i = 0; i < ids->size(); ++i)
        NUMATTN_CHECK((*ids)[i] >= 0 && (*ids)[i] < tok_.vocab_size(),
                      "text: token id {} at position {} is outside the vocabulary [0, {})", (*ids)[i], i,
                      tok_.vocab_size());
      return *ids;
    }
    return encode_text(tok_, std::get<std::string>(text));
  }

  nb::dict ppl(const TextArg& text, std::int64_t ctx_len, std::int64_t chunks, const std::string& attn,
               const std::optional<std::string>& baseline, const std::string& bos, bool allow_long_ctx,
               std::optional<int> threads) const {
    const ExecContext ctx{threads.value_or(0)};
    ctx.num_threads();
    PplOptions po;
    po.ctx = ctx_len;
    po.chunks = chunks;
    po.attn = attn;
    po.baseline = baseline.value_or("");
    po.bos = parse_bos_mode(bos);
    po.allow_long_ctx = allow_long_ctx;
    const CancelToken cancel(check_interrupt);
    po.cancel = &cancel;
    check_ppl_options(po, &model_.hparams());
    PplResult r;
    {
      nb::gil_scoped_release release;
      const std::vector<std::int32_t> tokens = text_tokens(text);
      check_ppl_options(po, &model_.hparams(), static_cast<std::int64_t>(tokens.size()));
      doing(fmt::format("evaluating perplexity on {} tokens with ctx={}", tokens.size(), ctx_len));
      r = evaluate_perplexity(model_, tokens, tok_.bos_id(), tok_.add_bos(), po, ctx);
    }
    nb::dict d;
    d["attn"] = r.attn_spec;
    d["ctx"] = r.ctx;
    d["chunks"] = r.chunks;
    d["tokens_scored"] = r.tokens_scored;
    d["tokens_processed"] = r.tokens_processed;
    d["nll_mean"] = r.nll_mean;
    d["ppl"] = r.ppl;
    d["ppl_stderr"] = r.ppl_stderr;
    d["seconds"] = r.seconds;
    d["tokens_per_s"] = r.tokens_per_s;
    if (r.has_baseline) {
      d["baseline"] = r.baseline_spec;
      d["ppl_baseline"] = r.ppl_baseline;
      d["kld"] = r.kld_mean;
      d["kld_p99"] = r.kld_p99;
      d["top1_agreement"] = r.top1_agreement;
    }
    NpArray<double> nll = new_array<double>({static_cast<std::int64_t>(r.nll.size())});
    std::copy(r.nll.begin(), r.nll.end(), nll.data());
    d["nll"] = nll;
    return d;
  }

  nb::dict capture(const TextArg& text, std::int64_t tokens, const std::variant<std::vector<std::int64_t>, std::string>& layers_arg,
                   std::int64_t offset, bool pre_rope, const std::string& bos, std::optional<int> threads) const {
    const ExecContext ctx{threads.value_or(0)};
    ctx.num_threads();
    const ModelHParams& hp = model_.hparams();
    check_window_length(hp, tokens);
    const BosMode mode = parse_bos_mode(bos);
    std::vector<std::int64_t> layers;
    if (const auto* s = std::get_if<std::string>(&layers_arg)) {
      NUMATTN_CHECK_OPTION(*s == "all", "layers", "'{}': give a list of layer indices or 'all'", *s);
      layers = all_indices(hp.n_layer);
    } else {
      layers = checked_index_list(std::get<std::vector<std::int64_t>>(layers_arg), "layers", hp.n_layer, "layer",
                                  "n_layer");
    }
    const std::int64_t Hq = hp.n_head, Hkv = hp.n_head_kv, D = hp.head_dim, N = tokens;
    std::vector<std::int32_t> window;
    {
      nb::gil_scoped_release release;
      window = cut_text_window(tok_, text_tokens(text), offset, N, mode).tokens;
    }
    doing(fmt::format("capturing q, k, v of {} layer(s) over {} tokens", layers.size(), N));
    // Outputs allocated up front (with the GIL), all of them reserved first; the capture
    // callback fills them.
    reserve_array("the captured q, k, v (float32) of every layer asked for",
                  {static_cast<std::int64_t>(layers.size()), Hq + 2 * Hkv, N, D}, sizeof(float));
    std::vector<int> slot(static_cast<std::size_t>(hp.n_layer), -1);
    std::vector<std::array<float*, 3>> dst;
    nb::dict out;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      slot[static_cast<std::size_t>(layers[i])] = static_cast<int>(i);
      NpArray<float> q = new_array<float>({Hq, N, D}), k = new_array<float>({Hkv, N, D}),
                     v = new_array<float>({Hkv, N, D});
      dst.push_back({q.data(), k.data(), v.data()});
      out[nb::int_(layers[i])] = nb::make_tuple(q, k, v);
    }
    auto copy = [&](const TensorView<const float>& src, float* d) {
      for (index_t h = 0; h < src.shape[1]; ++h)
        for (index_t i = 0; i < N; ++i)
          for (index_t x = 0; x < D; ++x) *d++ = src(0, h, i, x);
    };
    const CancelToken cancel(check_interrupt);
    ForwardOptions fo;
    fo.logits_begin = N;  // no logits are needed
    fo.capture = [&](const QkvCapture& c) {
      const int s = slot[static_cast<std::size_t>(c.layer)];
      if (s >= 0) {
        const auto& d = dst[static_cast<std::size_t>(s)];
        copy(pre_rope ? c.q_pre : c.q_post, d[0]);
        copy(pre_rope ? c.k_pre : c.k_post, d[1]);
        copy(c.v, d[2]);
      }
      cancel.check("capture");
    };
    {
      nb::gil_scoped_release release;
      KvCache cache = model_.make_cache(N);
      model_.forward(window, cache, ctx, fo);
    }
    return out;
  }

  nb::object generate(const std::string& prompt, std::int64_t max_tokens, const std::optional<std::string>& attn,
                      bool chat, bool return_ids, std::optional<int> threads) {
    const ExecContext ctx{threads.value_or(0)};
    ctx.num_threads();
    check_generation(max_tokens);
    if (attn) {
      try {
        make_attention_methods(*attn, model_.hparams().n_layer, model_.hparams().local_layers);
      } catch (const Error& e) {
        throw OptionError("attn", e.what());
      }
    }
    const std::vector<std::int32_t> ids = encode_prompt(tok_, prompt, chat);
    check_generation(max_tokens, static_cast<std::int64_t>(ids.size()), &model_.hparams());
    doing(fmt::format("generating up to {} tokens after a prompt of {}", max_tokens, ids.size()));
    std::vector<std::int32_t> out;
    {
      nb::gil_scoped_release release;
      // generate_greedy runs the model's own attention: another spec is set for this call only,
      // under a lock (a Model is shared by Python threads) and restored even on an error.
      std::lock_guard<std::mutex> lock(mu_);
      const std::string saved = model_.attention_spec();
      if (attn) model_.set_attention(*attn);
      try {
        const CancelToken cancel(check_interrupt);
        out = generate_greedy(model_, ids, max_tokens, generation_stop_id(tok_, chat), ctx,
                              [&](std::int32_t) { cancel.check("generate"); });
      } catch (...) {
        model_.set_attention(saved);
        throw;
      }
      model_.set_attention(saved);
    }
    if (return_ids) return nb::cast(out);
    return nb::cast(tok_.decode(out, false));
  }

 private:
  std::string path_, name_;
  LlamaModel model_;
  Tokenizer tok_;
  std::string transform_;
  std::mutex mu_;
};

}  // namespace

void bind_model(nb::module_& m) {
  m.def("default_model_path", &default_model_path,
        "Path of the cached default model (SmolLM2-135M-Instruct Q4_1; scripts/fetch_data.sh "
        "fetches it). Raises numattn.Error when it is missing.");
  m.def("default_text_path", &default_text_path,
        "Path of the cached default text (the six Jane Austen novels). Raises numattn.Error when "
        "it is missing.");
  nb::class_<PyModel>(m, "Model", R"doc(A Llama-architecture GGUF model in float32 (weights dequantized at
load, ≈ 4 bytes per weight: ≈ 540 MB for SmolLM2-135M) with its byte-level BPE tokenizer and a
pluggable attention method per layer (model/llama.h).

``Model.load("default" | path)``; then ``ppl``, ``capture``, ``generate``, ``tokenize``. Each
long call releases the GIL and stops on Ctrl-C (KeyboardInterrupt) between chunks, layers or
tokens; the model is left as it was.)doc")
      // The constructor, so that the Python package's Model (which checks its arguments) can
      // subclass this one; Model.load is the spelling the documentation uses.
      .def("__init__", [](PyModel* self, const std::string& path, std::optional<int> threads,
                          const std::string& xform) {
             new (self) PyModel(PyModel::load_parts(path, threads, xform));
           }, nb::arg("path") = "default", nb::kw_only(), nb::arg("threads") = nb::none(),
           nb::arg("transform") = "", "Model(path) is Model.load(path).")
      .def_static("load", &PyModel::load, nb::arg("path") = "default", nb::kw_only(),
                  nb::arg("threads") = nb::none(), nb::arg("transform") = "",
                  "Reads a GGUF file ('default': the cached SmolLM2-135M): hyper-parameters and "
                  "tensors are validated before anything is allocated; raises numattn.Error naming "
                  "the file, key or tensor. ``transform``: model transforms applied at load, the "
                  "pipeline string of `numattn --transform` (``\"mla(rank=128)|bda(pairs=qk)\"``; "
                  "``numattn transforms`` lists them), parsed and checked before the file is read.")
      .def_prop_ro("path", &PyModel::path)
      .def_prop_ro("transform", &PyModel::transform,
                   "the canonical pipeline applied at load (every default filled in; '' for none)")
      .def_prop_ro("name", &PyModel::name, "general.name of the file")
      .def_prop_ro("bos_id", [](const PyModel& s) { return s.tokenizer().bos_id(); },
                   "the BOS token id (-1: none)")
      .def_prop_ro("add_bos", [](const PyModel& s) { return s.tokenizer().add_bos(); },
                   "tokenizer.ggml.add_bos_token: whether texts and prompts start with BOS, and "
                   "perplexity puts BOS first in each chunk")
      .def_prop_ro("hparams", [](const PyModel& s) {
        const ModelHParams& h = s.model().hparams();
        nb::dict d;
        d["n_vocab"] = h.n_vocab, d["n_embd"] = h.n_embd, d["n_layer"] = h.n_layer, d["n_ff"] = h.n_ff;
        d["n_head"] = h.n_head, d["n_head_kv"] = h.n_head_kv, d["head_dim"] = h.head_dim;
        d["n_rot"] = h.n_rot, d["rope_base"] = h.rope_base, d["rms_eps"] = h.rms_eps;
        d["n_ctx_train"] = h.n_ctx_train;
        return d;
      }, "hyper-parameters (GGUF llama.* keys)")
      .def("tokenize", [](const PyModel& s, const std::string& text, bool add_bos, bool parse_special) {
             return entry("Model.tokenize", [&] {
               doing(fmt::format("tokenizing {} bytes of text", text.size()));
               return s.tokenizer().encode(text, add_bos, parse_special);
             });
           }, nb::arg("text"), nb::kw_only(), nb::arg("add_bos") = false, nb::arg("parse_special") = true,
           "Token ids of text (GPT-2 byte-level BPE, as llama.cpp).")
      .def("detokenize", [](const PyModel& s, const std::vector<std::int32_t>& ids, bool render_special) {
             return entry("Model.detokenize", [&] {
               doing(fmt::format("decoding {} token ids", ids.size()));
               const std::int32_t n = s.tokenizer().vocab_size();
               for (std::size_t i = 0; i < ids.size(); ++i)
                 NUMATTN_CHECK_OPTION(ids[i] >= 0 && ids[i] < n, "ids",
                                      "token id {} at position {} is outside the vocabulary [0, {})", ids[i], i, n);
               return s.tokenizer().decode(ids, render_special);
             });
           }, nb::arg("ids"), nb::kw_only(), nb::arg("render_special") = true)
      .def("ppl", guarded("Model.ppl", &PyModel::ppl), nb::arg("text"), nb::arg("ctx") = 512, nb::arg("chunks") = -1,
           nb::kw_only(), nb::arg("attn") = "exact.flash", nb::arg("baseline") = nb::none(),
           nb::arg("bos") = "auto", nb::arg("allow_long_ctx") = false, nb::arg("threads") = nb::none(),
           R"doc(Perplexity on a text (a str, tokenized whole as `numattn ppl` does, or a list of token
ids), llama.cpp's protocol (model/ppl.h): chunks of ``ctx`` tokens from an empty cache, the
second half of each scored. ``chunks=-1``: all that fit. ``attn``: one spec or one per layer
(';'). With ``baseline`` the same chunks also run with that spec and the dict gains ``kld``
(mean KL(p_base ‖ p)), ``kld_p99``, ``top1_agreement``, ``ppl_baseline``.
Returns a dict: ppl, ppl_stderr, nll_mean, nll (float64 per scored token), tokens_scored,
tokens_processed, seconds, tokens_per_s, attn, ctx, chunks.
Cost: one forward pass of ctx tokens per chunk (two with a baseline).)doc")
      .def("capture", guarded("Model.capture", &PyModel::capture), nb::arg("text"), nb::arg("tokens") = 2048,
           nb::arg("layers") = std::vector<std::int64_t>{0}, nb::kw_only(), nb::arg("offset") = 0,
           nb::arg("pre_rope") = false, nb::arg("bos") = "auto", nb::arg("threads") = nb::none(),
           R"doc(The Q, K, V that the attention layers see on ``tokens`` tokens of a text (from token
``offset`` of the tokenized text; the first replaced by BOS per ``bos``), as `numattn capture`
writes them: a dict {layer: (q, k, v)} of float32 arrays q [Hq, N, D], k and v [Hkv, N, D],
after RoPE (``pre_rope=True``: before). ``numattn.attention(q, k, v, causal=True,
scale=...)`` then runs that layer's problem. ``layers``: indices or "all".)doc")
      .def("generate", guarded("Model.generate", &PyModel::generate), nb::arg("prompt"), nb::arg("max_tokens") = 32, nb::kw_only(),
           nb::arg("attn") = nb::none(), nb::arg("chat") = false, nb::arg("return_ids") = false,
           nb::arg("threads") = nb::none(),
           R"doc(Greedy generation with the KV cache (as `numattn generate`): the new text (or token ids
with ``return_ids=True``), stopping at end-of-sequence. ``attn``: the attention spec for this
call (default exact.flash); ``chat=True`` wraps the prompt in the vocabulary's chat turns (ChatML or Gemma's).)doc")
      .def("__repr__", [](const PyModel& s) {
        const ModelHParams& h = s.model().hparams();
        return fmt::format("Model('{}', layers={}, heads={}/{}, head_dim={}, vocab={})", s.name(), h.n_layer,
                           h.n_head, h.n_head_kv, h.head_dim, h.n_vocab);
      });
}

}  // namespace numattn::py
