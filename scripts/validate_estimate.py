#!/usr/bin/env python3
"""Validates the a-posteriori error estimate (est_rel_error, est_rel_error_hi of `numattn run`)
against the true error, over many runs of the CLI.

    scripts/validate_estimate.py [--numattn build/bin/numattn] [--quick] [--json OUT]
                                 [--min-coverage 0.9] [--min-close 0.9]
    scripts/validate_estimate.py --captures /tmp/cap-est-2048,/tmp/cap-est-8192 --layers 3,15,27
                                 [--seeds 0,1] [--methods all|NAME,...] [--budgets] [--json OUT]

Each run is `numattn run` of one approximate method with its own estimate (the automatic row
count, `--est-rows -1`). Reported:
  coverage  the fraction of runs with true error <= est_rel_error_hi (the bound holds; nominal
            level 0.95, one-sided)
  close     the fraction with est_rel_error within a factor 2 of the true error (runs whose true
            error and estimate are both under 1e-6, float32 rounding, count as close)

Random problems (the default; --quick is the ctest): methods x N x input distribution x seeds,
causal on odd seeds; the true error is rel_fro_error with every row checked. Only the standard
library is used.

Captured problems (--captures: `numattn capture` directories): every registered approximate
method (not exact, dist.* or auto.select) at its default and, with --budgets, at the two budget
settings of BUDGETS, on each captured layer, causal bottom-right (non-causal methods run
without the rule), one run per seed in --seeds (the seed of the estimate's row design,
--est-seed, and of the method where it has one). The true error is measured over every row
against exact.flash's output on the same problem (its own error, about 1e-6, is far below the
errors measured); this needs numpy: the script re-runs itself with the repository's
.venv/bin/python (scripts/setup.sh) when the interpreter lacks it. A run over --timeout seconds
is dropped and counted. Exits 1 when coverage or close falls below its minimum.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Random problems: approximate methods at parameters where they are not exact on the problem
# sizes used (N up to 1024 keys), spanning sparse, low-rank and kernel families.
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

# Captured problems: two budget settings per method, one cheaper and one dearer than the
# default where the schema allows (sparse.hyper's default recursion base is every row at
# N <= 4096: 256 is its base; polysketch's sketch is at its largest by default).
BUDGETS = {
    "sparse.window": ["left=64,right=64", "left=1024,right=1024"],
    "sparse.topk": ["k=16", "k=256"],
    "sparse.routing": ["clusters=8", "clusters=128"],
    "sparse.clustered": ["topk=8", "topk=128"],
    "sparse.multipole": ["near=2", "near=32"],
    "sparse.reformer": ["chunk=32", "chunk=256"],
    "sparse.hyper": ["min_seq_len=256,block=64", "min_seq_len=256,block=512"],
    "sparse.scatterbrain": ["features=64", "chunk=256"],
    "sparse.smyrf": ["clusters=64", "clusters=8"],
    "sparse.kdeformer": ["samples=128", "samples=2048"],
    "lowrank.nystrom": ["landmarks=16", "landmarks=256"],
    "lowrank.linformer": ["k=64", "k=1024"],
    "lowrank.loki": ["topk_frac=0.0625", "topk_frac=0.5"],
    "lowrank.wildcat": ["rank=16", "rank=256"],
    "lowrank.skyformer": ["landmarks=32", "landmarks=256"],
    "kernel.performer": ["features=64", "features=1024"],
    "kernel.levattention": ["keys=128", "keys=512"],
    "kernel.polysketch": ["sketch=8", "sketch=16"],
    "kernel.tensorsketch": ["sketch=64", "sketch=1024"],
    "tensor.simplicial": ["w1=16,w2=8", "w1=128,w2=32"],
    "auto.causal": ["inner=lowrank.nystrom(landmarks=16)", "inner=lowrank.nystrom(landmarks=256)"],
}


def run(numattn, args, timeout=None):
    cmd = [numattn, "run", "--format", "json", "--threads", "2"] + args
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out after %s s" % timeout
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "rc %d" % p.returncode
    return json.loads(p.stdout), None


def judge(truth, est, hi):
    if truth is None or est is None:
        return None
    covered = hi is not None and truth <= hi
    if truth < FLOAT32_LEVEL and est < FLOAT32_LEVEL:
        close = True
    else:
        close = truth > 0 and est > 0 and 0.5 <= est / truth <= 2.0
    return covered, close


def random_problems(quick):
    sizes = [128, 256] if quick else [256, 512, 1024]
    seeds = [0, 1] if quick else [0, 1, 2, 3]
    methods = METHODS[:4] if quick else METHODS
    for m in methods:
        for n in sizes:
            for dist in ("gaussian", "spiky"):
                for s in seeds:
                    if quick and (n // 128 + s) % 2:  # half the grid, causal and not
                        continue
                    causal = "bottom-right" if s % 2 and not m.startswith(NONCAUSAL) else "none"
                    yield m, ["--n", str(n), "--heads", "4", "--kv-heads", "2", "--d", "64",
                              "--seed", str(s), "--dist", dist, "--causal", causal,
                              "--check-rows", str(4 * n)], "%s n=%d %s seed=%d %s" % (m, n, dist, s, causal)


# Not run on captures: the float64 SVD oracle costs O(N^3) per head (minutes at N = 2048).
EXCLUDED = ("lowrank.svd",)


def registered(numattn):
    out = subprocess.run([numattn, "methods", "--format", "json"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    return {r["name"]: r for r in rows
            if r["family"] not in ("exact", "dist") and r["name"] not in ("auto.select",) + EXCLUDED}


def with_params(name, params):
    return "%s(%s)" % (name, params) if params else name


def capture_runs(a, records, failed):
    import numpy as np

    methods = registered(a.numattn)
    wanted = list(methods) if a.methods == "all" else a.methods.split(",")
    work = tempfile.mkdtemp(prefix="validate_estimate_")
    out_path = os.path.join(work, "out.npy")
    seeds = [int(s) for s in a.seeds.split(",")]
    done = {}  # --jsonl records of an earlier, interrupted run: kept, not re-run
    if a.jsonl and os.path.exists(a.jsonl):
        with open(a.jsonl) as f:
            for line in f:
                r = json.loads(line)
                done[r["label"]] = r
    for cap in a.captures.split(","):
        for layer in [int(x) for x in a.layers.split(",")]:
            refs = {}
            for name in wanted:
                info = methods[name]
                causal = "bottom-right" if "causal" in info["capabilities"].split() else "none"
                if causal not in refs:
                    path = os.path.join(work, "ref_%s.npy" % causal)
                    _, err = run(a.numattn, ["--qkv", cap, "--layer", str(layer), "--causal", causal,
                                             "--method", "exact.flash", "--check-rows", "0", "--est-rows", "0",
                                             "--no-lse", "--out", path])
                    if err:
                        raise SystemExit("exact.flash on %s layer %d: %s" % (cap, layer, err))
                    ref = np.load(path).astype(np.float64)
                    refs[causal] = (ref, float((ref * ref).sum()))
                ref, ref_sq = refs[causal]
                settings = [""] + (BUDGETS.get(name, []) if a.budgets else [])
                for params in settings:
                    for s in seeds:
                        p = params
                        if " seed=" in " " + info["spec"].replace("(", " ").replace(",", " ") and "seed=" not in p:
                            p = (p + "," if p else "") + "seed=%d" % s
                        spec = with_params(name, p)
                        label = "%s %s layer %d est-seed %d" % (spec, os.path.basename(cap), layer, s)
                        if label in done:
                            records.append(done[label])
                            continue
                        t0 = time.time()
                        row, err = run(a.numattn, ["--qkv", cap, "--layer", str(layer), "--causal", causal,
                                                   "--method", spec, "--check-rows", "0", "--est-seed", str(s),
                                                   "--no-lse", "--out", out_path], a.timeout)
                        if row is None:
                            failed.append((label, err))
                            print("%-90s %s" % (label, err), flush=True)
                            continue
                        o = np.load(out_path).astype(np.float64)
                        truth = float(np.sqrt(((o - ref) ** 2).sum() / ref_sq))
                        j = judge(truth, row["est_rel_error"], row["est_rel_error_hi"])
                        if j is None:
                            failed.append((label, "no estimate: %s" % row.get("status")))
                            continue
                        rec = {"label": label, "method": name, "spec": row["method"], "capture": cap,
                               "layer": layer, "seed": s, "causal": causal, "truth": truth,
                               "est": row["est_rel_error"], "hi": row["est_rel_error_hi"],
                               "est_rows": row["est_rows"], "time_ms": row["time_ms"],
                               "wall_s": time.time() - t0, "covered": j[0], "close": j[1]}
                        records.append(rec)
                        print("%-90s true %.3e  est %.3e  hi %.3e  %s%s" % (
                            label, truth, rec["est"], rec["hi"] or float("inf"),
                            "covered" if j[0] else "MISSED", "" if j[1] else "  (not within x2)"), flush=True)
                        if a.jsonl:
                            with open(a.jsonl, "a") as f:
                                f.write(json.dumps(rec) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--numattn", default=os.path.join(ROOT, "build", "bin", "numattn"))
    ap.add_argument("--quick", action="store_true", help="a small grid of random problems (the ctest)")
    ap.add_argument("--captures", help="comma-separated `numattn capture` directories: runs on their layers")
    ap.add_argument("--layers", default="15", help="captured layers (with --captures)")
    ap.add_argument("--seeds", default="0,1", help="estimate (and method) seeds on captures")
    ap.add_argument("--methods", default="all", help="method names on captures (comma-separated) or all")
    ap.add_argument("--budgets", action="store_true", help="also the two BUDGETS settings of each method")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run on captures")
    ap.add_argument("--json", help="write every run's numbers here")
    ap.add_argument("--jsonl", help="append each capture run's record here as it finishes")
    ap.add_argument("--min-coverage", type=float, default=0.9)
    ap.add_argument("--min-close", type=float, default=0.9)
    a = ap.parse_args()

    if a.captures:
        try:
            import numpy  # noqa: F401
        except ImportError:
            venv = os.path.join(ROOT, ".venv", "bin", "python")
            if os.path.exists(venv) and os.path.realpath(sys.executable) != os.path.realpath(venv):
                os.execv(venv, [venv] + sys.argv)
            raise SystemExit("numpy is needed with --captures (scripts/setup.sh makes .venv)")

    records, failed = [], []
    if a.captures:
        capture_runs(a, records, failed)
    else:
        for method, args, label in random_problems(a.quick):
            row, err = run(a.numattn, ["--method", method] + args)
            if row is None:
                failed.append((label, err))
                continue
            j = judge(row["rel_fro_error"], row["est_rel_error"], row["est_rel_error_hi"])
            if j is None:
                failed.append((label, "no error or estimate: %s" % row.get("status")))
                continue
            records.append({"label": label, "method": method, "truth": row["rel_fro_error"],
                            "est": row["est_rel_error"], "hi": row["est_rel_error_hi"],
                            "est_rows": row["est_rows"], "covered": j[0], "close": j[1]})
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
    if a.captures:
        print("\nper capture and layer (coverage, within x2, runs):")
        for key in sorted({(os.path.basename(r["capture"]), r["layer"]) for r in records}):
            rs = [r for r in records if (os.path.basename(r["capture"]), r["layer"]) == key]
            print("  %-30s %5.1f%%  %5.1f%%  %d" % ("%s layer %d" % key, 100 * sum(r["covered"] for r in rs) / len(rs),
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
