// numattn bd-study: worst-head κ and float32 error of BDA per basis rule on the random-weight
// set-ups MHA-768, MLA-512 and MHA-4096 (the table of docs/bd.md §6).
#include <algorithm>
#include <iostream>
#include <limits>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "numattn/transform/bda.h"
#include "numattn/transform/bda_eval.h"

namespace numattn::cli {

namespace {

struct Setup {
  const char* name;
  index_t d_model, d_kv, heads, kv_heads, head_dim;
  const char* what;
};

// Set-ups: MHA 768/64 ×12, MLA nope-QK 2048 → latent 512, dh 128 ×16, MHA 4096/128 ×4.
const Setup kSetups[] = {
    {"mha768", 768, 0, 12, 12, 64, "MHA d=768, dh=64, 12 heads"},
    {"mla512", 2048, 512, 16, 16, 128, "MLA 2048 -> latent 512, dh=128, 16 heads"},
    {"mha4096", 4096, 0, 4, 4, 128, "MHA d=4096, dh=128, 4 heads"},
};

struct StudyOptions {
  std::string setups = "mha768,mla512,mha4096";
  std::string strategies = "first,last,residual_min,pivoted,maxmin";
  std::string pairs = "qkvo";
  int seeds = 3;
  long long tokens = 256;
  int threads = 0;
  std::string format = "md";
};

}  // namespace

void add_bd_study(CLI::App& app) {
  auto o = std::make_shared<StudyOptions>();
  auto* sub = app.add_subcommand(
      "bd-study",
      "BDA basis rules compared on random N(0,1/d) weights (each of --setups): worst-head κ "
      "and float32 logit / layer-output error against the float64 reference (medians over seeds)");
  sub->add_option("--setups", o->setups, "comma list of mha768, mla512, mha4096")->capture_default_str();
  sub->add_option("--strategies", o->strategies, "comma list of basis rules")->capture_default_str();
  sub->add_option("--pairs", o->pairs, "qk, vo or qkvo")->capture_default_str();
  sub->add_option("--seeds", o->seeds, "random layers per set-up (seeds 1..N)")->capture_default_str();
  sub->add_option("--tokens", o->tokens, "tokens per evaluation (causal)")->capture_default_str();
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o] {
    ExecContext ctx{o->threads};
    std::vector<Row> rows;
    for (const auto& sname : split_list(o->setups)) {
      const Setup* su = nullptr;
      for (const auto& s : kSetups)
        if (sname == s.name) su = &s;
      NUMATTN_CHECK(su, "unknown set-up '{}': use mha768, mla512 or mha4096", sname);
      for (const auto& stname : split_list(o->strategies)) {
        const auto st = decomp::parse_strategy(stname);
        std::vector<double> kqk, kvo, lb, lp, ob, op;
        for (int seed = 1; seed <= o->seeds; ++seed) {
          std::fprintf(stderr, "\rbd-study: %s %s seed %d ...        ", su->name, stname.c_str(), seed);
          const auto rl = transform::random_layer(su->d_model, su->d_kv, su->heads, su->kv_heads,
                                                  su->head_dim, false, static_cast<std::uint64_t>(seed));
          transform::BdaOptions opt;
          opt.pairs = transform::parse_bda_pairs(o->pairs);
          opt.strategy = st;
          opt.kappa_threshold = std::numeric_limits<double>::infinity();  // study the rule itself
          const auto L = transform::bda_transform(rl.view(), opt);
          const auto a = transform::evaluate_bda(rl.view(), L, o->tokens,
                                                 1000 + static_cast<std::uint64_t>(seed), ctx);
          kqk.push_back(L.qk.applied ? L.qk.kappa_max : 0);
          kvo.push_back(L.vo.applied ? L.vo.kappa_max : 0);
          lb.push_back(a.logit_err_bda);
          lp.push_back(a.logit_err_plain);
          ob.push_back(a.out_err_bda);
          op.push_back(a.out_err_plain);
        }
        Row r;
        r["setup"] = su->name;
        r["strategy"] = stname;
        r["seeds"] = o->seeds;
        r["kappa_qk_max"] = median(kqk);
        r["kappa_vo_max"] = median(kvo);
        r["logit_err_bda"] = median(lb);
        r["out_err_bda"] = median(ob);
        r["logit_err_plain"] = median(lp);
        r["out_err_plain"] = median(op);
        r["worst_kappa_seed_max"] = std::max(*std::max_element(kqk.begin(), kqk.end()),
                                             *std::max_element(kvo.begin(), kvo.end()));
        rows.push_back(r);
      }
    }
    std::fprintf(stderr, "\r%60s\r", "");
    print_table(std::cout, rows, parse_format(o->format));
  });
}

NUMATTN_COMMAND(62, add_bd_study);

}  // namespace numattn::cli
