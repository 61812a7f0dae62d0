#include "numattn/attention/method.h"

#include <charconv>

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

Status AttentionMethod::can_run(const AttentionProblem& p) const {
  const Capabilities& c = info().caps;
  const std::string& n = info().name;
  if (p.causal != Causal::kNone && !c.causal)
    return Status::unsupported(n + " does not support causal masking");
  if (p.kv_heads() != p.heads() && !c.gqa)
    return Status::unsupported(n + " does not support GQA/MQA (Hq != Hkv)");
  if (p.mask.kind == MaskKind::kBool && !c.bool_mask)
    return Status::unsupported(n + " does not support boolean masks");
  if (p.mask.kind == MaskKind::kAdditive && !c.additive_mask)
    return Status::unsupported(n + " does not support additive masks");
  if (p.has_window() && !c.window) return Status::unsupported(n + " does not support a sliding window");
  if (!p.lse.empty() && !c.lse) return Status::unsupported(n + " cannot output log-sum-exp");
  if (p.d_qk() != p.d_v() && !c.dk_ne_dv) return Status::unsupported(n + " needs Dk == Dv");
  if (p.half_kv() && !c.half_kv)
    return Status::unsupported(n + " cannot read " + to_string(p.half.type) + " keys and values (widen_kv)");
  return Status::ok();
}

void AttentionMethod::run(const AttentionProblem& p, const ExecContext& ctx) const {
  validate(p);
  Status s = can_run(p);
  NUMATTN_CHECK(s.is_ok(), "{} cannot run this problem ({}): {}", spec(), p.describe(), s.reason());
  forward(p, ctx);
  detail::settle_nonfinite_rows(*this, p, ctx);
}

}  // namespace numattn
