#!/usr/bin/env bash
# The nineteenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_session19_round.sh x1
# Part "x1": the INT4 GEMV down kernel in packed fp16 (down config F16: gate_up stores act as fp16 pairs with a
# power-of-two scale per word of 8, the down dots as HFMA2, two weights an op; ~3.3 SASS instructions a weight
# against ~4.3 over the slot loop, 3.7 against 5.1 with PRELOAD). Its GPU tests (the inline PTX bit-identical to
# its plain-op emulation), a sweep of down configs, F16 and the fp32 form, at T = 1..16 (bench_moe_dot.py, uniform
# routing and tokens sharing 12 experts) writing the best per T as a table, then the 61-layer step at 1k with the
# checked-in table (down F16 at its previous tiles) against the previous one and the sweep's, alternating twice.
# Part "x2" (x1 at ed40548: 4 F16 GPU tests passed; MoE with F16 down at the table's tiles, T = 1 / 2 / 4 / 8 / 16
# over 12 shared experts 14.6 / 19.1 / 31.6 / 54.4 / 102.5 -> 13.7 / 17.6 / 30.5 / 51.0 / 96.2 us, and 29.6 at T=4
# with PRELOAD's tile; the step at 1k T = 1 / 2 / 4 / 8 4.71 / 5.19 / 6.07 / 7.41 ms against 4.75 / 5.23 / 6.19 /
# 7.56; the sweep's table was not written, a variable clash in bench_moe_dot's write_table): the table now takes
# F16 down at every T, PRELOAD's tile up to T=4. The INT4 MoE GPU tests, the PDL, overlap and Kimi-layout tests,
# then the step at 1k and 8k against the previous table, alternating twice.
# Part "x3" (x2 at 7021347: MoE tests 69 passed, PDL/overlap/layout tests 20 passed; the step with the table against
# the previous, medians of two alternations, ms: 1k decode 4.78 vs 4.82, verify T = 2 / 4 / 8 5.20 / 6.06 / 7.37 vs
# 5.31 / 6.19 / 7.65; 8k 4.91 vs 4.94, 5.32 / 6.33 / 7.72 vs 5.46 / 6.44 / 8.04): the CUDA engine and graph-runner
# tests (speculative output equals plain decoding with graphs on), then end to end, the Kimi slice baseline and
# EAGLE-3 at a pinned accept length 3.0, the two tables alternating twice.
# Part "x4" (x3 at 7021347: 25 passed; end to end, table / previous, tok/s: EAGLE-3 at accept 3.0 378.4 / 366.4 vs
# 355.6 / 353.4, baseline 194.0 / 193.3 vs 182.3 / 183.0): every other kernel GPU test (the fold and MLA-rope
# model tests run the INT4 MoE at the table's configs).
# Part "x5" (x4 at 30b4b10: 230 passed): gate_up's GROUP (an expert's first pair computes its pairs 4 or 2 at a time,
# each weight decoded once for them; ~0.65-1.3 SASS instructions a weight and pair in the 4- and 2-pair loops
# against ~2.7): the INT4 MoE GPU tests with the new ones (grouped bit-identical to one program a pair), a sweep of
# GROUP configs at T = 1..16 writing the best per T as a table, then the 61-layer step at 1k with that table
# against the checked-in one, alternating twice.
# Part "x6" (x5 at 85e736a: MoE tests 73 passed, the grouped path bit-identical to one program a pair; GROUP slower at
# every T >= 2, also on 12 shared experts (T=4 35.97-40.06 us against 29.29: the expert's pairs in series in its
# first pair's program, at 217-255 registers), faster at T=1 alone (8 rows, 4 warps, GROUP 4: 10.93 / 12.79 us
# against 13.72 / 14.66), where every expert has one pair; the step with the sweep's table (that T=1 bucket, the
# rest as checked in) 4.90 against 4.73 ms at T=1, T = 2..8 within 1%): the T=1 bucket alone, 8 rows and 4 warps
# with GROUP 4 and without, against the checked-in one: the MoE at T=1, then the step at T=1, alternating twice.
# (x6 at 8e33e80: the MoE at T=1 again 10.9 / 13.0 us with GROUP 4 against 13.6-13.9 / 14.8 (table) and 15.4 /
# 16.1 (the same tiles without GROUP), yet the step at T=1 4.77 / 4.89 ms with it against 4.66 / 4.67 (table) and
# 4.68 / 4.70. GROUP was removed after this part; 85e736a has it. Parts x5 and x6 no longer run as written.)
# Part "x7", run from a checkout of 8e33e80 (GROUP still in; its command line was this part's loop, with GIT_COMMIT
# left unset): 6 layers under the profiler at T=1, the table and the T=1 GROUP table alternating twice. In the step
# the GROUP gate_up was itself faster, 10.3 us a call against 11.6-11.7, the kernels' busy time 0.928-0.930 ms
# against 0.933-0.934, yet the graph took 0.625 / 0.667 ms against 0.615 / 0.619: the time went into the gaps.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: x1, x2, x3, x4, x5, x6, x7}
OLD="SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_down_fp32_table.json"

# (sweep_step: benchmarks/rounds/gpu_stages.sh)

case $part in
x1)
  TAIL=8 stage f16_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "gemv_f16"
  V=()
  for c in 8,2,1,0 32,4,0,0 8,2,1,1 32,4,0,1 16,2,1,1 16,4,1,1 8,2,0,1 16,4,0,1 32,8,0,1 64,4,0,1 64,8,0,1 32,8,1,1; do
    IFS=, read -r bn w pre f16 <<< "$c"
    V+=(--down-config "BLOCK_N=$bn,BLOCK_W=32,num_warps=$w,PRELOAD=$pre,F16=$f16")
  done
  sweep_step down gemv_down 240 200 "$OLD"
  ;;
x2)
  TAIL=8 stage moe_tests 170 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "int4"
  TAIL=8 stage other_tests 170 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 160 \
    tests/kernels/test_pdl_gpu.py tests/test_overlap.py tests/loaders/test_layouts.py
  TAIL=20 stage step_table 230 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' "$OLD" '' "$OLD" \
    --out "$OUT/step_table.json"
  ;;
x3)
  TAIL=15 stage engine_tests 290 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 280 \
    tests/test_graph_runner.py tests/gpu/test_cuda_engine.py
  TAIL=12 stage e2e_table 290 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' "$OLD" --repeat-variants 2 --out "$OUT/e2e_table.json"
  ;;
x4)
  TAIL=8 stage kernel_tests 280 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/kernels/test_kernels_gpu.py tests/kernels/test_fold_gpu.py tests/kernels/test_mla_rope_gpu.py -k "not int4"
  ;;
x5)
  TAIL=8 stage moe_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "int4"
  V=()
  for c in 16,8,4 8,4,4 32,8,4 16,4,2 16,8,2 32,4,2; do
    IFS=, read -r bn w g <<< "$c"
    V+=(--gemv-config "BLOCK_N=$bn,BLOCK_W=128,num_warps=$w,F16=1,GROUP=$g")
  done
  sweep_step group gemv 170 170
  ;;
x6)
  TAIL=12 stage moe_t1 60 python benchmarks/bench_moe_dot.py --out "$OUT/moe_t1.json" --variants "gemv (table)" \
    --tokens 1 --pools 12 384 --gemv-config BLOCK_N=8,BLOCK_W=128,num_warps=4,F16=1,GROUP=4 \
    --gemv-config BLOCK_N=8,BLOCK_W=128,num_warps=4,F16=1
  G="SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_gate_up_t1_group_table.json"
  B="SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_gate_up_t1_bn8_table.json"
  TAIL=12 stage step_t1 150 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 --eager-iters 1 --graph-iters 30 --env-variants '' "$G" "$B" '' "$G" "$B" --out "$OUT/step_t1.json"
  ;;
x7)
  G=benchmarks/data/sm_90_gate_up_t1_group_table.json
  for v in table group table group; do
    if [ $v = group ]; then E="SGLANG_EAGLE3_CONFIG_TABLE=$G"; else E=; fi
    env $E timeout 70 python benchmarks/profile_step.py --layers 6 --tokens 1 --no-gemm --replays 20 \
      --out "$OUT/prof_${v}_$RANDOM.json" > "$OUT/prof_$v.log" 2>&1
    echo "== $v rc $?"
    grep -iE "graph|moe_int4|topk|gemv_kernel|rms|mla" "$OUT/prof_$v.log" | grep -v -i warn | head -14
  done
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
