#!/usr/bin/env bash
# Twenty-third session's device round (H200): bash benchmarks/rounds/run_session23_round.sh PART, results under $OUT.
source "$(dirname "$0")/gpu_stages.sh"
# Part "v1": what the twenty-second session prepared after its device time was spent: the radix select's edge cases
# on the GPU; the CUDA-core GEMV prototype's bit-identity across T and q_b with its q_a norm folded
# (bench_gemv_fma.py); the Kimi slice at 16 concurrent top_p requests, the radix select against the sort
# (SGLANG_EAGLE3_SAMPLER_RADIX=0) alternating twice.
# (v1 at a08faac: edges test 2 passed; every projection's rows bit-identical alone / in pairs / in a verify of 4 for
# the prototype and the shipped GEMV; q_b + q_a norm, T = 1 / 4: prototype 2.83 / 5.70 us against 7.49 / 8.31;
# 16 concurrent top_p requests, radix / sort, tok/s: baseline 1101.7 (first pass 751.5: a cold pass at 396.9) /
# 1090.7, 1091.1, EAGLE-3 1107.2, 1109.1 / 1107.0, 1107.6: within ~1%; at 16 requests EAGLE-3 (64 rows a round)
# is only 1.005x the baseline.)
# Part "v2": the CUDA-core GEMV in the package (kernels/gemv.py triton_gemv_fma; fma_form sends it q_b, with its q_a
# norm): its GPU tests (q_b shapes, T = 1..16, rows bit-identical alone / in pairs / in fours as in the batch) and
# the GEMV tests it now serves; bench_gemv_fma.py (the package's kernel over five configs against the tensor-core
# GEMV, T = 1..16); the 61-layer step at 1k and 8k, T = 1..16, with it and without (SGLANG_EAGLE3_GEMV_FMA=0),
# alternating twice.
# (v2 at 4412460: 85 GEMV GPU tests passed; the step, FMA on / off: 1k T = 1 / 2 / 4 / 8 / 16
# 4.42 / 4.83 / 5.89 / 7.53 / 11.03 against 4.67 / 5.10 / 5.95 / 7.30 / 10.12 ms: faster to T = 4, slower at 8
# (+3%) and 16 (+9%); 8k the same shape.)
# Part "v3": the CUDA-core GEMV with a free lane count and 8-row programs (config keys LANES, MAX_ROWS; the knob
# SGLANG_EAGLE3_GEMV_FMA_CONFIG): its GPU tests; bench_gemv_fma.py sweeping ten configs on q_b (with and without its
# norm) at T = 1..16; the step at 1k, T = 1..16: the default config, two 8-row configs and the tensor-core kernel,
# alternating twice.
# (v3 at de406cb: 35 GPU tests passed; the sweep ran out of its 150 s at q_b + norm T = 16; no config beat the tensor
# cores at T >= 8 with the norm (best 9.55 us at T = 8 against 8.36); the step: 8-row configs no better at T = 16
# (11.11-11.76 against 10.18 on tensor cores).)
# Part "v4": q_b on the tensor-core GEMV over ten launch configs (bench_gemv_fma.py --tc-sweep: no split-K, narrower
# row blocks, wider K tiles), with and without its norm, T = 1..16, against the CUDA-core form's default.
# (v4 at 1f4b6e1: every config bit-identical across T; q_b + norm, gemv_config's (split-K 3) 7.39-8.32 us, no split
# at 32 x 512 x 3 stages 6.62-7.14: ~1 us less at every T, not yet shipped (not timed in the step).)
# Part "v5": with the form chosen per engine (kernels/gemv.py fma_for_engine: the CUDA-core q_b only when an engine's
# graphs serve one request a step; layers' gemv_fma): the GEMV GPU tests, the graph runner and CUDA engine tests
# (speculative == plain with graphs), then the step at 1k and 8k, T = 1..8 (batch 1: the CUDA-core q_b) against
# SGLANG_EAGLE3_GEMV_FMA=0, alternating twice.
# (v5 at 0a77b67: 85 GEMV tests passed; graph runner + engine tests 27 passed before the 230 s limit; the step, on /
# off: 1k 4.35, 4.33 / 4.78, 4.66 (T=1), 5.97, 5.91 / 5.99, 6.00 (T=4), 7.64, 7.51 / 7.38, 7.32 (T=8); 8k 4.47,
# 4.46 / 4.77, 4.78 (T=1), 6.19, 6.17 / 6.25, 6.26 (T=4).)
# Part "v6": the CUDA engine tests alone (v5's limit cut them after 27 passed), then the Kimi slice end to end with
# the CUDA-core q_b (the default at --cuda-graph-max-bs 1) and without (SGLANG_EAGLE3_GEMV_FMA=0).
# (v6 at 05a4d93: 17 passed; baseline 215.0 / 201.7 tok/s, EAGLE-3 k=3 pinned 3.0 400.0 / 398.3.)
# Part "v7": the step at 1k, T = 1..8, the default config (4 rows of W, 256 lanes, 8 warps) against 128 lanes at 4
# warps (the sweep's best for q_b with its norm at T = 4) and the tensor cores, alternating twice.
# (v7 at 3107744, medians of two, ms, T = 1 / 2 / 4 / 8: 256 lanes 4.37 / 4.98 / 6.07 / 7.64, 128 lanes 4.41 / 4.90 /
# 5.85 / 7.45, tensor cores 4.69 / 5.15 / 5.99 / 7.33: 128 lanes shipped.)
# Part "v8": after fma_config took 128 lanes over 4 warps (v7's choice): the CUDA-core GEMV's GPU tests again.
# (v8 at 47affd2: 35 passed.)
part=${1:?part: v1, v2, v3, v4, v5, v6, v7, v8}
case $part in
v1)
  TAIL=6 stage edges_test 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "top_threshold_edges"
  TAIL=24 stage gemv_fma 150 python benchmarks/bench_gemv_fma.py --out "$OUT/gemv_fma.json"
  TAIL=10 stage e2e_batch_top_p 360 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --max-new-tokens 64 \
    --repeat 2 --simulate-accept 3.0 --concurrency 16 --cuda-graph-max-bs 16 --sampling temperature=0.7,top_p=0.95 \
    --env-variants '' SGLANG_EAGLE3_SAMPLER_RADIX=0 --repeat-variants 2 --out "$OUT/e2e_batch_top_p.json"
  ;;
v2)
  TAIL=8 stage gemv_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "gemv"
  TAIL=40 stage gemv_fma 120 python benchmarks/bench_gemv_fma.py --out "$OUT/gemv_fma.json"
  NO=SGLANG_EAGLE3_GEMV_FMA=0
  TAIL=30 stage step_fma 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --max-tokens 16 --tokens 1 2 4 8 16 --eager-iters 1 --graph-iters 30 --env-variants '' "$NO" '' "$NO" --out "$OUT/step_fma.json"
  ;;
v3)
  TAIL=8 stage gemv_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "gemv_fma or q_b"
  TAIL=48 stage gemv_fma 150 python benchmarks/bench_gemv_fma.py --out "$OUT/gemv_fma.json"
  NO=SGLANG_EAGLE3_GEMV_FMA=0
  A=SGLANG_EAGLE3_GEMV_FMA_CONFIG=BLOCK_N=4,LANES=256,num_warps=8,MAX_ROWS=8
  B=SGLANG_EAGLE3_GEMV_FMA_CONFIG=BLOCK_N=8,LANES=128,num_warps=4,MAX_ROWS=8
  TAIL=24 stage step_fma 280 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --max-tokens 16 --tokens 1 2 4 8 16 --eager-iters 1 --graph-iters 30 --env-variants '' "$A" "$B" "$NO" '' "$A" \
    "$B" "$NO" --out "$OUT/step_fma.json"
  ;;
v4)
  TAIL=30 stage tc_sweep 200 python benchmarks/bench_gemv_fma.py --tc-sweep --out "$OUT/tc_sweep.json"
  ;;
v5)
  TAIL=8 stage gemv_tests 120 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 110 \
    tests/kernels/test_kernels_gpu.py -k "gemv"
  TAIL=10 stage engine_tests 230 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 220 \
    tests/test_graph_runner.py tests/gpu/test_cuda_engine.py
  TAIL=24 stage step_head 220 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' SGLANG_EAGLE3_GEMV_FMA=0 '' \
    SGLANG_EAGLE3_GEMV_FMA=0 --out "$OUT/step_head.json"
  ;;
v6)
  TAIL=10 stage engine_tests 220 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 210 \
    tests/gpu/test_cuda_engine.py
  TAIL=12 stage e2e_fma 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' SGLANG_EAGLE3_GEMV_FMA=0 --out "$OUT/e2e_fma.json"
  ;;
v7)
  C=SGLANG_EAGLE3_GEMV_FMA_CONFIG=BLOCK_N=4,LANES=128,num_warps=4,MAX_ROWS=4
  TAIL=16 stage step_l128 240 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' "$C" SGLANG_EAGLE3_GEMV_FMA=0 '' "$C" \
    SGLANG_EAGLE3_GEMV_FMA=0 --out "$OUT/step_l128.json"
  ;;
v8)
  TAIL=8 stage gemv_tests 120 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 110 \
    tests/kernels/test_kernels_gpu.py -k "gemv_fma or q_b"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
