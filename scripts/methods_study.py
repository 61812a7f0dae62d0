#!/usr/bin/env python3
"""Measures every approximate method the way docs/methods.md reports it, and prints Markdown.

    scripts/methods_study.py [--numattn build/bin/numattn] [--quick] [--only speed,sweep,...]

Sections (all ratios come from one run of `numattn bench`, which times exact.flash on the same
problem in the same process; absolute times on a shared machine are not evidence):
  speed     N = 16384, D = 64, H = 8, 2 threads: speed-up over exact.flash, non-causal and causal
  crossover the smallest N (D = 64, H = 8) at which each method is faster than exact.flash
  sweep     error against budget on Gaussian, spiky and real (captured) Q/K/V, three budgets each,
            and for the low-rank methods the ratio to lowrank.svd at equal rank; --family picks
            the families swept, --recall K adds the top-K recall of each method's attention rows
  ppl       the default model with each causal method in every layer: PPL, KL and top-1 against
            exact.flash at ctx 512
  ortho     Performer: orthogonal against i.i.d. features at equal M over 20 seeds
Only the standard library is used, so any python3 runs it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# (spec name, budget parameter, three budgets, rank-like: compared with lowrank.svd(rank=value))
SWEEPS = [
    ("lowrank.svd", "rank", ["16", "64", "256"], False),
    ("lowrank.linformer", "k", ["16", "64", "256"], True),
    ("lowrank.nystrom", "landmarks", ["16", "64", "256"], True),
    ("lowrank.skyformer", "landmarks", ["16", "64", "256"], True),
    ("lowrank.wildcat", "rank", ["16", "64", "256"], True),
    ("lowrank.loki", "topk_frac", ["0.125", "0.25", "0.5"], False),
    ("kernel.performer", "features", ["64", "256", "1024"], False),
    ("kernel.linear", None, [], False),
    ("kernel.polysketch", "sketch", ["8", "16", "32"], False),
    ("kernel.tensorsketch", "sketch", ["64", "256", "1024"], False),
    ("kernel.levattention", "keys", ["16", "64", "256"], False),
    # Budgets in increasing order of cost (routing and smyrf: fewer, larger clusters cost more).
    ("sparse.window", "left", ["64", "256", "1024"], False),
    ("sparse.topk", "k", ["16", "64", "256"], False),
    ("sparse.reformer", "rounds", ["1", "2", "4"], False),
    ("sparse.smyrf", "rounds", ["2", "8", "16"], False),
    ("sparse.routing", "clusters", ["64", "16", "4"], False),
    ("sparse.clustered", "topk", ["16", "64", "256"], False),
    ("sparse.multipole", "near", ["2", "8", "32"], False),
    ("sparse.kdeformer", "samples", ["200", "800", "3200"], False),
    ("sparse.hyper(min_seq_len=256)", "block", ["64", "256", "1024"], False),
    ("sparse.scatterbrain", "features", ["64", "256", "1024"], False),
]
SPEED = ["kernel.performer(features=256)", "lowrank.nystrom(landmarks=64)",
         "lowrank.linformer(k=256)", "lowrank.skyformer(landmarks=128)", "lowrank.wildcat(rank=64)",
         "lowrank.loki", "kernel.linear", "kernel.polysketch", "kernel.tensorsketch",
         "kernel.levattention"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Tool:
    def __init__(self, path, threads):
        self.path, self.threads = path, threads

    def json(self, *args, check=True):
        cmd = [self.path, *args, "--format", "json"]
        log("$ " + " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            if check:
                raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
            return None
        out = json.loads(r.stdout)
        return out

    def bench(self, *args):
        rows = self.json("bench", "--threads", str(self.threads), *args)
        rows = rows if isinstance(rows, list) else [rows]
        # The same-run GEMM baseline row (method "blas.sgemm") is not a method row.
        return [r for r in rows if not str(r.get("method", "")).startswith("blas.")]

    def methods(self):
        return {m["name"]: m for m in self.json("methods")}


def fmt(x, f="{:.3g}"):
    return "–" if x is None else f.format(x)


def speed(tool, quick, methods):
    n = "4096" if quick else "16384"
    print(f"## Speed against exact.flash (same run): N = {n}, D = 64, H = 8, 2 threads\n")
    print("| method | causal | time ms | exact.flash ms | speed-up | target | target error | softmax error |")
    print("|---|---|---|---|---|---|---|---|")
    for causal in ["none", "bottom-right"]:
        for spec in SPEED:
            if spec.split("(")[0] not in methods:
                continue
            for r in tool.bench("--method", spec, "--n", n, "--d", "64", "--heads", "8",
                                "--causal", causal, "--reps", "3", "--check-rows", "64"):
                if not r.get("status", "").startswith("ok"):
                    print(f"| {spec} | {causal} | {r.get('status')} | | | | | |")
                    continue
                print(f"| {r['method']} | {causal} | {fmt(r['time_ms'], '{:.1f}')} | "
                      f"{fmt(r.get('exact_time_ms'), '{:.1f}')} | {fmt(r.get('speedup_vs_exact'), '{:.1f}×')} | "
                      f"{r.get('target')} | {fmt(r.get('target_rel_fro_error'))} | {fmt(r.get('rel_fro_error'))} |")
    print()


def crossover(tool, quick, methods):
    ns = ["256", "512", "1024", "2048", "4096"] + ([] if quick else ["8192", "16384"])
    print("## Crossover: the smallest N at which a method beats exact.flash (D = 64, H = 8, non-causal)\n")
    print("| method | " + " | ".join(f"N={n}" for n in ns) + " | crossover N |")
    print("|---|" + "---|" * (len(ns) + 1))
    for spec in SPEED:
        if spec.split("(")[0] not in methods:
            continue
        rows = tool.bench("--method", spec, "--n", ",".join(ns), "--d", "64", "--heads", "8",
                          "--reps", "3", "--check-rows", "0")
        su = {str(r["n"]): r.get("speedup_vs_exact") for r in rows}
        cross = next((n for n in ns if (su.get(n) or 0) > 1), None)
        print(f"| {spec} | " + " | ".join(fmt(su.get(n), "{:.2f}×") for n in ns) +
              f" | {cross if cross else '> ' + ns[-1]} |")
    print()


def sweep_rows(tool, name, param, values, problem, extra):
    if param is None:
        return {None: tool.bench("--method", name, *problem, "--reps", "1", *extra)[0]}
    rows = tool.bench("--method", name, "--sweep", f"{param}={','.join(values)}", *problem, "--reps", "1", *extra)
    return {str(r.get("sweep_value")): r for r in rows}


def sweep(tool, quick, methods, capture_dir, n_synth, layers, families, recall, causal):
    problems = [(f"gaussian, N = {n_synth}, H = 4, D = 64", ["--n", n_synth, "--d", "64", "--heads", "4", "--dist", "gaussian"]),
                (f"spiky, N = {n_synth}, H = 4, D = 64", ["--n", n_synth, "--d", "64", "--heads", "4", "--dist", "spiky"])]
    for layer in layers:
        problems.append((f"real, layer {layer}", ["--qkv", capture_dir, "--layer", str(layer)]))
    if causal:
        problems = [(label + ", causal", args + ["--causal", "top-left"]) for label, args in problems]
    extra = ["--recall", str(recall)] if recall else []
    print(f"## Error against budget ({'causal' if causal else 'non-causal'}; target error / softmax error; ratio to lowrank.svd at equal rank)\n")
    for label, problem in problems:
        print(f"### {label}\n")
        rec = f" top-{recall} recall |" if recall else ""
        print(f"| method | budget | target | target error | softmax error | ÷ svd error |{rec} time ms | speed-up |")
        print("|---|---|---|---|---|---|---|---|" + ("---|" if recall else ""))
        svd = {}
        for name, param, values, ranklike in SWEEPS:
            base = name.split("(")[0]
            if base not in methods or base.split(".")[0] not in families:
                continue
            if causal and "causal" not in methods[base]["capabilities"].split():
                continue
            rows = sweep_rows(tool, name, param, values, problem, extra)
            if name == "lowrank.svd":
                svd = {v: r.get("rel_fro_error") for v, r in rows.items()}
            for v, r in rows.items():
                ratio = None
                if ranklike and svd.get(v) and r.get("rel_fro_error") is not None:
                    ratio = r["rel_fro_error"] / svd[v]
                if not str(r.get("status", "")).startswith("ok"):
                    print(f"| {name} | {param}={v} | {r.get('status')} | | | | | |" + (" |" if recall else ""))
                    continue
                rc = f" {fmt(r.get('topk_recall'), '{:.3f}')} |" if recall else ""
                print(f"| {name} | {'' if param is None else f'{param}={v}'} | {r.get('target')} | "
                      f"{fmt(r.get('target_rel_fro_error'))} | {fmt(r.get('rel_fro_error'))} | "
                      f"{fmt(ratio, '{:.2f}')} |{rc} {fmt(r.get('time_ms'), '{:.1f}')} | "
                      f"{fmt(r.get('speedup_vs_exact'), '{:.1f}×')} |")
        print()


def ppl(tool, quick, methods, chunks, ctx, families, specs):
    print(f"## In the model: every layer's attention replaced, ctx {ctx}, {chunks} chunks, against exact.flash\n")
    print("| attention | PPL | KL vs exact | top-1 agreement |")
    print("|---|---|---|---|")
    if not specs:
        # Every causal approximate method at its defaults; lowrank.svd is an oracle (an SVD of
        # every head's P per chunk): minutes per chunk.
        specs = [name for name, info in methods.items()
                 if "causal" in info["capabilities"].split() and info["family"] in families
                 and name != "lowrank.svd"]
    for spec in ["exact.flash"] + specs:
        d = tool.json("ppl", "--model", "default", "--text", "default", "--ctx", str(ctx), "--chunks",
                      chunks, "--attn", spec, "--baseline", "exact.flash", "--no-progress",
                      "--threads", str(tool.threads), check=False)
        if d is None:
            print(f"| {spec} | failed | | |")
            continue
        print(f"| {d['attn']} | {d['ppl']:.3f} ± {d['ppl_stderr']:.3f} | {fmt(d.get('kld_mean'))} | "
              f"{fmt(d.get('top1_agreement'), '{:.4f}')} |")
    print()


def ortho(tool, quick, methods):
    if "kernel.performer" not in methods:
        return
    seeds = 20
    print(f"## Performer: orthogonal against i.i.d. features (M = 64 and 256, {seeds} seeds, N = 1024, D = 64)\n")
    print("| features | orthogonal: mean error | i.i.d.: mean error | ratio |")
    print("|---|---|---|---|")
    for m in ["64", "256"]:
        mean = {}
        for o in ["true", "false"]:
            errs = []
            rows = tool.bench("--method", f"kernel.performer(features={m},orthogonal={o})", "--sweep",
                              "seed=" + ",".join(str(s) for s in range(1, seeds + 1)), "--n", "1024",
                              "--d", "64", "--heads", "4", "--reps", "1", "--check-rows", "512")
            errs = [r["rel_fro_error"] for r in rows if r.get("rel_fro_error") is not None]
            mean[o] = statistics.mean(errs)
        print(f"| {m} | {mean['true']:.4g} | {mean['false']:.4g} | {mean['true'] / mean['false']:.3f} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numattn", default="build/bin/numattn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one layer, fewer chunks")
    ap.add_argument("--only", default="speed,crossover,sweep,ppl,ortho")
    ap.add_argument("--capture", default="", help="existing capture directory (default: capture now)")
    ap.add_argument("--n-synth", default="", help="N of the Gaussian and spiky sweeps (default 2048; 1024 with --quick)")
    ap.add_argument("--layers", default="", help="captured layers swept (default 0,15,29; 0 with --quick)")
    ap.add_argument("--chunks", default="", help="ppl chunks (default 20; 4 with --quick)")
    ap.add_argument("--ctx", type=int, default=512, help="ppl context length")
    ap.add_argument("--ppl-attn", default="", help="';'-separated --attn specs for ppl (default: every causal method)")
    ap.add_argument("--causal", action="store_true", help="sweep causal (top-left) problems with the causal methods only")
    ap.add_argument("--family", default="lowrank,kernel,sparse", help="families swept (comma-separated)")
    ap.add_argument("--recall", type=int, default=0, help="K: add top-K recall columns to the sweep (0 = off)")
    ap.add_argument("--tokens", default="", help="tokens captured when --capture is not given (default 2048; 1024 with --quick)")
    a = ap.parse_args()
    tool = Tool(a.numattn, a.threads)
    methods = tool.methods()
    only = set(a.only.split(","))
    if "speed" in only:
        speed(tool, a.quick, methods)
    if "crossover" in only:
        crossover(tool, a.quick, methods)
    if "sweep" in only:
        cap = a.capture
        if not cap:
            cap = tempfile.mkdtemp(prefix="numattn_capture_")
            subprocess.run([a.numattn, "capture", "--model", "default", "--text", "default", "--tokens",
                            a.tokens or ("1024" if a.quick else "2048"), "--layers", a.layers or ("0" if a.quick else "0,15,29"),
                            "--out", cap], check=True, stdout=sys.stderr)
        sweep(tool, a.quick, methods, cap, a.n_synth or ("1024" if a.quick else "2048"),
              [int(x) for x in (a.layers or ("0" if a.quick else "0,15,29")).split(",")],
              set(a.family.split(",")), a.recall, a.causal)
    if "ppl" in only:
        ppl(tool, a.quick, methods, a.chunks or ("4" if a.quick else "20"), a.ctx, set(a.family.split(",")),
            [x for x in a.ppl_attn.split(";") if x])
    if "ortho" in only:
        ortho(tool, a.quick, methods)


if __name__ == "__main__":
    main()
