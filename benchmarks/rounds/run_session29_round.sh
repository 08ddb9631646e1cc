#!/usr/bin/env bash
# Twenty-ninth session's device round (H200).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session29_round.sh c1   (c1 .. c9, one device call each)
# The rope_wuk fusion (MLA's rotary launch as programs of W_UK's GEMV launch, one launch fewer a layer on the
# main chain, no stream fork/join).
# c1: its GPU tests (kernel bit-equality against the two launches at Kimi shapes T = 1..16, a graph replay, the
#     small Kimi-shaped model's logits and caches with it on and off, the launch count) and the rotary / latent /
#     PDL tests the refactored rotary kernel touches.
#     Ran at 54d844c: 51 passed (the new tests: bit-identical at T = 1..16, in a graph and in the model; 13 launches
#     a MoE layer with it, 14 without).
# c2: the 61-layer step at 1k and 8k, T = 1, 4, 8, one process alternating the defaults and rope_wuk on twice.
#     Found: x0.988-1.008 of the defaults (medians), inside the runs' spread.
# c3: the launches alone (bench_small_ops.py): W_UK alone, the rotary launch then W_UK, W_UK with the rotary
#     programs in its launch, T = 1 and 4 (with the other small launches the script times). Found: T=1 2.30 /
#     3.40 / 2.35 us, T=4 2.15 / 3.17 / 2.50: alone, the fusion saves 0.7-1.05 us a layer.
# c4: the step again at 1k, T = 1 and 4 only, the two settings alternating six times with 50 replays each (c2's
#     spread, ~1%, was as large as the ~1.4% that c3's 1 us a layer would make). Found: T=1 4.36 / 4.39 ms
#     (defaults / rope_wuk, medians of six), T=4 5.81 / 5.80: no gain in the step.
# c5: leave-one-out: the step as it is, with a rotary kernel that does no work (benchmarks/ablations/
#     rotary_noop.py: the launch kept, its work gone; numbers wrong, timing only) and with rope_wuk, at 1k,
#     T = 1 and 4, alternating three times: what the rotary's work costs on the chain. Found: none measurable
#     (T=1 4.41 / 4.41 ms, T=4 5.79 / 5.84; rope_wuk 4.43 / 5.82).
# c6: the same leave-one-out for three more small launches, each alone against the step as it is, at 1k, T = 1
#     and 4, alternating twice: the norms storing zeros (rms_norm_zero.py), MLA's merge storing zeros
#     (mla_merge_zero.py), the routing storing fixed experts (moe_topk_const.py); timing only. Found (medians
#     of two, against 4.32 / 5.73 ms): norms 0.971 / 0.972, merge 0.989 / 0.978, routing 0.985 / 1.015 (T=4
#     confounded: every token on the same experts).
# c7: the input-norm fold alone (bench_norm_fold.py): q_a + kv_a with the norm and residual add in its launch,
#     at the launcher's config and eight others, against the norm then the plain launch, T = 1 and 4.
#     Found: the fold 59.7 us against 12.2 for the plain launch and 14.7 for the norm then it (T=1; T=4 alike);
#     smaller K tiles faster (32: 34.4 us). In its sm_90 SASS every warp works the whole [16, BLOCK_K] x tile
#     (the dot operand's layout): the NORM_POST loop is 334 instructions a tile against 134.
# c8: the same at fewer warps a program (less of that redundant work) and 16-wide K tiles. Found: best 23-26 us
#     (16:4:8:1, 32:4:8:2, 64:4:4:1, 128:4:4:1), still twice the plain launch: no config rescues NORM_POST.
# c9: the single-GPU tests of the runtime and kernels at the session's code (tests/gpu, test_kernels_gpu.py,
#     test_graph_runner.py, test_fold_gpu.py, test_mla_rope_gpu.py). Ran out of its 560 s after 306 passed, none
#     failed (session29_c9_f55bf29.txt); test_mla_rope_gpu.py then alone, 35 passed (session29_c10_f55bf29.txt).
# Results: benchmarks/results/h200/session29_c*_<commit>.txt and the JSON files they name; docs/BENCHMARKS.md,
# twenty-ninth session.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: c1 .. c9}
NF=SGLANG_EAGLE3_NO_FUSE
RWK="$NF=input_norm,router_topk,q_rope_attn,route_shared_down"  # rope_wuk on, the other defaults as they are
case $part in
c1)
  TAIL=30 stage gpu_rope_wuk 270 python -m pytest -q -p no:cacheprovider tests/kernels/test_fold_gpu.py -k rope -rA
  TAIL=30 stage gpu_rotary 270 python -m pytest -q -p no:cacheprovider tests/kernels/test_pdl_gpu.py \
    tests/kernels/test_kernels_gpu.py::test_rotary_bit_identical tests/kernels/test_kernels_gpu.py::test_latent_to_cache \
    tests/kernels/test_kernels_gpu.py::test_kernels_per_moe_layer \
    tests/kernels/test_kernels_gpu.py::test_graph_replay_equals_eager tests/kernels/test_mla_rope_gpu.py::test_rotary_k_only_kimi
  ;;
c2)
  TAIL=60 stage step_rope_wuk 560 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' "$RWK" '' "$RWK" \
    --out "$OUT/step_rope_wuk.json"
  ;;
c3)
  TAIL=40 stage small_ops 300 python benchmarks/bench_small_ops.py --repeat 5 --out "$OUT/small_ops.json"
  ;;
c4)
  TAIL=40 stage step_rope_wuk_x6 560 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 50 \
    --env-variants '' "$RWK" '' "$RWK" '' "$RWK" '' "$RWK" '' "$RWK" '' "$RWK" --out "$OUT/step_rope_wuk_x6.json"
  ;;
c5)
  TAIL=40 stage step_rotary_ablation 560 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 50 --env-variants '' "$RWK" '' "$RWK" '' "$RWK" \
    --kernels-from benchmarks/ablations/rotary_noop.py --out "$OUT/step_rotary_ablation.json"
  ;;
c6)
  A=benchmarks/ablations
  TAIL=40 stage step_small_ablation 580 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 50 --env-variants '' '' \
    --kernels-from $A/rms_norm_zero.py $A/mla_merge_zero.py $A/moe_topk_const.py \
    --out "$OUT/step_small_ablation.json"
  ;;
c7)
  TAIL=60 stage norm_fold 400 python benchmarks/bench_norm_fold.py --out "$OUT/norm_fold.json"
  ;;
c8)
  TAIL=60 stage norm_fold_warps 400 python benchmarks/bench_norm_fold.py --out "$OUT/norm_fold_warps.json" \
    --configs 32:4:8 32:4:8:1 32:4:8:2 16:4:8 16:4:8:1 64:4:4:1 64:4:4:2 32:8:8:1 32:2:8:1 128:4:4:1
  ;;
c9)
  TAIL=40 stage gpu_suite 560 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu \
    tests/kernels/test_kernels_gpu.py tests/test_graph_runner.py tests/kernels/test_fold_gpu.py \
    tests/kernels/test_mla_rope_gpu.py
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
