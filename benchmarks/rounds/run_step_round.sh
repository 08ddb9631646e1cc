#!/usr/bin/env bash
# One device call for the decode/verify step work (issues 4 and 5): GPU tests of the kernels and graphs, the
# per-kernel profile of a 6-layer Kimi rank slice without and with PDL (opt-in), then the 61-layer verify-graph benchmark.
# Usage on the GPU machine, from the repo root: OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_step_round.sh
source "$(dirname "$0")/gpu_stages.sh"
stage gpu_tests "${T_TESTS:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu \
  tests/kernels/test_kernels_gpu.py tests/test_graph_runner.py
TAIL=45 stage profile "${T_PROFILE:-150}" python benchmarks/profile_step.py --layers 6 --tokens 1 4 --no-gemm \
  --out "$OUT/profile.json"
TAIL=20 SGLANG_EAGLE3_PDL=1 stage profile_pdl "${T_PROFILE:-150}" python benchmarks/profile_step.py --layers 6 \
  --tokens 1 4 --no-gemm --out "$OUT/profile_pdl.json"
TAIL=20 stage verify_graph "${T_VERIFY:-150}" python benchmarks/bench_verify_graph.py --backends triton \
  --eager-iters 3 --graph-iters 20 --out "$OUT/verify_graph.json"
