#!/usr/bin/env bash
# The sixty-third session's device round. g1 first (any card): the GPU tests of what changed since the last device
# run (the sixty-first to sixty-third sessions had none until now): the kernels' (the top_threshold NaN guard and
# the launchers' audit, 6f9b90e) and the engine's, strict thinking on CUDA graphs among them (7543836). Then, with
# the device time left, h: on an H200 the tables section 0 calls current (last measured on an H200 at 53f310f).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session63_round.sh g1 | h
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: g1 | h}
record_gpu
[ "$part" = h ] && part=$(on_h200 h g1)
case $part in
h) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
g1) TAIL=25 stage tests_kernels 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/kernels/test_kernels_gpu.py tests/kernels/test_kernel_api.py
    TAIL=25 stage tests_engine 270 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/test_graph_runner.py tests/test_overlap.py tests/gpu ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
