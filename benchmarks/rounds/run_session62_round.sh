#!/usr/bin/env bash
# The sixty-second session's device round (written for the next session that gets device time: the sixty-first and
# sixty-second had none). On an H200 the tables section 0 calls current (last measured on an H200 at 53f310f); on
# any card the GPU tests of what changed since the last device run: the kernel launchers' audit (the top_threshold
# kernel's row without candidates, the per-head gemv with a norm, INT4 group sizes; 6f9b90e), and the engine's GPU
# tests (graphs, overlap, CUDA engine).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session62_round.sh h | g1
# h:  on an H200, head_tables (the step at 1k and 8k, T = 1..8, with the slice's routing and uniform, and the kernel
#     table); on another card, g1.
# g1 (any card): the kernels' GPU tests (sampling, MLA, MoE, gemv against their references) and the engine's.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: h | g1}
record_gpu
[ "$part" = h ] && part=$(on_h200 h g1)
case $part in
h) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
g1) TAIL=25 stage tests_kernels 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/kernels/test_kernels_gpu.py tests/kernels/test_kernel_api.py
    TAIL=25 stage tests_engine 280 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/test_graph_runner.py tests/test_overlap.py tests/gpu ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
