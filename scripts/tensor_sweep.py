#!/usr/bin/env python3
"""Sweeps tensor compressions of a model's weights (transform/tensor_heads.h) through `numattn ppl`.

    scripts/tensor_sweep.py [--numattn build/bin/numattn] [--model default] [--text default]
                            [--ctx 512] [--chunks 2] [--threads T] [--mla-rank R]
                            [--spec vo-cp:rank=128 --spec tucker-qkvo:rank=256 ...]
                            [--csv out.csv] [--md out.md] [--json out.json]

One `numattn ppl --tensor SPEC --format json` per spec (default: the table of docs/tensor.md:
collaborative VO heads at ranks 64/128/256/384, Tucker shared factors of Q/K/V/O at 128/256/384/512
and of the FFN at 256/512); the CLI compresses at load and measures PPL, KL and top-1 against
the uncompressed model in the same run. Columns: spec, ppl, ppl_baseline, dppl_% (relative PPL
change), kld_mean, top1_agreement, params_kept (factored form over the weights the scheme
compresses), fit_min, fit_mean, not_converged (decompositions stopped at `iters` still moving),
tensor_s (decomposition seconds). Then, per scheme, the smallest rank whose PPL rises by at most
1% (or "none" when no rank in the sweep does). `--mla-rank R` converts the model to MLA first
(then only qk-cp applies, on the NoPE part, and the baseline is the MLA model). Rows are printed
as they finish (stderr); a failing
spec is recorded with its error and the sweep goes on. Only the standard library is used.
"""
import argparse
import csv
import json
import subprocess
import sys

DEFAULT_SPECS = [
    "vo-cp:rank=64", "vo-cp:rank=128", "vo-cp:rank=256", "vo-cp:rank=384",
    "tucker-qkvo:rank=128", "tucker-qkvo:rank=256", "tucker-qkvo:rank=384", "tucker-qkvo:rank=512",
    "tucker-ffn:rank=256", "tucker-ffn:rank=512",
]
COLUMNS = ["spec", "ppl", "ppl_baseline", "dppl_%", "kld_mean", "top1_agreement", "params_before",
           "params_after", "params_kept", "fit_min", "fit_mean", "not_converged", "tensor_s"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_one(args, spec):
    cmd = [args.numattn, "ppl", "--model", args.model, "--text", args.text, "--ctx", str(args.ctx),
           "--chunks", str(args.chunks), "--tensor", spec, "--no-progress", "--format", "json"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.mla_rank is not None:
        cmd += ["--mla-rank", str(args.mla_rank)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        err = out.stderr.strip().splitlines()
        return {"spec": spec, "error": err[-1] if err else f"exit {out.returncode}", "cmd": " ".join(cmd)}
    r = json.loads(out.stdout)
    if isinstance(r, list):
        r = r[0]
    return {
        "spec": r["tensor"], "ppl": r["ppl"], "ppl_baseline": r["ppl_baseline"],
        "dppl_%": 100.0 * r["ppl_rel_change"], "kld_mean": r["kld_mean"],
        "top1_agreement": r["top1_agreement"], "params_before": r["tensor_params_before"],
        "params_after": r["tensor_params_after"], "params_kept": r["tensor_params_kept"],
        "fit_min": r["tensor_fit_min"], "fit_mean": r["tensor_fit_mean"],
        "not_converged": r["tensor_not_converged"], "tensor_s": r["tensor_s"], "cmd": " ".join(cmd),
    }


def fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def scheme_rank(spec):
    scheme, _, rest = spec.partition(":")
    for kv in rest.split(","):
        k, _, v = kv.partition("=")
        if k == "rank":
            return scheme, v
    return scheme, "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numattn", default="build/bin/numattn")
    ap.add_argument("--model", default="default")
    ap.add_argument("--mla-rank", type=int, help="convert to MLA at this latent rank first (ppl --mla-rank)")
    ap.add_argument("--text", default="default")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--spec", action="append", help="a --tensor spec (repeatable); default: the docs table")
    ap.add_argument("--csv")
    ap.add_argument("--md")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for spec in args.spec or DEFAULT_SPECS:
        row = run_one(args, spec)
        rows.append(row)
        log(json.dumps({k: row.get(k) for k in COLUMNS + ["error"] if k in row}))
    good = [r for r in rows if "error" not in r]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['spec']} | error: {r['error']} |")
        else:
            lines.append("| " + " | ".join(fmt(r[c]) for c in COLUMNS) + " |")
    lines.append("")
    by_scheme = {}
    for r in good:
        scheme, rank = scheme_rank(r["spec"])
        by_scheme.setdefault(scheme, []).append((r["params_kept"], rank, r["dppl_%"]))
    for scheme, items in by_scheme.items():
        ok = sorted((p, rank) for p, rank, d in items if d <= 1.0)
        lines.append(f"- {scheme}: smallest rank with PPL rise <= 1%: "
                     + (f"rank {ok[0][1]} (params kept {ok[0][0]:.3f})" if ok else "none in this sweep"))
    text = "\n".join(lines)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS + ["error", "cmd"], extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
