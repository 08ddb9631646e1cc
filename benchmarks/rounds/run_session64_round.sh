#!/usr/bin/env bash
# The sixty-fourth session's device round: what no GPU has run yet, most important first, in one call.
# g: the sixty-second session's top_threshold NaN guard (its kernel tests, ~60 s), strict thinking on CUDA graphs
# (7543836, tests/gpu/test_strict_thinking_cuda.py), then the engine's grammar rounds (host masks request-major since
# 3a93834) and sampled speculation. h: on an H200 the tables section 0 calls current (last at 53f310f), else g.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session64_round.sh g | h
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
# Ran at f732076 on one H200 lease (after two failed starts and two refusals): g (all passed), then h with shorter
# stage limits (T_STEP=190 T_STEP_UNIFORM=140 T_KERNELS=220 head_tables), then `pytest -m gpu tests/gpu` and the kernel
# GPU tests g leaves out (stage limit 400 s); results benchmarks/results/h200/*_f732076.*, BENCHMARKS sections 0 and 1.
# k was never started (too little device time left); it is the next round's first call (T_K sets its limit).
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: g | h | k}
record_gpu
[ "$part" = h ] && part=$(on_h200 h g)
case $part in
h) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
g) TAIL=25 stage tests_top_threshold 90 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/kernels/test_kernels_gpu.py -k "top_threshold"
   TAIL=25 stage tests_strict_thinking 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/gpu/test_strict_thinking_cuda.py
   TAIL=25 stage tests_engine 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/gpu/test_cuda_engine.py -k "grammar or sampled" ;;
k) # the kernel GPU tests no GPU has run since the last kernel change (listed in the file, the launchers' audit's first)
   TAIL=25 stage tests_kernels_not_run "${T_K:-300}" python -c "import sys, pytest; sys.exit(pytest.main(['-q', \
      '-p', 'no:cacheprovider', '-o', 'addopts=', '-m', 'gpu', '-rfE'] + open(sys.argv[1]).read().split()))" \
      benchmarks/rounds/session64_kernel_tests_not_run.txt ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
