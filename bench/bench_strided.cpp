// Strided against contiguous inputs for exact.flash: the same Q/K/V stored as [B, H, N, D]
// (contiguous rows per head) and as [B, N, H, D] (what Hugging Face passes: a head's rows H·D
// elements apart), in float32 and with half-precision Q, K, V and output. Runs are
// interleaved (contiguous, strided, contiguous, ...) so that load from other processes hits
// both alike; prints the median time of each and their ratio.
//
//   bench_strided [--n 8192] [--heads 8] [--kv-heads 8,2] [--d 64] [--reps 5] [--threads 2]
//                 [--types f32,f16,bf16] [--causal none,bottom-right]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "numattn/attention/problem.h"
#include "numattn/attention/random_problem.h"
#include "numattn/attention/registry.h"
#include "numattn/core/exec.h"
#include "numattn/quant/quant.h"

namespace {

using numattn::index_t;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::size_t a = 0;
  while (a <= s.size()) {
    const std::size_t b = std::min(s.find(',', a), s.size());
    v.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return v;
}

/// One problem in one layout: float32 buffers from RandomProblem, half copies when asked.
struct Case {
  std::unique_ptr<numattn::RandomProblem> prob;
  std::vector<std::uint16_t> q16, k16, v16, out16;
  numattn::AttentionProblem p;
};

std::vector<std::uint16_t> to_half(const std::vector<float>& x, numattn::KvType t) {
  std::vector<std::uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    h[i] = t == numattn::KvType::kF16 ? numattn::fp32_to_fp16(x[i]) : numattn::fp32_to_bf16(x[i]);
  return h;
}

void make_case(Case& c, const numattn::ProblemConfig& cfg, numattn::KvType t) {
  c.prob = std::make_unique<numattn::RandomProblem>(cfg);
  c.p = c.prob->problem();
  c.p.lse = {};
  if (t == numattn::KvType::kF32) return;
  c.q16 = to_half(c.prob->q_data(), t);
  c.k16 = to_half(c.prob->k_data(), t);
  c.v16 = to_half(c.prob->v_data(), t);
  c.out16.assign(c.prob->out_data().size(), 0);
  c.p.q.data = nullptr;
  c.p.k.data = nullptr;
  c.p.v.data = nullptr;
  c.p.out.data = nullptr;
  c.p.half_q = {t, c.q16.data()};
  c.p.half = {t, c.k16.data(), c.v16.data()};
  c.p.half_out = {t, c.out16.data()};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  index_t n = 8192, heads = 8, d = 64;
  int reps = 5, threads = 2;
  std::string kv = "8,2", types = "f32,f16,bf16", causals = "none,bottom-right";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], x = argv[i + 1];
    if (a == "--n") n = std::stoll(x);
    else if (a == "--heads") heads = std::stoll(x);
    else if (a == "--kv-heads") kv = x;
    else if (a == "--d") d = std::stoll(x);
    else if (a == "--reps") reps = std::stoi(x);
    else if (a == "--threads") threads = std::stoi(x);
    else if (a == "--types") types = x;
    else if (a == "--causal") causals = x;
    else {
      std::fprintf(stderr, "error: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const auto method = numattn::create_method("exact.flash");
  const numattn::ExecContext ctx{threads};
  std::printf("| Hkv | causal | type | contiguous ms | strided ms | strided / contiguous |\n|---|---|---|---|---|---|\n");
  for (const std::string& hk : split(kv))
    for (const std::string& cs : split(causals))
      for (const std::string& ts : split(types)) {
        numattn::ProblemConfig cfg;
        cfg.batch = 1;
        cfg.heads = heads;
        cfg.kv_heads = std::stoll(hk);
        cfg.n = n;
        cfg.d = d;
        cfg.causal = numattn::parse_causal(cs);
        cfg.want_lse = false;
        const numattn::KvType t = numattn::parse_kv_type(ts);
        Case contiguous, strided;
        make_case(contiguous, cfg, t);
        cfg.layout = numattn::Layout::kBNHD;
        make_case(strided, cfg, t);
        std::vector<double> tc, tsd;
        for (int r = 0; r < reps + 1; ++r)
          for (Case* c : {&contiguous, &strided}) {
            const auto t0 = std::chrono::steady_clock::now();
            method->run(c->p, ctx);
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (r > 0) (c == &contiguous ? tc : tsd).push_back(ms);  // the first round warms up
          }
        const double mc = median(tc), ms = median(tsd);
        std::printf("| %s | %s | %s | %.1f | %.1f | %.3f |\n", hk.c_str(), cs.c_str(), ts.c_str(), mc, ms, ms / mc);
        std::fflush(stdout);
      }
  return 0;
}
