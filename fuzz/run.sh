#!/usr/bin/env bash
# Builds and runs one libFuzzer target (clang, ASan + UBSan), then prints its executions,
# coverage and crashes.
#
#   fuzz/run.sh TARGET [SECONDS=120] [extra libFuzzer flags...]    TARGET: gguf npy spec tokenizer
#   for t in gguf npy spec tokenizer; do fuzz/run.sh $t 600 || break; done   # the long runs
#
# Build directory: $NUMATTN_FUZZ_BUILD (default build-fuzz), configured on first use with
# $CXX (default clang++). The committed seeds in fuzz/corpus/TARGET are only read; inputs the
# fuzzer finds go to BUILD/corpus/TARGET, crash reproducers to BUILD/crashes/TARGET/ and the
# full log to BUILD/fuzz-TARGET.log. Reproduce a crash with: BUILD/fuzz/TARGET_fuzz FILE
# Exits non-zero when the target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: fuzz/run.sh gguf|npy|spec|tokenizer [SECONDS] [libFuzzer flags]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
T=$1
SECS=${2:-120}
shift $(($# >= 2 ? 2 : 1))
case $T in
  gguf) MAXLEN=4096 ;;
  npy) MAXLEN=8192 ;;
  spec) MAXLEN=256 ;;
  tokenizer) MAXLEN=1024 ;;
  *) usage ;;
esac
B=${NUMATTN_FUZZ_BUILD:-build-fuzz}

if [[ ! -f $B/build.ninja ]]; then
  CXX=${CXX:-clang++} cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DNUMATTN_FUZZ=ON -DNUMATTN_BUILD_TESTS=OFF -DNUMATTN_BUILD_BENCHMARKS=OFF \
    -DNUMATTN_BUILD_CLI=OFF -DNUMATTN_OPENMP=OFF >/dev/null
fi
cmake --build "$B" --target "${T}_fuzz" >/dev/null
mkdir -p "$B/corpus/$T" "$B/crashes/$T"
before=$(find "$B/crashes/$T" -type f | wc -l)
LOG=$B/fuzz-$T.log
set +e
"$B/fuzz/${T}_fuzz" -max_total_time="$SECS" -max_len=$MAXLEN -rss_limit_mb=2048 \
  -malloc_limit_mb=512 -print_final_stats=1 -artifact_prefix="$B/crashes/$T/" \
  "$@" "$B/corpus/$T" "fuzz/corpus/$T" >"$LOG" 2>&1
rc=$?
set -e
last=$(grep -E "^#[0-9]+" "$LOG" | tail -1 || true)
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG")
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$LOG")
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
crashes=$(($(find "$B/crashes/$T" -type f | wc -l) - before))
echo "$T: ${execs:-?} executions in ${SECS} s (${rate:-?}/s), coverage ${cov:-?} edges," \
  "${ft:-?} features, corpus ${corp:-?}; crashes: $crashes; exit $rc (log: $LOG)"
if [[ $rc -ne 0 ]]; then
  grep -E 'ERROR|SUMMARY|runtime error|spec_fuzz:|tokenizer_fuzz:|Test unit written' "$LOG" | head -20 >&2
fi
exit $rc
