#include "numattn/attention/method.h"

#include <charconv>

#include "attention/auto/causal.h"
#include "attention/edges.h"

namespace numattn {

const std::string& ParamValues::raw(const std::string& name) const {
  auto it = values_.find(name);
  NUMATTN_ASSERT(it != values_.end());
  return it->second;
}

std::int64_t ParamValues::get_int(const std::string& name) const { return std::stoll(raw(name)); }
double ParamValues::get_float(const std::string& name) const { return std::stod(raw(name)); }
bool ParamValues::get_bool(const std::string& name) const { return raw(name) == "true"; }
const std::string& ParamValues::get_string(const std::string& name) const { return raw(name); }

std::string ParamValues::canonical() const {
  std::string s;
  if (!schema_) return s;
  for (const auto& ps : *schema_) {
    if (!s.empty()) s += ',';
    s += ps.name + '=' + raw(ps.name);
  }
  return s;
}

std::string AttentionMethod::spec() const {
  std::string p = params_.canonical();
  return p.empty() ? info().name : info().name + "(" + p + ")";
}

bool AttentionMethod::causal_recursion() const {
  const MethodInfo& m = info();
  const TargetKind t = target().kind;
  return m.family != "auto" && !m.caps.communicates && m.caps.deterministic &&
         (t == TargetKind::kSoftmax || t == TargetKind::kGaussian);
}

bool AttentionMethod::runs_by_recursion(const AttentionProblem& p) const {
  const Capabilities& c = info().caps;
  const bool lacks = (p.causal != Causal::kNone && !c.causal) || (p.has_window() && !c.window);
  return lacks && causal_recursion();
}

Status AttentionMethod::can_run(const AttentionProblem& p) const {
  const Capabilities& c = info().caps;
  const std::string& n = info().name;
  const bool recursion = runs_by_recursion(p);
  // Why the recursion cannot stand in for a missing causal rule or window.
  const auto no_recursion = [&] {
    return fmt::format(" (its kernel has none, and the causal recursion cannot stand in: it merges softmax or "
                       "Gaussian-kernel blocks of a deterministic method outside the auto and dist families, "
                       "and {} is {}{})",
                       n, target().name(), c.deterministic ? "" : ", non-deterministic");
  };
  if (p.causal != Causal::kNone && !c.causal && !recursion)
    return Status::unsupported(n + " does not support causal masking" + no_recursion());
  if (p.kv_heads() != p.heads() && !c.gqa)
    return Status::unsupported(n + " does not support GQA/MQA (Hq != Hkv)");
  if (p.mask.kind == MaskKind::kBool && !c.bool_mask)
    return Status::unsupported(n + " does not support boolean masks");
  if (p.mask.kind == MaskKind::kAdditive && !c.additive_mask)
    return Status::unsupported(n + " does not support additive masks");
  if (p.mask.kind != MaskKind::kNone && !p.mask.shared() && !c.head_mask)
    return Status::unsupported(n + " takes only a mask shared by every batch and head (Mask::stride_b = "
                               "stride_h = 0): it cannot honour one that varies over them");
  if (p.has_window() && !c.window && !recursion)
    return Status::unsupported(n + " does not support a sliding window" + no_recursion());
  if (!p.lse.empty() && !c.lse) return Status::unsupported(n + " cannot output log-sum-exp");
  if (p.d_qk() != p.d_v() && !c.dk_ne_dv) return Status::unsupported(n + " needs Dk == Dv");
  if (p.half_kv() && !c.half_kv)
    return Status::unsupported(n + " cannot read " + to_string(p.half.type) + " keys and values (widen_kv)");
  if (recursion)
    return causal_recursion::can_run(*this, causal_recursion::auto_lse(*this), causal_recursion::kDefaultBlock, p);
  return Status::ok();
}

double attention_io_bytes(const AttentionProblem& p) {
  const double bh = static_cast<double>(p.batch() * p.heads()), bk = static_cast<double>(p.batch() * p.kv_heads());
  const double nq = static_cast<double>(p.n_q()), nk = static_cast<double>(p.n_kv());
  double b = 4 * (bh * nq * (p.d_qk() + p.d_v() + (p.lse.empty() ? 0 : 1)) + bk * nk * (p.d_qk() + p.d_v()));
  // A mask that varies over batches or heads is read once per (b, h) that has its own.
  const double copies = static_cast<double>((p.mask.stride_b ? p.batch() : 1) * (p.mask.stride_h ? p.heads() : 1));
  if (p.mask.kind == MaskKind::kBool) b += copies * nq * nk;
  if (p.mask.kind == MaskKind::kAdditive) b += copies * 4 * nq * nk;
  return b;
}

double AttentionMethod::bytes(const AttentionProblem& p) const {
  const auto ws = static_cast<double>(workspace_bytes(p, ExecContext{1}));
  return attention_io_bytes(p) + (ws > kCacheResidentBytes ? 2 * ws : 0);
}

CostModel AttentionMethod::cost(const AttentionProblem& p) const {
  if (runs_by_recursion(p))
    return causal_recursion::cost(*this, causal_recursion::auto_lse(*this), causal_recursion::kDefaultBlock, p);
  return {flops(p), bytes(p)};
}

void AttentionMethod::run(const AttentionProblem& p, const ExecContext& ctx) const {
  validate(p);
  if ((p.has_half_q() || p.has_half_out()) && !info().caps.half_io) {
    // Half-precision Q / output for a method that reads and writes float32 only: a float32 copy
    // of Q and a float32 output buffer, rounded once at the end.
    const WidenedIo w = widen_io(p);
    run(w.problem, ctx);
    w.store_out(p);
    return;
  }
  Status s = can_run(p);
  NUMATTN_CHECK(s.is_ok(), "{} cannot run this problem ({}): {}", spec(), p.describe(), s.reason());
  if (runs_by_recursion(p))
    causal_recursion::forward(*this, causal_recursion::auto_lse(*this), causal_recursion::kDefaultBlock, p, ctx);
  else
    forward(p, ctx);
  detail::settle_nonfinite_rows(*this, p, ctx);
}

}  // namespace numattn
