#include "attention/exact/reference_method.h"

#include <vector>

#include "attention/method_def.h"
#include "attention/ordered_errors.h"
#include "numattn/attention/reference.h"

namespace numattn {

const MethodInfo& ReferenceAttention::describe() {
  static const MethodInfo info = [] {
    MethodInfo m;
    m.name = "exact.reference";
    m.family = "exact";
    m.summary = "float64 softmax attention, row by row; the oracle of every test and report";
    m.citation = "Vaswani et al., Attention Is All You Need, NeurIPS 2017";
    m.time_complexity = "O(Nq·Nk·(Dk+Dv)) in float64";
    m.memory_complexity = "O(Nk) per thread";
    m.caps = {.exact = true, .causal = true, .gqa = true, .bool_mask = true, .additive_mask = true,
              .window = true, .lse = true, .decode = false, .head_mask = true};
    m.accuracy = AccuracyContract::exact();
    return m;
  }();
  return info;
}

std::size_t ReferenceAttention::workspace_bytes(const AttentionProblem& p,
                                                const ExecContext& ctx) const {
  return static_cast<std::size_t>(ctx.num_threads()) * 8 * static_cast<std::size_t>(p.n_kv() + p.d_v());
}

void ReferenceAttention::forward(const AttentionProblem& p, const ExecContext& ctx) const {
  const index_t rows = p.batch() * p.heads() * p.n_q();
  detail::parallel_for_ordered_errors(ctx, rows, [&](std::int64_t t) {
    const index_t i = t % p.n_q(), bh = t / p.n_q(), b = bh / p.heads(), h = bh % p.heads();
    std::vector<double> o(static_cast<std::size_t>(p.d_v()));
    const double lse = reference_row(p, b, h, i, o.data());
    float* dst = p.out.row(b, h, i);
    for (index_t d = 0; d < p.d_v(); ++d) dst[d] = static_cast<float>(o[static_cast<std::size_t>(d)]);
    if (!p.lse.empty()) p.lse(b, h, i, 0) = static_cast<float>(lse);
  });
}

NUMATTN_DEFINE_METHOD(ReferenceAttention)

}  // namespace numattn
