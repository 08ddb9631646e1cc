#!/usr/bin/env bash
# The fifty-first session's device round: how far the kernels sit from what the launch structure itself allows, at
# decode and at a verify of 4 with a trained router's spread (uniform routing), on the card lent; the H200 tables at
# HEAD where an H200 comes.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session51_round.sh b1   (one device call each, < 10 min)
# b1: on an H200, the tables docs/BENCHMARKS.md section 0 calls current (head_tables: the step table with both
#     routings, the kernel table). On another card: the launch structure's own floor (bench_launch_floor.py: every
#     launch a read-only kernel of its bytes, PDL on) at decode and at a verify of 4 (31 experts a MoE layer), the
#     real step at 1k, T = 1 and 4, with both routings in the same call, and the dense launches alone against a
#     read-only kernel of their bytes (bench_gemv_launches.py, T = 1, 4).
# b2: b1's launch floors again (b1's capture failed: bench_launch_floor.py joined a stream it had not forked, fixed
#     in b4da3c4), then the kernel table (bench_kernels.py: MLA and the INT4 MoE against read-only kernels of
#     their bytes).
# b3: each launch's own time in the step's order (profile_step.py --sequence, PDL off so no time includes a wait),
#     T = 1 and 4 with uniform routing, to set beside b2's read-only kernels of the same sizes: the launches where a
#     verify's kernels lose to the structure.
# b4: b2's launch floors and b3's profile in one call (on an H200 after b1's tables, which hold the kernel table),
#     then launch_gaps.py over them.
# b5: the H100-chosen settings of the forty-eighth to fiftieth sessions checked on this card, the step paired at 1k
#     (T = 3..6, 8) with uniform routing: each reverted (gate_up's T=3 in 32-row blocks, the T = 5..6 down kernel's
#     slot loop, MLA without short_split, the CUDA-core pairs' row groups one after the other) against the table,
#     with a second capture of the table as the noise.
# b6: does the experts' row-major layout cost gate_up its bandwidth? bench_moe_layout.py's read-only probe with
#     gate_up's grid and tiles over the checkpoint's layout and over one contiguous run a program, T = 1, 4, 8, at the
#     T=4 bucket's tiles (32 rows, 4 warps) and the T=1 bucket's (16 rows, 8 warps); then the T=4 tiles split 7 ways
#     over K (a chunk a program: would a split-K gate_up's more, shorter programs read closer to a read-only kernel?).
# b7: b4's launch gaps put q_b (CUDA cores) at 6.37 us alone at a verify of 4 against 3.95 at decode: the step paired
#     (1k, T = 1, 4, 8, uniform routing) against q_b on the tensor cores (variants/gemv_q_b_tc.py).
# Ran (all on H100s; ~25 of 30 device minutes spent, ~6 of them running, the rest on calls refused for want of a
# machine, ~90 s each): b1 at 0a03388 (its launch floors failed: the capture bug fixed in b4da3c4; the step and the
# dense launches alone ran), b2 at e9759bc
# (structure 1.57x its floor at decode, 1.33x at verify of 4), b4 and b6 at cb1cceb in one call (the launch gaps; the
# layout probe: no change at verify sizes, 26% alone at decode). b3 ran inside b4. Not run: b5, b7 (no device time).
# Next device session: on an H200, b1 (the tables) then b5; on any card, b7.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: b1 | b2 | b3 | b4 | b5 | b6 | b7}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
case $part in
b1)
  if grep -q H200 "$OUT/gpu.txt"; then
    T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables
  else
    for t in 1 4; do
      TAIL=3 stage "launch_floor_t$t" 90 python benchmarks/bench_launch_floor.py --tokens "$t" \
        --out "$OUT/launch_floor_t$t.json"
    done
    for routing in own uniform; do
      TAIL=4 stage "step_$routing" 120 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
        --tokens 1 4 --eager-iters 1 --graph-iters 30 --routing "$routing" --out "$OUT/step_$routing.json"
    done
    TAIL=40 stage gemv_launches 150 python benchmarks/bench_gemv_launches.py --tokens 1 4 \
      --out "$OUT/gemv_launches.json"
  fi
  ;;
b2)
  for t in 1 4; do
    TAIL=3 stage "launch_floor_t$t" 100 python benchmarks/bench_launch_floor.py --tokens "$t" \
      --out "$OUT/launch_floor_t$t.json"
  done
  TAIL=45 stage kernels 300 python benchmarks/bench_kernels.py --out "$OUT"
  ;;
b3)
  SGLANG_EAGLE3_PDL=0 TAIL=8 stage profile_seq_nopdl 150 python benchmarks/profile_step.py --layers 3 --tokens 1 4 \
    --no-gemm --sequence --routing uniform --replays 20 --out "$OUT/profile_seq_nopdl.json"
  ;;
b4)
  for t in 1 4; do
    TAIL=3 stage "launch_floor_t$t" 100 python benchmarks/bench_launch_floor.py --tokens "$t" \
      --out "$OUT/launch_floor_t$t.json"
  done
  SGLANG_EAGLE3_PDL=0 TAIL=8 stage profile_seq_nopdl 150 python benchmarks/profile_step.py --layers 3 --tokens 1 4 \
    --no-gemm --sequence --routing uniform --replays 20 --out "$OUT/profile_seq_nopdl.json"
  TAIL=40 stage launch_gaps 30 python benchmarks/launch_gaps.py --profile "$OUT/profile_seq_nopdl.json" \
    --floor "$OUT/launch_floor_t1.json" "$OUT/launch_floor_t4.json" --out "$OUT/launch_gaps.json"
  ;;
b5)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  V=(SGLANG_EAGLE3_PDL=1)
  for n in t3_gate_up_bn32 t5_6_down_slots mla_no_short; do V+=("SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/$n.json"); done
  V+=(SGLANG_EAGLE3_GEMV_GROUPS_INNER=none)
  TAIL=40 stage paired_reverts 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 3 4 5 6 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' "${V[@]}" \
    --paired 80 --out "$OUT/paired_reverts.json"
  ;;
b6)
  TAIL=5 stage layout_bn32 120 python benchmarks/bench_moe_layout.py --tokens 1 4 8 --out "$OUT/moe_layout_bn32.json"
  TAIL=5 stage layout_bn16 120 python benchmarks/bench_moe_layout.py --tokens 1 4 8 --block-n 16 --warps 8 \
    --out "$OUT/moe_layout_bn16.json"
  TAIL=5 stage layout_bn32_split7 120 python benchmarks/bench_moe_layout.py --tokens 1 4 8 --split 7 \
    --out "$OUT/moe_layout_bn32_split7.json"
  ;;
b7)
  TAIL=20 stage paired_q_b 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --paired 100 \
    --kernels-from benchmarks/variants/gemv_q_b_tc.py --out "$OUT/paired_q_b.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
