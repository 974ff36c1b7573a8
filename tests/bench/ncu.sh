#!/usr/bin/env bash
# One model's kernels under Nsight Compute on the GPU machine, a line per launch
# (tests/bench/ncu_table.py), the full report kept in build/ncu-<model>-<what>.txt:
#   bash tests/bench/ncu.sh MODEL [prefill|decode] [LAUNCHES]
#   bash tests/bench/ncu.sh MODEL source KERNEL [LAUNCHES]
# MODEL: a name under models/, profiled as its random-weight bf16 shape (bench_model.sh).
# prefill: LAUNCHES (default 8) kernels of a 16-token prompt batch from its first layer's QKV on;
# decode: LAUNCHES (default 6) of a decode step's kernels from about its second layer on (past the
# embedding and 5 launches; the 7-8B shapes join attention and o_proj, 5 launches a layer). Each
# kernel runs alone under ncu (no overlap between stages, no programmatic early launch). ncu locks the SM clock (1.3
# GHz on the H200, 1.98 in a run): compare the kernels with each other, not with --bench.
# source: LAUNCHES (default 4) launches of the kernel named KERNEL (e.g. attention_kernel, or a
# template's instances: prefill_flash_kernel), past the first SKIP (default 60), with stall sampling at every 32 cycles, read by tests/bench/ncu_source.py (the
# CSV kept in build/ncu-<model>-source.csv). REPLAY=application (any mode): each of ncu's passes a
# whole run with the caches left alone, so the kernel meets the caches the kernels before it left, as
# in the step. Under the default kernel replay ncu's memory save and restore between passes leave the
# L2 cold even with --cache-control none: a kernel reading what the one before left in L2 shows its
# DRAM bytes only under application replay (seen measuring L2 prefetches: docs/performance.md, D9).
# DEPTH: the context depth of the profiled decode steps (default 0). --bench feeds its 128-token
# prompt at depth 0 once untimed and 3 times timed before any depth, a batch each (every layer: it
# is the prompt's last), so a prefill kernel's first launch at DEPTH is past 4 x layers launches of
# it (the 1B shape: SKIP=64). A longer --bench-prompt is more batches, the non-last ones a layer
# short (the 7B at 512 tokens: 4 x 63; D130's profile took --launch-skip 260).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu_env.sh
. tests/bench/bench_model.sh
[ $# -ge 1 ] || { echo "usage: bash tests/bench/ncu.sh MODEL [prefill|decode] [LAUNCHES] | MODEL source KERNEL [LAUNCHES]" >&2; exit 2; }
m=$1
what=${2:-prefill}
command -v ncu >/dev/null || { echo "ncu.sh: no ncu on the PATH (Nsight Compute, in the CUDA toolkit)" >&2; exit 1; }
case $what in
    # the batch's embedding and first norm come before its first QKV
    prefill) names='regex:^prefill_' skip=2 count=${3:-8} ;;
    # the decode kernels, not the prefill's
    decode) names='regex:^(embed|rmsnorm_|attention|o_proj|down_|step_end|sample)' skip=6 count=${3:-6} ;;
    source)
        [[ ${3:-} =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || { echo "ncu.sh: source needs a kernel name, e.g. attention_kernel" >&2; exit 2; }
        names="regex:^$3(\$|<)" skip=${SKIP:-60} count=${4:-4} ;; # a template's instances too (prefill_flash_kernel<32, true>)
    *) echo "ncu.sh: '$what': prefill, decode or source" >&2; exit 2 ;;
esac
bench_model "$m" || exit 1
d=build/bench-models/bench-$m
replay=()
case ${REPLAY:-kernel} in
    kernel) ;;
    application) replay=(--replay-mode application --cache-control none) ;;
    *) echo "ncu.sh: REPLAY='$REPLAY': kernel or application" >&2; exit 2 ;;
esac
if [ "$what" = source ]; then
    rep=build/ncu-$m-source
    rm -f "$rep.ncu-rep"
    timeout 300 ncu --kernel-name "$names" --launch-skip "$skip" --launch-count "$count" "${replay[@]}" \
        --section SourceCounters --section WarpStateStats --warp-sampling-interval 0 -o "$rep" \
        "build/bench-$m/ingot" -m "$d" --device cuda --bench --bench-depths "${DEPTH:-0}" -n 8 >"$rep.log" 2>&1 ||
        { echo "ncu.sh: ncu failed; the end of $rep.log:" >&2; tail -5 "$rep.log" >&2; exit 1; }
    ncu --import "$rep.ncu-rep" --page source --print-source sass --csv >"$rep.csv" || exit 1
    .venv/bin/python tests/bench/ncu_source.py "$rep.csv"
    exit
fi
report=build/ncu-$m-$what.txt
# --bench-depths 0 -n 8: a 128-token prompt (8 batches) and 8 decode steps, enough launches to skip into
timeout 300 ncu --kernel-name "$names" --launch-skip "$skip" --launch-count "$count" "${replay[@]}" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    "build/bench-$m/ingot" -m "$d" --device cuda --bench --bench-depths "${DEPTH:-0}" -n 8 >"$report" 2>&1 ||
    { echo "ncu.sh: ncu failed; the end of $report:" >&2; tail -5 "$report" >&2; exit 1; }
.venv/bin/python tests/bench/ncu_table.py "$report"
