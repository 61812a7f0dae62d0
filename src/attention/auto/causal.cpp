#include "attention/auto/causal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "attention/method_def.h"
#include "numattn/attention/blocks/dense_softmax.h"
#include "numattn/attention/blocks/lse_merge.h"
#include "numattn/attention/blocks/nonfinite_rows.h"
#include "numattn/attention/registry.h"

namespace numattn {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr const char* kName = "auto.causal";

using Part = AutoCausalAttention::Part;

/// The inner method of `spec`, checked: it must compute softmax or the Gaussian kernel, be
/// deterministic and not be a selector or a distributed method.
std::unique_ptr<AttentionMethod> make_checked(const std::string& spec, const char* what) {
  std::unique_ptr<AttentionMethod> m;
  try {
    m = create_method(spec);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}={}: {}", kName, what, spec, e.what()));
  }
  const MethodInfo& info = m->info();
  NUMATTN_CHECK(info.family != "auto" && !info.caps.communicates,
                "{}: {}={}: a method of the '{}' family cannot run inside {} (give the method it would "
                "run, e.g. lowrank.nystrom(landmarks=64))",
                kName, what, spec, info.family, kName);
  NUMATTN_CHECK(info.caps.deterministic, "{}: {}={} is not deterministic; {} needs a deterministic method",
                kName, what, spec, kName);
  const TargetKind t = m->target().kind;
  NUMATTN_CHECK(t == TargetKind::kSoftmax || t == TargetKind::kGaussian,
                "{}: {}={} computes {} attention; {} makes softmax (or Gaussian-kernel) methods causal, "
                "use that method's own causal mode instead",
                kName, what, spec, m->target().name(), kName);
  return m;
}

/// The canonical value of `lse` for `inner`: "inner", or the canonical spec of the method whose
/// LSE gives the normalisers.
std::string resolve_lse(const AttentionMethod& inner, const std::string& lse) {
  if (lse == "auto") return inner.info().caps.lse ? "inner" : create_exact_method()->spec();
  if (lse == "inner") {
    NUMATTN_CHECK(inner.info().caps.lse,
                  "{}(lse=inner): {} gives no log-sum-exp; use lse=auto or lse=exact.flash (exact "
                  "normalisers) or an LSE method such as lse=sparse.hyper(block=64,samples=64,min_seq_len=1)",
                  kName, inner.spec());
    return "inner";
  }
  const auto m = make_checked(lse, "lse");
  NUMATTN_CHECK(m->info().caps.lse, "{}: lse={}: that method gives no log-sum-exp; name one that does "
                "(exact.flash, sparse.hyper, sparse.kdeformer, ...) or lse=auto", kName, lse);
  NUMATTN_CHECK(m->target().is_softmax(), "{}: lse={}: the normaliser method must compute softmax", kName, lse);
  return m->spec();
}

ParamValues canonical_params(const ParamValues& p) {
  const auto inner = make_checked(p.get_string("inner"), "inner");
  std::map<std::string, std::string> v;
  v["inner"] = inner->spec();
  v["block"] = std::to_string(p.get_int("block"));
  v["lse"] = resolve_lse(*inner, p.get_string("lse"));
  return ParamValues(&AutoCausalAttention::describe().params, std::move(v));
}

/// The visibility edges of problem.h as two lines: row i sees lo(i) ≤ j ≤ hi(i).
struct Edges {
  bool has_hi = false, has_lo = false;
  index_t hoff = 0, loff = 0;
  explicit Edges(const AttentionProblem& p) {
    const index_t off = p.diag_offset();
    if (p.causal != Causal::kNone) {
      has_hi = true;  // a right window (≥ 0) never binds below the causal diagonal
      hoff = off;
    } else if (p.window_right >= 0) {
      has_hi = true;
      hoff = p.window_right;
    }
    if (p.window_left >= 0) {
      has_lo = true;
      loff = off - p.window_left;
    }
  }
  index_t hi(index_t i) const { return i + hoff; }
  index_t lo(index_t i) const { return i + loff; }
};

void decompose(const Edges& e, index_t block, index_t a, index_t c, index_t ka, index_t kb, std::vector<Part>& out) {
  // Trim to the rows that see a key of [ka, kb) and the keys some row of [a, c) sees; then every
  // row sees at least its own first key and every key is seen (lo ≤ hi, both increasing).
  if (e.has_hi) a = std::max(a, ka - e.hoff);
  if (e.has_lo) c = std::min(c, kb - e.loff);
  if (a >= c) return;
  if (e.has_lo) ka = std::max(ka, e.lo(a));
  if (e.has_hi) kb = std::min(kb, e.hi(c - 1) + 1);
  if (ka >= kb) return;
  if (std::max(c - a, kb - ka) <= block) {  // small: exact (cheaper than most inner calls)
    out.push_back({a, c, ka, kb, false});
    return;
  }
  if ((!e.has_lo || e.lo(c - 1) <= ka) && (!e.has_hi || e.hi(a) >= kb - 1)) {  // fully visible
    out.push_back({a, c, ka, kb, true});
    return;
  }
  index_t split = -1;
  if (e.has_hi && e.hi(a) > ka && e.hi(a) < kb) split = e.hi(a);  // off-diagonal | diagonal
  else if (e.has_lo && e.lo(c - 1) + 1 > ka && e.lo(c - 1) + 1 < kb) split = e.lo(c - 1) + 1;  // window edge | inside
  if (split < 0 && c - a >= kb - ka) {
    const index_t b = a + (c - a) / 2;
    decompose(e, block, a, b, ka, kb, out);
    decompose(e, block, b, c, ka, kb, out);
    return;
  }
  if (split < 0) split = ka + (kb - ka) / 2;
  decompose(e, block, a, c, ka, split, out);
  decompose(e, block, a, c, split, kb, out);
}

/// Rows [r0, r0 + n) of a [B, H, N, D] view.
template <class T>
TensorView<T> rows(const TensorView<T>& t, index_t r0, index_t n) {
  return TensorView<T>(t.row(0, 0, r0), {t.shape[0], t.shape[1], n, t.shape[3]}, t.stride);
}

/// q̃ = [q, 1] or k̃ = [k, −‖k‖²/2] (contiguous, D + 1 columns): softmax over s·q̃·k̃ is the
/// normalised Gaussian kernel exp(−s‖q − k‖²/2) (the ‖q‖² factor cancels in each row).
std::vector<float> augment(const TensorView<const float>& x, bool key, const ExecContext& ctx) {
  const index_t B = x.shape[0], H = x.shape[1], N = x.shape[2], D = x.shape[3];
  std::vector<float> y(static_cast<std::size_t>(B * H * N * (D + 1)));
  parallel_for(ctx, B * H, [&](std::int64_t t) {
    const index_t b = t / H, h = t % H;
    for (index_t n = 0; n < N; ++n) {
      const float* src = x.row(b, h, n);
      float* dst = y.data() + ((t * N) + n) * (D + 1);
      double n2 = 0;
      for (index_t d = 0; d < D; ++d) {
        dst[d] = src[d];
        n2 += static_cast<double>(src[d]) * src[d];
      }
      dst[D] = key ? static_cast<float>(-0.5 * n2) : 1.0f;
    }
  });
  return y;
}

/// The fully visible block `t` as a non-causal problem over `q`, `k`, `v`.
AttentionProblem block_problem(const AttentionProblem& p, const Part& t, const TensorView<const float>& q,
                               const TensorView<const float>& k, const TensorView<const float>& v) {
  AttentionProblem sub;
  sub.q = rows(q, t.a, t.c - t.a);
  sub.k = rows(k, t.ka, t.kb - t.ka);
  sub.v = rows(v, t.ka, t.kb - t.ka);
  sub.scale = p.effective_scale();
  return sub;
}

/// A zero V of one column for `keys` keys (the normaliser runs need no values).
TensorView<const float> zero_values(const float* zeros, index_t B, index_t Hk, index_t keys, index_t ld) {
  return TensorView<const float>(zeros, {B, Hk, keys, 1}, {Hk * ld, ld, 1, 1});
}

}  // namespace

AutoCausalAttention::AutoCausalAttention(ParamValues p) : AttentionMethod(canonical_params(p)) {
  inner_ = make_checked(params_.get_string("inner"), "inner");
  const std::string& l = params_.get_string("lse");
  if (l != "inner") lse_ = make_checked(l, "lse");
}

const MethodInfo& AutoCausalAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = kName;
    m.family = "auto";
    m.summary =
        "causal (and sliding-window) form of a non-causal method: diagonal blocks recursive down to "
        "`block` (exact), fully visible off-diagonal blocks by `inner`, merged by log-sum-exp";
    m.citation = "Han, Jayaram, Karbasi, Mirrokni, Woodruff, Zandieh, HyperAttention: Long-context Attention "
                 "in Near-Linear Time, ICLR 2024 (causal recursion, Algorithm 4)";
    m.time_complexity =
        "Σ_ℓ 2^ℓ·inner(N/2^(ℓ+1) × N/2^(ℓ+1)) over log2(N/block) levels + O(N·block·(Dk+Dv)) + normalisers "
        "(lse=exact.flash: O(N²·Dk/2))";
    m.memory_complexity = "O(B·Hq·(Nq/2)·(Dv+1)) for one block's partial + O(B·Hq·Nq) doubles + the inner method's";
    m.params = {
        {"inner", ParamType::kString, "lowrank.nystrom", 0, 0, {},
         "the non-causal method run on each fully visible block, a nested spec: inner=lowrank.nystrom(landmarks=64)"},
        {"block", ParamType::kInt, "256", 1, 1 << 20, {},
         "partially visible parts with max(rows, keys) ≤ block are computed exactly (the recursion's base)"},
        {"lse", ParamType::kString, "auto", 0, 0, {},
         "normalisers of the fully visible blocks: inner (its own LSE), or the LSE of a method spec run on "
         "the block (exact.flash: exact; sparse.hyper(...): HyperAttention's estimate); auto: inner when "
         "it gives one, else exact.flash"},
    };
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = true, .lse = true, .decode = false, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = false};
    AccuracyContract& a = m.accuracy;
    a.max_rel_fro_error = [](const BudgetInput& in) {
      // The inner method's budget on the problem as a non-causal one (its blocks are smaller),
      // doubled: a row's output mixes the blocks' errors, weighted by their softmax mass.
      AttentionProblem plain = in.problem;
      plain.causal = Causal::kNone;
      plain.window_left = plain.window_right = -1;
      auto budget_of = [&](const AttentionMethod& x) {
        return x.info().accuracy.max_rel_fro_error(BudgetInput{x.params(), plain, in.logit_magnitude});
      };
      const auto inner = create_method(in.params.get_string("inner"));
      double b = 2 * budget_of(*inner);
      const std::string l = resolve_lse(*inner, in.params.get_string("lse"));
      if (l != "inner") {
        const auto est = create_method(l);
        if (!est->info().caps.exact) b += 2 * budget_of(*est);
      }
      return b + exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
    };
    a.limit_case = [](const AttentionProblem&) { return ParamOverrides{{"inner", "exact.flash"}}; };
    // Larger exact parts: block ≥ max(Nq, Nk) is exact attention.
    a.convergence.param = "block";
    a.convergence.values = [](const AttentionProblem& p) {
      return std::vector<std::string>{"1", std::to_string(std::max(p.n_q(), p.n_kv()))};
    };
    // Every method that refuses causal problems on its own, on blocks small enough for the
    // harness's problems to reach them; exact inner methods; the normaliser estimators.
    a.samples = {
        {{"inner", "lowrank.nystrom(landmarks=8)"}, {"block", "8"}},
        {{"inner", "lowrank.linformer(k=8)"}, {"block", "8"}},
        {{"inner", "lowrank.skyformer(landmarks=8)"}, {"block", "8"}},
        {{"inner", "lowrank.wildcat(rank=8)"}, {"block", "8"}},
        {{"inner", "sparse.smyrf(clusters=2,rounds=2)"}, {"block", "8"}},
        {{"inner", "sparse.routing(clusters=2)"}, {"block", "8"}},
        {{"inner", "sparse.clustered(clusters=2,topk=4)"}, {"block", "8"}},
        {{"inner", "sparse.kdeformer(samples=8,bucket=8)"}, {"block", "8"}},
        {{"inner", "sparse.scatterbrain(features=16,chunk=8)"}, {"block", "8"}},
        {{"inner", "exact.naive"}, {"block", "4"}},
        {{"inner", "lowrank.nystrom(landmarks=8)"}, {"block", "8"}, {"lse", "sparse.hyper(block=8,samples=8,min_seq_len=1)"}},
        {{"inner", "sparse.routing(clusters=2)"}, {"block", "8"}, {"lse", "exact.flash"}},
    };
    return m;
  }();
  return info;
}

Target AutoCausalAttention::target() const { return inner_->target(); }

std::vector<Part> AutoCausalAttention::parts(const AttentionProblem& p) const {
  return causal_recursion::parts(p, params_.get_int("block"));
}

Status AutoCausalAttention::can_run(const AttentionProblem& p) const {
  const Status base = AttentionMethod::can_run(p);
  if (!base.is_ok()) return base;
  const Status s = causal_recursion::can_run(*inner_, lse_.get(), params_.get_int("block"), p);
  return s.is_ok() ? s : Status::unsupported(std::string(kName) + ": " + s.reason());
}

std::size_t AutoCausalAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  return causal_recursion::workspace_bytes(*inner_, lse_.get(), params_.get_int("block"), p, ctx);
}

double AutoCausalAttention::flops(const AttentionProblem& p) const {
  return causal_recursion::cost(*inner_, lse_.get(), params_.get_int("block"), p).flops;
}

double AutoCausalAttention::bytes(const AttentionProblem& p) const {
  return causal_recursion::cost(*inner_, lse_.get(), params_.get_int("block"), p).bytes;
}

void AutoCausalAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  causal_recursion::forward(*inner_, lse_.get(), params_.get_int("block"), p, ctx);
}

namespace causal_recursion {

std::vector<Part> parts(const AttentionProblem& p, index_t block) {
  std::vector<Part> out;
  decompose(Edges(p), block, 0, p.n_q(), 0, p.n_kv(), out);
  return out;
}

const AttentionMethod* auto_lse(const AttentionMethod& inner) {
  static const std::unique_ptr<AttentionMethod> flash = create_exact_method();
  return inner.info().caps.lse ? nullptr : flash.get();
}

Status can_run(const AttentionMethod& inner, const AttentionMethod* lse, index_t block, const AttentionProblem& p) {
  if (p.mask.kind == MaskKind::kBool)
    return Status::unsupported(fmt::format(
        "the causal recursion that runs {} on causal or windowed problems cannot take a boolean mask (its fully "
        "visible blocks go to the method unmasked)", inner.spec()));
  if (p.mask.kind == MaskKind::kAdditive)
    return Status::unsupported(fmt::format(
        "the causal recursion that runs {} on causal or windowed problems cannot take an additive mask (its fully "
        "visible blocks go to the method unmasked)", inner.spec()));
  // Probe every fully visible block with the inner method (and the normaliser method) on the
  // real data: their refusals may depend on the block's shape or contents.
  static const float zero = 0.f;
  static float sink = 0.f;
  const index_t B = p.batch(), H = p.heads(), Hk = p.kv_heads();
  for (const Part& t : parts(p, block)) {
    if (!t.full) continue;
    const index_t R = t.c - t.a, K = t.kb - t.ka;
    AttentionProblem sub = block_problem(p, t, p.q, p.k, p.v);
    sub.out = rows(p.out, t.a, R);
    if (!lse) sub.lse = TensorView<float>(&sink, {B, H, R, 1}, {0, 0, 0, 1});
    const auto refused = [&](const AttentionMethod& m, const Status& s) {
      return Status::unsupported(fmt::format("{} cannot run the fully visible block of rows [{}, {}) × keys [{}, {}): {}",
                                             m.spec(), t.a, t.c, t.ka, t.kb, s.reason()));
    };
    if (const Status s = inner.can_run(sub); !s.is_ok()) return refused(inner, s);
    if (lse) {
      sub.v = TensorView<const float>(&zero, {B, Hk, K, 1}, {0, 0, 0, 1});
      sub.out = TensorView<float>(&sink, {B, H, R, 1}, {0, 0, 0, 1});
      sub.lse = sub.out;
      if (const Status s = lse->can_run(sub); !s.is_ok()) return refused(*lse, s);
    }
  }
  return Status::ok();
}

std::size_t workspace_bytes(const AttentionMethod& inner, const AttentionMethod* lse, index_t block,
                            const AttentionProblem& p, const ExecContext& ctx) {
  const auto B = static_cast<std::size_t>(p.batch()), H = static_cast<std::size_t>(p.heads()),
             Hk = static_cast<std::size_t>(p.kv_heads());
  const auto dv = static_cast<std::size_t>(p.d_v());
  std::size_t rmax = 0, kmax = 0, most = 0;
  for (const Part& t : parts(p, block)) {
    rmax = std::max(rmax, static_cast<std::size_t>(t.c - t.a));
    kmax = std::max(kmax, static_cast<std::size_t>(t.kb - t.ka));
    AttentionProblem sub = block_problem(p, t, p.q, p.k, p.v);
    sub.out = rows(p.out, t.a, t.c - t.a);
    most = std::max(most, t.full ? inner.workspace_bytes(sub, ctx)
                                 : blocks::dense_softmax_workspace_bytes(sub, ctx.num_threads()));
    if (t.full && lse) most = std::max(most, lse->workspace_bytes(sub, ctx));
  }
  std::size_t bytes = most + sizeof(double) * B * H * static_cast<std::size_t>(p.n_q()) +
                      sizeof(float) * (B * H * rmax * (dv + 2) + B * Hk * kmax);
  if (!inner.target().is_softmax())
    bytes += sizeof(float) * (B * H * static_cast<std::size_t>(p.n_q()) + B * Hk * static_cast<std::size_t>(p.n_kv())) *
             static_cast<std::size_t>(p.d_qk() + 1);
  return bytes;
}

CostModel cost(const AttentionMethod& inner, const AttentionMethod* lse, index_t block, const AttentionProblem& p) {
  static const float zero = 0.f;
  static float sink = 0.f;
  const Edges e(p);
  const index_t B = p.batch(), H = p.heads(), Hk = p.kv_heads();
  CostModel c;
  for (const Part& t : parts(p, block)) {
    const index_t R = t.c - t.a, K = t.kb - t.ka;
    AttentionProblem sub = block_problem(p, t, p.q, p.k, p.v);
    sub.out = rows(p.out, t.a, R);
    if (t.full) {
      c.flops += inner.flops(sub);
      c.bytes += inner.bytes(sub);
      if (lse) {
        sub.v = TensorView<const float>(&zero, {B, Hk, K, 1}, {0, 0, 0, 1});
        sub.out = TensorView<float>(&sink, {B, H, R, 1}, {0, 0, 0, 1});
        sub.lse = sub.out;
        c.flops += lse->flops(sub);
        c.bytes += lse->bytes(sub);
      }
    } else {
      sub.window_right = e.has_hi ? e.hi(t.a) - t.ka : -1;
      sub.window_left = e.has_lo ? t.ka - e.lo(t.a) : -1;
      c.flops += attention_flops(sub);
      c.bytes += attention_io_bytes(sub);
    }
    // The merge: each part's rows (output and LSE) written, read back and merged in float64.
    c.bytes += 3.0 * 4 * static_cast<double>(B * H * R * (p.d_v() + 1));
    c.flops += 4.0 * static_cast<double>(B * H * R * p.d_v());
  }
  return c;
}

void forward(const AttentionMethod& inner, const AttentionMethod* lse_m, index_t block, const AttentionProblem& p,
             const ExecContext& ctx) {
  if (blocks::mark_rows_reading_nonfinite(p, ctx)) return;
  const index_t B = p.batch(), H = p.heads(), Hk = p.kv_heads(), nq = p.n_q(), dv = p.d_v();
  const std::vector<Part> list = parts(p, block);
  const Edges e(p);

  // Inputs of the exact parts and of the normalisers: q, k, or their Gaussian augmentation.
  std::vector<float> qa, ka;
  TensorView<const float> qx = p.q, kx = p.k;
  if (!inner.target().is_softmax()) {
    qa = augment(p.q, false, ctx);
    ka = augment(p.k, true, ctx);
    qx = TensorView<const float>::contiguous(qa.data(), {B, H, nq, p.d_qk() + 1});
    kx = TensorView<const float>::contiguous(ka.data(), {B, Hk, p.n_kv(), p.d_qk() + 1});
  }
  index_t rmax = 0, kmax = 0;
  for (const Part& t : list) {
    rmax = std::max(rmax, t.c - t.a);
    kmax = std::max(kmax, t.kb - t.ka);
  }
  std::vector<float> zeros, dummy;
  if (lse_m) {
    zeros.assign(static_cast<std::size_t>(B * Hk * kmax), 0.f);
    dummy.resize(static_cast<std::size_t>(B * H * rmax));
  }
  // The normaliser of fully visible block `t` into `lse` ([B, H, rows, 1]).
  auto normalise = [&](const Part& t, const TensorView<float>& lse) {
    const index_t R = t.c - t.a, K = t.kb - t.ka;
    AttentionProblem sub = block_problem(p, t, qx, kx, p.v);
    sub.v = zero_values(zeros.data(), B, Hk, K, kmax);
    sub.out = TensorView<float>::contiguous(dummy.data(), {B, H, R, 1});
    sub.lse = lse;
    lse_m->forward(sub, ctx);
  };

  // One fully visible block covering the problem (non-causal, no window): the inner method alone.
  if (list.size() == 1 && list[0].full && list[0].c - list[0].a == nq && list[0].kb - list[0].ka == p.n_kv()) {
    AttentionProblem sub = block_problem(p, list[0], p.q, p.k, p.v);
    sub.out = p.out;
    if (!lse_m) sub.lse = p.lse;
    inner.forward(sub, ctx);
    if (lse_m && !p.lse.empty()) normalise(list[0], p.lse);
    return;
  }

  std::vector<double> acc(static_cast<std::size_t>(B * H * nq), kNegInf);
  std::vector<float> po(static_cast<std::size_t>(B * H * rmax * dv)), pl(static_cast<std::size_t>(B * H * rmax));
  for (const Part& t : list) {
    const index_t R = t.c - t.a;
    const auto out = TensorView<float>::contiguous(po.data(), {B, H, R, dv});
    const auto lse = TensorView<float>::contiguous(pl.data(), {B, H, R, 1});
    if (t.full) {
      AttentionProblem sub = block_problem(p, t, p.q, p.k, p.v);
      sub.out = out;
      if (!lse_m) sub.lse = lse;
      inner.forward(sub, ctx);
      if (lse_m) normalise(t, lse);
    } else {
      // Exact over the part's visible pairs: its edges as a window about its own diagonal
      // (j' − i' ∈ [lo(a) − ka, hi(a) − ka], both ends ≥ 0 after trimming).
      AttentionProblem sub = block_problem(p, t, qx, kx, p.v);
      sub.out = out;
      sub.lse = lse;
      sub.window_right = e.has_hi ? e.hi(t.a) - t.ka : -1;
      sub.window_left = e.has_lo ? t.ka - e.lo(t.a) : -1;
      blocks::dense_softmax_attention(sub, ctx);
    }
    parallel_for(ctx, B * H, [&](std::int64_t bh) {
      const index_t b = bh / H, h = bh % H;
      for (index_t r = 0; r < R; ++r)
        blocks::lse_merge_into(p.out.row(b, h, t.a + r), acc[static_cast<std::size_t>(bh * nq + t.a + r)],
                               po.data() + (bh * R + r) * dv, pl[static_cast<std::size_t>(bh * R + r)], dv);
    });
  }
  parallel_for(ctx, B * H, [&](std::int64_t bh) {
    const index_t b = bh / H, h = bh % H;
    for (index_t i = 0; i < nq; ++i) {
      const double l = acc[static_cast<std::size_t>(bh * nq + i)];
      if (l == kNegInf) std::fill(p.out.row(b, h, i), p.out.row(b, h, i) + dv, 0.f);
      if (!p.lse.empty()) p.lse(b, h, i, 0) = static_cast<float>(l);
    }
  });
}

}  // namespace causal_recursion

NUMATTN_DEFINE_METHOD(AutoCausalAttention)

}  // namespace numattn
