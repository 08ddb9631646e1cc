#!/usr/bin/env bash
# Twenty-fifth session's device rounds (H200): decode and verify computing a token alike.
#   bash benchmarks/rounds/run_session25_round.sh x1 | x2 | x3 | x4 | x5
# The A/B parts time the kernels of 10b889d (before the fixed-order sums) against this tree's in one process:
#   mkdir -p .carry && git show 10b889d:sglang_eagle3/kernels/triton/fused_moe.py > .carry/fused_moe_10b889d.py
# (the device tool's `carry` takes these ignored files along). Each part ran at the commit its results are named
# after (bd47baa, c820bb0, dc77087, 17a756b, 17a756b); the code has moved on since x1-x3 (their Found lines say how).
#
# x1: the GPU tests of the fixed-order MoE sums (every tile and every table bucket round a token alike), the
#     invariance probe (which modules make a verify row differ from the decode of the same token, Kimi TP=8 rank
#     slice, 3 layers), and the MoE alone old vs new (bench_moe_dot --kernels-from).
#     Found: the new round_alike tests pass (every tile, every table bucket); the plain-op emulation of the F16
#     kernels compiled for the GPU no longer matched the PTX (mul_rn's no-PTX branch was a plain product, which the
#     compiler contracted into the next add); the probe's graph rows were read after the next replay had reused
#     the pool (a probe bug: now copied); eager, the new MoE leaves rows bit-identical at T <= 4 and the MLA
#     kernel (its split plan: BLOCK_M and the split count follow T) breaks T=8; the MoE alone was 1.0-1.5 us
#     slower at T = 1..4 (PRELOAD's route-weight product had sunk past the PDL wait: now before it).
# x2: the F16 / ROWS / round-alike GPU tests again; the MoE alone, this tree against 10b889d, the tree with
#     gate_up's sums by tl.sum (sums_tlsum: the cost of the fixed order) and with PRELOAD's product contractible
#     (down_plainmul: the cost of mul_rn); the probe again (graphs copied) and eager with 10b889d's MoE.
#   for f in sums_tlsum down_plainmul: made from this tree's kernels/triton/fused_moe.py by the edits named above.
#     Found: the emulation tests still failed (the emulated down's t * inv was contracted into the group sums'
#     adds); the probe's graph rows now match eager (T <= 4 bit-identical at 1k and 8k; T=8 broken by MLA); with
#     10b889d's MoE the probe names model.layers.1.mlp.experts at T=4 and 8 (the old sums); the MoE alone: the cost
#     is all in down's PRELOAD (sums_tlsum, gate_up as at 10b889d, is as slow as this tree): +1.2 us at T=1.
#   Offline SASS then showed why: the PRELOAD tail's inline-asm mul_rn, or summing the slots before the groups,
#   leaves ptxas issuing act's loads in two waves after the PDL wait (last LDG at ~410 of ~740 instructions after
#   the wait, against 275 of 750 at 10b889d). Now: the groups first per slot, plain products, and the down kernel
#   compiled without fp fusion (every product rounded alone): last LDG at 284 of 758.
# x3: the F16 / ROWS / round-alike GPU tests again; the MoE alone this tree against 10b889d; the probe.
#     Found: 20 passed; the MoE alone within 0.2 us of 10b889d at T = 1, 2, 16, +0.3-0.4 us at T = 4, 8, +2% at 64;
#     the probe bit-identical at T <= 4 (1k, 8k), T=8 still broken by MLA (its split count followed T's row blocks).
#   Then MLA: the split count no longer follows the row blocks up to 16 tokens a request, the split kernel's row
#   sums kept per key column and added once after the loop (no BLOCK_M- or warp-dependent tl.sum; 23-31 fewer
#   SASS instructions in the key loop, 3 barriers fewer), the merge unchanged (one tile for decode and verify).
#   The A/B's old side is all three of 10b889d's files (MoE kernels, MLA kernels, MLA launcher):
#     git show 10b889d:sglang_eagle3/kernels/triton/mla_attention.py > .carry/mla_kernels_10b889d.py
#     git show 10b889d:sglang_eagle3/kernels/mla_attention.py > .carry/mla_launcher_10b889d.py
# x4: the MLA GPU tests (decode vs verify bit for bit at 1k / 8k / 20k, bf16 and fp32); the probe; the 61-layer
#     step at 1k and 8k, this tree against 10b889d's MoE + MLA, alternating twice.
#     Found: 63 passed; the probe bit-identical at every width and context, eager and graphs; the step (graph ms,
#     medians of 2) equal within noise at T = 1, 2, 4 (1k and 8k), slower at T=8: 7.67 vs 7.50 (1k), 8.40 vs 7.79
#     (8k): a verify of 8 now splits 8k keys 129 ways (two row blocks: twice the programs and partials).
# x5: the engine tests (speculative == plain with graphs) and the MoE + PDL GPU tests.
#     Found: engine 17 passed; the MoE + PDL stage ran out of its 200 s compiling (98 passed, none failed) and
#     passed whole on the warm machine (113 passed, 50 s: `stage moe_tests 330 ... -k moe -x`, round_x5b).
# x6: the other users of the MLA split kernel (its row sums changed): the draft's grouped-query attention, the
#     draft forward on the kernels, the absorbed prefill chunks; and the graph runner's GPU tests.
#     Found: 21 passed; graph runner 13 passed (24 deselected: its CPU cases).
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: x1, x2, x3, x4, x5, x6}
OLD_ALL=.carry/fused_moe_10b889d.py+.carry/mla_kernels_10b889d.py+.carry/mla_launcher_10b889d.py
OLD_MOE=.carry/fused_moe_10b889d.py
case $part in
x1)
  TAIL=12 stage moe_alike_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_kernels_gpu.py -k "round_alike or gemv_rows or int4_gemv_f16 or token_independent"
  TAIL=40 stage probe 240 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 \
    --widths 2 4 8 --out "$OUT/invariance.json"
  TAIL=30 stage moe_ab 150 python benchmarks/bench_moe_dot.py --out "$OUT/moe_ab.json" --variants "gemv (table)" \
    --tokens 1 2 4 8 16 64 --pools 12 384 --kernels-from "$OLD_MOE"
  ;;
x2)
  TAIL=8 stage moe_alike_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_kernels_gpu.py -k "round_alike or gemv_rows or int4_gemv_f16"
  TAIL=50 stage moe_ab 200 python benchmarks/bench_moe_dot.py --out "$OUT/moe_ab.json" --variants "gemv (table)" \
    --tokens 1 2 4 8 64 --pools 12 384 --kernels-from "$OLD_MOE" .carry/sums_tlsum.py .carry/down_plainmul.py
  TAIL=40 stage probe 200 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 \
    --widths 2 4 8 --kernels-from "$OLD_MOE" --out "$OUT/invariance.json"
  ;;
x3)
  TAIL=8 stage moe_alike_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_kernels_gpu.py -k "round_alike or gemv_rows or int4_gemv_f16"
  TAIL=30 stage moe_ab 150 python benchmarks/bench_moe_dot.py --out "$OUT/moe_ab.json" --variants "gemv (table)" \
    --tokens 1 2 4 8 16 64 --pools 12 384 --kernels-from "$OLD_MOE"
  TAIL=30 stage probe 200 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 \
    --widths 2 4 8 --out "$OUT/invariance.json"
  ;;
x4)
  TAIL=8 stage mla_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_kernels_gpu.py tests/kernels/test_mla_rope_gpu.py -k "mla"
  TAIL=30 stage probe 160 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 \
    --widths 2 4 8 --out "$OUT/invariance.json"
  TAIL=40 stage step_ab 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' '' --kernels-from "$OLD_ALL" \
    --out "$OUT/step_ab.json"
  ;;
x5)
  TAIL=8 stage engine_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/gpu/test_cuda_engine.py
  TAIL=8 stage moe_tests 330 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 320 \
    tests/kernels/test_kernels_gpu.py tests/kernels/test_pdl_gpu.py -k "moe"
  ;;
x6)
  TAIL=8 stage split_kernel_users 250 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 240 \
    tests/kernels/test_kernels_gpu.py -k "gqa or draft or prefill or chunk"
  TAIL=8 stage graph_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/test_graph_runner.py
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
