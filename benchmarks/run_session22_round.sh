#!/usr/bin/env bash
# Twenty-second session's device round (H200): bash benchmarks/run_session22_round.sh PART, results under $OUT.
# top_k / top_p without a sort: the sampler's thresholds by a radix select (kernels.top_threshold, 4-bit digits of
# the scores' ordered bits in 8 streaming passes), where the sampler sorted every row of 163840 scores before.
source "$(dirname "$0")/gpu_stages.sh"
# Part "w1": the sampler's GPU tests (the radix thresholds against the reference and against the sort path at
# Kimi's vocabulary, 1..64 rows; the Gumbel kernel; sampled speculation equal to plain decoding with graphs), then
# the sampler's cost radix against sort in one process (bench_small_ops.py --sampler: 1..256 rows).
# Part "w2": the Kimi slice at a pinned 3.0 sampled at temperature 0.7 without and with top_p 0.95, alternating
# twice; then one EAGLE-3 engine with 16-request graph buckets (--cuda-graph-max-bs 16): what capturing the round's
# three graph sets (greedy, sampled, filtered) costs a server in start-up time and graph memory.
part=${1:?part: w1, w2}
E2E_KIMI=(--kimi-slice --num-prompts 3 --max-new-tokens 96 --repeat 2)
case $part in
w1)
  TAIL=15 stage gpu_tests 240 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/kernels/test_kernels_gpu.py tests/gpu/test_cuda_engine.py -k "gumbel or top_threshold or filters_kernel or sampled"
  TAIL=40 stage sampler 150 python benchmarks/bench_small_ops.py --sampler --repeat 2 --out "$OUT/sampler.json"
  TAIL=4 stage select_passes 60 python benchmarks/bench_small_ops.py --select-passes --out "$OUT/select_passes.json"
  ;;
w2)
  TAIL=14 stage e2e_top_p 330 python benchmarks/bench_e2e.py "${E2E_KIMI[@]}" --simulate-accept 3.0 \
    --sampling temperature=0.7 temperature=0.7,top_p=0.95 --repeat-variants 2 --out "$OUT/e2e_top_p.json"
  TAIL=6 stage capture_bs16 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 1 --max-new-tokens 32 \
    --simulate-accept 3.0 --cuda-graph-max-bs 16 --out "$OUT/capture_bs16.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
