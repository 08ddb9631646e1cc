#!/usr/bin/env bash
# Fourth session's device calls (each <= 10 min). Part "new": the GPU tests of the kernels added this session
# (input-norm fold, INT4 mma gate_up, the launch count), the mma-vs-GEMV MoE benchmark, and the 61-layer step
# at context 1k (decode, verify T=4) with the defaults (overlaps none vs shared_down) and with the input-norm
# fold off. Part "more": the same step with this session's defaults (input-norm
# fold off by default, routing tail and q rope in the attention on) against the old wiring, then the whole GPU
# suite. Part "last": the routing tail alone, the full 61-layer table, the Kimi-slice end to end (defaults).
# Part "new" ran at 8850cf8 (its mma test and benchmark files were removed after it).
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_session4_round.sh new|more|last
source "$(dirname "$0")/gpu_stages.sh"
PYTEST=(python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu)
STEP=(python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 --max-tokens 4 --tokens 1 4
      --eager-iters 1 --graph-iters 30)
case "${1:?new, more or last}" in
  new)
    TAIL=25 stage new_tests "${T_TESTS:-200}" "${PYTEST[@]}" tests/kernels/test_fold_gpu.py \
      tests/kernels/test_moe_mma_gpu.py tests/kernels/test_kernels_gpu.py -k "not sweep"
    TAIL=40 stage moe_mma "${T_MMA:-100}" python benchmarks/bench_moe_mma.py --out "$OUT"
    TAIL=8 stage step_fold_on "${T_STEP:-120}" "${STEP[@]}" --overlap-variants none shared_down \
      --out "$OUT/step_fold_on.json"
    TAIL=6 SGLANG_EAGLE3_NO_FUSE=input_norm stage step_fold_off "${T_STEP:-100}" "${STEP[@]}" \
      --out "$OUT/step_fold_off.json"
    ;;
  more)  # the step first (the decisions hang on it), then the whole GPU suite in what is left
    TAIL=8 stage step_on "${T_STEP:-110}" "${STEP[@]}" --overlap-variants shared_down shared_down,mla_k_path \
      --out "$OUT/step_on.json"
    TAIL=6 SGLANG_EAGLE3_NO_FUSE=input_norm,router_topk,q_rope_attn stage step_old "${T_STEP:-90}" "${STEP[@]}" \
      --overlap-variants shared_down --out "$OUT/step_old.json"
    TAIL=25 stage gpu_tests "${T_TESTS:-330}" "${PYTEST[@]}" tests/gpu tests/kernels/test_*gpu.py \
      tests/test_graph_runner.py tests/test_overlap.py
    ;;
  last)  # the routing tail alone, then the full 61-layer table and the Kimi-slice end-to-end run
    TAIL=6 SGLANG_EAGLE3_NO_FUSE=input_norm,q_rope_attn stage step_topk_only "${T_STEP:-90}" "${STEP[@]}" \
      --out "$OUT/step_topk_only.json"
    TAIL=20 stage verify_graph "${T_VERIFY:-190}" python benchmarks/bench_verify_graph.py --backends triton \
      --eager-iters 1 --graph-iters 20 --out "$OUT/verify_graph.json"
    TAIL=12 stage e2e_kimi "${T_KIMI:-150}" python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 \
      --max-new-tokens 48 --out "$OUT/e2e_kimi_slice.json"
    ;;
esac
