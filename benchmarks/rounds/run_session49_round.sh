#!/usr/bin/env bash
# The forty-ninth session's device round: past 4 rows of x the CUDA-core GEMV forms (q_a + kv_a, router + shared
# gate/up, q_b, W_UV) run a second row group of programs over the same weights; the grid put the weight blocks on
# axis 0, so the second group started after the first had filled the SMs (kernels/gemv.py row_groups_inner). With
# the row groups on axis 0 a block's programs start together and share the weights through L2. Same bits.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session49_round.sh z1   (one device call each, < 10 min)
# z1: the CUDA-core GEMV GPU tests; the 61-layer step paired, row groups adjacent (the default) against
#     SGLANG_EAGLE3_GEMV_GROUPS_INNER=0 at T = 1, 4, 5, 6, 8, 1k and 8k; profile_step.py at T = 5, 8 with each order
#     (per kernel); variant_tables.py's mla_decode_s2 (decode's MLA at one key-tile buffer) paired at T = 1.
# z2: z1 found the pair launches 3.1 us faster at T = 5 with the groups side by side and the single ones (q_b, W_UV)
#     0.4-0.6 us slower, so the default became "pairs": the step paired, pairs (the default) against all and none,
#     at T = 1, 4, 5, 6, 8, 1k and 8k; the invariance probe at T = 5, 8 (every verify row against its decode).
# z3: the single launches (q_b, W_UV) at up to 8 rows of x a program (benchmarks/variants/gemv_fma_rows8.py: one
#     program a weight block at T = 5..8, where two groups of 4 take two waves), the step paired at T = 4, 5, 6, 8;
#     then the step table at HEAD (bench_verify_graph.py, 1k and 8k, T = 1..8).
# z4: on an H200 the tables at HEAD (head_tables: the step table and the kernel table, section 0's); on anything else
#     the CUDA-core GEMV GPU tests at the default (pairs side by side) and the invariance probe at T = 5..8, 8k.
# z5: on an H200 the tables at HEAD again (z4 got an H100); else profile_step.py with PDL off at T = 1, 4, 5, 8 (each
#     kernel's own time at the default: what is left of the T = 4 -> 5 step).
# z6: on an H200 the tables at HEAD; else end to end on the Kimi slice (bench_e2e.py, batch 1, k = 6 with the
#     accept length pinned to 5.0: verify of 7 every round) with the row groups side by side (the default) and
#     without (none), alternating twice.
# z7: on an H200 the step table at HEAD only (what device time was left); else nothing but gpu.txt. Ran at c570975:
#     an H100 (collect then failed on no logs: gpu_stages.sh mended).
# z8: the INT4 GEMV gate_up's ROWS form at verify sizes (variant_tables.py t2_16_gate_up_rows2, t5_16_gate_up_rows4),
#     the step paired at T = 2, 4, 5, 8 (1k, 8k; the random router's routing), then at 1k with uniform routing.
# Ran: z1 at baa1c40 (H100; all launches' groups side by side then: the step x0.946-0.968 at T = 5..8 against none,
# x1.001-1.003 at T = 1; mla_decode_s2 x1.004 / x1.026 at 1k / 8k: slower); z2 at c14a217 (H100; against pairs: none x1.039-1.053 at T = 5..8, all x0.992-1.004; the probe at T = 5,
# 8: every verify row its decode's bits); z3 at 24c557a (H100; rows8 x1.041-1.050 at T = 5..8: not taken; the
# step table); z4 at e490bd6 (H100: fma GPU tests 123 passed, the probe at 8k T = 5..8 every row identical); z5 at
# 3ad4e58 (H100: the PDL-off profile; the pair launch 11.04 / 14.91 / 15.11 us at T = 4 / 5 / 8); z6 at 61dbae7 (H100:
# end to end at k = 6, accept 5.05: 489.9 / 485.4 tok/s against 473.7 / 474.7 without; baselines 233.6-234.1); z8 at
# 71703da (H100: ROWS 2 at T = 2..16 x1.014-1.021 at T=2, x1.44-1.47 at T=4, x1.03 at 5, x0.975 / x0.977 at 8 with the
# random router and x1.023 at 8 uniform; ROWS 4 at 5..16 x1.03-1.09: neither taken).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: z1 | z2 | z3 | z4 | z5 | z6 | z7 | z8}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
z1)
  TAIL=6 stage fma_gpu_tests 120 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 100 \
    tests/kernels/test_kernels_gpu.py -k fma
  # (at baa1c40 the knob was 0/1 and every launch went side by side by default: --env-variants '' ..._INNER=0)
  TAIL=24 stage paired_groups 230 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 5 6 8 --eager-iters 1 --graph-iters 10 --env-variants SGLANG_EAGLE3_GEMV_GROUPS_INNER=all \
    SGLANG_EAGLE3_GEMV_GROUPS_INNER=none --paired 100 --out "$OUT/paired_groups.json"
  SGLANG_EAGLE3_GEMV_GROUPS_INNER=all TAIL=30 stage profile_inner 70 python benchmarks/profile_step.py --layers 4 --tokens 5 8 --no-gemm \
    --out "$OUT/profile_inner.json"
  SGLANG_EAGLE3_GEMV_GROUPS_INNER=none TAIL=30 stage profile_outer 70 python benchmarks/profile_step.py --layers 4 \
    --tokens 5 8 --no-gemm --out "$OUT/profile_outer.json"
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  TAIL=10 stage paired_decode_s2 70 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 --eager-iters 1 --graph-iters 10 --env-variants '' \
    SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/mla_decode_s2.json --paired 100 --out "$OUT/paired_decode_s2.json"
  ;;
z2)
  TAIL=36 stage paired_groups 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 5 6 8 --eager-iters 1 --graph-iters 10 --env-variants '' SGLANG_EAGLE3_GEMV_GROUPS_INNER=all \
    SGLANG_EAGLE3_GEMV_GROUPS_INNER=none --paired 100 --out "$OUT/paired_groups.json"
  TAIL=10 stage probe 120 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 --widths 5 8 \
    --out "$OUT/probe.json"
  ;;
z3)
  TAIL=28 stage paired_rows8 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 4 5 6 8 --eager-iters 1 --graph-iters 10 --kernels-from benchmarks/variants/gemv_fma_rows8.py \
    --paired 100 --out "$OUT/paired_rows8.json"
  TAIL=20 stage verify_graph 300 python benchmarks/bench_verify_graph.py \
    --backends triton --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
z4)
  if grep -q H200 "$OUT/gpu.txt"; then
    T_STEP=300 T_KERNELS=250 head_tables
  else
    TAIL=6 stage fma_gpu_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 120 \
      tests/kernels/test_kernels_gpu.py -k fma
    TAIL=12 stage probe 200 python benchmarks/probe_invariance.py --layers 3 --contexts 8192 --widths 5 6 7 8 \
      --out "$OUT/probe.json"
  fi
  ;;
z5)
  if grep -q H200 "$OUT/gpu.txt"; then
    T_STEP=300 T_KERNELS=250 head_tables
  else
    SGLANG_EAGLE3_PDL=0 TAIL=40 stage profile_nopdl 150 python benchmarks/profile_step.py --layers 4 \
      --tokens 1 4 5 8 --no-gemm --out "$OUT/profile_nopdl.json"
  fi
  ;;
z6)
  if grep -q H200 "$OUT/gpu.txt"; then
    T_STEP=300 T_KERNELS=250 head_tables
  else
    TAIL=16 stage e2e_k6 420 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
      --repeat 2 --k 6 --simulate-accept 5.0 --env-variants '' SGLANG_EAGLE3_GEMV_GROUPS_INNER=none \
      --repeat-variants 2 --out "$OUT/e2e_k6.json"
  fi
  ;;
z7)
  if grep -q H200 "$OUT/gpu.txt"; then
    TAIL=20 stage verify_graph 330 python benchmarks/bench_verify_graph.py --backends triton --eager-iters 1 \
      --graph-iters 30 --out "$OUT/verify_graph.json"
  else
    cat "$OUT/gpu.txt"
  fi
  ;;
z8)
  python benchmarks/variant_tables.py /tmp/tables > /dev/null
  V=()
  for n in t2_16_gate_up_rows2 t5_16_gate_up_rows4; do V+=("SGLANG_EAGLE3_CONFIG_TABLE=/tmp/tables/$n.json"); done
  TAIL=30 stage paired_rows 250 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 2 4 5 8 --eager-iters 1 --graph-iters 10 --env-variants '' "${V[@]}" --paired 80 \
    --out "$OUT/paired_rows.json"
  TAIL=12 stage paired_rows_uniform 120 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 4 8 --eager-iters 1 --graph-iters 10 --uniform-routing --env-variants '' "${V[@]}" --paired 80 \
    --out "$OUT/paired_rows_uniform.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
