#!/usr/bin/env bash
# Twenty-seventh session's device rounds (H200).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session27_round.sh a1 | a2 | a3 | a4 | a5
# The A/B files (the kernels of b35c259, before this session) travel in .carry/ab (device tool: carry .carry):
#   mkdir -p .carry/ab; for f in rotary rms_norm moe_topk; do
#     git show b35c259:sglang_eagle3/kernels/triton/$f.py > .carry/ab/${f}_b35c259.py; done
#
# a1: the small launches' memory chains. The rotary kernel loaded, stored and loaded again seven times in a row
#     (the compiler keeps a load below a store it may alias); now every load is issued before the first store. The
#     RMSNorm kernel loads its weight before the PDL wait, the routing kernel its bias. GPU tests of the three
#     (and of what calls them: the latent-to-cache launch, the model forward, the fold tests, the CUDA engine),
#     the launches alone against b35c259's (bench_small_ops.py --kernels-from, alternating), then the 61-layer step
#     at 1k and 8k, T = 1 and 4, with this checkout's kernels and b35c259's, alternating twice in one process.
#     Ran at d51c641 only: since then the rotary launcher passes ONE_BLOCK, which b35c259's rotary kernel does not
#     take (swap rms_norm and moe_topk alone, or take the rotary file of d51c641).
# a2: overlap rope_side (new: MLA's rotary launch on the side stream beside W_UK): its GPU test (every overlap
#     bit-identical to none, eager and replayed), then the 61-layer step with it and without, alternating twice; and
#     the routing kernel at 1 and 2 warps instead of the table's 4 (tables .carry/topk_w1.json, topk_w2.json: sm_90.json
#     with only moe_topk's num_warps changed), the step at 1k, alternating twice.
# a3: the issue table at the session's last commit (the 61-layer slice, decode and verify T = 2..8 at 1k and 8k, eager
#     and graph: verify_graph.json) and end to end on the slice: single stream and 16 concurrent requests, baseline
#     against EAGLE-3 k=3 with the accept length pinned at 3.0 (as the twenty-sixth session's z1 / z2).
# a4: correctness at the same commit: decode vs verify bit for bit on the Kimi slice (probe_invariance.py) and the CUDA
#     engine tests (speculative == plain with graphs; a1's 120 s ran out after 14 passed).
# a5: issue 5's kernel table at the same code (bench_kernels.py: kernels.json), last made at d368333.
# Then one inline call at 5f407c3 (the rotary kernel's ONE_BLOCK, no head loop when one block holds every head;
#     compile checks that loads stay before stores): `source benchmarks/rounds/gpu_stages.sh; python -m pytest -q -m gpu
#     tests/kernels/test_kernels_gpu.py -k "rotary or latent or model_forward or graph_replay_equals or rms_norm"`:
#     36 passed. Not timed (the device time was spent).
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: a1, a2, a3, a4, a5}
AB=.carry/ab
OLD_SMALL="$AB/rotary_b35c259.py+$AB/rms_norm_b35c259.py+$AB/moe_topk_b35c259.py"
case $part in
a1)
  TAIL=15 stage small_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_kernels_gpu.py -k "topk or rms_norm or rotary or latent or model_forward or kernels_per_moe or graph_replay_equals" \
    tests/kernels/test_fold_gpu.py
  TAIL=30 stage small_ops 120 python benchmarks/bench_small_ops.py --out "$OUT/small_ops.json" --kernels-from "$OLD_SMALL"
  TAIL=40 stage step_small 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants '' '' --kernels-from "$OLD_SMALL" \
    --out "$OUT/step_small.json"
  TAIL=12 stage engine_tests 120 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 115 \
    tests/gpu/test_cuda_engine.py
  ;;
a2)
  TAIL=12 stage overlap_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/test_overlap.py
  TAIL=30 stage step_rope_side 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 30 \
    --overlap-variants shared_down shared_down,rope_side shared_down shared_down,rope_side --out "$OUT/step_rope_side.json"
  W1="SGLANG_EAGLE3_CONFIG_TABLE=.carry/topk_w1.json" W2="SGLANG_EAGLE3_CONFIG_TABLE=.carry/topk_w2.json"
  TAIL=30 stage step_topk_warps 170 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants '' "$W1" "$W2" '' "$W1" "$W2" \
    --out "$OUT/step_topk_warps.json"
  ;;
a3)
  TAIL=20 stage verify_graph 240 python benchmarks/bench_verify_graph.py --backends triton \
    --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  TAIL=25 stage e2e_single 170 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --out "$OUT/e2e_single.json"
  TAIL=25 stage e2e_b16 150 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --max-new-tokens 64 \
    --repeat 2 --simulate-accept 3.0 --concurrency 16 --cuda-graph-max-bs 16 --out "$OUT/e2e_b16.json"
  ;;
a4)
  TAIL=30 stage probe 200 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 \
    --widths 2 4 8 --out "$OUT/probe.json"
  TAIL=12 stage engine_tests 330 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 320 \
    tests/gpu/test_cuda_engine.py
  ;;
a5)
  TAIL=45 stage kernels 250 python benchmarks/bench_kernels.py --out "$OUT"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
