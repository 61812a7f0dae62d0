#!/usr/bin/env python3
"""Validates the a-posteriori error estimate (est_rel_error, est_rel_error_hi of `numattn run`)
against the true error, over many runs of the CLI.

    scripts/validate_estimate.py [--numattn build/bin/numattn] [--quick] [--qkv DIR --layer L]
                                 [--json OUT] [--min-coverage 0.9] [--min-close 0.9]

Each run is `numattn run --est-rows 32` of one approximate method on one problem with the full
float64 check (every row, --check-rows = all rows): rel_fro_error is then the true error, and
the run's estimate comes from 32 other-seeded rows. Reported:
  coverage  the fraction of runs with true error <= est_rel_error_hi (the bound holds; nominal
            level 0.95, one-sided)
  close     the fraction with est_rel_error within a factor 2 of the true error (runs whose true
            error and estimate are both under 1e-6, float32 rounding, count as close)
Problems: methods x N x input distribution (gaussian, spiky) x seeds, causal on odd seeds; with
--qkv, also the captured layer's Q/K/V (causal bottom-right, the model's rule, for methods that
have it) at logit scales 1 and 2. Exits 1 when
coverage or close falls below its minimum. Only the standard library is used.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Approximate methods at parameters where they are not exact on the problem sizes used (N up to
# 1024 keys), spanning sparse, low-rank and kernel families.
METHODS = [
    "sparse.window(left=64,right=64,sinks=4)",
    "sparse.topk(k=32)",
    "sparse.routing",
    "sparse.hyper(min_seq_len=128)",
    "lowrank.nystrom(landmarks=32)",
    "lowrank.linformer(k=64)",
    "lowrank.loki(topk_frac=0.25)",
    "kernel.performer(features=128)",
    "kernel.levattention(keys=64)",
]
# Methods without a causal mode run every problem non-causal.
NONCAUSAL = ("sparse.routing", "lowrank.nystrom", "lowrank.linformer")
FLOAT32_LEVEL = 1e-6


def run(numattn, args):
    cmd = [numattn, "run", "--format", "json", "--threads", "2"] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "rc %d" % p.returncode
    return json.loads(p.stdout), None


def judge(row):
    truth, est, hi = row["rel_fro_error"], row["est_rel_error"], row["est_rel_error_hi"]
    if truth is None or est is None:
        return None
    covered = hi is not None and truth <= hi
    if truth < FLOAT32_LEVEL and est < FLOAT32_LEVEL:
        close = True
    else:
        close = truth > 0 and est > 0 and 0.5 <= est / truth <= 2.0
    return covered, close


def problems(quick, qkv, layer, skip_random=False, qkv_check_rows=1000000000):
    sizes = [128, 256] if quick else [256, 512, 1024]
    seeds = [0, 1] if quick else [0, 1, 2, 3]
    methods = METHODS[:4] if quick else METHODS
    for m in methods if not skip_random else []:
        for n in sizes:
            for dist in ("gaussian", "spiky"):
                for s in seeds:
                    if quick and (n // 128 + s) % 2:  # half the grid, causal and not
                        continue
                    causal = "bottom-right" if s % 2 and not m.startswith(NONCAUSAL) else "none"
                    yield m, ["--n", str(n), "--heads", "4", "--kv-heads", "2", "--d", "64",
                              "--seed", str(s), "--dist", dist, "--causal", causal,
                              "--check-rows", str(4 * n)], "%s n=%d %s seed=%d %s" % (m, n, dist, s, causal)
    if qkv:
        for m in methods:
            for logit in ("1", "2"):
                causal = "none" if m.startswith(NONCAUSAL) else "bottom-right"
                yield m, ["--qkv", qkv, "--layer", str(layer), "--causal", causal,
                          "--logit-scale", logit, "--check-rows", str(qkv_check_rows)], \
                    "%s capture layer %d logits x%s" % (m, layer, logit)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--numattn", default=os.path.join(HERE, "..", "build", "bin", "numattn"))
    ap.add_argument("--quick", action="store_true", help="a small grid (the ctest)")
    ap.add_argument("--qkv", help="a `numattn capture` directory: add runs on its layer --layer")
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--qkv-check-rows", type=int, default=-1,
                    help="rows of the 'true' error on the capture (-1: every row; a large sample, "
                         "e.g. 4096, when every row would take too long)")
    ap.add_argument("--skip-random", action="store_true", help="only the runs on --qkv")
    ap.add_argument("--est-rows", type=int, default=32)
    ap.add_argument("--json", help="write every run's numbers here")
    ap.add_argument("--min-coverage", type=float, default=0.9)
    ap.add_argument("--min-close", type=float, default=0.9)
    a = ap.parse_args()

    records, failed = [], []
    check = a.qkv_check_rows if a.qkv_check_rows > 0 else 1000000000
    for method, args, label in problems(a.quick, a.qkv, a.layer, a.skip_random, check):
        row, err = run(a.numattn, ["--method", method, "--est-rows", str(a.est_rows)] + args)
        if row is None:
            failed.append((label, err))
            continue
        j = judge(row)
        if j is None:
            failed.append((label, "no error or estimate: %s" % row.get("status")))
            continue
        records.append({"label": label, "method": method, "source": row.get("source"),
                        "truth": row["rel_fro_error"], "est": row["est_rel_error"],
                        "hi": row["est_rel_error_hi"], "covered": j[0], "close": j[1]})
        print("%-70s true %.3e  est %.3e  hi %.3e  %s%s" % (
            label, row["rel_fro_error"], row["est_rel_error"], row["est_rel_error_hi"] or float("inf"),
            "covered" if j[0] else "MISSED", "" if j[1] else "  (not within x2)"), flush=True)

    n = len(records)
    if n == 0:
        print("no runs succeeded", file=sys.stderr)
        return 1
    cov = sum(r["covered"] for r in records) / n
    close = sum(r["close"] for r in records) / n
    print("\nper method (coverage, within x2, runs):")
    for m in sorted({r["method"] for r in records}):
        rs = [r for r in records if r["method"] == m]
        print("  %-45s %5.1f%%  %5.1f%%  %d" % (m, 100 * sum(r["covered"] for r in rs) / len(rs),
                                               100 * sum(r["close"] for r in rs) / len(rs), len(rs)))
    tiny = sum(r["truth"] < FLOAT32_LEVEL for r in records)
    print("\nruns: %d (failed to run: %d; true error under %g: %d)" % (n, len(failed), FLOAT32_LEVEL, tiny))
    print("coverage (true <= est_rel_error_hi, level 0.95): %.1f%%" % (100 * cov))
    print("estimate within x2 of the truth: %.1f%%" % (100 * close))
    for label, err in failed:
        print("  failed: %s: %s" % (label, err))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": n, "coverage": cov, "close": close, "records": records,
                       "failed": failed}, f, indent=1)
    ok = cov >= a.min_coverage and close >= a.min_close
    if not ok:
        print("FAILED: coverage %.3f (min %.2f), close %.3f (min %.2f)" % (cov, a.min_coverage, close, a.min_close))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
