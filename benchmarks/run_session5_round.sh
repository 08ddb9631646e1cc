#!/usr/bin/env bash
# The fifth session's device calls (each <= 10 min). Part "pdl": does programmatic dependent launch start a
# kernel early inside our CUDA graphs, and does loading a GEMV's first weight tiles into registers before its
# wait pay (bench_pdl.py: a spin/probe pair, then a 12-layer chain of the rank's dense GEMVs); the GPU tests of
# that path; the 61-layer step with PDL off / L2 prefetch / 1 and 2 tiles in registers / off again (one
# process, bench_verify_graph.py --env-variants); the FlashInfer MLA peer if its wheels were carried (.whl).
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/run_session5_round.sh pdl
source "$(dirname "$0")/gpu_stages.sh"
case "${1:?pdl}" in
  pdl)
    TAIL=30 stage pdl "${T_PDL:-120}" python benchmarks/bench_pdl.py --out "$OUT/pdl.json"
    TAIL=8 stage pdl_tests "${T_PDL_TESTS:-90}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_pdl_gpu.py
    TAIL=16 stage step_pdl "${T_STEP:-240}" python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants "SGLANG_EAGLE3_PDL=0" \
      "SGLANG_EAGLE3_PDL=1" "SGLANG_EAGLE3_PDL=1 SGLANG_EAGLE3_PDL_PRELOAD=1" \
      "SGLANG_EAGLE3_PDL=1 SGLANG_EAGLE3_PDL_PRELOAD=2" "SGLANG_EAGLE3_PDL=0" --out "$OUT/step_pdl.json"
    ;;
esac
