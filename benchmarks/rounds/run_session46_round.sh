#!/usr/bin/env bash
# The forty-sixth session's device round: the adaptive policy's change test (`e6ee4ac`: position 1's recent checks
# against the older ones; a change resets the evidence and decides at once), never run on a GPU, against the policy
# without it (SGLANG_EAGLE3_ADAPTIVE_CHANGE_NATS=inf) in one process; and the forty-fifth session's s1 tests, which no
# machine ran.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session46_round.sh u1   (then u2; one device call each, < 10 min;
#   pass carry: [".carry"] after benchmarks/rounds/fetch_device_wheels.sh so the structured-output test runs)
# u1 (an H100 will do): the Kimi slice at batch 1, the pinned accept length going 1, 3, 1, 3 pass by pass
#     (--accept-phases), with the change test and without, alternating (each variant runs its own baseline first):
#     how many steps each takes to rest again after every draft was accepted, and to draft again.
# u2: the CUDA engine's adaptive and resting-draft tests, the structured-output case included (xgrammar carried), then
#     the Kimi slice at batch 1 with the random draft (nothing accepted): baseline and adaptive, with the change test
#     and without (a constant acceptance: the test must cost nothing there).
# u3 (an H200, or an H100 since `77f00e0`): 16 concurrent requests, the accept length going 1, 3, 1, 3 pass by pass,
#     with the change test and without.
# u4: the policy pricing a batch with sampled requests at its own timed costs (the round costs timed twice since
#     this session): the CUDA engine's adaptive and resting-draft tests, then the Kimi slice at batch 1 with the random
#     draft, greedy and at temperature 0.8 (where the greedy prices held the draft at k = 1: 0.96x at `9743967`).
# u5: stepping up (a decision picks no k past the first candidate beyond the deepest position with evidence; u1 and u3
#     saw the change test jump 0 -> 5 for 8 rounds on each rise, the pinned third draft never accepted): u1's and u3's
#     phases with it and without (SGLANG_EAGLE3_ADAPTIVE_STEP_UP=0), 48 tokens a request at batch 1 to fit one call.
# Ran (one H100, after three refused starts): u1 twice, u2 and u3 at 9743967, a sampled run at 9743967 (bench_e2e.py
# --kimi-slice --num-prompts 3 --max-new-tokens 96 --repeat 2 --simulate-accept 0 --adaptive --adaptive-only --sampling
# greedy temperature=0.8,seed=7), u4 at b03986d, u5 at a569a5d. Results: benchmarks/results/h100/*_{9743967,b03986d,
# a569a5d}*, BENCHMARKS.md section 8.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: u1 | u2 | u3 | u4 | u5}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
NOTEST=SGLANG_EAGLE3_ADAPTIVE_CHANGE_NATS=inf
case $part in
u1)
  TAIL=24 stage e2e_kimi_phases 400 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 64 \
    --repeat 4 --simulate-accept --adaptive --adaptive-only --accept-phases 1 3 --env-variants '' "$NOTEST" \
    --out "$OUT/e2e_phases_change_kimi.json"
  ;;
u2)
  TAIL=12 stage engine_tests 170 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/gpu/test_cuda_engine.py -k "adaptive or resting"
  TAIL=16 stage e2e_kimi_rest 330 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 0 --adaptive --adaptive-only --env-variants '' "$NOTEST" \
    --out "$OUT/e2e_rest_change_kimi.json"
  ;;
u3)
  TAIL=24 stage e2e_kimi_phases_c16 520 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 \
    --concurrency 16 --cuda-graph-max-bs 16 --max-new-tokens 48 --repeat 4 --simulate-accept --adaptive \
    --adaptive-only --accept-phases 1 3 --env-variants '' "$NOTEST" --out "$OUT/e2e_phases_change_kimi_c16.json"
  ;;
u4)
  TAIL=12 stage engine_tests 170 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/gpu/test_cuda_engine.py -k "adaptive or resting"
  TAIL=16 stage e2e_kimi_rest_sampled 300 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 \
    --max-new-tokens 96 --repeat 2 --simulate-accept 0 --adaptive --adaptive-only --sampling greedy \
    temperature=0.8,seed=7 --out "$OUT/e2e_rest_sampled_kimi.json"
  ;;
u5)
  NOSTEP=SGLANG_EAGLE3_ADAPTIVE_STEP_UP=0
  TAIL=24 stage e2e_kimi_phases_step 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 \
    --max-new-tokens 48 --repeat 4 --simulate-accept --adaptive --adaptive-only --accept-phases 1 3 \
    --env-variants '' "$NOSTEP" --out "$OUT/e2e_phases_step_kimi.json"
  TAIL=24 stage e2e_kimi_phases_step_c16 260 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 \
    --concurrency 16 --cuda-graph-max-bs 16 --max-new-tokens 48 --repeat 4 --simulate-accept --adaptive \
    --adaptive-only --accept-phases 1 3 --env-variants '' "$NOSTEP" --out "$OUT/e2e_phases_step_kimi_c16.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
