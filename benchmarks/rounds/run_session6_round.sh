#!/usr/bin/env bash
# The sixth session's device calls (each <= 10 min).
# Part "x2" (nvidia-h200-x2): TP=2 with PDL on (greedy tokens of TP=2 equal TP=1, graphs on, NCCL beside our
# PDL kernels in one graph), then the quarantined q_rope_attn model test alone and the step with q_rope_attn +
# mla_k_path against the defaults (run_session5_round.sh q_rope, prepared last session).
# Part "moe": the INT4 MoE down kernel loading its weights before its PDL wait (PRELOAD): its GPU tests, the
# kernel benchmark (preload vs slot loop per T, in one run), and the 61-layer step with and without it.
# Part "suite": the whole GPU suite at this commit, then the step at T=1, 2 as shipped, without the down PRELOAD
# (the table turns it on at T <= 2), and without the shared expert's side stream (its join precedes gate_up). Part "tables": the INT4 GEMV MoE swept at T=1 and T=2 (gate_up x down, PRELOAD
# on and off) and merged into the table, the kernel benchmark (with the read-only ceilings), the full 61-layer
# verify table. Part "rest": the suite's files that part "suite" did not reach in its 400 s (it ran 236 tests, all
# passing), the PDL tests again, and the Kimi-slice end-to-end run. Part "last": the INT4 GEMV MoE swept at
# T=4 and T=8 (not merged), then the step at T=1, 2, 4 in one process with the table shipped now, the table of
# the fifth session (sm_90_table_2c0d587.json) and the shipped one plus the new sweep (SGLANG_EAGLE3_CONFIG_TABLE).
# Part "e2e": the Kimi-slice end-to-end run three times, shipped / fifth session's table / shipped, to tell the
# table change from the run-to-run spread.
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_session6_round.sh x2|moe|suite|tables|rest|last|e2e
source "$(dirname "$0")/gpu_stages.sh"
case "${1:?x2, moe, suite, tables, rest, last or e2e}" in
  x2)
    nvidia-smi -L
    TAIL=10 stage tp2_pdl "${T_TP:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/gpu/test_tp_cuda.py
    bash "$(dirname "$0")/run_session5_round.sh" q_rope
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
  moe)
    TAIL=12 stage moe_tests "${T_TESTS:-150}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_pdl_gpu.py tests/kernels/test_kernels_gpu.py -k "moe or pdl"
    TAIL=60 stage kernels "${T_KERNELS:-170}" python benchmarks/bench_kernels.py --out "$OUT"
    TAIL=16 stage step_preload "${T_STEP:-220}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 8192 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants "" \
      "SGLANG_EAGLE3_MOE_DOWN_PRELOAD=0" "" "SGLANG_EAGLE3_MOE_DOWN_PRELOAD=0" --out "$OUT/step_preload.json"
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
  suite)
    TAIL=25 stage gpu_tests "${T_TESTS:-400}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu \
      tests/kernels/test_*gpu.py tests/test_graph_runner.py tests/test_overlap.py
    TAIL=12 stage step_preload "${T_STEP:-170}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 --max-tokens 2 --tokens 1 2 --eager-iters 1 --graph-iters 30 --env-variants "" \
      "SGLANG_EAGLE3_MOE_DOWN_PRELOAD=0" "SGLANG_EAGLE3_OVERLAP=none" "" --out "$OUT/step_preload_t2.json"
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
  tables)
    # the INT4 GEMV MoE at T=1 and T=2 swept jointly (gate_up x down with PRELOAD), the winners used by the
    # kernel benchmark in-process and merged into the table the verify benchmark then reads
    TAIL=40 stage kernels "${T_KERNELS:-300}" python benchmarks/bench_kernels.py --out "$OUT" --sweep gemv
    python benchmarks/merge_sweep.py "$OUT/sweep_table.json" sglang_eagle3/kernels/configs/sm_90.json
    TAIL=20 stage verify_graph "${T_VERIFY:-230}" python benchmarks/bench_verify_graph.py --backends triton \
      --eager-iters 1 --graph-iters 20 --out "$OUT/verify_graph.json"
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
  rest)
    TAIL=12 stage gpu_tests_rest "${T_TESTS:-270}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/test_graph_runner.py tests/test_overlap.py tests/kernels/test_pdl_gpu.py
    stage e2e_kimi "${T_KIMI:-150}" python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 48 \
      --out "$OUT/e2e_kimi_slice.json"
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
  last)
    TAIL=30 stage kernels "${T_KERNELS:-200}" python benchmarks/bench_kernels.py --out "$OUT" --sweep gemv \
      --sweep-tokens 4 8
    TAIL=16 stage step_tables "${T_STEP:-200}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 --max-tokens 4 --tokens 1 2 4 --eager-iters 1 --graph-iters 30 --env-variants "" \
      "SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/results/h200/sm_90_table_2c0d587.json" \
      "SGLANG_EAGLE3_CONFIG_TABLE=$OUT/sweep_table.json" "" --out "$OUT/step_tables.json"
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
  e2e)
    E2E=(python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 48)
    stage e2e_shipped "${T_KIMI:-90}" "${E2E[@]}" --out "$OUT/e2e_shipped.json"
    SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/results/h200/sm_90_table_2c0d587.json stage e2e_table5 "${T_KIMI:-90}" \
      "${E2E[@]}" --out "$OUT/e2e_table5.json"
    stage e2e_shipped_again "${T_KIMI:-90}" "${E2E[@]}" --out "$OUT/e2e_shipped_again.json"
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
esac
