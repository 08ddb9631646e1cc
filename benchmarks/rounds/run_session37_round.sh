#!/usr/bin/env bash
# Thirty-seventh session's device round (H200): what the thirty-sixth left unrun after lanes first went on by default.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session37_round.sh k1   (then k2; one device call each, < 10 minutes)
# k1: the CUDA engine tests (speculative == plain with graphs on; the thirty-sixth session changed the Engine's request
#     semantics on CPU only), then the step table of section 0 at the lanes-first default (1k and 8k, T = 1..8).
# k2: the kernel table at HEAD, the invariance probe at 8k, and the prefetch's mechanism (j2 of the thirty-fifth
#     session's script: why the L2 prefetch plans lose at decode).
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
*) echo "unknown part $part"; exit 2 ;;
esac
collect
