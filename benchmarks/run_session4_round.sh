#!/usr/bin/env bash
# Fourth session's device calls (each <= 10 min). Part "new": the GPU tests of the kernels added this session
# (input-norm fold, INT4 mma gate_up, the launch count), the mma-vs-GEMV MoE benchmark, and the 61-layer step
# at context 1k (decode, verify T=4) with the defaults (overlaps none vs shared_down) and with the input-norm
# fold off. Part "more": the same step with the routing tail and the q-rope-in-attention fusions on and off.
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/run_session4_round.sh new|more
source "$(dirname "$0")/gpu_stages.sh"
PYTEST=(python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu)
STEP=(python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 --max-tokens 4 --tokens 1 4
      --eager-iters 1 --graph-iters 30)
case "${1:?new or more}" in
  new)
    TAIL=25 stage new_tests "${T_TESTS:-200}" "${PYTEST[@]}" tests/kernels/test_fold_gpu.py \
      tests/kernels/test_moe_mma_gpu.py tests/kernels/test_kernels_gpu.py -k "not sweep"
    TAIL=40 stage moe_mma "${T_MMA:-100}" python benchmarks/bench_moe_mma.py --out "$OUT"
    TAIL=8 stage step_fold_on "${T_STEP:-120}" "${STEP[@]}" --overlap-variants none shared_down \
      --out "$OUT/step_fold_on.json"
    TAIL=6 SGLANG_EAGLE3_NO_FUSE=input_norm stage step_fold_off "${T_STEP:-100}" "${STEP[@]}" \
      --out "$OUT/step_fold_off.json"
    ;;
  more)
    TAIL=25 stage more_tests "${T_TESTS:-200}" "${PYTEST[@]}" tests/kernels/test_fold_gpu.py \
      tests/kernels/test_mla_rope_gpu.py tests/test_overlap.py
    TAIL=6 stage step_all_on "${T_STEP:-100}" "${STEP[@]}" --out "$OUT/step_all_on.json"
    TAIL=6 SGLANG_EAGLE3_NO_FUSE=router_topk,q_rope_attn stage step_new_off "${T_STEP:-100}" "${STEP[@]}" \
      --out "$OUT/step_new_off.json"
    ;;
esac
