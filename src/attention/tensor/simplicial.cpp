#include "attention/tensor/simplicial.h"

#include "attention/method_def.h"
#include "numattn/attention/simplicial.h"

namespace numattn {

const MethodInfo& SimplicialAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "tensor.simplicial";
    m.family = "tensor";
    m.summary = "2-simplicial attention: softmax over key pairs (j,k) in causal windows w1×w2, trilinear logit, "
                "value v_j⊙v_k (replaces softmax)";
    m.citation = "Clift et al., Logic and the 2-Simplicial Transformer, ICLR 2020; Roy et al., Fast and Simplex: "
                 "2-Simplicial Attention in Triton, 2025";
    m.time_complexity = "O(Nq·w1·w2·(Dk+Dv))";
    m.memory_complexity = "O(threads·((64+w1+w2)·(Dk+Dv) + 64·w2)) packed windows and one pair tile";
    m.params = {{"w1", ParamType::kInt, "64", 1, 128, {}, "window of the first key j: the w1 keys ending at the diagonal"},
                {"w2", ParamType::kInt, "16", 1, 64, {}, "window of the second key k: the w2 keys ending at the diagonal"}};
    m.caps = {.exact = false, .causal = true, .gqa = true, .bool_mask = false, .additive_mask = false,
              .window = true, .lse = true, .decode = true, .dk_ne_dv = true, .strided = true,
              .deterministic = true, .randomized = false};
    // Exact for its own target at every parameter set (float32 rounding only).
    m.accuracy.max_rel_fro_error = [](const BudgetInput& in) {
      return exact_f32_tolerance(in.logit_magnitude).rel_fro_error;
    };
    m.accuracy.limit_case = [](const AttentionProblem&) { return ParamOverrides{}; };
    m.accuracy.samples = {{{"w1", "7"}, {"w2", "3"}}, {{"w1", "3"}, {"w2", "33"}}, {{"w1", "100"}, {"w2", "17"}}};
    return m;
  }();
  return info;
}

Status SimplicialAttention::can_run(const AttentionProblem& p) const {
  Status s = AttentionMethod::can_run(p);
  if (!s.is_ok()) return s;
  if (p.causal == Causal::kNone)
    return Status::unsupported("tensor.simplicial is causal: its key windows end at the query's diagonal position "
                               "(use --causal top-left or bottom-right)");
  return Status::ok();
}

Target SimplicialAttention::target() const {
  return Target::simplicial(params_.get_int("w1"), params_.get_int("w2"));
}

double SimplicialAttention::flops(const AttentionProblem& p) const {
  return simplicial_flops(p, params_.get_int("w1"), params_.get_int("w2"));
}

std::size_t SimplicialAttention::workspace_bytes(const AttentionProblem& p, const ExecContext& ctx) const {
  return simplicial_workspace_bytes(p, params_.get_int("w1"), params_.get_int("w2"), ctx.num_threads());
}

void SimplicialAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  simplicial_attention(p, p.k, p.v, params_.get_int("w1"), params_.get_int("w2"), ctx);
}

NUMATTN_DEFINE_METHOD(SimplicialAttention)

}  // namespace numattn
