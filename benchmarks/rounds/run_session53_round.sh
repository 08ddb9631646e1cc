#!/usr/bin/env bash
# The fifty-third session's device round: the fifty-second's c5 (register caps and down's one-warp tile, paired in the
# step) with q_b at 64 lanes beside it; the H200 tables at HEAD where an H200 comes.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session53_round.sh d1   (one device call each, < 10 min)
# d1 (any card): the GPU tests that hold the MoE's tiles, register caps among them, to one rounding; then the step
#     paired (1k, uniform routing, T = 1, 4, 8) against
#     - gate_up at T = 4..8 in 16-row blocks at 4 warps capped at 128 registers (fifty-second session's ncu: 255 a
#       thread at T=4, 8 warps a SM; capped, 512 programs in one wave, 4 a SM; one 8-byte spill offline),
#     - down's PRELOAD tile at 8 rows in one warp at T = 1..6 (the fastest down config alone at T = 4 and 8),
#     - q_b (MLA's q_a norm + q_b, K = 1536) at 64 lanes over 2 warps (fma_config gives it 128 over 4: two K steps
#       of 1024, the second half masked; 64 lanes take three whole steps of 512; the fifty-first session's launch
#       gaps had q_b 6.37 us at 4 rows against 3.95 at one, the largest growth of a dense launch from decode to a
#       verify of 4; SGLANG_EAGLE3_GEMV_FMA_CONFIG also reaches W_UV, whose own config is this one already);
#     then the MoE alone at T = 3, 4, 8 over gate_up's tiles with and without the cap.
# d2: on an H200, the tables docs/BENCHMARKS.md section 0 calls current (head_tables); on another card, d1.
# d3 (any card): the down kernel's PRELOAD tile for several output blocks a program in turn (the config's BLOCKS,
#     new: the next block's weights load while one computes): the GPU test holding every tile to one rounding at
#     T=4 (d1 runs it at T = 1, 4, 8), then the MoE alone at T = 2, 4, 6, 8 (all 384 experts) over
#     tiles and BLOCKS against the table; then the step paired (1k, uniform routing, T = 1, 2, 4, 8) against
#     8-row tiles at 2 warps in BLOCKS of 2 and 4 at T = 2..8 (variant_tables.py t2_8_down_blocks2 / 4) and against
#     d1's q_b at 64 lanes (in case d1 does not run: device calls were refused more often than not).
# d4 (any card): d1 found down's one-warp tile x0.981 at T=4 (x1.009 at T=1) and gate_up capped x0.986 at T=4 (x1.003
#     at T=8): the step paired (1k, uniform routing, T = 1..6) against each where it won (down T = 2..6, gate_up
#     T = 4..6) and both; then both against the table with the slice's own routing (T = 1, 2, 4, 6).
# d5 (any card): d4 found down's one-warp tile faster at every T of 2..6 with uniform routing (x0.991-0.998) and gate_up's
#     cap slower at 4..6 in this run (x1.004-1.047, where d1 had x0.986 at 4): down's tile alone paired against the
#     table at 1k and 8k, T = 1..6 uniform and T = 1, 2, 4, 6 with the slice's own routing, before the table takes it.
# d6: d5 had down's one-warp tile faster at T = 2..6 with the slice's own routing (x0.966-0.980) and mostly with uniform
#     routing, but x1.006 at 1k T=3, x1.008 at 8k T=2 and x1.001 [0.999, 1.002] at 8k T=4: again at T = 3, 4 (new
#     captures, 120 rounds), and at T = 7, 8 (the slot loop's bucket) with the tile there too.
# d7 (any card): the tables at HEAD (head_tables: the step at 1k and 8k, T = 1..8, with the slice's routing and uniform,
#     and the kernel table), after the table took down's one-warp tile.
# d8 (any card): with the new down bucket (T = 2..6 in one warp, T=1 in two), the INT4 MoE's GPU tests of one rounding
#     across tiles and batches, and the invariance probe (every verify row of T = 2, 4, 6 the bits of its decode).
# d9 (any card): end to end on the slice at HEAD (bench_e2e.py, batch 1, uniform routing), k = 3 with the accept length
#     pinned to 3.0 and k = 6 at 5.0, against the target alone, as the fiftieth session ran it.
# d10 (any card): the CUDA engine tests at HEAD (speculative output with graphs and kernels equal to the reference, the
#     fallback counters, sampling, grammar, adaptive k) with the new down bucket.
# Ran (H100s; the first seven calls refused, ~12 device minutes; the rest named nvidia-h100-x1): d3 at bbf5514, d1
# at bbf5514, d4 at b38856e, d5 at ea14c69, d6 at 5609d13 (t2_8_down_w1, since removed: the same table as
# t7_8_down_bn8_w1 once the table took t2_6_down_w1), d7 at b0c30fc, d8 at c5e6464, d9 at a4aef8e, d10 at 3eb943a (~28
# of the 30 device minutes in all). BLOCKS lost (d3) and was removed after: d3 runs only at bbf5514. Not run: d2 (no
# H200).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: d1 | d2 | d3 | d4 | d5 | d6 | d7 | d8 | d9 | d10}
record_gpu
if [ "$part" = d2 ]; then part=$(on_h200 d2 d1); fi
Q_B_L64="SGLANG_EAGLE3_GEMV_FMA_CONFIG=BLOCK_N=4,LANES=64,num_warps=2,MAX_ROWS=4"
case $part in
d1) TAIL=6 stage tests_caps 140 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "tiles_round_alike or table_buckets_round_alike"
    python benchmarks/variant_tables.py /tmp/tables > /dev/null
    TAIL=40 stage paired_regs_w1_qb 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t4_8_gate_up_bn16_r128.json \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t1_6_down_w1.json "$Q_B_L64" --paired 60 \
      --out "$OUT/paired_regs_w1_qb.json"
    TAIL=30 stage moe_gate_up_regs 100 python benchmarks/bench_moe_dot.py --variants "gemv (table)" --tokens 3 4 8 \
      --pools 384 --gemv-config "BLOCK_N=16,BLOCK_W=128,num_warps=4,F16=1,maxnreg=128" \
      --gemv-config "BLOCK_N=16,BLOCK_W=128,num_warps=4,F16=1" \
      --gemv-config "BLOCK_N=8,BLOCK_W=128,num_warps=2,F16=1,maxnreg=128" \
      --gemv-config "BLOCK_N=8,BLOCK_W=128,num_warps=4,F16=1" --out "$OUT/moe_gate_up_regs.json" ;;
d4) python benchmarks/variant_tables.py /tmp/tables > /dev/null
    TAIL=40 stage paired_w1_r128 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 3 4 5 6 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t2_6_down_w1.json \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t4_6_gate_up_bn16_r128.json \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t4_6_gate_up_r128_t2_6_down_w1.json --paired 60 \
      --out "$OUT/paired_w1_r128.json"
    TAIL=20 stage paired_w1_r128_own 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 4 6 --eager-iters 1 --graph-iters 5 --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t4_6_gate_up_r128_t2_6_down_w1.json --paired 60 \
      --out "$OUT/paired_w1_r128_own.json" ;;
d5) python benchmarks/variant_tables.py /tmp/tables > /dev/null
    TAIL=30 stage paired_down_w1_uniform 250 python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 8192 --tokens 1 2 3 4 5 6 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t2_6_down_w1.json --paired 80 --out "$OUT/paired_down_w1_uniform.json"
    TAIL=20 stage paired_down_w1_own 200 python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 8192 --tokens 1 2 4 6 --eager-iters 1 --graph-iters 5 --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t2_6_down_w1.json --paired 80 --out "$OUT/paired_down_w1_own.json" ;;
d6) python benchmarks/variant_tables.py /tmp/tables > /dev/null
    TAIL=30 stage paired_down_w1_again 250 python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 8192 --tokens 3 4 7 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t2_6_down_w1.json SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t2_8_down_w1.json \
      --paired 120 --out "$OUT/paired_down_w1_again.json" ;;
d7) T_STEP=170 T_STEP_UNIFORM=120 T_KERNELS=180 head_tables ;;
d8) TAIL=8 stage moe_gpu_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_kernels_gpu.py -k "int4 and (round_alike or token_independent)"
    TAIL=14 stage probe 150 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 --widths 2 4 6 \
      --out "$OUT/probe.json" ;;
d9) for k_acc in 3:3.0 6:5.0; do  # end to end on the slice, batch 1, the accept length pinned, uniform routing
      k=${k_acc%:*}; acc=${k_acc#*:}
      TAIL=4 stage "e2e_k${k}_uniform" 110 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 \
        --max-new-tokens 96 --repeat 2 --k "$k" --simulate-accept "$acc" --routing uniform \
        --out "$OUT/e2e_k${k}_uniform.json"
    done ;;
d10) TAIL=14 stage engine_tests 260 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 240 \
      tests/gpu/test_cuda_engine.py ;;
d2) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
d3) TAIL=6 stage tests_blocks 60 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      "tests/kernels/test_kernels_gpu.py::test_fused_moe_int4_gemv_tiles_round_alike[4-True]"
    V=()
    for tile in "8 2 1" "8 2 2" "8 2 4" "8 2 8" "8 1 1" "8 1 2" "8 1 4" "4 1 2" "4 1 4" "4 1 8" "16 4 2" "16 4 4" \
                "16 2 2"; do
      read -r bn w b <<< "$tile"
      V+=(--down-config "BLOCK_N=$bn,BLOCK_W=32,num_warps=$w,PRELOAD=1,F16=1,BLOCKS=$b")
    done
    TAIL=60 stage moe_down_blocks 150 python benchmarks/bench_moe_dot.py --variants "gemv (table)" --tokens 2 4 6 8 \
      --pools 384 "${V[@]}" --out "$OUT/moe_down_blocks.json"
    python benchmarks/variant_tables.py /tmp/tables > /dev/null
    TAIL=40 stage paired_blocks 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t2_8_down_blocks2.json \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t2_8_down_blocks4.json "$Q_B_L64" --paired 60 \
      --out "$OUT/paired_blocks.json" ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
