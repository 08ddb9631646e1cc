#!/usr/bin/env bash
# The forty-third session's device round: the tables at HEAD on the H200 (issue 4 and 5 name it; the last H200 tables
# were the thirty-seventh session's, before q_a + kv_a moved to the CUDA cores), then the adaptive draft length at
# concurrency (the forty-second session ran it at batch 1 only).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session43_round.sh q1   (then q2; one device call each, < 10 min)
# q1: the CUDA engine tests (speculative == plain with graphs, the adaptive cases with time_rounds' pass count), then
#     the 61-layer step table (1k and 8k, T = 1..8).
# q2: the kernel table, then the Kimi-K2.5 TP=8 rank slice end to end at 16 concurrent requests: the baseline,
#     EAGLE-3 k = 3 with the random draft's own acceptance and pinned at 3.0, each fixed and adaptive.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: q1 | q2}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
q1)
  TAIL=12 stage engine_tests 240 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 230 \
    tests/gpu/test_cuda_engine.py
  TAIL=24 stage verify_graph 320 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 3 4 5 6 7 8 --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
q2)
  TAIL=45 stage kernels 240 python benchmarks/bench_kernels.py --out "$OUT"
  TAIL=20 stage e2e_kimi_c16 330 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --concurrency 16 \
    --cuda-graph-max-bs 16 --max-new-tokens 64 --repeat 2 --simulate-accept 0 3.0 --adaptive \
    --out "$OUT/e2e_adaptive_kimi_c16.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
