#!/usr/bin/env bash
# The fifty-second session's device round: what the INT4 GEMV MoE's decode arithmetic costs in the step, on the card
# lent; the H200 tables at HEAD where an H200 comes.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session52_round.sh c1   (one device call each, < 10 min)
# c1: on an H200, the tables docs/BENCHMARKS.md section 0 calls current (head_tables, as run_session51_round.sh b1);
#     on another card, c2.
# c2: the step paired (1k, T = 1, 2, 4, 8, uniform routing: a trained router's spread) against the MoE's kernels with
#     their nibble decode and dots made cheap, every load, sum, store and the grid kept
#     (benchmarks/ablations/_moe_cheap_dots.py): gate_up's alone, down's alone, both. What a decode that cost
#     nothing could win in the step under PDL, kernel by kernel, before building one (tensor-core dots, say).
# c4: c2 found the decode arithmetic worth 1-2.6% of the step: the MoE kernels at a verify lose to a read-only
#     kernel in how they read. Nsight Compute's counters for gate_up and down at T = 1, 4, 8 with uniform routing
#     (ncu_decode.py moe_uniform: DRAM throughput, occupancy, waves, stall reasons) beside a read-only kernel; then
#     the MoE alone at T = 4, 8 (all 384 experts) over down configs (rows 8-64, 1-8 warps, PRELOAD's tile or the
#     slot loop) against the table.
# c5: the GPU tests that hold the MoE's tiles, register caps among them, to one rounding; then the step paired (1k,
#     uniform routing, T = 1, 4, 8) against gate_up at T = 4..8 in 16-row blocks at 4 warps
#     capped at 128 registers (c4: 255 a thread at T=4 and 8 warps a SM; capped, one wave of 512 programs, 4 a SM,
#     one 8-byte spill offline) and against down's PRELOAD tile at 8 rows in one warp at T = 1..6 (c4's fastest alone
#     at T = 4, 8); then the MoE alone at T = 3, 4, 8 over gate_up's tiles with and without the cap, and
#     bench_moe_layout.py's probe over the words alone (--no-scales: the bytes of the read-only kernel it is set
#     beside).
# c3: the same at decode and a verify of 4 with the slice's own routing (few experts a layer), and at 8k.
# Ran (H100s; every call named nvidia-h200): run_session51_round.sh b7 at 3129ba6, c2 at 9fbd9b5 (as c1: no H200),
# c4 at 2e996ed (~11 device minutes held, 5.4 running). Then eight calls refused for want of a machine (~14 device
# minutes in all) until too little was left to start one. Not run: c1 on an H200, c3, c5. Next device session: c5
# on any card, c1 on an H200.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: c1 | c2 | c3 | c4 | c5}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
A=benchmarks/ablations
CHEAP=("$A/moe_int4_gemv_gate_up_cheap.py" "$A/moe_int4_gemv_down_cheap.py"
       "$A/moe_int4_gemv_gate_up_cheap.py+$A/moe_int4_gemv_down_cheap.py")
paired_cheap() {  # paired_cheap NAME LIMIT ARGS...: the step against the three cheap variants, paired
  local name=$1 limit=$2; shift 2
  TAIL=40 stage "$name" "$limit" python benchmarks/bench_verify_graph.py --backends triton --eager-iters 1 \
    --graph-iters 5 --paired 80 --kernels-from "${CHEAP[@]}" --out "$OUT/$name.json" "$@"
}
if [ "$part" = c1 ] && ! grep -q H200 "$OUT/gpu.txt"; then part=c2; fi
case $part in
c1) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
c2) paired_cheap paired_cheap_uniform 400 --contexts 1024 --tokens 1 2 4 8 --routing uniform ;;
c3) paired_cheap paired_cheap_own 250 --contexts 1024 --tokens 1 4
    paired_cheap paired_cheap_uniform_8k 250 --contexts 8192 --tokens 1 4 --routing uniform ;;
c4) TAIL=4 stage ncu_moe_uniform 300 "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --metrics "$STALLS" -k regex:"moe_int4_gemv|stream_read" -c 13 python benchmarks/ncu_decode.py moe_uniform
    V=()
    for bn in 8 16 32 64; do for w in 1 2 4 8; do for pre in 0 1; do
      V+=(--down-config "BLOCK_N=$bn,BLOCK_W=32,num_warps=$w,PRELOAD=$pre,F16=1")
    done; done; done
    TAIL=75 stage moe_down_uniform 240 python benchmarks/bench_moe_dot.py --variants "gemv (table)" --tokens 4 8 \
      --pools 384 "${V[@]}" --out "$OUT/moe_down_uniform.json" ;;
c5) TAIL=6 stage tests_caps 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "tiles_round_alike or table_buckets_round_alike"
    python benchmarks/variant_tables.py /tmp/tables > /dev/null
    TAIL=30 stage paired_regs_w1 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t4_8_gate_up_bn16_r128.json \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t1_6_down_w1.json --paired 60 --out "$OUT/paired_regs_w1.json"
    TAIL=30 stage moe_gate_up_regs 100 python benchmarks/bench_moe_dot.py --variants "gemv (table)" --tokens 3 4 8 \
      --pools 384 --gemv-config "BLOCK_N=16,BLOCK_W=128,num_warps=4,F16=1,maxnreg=128" \
      --gemv-config "BLOCK_N=16,BLOCK_W=128,num_warps=4,F16=1" \
      --gemv-config "BLOCK_N=8,BLOCK_W=128,num_warps=2,F16=1,maxnreg=128" \
      --gemv-config "BLOCK_N=8,BLOCK_W=128,num_warps=4,F16=1" --out "$OUT/moe_gate_up_regs.json"
    TAIL=5 stage layout_words 60 python benchmarks/bench_moe_layout.py --tokens 1 4 8 --no-scales \
      --out "$OUT/moe_layout_words.json" ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
