#!/usr/bin/env bash
# The fiftieth session's device round: the benchmarks' drawn routing (benchmarks/routing.py). The random slice's router
# sends a verify's tokens to ~10 experts a layer (32 pairs at T = 4); a trained Kimi-K2.5 spreads them (shared experts
# and load balancing: little local routing consistency), which sets both a verify's MoE time and its floor. The old
# --uniform-routing drew the experts inside the step (a rand, a top-k and a cast a MoE layer, timed with it); the
# routing is now drawn before capture, one fixed routing a layer and row count, so the step launches what it would.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session50_round.sh a1   (one device call each, < 10 min)
# a1: the step at 1k, T = 1, 4, 8 with uniform routing drawn in the step (the tree before, carried as .carry/old:
#     git archive a6692a5 sglang_eagle3 'benchmarks/*.py' benchmarks/ablations benchmarks/variants | tar -x -C
#     .carry/old) and drawn before capture (this tree); then the step table at HEAD (1k and 8k, T = 1..8) with
#     uniform routing and with the random router's own (the section-0 table's command).
# a2: where a step's time goes with uniform routing (profile_step.py, PDL off: each kernel's own time, T = 1, 4, 8);
#     then end to end on the Kimi slice (bench_e2e.py, batch 1) at k = 3 (accept length pinned to 3.0) and k = 6
#     (5.0), each with uniform routing and with the router's own.
# a3: the INT4 GEMV MoE's tiles where a trained router's spread makes them read DRAM: the step paired (1k, T = 2, 3, 4,
#     5, 8) with uniform routing, the checked-in table against variant_tables.py's T = 2..4 down tiles (16 rows at 2
#     and 4 warps, 4 rows at 1 warp, the T = 5..16 slot loop), PRELOAD's tile at T = 5..8 and gate_up's 16-row blocks
#     at T = 3..4; then the same with the random router's own routing.
# a4: a3's one gain (gate_up's 16-row blocks at T=3, ~5%) at T=3 alone, and the program counts behind it elsewhere:
#     gate_up in 32-row blocks at T = 5..8 and 8-row at T=2, the down kernel in 16 and 64 rows at T = 5..8; the step
#     paired at T = 2..8 (T=4, which none changes, and a second capture of the table, SGLANG_EAGLE3_PDL=1 (the
#     default), say what two captures of one config differ by), uniform routing then the router's own.
# a5: the sm_90 table with gate_up's T=3 bucket in 16-row blocks (a4): the INT4 MoE GPU tests that hold a token's
#     bits across buckets and tiles (a token alone under decode's configs against its row of a batch under T's), and
#     the invariance probe at T = 3, 4 (1k, 8k: every verify row against its token's decode, eager and replayed).
# a6: what T = 4 -> 5 adds with uniform routing (verify of 5 1.3 ms over verify of 4 at 1k): the step paired at T = 4..8
#     (T=4 the control) with the down kernel's PRELOAD tile at T=5 and at T = 5..6 (a3: x0.982 at T=5), a second
#     capture of the table; then the CUDA-core pairs at up to 8 rows of x a program (one program a weight block
#     past 4 rows: benchmarks/variants/gemv_pair_rows8.py, the router + shared pair; gemv_qkv_rows8.py, q_a + kv_a),
#     last measured before lanes first and the row groups side by side.
# a7: the sm_90 table with the down kernel's PRELOAD tile up to T=6 (a6): the step paired at T = 4..7 against it at
#     T = 5..6 as before (variant_tables.py t5_6_down_slots) and a second capture, with the router's own routing (a6
#     measured uniform only) then uniform; the MoE GPU tests of a token's bits across buckets; the probe at T = 5, 6.
# a8: the step table at HEAD (the two tiles a4 / a7 took), 1k and 8k, T = 1..8, with uniform routing and the router's
#     own.
# Ran (one lease each, all on H100s, no refusals; ~27 of 30 device minutes): a1 at e464826 (in-step draws ~0.95 ms
# a step; verify of 4 x1.11 / x1.09 with uniform routing at 1k / 8k), a2 at d2186ff (end to end k = 3 1.58x / 1.74x,
# k = 6 1.87x / 2.11x, uniform / own), a3 at a5fd8b4, a4 at 66850f5 (gate_up T=3 in 16 rows ~x0.96: taken), a5 at
# d0e46af (25 passed, probe T = 3, 4 identical), a6 at ecd7277 (down PRELOAD at T = 5..6 x0.977-0.986 uniform; pairs
# at 8 rows x1.03-1.05), a7 at f2d833e (confirmed; 16 passed, probe T = 5, 6 identical), a8 at c19d430 (the tables).
# Next device session: on an H200, T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables (gpu_stages.sh: the step
# table with both routings, the kernel table).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: a1 | a2 | a3 | a4 | a5 | a6 | a7 | a8}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
a1)
  TAIL=6 stage uniform_in_step 150 python .carry/old/benchmarks/bench_verify_graph.py --backends triton \
    --contexts 1024 --tokens 1 4 8 --eager-iters 1 --graph-iters 30 --uniform-routing \
    --out "$OUT/uniform_in_step.json"
  TAIL=20 stage verify_graph_uniform 200 python benchmarks/bench_verify_graph.py --backends triton \
    --eager-iters 1 --graph-iters 30 --routing uniform --out "$OUT/verify_graph_uniform.json"
  TAIL=20 stage verify_graph 200 python benchmarks/bench_verify_graph.py --backends triton \
    --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
a2)
  SGLANG_EAGLE3_PDL=0 TAIL=30 stage profile_uniform_nopdl 100 python benchmarks/profile_step.py --layers 4 \
    --tokens 1 4 8 --no-gemm --routing uniform --out "$OUT/profile_uniform_nopdl.json"
  for k_acc in 3:3.0 6:5.0; do
    k=${k_acc%:*}; acc=${k_acc#*:}
    for routing in uniform own; do
      TAIL=4 stage "e2e_k${k}_$routing" 120 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 \
        --max-new-tokens 96 --repeat 2 --k "$k" --simulate-accept "$acc" --routing "$routing" \
        --out "$OUT/e2e_k${k}_$routing.json"
    done
  done
  ;;
a3)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  V=()
  for n in t2_4_down_bn16_w2 t2_4_down_bn16 t2_4_down_bn4_w1 t2_4_down_slots t5_8_down_preload t3_4_gate_up_bn16; do
    V+=("SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/$n.json")
  done
  for routing in uniform own; do
    TAIL=44 stage "paired_moe_$routing" 270 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 2 3 4 5 8 --eager-iters 1 --graph-iters 5 --routing "$routing" --env-variants '' "${V[@]}" \
      --paired 80 --out "$OUT/paired_moe_$routing.json"
  done
  ;;
a4)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  V=(SGLANG_EAGLE3_PDL=1)
  for n in t3_gate_up_bn16 t5_8_gate_up_bn32 t2_gate_up_bn8 t5_8_down_bn16 t5_8_down_bn64; do
    V+=("SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/$n.json")
  done
  for routing in uniform own; do
    TAIL=4 stage "paired_tiles_$routing" 280 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 2 3 4 5 6 7 8 --eager-iters 1 --graph-iters 5 --routing "$routing" --env-variants '' "${V[@]}" \
      --paired 60 --out "$OUT/paired_tiles_$routing.json"
  done
  ;;
a5)
  TAIL=8 stage moe_gpu_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 180 \
    tests/kernels/test_kernels_gpu.py -k "int4 and (round_alike or token_independent or gemv_f16 or gemv_rows)"
  TAIL=14 stage probe 150 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 --widths 3 4 \
    --out "$OUT/probe.json"
  ;;
a6)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  TAIL=4 stage paired_t5_down 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 4 5 6 7 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' SGLANG_EAGLE3_PDL=1 \
    SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t5_down_preload.json \
    SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t5_6_down_preload.json --paired 60 --out "$OUT/paired_t5_down.json"
  TAIL=4 stage paired_rows8 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 4 5 6 7 8 --eager-iters 1 --graph-iters 5 --routing uniform \
    --kernels-from benchmarks/variants/gemv_pair_rows8.py benchmarks/variants/gemv_qkv_rows8.py --paired 60 \
    --out "$OUT/paired_rows8.json"
  ;;
a7)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  for routing in own uniform; do
    TAIL=4 stage "paired_down_$routing" 150 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 4 5 6 7 --eager-iters 1 --graph-iters 5 --routing "$routing" --env-variants '' SGLANG_EAGLE3_PDL=1 \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t5_6_down_slots.json --paired 60 --out "$OUT/paired_down_$routing.json"
  done
  TAIL=4 stage moe_gpu_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "int4 and (round_alike or token_independent)"
  TAIL=10 stage probe 100 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 --widths 5 6 \
    --out "$OUT/probe.json"
  ;;
a8)
  for routing in uniform own; do
    TAIL=18 stage "verify_graph_$routing" 110 python benchmarks/bench_verify_graph.py --backends triton \
      --eager-iters 1 --graph-iters 30 --routing "$routing" --out "$OUT/verify_graph_$routing.json"
  done
  ;;
esac
collect
