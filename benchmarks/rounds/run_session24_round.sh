#!/usr/bin/env bash
# Twenty-fourth session's device round (H200): bash benchmarks/rounds/run_session24_round.sh PART, results under $OUT.
source "$(dirname "$0")/gpu_stages.sh"
# Part "w1": where a batched step's time goes (16 requests: the regime where EAGLE-3 gained only 1.005x end to end
# in the twenty-third session): profile_step.py at batch 16, T = 1 and 4 (16 and 64 rows), the random router's own
# routing and uniform routing, and at batch 1 (the current per-kernel breakdown); then the Kimi slice end to end,
# single stream, with the shipped 128-lane CUDA-core q_b against SGLANG_EAGLE3_GEMV_FMA=0 (not yet run end to end).
# Part "w2": gate_up's ROWS form (a weight word decoded once for up to ROWS pairs of its expert): its GPU tests (bit-
# identical to the one-pair form, to its emulation, alone vs batch) and the INT4 tests around it; bench_moe_dot.py at
# T = 1..64 over pools of 12 and 384 experts, the table's configs against five ROWS configs, the best per T written
# as a gate_up table (rows_table.json, for w3).
# (w2 at 4f3f49c: the ROWS form bit-identical to the one-pair form only at the same tiles (1 of 5 cases; 1-2 bf16
# ulps apart against the table's other tiles: the test now compares at the same tiles); MoE us, pool 12 / 384:
# T=1 table 13.9 / 14.9, ROWS 2 at 16 x 8 warps 11.0 / 13.0; T = 2..8 ROWS slower; T=16 ROWS 2 at 16 x 4 warps
# 89 / 112 against 96 / 106; T=64 323 / 376-384 against 359-360 / 397-401.)
# Part "w3": with the sm_90 table taking ROWS 2 at T=1 and above 16 tokens: the ROWS and table-bucket GPU tests, then
# the 61-layer step at batch 1 (1k, T = 1..8) and at batch 16 (1k, T = 1 and 4, uniform routing) against the previous
# gate_up buckets (a table file written here), alternating twice.
# Part "w4": the CUDA engine tests (speculative == plain with graphs), then the Kimi slice end to end, single stream
# and at 16 concurrent requests, against the previous gate_up buckets.
# (w3 at 8ba8a49: 13 GPU tests passed; the step, new / previous gate_up buckets, ms: batch 1 at 1k T = 1 / 2 / 4 / 8
# 4.38 / 4.87 / 5.75 / 7.34 against 4.37 / 4.83 / 5.74 / 7.33 (equal); batch 16 uniform T=1 12.17 / 12.10, T=4
# 30.64 / 31.02 (-1.2%).)
# (w4 at 8ba8a49: engine tests 17 passed; end to end, new / previous buckets, tok/s: single stream baseline 213.8 /
# 213.9, EAGLE-3 k=3 pinned 3.0 409.6 / 411.7; 16 concurrent baseline 1112.0 / 1109.0, EAGLE-3 1169.7 / 1119.6.)
# Part "w5": gate_up's XP form (x rounded and paired for the F16 dots once a token by a launch of its own, loaded in
# the weights' layout: no move through shared memory a chunk): its GPU tests, then bench_moe_dot.py at T = 1..64
# over pools of 12 and 384, the table against XP at the table's tiles and at 16 x 8 warps, with ROWS 2 and without.
# Part "w6": the GPU MoE and PDL tests at the new table, then the 16-request end to end of w4 again, the two gate_up
# tables alternating twice in one run (w4 ran each once).
# (w6 at 7e50e20: 105 passed; 16 concurrent, new / previous tables, tok/s: baseline 1111.8, 1109.5 / 1108.7, 1109.2,
# EAGLE-3 k=3 pinned 3.0 1175.0, 1175.5 / 1119.5, 1122.2: +4.9%, 1.06x the baseline instead of 1.01x.)
# Part "w7": the rest of the GPU suite at the new table (graph runner, overlap and fold tests, then the kernel tests
# without the MoE ones w6 ran; the CUDA engine tests ran in w4).
# (w7 at f713448: graph runner / overlap / fold / layouts 78 passed, kernels without MoE 195 passed.)
part=${1:?part: w1, w2, w3, w4, w5, w6, w7}
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
w5)
  TAIL=8 stage xp_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "gemv_rows or buckets_agree"
  R="BLOCK_W=128,F16=1"
  TAIL=100 stage moe_xp 330 python benchmarks/bench_moe_dot.py --out "$OUT/moe_xp.json" --variants "gemv (table)" \
    --tokens 1 2 4 8 16 64 --pools 12 384 --table-path gemv --table-pool 0 --table-out "$OUT/xp_table.json" \
    --gemv-config "BLOCK_N=16,num_warps=8,XP=1,$R" --gemv-config "BLOCK_N=16,num_warps=4,XP=1,$R" \
    --gemv-config "BLOCK_N=16,num_warps=8,ROWS=2,XP=1,$R" --gemv-config "BLOCK_N=8,num_warps=4,XP=1,$R" \
    --gemv-config "BLOCK_N=32,num_warps=8,XP=1,$R"
  ;;
w7)
  TAIL=12 stage graph_tests 280 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 270 \
    tests/test_graph_runner.py tests/test_overlap.py tests/kernels/test_fold_gpu.py tests/loaders/test_layouts.py
  TAIL=12 stage kernel_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_kernels_gpu.py tests/kernels/test_mla_rope_gpu.py -k "not moe"
  ;;
w3|w4|w6)
  OLD_TABLE="$OUT/gate_up_before_rows.json"
  python - "$OLD_TABLE" <<'PY'
import json, sys
old = [{"max_tokens": 2, "BLOCK_N": 16, "BLOCK_W": 128, "num_warps": 8, "F16": True},
       {"max_tokens": 4, "BLOCK_N": 32, "BLOCK_W": 128, "num_warps": 4, "F16": True},
       {"BLOCK_N": 16, "BLOCK_W": 128, "num_warps": 4, "F16": True}]
json.dump({"arch": "sm_90", "sm_counts": [132], "measured": True, "source": "sm_90 gate_up buckets before 88044a7",
           "ops": {"fused_moe_int4_gemv_gate_up": old}}, open(sys.argv[1], "w"), indent=1)
PY
  OLD="SGLANG_EAGLE3_CONFIG_TABLE=$OLD_TABLE"
  if [ "$part" = w6 ]; then
    TAIL=8 stage moe_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
      tests/kernels/test_kernels_gpu.py tests/kernels/test_pdl_gpu.py -k "moe"
    TAIL=12 stage e2e_b16_alt 360 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --max-new-tokens 64 \
      --repeat 2 --simulate-accept 3.0 --concurrency 16 --cuda-graph-max-bs 16 --env-variants '' "$OLD" \
      --repeat-variants 2 --out "$OUT/e2e_b16_alt.json"
  elif [ "$part" = w3 ]; then
    TAIL=8 stage rows_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
      tests/kernels/test_kernels_gpu.py -k "gemv_rows or buckets_agree or token_independent"
    TAIL=24 stage step_b1 230 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' "$OLD" '' "$OLD" --out "$OUT/step_b1.json"
    TAIL=16 stage step_b16 230 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --batch 16 --max-tokens 4 --tokens 1 4 --uniform-routing --eager-iters 1 --graph-iters 20 \
      --env-variants '' "$OLD" '' "$OLD" --out "$OUT/step_b16.json"
  else
    TAIL=8 stage engine_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
      tests/gpu/test_cuda_engine.py
    TAIL=10 stage e2e_b1 180 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
      --repeat 2 --simulate-accept 3.0 --env-variants '' "$OLD" --out "$OUT/e2e_b1.json"
    TAIL=10 stage e2e_b16 220 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --max-new-tokens 64 \
      --repeat 2 --simulate-accept 3.0 --concurrency 16 --cuda-graph-max-bs 16 --env-variants '' "$OLD" \
      --out "$OUT/e2e_b16.json"
  fi
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
