#!/usr/bin/env python3
"""Prefill tokens/s of the in-place quantized weights against float32, through `numattn ppl`.

    scripts/prefill_bench.py [--numattn build/bin/numattn] [--model default] [--text default]
                             [--ctx 512] [--chunks 4] [--threads 2,1] [--pairs 5]
                             [--before OTHER_NUMATTN] [--then OLD_NUMATTN]

For each thread count, --pairs rounds of `numattn ppl --weights gguf` and `--weights f32`
(--format json), the order rotating from one round to the next so that a change of load hits
every arm alike; --before adds a third arm, another build's `--weights gguf` (the in-place path
before a change); --then adds another, a build from before weights were kept in place (its `ppl`
has no --weights: float32 weights always), so that the in-place prefill can be compared with
the prefill the project had then, not only with today's float32 path. Prints every run's tokens/s and PPL, then per thread count the medians of
tokens/s and of each forward phase (profile_s), the ratio of the medians to float32, the
best run of each arm and its ratio to float32's best (the run least disturbed by other load), the
median CPU seconds per run (user + system of the whole process: not inflated by time spent
descheduled, but including the load, which dequantizes every weight with --weights f32, so
compare it between the two in-place arms; with OMP_WAIT_POLICY=passive in the environment
waiting threads sleep instead of spinning), the largest relative PPL difference, and the load
average before and after. The machine may be
shared: compare ratios measured in the same minutes, not absolute figures.
Only the standard library is used.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys


def run_ppl(a, arm, threads):
    weights = "gguf" if arm.startswith("gguf") else "f32"
    exe = {"gguf-before": a.before, "f32-then": a.then}.get(arm, a.numattn)
    cmd = [exe, "ppl", "--model", a.model, "--text", a.text, "--ctx", str(a.ctx),
           "--chunks", str(a.chunks), "--threads", str(threads), "--format", "json"]
    if arm != "f32-then":
        cmd += ["--weights", weights]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = json.loads(out)
    if isinstance(row, list):
        row = row[0]
    # CPU seconds of the whole process (load and tokenization included), which time the
    # process spends descheduled does not inflate.
    row["cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return row


def phase_median(rows, phase):
    times = [r.get("profile_s", {}).get(phase) for r in rows]
    return "-" if None in times else f"{statistics.median(times):.3f}"


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numattn", default="build/bin/numattn", help="the build measured")
    p.add_argument("--model", default="default", help="GGUF file (default: the cached SmolLM2)")
    p.add_argument("--text", default="default", help="text file (default: the cached Austen)")
    p.add_argument("--ctx", type=int, default=512, help="tokens per ppl chunk")
    p.add_argument("--chunks", type=int, default=4, help="ppl chunks per run")
    p.add_argument("--threads", default="2,1", help="comma-separated thread counts")
    p.add_argument("--pairs", type=int, default=5, help="rounds: one run of every arm each")
    p.add_argument("--before", help="another numattn build, run as a third arm (--weights gguf)")
    p.add_argument("--then", help="a numattn build from before weights in place (float32 "
                   "weights, no --weights flag), run as another arm")
    a = p.parse_args()
    arms = ["gguf", "f32"] + (["gguf-before"] if a.before else []) + (["f32-then"] if a.then else [])
    for t in [int(s) for s in a.threads.split(",")]:
        res = {w: [] for w in arms}
        before = loadavg()
        for i in range(a.pairs):
            order = arms[i % len(arms):] + arms[:i % len(arms)]
            if i % 2 == 1:
                order.reverse()
            for w in order:
                r = run_ppl(a, w, t)
                res[w].append(r)
                print(f"threads {t} round {i} {w:11s}: {r['tokens_per_s']:.1f} tok/s, "
                      f"ppl {r['ppl']!r}, load {loadavg()}", file=sys.stderr, flush=True)
        after = loadavg()
        med = {w: statistics.median(r["tokens_per_s"] for r in rs) for w, rs in res.items()}
        print(f"## threads {t}, ctx {a.ctx}, chunks {a.chunks}, {a.pairs} rotating rounds; "
              f"load average before {before}, after {after}")
        best_f32 = max(r["tokens_per_s"] for r in res["f32"])
        for w in arms:
            tps = ", ".join(f"{r['tokens_per_s']:.1f}" for r in res[w])
            best = max(r["tokens_per_s"] for r in res[w])
            print(f"{w:11s} tok/s: {tps}  median {med[w]:.1f}, / float32 {med[w] / med['f32']:.3f}; "
                  f"best {best:.1f}, / float32 best {best / best_f32:.3f}")
        cpu = {w: statistics.median(r["cpu_s"] for r in rs) for w, rs in res.items()}
        print("CPU s per run (median): " + ", ".join(f"{w} {cpu[w]:.2f}" for w in arms) +
              (f"; before / in place {cpu['gguf-before'] / cpu['gguf']:.3f}" if a.before else ""))
        phases = res["gguf"][0].get("profile_s", {}).keys()
        print("phase medians (s per run): " + "; ".join(
            f"{k} " + " / ".join(phase_median(res[w], k) for w in arms) for k in phases) + f" ({' / '.join(arms)})")
        ref = res["f32"][0]["ppl"]
        rel = max(abs(r["ppl"] - ref) / ref for rs in res.values() for r in rs)
        print(f"ppl in place {res['gguf'][0]['ppl']!r}, float32 {ref!r}, "
              + (f"before {res['gguf-before'][0]['ppl']!r}, " if a.before else "")
              + (f"then {res['f32-then'][0]['ppl']!r}, " if a.then else "") +
              f"largest relative difference {rel:.2e}")


if __name__ == "__main__":
    main()
