#!/usr/bin/env bash
# The seventh session's device calls (each <= 10 min).
# Part "tile": the MoE tile path rebuilt (pairs sorted by expert into blocks by one align program, tl.dot per
# block, INT4 decoded exactly with the scale after the dot): its GPU tests, then bench_moe_tile.py for this
# checkout (tile configs swept at T = 16, 64, 256, 2048; the MoE at T = 8..2048; eager prefill of 256 and 2048
# tokens through the 61-layer Kimi rank slice) and for the previous one (.old: `git archive 8c225e5` of the
# package, carried; prefill of 256 only, the old tile path takes minutes at 2048).
# Part "tile2": the tile path with its weight words prefetched by hand one scale group ahead (the first run
# showed them loaded unpipelined, ~15% of copy bandwidth): tests, the sweep (merged into this machine's copy
# of the sm_90 table, so the runs after it use it), the MoE at T = 8..2048 both paths (where they cross), the
# prefill, then the Kimi-slice end-to-end run (prefill included) for this checkout and the previous one.
# Part "suite": the whole single-GPU suite in one call (the MoE GEMV path now serves up to 128 tokens).
# Part "batch": the 61-layer step at 4 requests a step (bench_verify_graph.py --batch 4, T = 1, 2, 4: MoE batches
# of 4, 8 and 16 tokens), the previous checkout then this one (the INT4 MoE at 16 tokens: tile path before, GEMV
# path now; at 4 and 8 tokens both run the GEMV path: the control).
# Part "uniform": the same with experts drawn uniformly each step (--uniform-routing: the random router sends a
# batch to ~10-16 experts a layer, a trained model spreads it), then the eager prefill likewise (256 and 2048
# tokens this checkout, 256 the previous one).
# Part "final": parts "e2e" and "batch" again with the runs of the previous checkout really running it (the
# scripts copied into .old/benchmarks had imported this checkout's package through PYTHONPATH; they now import
# the tree they live in and record its directory as "package"): e2e alternating twice each, then the B=4 step
# with uniform routing, previous then this checkout.
# Part "unroll": the INT4 tile loop unrolled twice over two named register sets (no loop-carried copies): the
# MoE GPU tests, then bench_moe_tile.py at T = 256, 512, 2048 (the MoE alone), the checkout
# before the change (.prev: `git archive bbba7d8`, carried) and this one, alternating. Result: -3% at T=256,
# +2-3% at 512 and 2048, twice each; not kept (reverted in the next commit).
# Part "e2e": the Kimi-slice end-to-end run (bench_e2e.py of this checkout, now also timing each request's first
# step, its prefill) for the previous checkout and this one, alternating, twice each, the GPU's clocks logged.
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_session7_round.sh tile|tile2|suite
source "$(dirname "$0")/gpu_stages.sh"
case "${1:?tile, tile2, suite, e2e, batch, uniform, final or unroll}" in
  tile)
    TAIL=12 stage moe_tests "${T_TESTS:-150}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "moe or align"
    TAIL=40 stage bench_new "${T_NEW:-260}" python benchmarks/bench_moe_tile.py --out "$OUT" --label new --sweep \
      --prefill 256 2048
    cp benchmarks/bench_moe_tile.py .old/benchmarks/
    TAIL=20 stage bench_old "${T_OLD:-150}" env GIT_COMMIT=8c225e5 python .old/benchmarks/bench_moe_tile.py \
      --out "$OUT" --label old --tokens 8 16 32 64 128 256 --gemv-max 0 --prefill 256 --prefill-iters 3
    collect
    ;;
  tile2)
    TAIL=8 stage moe_tests "${T_TESTS:-120}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "moe or align"
    TAIL=40 stage bench_new "${T_NEW:-220}" python benchmarks/bench_moe_tile.py --out "$OUT" --label new --sweep \
      --gemv-max 256 --prefill 256 2048
    python benchmarks/merge_sweep.py "$OUT/sweep_tile_table.json" sglang_eagle3/kernels/configs/sm_90.json
    E2E=(benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 48 --repeat 3)
    TAIL=8 stage e2e_new "${T_KIMI:-110}" python "${E2E[@]}" --out "$OUT/e2e_new.json"
    TAIL=8 stage e2e_old "${T_KIMI:-110}" env GIT_COMMIT=8c225e5 python ".old/${E2E[0]}" "${E2E[@]:1}" \
      --out "$OUT/e2e_old.json"
    collect
    ;;
  e2e)
    cp benchmarks/bench_e2e.py .old/benchmarks/
    E2E=(--kimi-slice --num-prompts 2 --max-new-tokens 48 --repeat 3)
    clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader; }
    for i in 1 2; do
      clocks
      TAIL=5 stage "e2e_old_$i" "${T_KIMI:-110}" env GIT_COMMIT=8c225e5 python .old/benchmarks/bench_e2e.py \
        "${E2E[@]}" --out "$OUT/e2e_old_$i.json"
      clocks
      TAIL=5 stage "e2e_new_$i" "${T_KIMI:-110}" python benchmarks/bench_e2e.py "${E2E[@]}" --out "$OUT/e2e_new_$i.json"
    done
    collect
    ;;
  batch)
    cp benchmarks/bench_verify_graph.py .old/benchmarks/
    STEP=(--backends triton --contexts 1024 --max-tokens 4 --tokens 1 2 4 --batch 4 --eager-iters 1 --graph-iters 20)
    TAIL=6 stage step_b4_old "${T_STEP:-170}" env GIT_COMMIT=8c225e5 python .old/benchmarks/bench_verify_graph.py \
      "${STEP[@]}" --out "$OUT/step_b4_old.json"
    TAIL=6 stage step_b4_new "${T_STEP:-170}" python benchmarks/bench_verify_graph.py "${STEP[@]}" \
      --out "$OUT/step_b4_new.json"
    collect
    ;;
  uniform)
    cp benchmarks/bench_verify_graph.py benchmarks/bench_moe_tile.py .old/benchmarks/
    STEP=(--backends triton --contexts 1024 --max-tokens 4 --tokens 1 2 4 --batch 4 --eager-iters 1 --graph-iters 20
          --uniform-routing)
    TAIL=6 stage step_b4u_old "${T_STEP:-150}" env GIT_COMMIT=8c225e5 python .old/benchmarks/bench_verify_graph.py \
      "${STEP[@]}" --out "$OUT/step_b4u_old.json"
    TAIL=6 stage step_b4u_new "${T_STEP:-150}" python benchmarks/bench_verify_graph.py "${STEP[@]}" \
      --out "$OUT/step_b4u_new.json"
    TAIL=4 stage prefill_u_new "${T_PRE:-120}" python benchmarks/bench_moe_tile.py --out "$OUT" --label new_uniform \
      --tokens --prefill 256 2048 --uniform-routing
    TAIL=4 stage prefill_u_old "${T_PRE:-120}" env GIT_COMMIT=8c225e5 python .old/benchmarks/bench_moe_tile.py \
      --out "$OUT" --label old_uniform --tokens --prefill 256 --prefill-iters 3 --uniform-routing
    collect
    ;;
  final)
    cp benchmarks/bench_e2e.py benchmarks/bench_verify_graph.py benchmarks/bench_moe_tile.py .old/benchmarks/
    E2E=(--kimi-slice --num-prompts 2 --max-new-tokens 48 --repeat 3)
    for i in 1 2; do
      TAIL=5 stage "e2e_old_$i" "${T_KIMI:-100}" env GIT_COMMIT=8c225e5 python .old/benchmarks/bench_e2e.py \
        "${E2E[@]}" --out "$OUT/e2e_old_$i.json"
      TAIL=5 stage "e2e_new_$i" "${T_KIMI:-100}" python benchmarks/bench_e2e.py "${E2E[@]}" --out "$OUT/e2e_new_$i.json"
    done
    STEP=(--backends triton --contexts 1024 --max-tokens 4 --tokens 1 4 --batch 4 --eager-iters 1 --graph-iters 20
          --uniform-routing)
    TAIL=4 stage step_b4u_old "${T_STEP:-120}" env GIT_COMMIT=8c225e5 python .old/benchmarks/bench_verify_graph.py \
      "${STEP[@]}" --out "$OUT/step_b4u_old.json"
    TAIL=4 stage step_b4u_new "${T_STEP:-120}" python benchmarks/bench_verify_graph.py "${STEP[@]}" \
      --out "$OUT/step_b4u_new.json"
    grep -o '"package": "[^"]*"' "$OUT"/*.json
    collect
    ;;
  unroll)
    TAIL=6 stage moe_tests "${T_TESTS:-100}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "moe or align"
    cp benchmarks/bench_moe_tile.py .prev/benchmarks/
    TILE=(--tokens 256 512 2048 --gemv-max 0)
    for i in 1 2; do
      TAIL=6 stage "prev_$i" "${T_B:-60}" env GIT_COMMIT=bbba7d8 python .prev/benchmarks/bench_moe_tile.py \
        --out "$OUT" --label "prev_$i" "${TILE[@]}"
      TAIL=6 stage "unroll_$i" "${T_B:-60}" python benchmarks/bench_moe_tile.py --out "$OUT" --label "unroll_$i" \
        "${TILE[@]}"
    done
    collect
    ;;
  suite)
    TAIL=40 stage gpu_tests "${T_TESTS:-540}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      --durations=12 tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py \
      tests/gpu
    collect
    ;;
esac
