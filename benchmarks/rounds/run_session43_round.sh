#!/usr/bin/env bash
# The forty-third session's device round: the tables at HEAD on the H200 (issue 4 and 5 name it; the last H200 tables
# were the thirty-seventh session's, before q_a + kv_a moved to the CUDA cores), then the adaptive draft length at
# concurrency (the forty-second session ran it at batch 1 only).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session43_round.sh q1   (then q2; one device call each, < 10 min)
# q1: the CUDA engine tests (speculative == plain with graphs, the adaptive cases with time_rounds' pass count), then
#     the 61-layer step table (1k and 8k, T = 1..8).
# q2: the kernel table, then the Kimi-K2.5 TP=8 rank slice end to end at 16 concurrent requests: the baseline,
#     EAGLE-3 k = 3 with the random draft's own acceptance and pinned at 3.0, each fixed and adaptive.
# q3: the resting draft (k = 0 as plain decode steps, the draft caught up every 16 rounds): the CUDA engine's adaptive
#     tests, then the Kimi slice at batch 1: the baseline, k = 3 with the random draft's acceptance and pinned at 3.0,
#     each fixed and adaptive with probe_rounds 0 (k = 0 rounds run the draft's extend, as before) and 16.
# q4: the same configurations at 16 concurrent requests.
# q5: at the session's last commit, every CUDA engine test and the overlap schedule's GPU tests.
# q6: the overlapped catch-up (queued behind the round in flight, its proposals read with that round): the adaptive
#     and resting-draft GPU tests, then the Kimi slice at batch 1 with the random draft, adaptive with probe_rounds
#     0 and 16. NOT RUN in the forty-third session (its device time was spent): the next session's first call.
# q1, q2 ran at 46d2e87 and q3, q4 at 2f3662c on one H200; q5 at c96b565 on an H100 (results/h200, results/h100).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: q1 | q2 | q3 | q4 | q5 | q6}
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
q3)
  TAIL=8 stage engine_adaptive 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/gpu/test_cuda_engine.py -k adaptive
  TAIL=20 stage e2e_kimi_rest 400 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 0 3.0 --adaptive --adaptive-probe-rounds 0 16 --out "$OUT/e2e_rest_kimi.json"
  ;;
q4)
  TAIL=20 stage e2e_kimi_rest_c16 500 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --concurrency 16 \
    --cuda-graph-max-bs 16 --max-new-tokens 64 --repeat 2 --simulate-accept 0 3.0 --adaptive \
    --adaptive-probe-rounds 0 16 --out "$OUT/e2e_rest_kimi_c16.json"
  ;;
q5)
  TAIL=10 stage engine_tests 220 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 210 \
    tests/gpu/test_cuda_engine.py
  TAIL=10 stage overlap_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/test_overlap.py
  ;;
q6)
  TAIL=6 stage engine_adaptive 130 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/gpu/test_cuda_engine.py -k "adaptive or resting"
  TAIL=12 stage e2e_kimi_rest 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 0 --adaptive --adaptive-probe-rounds 0 16 --out "$OUT/e2e_rest_kimi.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
