#!/usr/bin/env bash
# The sixty-sixth session's device round: what no GPU has run yet, in one call.
# k: the 182 kernel GPU tests no GPU has run since the last kernel change (the sixty-fourth session's list,
#    benchmarks/rounds/session64_kernel_tests_not_run.txt; T_K sets the stage limit).
# e: the CUDA engine's grammar, sampled and strict-thinking tests at HEAD (runtime/grammar.py's compilers became an
#    LRU keyed by the special tokens a tag exposes in the sixty-fifth session; xgrammar from .carry/wheels).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session66_round.sh ke | k | e
# Results land in $OUT; copied to benchmarks/results/<gpu>/session66_*_<commit>.txt.
source "$(dirname "$0")/gpu_stages.sh"
parts=${1:?parts: any of k e}
record_gpu
case $parts in *k*)
  TAIL=25 stage tests_kernels_not_run "${T_K:-330}" python -c "import sys, pytest; sys.exit(pytest.main(['-q', \
     '-p', 'no:cacheprovider', '-o', 'addopts=', '-m', 'gpu', '-rfE'] + open(sys.argv[1]).read().split()))" \
     benchmarks/rounds/session64_kernel_tests_not_run.txt ;;
esac
case $parts in *e*)
  TAIL=25 stage tests_engine_grammar "${T_E:-220}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
     tests/gpu/test_cuda_engine.py tests/gpu/test_strict_thinking_cuda.py -k "grammar or sampled or strict" ;;
esac
collect
