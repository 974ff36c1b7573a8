#!/usr/bin/env bash
# Build and run the tensor-core Q4_0 / Q8_0 matvec prototype (tests/bench/mv_mma.cu) on the GPU
# machine:
#   bash tests/bench/mv_mma.sh [ROWS K ...]      (default: 4096 14336  14336 4096  2048 8192)
# Prints each kernel's registers and spills (ptxas), the read probe, then per shape and format the
# best variant's GB/s and share of the probe, the max error against float64 and PASS/FAIL, and a
# line of every variant. Exit 1 if a check fails, 2 on a bad shape or build.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Werror all-warnings --resource-usage \
    tests/bench/mv_mma.cu -o build/mv_mma 2>build/mv_mma.ptxas || { cat build/mv_mma.ptxas >&2; exit 2; }
# one line a mv_kernel<format (0 Q4_0, 1 Q8_0), unroll, pipelined, math, warps, min blocks>
awk '/Compiling entry function .*mv_kernel/ { k = $0; sub(/.*_Z9mv_kernelI/, "", k); sub(/EEvPK.*/, "", k)
                                              gsub(/L[ib]/, "", k); gsub(/E/, ",", k) }
     /spill stores/ && k != "" { s = $5 " + " $9 }
     /Used [0-9]+ registers/ && k != "" { print "ptxas mv_kernel<" k ">: " $5 " registers, spill stores + loads " s " bytes"; k = "" }' \
    build/mv_mma.ptxas
if [ $# -eq 0 ]; then set -- 4096 14336 14336 4096 2048 8192; fi
exec build/mv_mma "$@"
