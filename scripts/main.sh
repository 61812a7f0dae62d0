#!/usr/bin/env bash
# The README's main job: install dependencies, fetch the default model and text, build, and
# print (1) the benchmark table of the registered methods against the same-run BLAS GEMM and
# (2) the default model's perplexity on the default text with exact.flash and exact.naive,
# and with BD Attention (VO pair) against the dense model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_data.sh   # default model and text, cached and checksummed
scripts/build.sh >&2   # build log on stderr: stdout is the report
NUMATTN=build/bin/numattn
CHUNKS=${NUMATTN_MAIN_CHUNKS:-20}

echo "## Attention kernels: B=1, H=8, N=4096, D=128 (median of 3; efficiency = GFLOP/s ÷ same-run sgemm)"
echo
$NUMATTN bench --n 4096 --d 128 --heads 8 --causal none,top-left --reps 3 --format md
echo
echo "## SmolLM2-135M-Instruct (Q4_1) on Jane Austen: perplexity, ctx 512, $CHUNKS chunks"
echo
ppl_row() {  # prints one Markdown table row from numattn ppl's JSON
  python3 -c '
import json, sys
d = json.load(sys.stdin)
f = lambda k, fmt: "" if d.get(k) is None else fmt.format(d[k])
print("| {} | {} | {:.4f} ± {:.4f} | {} | {} | {} | {:.0f} |".format(
    d["attn"].split("(")[0], d.get("bda", "none"), d["ppl"], d["ppl_stderr"],
    f("kld_mean", "{:.3g}"), f("top1_agreement", "{:.4f}"), f("ppl_rel_change", "{:.2e}"),
    d["tokens_per_s"]))'
}
echo "| attention | BDA | PPL | KL vs baseline | top-1 agreement | PPL rel. change | tokens/s |"
echo "|---|---|---|---|---|---|---|"
$NUMATTN ppl --model default --text default --ctx 512 --chunks "$CHUNKS" --attn exact.flash \
  --no-progress --format json | ppl_row
$NUMATTN ppl --model default --text default --ctx 512 --chunks "$CHUNKS" --attn exact.naive \
  --baseline exact.flash --no-progress --format json | ppl_row
$NUMATTN ppl --model default --text default --ctx 512 --chunks "$CHUNKS" --attn exact.flash \
  --bda vo --no-progress --format json | ppl_row
