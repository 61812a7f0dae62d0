#!/usr/bin/env bash
# `numattn run|bench|ppl` under mpirun (registered by tests/dist/CMakeLists.txt):
#  1. run --method dist.ring / dist.ulysses with 2 ranks passes its float64 check and writes the
#     same output as the single-process exact.flash (to float32 rounding);
#  2. a bad input on rank 1's shard (a NaN in its rows of --q) ends both ranks with the error,
#     well within a timeout (no hang);
#  3. bench under mpirun gives one row per (problem, method) with the overlap figure;
#  4. ppl with 2 ranks gives the single-process statistics (skipped, exit 77, without the
#     default model and text in ~/.cache/numattn; not run with NUMATTN_TEST_QUICK=1).
set -euo pipefail
NUMATTN=$1
MPIRUN=$2
read -r -a MPIARGS <<< "${3//;/ }"
PY=/usr/bin/python3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mpi() { timeout 120 "$MPIRUN" "${MPIARGS[@]}" -n "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. Output equality with the single process, through files written by rank 0.
for m in dist.ring dist.ulysses; do
  mpi 2 "$NUMATTN" run --method "$m" --n 301 --n-kv 250 --heads 4 --kv-heads 2 --d 16 \
    --causal bottom-right --check-rows 128 --threads 1 --format json --out "$T/$m.npy" \
    --lse-out "$T/$m.lse.npy" > "$T/$m.json"
  "$PY" - "$T/$m.json" <<'PY' || fail "$m row"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "ok" and r["ranks"] == 2 and r["rows_checked"] == 128, r
assert 0 <= r["wait_fraction"] <= 1 and r["peak_rss_bytes"] > 0, r
PY
done
"$NUMATTN" run --method exact.flash --n 301 --n-kv 250 --heads 4 --kv-heads 2 --d 16 \
  --causal bottom-right --check-rows 0 --threads 1 --format json --out "$T/flash.npy" \
  --lse-out "$T/flash.lse.npy" > /dev/null
"$PY" - "$T" <<'PY' || fail "outputs differ from exact.flash"
import numpy as np, sys
t = sys.argv[1]
f, fl = np.load(t + "/flash.npy"), np.load(t + "/flash.lse.npy")
for m in ("dist.ring", "dist.ulysses"):
    o, l = np.load(t + "/" + m + ".npy"), np.load(t + "/" + m + ".lse.npy")
    assert o.shape == f.shape and l.shape == fl.shape, (m, o.shape, f.shape)
    assert np.max(np.abs(o - f) / np.maximum(1, np.abs(f))) < 1e-5, m
    # Rows with no visible key (bottom-right, Nq > Nk): lse -inf on both sides.
    assert np.array_equal(np.isinf(l), np.isinf(fl)) and np.all(l[np.isinf(l)] == fl[np.isinf(fl)]), m
    fin = np.isfinite(fl)
    assert np.max(np.abs(l[fin] - fl[fin])) < 1e-4, m
PY

# 2. A NaN in rank 1's rows (zigzag, 2 ranks, N = 64: rank 1 holds rows 16..47): both ranks exit
#    non-zero with the error, within the timeout.
"$PY" - "$T" <<'PY'
import numpy as np, sys
t = sys.argv[1]
rng = np.random.default_rng(1)
for n in "qkv":
    a = rng.standard_normal((2, 64, 8)).astype(np.float32)
    if n == "q":
        a[1, 20, 3] = np.nan
    np.save(t + "/" + n + ".npy", a)
PY
set +e
mpi 2 "$NUMATTN" run --method dist.ring --q "$T/q.npy" --k "$T/k.npy" --v "$T/v.npy" --threads 1 \
  > "$T/bad.out" 2> "$T/bad.err"
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "a NaN on rank 1's shard did not fail the run"
[ "$rc" -ne 124 ] || fail "the run hung (timeout)"
[ "$(grep -c '^error: rank 1: ' "$T/bad.err")" -eq 2 ] || { cat "$T/bad.err" >&2; fail "both ranks must report rank 1's error"; }
grep -q "non-finite\|NaN\|nan" "$T/bad.err" || { cat "$T/bad.err" >&2; fail "the error must name the NaN"; }

# 3. bench under mpirun.
mpi 2 "$NUMATTN" bench --method dist.ring --method dist.ulysses --n 128,200 --heads 2 --d 8 \
  --causal top-left --reps 1 --check-rows 32 --threads 1 --format json > "$T/bench.json"
"$PY" - "$T/bench.json" <<'PY' || fail "bench rows"
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 4 and all(r["status"] == "ok" and r["ranks"] == 2 for r in rows), rows
assert all("wait_fraction" in r and r["efficiency"] > 0 for r in rows), rows
PY
# A single-process method is refused under mpirun, on every rank, by name.
if mpi 2 "$NUMATTN" run --method exact.flash --n 64 2> "$T/refuse.err" > /dev/null; then
  fail "exact.flash ran under mpirun"
fi
grep -q "only dist.\* methods" "$T/refuse.err" || { cat "$T/refuse.err" >&2; fail "refusal message"; }

# 4. Distributed perplexity equals the single-process one (three model runs: not in the
#    sanitizer pass, NUMATTN_TEST_QUICK=1).
if [ "${NUMATTN_TEST_QUICK:-0}" = 1 ]; then
  echo "cli under mpirun: checks 1-3 passed; ppl skipped (NUMATTN_TEST_QUICK=1)"
  exit 0
fi
CACHE=${NUMATTN_CACHE:-$HOME/.cache/numattn}
if ! ls "$CACHE"/*.gguf > /dev/null 2>&1; then
  echo "SKIP: no default model in $CACHE (scripts/fetch_data.sh)"
  exit 77
fi
PPL=(ppl --ctx 64 --chunks 3 --baseline exact.naive --threads 1 --no-progress --format json)
"$NUMATTN" "${PPL[@]}" > "$T/ppl1.json"
mpi 2 "$NUMATTN" "${PPL[@]}" > "$T/ppl2.json"
"$PY" - "$T/ppl1.json" "$T/ppl2.json" <<'PY' || fail "distributed ppl differs"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["ranks"] == 2, b
for k in ("chunks", "tokens_scored", "tokens_processed", "ppl", "ppl_stderr", "kld_mean", "kld_p99",
          "top1_agreement", "ppl_baseline"):
    x, y = a[k], b[k]
    assert abs(x - y) <= 1e-9 * max(1.0, abs(x)), (k, x, y)
print("ppl", a["ppl"], "==", b["ppl"])
PY
echo "cli under mpirun: all checks passed"
