#!/usr/bin/env bash
# Thirty-seventh session's device round (H200): what the thirty-sixth left unrun after lanes first went on by default.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session37_round.sh k1   (then k2; one device call each, < 10 minutes)
# k1: the CUDA engine tests (speculative == plain with graphs on; the thirty-sixth session changed the Engine's request
#     semantics on CPU only), then the step table of section 0 at the lanes-first default (1k and 8k, T = 1..8).
# k2: the kernel table at HEAD, the invariance probe at 8k, and the prefetch's mechanism (j2 of the thirty-fifth
#     session's script: why the L2 prefetch plans lose at decode).
# k3: MLA's q_a + kv_a pair on the CUDA cores (triton_gemv_fma_pair without w2_up, new this session;
#     SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=1 in the package): its GPU tests, the launch alone at its configs, the step paired against the tensor-core
#     pair at 256 lanes (gemv_qkv_fma.py, the pair's config) and 128 (gemv_qkv_fma_l128.py), 1k and 8k, T = 1 / 2 /
#     4 / 8, and the invariance probe with each (every verify row == its token's decode).
# k4: after q_a + kv_a went on the CUDA cores by default (128 lanes; k3 and a second paired run chose it): the CUDA-core
#     GPU tests, the probe at 8k, the CUDA engine tests (this session's scheduler and TP-worker changes), end to end against SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 alternating.
# k5 (prepared for the next device session, not run): the step table at the q_a + kv_a default (section 0's is at
#     8c4644c, before it), the CUDA engine tests in full (k4 ran out at 14 of 17), end to end against
#     SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 alternating.
# k6 (prepared, not run): the step paired at 1k / 8k, T = 1 / 4 / 8, against the defaults: the router + shared pair at
#     128 lanes (gemv_pair_l128.py: q_a + kv_a's 128 lanes beat 256 in the step though not alone), q_a + kv_a at 8
#     rows of x a program (gemv_qkv_rows8.py: its cost at T = 8; both define fma_pair_config, so they do not combine
#     with "+"), and q_a + kv_a back on the tensor cores
#     (gemv_qkv_tc.py: the change's size in the same run).
# k7 (prepared, not run): the step paired with o_proj on the CUDA cores (gemv_fma_oproj.py: level with the tensor
#     cores alone; q_a + kv_a gained far more in the step than alone), the shared expert's down on them
#     (gemv_fma_short_k.py, K = 256 at one warp; both define fma_form, so they do not combine with "+"); then the
#     invariance probe with each (verify rows == decode).
# Results land in $OUT; copy them to benchmarks/results/h200/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: k1 ..}
shift
case $part in
k1)
  TAIL=12 stage engine_tests 230 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 220 \
    tests/gpu/test_cuda_engine.py
  TAIL=20 stage verify_graph 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 3 4 5 6 7 8 --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
k2)
  TAIL=45 stage kernels 240 python benchmarks/bench_kernels.py --out "$OUT"
  TAIL=12 stage probe 120 python benchmarks/probe_invariance.py --layers 3 --contexts 8192 --widths 2 4 8 \
    --out "$OUT/probe.json"
  TAIL=70 stage l2_prefetch 150 python benchmarks/bench_l2_prefetch.py --tokens 1 4 --out "$OUT/l2_prefetch.json"
  ;;
k3)
  V=benchmarks/variants
  TAIL=8 stage pair_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "gemv_fma_pair"
  TAIL=20 stage launches_qkv 90 python benchmarks/bench_gemv_launches.py --only q_a+kv_a --tokens 1 2 4 8 \
    --out "$OUT/gemv_launches_qkv.json"
  TAIL=40 stage paired_qkv 330 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $V/gemv_qkv_fma.py $V/gemv_qkv_fma_l128.py --out "$OUT/paired_qkv.json"
  TAIL=14 stage verdicts 30 python benchmarks/report.py "$OUT/paired_qkv.json"
  TAIL=20 stage probe_qkv 100 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 --widths 2 4 8 \
    --kernels-from $V/gemv_qkv_fma.py $V/gemv_qkv_fma_l128.py --out "$OUT/probe_qkv.json"
  ;;
k4)
  TAIL=8 stage fma_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "gemv_fma or kernels_per_moe_layer or model_forward"
  TAIL=12 stage probe 100 python benchmarks/probe_invariance.py --layers 3 --contexts 8192 --widths 2 4 8 \
    --out "$OUT/probe.json"
  TAIL=12 stage engine_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/gpu/test_cuda_engine.py
  TAIL=14 stage e2e 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 --repeat-variants 2 \
    --out "$OUT/e2e.json"
  ;;
k5)
  TAIL=12 stage engine_tests 230 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 220 \
    tests/gpu/test_cuda_engine.py
  TAIL=20 stage verify_graph 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 3 4 5 6 7 8 --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
k6)
  V=benchmarks/variants
  TAIL=40 stage paired 400 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $V/gemv_pair_l128.py $V/gemv_qkv_rows8.py $V/gemv_qkv_tc.py --out "$OUT/paired.json"
  TAIL=14 stage verdicts 30 python benchmarks/report.py "$OUT/paired.json"
  TAIL=14 stage e2e 150 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 --repeat-variants 2 \
    --out "$OUT/e2e.json"
  ;;
k7)
  V=benchmarks/variants
  TAIL=40 stage paired 400 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $V/gemv_fma_oproj.py $V/gemv_fma_short_k.py --out "$OUT/paired_oproj.json"
  TAIL=14 stage verdicts 30 python benchmarks/report.py "$OUT/paired_oproj.json"
  TAIL=20 stage probe 100 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 --widths 2 4 8 \
    --kernels-from $V/gemv_fma_oproj.py $V/gemv_fma_short_k.py --out "$OUT/probe_oproj.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
