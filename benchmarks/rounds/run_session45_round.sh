#!/usr/bin/env bash
# The forty-fifth session's device round: a resting draft's catch-up checks position 1 at every token it covers and the
# policy's half-life is 24 rounds (`4263d13`), never run on a GPU; and the forty-fourth session's r2 (16 concurrent
# requests resting, the overlapped catch-up), which no machine ran.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session45_round.sh s1   (then s2 on an H200; one device call each,
#   < 10 min; pass carry: [".carry"] after benchmarks/rounds/fetch_device_wheels.sh so the structured-output test runs)
# s1 (an H100 will do; ~5 minutes, the session's device time being short after refused starts): the CUDA engine's
#     adaptive and resting-draft tests (the catch-up's checks reach the policy with graphs), then the Kimi slice at
#     batch 1: the baseline and an adaptive run whose pinned accept length goes 1, 3, 1, 3 pass by pass
#     (--accept-phases: how many steps the policy takes to draft again, and to rest again, at the slice's real costs).
# s0: s1 cut to ~4 minutes (the session's last device minutes): the resting-draft GPU tests only, then the
#     accept-phases run with 64 new tokens a prompt.
# s3: the Kimi slice at batch 1 with the random draft: the baseline and adaptive (probe_rounds 16, the draft
#     resting), twice each (the forty-fourth session's r0 line: the new feeding changes no cost at a constant
#     acceptance).
# s2 (an H200: the slice with the draft at 16 requests did not fit an H100): the Kimi slice at 16 concurrent requests
#     with the random draft: the baseline and adaptive with probe_rounds 0 and 16 (the forty-fourth session's r2).
# Ran: s0, then fixed k = 3 at the same pinned lengths (bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 64
# --repeat 2 --simulate-accept 1 3), s3 and s2, at b205498 on an H100 (the session's only machine, after ~20 minutes of
# refused starts); s1 never ran. Results: benchmarks/results/h100/*_b205498*, BENCHMARKS.md section 8.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: s0 | s1 | s2 | s3}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
s0)
  TAIL=8 stage engine_tests 90 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 80 \
    tests/gpu/test_cuda_engine.py -k "resting"
  TAIL=12 stage e2e_kimi_phases 130 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 64 \
    --repeat 4 --simulate-accept --adaptive --adaptive-only --accept-phases 1 3 --out "$OUT/e2e_phases_kimi.json"
  ;;
s1)
  TAIL=12 stage engine_tests 130 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/gpu/test_cuda_engine.py -k "adaptive or resting"
  TAIL=12 stage e2e_kimi_phases 150 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 4 --simulate-accept --adaptive --adaptive-only --accept-phases 1 3 --out "$OUT/e2e_phases_kimi.json"
  ;;
s3)
  TAIL=12 stage e2e_kimi_rest 240 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 0 --adaptive --adaptive-only --out "$OUT/e2e_rest_kimi.json"
  ;;
s2)
  TAIL=20 stage e2e_kimi_rest_c16 400 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --concurrency 16 \
    --cuda-graph-max-bs 16 --max-new-tokens 64 --repeat 2 --simulate-accept 0 --adaptive --adaptive-only \
    --adaptive-probe-rounds 0 16 --out "$OUT/e2e_rest_kimi_c16.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
