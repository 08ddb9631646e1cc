#!/usr/bin/env bash
# The eleventh session's device calls (each <= 10 min).
# Part "e1": two ways to put more programs on a short decode: MLA's split_grain (a request's keys divided among
# the splits in multiples of split_grain keys, not of the 64-key tile: at 1k context in the step's 8448-slot
# table, 16 programs worked) and the INT4 GEMV gate_up split over H (SPLIT; at T=1 only 128 programs of 8 warps).
# Their GPU tests (MLA and INT4 MoE), the MLA grain sweep (bench_small_ops.py --mla-grains, contexts 256..8k,
# T = 1 and 4) and the GEMV gate_up split variants (bench_moe_dot.py, T = 1 and 2, 12 and 384 experts).
# (e1 at eb7797e: the tests 85 passed; MLA within 0.1-0.2 us whatever the grain at T=1 (1k: 7.8-8.0 us, 16 or
# 128 programs alike), mixed at T=4; every GEMV split variant slower (T=1: 13.0 us table, 14.1 the best split).
# Neither is parallelism-bound: both reverted in the next commit, the code stays in eb7797e.)
# Part "e2": MLA's reads before its PDL wait: the merge reads seq_len before it (then only the active splits'
# partials), the split launch with "prewait" 1 (seq_len and its first key tile's page table entries) or 2 (also
# an L2 prefetch of that tile's cache rows). MLA and PDL GPU tests; bench_small_ops.py --mla-variants prewait=0/1/2
# and the previous checkout's MLA cases (.old: `git archive a7bc549 sglang_eagle3 benchmarks`), alternating twice;
# the 61-layer step at 1k and 8k (decode, verify of 4) with the table's MLA config at prewait 0 and 2, alternating
# twice in one process.
# (e2 at dd341d4: tests 58 passed; the merge reading only the active partials: T=4 1k 13.3-13.5 -> 11.8 us, T=1 1k
# 7.8-7.9 -> 7.4, 8k unchanged; prewait 1 no change, prewait 2 +5-6 us and the step 5-6% slower: prewait removed.)
# Part "e3": Nsight Compute on MLA (split + merge, T = 1 and 4 at 1k in an 8448-slot table), then the whole
# single-GPU suite.
# (e3 at 0be45f5: the GPU suite 305 passed, 1 skipped; ncu: MLA's split launch at T=1, 1k: 8.3 us, 3% of DRAM
# bandwidth, 0.29 issued warps a scheduler, stalls long-scoreboard 1.5, no-instruction 1.1, wait 0.9 (16 of its
# 132 programs hold keys); the merge 3.9-4.0 us, 0.2 issued, barrier / short-scoreboard / wait stalls.)
# Part "e4": MLA launch configs at decode contexts (bench_small_ops.py --mla-variants: warps, stages, key tile),
# then the 61-layer step at HEAD (1k and 8k; decode, verify of 4 and 8) for the record.
# (e4 at 16260c0: no MLA config faster at both 1k and 8k (BLOCK_N 32: T=4 1k 11.9 -> 11.0 us, 8k 16.4 -> 18.7); the
# step at HEAD: decode 4.81 / 4.95 ms at 1k / 8k, verify T=4 6.42 / 6.76, T=8 8.16 / 8.60.)
# Part "e5": the INT4 GEMV gate_up with three chunks in flight (DEPTH 3) against two, bench_moe_dot.py at
# T = 1, 2, 4, 8 on 12 and 384 experts.
# (e5 at e8ba712: DEPTH 3 slower than the table at every T (T=1 12.9 -> 13.6 us); removed. BLOCK_N 32 x 64 words,
# 8 warps, two chunks: 1-2% faster than the table at T=4 and T=8 on 12 experts, equal at T=8 uniform, much
# slower at T=2: left as it is.)
# Part "e6": the tables at HEAD: the 61-layer verify table (1k and 8k, T = 1..8) and the kernels' benchmark.
# (e6 at ee099e0: decode 4.83 / 5.02 ms at 1k / 8k (3.35 / 3.21x the floor), verify T=4 6.47 / 6.85, T=8 8.26 /
# 8.63; INT4 GEMV MoE 40.2 / 47.3 / 56.2 / 63.6% of copy bandwidth at T = 1 / 2 / 4 / 8; docs/BENCHMARKS.md.)
# Part "e7": MLA's split programs past a request's keys return right after computing the active count (they
# loaded q and ran an empty loop): the MLA and PDL GPU tests; bench_small_ops.py --mla-variants '' of this
# checkout and of the previous (.old: `git archive ab7445b sglang_eagle3 benchmarks`), alternating twice.
# (e7 at e355194: tests 52 passed; slower: T=1 1k 7.5-7.6 -> 8.1 us, T=1 8k (every split active) 9.7-9.9 -> 11.3;
# the q loads no longer issue beside seq_len's. Reverted.)
# Part "e8": the MLA merge launch's tile (merge_tile fp32 values a program) and warps (merge_warps), now config
# keys: bench_small_ops.py --mla-variants, T = 1 and 4 at 1k and 8k.
# (e8 at 18a02f1: merge_tile 8192 at 4 warps: T=4 1k 11.8 -> 11.3 us, 8k 16.6 -> 15.4, T=1 within 0.1 us; 1 warp
# and 8 warps slower. The sm_90 table's MLA buckets take merge_tile 8192.)
# Part "e9": that table: the MLA and PDL GPU tests; MLA alone with the table against merge_tile=4096,
# alternating; the step at 1k and 8k (decode, verify of 4) with the table and with merge_tile 4096, alternating
# twice in one process.
# (e9 at 34b6939: tests 52 passed; MLA T=4 1k / 8k 11.37 / 15.41 us with the table against 11.83 / 16.57 with 4096;
# the step's verify T=4 at 8k 6.64 against 6.76 ms, the rest within 0.04 ms.)
# After e9, inline at 1746dee: `python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/test_graph_runner.py
# tests/gpu tests/test_overlap.py` (graph runner, CUDA engine, overlap tests with the new merge tile): 25 passed,
# 1 skipped.
# Parts e1 and e2 ran at eb7797e and dd341d4: the options they pass (bench_small_ops.py --mla-grains, the MLA
# config key "prewait") left with the code they measured; check out that commit to run them again.
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_session11_round.sh e1
source "$(dirname "$0")/gpu_stages.sh"
GEMV_SPLITS=(BLOCK_N=16,BLOCK_W=64,num_warps=8,SPLIT=2 BLOCK_N=16,BLOCK_W=128,num_warps=8,SPLIT=7
             BLOCK_N=16,BLOCK_W=64,num_warps=8,SPLIT=7 BLOCK_N=16,BLOCK_W=32,num_warps=4,SPLIT=4
             BLOCK_N=8,BLOCK_W=128,num_warps=4,SPLIT=7 BLOCK_N=8,BLOCK_W=64,num_warps=4,SPLIT=2
             BLOCK_N=8,BLOCK_W=64,num_warps=4,SPLIT=7 BLOCK_N=16,BLOCK_W=64,num_warps=4,SPLIT=14)
mla_gpu_tests() {  # mla_gpu_tests PART: the MLA kernel, MLA-rope and PDL GPU tests that touch MLA
  TAIL=6 stage "$1_tests" "${T_TESTS:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
    tests/kernels/test_kernels_gpu.py tests/kernels/test_mla_rope_gpu.py tests/kernels/test_pdl_gpu.py -k "mla"
}
mla_table() {  # mla_table KEY VALUE: sm_90.json's MLA buckets with KEY=VALUE, as $OUT/mla_<KEY up to _>_<VALUE>.json
  python - "$1" "$2" > "$OUT/mla_${1%%_*}_$2.json" <<'PY'
import json, sys
key, value = sys.argv[1], int(sys.argv[2])
base = json.load(open("sglang_eagle3/kernels/configs/sm_90.json"))
ops = {"mla_attention": [{**b, key: value} for b in base["ops"]["mla_attention"]]}
print(json.dumps({"arch": base["arch"], "sm_counts": base["sm_counts"], "measured": True,
                  "source": f"sm_90.json with {key} {value}", "ops": ops}))
PY
}
mla_step_ab() {  # mla_step_ab KEY VALUE: the step at 1k and 8k (decode, verify of 4), the table as it is and with
  # its MLA buckets' KEY=VALUE (mla_table), alternating twice in one process -> $OUT/step_<KEY up to _>.json
  mla_table "$1" "$2"
  local table="SGLANG_EAGLE3_CONFIG_TABLE=$OUT/mla_${1%%_*}_$2.json"
  TAIL=20 stage "step_${1%%_*}" "${T_STEP:-280}" python benchmarks/bench_verify_graph.py --backends triton \
    --contexts 1024 8192 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 \
    --out "$OUT/step_${1%%_*}.json" --env-variants "" "$table" "" "$table"
}
case "${1:?e1 | e2 | e3 | e4 | e5 | e6 | e7 | e8 | e9}" in
  e1)
    TAIL=6 stage e1_tests "${T_TESTS:-220}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "mla or fused_moe_int4"
    TAIL=45 stage mla_grain "${T_MLA:-150}" python benchmarks/bench_small_ops.py --out "$OUT/mla_grain.json" \
      --mla-grains 8 16 32 64 --repeat 2
    args=(); for c in "${GEMV_SPLITS[@]}"; do args+=(--gemv-config "$c"); done
    TAIL=40 stage moe_split "${T_MOE:-150}" python benchmarks/bench_moe_dot.py --out "$OUT/moe_split.json" \
      --variants "gemv (table)" --tokens 1 2 --pools 12 384 "${args[@]}"
    collect
    ;;
  e2)
    mla_gpu_tests e2
    for i in 1 2; do
      TAIL=16 stage "mla_new_$i" 100 python benchmarks/bench_small_ops.py --out "$OUT/mla_new_$i.json" \
        --mla-variants prewait=0 prewait=1 prewait=2 --repeat 2 --label new
      TAIL=5 stage "mla_old_$i" 100 env GIT_COMMIT=a7bc549 python .old/benchmarks/bench_small_ops.py \
        --out "$OUT/mla_old_$i.json" --repeat 2 --label old
    done
    mla_step_ab prewait 2
    collect
    ;;
  e3)
    TAIL=4 stage ncu_mla "${T_NCU:-150}" "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --metrics "$STALLS" -k regex:"mla" -c 8 python benchmarks/ncu_decode.py mla_table
    TAIL=15 stage gpu_suite "${T_SUITE:-420}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
    collect
    ;;
  e4)
    TAIL=32 stage mla_configs 200 python benchmarks/bench_small_ops.py --out "$OUT/mla_configs.json" --repeat 2 \
      --mla-variants "" num_warps=4 num_stages=1 BLOCK_N=32 BLOCK_N=32,num_warps=4 num_stages=1,num_warps=4
    TAIL=12 stage step_head "${T_STEP:-300}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 8192 --max-tokens 8 --tokens 1 4 8 --eager-iters 1 --graph-iters 30 --out "$OUT/step_head.json"
    collect
    ;;
  e5)
    args=(); for c in BLOCK_N=16,BLOCK_W=128,num_warps=8,DEPTH=3 BLOCK_N=16,BLOCK_W=64,num_warps=8,DEPTH=2 \
      BLOCK_N=16,BLOCK_W=64,num_warps=8,DEPTH=3 BLOCK_N=8,BLOCK_W=128,num_warps=4,DEPTH=3 \
      BLOCK_N=8,BLOCK_W=64,num_warps=4,DEPTH=3 BLOCK_N=32,BLOCK_W=64,num_warps=8,DEPTH=2 \
      BLOCK_N=32,BLOCK_W=64,num_warps=8,DEPTH=3; do args+=(--gemv-config "$c"); done
    TAIL=70 stage moe_depth 250 python benchmarks/bench_moe_dot.py --out "$OUT/moe_depth.json" \
      --variants "gemv (table)" --tokens 1 2 4 8 --pools 12 384 "${args[@]}"
    collect
    ;;
  e6)
    head_tables
    collect
    ;;
  e7)
    mla_gpu_tests e7
    for i in 1 2; do
      TAIL=6 stage "mla_new_$i" 100 python benchmarks/bench_small_ops.py --out "$OUT/mla_new_$i.json" \
        --mla-variants '' --repeat 2 --label new
      TAIL=6 stage "mla_old_$i" 100 env GIT_COMMIT=ab7445b python .old/benchmarks/bench_small_ops.py \
        --out "$OUT/mla_old_$i.json" --mla-variants '' --repeat 2 --label old
    done
    collect
    ;;
  e8)
    TAIL=45 stage mla_merge 200 python benchmarks/bench_small_ops.py --out "$OUT/mla_merge.json" --repeat 2 \
      --mla-variants "" merge_warps=1,merge_tile=1024 merge_warps=2,merge_tile=2048 merge_warps=2 merge_tile=2048 \
      merge_tile=8192 merge_warps=8,merge_tile=8192
    collect
    ;;
  e9)
    mla_gpu_tests e9
    TAIL=12 stage mla_table 100 python benchmarks/bench_small_ops.py --out "$OUT/mla_table.json" --repeat 3 \
      --mla-variants "" merge_tile=4096
    mla_step_ab merge_tile 4096
    collect
    ;;
esac
