#!/usr/bin/env bash
# The fifty-ninth session's device round: the engine's GPU tests at HEAD on the card's own table (the fifty-eighth
# session changed the scheduler's admission under KV pressure and what the accept counters count after its last GPU
# run), the slice end to end at HEAD, and on an H200 the tables section 0 calls current (not measured on an H200
# since 53f310f, whose gate_up ran the chunk sums removed after it).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session59_round.sh h | g1
# h:  on an H200, head_tables (the step at 1k and 8k, T = 1..8, with the slice's routing and uniform, and the kernel
#     table); on another card, g1.
# g1 (any card): the graph runner, overlap and CUDA engine GPU tests (speculative output with graphs and kernels
#     equal to the reference's, the fallback counters, sampling, grammar, adaptive k, KV pressure), then the slice end
#     to end (bench_e2e.py, batch 1, uniform routing): the target alone and k = 3 at an accept length pinned to 3.0.
# Ran (two calls, the first refused for want of a machine): h at aae5016 on an H100, so g1; run from `git archive` of
# that commit carried as .carry/head.tar.gz (the helpers' uncommitted edits stayed here); results
# benchmarks/results/h100/session59_g1_*_aae5016*, docs/BENCHMARKS.md section 1, "Fifty-ninth session".
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: h | g1}
record_gpu
[ "$part" = h ] && part=$(on_h200 h g1)
case $part in
h) T_STEP=200 T_STEP_UNIFORM=150 T_KERNELS=230 head_tables ;;
g1) :
    TAIL=25 stage tests_engine 330 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rfE \
      tests/test_graph_runner.py tests/test_overlap.py tests/gpu
    TAIL=6 stage e2e_k3_uniform 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 \
      --max-new-tokens 96 --repeat 2 --k 3 --simulate-accept 3.0 --routing uniform --out "$OUT/e2e_k3_uniform.json" ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
