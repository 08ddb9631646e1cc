#!/usr/bin/env bash
# The eighth session's device calls (each <= 10 min). The first five ran inline (no part here), exactly:
#   python benchmarks/bench_chain.py --out $OUT/chain_<c>.json --tokens 1 4 --layers 12 [--variants ...]
#       at b942d6c (default variants), 0273b2d and edeb252 (variants in the JSON's command): a persistent
#       GEMV chain against separate launches; code removed in 81ae722 (it lost).
#   python benchmarks/bench_chain.py --out $OUT/chain_tail_068d6db.json --variants separate separate/notail
#       single0 single0/notail ... : the split-K tail's cost, 1.5-1.7 us a split launch.
#   python benchmarks/bench_split_sum.py --out $OUT/split_sum_7242d72.json --tokens 1 4 --reader-block-k 0 128 64:
#       the split-K reduction left to the readers; slower, reverted (ab51539).
#   python benchmarks/bench_launch_floor.py --out $OUT/launch_floor_498f9bf.json (and with SGLANG_EAGLE3_PDL=0),
#       then bench_verify_graph.py --backends triton --contexts 1024 --max-tokens 4 --tokens 1 4 --eager-iters 1
#       --graph-iters 30: the launch structure's own floor beside the real step.
# Part "topk": the routing kernel with one reduction a pick. Its GPU tests, then bench_small_ops.py for this
# checkout and the previous one (.old: `git archive 498f9bf` of the package and the scripts it needs, carried),
# alternating twice, then the 61-layer step (decode and verify of 4 at 1k) previous / this / previous / this.
# Part "suite": the whole single-GPU suite in one call (the routing kernel changed), then Nsight Compute on the
# decode kernels at T=1 (benchmarks/ncu_decode.py: the counters of one launch each, ncu serialises them).
# Part "lean" (after `profile_step.py --gemm-only --tokens 1 --sweep --deep-sweep --only "q_a+kv_a as one
# matrix" o_proj`, run inline at 8973344): the GEMV GPU tests with the lean configs, then the 61-layer step with
# them and without (SGLANG_EAGLE3_GEMV_LEAN=0), alternating twice in one process.
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_session8_round.sh topk|suite|lean
source "$(dirname "$0")/gpu_stages.sh"
PREV=${PREV:-498f9bf}
case "${1:?topk, suite or lean}" in
  topk)
    TAIL=6 stage topk_tests "${T_TESTS:-120}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py tests/kernels/test_fold_gpu.py -k "topk or route"
    for i in 1 2; do
      TAIL=7 stage "small_new_$i" 60 python benchmarks/bench_small_ops.py --out "$OUT/small_new_$i.json" --label new
      TAIL=7 stage "small_old_$i" 60 env GIT_COMMIT="$PREV" python .old/benchmarks/bench_small_ops.py \
        --out "$OUT/small_old_$i.json" --label old
    done
    STEP=(--backends triton --contexts 1024 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30)
    for i in 1 2; do
      TAIL=3 stage "step_old_$i" 120 env GIT_COMMIT="$PREV" python .old/benchmarks/bench_verify_graph.py "${STEP[@]}" \
        --out "$OUT/step_old_$i.json"
      TAIL=3 stage "step_new_$i" 120 python benchmarks/bench_verify_graph.py "${STEP[@]}" --out "$OUT/step_new_$i.json"
    done
    collect
    ;;
  suite)
    TAIL=15 stage gpu_suite "${T_SUITE:-420}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    TAIL=4 stage ncu "${T_NCU:-120}" "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      -k regex:"gemv_kernel|stream_read|mla|moe|topk" -c 40 python benchmarks/ncu_decode.py
    collect
    ;;
  lean)
    TAIL=4 stage gemv_tests "${T_TESTS:-90}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "gemv and not moe"
    TAIL=12 stage step_lean "${T_STEP:-260}" python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 --out "$OUT/step_lean.json" \
      --env-variants "" "SGLANG_EAGLE3_GEMV_LEAN=0" "" "SGLANG_EAGLE3_GEMV_LEAN=0"
    collect
    ;;
esac
