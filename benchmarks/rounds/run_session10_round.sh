#!/usr/bin/env bash
# The tenth session's device calls (each <= 10 min).
# Part "d1": the INT4 MoE's dot path (gate_up as tensor-core dots over each expert's pairs, kernels/fused_moe.py
# path="dot"): its GPU tests and the MoE ones; bench_moe_dot.py (GEMV vs dot configs, T = 1..16, tokens drawing
# their top-8 from 12 or 384 experts); the 61-layer step at 1k (decode, verify of 2, 4, 8) with the dot path for
# T = 2..16 (SGLANG_EAGLE3_MOE_DOT_MAX=16, the default dot config) and without, alternating twice in one process.
# (d1 at e468f72: the dot path 2-6x slower than the GEMV at every T: 64-128 programs a call, each latency-bound.)
# Part "d2": the dot path split over H (SPLIT programs a (pair, I block), the last to arrive adds the partials):
# the dot path's GPU tests (fixed bounds); bench_moe_dot.py with split variants, writing a table of the fastest
# dot config per T (pool 12); the step at 1k (verify of 2, 4, 8) with the dot path at that table's configs and
# without, alternating twice.
# (d2 at a6edb4c: split 4-8 brings the bf16 dot path to 33 / 43 / 61 / 85 us at T = 2 / 4 / 8 / 16 on 12 experts,
# against the GEMV's 22 / 39 / 68 / 132; on uniform routing it loses at every T.)
# Part "d3": the dot path with 2 or 3 chunks in flight a program (PREFETCH): the dot path's tests, then
# bench_moe_dot.py (T = 2..16) and the step at 1k with the best table, as d2.
# (d3 at b70f15e: 2-3 chunks in flight do not help; in the step the dot path is 15% / 9% slower at T=2 / 4 and
# 4% faster at T=8, one request's tokens sharing ~12 experts.)
# Part "d4": Nsight Compute on the dot path's gate_up (T=1, and T=4 on 12 shared experts: stall reasons), then the
# whole single-GPU suite.
# (d4 at 3853731: the whole GPU suite 305 passed, 1 skipped; its ncu stage matched the GEMV kernels first and
# profiled only those: -c counts launches in the order the driver runs its parts.)
# Part "d5": the dot path's GPU tests at HEAD (PREFETCH removed, the table's config), then Nsight Compute on the
# dot gate_up alone (T=1, and T=4 on 12 shared experts).
# (d5 at 59be66d: the dot path and INT4 MoE GPU tests 56 passed; ncu of the dot gate_up in BENCHMARKS.md.)
# Part "d6": the nibble trick's high nibbles from a shift by 16 (5f9a568): the INT4 MoE GPU tests; the GEMV MoE
# (bench_moe_dot.py, T = 1, 2, 4, 8 on 12 and 384 experts) of this checkout and of the previous one (.old:
# `git archive 495025a sglang_eagle3 benchmarks`), alternating twice; the step at 1k (decode, verify of 4 and 8)
# of the previous and this checkout, alternating twice, one process each.
# (d6 at 243f40a: T >= 2 ~5% faster, T=1 ~30% slower back to back (13.0 -> 17.0 us), the step's T=1 not;
# SHIFT16 became a per-launch constexpr, the GEMV launcher's from 2 tokens up.)
# Part "d7": that split (T=1 the previous code, T >= 2 the shift by 16): the INT4 MoE GPU tests and the GEMV MoE
# against the previous checkout (.old at 495025a) once each, then the step at HEAD once (decode, verify 4 and 8).
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_session10_round.sh d1
source "$(dirname "$0")/gpu_stages.sh"
case "${1:?d1 | d2 | d3 | d4 | d5 | d6 | d7}" in
  d1)
    TAIL=8 stage d1_tests "${T_TESTS:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "moe"
    TAIL=100 stage moe_dot "${T_DOT:-200}" python benchmarks/bench_moe_dot.py --out "$OUT/moe_dot.json"
    TAIL=20 stage step_dot "${T_STEP:-280}" python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --max-tokens 8 --tokens 1 2 4 8 --eager-iters 1 --graph-iters 50 --out "$OUT/step_dot.json" \
      --env-variants "" "SGLANG_EAGLE3_MOE_DOT_MAX=16" "" "SGLANG_EAGLE3_MOE_DOT_MAX=16"
    collect
    ;;
  d2|d3)
    TAIL=8 stage "$1_tests" "${T_TESTS:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "dot_path"
    TAIL=110 stage moe_dot "${T_DOT:-240}" python benchmarks/bench_moe_dot.py --out "$OUT/moe_dot_$1.json" --tokens 2 4 8 16 \
      --table-out "$OUT/dot_table.json"
    TAIL=20 stage step_dot "${T_STEP:-250}" python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --max-tokens 8 --tokens 2 4 8 --eager-iters 1 --graph-iters 50 --out "$OUT/step_dot_$1.json" \
      --env-variants "" "SGLANG_EAGLE3_MOE_DOT_MAX=16 SGLANG_EAGLE3_CONFIG_TABLE=$OUT/dot_table.json" "" \
      "SGLANG_EAGLE3_MOE_DOT_MAX=16 SGLANG_EAGLE3_CONFIG_TABLE=$OUT/dot_table.json"
    collect
    ;;
  d4)
    TAIL=4 stage ncu_dot "${T_NCU:-200}" "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats --metrics "$STALLS" \
      -k regex:"moe_int4_(dot|gemv)" -c 6 python benchmarks/ncu_decode.py moe_dot moe_verify
    TAIL=15 stage gpu_suite "${T_SUITE:-420}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
    collect
    ;;
  d5)
    TAIL=4 stage d5_tests "${T_TESTS:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "dot_path or fused_moe_int4"
    TAIL=4 stage ncu_dot "${T_NCU:-200}" "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats --metrics "$STALLS" \
      -k regex:"moe_int4_dot" -c 4 python benchmarks/ncu_decode.py moe_dot
    collect
    ;;
  d6)
    TAIL=4 stage d6_tests "${T_TESTS:-150}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "fused_moe_int4 or dot_path or graph_replay"
    for i in 1 2; do
      TAIL=9 stage "moe_new_$i" 60 python benchmarks/bench_moe_dot.py --variants "gemv (table)" --tokens 1 2 4 8 \
        --out "$OUT/moe_new_$i.json"
      TAIL=9 stage "moe_old_$i" 60 env GIT_COMMIT=495025a python .old/benchmarks/bench_moe_dot.py \
        --variants "gemv (table)" --tokens 1 2 4 8 --out "$OUT/moe_old_$i.json"
    done
    for i in 1 2; do
      TAIL=4 stage "step_old_$i" 80 env GIT_COMMIT=495025a python .old/benchmarks/bench_verify_graph.py \
        --backends triton --contexts 1024 --max-tokens 8 --tokens 1 4 8 --eager-iters 1 --graph-iters 30 \
        --out "$OUT/step_old_$i.json"
      TAIL=4 stage "step_new_$i" 80 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
        --max-tokens 8 --tokens 1 4 8 --eager-iters 1 --graph-iters 30 --out "$OUT/step_new_$i.json"
    done
    collect
    ;;
  d7)
    TAIL=4 stage d7_tests "${T_TESTS:-150}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "fused_moe_int4 or dot_path or graph_replay"
    TAIL=9 stage moe_new 60 python benchmarks/bench_moe_dot.py --variants "gemv (table)" --tokens 1 2 4 8 \
      --out "$OUT/moe_new.json"
    TAIL=9 stage moe_old 60 env GIT_COMMIT=495025a python .old/benchmarks/bench_moe_dot.py \
      --variants "gemv (table)" --tokens 1 2 4 8 --out "$OUT/moe_old.json"
    TAIL=4 stage step_new 80 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --max-tokens 8 --tokens 1 4 8 --eager-iters 1 --graph-iters 30 --out "$OUT/step_new.json"
    collect
    ;;
esac
