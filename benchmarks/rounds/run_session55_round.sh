#!/usr/bin/env bash
# The fifty-fifth session's device round: the derived sm_120 table (our users' RTX PRO 6000 Blackwell; no sm_120 card
# is lent) run for real on the card at hand, SGLANG_EAGLE3_EMULATE_GPU=sm_120 (its configs, 188 SMs for the grids,
# 99 KB a block) with DISABLE_MMA_V3=1 (Triton's dots on mma.sync, as sm_120 compiles them); the H200 tables at HEAD
# where an H200 comes.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session55_round.sh f1   (one device call each, < 10 min)
# f1 (any card): emulating sm_120: the kernel GPU tests (tests/kernels, -m gpu), then the invariance probe (every
#     verify row the bits of its decode) at 1k and 8k, widths 2..8.
# f2 (any card): emulating sm_120: the graph runner, overlap, layout and CUDA engine GPU tests (speculative output
#     with graphs and kernels equal to the reference's); then what the sm_120 configs cost on this card (not on
#     sm_120): the 61-layer step at 1k, T = 1, 2, 4, 8, uniform routing, the card's own table against the emulation,
#     paired.
# f3 (any card): the kernel table emulating sm_120.
# f1b, f1c (any card): emulating sm_120, the kernel GPU tests f1 did not reach (its 420 s ran out at the 220th of 534),
#     in two calls: f1b the last INT4 dot-path cases, the RMSNorm, rotary and latent-cache tests and the GEMVs; f1c
#     the CUDA-core pairs and heads, the model-level kernel tests, the MoE tile path, sampling, test_mla_rope_gpu.py
#     and test_pdl_gpu.py.
# h: on an H200 the tables docs/BENCHMARKS.md section 0 calls current (head_tables); on another card, f1b (f1 ran in
#    the fifty-fifth session; the fifty-sixth took this script on for the parts left).
# Ran (ten calls, eight refused for want of a machine, ~17 of the 30 device minutes): h at 7f22153, named
# nvidia-h200, an H100 came: f1, whose kernel tests ran out of their 420 s at 220 of 534 (compiling under
# DISABLE_MMA_V3; 206 passed, 14 skipped, none failed); then on the same lease, 175 s, the CUDA engine tests of f2
# alone (the command is the first line of session55_f2_engine_sm120_7f22153.txt). Not run: the rest of f1's kernel
# tests (the last of test_fused_moe_int4_dot_path_exact on), f2's other tests and paired step, f3, h on an H200.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: f1 | f1b | f1c | f2 | f3 | h}
record_gpu
if [ "$part" = h ]; then part=$(on_h200 h f1b); fi
EMU=(SGLANG_EAGLE3_EMULATE_GPU=sm_120 DISABLE_MMA_V3=1)
case $part in
f1) TAIL=25 stage tests_kernels_sm120 420 env "${EMU[@]}" python -m pytest -q -p no:cacheprovider -o addopts="" \
      -m gpu -rfE tests/kernels
    TAIL=14 stage probe_sm120 150 env "${EMU[@]}" python benchmarks/probe_invariance.py --layers 3 \
      --contexts 1024 8192 --widths 2 4 6 8 --out "$OUT/probe_sm120.json" ;;
f2) TAIL=25 stage tests_engine_sm120 300 env "${EMU[@]}" python -m pytest -q -p no:cacheprovider -o addopts="" \
      -m gpu -rfE tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
    TAIL=30 stage paired_sm120 270 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' "${EMU[*]}" \
      --paired 40 --out "$OUT/paired_sm120.json" ;;
f1b|f1c) K=tests/kernels/test_kernels_gpu.py
    if [ "$part" = f1b ]; then
      IDS=($K::test_fused_moe_int4_dot_path_exact $K::test_rms_norm $K::test_rotary_bit_identical
           $K::test_latent_to_cache $K::test_gemv_projections $K::test_gemv_fma)
    else
      IDS=($K::test_gemv_fma_pair $K::test_gemv_fma_pair_plain $K::test_gemv_fma_pair_norm $K::test_gemv_fma_heads
           $K::test_gemv_fma_lanes_first $K::test_gemv_q_b_with_q_a_layernorm $K::test_gemv_pair_q_a_kv_a
           $K::test_gemv_pair_router_and_shared_expert $K::test_model_forward_kernels_vs_reference
           $K::test_kernels_per_moe_layer $K::test_graph_replay_equals_eager $K::test_moe_align_real_shapes
           $K::test_fused_moe_int4_large_batch_vs_reference $K::test_fused_moe_int4_swap_vs_reference
           $K::test_fused_moe_int4_tile_token_independent_of_batch $K::test_fused_moe_int4_graph_replay
           $K::test_gumbel_argmax_kimi_vocab $K::test_top_threshold_kimi_vocab $K::test_top_threshold_edges
           $K::test_filters_kernel_vs_sort_kimi_vocab tests/kernels/test_mla_rope_gpu.py tests/kernels/test_pdl_gpu.py)
    fi
    TAIL=25 stage "tests_${part}_sm120" 560 env "${EMU[@]}" python -m pytest -q -p no:cacheprovider -o addopts="" \
      -m gpu -rfE "${IDS[@]}" ;;
f3) TAIL=45 stage kernels_sm120 220 env "${EMU[@]}" python benchmarks/bench_kernels.py --out "$OUT" ;;
h) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
