#!/usr/bin/env bash
# The sixteenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_session16_round.sh t1
# Part "t1": MLA's split loop with the page table entries loaded one key tile ahead (until now Triton's pipeliner
# spent a stage on the page -> cache-row load chain and kept ONE buffer of key tiles at num_stages 2-4, so every
# tile waited for its own load; offline the TTGIR now has num_stages - 1 buffers). The MLA / GQA GPU tests, then
# the split kernel at 1k..128k contexts, T = 1 and 4, at the table's config (2 stages: still one buffer) and at
# configs that now double- or triple-buffer; the previous checkout's kernel at its table config beside it
# (.old: `git archive b22bb47 sglang_eagle3 benchmarks`).
# Part "t2" (after t1 at 9dab869: 3 stages at 64-key tiles, now two buffers, took T=1 at 32k / 128k from 24.2 / 72
# to 19.8 / 54 us and T=4 from 33.2 / 90.6 to 27.9 / 74.0, 1k +0.3 us, 8k equal; the sm_90 table now has 3 stages
# and the launcher lowers the depth to what fits a block's shared memory): the MLA / GQA / draft GPU tests at the
# new table, the op at the new table against the previous table's 2 stages, then the 61-layer step at 32k and 128k
# contexts (decode, verify of 4) with the new table and with the previous one
# (SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_mla_2stage_table.json), alternating twice in one process.
# Part "t3": the same A/B of the step at 1k and 8k (where MLA's splits hold one key tile each), and the draft's
# attention (grouped-query form of the same kernel) swept now that its deeper stages buffer (bench_draft_step.py).
# Part "t4": with two buffers a split of several key tiles now overlaps its loads, so fewer, longer splits may pay
# where each split held one tile (8k: 128 splits of 64 keys, and a merge of 128 partials): min_keys_per_split
# 128 / 256 / 512 over the new table, 1k..128k.
# Part "t5" (t4 at 5e1ccd8: fewer, longer splits lose wherever they bind, 8k 9.8 -> 27.6 us at 512-key splits: one SM
# streams a 64-key tile in ~3.4 us whether it has 1 or 8 of them, so the loop is bound inside the SM): Nsight
# Compute on the split kernel at 32k (T = 1 and 4), stall reasons and the source lines the warps wait at.
# Part "t6" (t5 at 8936770: at 32k the split kernel issues an instruction every 3.5 cycles a scheduler, 2 warps a
# scheduler, its stalls short-scoreboard (shared memory) 1.4-1.9 and fixed-latency waits 1.3 cycles an
# instruction, 2.66M shared-memory wavefronts: ~5000 a 64-key tile, every warp reloading q for its slice of the
# score): the transposed form (config keys_m: keys as the dots' M = 64, query rows as N), which Triton compiles to
# Hopper's warpgroup MMA reading both operands from shared memory once a warpgroup; offline it fits two buffers
# only at num_stages 2 (the asynchronous MMA holds a third at 3 stages: 236 KB), so its loads do not overlap.
# (t6 at 4c52f34: the keys_m GPU tests passed (4 and 8 warps, 2 stages), but it was slower at every shape timed
# before a variant (1 stage or 2 programs a SM) hit an illegal memory access at T=4, 8k: 1k 7.95 -> 8.2-9.0 us,
# 8k 9.8 -> 10.3-10.8, T=4 1k 11.9 -> 11.9-15.9. Removed after it; the code is in 4c52f34.)
# Part "t7": the whole single-GPU suite at the double-buffered MLA table (every engine test attends through it).
# Part "t8": the kernels table (issue 5's kernels.json) at the session's end: MLA's 32k case with two buffers.
# Part "t9": each row block's key loop stops at its last row's position (causal: a prefill chunk's first rows see
# half the keys its last ones do; decode and verify lose at most T - 1 keys). The MLA / GQA / draft GPU tests,
# MLA at decode and verify shapes and the eager (ragged) prefill, this checkout and the previous one
# (.old: `git archive 5761af2 sglang_eagle3 benchmarks`) alternating twice.
# Part "t10": after the causal key loops, the CUDA engine and graph runner tests (prefill graphs, the eager ragged
# prefill, speculation equal to no speculation), as far as the session's last device minutes allow.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: t1 .. t10}
OLD_TABLE="SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_mla_2stage_table.json"
MLA_CASES="1:1024:8448 4:1024:8448 1:8192:8448 4:8192:8448 1:32768:131072 4:32768:131072 1:131000:131072 4:131000:131072"

case $part in
t1)
  TAIL=8 stage mla_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "mla or gqa or draft"
  TAIL=60 stage mla_pipe 300 python benchmarks/bench_small_ops.py --out "$OUT/mla_pipe.json" --repeat 2 \
    --mla-cases $MLA_CASES \
    --mla-variants '' num_stages=3 BLOCK_N=32,num_stages=3 BLOCK_N=32,num_stages=4 \
      BLOCK_N=32,num_stages=3,ctas_per_sm=2 num_stages=3,num_warps=4
  TAIL=10 stage mla_old 100 env GIT_COMMIT=b22bb47 python .old/benchmarks/bench_small_ops.py \
    --out "$OUT/mla_old.json" --repeat 2 --mla-cases $MLA_CASES --mla-variants ''
  ;;
t2)
  TAIL=8 stage mla_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "mla or gqa or draft"
  TAIL=20 stage mla_table 120 python benchmarks/bench_small_ops.py --out "$OUT/mla_table.json" --repeat 2 \
    --mla-cases $MLA_CASES --mla-variants '' num_stages=2
  TAIL=30 stage step_long 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 32768 131072 \
    --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants '' "$OLD_TABLE" '' "$OLD_TABLE" \
    --out "$OUT/step_long.json"
  ;;
t3)
  TAIL=30 stage step_short 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants '' "$OLD_TABLE" '' "$OLD_TABLE" \
    --out "$OUT/step_short.json"
  TAIL=70 stage draft_step 240 python benchmarks/bench_draft_step.py --sweep --out "$OUT/draft_step.json"
  ;;
t4)
  TAIL=30 stage mla_splits 200 python benchmarks/bench_small_ops.py --out "$OUT/mla_splits.json" --repeat 2 \
    --mla-cases $MLA_CASES 1:4096:8448 4:4096:8448 \
    --mla-variants '' min_keys_per_split=128 min_keys_per_split=256 min_keys_per_split=512
  ;;
t5)
  TAIL=400 stage ncu_mla_long 200 "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --section SourceCounters --metrics "$STALLS" -k regex:"mla_split" -c 4 python benchmarks/ncu_decode.py mla_long
  ;;
t6)
  TAIL=8 stage keys_m_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/kernels/test_kernels_gpu.py -k "mla"
  TAIL=60 stage mla_keys_m 240 python benchmarks/bench_small_ops.py --out "$OUT/mla_keys_m.json" --repeat 2 \
    --mla-cases $MLA_CASES 1:4096:8448 \
    --mla-variants '' keys_m=1,num_warps=4,num_stages=2 keys_m=1,num_warps=8,num_stages=2 \
      keys_m=1,num_warps=4,num_stages=1 keys_m=1,num_warps=8,num_stages=2,ctas_per_sm=2
  ;;
t7)
  TAIL=12 stage gpu_suite 570 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 300 \
    tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
  ;;
t8)
  TAIL=45 stage kernels 280 python benchmarks/bench_kernels.py --out "$OUT"
  ;;
t9)
  TAIL=8 stage mla_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/kernels/test_kernels_gpu.py -k "mla or gqa or draft"
  for i in 1 2; do
    TAIL=6 stage "mla_new_$i" 60 python benchmarks/bench_small_ops.py --out "$OUT/mla_new_$i.json" --repeat 2 \
      --mla-cases 1:1024:8448 4:1024:8448 1:8192:8448 4:8192:8448 1:32768:131072 4:32768:131072 --mla-variants ''
    TAIL=6 stage "mla_old_$i" 60 env GIT_COMMIT=5761af2 python .old/benchmarks/bench_small_ops.py \
      --out "$OUT/mla_old_$i.json" --repeat 2 \
      --mla-cases 1:1024:8448 4:1024:8448 1:8192:8448 4:8192:8448 1:32768:131072 4:32768:131072 --mla-variants ''
  done
  TAIL=6 stage prefill_new 90 python benchmarks/bench_small_ops.py --out "$OUT/prefill_new.json" \
    --mla-prefill 1024 4096 16384
  TAIL=6 stage prefill_old 90 env GIT_COMMIT=5761af2 python .old/benchmarks/bench_small_ops.py \
    --out "$OUT/prefill_old.json" --mla-prefill 1024 4096
  ;;
t10)
  TAIL=8 stage engine_tests 230 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  ;;
*)
  echo "unknown part $part"; exit 2 ;;
esac
collect
