#!/usr/bin/env bash
# Twentieth session's device round (H200): bash benchmarks/rounds/run_session20_round.sh PART, results under $OUT.
# Part "y1": where a round's wall time goes on the Kimi slice (host or GPU): bench_e2e.py --profile (the scheduler's
# wall time a step, the GPU kernel time in it, the host's Python functions), baseline and EAGLE-3 k=3 at a pinned
# accept length of 3.0; and which launch the "Memcpy DtoD" of every MoE layer in the 6-layer profile is (the
# profile with the shared expert's side stream, the default, and without it).
source "$(dirname "$0")/gpu_stages.sh"
# Part "y2": the overlap schedule (the next greedy round queued before the host reads the one in flight): the CUDA
# engine and graph runner GPU tests (with it on by default, and on against off), then end to end on the Kimi slice
# with it on and off, alternating twice in one process, then the profile with it on.
# Part "y3" (y2 at f6be864: GPU tests 27 passed; on / off alternating twice: baseline 200.6 / 200.9 against 190.3 /
# 195.4 tok/s, EAGLE-3 388.9 / 389.5 against 377.2 / 377.8; a round's wall 7.165 -> 6.38 ms, but the round queued
# behind each request's last one was wasted, 12.8 ms steps at the end): no round is queued behind one that may end
# every request at its token limit; the overlap GPU test, then the same A/B and profile.
# Part "y4" (y3 at 9516bec: overlap GPU test 2 passed; on / off alternating twice: baseline 202.7 / 203.0 against
# 193.6 / 196.0 tok/s, EAGLE-3 400.0 / 399.3 against 385.0 / 377.1; a round 6.347 ms): gate_up's LATE (its PDL
# trigger after its weights are streamed, so the down kernel's programs do not sit beside it): the MoE alone at
# T = 1..16 with LATE at the table's tiles, the best per T as a table, then the 61-layer step against the checked-in
# table, alternating twice (sweep_step, gpu_stages.sh).
# (y4 at 4cd9052: LATE lost at every T, the MoE alone at T=1 16.5 against 14.8 us over 384 experts, T=4 35.7-39.1
# against 32.5; the sweep's table is the checked-in one, and the step with it within the noise, 0.985-1.007. So the
# down kernel's programs starting beside gate_up is not what cost the T=1 MoE; LATE was removed after this part, which
# no longer runs as written.)
# Part "y5": the whole single-GPU test suite at HEAD (tests/server needs the openai client, absent there).
# (y5 at c01309b: 341 passed, none failed, when the 575 s limit cut it in tests/gpu; then inline at c01309b:
# python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 tests/gpu: 14 passed, 1 skipped.)
# Part "y6": the embedded pair (small, host-bound: ~0.5 ms of host work a round against ~0.7 ms of kernels, twelfth
# session) end to end with the overlap schedule on and off, alternating twice.
part=${1:?part: y1, y2, y3, y4, y5, y6}

# The Kimi slice end to end with the overlap schedule on and off, alternating twice, then profiled with it on.
overlap_e2e() {
  TAIL=20 stage e2e_overlap 420 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --overlap-schedule on off --repeat-variants 2 --out "$OUT/e2e_overlap.json"
  TAIL=30 stage e2e_profile_on 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --simulate-accept 3.0 --profile --out "$OUT/e2e_profile_on.json"
}

case $part in
y1)
  TAIL=60 stage e2e_profile 330 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --profile --out "$OUT/e2e_profile.json"
  for ov in default none; do
    if [ "$ov" = default ]; then unset SGLANG_EAGLE3_OVERLAP; else export SGLANG_EAGLE3_OVERLAP=none; fi
    TAIL=30 stage "prof_$ov" 120 python benchmarks/profile_step.py --layers 6 --tokens 1 --no-gemm \
      --out "$OUT/prof_overlap_$ov.json"
  done
  unset SGLANG_EAGLE3_OVERLAP
  ;;
y2)
  TAIL=15 stage engine_tests 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 280 \
    tests/test_graph_runner.py tests/gpu/test_cuda_engine.py
  overlap_e2e
  ;;
y3)
  TAIL=6 stage overlap_test 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 180 \
    tests/gpu/test_cuda_engine.py -k overlap
  overlap_e2e
  ;;
y4)
  V=()
  for c in 16,8 32,4 16,4; do
    IFS=, read -r bn w <<< "$c"
    V+=(--gemv-config "BLOCK_N=$bn,BLOCK_W=128,num_warps=$w,F16=1,LATE=1")
  done
  sweep_step late gemv 260 230
  ;;
y5)
  TAIL=15 stage gpu_suite 575 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 300 \
    tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
  ;;
y6)
  TAIL=12 stage e2e_embedded 170 python benchmarks/bench_e2e.py --ks 3 --num-prompts 8 --max-new-tokens 64 \
    --repeat 3 --overlap-schedule on off --repeat-variants 2 --out "$OUT/e2e_embedded_overlap.json"
  ;;
esac
collect
