#!/usr/bin/env bash
# One device call (~8 min): do the three launch fusions (env.NO_FUSE) change what graphs compute? The graph-
# runner GPU tests with every fusion on, the end-to-end graph-vs-eager test again with all of them off (over
# several prompt seeds both times), the 61-layer step at context 1k with the fusions on, and the GEMV table
# with a read-only ceiling per projection and a wide config sweep on the launches that carry most bytes.
# Usage on the GPU machine, from the repo root: OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_fusion_round.sh
source "$(dirname "$0")/gpu_stages.sh"
PYTEST=(python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu)
TAIL=30 stage graph_tests_fused "${T_TESTS:-200}" "${PYTEST[@]}" tests/test_graph_runner.py
TAIL=30 SGLANG_EAGLE3_NO_FUSE=all stage graph_tests_unfused "${T_UNFUSED:-120}" "${PYTEST[@]}" \
  tests/test_graph_runner.py -k end_to_end
TAIL=14 stage verify_graph "${T_VERIFY:-120}" python benchmarks/bench_verify_graph.py --backends triton \
  --contexts 1024 --max-tokens 4 --eager-iters 2 --graph-iters 20 --out "$OUT/verify_graph.json"
TAIL=40 stage gemv_sweep "${T_SWEEP:-260}" python benchmarks/profile_step.py --gemm-only --tokens 1 4 --sweep \
  --wide-sweep --out "$OUT/gemv_sweep.json"
