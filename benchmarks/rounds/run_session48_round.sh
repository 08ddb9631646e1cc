#!/usr/bin/env bash
# The forty-eighth session's device round: where a verify's extra time over a decode goes, T by T, and the INT4 GEMV
# MoE swept jointly (gate_up x down) over tiles that keep the table's packed-fp16 arithmetic (the sweep had timed only
# the fp32 form, which the table cannot take: bench_kernels.gemv_form_candidates).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session48_round.sh x1   (one device call each, < 10 min)
# x1: profile_step.py per kernel at T = 1..6, 8 (4 layers, 1k; CUPTI serialises a replay's kernels: shares, not a
#     timeline), then bench_kernels.py --sweep gemv at T = 1, 2, 4 (each winner confirmed against the table's config,
#     alternating three times) and the MoE at T = 1, 2, 4, 8 with the swept table, with its read ceilings.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: x1}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
x1)
  TAIL=100 stage profile_t 170 python benchmarks/profile_step.py --layers 4 --tokens 1 2 3 4 5 6 8 --no-gemm \
    --out "$OUT/profile_t.json"
  TAIL=40 stage moe_sweep 390 python benchmarks/bench_kernels.py --out "$OUT" --sweep gemv --sweep-tokens 1 2 4 \
    --moe-only
  cat "$OUT/sweep_table.json" 2>/dev/null
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
