#!/usr/bin/env bash
# Twenty-fourth session's device round (H200): bash benchmarks/run_session24_round.sh PART, results under $OUT.
source "$(dirname "$0")/gpu_stages.sh"
# Part "w1": where a batched step's time goes (16 requests: the regime where EAGLE-3 gained only 1.005x end to end
# in the twenty-third session): profile_step.py at batch 16, T = 1 and 4 (16 and 64 rows), the random router's own
# routing and uniform routing, and at batch 1 (the current per-kernel breakdown); then the Kimi slice end to end,
# single stream, with the shipped 128-lane CUDA-core q_b against SGLANG_EAGLE3_GEMV_FMA=0 (not yet run end to end).
# Part "w2": gate_up's ROWS form (a weight word decoded once for up to ROWS pairs of its expert): its GPU tests (bit-
# identical to the one-pair form, to its emulation, alone vs batch) and the INT4 tests around it; bench_moe_dot.py at
# T = 1..64 over pools of 12 and 384 experts, the table's configs against five ROWS configs, the best per T written
# as a gate_up table (rows_table.json, for w3).
part=${1:?part: w1, w2}
case $part in
w1)
  TAIL=40 stage prof_b16 200 python benchmarks/profile_step.py --layers 6 --tokens 1 4 --batch 16 --no-gemm \
    --out "$OUT/prof_b16.json"
  TAIL=40 stage prof_b16u 200 python benchmarks/profile_step.py --layers 6 --tokens 1 4 --batch 16 --no-gemm \
    --uniform-routing --out "$OUT/prof_b16u.json"
  TAIL=40 stage prof_b1 150 python benchmarks/profile_step.py --layers 6 --tokens 1 4 --no-gemm --out "$OUT/prof_b1.json"
  TAIL=12 stage e2e_l128 220 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' SGLANG_EAGLE3_GEMV_FMA=0 --out "$OUT/e2e_l128.json"
  ;;
w2)
  TAIL=10 stage rows_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_kernels_gpu.py -k "gemv_rows or int4_gemv_f16 or token_independent"
  R="BLOCK_W=128,F16=1"
  TAIL=90 stage moe_rows 320 python benchmarks/bench_moe_dot.py --out "$OUT/moe_rows.json" --variants "gemv (table)" \
    --tokens 1 2 4 8 16 64 --pools 12 384 --table-path gemv --table-pool 0 --table-out "$OUT/rows_table.json" \
    --gemv-config "BLOCK_N=8,num_warps=4,ROWS=2,$R" --gemv-config "BLOCK_N=8,num_warps=4,ROWS=4,$R" \
    --gemv-config "BLOCK_N=16,num_warps=8,ROWS=4,$R" --gemv-config "BLOCK_N=16,num_warps=4,ROWS=2,$R" \
    --gemv-config "BLOCK_N=16,num_warps=8,ROWS=2,$R"
  cat "$OUT/rows_table.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
