#!/usr/bin/env bash
# The ninth session's device calls (each <= 10 min).
# Part "r1": MLA's inactive splits store nothing (the merge reads the active ones) and the MoE routing beside the
# shared expert's down projection (route_shared_down). Their GPU tests; bench_small_ops.py for this checkout and
# the previous one (.old: `git archive $PREV` of the package and the scripts it needs, this checkout's
# bench_small_ops.py and bench_kernels.py copied over it), alternating twice; the 61-layer step at 1k (decode and
# verify of 4) of the previous checkout, then of this one with route_shared_down on and off, alternating three
# times in one process.
# Part "r2": the INT4 GEMV MoE's gate_up decoding each weight once for up to 4 pairs of an expert (ROWS). The MoE
# GPU tests; bench_moe_rows.py (one pair a program vs ROWS configs, T = 1..8, tokens drawing from 12, 24 or 384
# experts); the 61-layer step at 1k (decode, verify of 2, 4, 8) with ROWS and without
# (SGLANG_EAGLE3_MOE_ROWS=0), alternating twice in one process.
# (ROWS was slower everywhere and was removed in 5809a2e; its code and bench_moe_rows.py are in e5743a2.)
# Part "r3": the whole single-GPU suite at HEAD (the lean GEMV configs, the routing kernel's order test, this
# session's MLA and routing changes), then profile_step.py's GEMV sweeps (alone, back to back, T=1) of the
# projections not deep-swept before: q_b, the shared expert's gate/up and down, W_UK, W_UV.
# Part "r4": the tables at HEAD: issue 4's (bench_verify_graph.py, decode and verify T = 2..8 at 1k and 8k,
# ours only) and issue 5's (bench_kernels.py, no sweep).
# Part "r5": the MLA merge loading its partials beside seq_len (not after it), against the r1 version (.old2:
# `git archive 2e04b1a`) and the previous session's (.old, 80d04e9): the MLA GPU tests, then bench_small_ops.py
# of the three trees alternating twice.
# Part "r6": the GPU tests of what changed after r3's suite (the merge's loads, the routing checks' helpers).
# Part "r7": Nsight Compute on the INT4 GEMV MoE (T=1, and verify T=4 and 8 with tokens sharing 12 experts):
# where one pair a program spends its time (the counters of one launch; ncu serialises kernels).
# Part "r8": the step at HEAD (decode and verify of 4, 1k and 8k) three times in one process: its noise, and
# bench_verify_graph's new summary on the GPU.
# After r8, inline at 36a3239 (the gemv launchers' shared routing-output helper): `python -m pytest -q -p
# no:cacheprovider -o addopts="" -m gpu tests/kernels/test_fold_gpu.py tests/kernels/test_kernels_gpu.py -k
# "route or router or gemv_pair"`: 38 passed.
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_session9_round.sh r1 .. r8
source "$(dirname "$0")/gpu_stages.sh"
PREV=${PREV:-80d04e9}
OLD_FUSE=input_norm,router_topk,q_rope_attn  # the defaults before route_shared_down
STEP=(--backends triton --contexts 1024 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 50)
case "${1:?r1 .. r8}" in
  r1)
    TAIL=8 stage r1_tests "${T_TESTS:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py tests/kernels/test_fold_gpu.py tests/test_fusions.py \
      -k "mla or topk or route_beside or fused or fusion"
    for i in 1 2; do
      TAIL=14 stage "small_new_$i" 90 python benchmarks/bench_small_ops.py --out "$OUT/small_new_$i.json" --label new
      TAIL=14 stage "small_old_$i" 90 env GIT_COMMIT="$PREV" python .old/benchmarks/bench_small_ops.py \
        --out "$OUT/small_old_$i.json" --label old
    done
    TAIL=3 stage step_old "${T_STEP:-150}" env GIT_COMMIT="$PREV" python .old/benchmarks/bench_verify_graph.py \
      "${STEP[@]}" --out "$OUT/step_old.json"
    TAIL=14 stage step_new "${T_STEP2:-260}" python benchmarks/bench_verify_graph.py "${STEP[@]}" --out "$OUT/step_new.json" \
      --env-variants "" "SGLANG_EAGLE3_NO_FUSE=$OLD_FUSE,route_shared_down" "" \
      "SGLANG_EAGLE3_NO_FUSE=$OLD_FUSE,route_shared_down" "" "SGLANG_EAGLE3_NO_FUSE=$OLD_FUSE,route_shared_down"
    collect
    ;;
  r2)
    TAIL=6 stage r2_tests "${T_TESTS:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "moe"
    TAIL=100 stage moe_rows "${T_ROWS:-200}" python benchmarks/bench_moe_rows.py --out "$OUT/moe_rows.json"
    TAIL=20 stage step_rows "${T_STEP:-280}" python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --max-tokens 8 --tokens 1 2 4 8 --eager-iters 1 --graph-iters 50 --out "$OUT/step_rows.json" \
      --env-variants "" "SGLANG_EAGLE3_MOE_ROWS=0" "" "SGLANG_EAGLE3_MOE_ROWS=0"
    collect
    ;;
  r3)
    TAIL=15 stage gpu_suite "${T_SUITE:-420}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
    TAIL=40 stage sweep "${T_SWEEP:-150}" python benchmarks/profile_step.py --gemm-only --tokens 1 --sweep \
      --deep-sweep --only q_b_proj "shared gate_up (gated)" "shared down" "w_uk (8 heads)" "w_uv (8 heads)" \
      --out "$OUT/sweep_r3.json"
    collect
    ;;
  r4)
    TAIL=20 stage verify_graph "${T_STEP:-300}" python benchmarks/bench_verify_graph.py --backends triton \
      --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
    TAIL=45 stage kernels "${T_KERNELS:-240}" python benchmarks/bench_kernels.py --out "$OUT"
    collect
    ;;
  r5)
    TAIL=6 stage r5_tests "${T_TESTS:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py tests/kernels/test_mla_rope_gpu.py -k "mla"
    for i in 1 2; do
      TAIL=5 stage "mla_new_$i" 90 python benchmarks/bench_small_ops.py --out "$OUT/mla_new_$i.json" --label new
      TAIL=5 stage "mla_r1_$i" 90 env GIT_COMMIT=2e04b1a python .old2/benchmarks/bench_small_ops.py \
        --out "$OUT/mla_r1_$i.json" --label r1
      TAIL=5 stage "mla_old_$i" 90 env GIT_COMMIT="$PREV" python .old/benchmarks/bench_small_ops.py \
        --out "$OUT/mla_old_$i.json" --label old
    done
    collect
    ;;
  r6)
    TAIL=8 stage r6_tests "${T_TESTS:-300}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_fold_gpu.py tests/kernels/test_mla_rope_gpu.py tests/kernels/test_kernels_gpu.py \
      tests/test_fusions.py tests/test_graph_runner.py -k "not moe or topk"
    collect
    ;;
  r7)
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    TAIL=4 stage ncu_moe "${T_NCU:-200}" "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      -k regex:"moe_int4_gemv" -c 14 python benchmarks/ncu_decode.py moe moe_verify
    collect
    ;;
  r8)
    TAIL=16 stage step_head "${T_STEP:-280}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 8192 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 \
      --env-variants "" "" "" --out "$OUT/step_head.json"
    collect
    ;;
esac
