#!/usr/bin/env bash
# The forty-fourth session's device round: the resting draft's overlapped catch-up (`ca6d79c`, never run on a GPU) and
# the adaptive policy's first decision by evidence (`6e06ddd`: one round at 16 requests instead of 8) and its resting
# rounds counted as rounds (`1115be2`: they age the evidence and count toward decisions).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session44_round.sh r1   (then r2; one device call each, < 10 min;
#   pass carry: [".carry"] after benchmarks/rounds/fetch_device_wheels.sh so the structured-output test runs)
# r1: the CUDA engine's adaptive and resting-draft tests (the structured-output one among the adaptive), then the Kimi slice at batch 1 with the random
#     draft: the baseline and adaptive with probe_rounds 0 and 16 (the forty-third session's q6; fixed k = 3 left out).
# r2: the Kimi slice at 16 concurrent requests with the random draft: the baseline and adaptive with
#     probe_rounds 0 and 16 (the forty-third session's q4 without the pinned runs). Its second pass runs at k = 0
#     throughout (the policy carries over; q4: 1090.3-1090.8 against the baseline's 1109.6 / 1117.6). (The first
#     decision by evidence does not show here: the harness's 8-token warm-up call leaves the policy one round short
#     of its first decision either way.)
# r0: r1 cut to ~3 minutes: the tests, then the baseline and adaptive (probe_rounds 16) only.
# Ran: r0 at 4ccb0cf on an H100 (the session's only machine, after about a dozen refused starts), then on it r1's
# e2e line and r2's (each as a stage with a shorter limit); r2 failed for memory, partly the harness's (77f00e0;
# BENCHMARKS.md section 8).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: r0 | r1 | r2}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
r0)  # what ~3 minutes of device time allow (the session's starts kept failing): the tests, then batch 1 resting
  TAIL=8 stage engine_tests 110 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 100 \
    tests/gpu/test_cuda_engine.py -k "adaptive or resting"
  TAIL=8 stage e2e_kimi_rest 150 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 0 --adaptive --adaptive-only --out "$OUT/e2e_rest_kimi.json"
  ;;
r1)
  install_carried_wheels
  TAIL=12 stage engine_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/gpu/test_cuda_engine.py -k "adaptive or resting"
  TAIL=12 stage e2e_kimi_rest 320 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 0 --adaptive --adaptive-only --adaptive-probe-rounds 0 16 --out "$OUT/e2e_rest_kimi.json"
  ;;
r2)
  TAIL=20 stage e2e_kimi_rest_c16 400 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --concurrency 16 \
    --cuda-graph-max-bs 16 --max-new-tokens 64 --repeat 2 --simulate-accept 0 --adaptive --adaptive-only --adaptive-probe-rounds 0 16 \
    --out "$OUT/e2e_rest_kimi_c16.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
