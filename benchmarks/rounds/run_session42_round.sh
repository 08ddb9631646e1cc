#!/usr/bin/env bash
# The forty-second session's device round: the adaptive draft length (runtime/adaptive.py, speculative_adaptive).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session42_round.sh p1   (then p2; one device call each, < 10 min)
# p1: the CUDA engine's adaptive tests (graphs for every candidate, the start-up timing uncounted, output equal to
#     the reference while k cycles), then the embedded pair end to end (its trained draft's real acceptance): the
#     baseline, fixed k = 1, 3, 5 and adaptive from k = 3, twice.
# p2: the Kimi-K2.5 TP=8 rank slice end to end: the baseline, EAGLE-3 k = 3 with the random draft's own acceptance
#     (~1 token a round: the field's case of speculation slower than none) and pinned at 3.0, each fixed and adaptive.
#     p1 and p2 ran at 6cd1d1b (an H100): results/h100/*_6cd1d1b.*. Adaptive then had no k = 0; since 626932c it has.
# p3: with k = 0 among the candidates (626932c): the CUDA engine's adaptive and structured-output tests (xgrammar from
#     .carry/wheels, carry: [".carry"]), then p2's Kimi slice again, then p1's embedded pair once. Ran at 2f311a3 (an
#     H100): results/h100/*_2f311a3.*, with one more embedded run on the same machine (e2e_adaptive_embedded_x3_*:
#     bench_e2e.py --num-prompts 8 --max-new-tokens 96 --ks 3 5 --adaptive --repeat 3 --repeat-variants 3).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: p1 | p2 | p3}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
p1)
  TAIL=8 stage engine_adaptive 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/gpu/test_cuda_engine.py -k adaptive
  TAIL=16 stage e2e_embedded 300 python benchmarks/bench_e2e.py --num-prompts 8 --max-new-tokens 96 --ks 1 3 5 \
    --adaptive --repeat 2 --repeat-variants 2 --out "$OUT/e2e_adaptive_embedded.json"
  ;;
p2)
  TAIL=16 stage e2e_kimi 540 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 0 3.0 --adaptive --out "$OUT/e2e_adaptive_kimi.json"
  ;;
p3)
  install_carried_wheels
  TAIL=8 stage engine_adaptive 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/gpu/test_cuda_engine.py -k "adaptive or grammar"
  TAIL=16 stage e2e_kimi 300 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 0 3.0 --adaptive --out "$OUT/e2e_adaptive_kimi.json"
  TAIL=8 stage e2e_embedded 90 python benchmarks/bench_e2e.py --num-prompts 8 --max-new-tokens 96 --ks 3 5 \
    --adaptive --repeat 2 --out "$OUT/e2e_adaptive_embedded.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
