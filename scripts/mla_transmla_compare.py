#!/usr/bin/env python3
"""numattn's side of the comparison with TransMLA's own code (docs/latent.md, section 6).

    scripts/mla_transmla_compare.py [--numattn build/bin/numattn] [--threads T] [--rows a,b,...]
                                    [--md out.md]

The protocol of the comparison: the default model and text, `numattn ppl --ctx 512 --chunks 10`
(2,550 scored tokens from the start of the text), the conversion calibrated on the last 2,048
tokens of the same text (`calib=default,calib_tokens=2048`, the mla transform's defaults), which
the scored chunks never reach. One `numattn ppl --format json --transform SPEC` per row, one at a
time; each prints its PPL beside the GQA model's (same run). The TransMLA column is not computed
here: TransMLA (github.com/MuLabPKU/TransMLA, not packaged on PyPI) runs as an external step, with
its algorithm files unchanged, fp32, the same calibration tokens and chunks (docs/latent.md).
Only the standard library is used.
"""
import argparse
import json
import subprocess
import sys

# name, cache per token and layer, what the row compares, transform spec, TransMLA's PPL
ROWS = [
    ("exact", 384, "exact merge (every RoPE dim, full rank)", "mla(rank=0,rope_heads=3)", None),
    ("ff2", 384, "100%, RoPE removal only, FreqFold 2", "mla(rank=0,rope_dims=64,freqfold=2)", 28.13),
    ("ff4", 384, "100%, RoPE removal only, FreqFold 4", "mla(rank=0,rope_dims=64,freqfold=4)", 31.03),
    ("half_ff1", 192, "50%, 128 latent + 64 RoPE, FreqFold 1", "mla(rank=128,rope_dims=64,freqfold=1)", 45.40),
    ("half_best", 192, "50%, budget search", "mla(budget=0.5)", 36.17),
    ("quarter_64", 96, "25%, 32 latent + 64 RoPE, FreqFold 2", "mla(rank=32,rope_dims=64,freqfold=2)", 94.51),
    ("quarter_32", 96, "25%, 64 latent + 32 RoPE, FreqFold 4", "mla(rank=64,rope_dims=32,freqfold=4)", 71.58),
    ("quarter_best", 96, "25%, budget search", "mla(budget=0.25)", 71.58),
]


def run(numattn, spec, threads):
    cmd = [numattn, "ppl", "--ctx", "512", "--chunks", "10", "--format", "json", "--no-progress",
           "--transform", spec]
    if threads:
        cmd += ["--threads", str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr}")
    row = json.loads(p.stdout)
    row = row[0] if isinstance(row, list) else row
    chosen = [line for line in p.stderr.splitlines() if "chose" in line]
    return row, chosen


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numattn", default="build/bin/numattn")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rows", default=",".join(r[0] for r in ROWS))
    ap.add_argument("--md", default="")
    a = ap.parse_args()
    want = a.rows.split(",")
    lines = ["| cache per token and layer | setting | numattn transform | TransMLA PPL | numattn PPL | GQA PPL |",
             "|---|---|---|---|---|---|"]
    for name, cache, what, spec, theirs in ROWS:
        if name not in want:
            continue
        row, chosen = run(a.numattn, spec, a.threads)
        cache_got = row["mla_latent"] + row["mla_d_rope"]
        note = f" ({chosen[-1].split(': ', 1)[-1]})" if chosen else ""
        line = (f"| {cache_got} ({100 * cache_got / 384:.0f}%) | {what}{note} | `{spec}` | "
                f"{'' if theirs is None else f'{theirs:.2f}'} | {row['ppl']:.4f} | {row['ppl_baseline']:.4f} |")
        if cache_got != cache:
            line += f" expected cache {cache}"
        print(line, file=sys.stderr, flush=True)
        lines.append(line)
    out = "\n".join(lines) + "\n"
    print(out)
    if a.md:
        with open(a.md, "w") as f:
            f.write(out)


if __name__ == "__main__":
    main()
