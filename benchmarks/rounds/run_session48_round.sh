#!/usr/bin/env bash
# The forty-eighth session's device round: where a verify's extra time over a decode goes, T by T, and the INT4 GEMV
# MoE swept jointly (gate_up x down) over tiles that keep the table's packed-fp16 arithmetic (the sweep had timed only
# the fp32 form, which the table cannot take: bench_kernels.gemv_form_candidates).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session48_round.sh x1   (one device call each, < 10 min)
# x1: profile_step.py per kernel at T = 1..6, 8 (4 layers, 1k; CUPTI serialises a replay's kernels: shares, not a
#     timeline), then bench_kernels.py --sweep gemv at T = 1, 2, 4 (each winner confirmed against the table's config,
#     alternating three times) and the MoE at T = 1, 2, 4, 8 with the swept table, with its read ceilings.
# x2: the MoE tiles where they have to pay: the 61-layer step paired (120 rounds a shape) at T = 1..4, 1k and 8k, the
#     checked-in table against benchmarks/variants/moe_tables.py's variants (x1's T=1 gate_up winner; the T = 2..4
#     down kernel without PRELOAD's tile, and at 16 rows x 4 warps), with the random router's routing and then with
#     uniform routing at 1k; then profile_step.py at T = 1..6, 8 with PDL off (each kernel's own time, no overlap).
#     (The generator was benchmarks/variants/moe_tables.py at d85d228, benchmarks/variant_tables.py since: the same tables.)
# x3: MLA's verify rows in 16-row blocks as decode's (the table's 32-row blocks were swept at 4 requests), with 3 and
#     with 2 stages, paired in the step at T = 1..8, 1k and 8k.
# x4: the same at long contexts, where 2 stages keep one key-tile buffer (the sixteenth session's double buffering
#     made T=4 at 128k 20% faster): MLA alone in a 131072-slot table (bench_small_ops.py --mla-variants, T = 3, 4, 8
#     at 1k..128k), then the step paired at 32k and 128k (that ran out of memory: two settings' 128k caches).
# x5: the short_split rule (launch_plan: 16-row blocks at one buffer where no split can hold more than max_tiles key
#     tiles) in the sm_90 table at max_tiles 1: the MLA GPU tests (the new decode == verify and same-bits cases in an
#     8448-slot table), the invariance probe at T = 3, 4, 8 (every verify row against its decode, eager and
#     replayed), MLA alone at two tiles a split (a 16896-slot table) to choose max_tiles, and the step paired
#     against the table without the rule at 1k and 8k, T = 1..8.
# x6: at max_tiles 2 (x5: at two tiles a split MLA alone is level): the CUDA engine's GPU tests (speculative ==
#     plain with graphs on) and the step table at HEAD (bench_verify_graph.py, 1k and 8k, T = 1..8).
# x7: the short_split GPU test with two key tiles a split (16896-slot tables) as well as one.
# Ran (one lease each, all on H100s, no refusals): x1 at 2d58fc7, x2 at d85d228, x3 at ff979db, x4 at e6de397 (its
# paired step out of memory), x5 at 08f348c (46 + probe), x6 at 17977ef (23 passed), x7 at d003103 (14 passed); ~27
# of 30 device minutes. Results: benchmarks/results/h100/session48_x*, verify_graph_17977ef.json; BENCHMARKS.md
# section 1, "Forty-eighth session".
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: x1 | x2 | x3 | x4 | x5 | x6 | x7}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
x1)
  TAIL=100 stage profile_t 170 python benchmarks/profile_step.py --layers 4 --tokens 1 2 3 4 5 6 8 --no-gemm \
    --out "$OUT/profile_t.json"
  TAIL=40 stage moe_sweep 390 python benchmarks/bench_kernels.py --out "$OUT" --sweep gemv --sweep-tokens 1 2 4 \
    --moe-only
  cat "$OUT/sweep_table.json" 2>/dev/null
  ;;
x2)
  python benchmarks/variant_tables.py /tmp/moe_tables > /dev/null
  V=()
  for n in t1_gate_up_bn8 t2_4_down_slots t2_4_down_bn16; do V+=("SGLANG_EAGLE3_CONFIG_TABLE=/tmp/moe_tables/$n.json"); done
  TAIL=40 stage paired_moe 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --max-tokens 4 --tokens 1 2 3 4 --eager-iters 1 --graph-iters 10 --env-variants '' "${V[@]}" --paired 120 \
    --out "$OUT/paired_moe.json"
  TAIL=30 stage paired_moe_uniform 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --max-tokens 4 --tokens 1 2 4 --eager-iters 1 --graph-iters 10 --uniform-routing --env-variants '' "${V[@]}" \
    --paired 120 --out "$OUT/paired_moe_uniform.json"
  SGLANG_EAGLE3_PDL=0 TAIL=4 stage profile_nopdl 90 python benchmarks/profile_step.py --layers 4 --tokens 1 2 3 4 5 6 8 \
    --no-gemm --out "$OUT/profile_nopdl.json"
  ;;
x3)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  TAIL=40 stage paired_mla 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --eager-iters 1 --graph-iters 10 --env-variants '' SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/mla_verify_bm16.json \
    SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/mla_verify_bm16_s2.json --paired 120 --out "$OUT/paired_mla.json"
  ;;
x4)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  CASES=()
  for T in 3 4 8; do for C in 1024 8192 32768 131072; do CASES+=("$T:$C:131072"); done; done
  TAIL=40 stage mla_long 200 python benchmarks/bench_small_ops.py --out "$OUT/mla_long.json" \
    --mla-variants '' BLOCK_M=16,num_stages=2 BLOCK_M=16 --mla-cases "${CASES[@]}"
  TAIL=20 stage paired_mla_long 330 python benchmarks/bench_verify_graph.py --backends triton \
    --contexts 32768 131072 --tokens 1 4 8 --eager-iters 1 --graph-iters 10 --env-variants '' \
    SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/mla_verify_bm16_s2.json --paired 80 --out "$OUT/paired_mla_long.json"
  ;;
x5)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  TAIL=15 stage mla_gpu_tests 230 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/kernels/test_kernels_gpu.py -k mla
  TAIL=14 stage probe 150 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 --widths 3 4 8 \
    --out "$OUT/probe.json"
  SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/mla_no_short.json TAIL=14 stage mla_two_tiles 100 \
    python benchmarks/bench_small_ops.py --out "$OUT/mla_two_tiles.json" --mla-variants '' BLOCK_M=16,num_stages=2 \
    --mla-cases 3:16384:16896 4:16384:16896 8:16384:16896 4:8192:16896 4:1024:16896
  TAIL=24 stage paired_short 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --eager-iters 1 --graph-iters 10 --env-variants '' SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/mla_no_short.json \
    --paired 100 --out "$OUT/paired_short.json"
  ;;
x6)
  TAIL=10 stage engine_tests 240 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py
  TAIL=20 stage verify_graph 250 python benchmarks/bench_verify_graph.py --backends triton --eager-iters 1 \
    --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
x7)
  TAIL=8 stage short_split_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
    tests/kernels/test_kernels_gpu.py -k short_split
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
