#!/usr/bin/env bash
# Thirty-first session's device round (H200).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session31_round.sh e1   (then e2 ...; one device call each)
# What each part found (results benchmarks/results/h200/*_<commit>*, logs session31_e<N>_<commit>.txt; every ratio
# is bench_verify_graph.py --paired 200 against the defaults):
# e1 (2d98eb2): CUDA engine tests at page 64: 17 passed. Launches left out whole: both norms x0.999 (T=1), rotary
#     x1.0065, routing x1.0024, all three x0.965; the zero stand-in of the norms x0.967.
# e2 (a2f799b): zeros against noise: rms_norm_zero x0.969, rms_norm_noise x0.999 (the zero stream itself is 3%
#     faster); MLA split zero / noise x0.936 / x0.937; MoE zero x0.857 (T=4 x0.738). End to end at page 64:
#     221.3 / 417.5 tok/s.
# e3 (0982baf): the one-wave rule (fewer stages so the router + shared pair's 200 programs fit at once): alone
#     10.25 -> 12.13 us, the step 2.0-2.9% slower: removed.
# e4 (4b17ccd): the dense projections' work x0.553 of decode at 1k (x0.683 at T=4); MLA merge zero / noise
#     x0.986 / x0.987; GEMV + MLA split + MoE all gone x0.340.
# e5 (a111e1d): other tensor-core configs of q_a + kv_a and the router + shared pair, alone and paired: none pays.
# e6 (391ae14): the router + shared pair on the CUDA cores: 71 GPU tests passed; alone 5.5 / 8.0 / 10.3 / 17.9 us
#     at T = 1 / 2 / 4 / 8 against 10.1-10.4; the tensor-core pair x1.079 of it at decode, x0.993-0.994 at T=4.
# e7 (c7fb9f7): end to end 238.8 / 412.7 tok/s; the step table of BENCHMARKS.md section 0.
# e8 (prepared, not run: the device time ran out): the invariance probe at the Kimi slice with the CUDA-core pair
#     (verify rows bit-identical to decode), and the cost of the pair at a verify of 8 in the step, paired.
# e1: what the thirtieth session left unrun at the engine's page size 64 (the CUDA engine tests, whose pool-sizing
#     test read 16-token pages), then what each small launch costs in the step by itself: the paired step at 1k,
#     T = 1 and 4, the defaults against each launch left out whole (benchmarks/ablations/*_skip.py: the dispatcher
#     returns without launching) and against its work left out with the launch kept (the thirtieth session's
#     stand-ins), in one run.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: e1 .. e8}
A=benchmarks/ablations
case $part in
e1)
  TAIL=12 stage engine_tests 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 290 \
    tests/gpu/test_cuda_engine.py
  TAIL=60 stage paired_launches 290 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $A/rms_norm_skip.py $A/rms_norm_zero.py $A/rotary_skip.py $A/rotary_noop.py \
    $A/moe_topk_skip.py $A/moe_topk_const.py $A/rms_norm_skip.py+$A/rotary_skip.py+$A/moe_topk_skip.py \
    --out "$OUT/paired_launches.json"
  ;;
e2)  # e1 found the all-zero stream of rms_norm_zero.py 3% faster while leaving the norm launches out whole saved
     # 0.1%: the same stand-ins storing a pseudo-random pattern (ablations/*_noise.py) beside the zero ones, and
     # the Kimi slice end to end at the engine's page size 64 (the section-0 rows were at 16)
  TAIL=40 stage paired_fill 260 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $A/rms_norm_zero.py $A/rms_norm_noise.py $A/mla_split_zero.py $A/mla_split_noise.py \
    $A/moe_int4_gemv_zero.py --out "$OUT/paired_fill.json"
  TAIL=25 stage e2e_single 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --out "$OUT/e2e_single.json"
  ;;
e3)  # (re-running e3 needs a checkout of 0982baf: the rule, its knob and bench_gemv_wave.py were removed after it)
     # the skinny GEMM's one-wave rule (kernels/gemv.py one_wave: the router + shared pair at 2 stages, two blocks
     # a SM, instead of 3 and a second wave): GPU tests, the launches alone with and without it and other
     # configs (bench_gemv_wave.py), the step paired against SGLANG_EAGLE3_GEMV_WAVE=0
  TAIL=8 stage tests_gemv 200 python -m pytest -q -x -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
    -k "gemv_pair or one_wave or gemv_projections"
  TAIL=40 stage gemv_wave 200 python benchmarks/bench_gemv_wave.py --tokens 1 2 4 8 --out "$OUT/gemv_wave.json"
  TAIL=30 stage paired_wave 240 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 --env-variants "" SGLANG_EAGLE3_GEMV_WAVE=0 \
    --out "$OUT/paired_wave.json"
  ;;
e4)  # e3 refuted the one-wave rule (removed). The rest of the step priced with noise stand-ins: the dense projections'
     # work (ablations/gemv_noise.py: both GEMV kernels), MLA's merge (noise against zero); at 1k and 8k, T = 1, 4
  TAIL=40 stage paired_gemv 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $A/gemv_noise.py $A/mla_merge_zero.py $A/mla_merge_noise.py $A/mla_split_noise.py \
    $A/gemv_noise.py+$A/mla_split_noise.py+$A/moe_int4_gemv_zero.py --out "$OUT/paired_gemv.json"
  ;;
e5)  # e4 put the dense projections' work at 45% of decode (31.6 us a layer for ~17 us of bytes): their two widest
     # launches at other configs, alone (bench_gemv_launches.py: splits, K tiles, stages) and in the step paired
     # (benchmarks/variants/gemv_*.py swap in a gemv_config with one launch's config changed)
  V=benchmarks/variants
  TAIL=40 stage gemv_launches 150 python benchmarks/bench_gemv_launches.py --tokens 1 4 --repeat 1 \
    --out "$OUT/gemv_launches.json"
  TAIL=40 stage paired_gemv_cfg 260 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $V/gemv_rs_split5.py $V/gemv_rs_split7.py $V/gemv_qa_split3.py $V/gemv_qa_bk128.py \
    --out "$OUT/paired_gemv_cfg.json"
  ;;
e6)  # e5: no tensor-core config of the two widest launches pays. The router + shared pair on the CUDA cores
     # (kernels/gemv.py triton_gemv_fma_pair, fma_pair_form): GPU tests, the launch alone against the tensor-core
     # pair and other CUDA-core configs, the step paired against the tensor-core pair (variants/gemv_pair_tc.py) and
     # 2 rows of x a program (variants/gemv_pair_rows2.py)
  V=benchmarks/variants
  TAIL=10 stage tests_fma_pair 200 python -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
    tests/kernels/test_fold_gpu.py -k "gemv_fma_pair or gemv_pair or route or router or model_forward or \
    graph_replay or kernels_per_moe"
  TAIL=16 stage gemv_launches 120 python benchmarks/bench_gemv_launches.py --only router --tokens 1 2 4 8 \
    --repeat 1 --out "$OUT/gemv_launches.json"
  TAIL=20 stage paired_fma_pair 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $V/gemv_pair_tc.py $V/gemv_pair_rows2.py --out "$OUT/paired_fma_pair.json"
  ;;
e7)  # the session's last device minutes at the CUDA-core pair (e6: decode 7.3% faster, verify of 4 0.6% slower):
     # the Kimi slice end to end, single stream, and the step's table at T = 1, 2, 4, 8
  TAIL=6 stage e2e_single 150 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --out "$OUT/e2e_single.json"
  TAIL=14 stage verify_graph 150 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
e8)  # prepared for the next session
  TAIL=30 stage probe 240 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 --widths 2 4 8 \
    --out "$OUT/probe.json"
  TAIL=20 stage paired_pair_t8 240 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 --kernels-from benchmarks/variants/gemv_pair_tc.py \
    --out "$OUT/paired_pair_t8.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
