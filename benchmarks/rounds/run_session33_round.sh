#!/usr/bin/env bash
# Thirty-third session's device round (H200).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session33_round.sh g1   (then g2 ...; one device call each)
# What each part found (results benchmarks/results/h200/*_<commit>*, logs session33_g<N>_<commit>.txt; every ratio
# is bench_verify_graph.py --paired 200 against the defaults; g1 and g8 run only at their own commits, whose code and
# variant files were removed since; g2's variant, gemv_pair_rows8.py, stays):
# g1 (dc8b6fe): the CUDA-core forms' first K steps' weight tiles loaded before the PDL wait (PRELOAD; same bits: 65
#     GPU tests passed). Alone faster (the pair 5.42 -> 4.87 us at T=1, 10.2 -> 9.4 at T=4); in the step paired
#     slower or level: q_b both steps x0.997 / x1.039 / x1.026 at T = 1 / 4 / 8 (T=4: 144 -> 176 registers), the
#     pair's first two of four x1.022 / x0.997 / x1.001, the pair at 2 weight rows x1.011-1.027 (other bits), with
#     all four steps before the wait x1.024-1.086. Removed (code at dc8b6fe).
# g2 (853c838): the pair with 8 rows of x a program: alone 17.8 -> 22.2 us at T=8, 32.8 -> 40.4 at T=16; the step
#     paired x1.041 / x1.040 at T=8 (1k / 8k), x1.0001 / x1.0009 at T=4 (unchanged code there: the noise). Not kept.
# g3 (041d992): the shared-down side stream stands: without any overlap the step is x1.0475 / x1.0464 at decode
#     (1k / 8k) and x1.0247 / x1.0244 at verify of 4 (the fourth session measured ~2% at decode before PDL).
# g4 (ae53bc0): q_rope_attn (q's rope in the MLA kernel) x1.028-1.037 of the defaults, with mla_k_path (its k path
#     on the side stream) x1.022-1.034; mla_k_path alone inert (x0.999-1.001): the defaults stand. q_rope_attn's
#     GPU tests: 35 passed.
# g5 (1e509eb): MLA's W_UV per head on the CUDA cores: 80 GPU tests passed (per-head form, GEMV, model forward,
#     graph replay); the probe: every verify row bit-identical to its decode (T = 2, 4, 8; 1k, 8k). W_UV on the
#     tensor cores (variants/gemv_w_uv_tc.py) x1.0187 / x1.0199 of it at decode (1k / 8k), x0.9976 / x0.9975 at
#     verify of 4, x0.9826 / x0.9953 at 8. Kept (one form an engine, as the router + shared pair).
# g6 (dfe3d74): W_UV at one warp of 32 lanes x1.062 / x0.996 at T = 1 / 4, at 2 weight rows x1.003 / x1.0003: the
#     config stays (variant files removed). The section 0 table at dfe3d74 (verify_graph_dfe3d74.json): decode 3.88 /
#     4.02 ms at 1k / 8k (2.70x / 2.59x the floor), verify of 4 5.88 / 6.02. ~22 of 30 device minutes in g1-g6.
# g7 (e9257aa): end to end, single stream: baseline 241.7 tok/s, EAGLE-3 k=3 pinned 3.0 403.7 (e2e_single_e9257aa.json;
#     the thirty-first session's 238.8 / 412.7 on another machine). ~25 of 30 device minutes in all.
# g8 (19dda76): MLA's W_UK per head on the CUDA cores (gemv_fma_ncols_kernel, lanes along N): 42 GPU tests passed
#     (W_UV's and W_UK's per-head forms), the probe at 1k identical; paired, W_UK on the tensor cores x0.9996 of it at
#     decode (level) and x0.9789 at verify of 4: the CUDA-core W_UK costs 2.1% there for nothing. Removed (code at
#     19dda76). ~28.1 of 30 device minutes in all.
# g9 (prepared, not run: the device time ran out): what this session left unrun at W_UV on the CUDA cores.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: g1 ..}
V=benchmarks/variants
case $part in
g1)  # The CUDA-core forms' weight tiles loaded before the PDL wait (PRELOAD): the same bits (GPU tests), the
     # router + shared pair alone at its variants, then the step paired at 1k, T = 1 / 4 / 8, against each
     # variant: q_b's two steps before the wait, the pair's first two of four, the pair at 2 weight rows a
     # program with and without all four before the wait, and q_b + that pair together.
  TAIL=8 stage fma_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_kernels_gpu.py -k "gemv_fma"
  TAIL=40 stage launches 120 python benchmarks/bench_gemv_launches.py --only router+shared --tokens 1 4 8 \
    --out "$OUT/gemv_launches_preload.json"
  TAIL=50 stage paired_preload 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $V/gemv_fma_qb_preload2.py $V/gemv_pair_preload2.py $V/gemv_pair_bn2.py \
    $V/gemv_pair_bn2_preload4.py $V/gemv_fma_qb_preload2.py+$V/gemv_pair_bn2_preload4.py \
    --out "$OUT/paired_preload.json"
  ;;
g2)  # The pair with 8 rows of x a program (one program a weight block at T = 8, where 4 rows make two): alone at
     # T = 8 and 16, then the step paired at T = 4 (unchanged there: the noise) and 8, at 1k and 8k.
  TAIL=20 stage launches_rows8 120 python benchmarks/bench_gemv_launches.py --only router+shared --tokens 8 16 \
    --out "$OUT/gemv_launches_rows8.json"
  TAIL=30 stage paired_rows8 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 4 8 --eager-iters 1 --graph-iters 5 --paired 200 --kernels-from $V/gemv_pair_rows8.py \
    --out "$OUT/paired_rows8.json"
  ;;
g3)  # The shared expert's down projection on a side stream (the one overlap on by default, last timed in the fourth
     # session, before PDL): the step paired without any overlap against the default, T = 1 / 4 at 1k and 8k.
  TAIL=30 stage paired_overlap 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 --overlap-variants shared_down none \
    --out "$OUT/paired_overlap.json"
  ;;
g4)  # g3 found the side stream worth 2.4-4.7% now: MLA's k path beside q_b and W_UK (overlap mla_k_path, with the
     # q_rope_attn fusion that moves q's rope into the MLA kernel; last timed unpaired in the sixth session) paired
     # against the defaults, and q_rope_attn alone (mla_k_path alone is inert: the cross product's fourth setting),
     # then q_rope_attn's GPU tests.
  TAIL=30 stage paired_k_path 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 --overlap-variants shared_down shared_down,mla_k_path \
    --env-variants '' SGLANG_EAGLE3_NO_FUSE=input_norm,router_topk,route_shared_down,rope_wuk \
    --out "$OUT/paired_k_path.json"
  TAIL=8 stage q_rope_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/kernels/test_mla_rope_gpu.py
  ;;
g5)  # MLA's W_UV per head on the CUDA cores (gemv_fma_kernel with HEADS; fma_form): GPU tests (the per-head form,
     # the GEMV, model forward and graph replay), decode == verify bit for bit on the Kimi slice (the probe), then
     # the step paired against W_UV on the tensor cores (variants/gemv_w_uv_tc.py) at T = 1 / 4 / 8, 1k and 8k.
  TAIL=10 stage tests_w_uv 240 python -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
    -k "gemv_fma or model_forward or graph_replay"
  TAIL=30 stage probe 170 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 --widths 2 4 8 \
    --out "$OUT/probe.json"
  TAIL=30 stage paired_w_uv 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 --kernels-from $V/gemv_w_uv_tc.py \
    --out "$OUT/paired_w_uv.json"
  ;;
g6)  # W_UV at two other CUDA-core configs (one warp of 32 lanes: no cross-warp sum; 2 weight rows a program) paired
     # at T = 1 / 4, 1k; then the step table of docs/BENCHMARKS.md section 0 at this commit.
  TAIL=20 stage paired_w_uv_cfg 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $V/gemv_w_uv_lanes32.py $V/gemv_w_uv_bn2.py --out "$OUT/paired_w_uv_cfg.json"
  TAIL=20 stage verify_graph 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
g7)  # the Kimi slice end to end, single stream, at W_UV on the CUDA cores (section 0's rows)
  TAIL=6 stage e2e_single 150 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --out "$OUT/e2e_single.json"
  ;;
g8)  # MLA's W_UK per head on the CUDA cores too (gemv_fma_ncols_kernel: N-contiguous weights), in the last device
     # minutes: its GPU tests (with W_UV's), the step paired against W_UK on the tensor cores (T = 1 / 4, 1k), the
     # probe at 1k.
  TAIL=8 stage tests_heads 90 python -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
    -k "gemv_fma_heads"
  TAIL=20 stage paired_w_uk 90 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 100 --kernels-from $V/gemv_w_uk_tc.py \
    --out "$OUT/paired_w_uk.json"
  TAIL=12 stage probe 90 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 --widths 2 4 8 \
    --out "$OUT/probe.json"
  ;;
g9)  # the CUDA engine tests (speculative == plain with graphs on), the probe at 8k, the kernel table at HEAD
  TAIL=12 stage engine_tests 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 290 \
    tests/gpu/test_cuda_engine.py
  TAIL=12 stage probe 120 python benchmarks/probe_invariance.py --layers 3 --contexts 8192 --widths 2 4 8 \
    --out "$OUT/probe.json"
  TAIL=45 stage kernels 240 python benchmarks/bench_kernels.py --out "$OUT"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
