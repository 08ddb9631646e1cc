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
# c5: bench_moe_layout.py's probe over the words alone (--no-scales: the bytes of the read-only kernel it is set
#     beside). Prepared here with the GPU tests of the capped tiles, the step paired against gate_up capped at 128
#     registers and down's one-warp tile, and the MoE alone over the caps: those ran as run_session53_round.sh d1.
# c3: the same at decode and a verify of 4 with the slice's own routing (few experts a layer), and at 8k.
# Ran (H100s; every call named nvidia-h200): run_session51_round.sh b7 at 3129ba6, c2 at 9fbd9b5 (as c1: no H200),
# c4 at 2e996ed (~11 device minutes held, 5.4 running). Then eight calls refused for want of a machine (~14 device
# minutes in all) until too little was left to start one. Not run: c1 on an H200, c3; c5 ran later (the fifty-third
# session ran all of it but its layout probe as run_session53_round.sh d1, the fifty-fourth the probe as
# run_session54_round.sh e3).
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
c5) # (its tests and paired step ran as run_session53_round.sh d1, with q_b at 64 lanes beside them; this probe
    # ran as run_session54_round.sh e3)
    TAIL=5 stage layout_words 60 python benchmarks/bench_moe_layout.py --tokens 1 4 8 --no-scales \
      --out "$OUT/moe_layout_words.json" ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
