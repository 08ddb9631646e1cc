#!/usr/bin/env bash
# The sixty-seventh session's device round.
# k e: run_session66_round.sh's parts (the 9 PDL kernel GPU tests owed since the sixty-fourth session and the CUDA
#    engine's grammar / sampled / strict tests): ran first, at a56ebd7 on an H100, all passed
#    (results/h100/session67_owed_tests_a56ebd7.*).
# g: every GPU test outside tests/kernels at HEAD (the engine, graph runner, overlap, loaders, routing bench): the
#    sixty-fifth session's runtime and server changes (grammar compilers, auto parsers) have met only part e. Named
#    file by file: the device has no fastapi, so collecting tests/server (no GPU tests) fails there.
#    Ran at dc7dca6 on an H100 (the first try, over all of tests, failed at collection for that reason; the second
#    as below with a 500 s limit): 57 passed, 1 skipped in 467 s (results/h100/session67_tests_gpu_not_kernels_*).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session67_round.sh g
# Results land in $OUT; copied to benchmarks/results/<gpu>/session67_*_<commit>.txt.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: g}
record_gpu
case $part in
g) TAIL=30 stage tests_gpu_not_kernels "${T_G:-540}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      -rfE --durations=10 tests/gpu tests/test_graph_runner.py tests/test_overlap.py tests/loaders/test_layouts.py \
      tests/test_bench_routing.py ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
