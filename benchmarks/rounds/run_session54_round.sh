#!/usr/bin/env bash
# The fifty-fourth session's device round: the decoder layer's input RMSNorm folded into the CUDA-core q_a + kv_a
# pair (the input_norm fusion, NORM_PRE with the residual in gemv_fma_pair_kernel: one launch fewer a layer); the
# H200 tables at HEAD where an H200 comes.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session54_round.sh e1   (one device call each, < 10 min)
# e1 (any card): the GPU tests of the fold (the CUDA-core pair's test_gemv_fma_pair_norm and the input_norm_fold
#     tests, whose graph replay case then ran the new fold by the default dispatch), the fold alone against the norm launch + the plain pair (bench_norm_fold.py),
#     then the 61-layer step paired at 1k, T = 1, 2, 4, 8, uniform routing: the defaults against input_norm on
#     (SGLANG_EAGLE3_NO_FUSE without it); then the invariance probe with it on (every verify row the bits of its
#     decode).
# e2: on an H200, the tables docs/BENCHMARKS.md section 0 calls current (head_tables); on another card, e1.
# e3 (any card): e1's fold tests ran out of their 150 s (compiling): again with room; then the fifty-second session's
#     unrun c5 (run_session52_round.sh): gate_up's layout probe over the experts' words alone (no scales), so that
#     its read-only kernel reads what the probe reads.
# Ran (fresh H100s; five calls refused, ~14 device minutes): e2 at 47786e0 (no H200: e1), e3 at b34efa4, e2 at
# b34efa4 (named nvidia-h200, an H100 came: e1 again). Not run: e2 on an H200.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: e1 | e2 | e3}
record_gpu
if [ "$part" = e2 ]; then part=$(on_h200 e2 e1); fi
# the default NO_FUSE without input_norm (router_topk,q_rope_attn,route_shared_down,rope_wuk when this ran)
FOLD="SGLANG_EAGLE3_NO_FUSE=$(python -c 'from sglang_eagle3 import env
print(",".join(f for f in env.DEFAULT_NO_FUSE.split(",") if f != "input_norm"))')"
fold_tests() {  # fold_tests SECONDS: the GPU tests of both folds
  TAIL=8 stage tests_fold "$1" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
    tests/kernels/test_kernels_gpu.py tests/kernels/test_fold_gpu.py -k "gemv_fma_pair_norm or input_norm_fold"
}
case $part in
e1) fold_tests 150
    TAIL=12 stage norm_fold 60 python benchmarks/bench_norm_fold.py --tokens 1 2 4 8 --configs 64:4:8 \
      --out "$OUT/norm_fold.json"
    TAIL=30 stage paired_fold 230 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' "$FOLD" --paired 80 \
      --out "$OUT/paired_fold.json"
    TAIL=14 stage probe_fold 120 env "$FOLD" python benchmarks/probe_invariance.py --layers 3 --contexts 1024 \
      --widths 2 4 --out "$OUT/probe_fold.json" ;;
e3) fold_tests 420
    TAIL=5 stage layout_words 90 python benchmarks/bench_moe_layout.py --tokens 1 4 8 --no-scales \
      --out "$OUT/moe_layout_words.json" ;;
e2) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
