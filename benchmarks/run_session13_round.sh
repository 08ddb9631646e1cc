#!/usr/bin/env bash
# The thirteenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/run_session13_round.sh p1
# Part "p1": prefill as CUDA graphs (ModelRunner.prefill: a prompt replays the smallest token bucket that holds
# it, padded; the draft's extend over it likewise). The graph runner (a new test: prefill replays against the
# ragged eager prefill and against their own function), CUDA engine and overlap GPU tests; the Kimi rank slice's
# prefill eager and as a graph at 256 / 1024 / 2048 tokens (bench_moe_tile.py --prefill, alternating twice in one
# process); end to end on the Kimi slice with prefill graphs off and on, alternating twice in one process.
# Part "p2": the whole single-GPU suite (prefill graphs are on by default in every GPU engine test now).
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: p1 or p2}

case $part in
p1)
  TAIL=8 stage engine_tests 240 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py tests/test_overlap.py
  TAIL=8 stage prefill 150 python benchmarks/bench_moe_tile.py --out "$OUT" --label prefill --tokens \
    --prefill 256 1024 2048
  TAIL=12 stage e2e_kimi 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --prefill-graphs none default --repeat-variants 2 --out "$OUT/e2e_prefill.json"
  ;;
p2)
  TAIL=12 stage gpu_suite 540 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 300 \
    tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
