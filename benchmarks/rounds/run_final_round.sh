#!/usr/bin/env bash
# One device call (<= 10 min): GPU tests of kernels and lossless speculation, the INT4 GEMV MoE sweep with the
# kernel benchmark (kernels.json), the winners merged into configs/sm_90.json, then the 61-layer verify-graph
# benchmark and the Kimi-slice end-to-end run with those configs.
# Usage on the GPU machine, from the repo root: OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_final_round.sh
source "$(dirname "$0")/gpu_stages.sh"
stage gpu_tests "${T_TESTS:-140}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu \
  tests/kernels/test_kernels_gpu.py
TAIL=40 stage kernels "${T_KERNELS:-160}" python benchmarks/bench_kernels.py --out "$OUT" --sweep gemv
[ -f "$OUT/sweep_table.json" ] && python benchmarks/merge_sweep.py "$OUT/sweep_table.json" \
  sglang_eagle3/kernels/configs/sm_90.json
TAIL=20 stage verify_graph "${T_VERIFY:-140}" python benchmarks/bench_verify_graph.py --backends triton \
  --eager-iters 3 --graph-iters 20 --out "$OUT/verify_graph.json"
stage e2e_kimi "${T_KIMI:-120}" python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 48 \
  --out "$OUT/e2e_kimi_slice.json"
