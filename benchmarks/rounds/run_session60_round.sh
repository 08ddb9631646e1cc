#!/usr/bin/env bash
# The sixtieth session's device round: on an H200 the tables section 0 calls current (last measured on an H200 at
# 53f310f, whose INT4 gate_up ran the chunk sums removed after it: HEAD runs the group sums), and on any card the
# engine's GPU tests at HEAD (the TP=1 worker path's start-up now reports its progress: the graph capture beats).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session60_round.sh h | g1
# h:  on an H200, head_tables (the step at 1k and 8k, T = 1..8, with the slice's routing and uniform, and the kernel
#     table); on another card, g1.
# g1 (any card): the graph runner, overlap and CUDA engine GPU tests (speculative output with graphs and kernels
#     equal to the reference's, the fallback counters, the TP=1 worker path with its start-up progress).
# Ran (22 calls, 21 refused for want of a machine): h at 5365466 on an H100, so g1; run from `git archive` of that
# commit carried as .carry/head.tar.gz; results benchmarks/results/h100/session60_g1_*_5365466*, docs/BENCHMARKS.md
# section 1, "Sixtieth session".
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: h | g1}
record_gpu
[ "$part" = h ] && part=$(on_h200 h g1)
case $part in
h) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
g1) TAIL=25 stage tests_engine 420 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/test_graph_runner.py tests/test_overlap.py tests/gpu ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
