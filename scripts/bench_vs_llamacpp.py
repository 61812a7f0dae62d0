#!/usr/bin/env python3
"""Decode (or prefill) tokens/s of numattn against llama.cpp's llama-bench on the same GGUF file.

Runs, interleaved and repeated, `numattn bench-model --ctx 0 --decode N` (one token of
context, then N decoded one at a time: llama-bench's tg test) and `llama-bench -n N -p 0 -r 1`
for each thread count, so both see the same machine load minute by minute (with --depth D:
`--ctx D` and `-d D`, decoding after D tokens of context); prints each pair,
then the medians and their ratio, and numattn's same-run roofline fraction (bytes per token
over the measured streaming-read bandwidth). With --prefill N it compares prompt processing
instead: `numattn bench-model --ctx N --decode 1` (the prefill of N tokens, logits of the last
only) against `llama-bench -p N -n 0`.

It builds and downloads nothing: pass the llama-bench binary (docs/model-runner.md says how to
build it from the llama-cpp-python source distribution).

  scripts/bench_vs_llamacpp.py /tmp/llb/bin/llama-bench --threads 1,2 --reps 5
  scripts/bench_vs_llamacpp.py /tmp/llb/bin/llama-bench --numattn-args="--activations q8"
  scripts/bench_vs_llamacpp.py /tmp/llb/bin/llama-bench --threads 2 --depth 512
  scripts/bench_vs_llamacpp.py /tmp/llb/bin/llama-bench --model gemma3 --threads 2 --prefill 512
"""
import argparse
import csv
import io
import json
import os
import shlex
import statistics
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return p.stdout


def numattn_decode(args, threads):
    ctx, dec = (args.prefill, 1) if args.prefill else (args.depth, args.tokens)
    out = run([args.numattn, "bench-model", "--model", args.model, "--ctx", str(ctx), "--decode",
               str(dec), "--threads", str(threads), "--reps", "1", "--format", "csv"]
              + shlex.split(args.numattn_args))
    rows = list(csv.DictReader(io.StringIO(out)))
    if not rows:
        sys.exit(f"numattn bench-model printed no row:\n{out}")
    r = rows[-1]
    tps = float(r["prefill_tokens_per_s"] if args.prefill else r["decode_tokens_per_s"])
    return tps, float(r["roofline_fraction"]), float(r["read_bandwidth_gbs"])


def llama_decode(args, threads):
    if args.prefill:
        cmd = ["-n", "0", "-p", str(args.prefill)]
    else:
        cmd = ["-n", str(args.tokens), "-p", "0", "-d", str(args.depth)]
    out = run([args.llama_bench, "-m", args.model] + cmd + ["-t", str(threads), "-r", "1", "-o", "json"])
    key = "n_prompt" if args.prefill else "n_gen"
    rows = [r for r in json.loads(out) if r.get(key, 0) > 0]
    if not rows:
        sys.exit(f"llama-bench printed no {'prompt' if args.prefill else 'generation'} row:\n{out}")
    return float(rows[0]["avg_ts"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("llama_bench", help="path of a built llama-bench binary")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/numattn/SmolLM2-135M-Instruct.Q4_1.gguf"),
                    help="GGUF file both run (default: numattn's default model; 'gemma3': the cached Gemma 3 270M)")
    ap.add_argument("--numattn", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "numattn"),
                    help="numattn CLI binary (default: build/bin/numattn)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens decoded per run (default 64)")
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    ap.add_argument("--depth", type=int, default=0,
                    help="tokens of context before decoding (numattn --ctx, llama-bench -d; default 0: "
                         "llama-bench's tg test, numattn one token)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="compare the prefill of this many tokens instead of decoding (llama-bench -p N -n 0)")
    ap.add_argument("--numattn-args", default="",
                    help="extra arguments for numattn bench-model, one shell-quoted string "
                         "(e.g. --numattn-args='--activations q8')")
    args = ap.parse_args()
    if args.model == "gemma3":
        cache = os.environ.get("NUMATTN_CACHE", os.path.expanduser("~/.cache/numattn"))
        args.model = os.path.join(cache, "gemma-3-270m-q4_k_m.gguf")
    for path, what in ((args.llama_bench, "llama-bench"), (args.numattn, "numattn"), (args.model, "model")):
        if not os.path.exists(path):
            sys.exit(f"{what} not found: {path}")
    if args.reps < 1 or args.tokens < 1:
        sys.exit("--reps and --tokens must be at least 1")
    if args.depth < 0 or args.prefill < 0:
        sys.exit("--depth and --prefill must be at least 0")
    threads = [int(t) for t in args.threads.split(",") if t]
    res = {t: {"numattn": [], "llama": [], "roof": [], "bw": []} for t in threads}
    what = (f"prefill of {args.prefill} tokens" if args.prefill
            else f"{args.tokens} tokens decoded after {max(1, args.depth)}")
    print(f"model {args.model}, {what}, {args.reps} interleaved repetitions"
          + (f", numattn arguments {args.numattn_args}" if args.numattn_args else ""))
    for rep in range(args.reps):
        for t in threads:
            # Alternate which one goes first so neither always follows the other.
            order = ("numattn", "llama") if rep % 2 == 0 else ("llama", "numattn")
            for who in order:
                if who == "numattn":
                    tps, roof, bw = numattn_decode(args, t)
                    res[t]["numattn"].append(tps)
                    res[t]["roof"].append(roof)
                    res[t]["bw"].append(bw)
                else:
                    res[t]["llama"].append(llama_decode(args, t))
            r = res[t]
            print(f"rep {rep + 1} threads {t}: numattn {r['numattn'][-1]:.1f} tok/s, "
                  f"llama.cpp {r['llama'][-1]:.1f} tok/s, roofline fraction {r['roof'][-1]:.3f}", flush=True)
    print("\n| threads | numattn tok/s (median) | llama-bench tok/s (median) | ratio | roofline fraction (median) | read GB/s (median) |")
    print("|---|---|---|---|---|---|")
    for t in threads:
        r = res[t]
        a, b = statistics.median(r["numattn"]), statistics.median(r["llama"])
        print(f"| {t} | {a:.1f} | {b:.1f} | {a / b:.2f} | {statistics.median(r['roof']):.3f} | "
              f"{statistics.median(r['bw']):.1f} |")


if __name__ == "__main__":
    main()
