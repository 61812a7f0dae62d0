"""Overhead of the Python binding over the CLI's kernel time, measured in one run.

    .venv/bin/python examples/bench_overhead.py --cli build/bin/numattn [--n 4096 --heads 8 --d 64]

The same float32 inputs (random, seeded) go through `numattn run --q/--k/--v ... --no-lse`, whose
`time_ms` is the median of --reps timed calls of the method alone, and through
numattn.attention(...), timed around the whole Python call (argument conversion, the output
array, the kernel). Rounds alternate CLI and Python so both see the same machine load; the
medians over rounds are compared. Prints one JSON object.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import numattn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True, help="path of the numattn CLI")
    ap.add_argument("--method", default="exact.flash")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5, help="timed calls per round (median)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="0 = all cores")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    shape = (a.batch, a.heads, a.n, a.d)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    threads = a.threads or None
    cli_ms, py_ms = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, x in (("q", q), ("k", k), ("v", v)):
            np.save(os.path.join(tmp, name + ".npy"), x)
        cmd = [a.cli, "run", "--method", a.method, "--q", f"{tmp}/q.npy", "--k", f"{tmp}/k.npy",
               "--v", f"{tmp}/v.npy", "--no-lse", "--check-rows", "0", "--reps", str(a.reps),
               "--threads", str(a.threads), "--format", "json"]
        numattn.attention(q, k, v, method=a.method, threads=threads)  # warm-up, as the CLI's
        for _ in range(a.rounds):
            row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            cli_ms.append((row[0] if isinstance(row, list) else row)["time_ms"])
            t = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                numattn.attention(q, k, v, method=a.method, threads=threads)
                t.append((time.perf_counter() - t0) * 1e3)
            py_ms.append(statistics.median(t))
    cli, py = statistics.median(cli_ms), statistics.median(py_ms)
    print(json.dumps({"method": a.method, "shape_bhnd": list(shape), "reps": a.reps, "rounds": a.rounds,
                      "cli_time_ms": cli, "python_time_ms": py, "overhead_pct": 100 * (py / cli - 1),
                      # each round's Python median over the CLI's of the same round: the pairs saw
                      # the same machine load, so their ratio is steadier than the medians' on a
                      # shared machine
                      "overhead_pct_paired": 100 * (statistics.median(p / c for p, c in zip(py_ms, cli_ms)) - 1),
                      "cli_rounds_ms": cli_ms, "python_rounds_ms": py_ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
