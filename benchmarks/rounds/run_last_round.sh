#!/usr/bin/env bash
# The session's last device call (~6 min): GPU tests (kernels, lossless speculation, graphs), the 61-layer
# verify-graph benchmark and the per-kernel profile of a 6-layer slice.
# Usage on the GPU machine, from the repo root: OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_last_round.sh
source "$(dirname "$0")/gpu_stages.sh"
stage gpu_tests "${T_TESTS:-180}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu \
  tests/kernels/test_kernels_gpu.py tests/test_graph_runner.py
TAIL=20 stage verify_graph "${T_VERIFY:-110}" python benchmarks/bench_verify_graph.py --backends triton \
  --eager-iters 3 --graph-iters 20 --out "$OUT/verify_graph.json"
TAIL=16 stage profile "${T_PROFILE:-70}" python benchmarks/profile_step.py --layers 6 --tokens 1 4 --no-gemm \
  --out "$OUT/profile.json"
