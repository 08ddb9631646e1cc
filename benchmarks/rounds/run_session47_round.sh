#!/usr/bin/env bash
# The forty-seventh session's device round: the resting draft's catch-up over sampled requests drawn inside its own
# prefill graphs (`draft_prefill_sampled`), where the forty-sixth session's catch-up drew after the greedy graph by an
# eager second pass of the draft head (2.69 ms against the greedy 0.91 on an H100, 16 tokens, batch 1).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session47_round.sh v1   (then v2; one device call each, < 10 min;
#   pass carry: [".carry"] after benchmarks/rounds/fetch_device_wheels.sh so the structured-output test runs)
# v1 (an H100 will do): the GPU tests of the graphs (the sampled catch-up's replay against the eager composition, the
#     prefill graphs, the CUDA engine's adaptive and resting-draft tests), then bench_catch_up.py: greedy, sampled in
#     the graph, the forty-sixth session's composition and the eager fallback side by side at 1 / 4 / 16 requests,
#     twice, with a profile of each sampled path at batch 1.
# v2: bench_catch_up.py again (after `6a2ccdd`: each row's request uploaded without waiting), then the Kimi slice end to end at batch 1 with the random draft, greedy and at temperature 0.8 (u4 of the forty-sixth
#     session's round at `b03986d`: the policy's timed sampled catch-up, and what it chose).
# v3: where fixed k = 1 loses for sampled requests (the policy's timed costs predicted it 3% faster than plain decoding
#     at the random draft's ~0.24 acceptance; it ran 0.96x at `9743967`): the Kimi slice at batch 1, baseline and k = 1,
#     greedy and at temperature 0.8, each with profile_round's pass (the scheduler's wall time a step against the GPU's
#     kernel time inside it, and the host's functions).
# v4: the runtime's GPU tests whole (the CUDA engine, the graph runner, the overlaps, the loaders' GPU layouts): the
#     forty-sixth and forty-seventh sessions changed the scheduler and the runner and ran only their subsets.
# v5: after `1815c95` (the Kimi slice built by bench_e2e.kimi_models for both benchmarks; the GPU test's reference
#     in conftest): the sampled catch-up's GPU test, bench_catch_up.py and bench_e2e.py --kimi-slice, short.
# v6: `b1b99b6` (the prefill replays' per-token inputs scattered, outputs gathered, by one index) against the tree
#     before it, bench_catch_up.py at 1 and 16 requests, alternating twice in one call.
# v7: the prefill replays' GPU tests after `b1b99b6` (they ran in v1 and v4 before it).
# Ran (one lease each, no refusals): on an H100 v1 at 41354f9, v2 at 0ec52f0, v3 at 59cac1d, v4 at 1bd4980 (23 + 32
# passed), v5 at 8ca651c (2 passed; the benchmarks ran; its e2e is a smoke run: 2 prompts x 32 tokens, one pass, no
# level); on an H200 v6 at 73a8f24; on an H100 v7 at 7ba7f7c (4 passed). ~27.5 of 30 device minutes. Results: benchmarks/results/h100/*_{41354f9,0ec52f0,
# 59cac1d,1bd4980,8ca651c,7ba7f7c}*, benchmarks/results/h200/*_73a8f24*, BENCHMARKS.md section 8.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: v1 | v2 | v3 | v4 | v5 | v6 | v7}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
v1)
  TAIL=12 stage graph_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/test_graph_runner.py -k "sampled_catch_up or prefill"
  TAIL=12 stage engine_tests 170 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/gpu/test_cuda_engine.py -k "adaptive or resting"
  TAIL=80 stage catch_up 200 python benchmarks/bench_catch_up.py --profile --out "$OUT/catch_up.json"
  ;;
v2)
  TAIL=12 stage catch_up 150 python benchmarks/bench_catch_up.py --iters 30 --out "$OUT/catch_up.json"
  TAIL=16 stage e2e_kimi_rest_sampled 330 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 \
    --max-new-tokens 96 --repeat 2 --simulate-accept 0 --adaptive --adaptive-only --sampling greedy \
    temperature=0.8,seed=7 --out "$OUT/e2e_rest_sampled_kimi.json"
  ;;
v3)
  TAIL=60 stage e2e_kimi_k1_profile 400 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 \
    --max-new-tokens 96 --repeat 2 --simulate-accept 0 --k 1 --sampling greedy temperature=0.8,seed=7 --profile \
    --out "$OUT/e2e_k1_profile_kimi.json"
  ;;
v4)
  TAIL=12 stage engine_tests_all 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/gpu/test_cuda_engine.py
  TAIL=12 stage runtime_gpu_tests 260 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/test_graph_runner.py tests/test_overlap.py tests/loaders
  ;;
v5)
  TAIL=8 stage graph_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/test_graph_runner.py -k sampled_catch_up
  TAIL=12 stage catch_up 120 python benchmarks/bench_catch_up.py --iters 10 --repeat 1 --batch 1 4 \
    --out "$OUT/catch_up.json"
  TAIL=8 stage e2e_kimi 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 32 \
    --repeat 1 --simulate-accept 3.0 --out "$OUT/e2e_kimi.json"
  ;;
v6)
  # the tree before `b1b99b6` carried as .carry/old (git archive 24d92c6 sglang_eagle3 benchmarks/*.py
  # benchmarks/ablations benchmarks/variants | tar -x -C .carry/old), alternating with this one twice
  OLD=24d92c6a9094b858d9f899074f5af69a93b312cf
  for i in 1 2; do
    TAIL=6 stage "catch_up_old_$i" 150 env GIT_COMMIT=$OLD python .carry/old/benchmarks/bench_catch_up.py --iters 30 \
      --repeat 1 --batch 1 16 --out "$OUT/catch_up_old_$i.json"
    TAIL=6 stage "catch_up_new_$i" 150 python benchmarks/bench_catch_up.py --iters 30 --repeat 1 --batch 1 16 \
      --out "$OUT/catch_up_new_$i.json"
  done
  ;;
v7)
  TAIL=8 stage graph_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/test_graph_runner.py -k "sampled_catch_up or prefill"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
