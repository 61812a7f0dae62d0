#include "tensor_cli.h"

namespace numattn::cli {

void add_tensor_alias_option(CLI::App& sub, std::string& spec) {
  sub.add_option("--tensor", spec,
                 std::string("deprecated alias of --transform \"tensor.SCHEME(...)\" (vo-cp:rank=256 is "
                             "tensor.vo_cp(rank=256)): compress weights with a tensor decomposition at load (transform/"
                             "tensor_heads.h); KL is then measured against the uncompressed model. "
                             "The compressed weights are rebuilt dense in float32 for execution. On an "
                             "MLA model (--mla-rank, or a numattn-mla file) only qk-cp applies, to the "
                             "NoPE part W_q_nope[h]ᵀ·W_uk[h]. `numattn convert --tensor SPEC --out X.gguf` "
                             "stores the factors. ") +
                     transform::tensor_spec_grammar() +
                     ". Examples: vo-cp:rank=256, tucker-qkvo:rank=256x384, tucker-ffn:rank=384,layers=15");
}

void add_tensor_columns(Row& row, const TensorModelReport& rep, bool json) {
  row["tensor"] = rep.spec.canonical();
  row["tensor_params_before"] = rep.params_before;
  row["tensor_params_after"] = rep.params_after;
  row["tensor_params_kept"] =
      rep.params_before > 0 ? static_cast<double>(rep.params_after) / static_cast<double>(rep.params_before) : 1.0;
  row["tensor_fit_min"] = rep.fit_min;
  row["tensor_fit_mean"] = rep.fit_mean;
  row["tensor_not_converged"] = rep.not_converged;
  row["tensor_exec_head_dim"] = rep.exec_head_dim;
  row["tensor_s"] = rep.seconds;
  if (!json) return;
  Row parts = Row::array();
  for (const auto& p : rep.parts) {
    Row r;
    r["name"] = p.name;
    r["fit"] = p.fit;
    r["iterations"] = p.iterations;
    r["info"] = decomp::dense::to_string(p.info);
    if (!p.message.empty()) r["message"] = p.message;
    r["rank_rows"] = p.rank_rows;
    r["rank_cols"] = p.rank_cols;
    r["params_before"] = p.params_before;
    r["params_after"] = p.params_after;
    parts.push_back(r);
  }
  row["tensor_parts"] = parts;
}

}  // namespace numattn::cli
