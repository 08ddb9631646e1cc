#!/usr/bin/env bash
# Twenty-sixth session's device rounds (H200): the issue tables again at one commit, end to end at that commit.
#   bash benchmarks/rounds/run_session26_round.sh z1 | z2 | z3   (z3 only at 9525980: its checks script was removed with the fold)
# Run with GIT_COMMIT=<HEAD> so the JSON files name the commit they ran at.
#
# z1: the tables docs/BENCHMARKS.md calls current (gpu_stages.sh head_tables): the 61-layer Kimi TP=8 rank slice,
#     decode and verify T = 2..8 at 1k and 8k, eager and graph (verify_graph.json), and bench_kernels.py
#     (kernels.json). The last full runs were the eleventh (verify_graph) and sixteenth (kernels) sessions'.
# z2: end to end on the Kimi slice at the same commit: single stream (3 prompts x 96 new tokens, and again with a
#     server's 131072-slot context limit) and 16 concurrent requests (64 new tokens each), baseline against EAGLE-3
#     k=3 with the accept length pinned at 3.0; then the CUDA engine tests (speculative == plain, graphs == eager).
# z3: MLA's W_UV folded into the merge launch (fusion merge_uv, new): its checks at Kimi shapes on the GPU
#     (benchmarks/uv_gpu_checks.py), then the 61-layer step at 1k and 8k with it on ('' = off, the default) and
#     off, alternating twice. Ran at 9525980 (the code is in that commit).
#     Found: correct (within 0.3% of float64 at Kimi shapes, decode and verify bit for bit at T = 4, 8, 1k and 8k)
#     and far slower: the step 4.43 -> 6.37 ms at 1k T=1, 5.89 -> 7.73 at T=4, 4.58 -> 7.34 at 8k T=1 (+30 us a
#     layer: one program a (token, head) reads the head's 128 KB of W_UV and, at 8k, 256 KB of partials alone, where
#     the merge and the GEMV spread them over 64 and ~100 programs). Removed; uv_gpu_checks.py went with it.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: z1, z2, z3}
case $part in
z1)
  T_STEP=330 T_KERNELS=240 head_tables
  ;;
z2)
  TAIL=25 stage e2e_single 170 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --out "$OUT/e2e_single.json"
  TAIL=25 stage e2e_single_128k 170 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --context-length 131072 --out "$OUT/e2e_single_128k.json"
  TAIL=25 stage e2e_b16 150 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --max-new-tokens 64 \
    --repeat 2 --simulate-accept 3.0 --concurrency 16 --cuda-graph-max-bs 16 --out "$OUT/e2e_b16.json"
  TAIL=12 stage engine_tests 100 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 95 \
    tests/gpu/test_cuda_engine.py
  ;;
z3)
  TAIL=20 stage uv_checks 200 python benchmarks/uv_gpu_checks.py
  ON="SGLANG_EAGLE3_NO_FUSE=input_norm,router_topk,q_rope_attn,route_shared_down"
  TAIL=40 stage step_uv 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' "$ON" '' "$ON" --out "$OUT/step_uv.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
