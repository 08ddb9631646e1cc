#!/usr/bin/env bash
# The sixty-third session's device round. g1 first (any card): the GPU tests of what changed since the last device
# run (the sixty-first to sixty-third sessions had none until now), in one call's time (the whole GPU suites take
# longer: the engine's alone 340 s on an H100, sixtieth session): the kernels' of the top_threshold NaN guard and
# the launchers' audit (6f9b90e), and the engine's strict thinking on CUDA graphs (7543836), grammar rounds (whose
# host rows changed with it) and sampled speculation. Then, with
# the device time left, h: on an H200 the tables section 0 calls current (last measured on an H200 at 53f310f).
# g0: the least of g1 (top_threshold's kernels, strict thinking on graphs) for a call on little device time.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session63_round.sh g1 | g0 | h
# Ran (about twenty calls; one ran, the rest refused or failed to start, ~20 of the 30 device minutes): g1 at 6377972
# on an H100 (results benchmarks/results/h100/session63_g1_*_6377972.txt): the kernel stage ran out of its 170 s (77
# passed, none failed, top_threshold's not reached), the engine stage's new test failed to import (tests/server needs
# fastapi, which the device lacks; fixed in 168f5c3, not rerun). g0 was never started: too little device time left.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: g1 | g0 | h}
record_gpu
[ "$part" = h ] && part=$(on_h200 h g1)
case $part in
h) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
g1) TAIL=25 stage tests_kernels 170 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/kernels/test_kernels_gpu.py tests/kernels/test_kernel_api.py \
      -k "top_threshold or gumbel or filters or gemv_fma or fused_moe_int4_gemv or kernel_api or mla_decode_verify"
    TAIL=25 stage tests_engine 280 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/gpu/test_strict_thinking_cuda.py tests/gpu/test_cuda_engine.py -k "strict or grammar or sampled" ;;
g0) TAIL=25 stage tests_kernels 60 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/kernels/test_kernels_gpu.py -k "top_threshold"
    TAIL=25 stage tests_engine 120 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/gpu/test_strict_thinking_cuda.py ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
