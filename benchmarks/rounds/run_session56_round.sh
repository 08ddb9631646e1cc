#!/usr/bin/env bash
# The fifty-sixth session's device round: the INT4 GEMV MoE's gate_up split over H (its config's SPLIT, with
# CHUNK_SUMS: one accumulator a row adding each 128-word chunk's sum in chunk order, so a split of whole chunks rounds
# as one program does). At decode 8 pairs x 16 row blocks give 128 programs for 132 SMs, each reading its 7 chunks
# in a row; the fifty-first session's read probe had 11.6 us there against 8.6-10.0 with the reads split 7 ways.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session56_round.sh g1   (one device call, < 10 min, any card)
# g1s: g1 without the tiles test and the split at T = 1..2, for ~430 s.
# g1: the GPU tests of the split and of the order (test_fused_moe_int4_gemv_split: act bit-identical split and not,
#     a token alone split as in its batch unsplit, the PTX as its emulation; the tiles and table buckets rounding
#     alike, split tiles among them); the invariance probe with the split at decode (variant table
#     t1_gate_up_split7); then the 61-layer step at 1k, T = 1, 2, 4, 8, uniform routing, paired: the checked-in table
#     (CHUNK_SUMS on: the new order, unsplit) against the old order (gate_up_group_sums), the split at T=1 (seven
#     programs of one chunk) and at T = 1..2.
# Ran (sixteen calls, twelve refused for want of a machine, ~15.5 of the 30 device minutes): g1 at 53f310f on an H200,
# then on the same lease run_session55_round.sh h (the H200 tables), f1b and f1c; results
# benchmarks/results/h200/session56_*_53f310f*. The split lost at decode (x1.019) and CHUNK_SUMS cost up to 1.1% at
# a verify: both were removed after (the code is at 53f310f; variant_tables.py no longer has its variants, so this
# script runs only at that commit).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: g1 | g1s}
record_gpu
python benchmarks/variant_tables.py /tmp/tables > /dev/null
case $part in
g1) K=tests/kernels/test_kernels_gpu.py  # (in this order: the split's own test first)
    TAIL=20 stage tests_split 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      $K::test_fused_moe_int4_gemv_split $K::test_fused_moe_int4_table_buckets_round_alike \
      $K::test_fused_moe_int4_gemv_tiles_round_alike
    TAIL=14 stage probe_split 80 env SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t1_gate_up_split7.json \
      python benchmarks/probe_invariance.py --layers 3 --contexts 1024 --widths 2 4 --out "$OUT/probe_split.json"
    TAIL=40 stage paired_split 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/gate_up_group_sums.json \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t1_gate_up_split7.json \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t1_2_gate_up_split7.json --paired 40 --out "$OUT/paired_split.json" ;;
g1s) K=tests/kernels/test_kernels_gpu.py  # g1 cut to fit what device time is left (~430 s)
    TAIL=20 stage tests_split 100 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      $K::test_fused_moe_int4_gemv_split $K::test_fused_moe_int4_table_buckets_round_alike
    TAIL=14 stage probe_split 70 env SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t1_gate_up_split7.json \
      python benchmarks/probe_invariance.py --layers 3 --contexts 1024 --widths 2 4 --out "$OUT/probe_split.json"
    TAIL=40 stage paired_split 260 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/gate_up_group_sums.json \
      SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/t1_gate_up_split7.json --paired 40 --out "$OUT/paired_split.json" ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
