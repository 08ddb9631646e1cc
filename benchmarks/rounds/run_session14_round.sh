#!/usr/bin/env bash
# The fourteenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_session14_round.sh q1
# Part "q1": the CUDA engine and graph runner GPU tests at the prefill's last-token logits (23d6ba8, CPU-tested
# only until now); the INT4 MoE tile path's new swap kernels (weights as the dot's M, several scale groups a
# dot, scaled weights rounded to bf16): their GPU tests, then bench_moe_tile.py --sweep --swap at 256 / 1024 /
# 2048 tokens (each T's winner against the checked-in group-path config, alternating twice; writes
# sweep_swap_table.json).
# Part "q2": the engine and graph runner GPU tests again (q1: 3 failed: the prefill replay test lacked its new
# last_rows input, fixed in the test; and the k=7 engine's decode capture was invalidated, most likely by a garbage
# collection inside the capture freeing an earlier engine's graphs: the collector is now paused while capturing);
# a wider swap sweep (BLOCK_W 4 / 8 / 16) at 256 / 512 / 1024 / 2048 tokens, then the 61-layer slice's prefill as
# graphs at 256 / 1024 tokens with the checked-in table and with this sweep's table
# (SGLANG_EAGLE3_CONFIG_TABLE), one process each, twice alternating.
# Part "q3": with the swap kernels in the sm_90 table: the INT4 MoE on both paths at 16..256 tokens (where the
# GEMV path and the tile path cross: GEMV_MAX_TOKENS); the slice's prefill as graphs at 256 / 1024 / 2048 tokens;
# end to end on the Kimi slice (baseline and EAGLE-3 at accept 3.0, prefill graphs on) with the group path's
# configs (benchmarks/data/sm_90_group_tile_table.json) and with the table's, one process each.
# Part "q4": the swap kernels decoding with bf16x2 PTX (two weights an instruction; the gate_up loop 6.0 -> 4.4
# SASS a weight at sm_90): the tile GPU tests, the swap sweep again (each winner against the group path's table),
# the prefill graphs at 256 / 1024 / 2048 tokens.
# Part "q5": Nsight Compute on the swap kernels at 256 and 1024 tokens, then the whole single-GPU suite.
# (q5 at df94e10: 318 passed, 1 skipped; ncu in section 2 of docs/BENCHMARKS.md.)
# Part "q6": start-up's graph memory from the pool's own segments (it read 0.0 MiB for the prefill graphs: every
# capture begins with torch's empty_cache()): the graph runner and CUDA engine GPU tests (which now check it), and
# the slice's prefill benchmark, whose log prints the prefill runners' capture_mib.
# Part "q7": wider swap tiles (BLOCK_N 64-128 gate rows at 8 warps, down 128-256 rows: fewer re-reads of the
# block's activations, 3.4-3.7 SASS a weight in the gate_up loop offline) in the sweep at 256 and 1024 tokens.
# (q7 at ee85df6: none faster; the table's configs won again within 1-2 us: not the activations' re-reads.)
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: q1 .. q7}

case $part in
q1)
  TAIL=8 stage engine_tests 220 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  TAIL=8 stage tile_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "tile or swap or large_batch"
  TAIL=40 stage swap_sweep 220 python benchmarks/bench_moe_tile.py --out "$OUT" --label swap --tokens \
    --sweep --swap --sweep-tokens 256 1024 2048
  ;;
q2)
  TAIL=8 stage engine_tests 220 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  TAIL=60 stage swap_sweep 200 python benchmarks/bench_moe_tile.py --out "$OUT" --label swap2 --tokens \
    --sweep --swap --sweep-tokens 256 512 1024 2048
  for round in 1 2; do
    TAIL=3 stage prefill_group_$round 120 python benchmarks/bench_moe_tile.py --out "$OUT" --label group_$round \
      --tokens --prefill 256 1024
    SGLANG_EAGLE3_CONFIG_TABLE=$OUT/sweep_swap_table.json TAIL=3 stage prefill_swap_$round 120 \
      python benchmarks/bench_moe_tile.py --out "$OUT" --label swap_$round --tokens --prefill 256 1024
  done
  ;;
q3)
  TAIL=20 stage crossover 150 python benchmarks/bench_moe_tile.py --out "$OUT" --label crossover --both-paths \
    --tokens 16 32 48 64 96 128 192 256 --prefill 256 1024 2048
  for table in group swap; do
    if [ $table = group ]; then export SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_group_tile_table.json
    else unset SGLANG_EAGLE3_CONFIG_TABLE; fi
    TAIL=6 stage e2e_$table 170 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
      --repeat 2 --simulate-accept 3.0 --prefill-graphs default --out "$OUT/e2e_$table.json"
  done
  ;;
q4)
  TAIL=8 stage tile_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "tile or swap or large_batch"
  TAIL=60 stage swap_sweep 200 python benchmarks/bench_moe_tile.py --out "$OUT" --label swap3 --tokens \
    --sweep --swap --sweep-tokens 256 512 1024 2048
  TAIL=8 stage prefill 150 python benchmarks/bench_moe_tile.py --out "$OUT" --label prefill --tokens \
    --prefill 256 1024 2048
  ;;
q6)
  TAIL=8 stage engine_tests 220 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  TAIL=8 stage prefill 150 python benchmarks/bench_moe_tile.py --out "$OUT" --label prefill --tokens \
    --prefill 256 1024
  ;;
q7)
  TAIL=60 stage swap_sweep 150 python benchmarks/bench_moe_tile.py --out "$OUT" --label swap4 --tokens \
    --sweep --swap --sweep-tokens 256 1024
  ;;
q5)
  TAIL=4 stage ncu_tile 80 "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section LaunchStats --section SchedulerStats --metrics "$STALLS" \
    -k regex:"moe_int4_swap" -c 4 python benchmarks/ncu_decode.py moe_tile
  TAIL=12 stage gpu_suite 500 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 300 \
    tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
  ;;
esac
collect
