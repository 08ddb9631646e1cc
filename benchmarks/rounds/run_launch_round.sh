#!/usr/bin/env bash
# The launch-removal work's device calls (each <= 10 min). Part "tests": the GPU tests (kernels at real shapes,
# lossless speculation, graphs vs eager) and the kernel benchmark (kernels.json); its MLA merge-path sweep
# (sweep_mla.json) ran at e9d8e06 and went with the in-launch merge. Part "step": the 61-layer verify-graph
# benchmark (1k and 8k, T=1..8), the per-kernel profile of a 6-layer slice, and the Kimi-slice end-to-end run.
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_launch_round.sh tests|step
source "$(dirname "$0")/gpu_stages.sh"
case "${1:?tests or step}" in
  tests)
    TAIL=25 stage gpu_tests "${T_TESTS:-360}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu \
      tests/kernels/test_*gpu.py tests/test_graph_runner.py tests/test_overlap.py
    TAIL=40 stage kernels "${T_KERNELS:-150}" python benchmarks/bench_kernels.py --out "$OUT"
    ;;
  step)
    TAIL=20 stage verify_graph "${T_VERIFY:-170}" python benchmarks/bench_verify_graph.py --backends triton \
      --eager-iters 2 --graph-iters 20 --out "$OUT/verify_graph.json"
    TAIL=24 stage profile "${T_PROFILE:-80}" python benchmarks/profile_step.py --layers 6 --tokens 1 4 --no-gemm \
      --out "$OUT/profile.json"
    stage e2e_kimi "${T_KIMI:-120}" python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 48 \
      --out "$OUT/e2e_kimi_slice.json"
    ;;
esac
