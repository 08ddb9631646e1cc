#!/usr/bin/env bash
# The fifty-eighth session's device round: the rest of the fifty-fifth session's sm_120 emulation (our users' RTX PRO
# 6000 Blackwell; no sm_120 card is lent), SGLANG_EAGLE3_EMULATE_GPU=sm_120 (its configs, 188 SMs for the grids,
# 99 KB a block) with DISABLE_MMA_V3=1 (Triton's dots on mma.sync, as sm_120 compiles them), in two calls that fit
# the device tool's 600 s each (run_session55_round.sh f2 + f3 is 790 s of stage limits):
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session58_round.sh e1
# e1 (any card): emulating sm_120, the graph runner, overlap, layout and CUDA engine GPU tests (speculative output
#     with graphs and kernels equal to the reference's), then the kernel table.
# e2 (any card): what the sm_120 configs cost on this card (not on sm_120): the 61-layer step at 1k, T = 1, 2, 4, 8,
#     uniform routing, the card's own table against the emulation, paired.
# Ran (eleven calls, nine refused for want of a machine, ~23 of the 30 device minutes): e1 then e2 at 2397826 on one H100
# lease; results benchmarks/results/h100/session58_*_2397826*, docs/BENCHMARKS.md section 1, "Fifty-eighth session".
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: e1 | e2}
record_gpu
EMU=(SGLANG_EAGLE3_EMULATE_GPU=sm_120 DISABLE_MMA_V3=1)
case $part in
e1) TAIL=25 stage tests_engine_sm120 300 env "${EMU[@]}" python -m pytest -q -p no:cacheprovider -o addopts="" \
      -m gpu -rfE tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
    TAIL=45 stage kernels_sm120 220 env "${EMU[@]}" python benchmarks/bench_kernels.py --out "$OUT" ;;
e2) TAIL=30 stage paired_sm120 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --tokens 1 2 4 8 --eager-iters 1 --graph-iters 5 --routing uniform --env-variants '' "${EMU[*]}" \
      --paired 40 --out "$OUT/paired_sm120.json" ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
