#!/usr/bin/env bash
# Thirty-third session's device round (H200).
#   GIT_COMMIT=<HEAD> bash benchmarks/run_session33_round.sh g1   (then g2 ...; one device call each)
# What each part found (results benchmarks/results/h200/*_<commit>*, logs session33_g<N>_<commit>.txt; every ratio
# is bench_verify_graph.py --paired 200 against the defaults):
# g1: (prepared)
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
*) echo "unknown part $part"; exit 2 ;;
esac
collect
