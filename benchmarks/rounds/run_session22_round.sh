#!/usr/bin/env bash
# Twenty-second session's device round (H200): bash benchmarks/rounds/run_session22_round.sh PART, results under $OUT.
# top_k / top_p without a sort: the sampler's thresholds by a radix select (kernels.top_threshold, 4-bit digits of
# the scores' ordered bits in 8 streaming passes), where the sampler sorted every row of 163840 scores before.
source "$(dirname "$0")/gpu_stages.sh"
# Part "w1": the sampler's GPU tests (the radix thresholds against the reference and against the sort path at
# Kimi's vocabulary, 1..64 rows; the Gumbel kernel; sampled speculation equal to plain decoding with graphs), then
# the sampler's cost radix against sort in one process (bench_small_ops.py --sampler: 1..256 rows).
# (w1, the select's versions in turn, threshold alone / whole sampler with top_p, us at 1 / 4 / 64 / 256 rows; the
# sort path in the same runs: sampler 160 / 234 / 1329 / 5028):
#   f759680: did not compile (a loop variable named like a tensor of another shape; the interpreter let it pass).
#   f68a2c1 (v1: 40 programs a row, [16, 1024] bins converted from the loads' layout each step, per-chunk partials
#     every program reduces): 77 / 92 / 508 / 1814; sampler 127 at 4 rows, 676 at 64, 2373 at 256.
#   69df1b3 (v2: the loop in the bins' layout, uint32 keys, chunks of 2048 at 8 warps): 42 / 65 / 486 / 1860.
#   3a99dcd (v3: integer atomics for the row's totals, candidates compacted in place from pass 2 with a scan and a
#     barrier every step, one kernel for all passes): 51 / 104 / 1096 / 4350 (slower everywhere).
#   5111841 (relaxed atomics, a line a bin): 47 / 93 / 952 / 3786.
#   f4f5fe6 (the copy compiled only into the passes that keep candidates; per-pass profile at 64 rows: 65 73 116 79
#     77 63 53 48 us: the later passes cost as much over ~3% of the tokens): 48 / 76 / 615 / 2371.
#   2ba24d1 (chunks of 8192 in blocks of 2048, bins reduced each block): 73 / 76 / 349 / 1205.
#   cae1aa1 (one block of 2048 a program, loaded before the pick, every pass over the whole block): 48 / 74 / 598 /
#     2269 (later passes 84 us at 64 rows: the whole block computed, masked).
#   93a0397 (passes over z one block a program; the third keeps its candidates, the five after read only those, 8
#     chunks' lists a program): 65 / 74 / 340 / 1243; whole sampler with top_p 92 / 156 (16 rows) / 436 / 1526
#     against the sort's 234 / 451 / 1337 / 5070; profile at 64 rows: 44 51 84 13 12 12 12 12 us. GPU tests: 16
#     passed at every compiling version.
# Part "w2": the Kimi slice at a pinned 3.0 sampled at temperature 0.7 without and with top_p 0.95, alternating
# twice; then one EAGLE-3 engine with 16-request graph buckets (--cuda-graph-max-bs 16): what capturing the round's
# three graph sets (greedy, sampled, filtered) costs a server in start-up time and graph memory.
# (w2 at 69df1b3, v2: EAGLE-3 at 3.0 temperature 0.7 390.0 / 390.4 tok/s, with top_p 0.95 387.2 / 386.9; baseline
# 201.7 / 201.1 against 199.5 / 199.6 (the twenty-first session's sort: 399 / 392 and 201 / 196). At 16-request
# buckets (5 a graph set): spec_round, spec_round_sampled, spec_round_filtered 1.8 s each, the pool grew 32 / 52 /
# 52 MiB; all graphs ~18 s and ~960 MiB, the prefill graphs 568 + 154 MiB of it.)
# Part "w3": after the draft columns' target ids were cached (ModelRunner._draft_choice), the GPU tests of sampled
# speculation and the round graphs' replays (CUDA engine, graph runner).
# (w3 at 59a83b3: 19 passed.)
# Part "w4": the decode projections as a CUDA-core GEMV (benchmarks/bench_gemv_fma.py, a prototype for issues 4 and
# 5), against the shipped GEMV and the read ceiling of the same bytes, T = 1 and 4.
# (w4 at 240171b, twice, within 0.1 us: T=1 CUDA cores / shipped / read ceiling, us: q_a + kv_a 10.42 / 11.47 / 9.45,
# q_b 2.42 / 5.74 / 3.22, o_proj 6.55 / 5.83 / 5.82, router + shared gate/up 6.59 / 7.96 / 5.26, shared down 2.90 /
# 3.16 / 2.97; at T=4 the CUDA cores lose on all but q_b (3.90 against 5.70).) Since 240171b the script also checks
# bit-identity across T and times q_b with its q_a norm folded in: not yet run (the next GPU session's first call).
# Part "w5" (prepared after the device time was spent; not yet run): the Kimi slice at 16 concurrent requests
# (bench_e2e.py --concurrency, new) sampled with top_p 0.95, the radix select against the sort it replaced
# (SGLANG_EAGLE3_SAMPLER_RADIX=0) alternating twice: the select's gain end to end where a round samples 64 rows.
part=${1:?part: w1, w2, w3, w4, w5}
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
w3)
  TAIL=8 stage gpu_tests 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py -k "sampled or round_replay or cuda_engine"
  ;;
w4)
  TAIL=16 stage gemv_fma 150 python benchmarks/bench_gemv_fma.py --out "$OUT/gemv_fma.json"
  ;;
w5)
  TAIL=10 stage e2e_batch_top_p 500 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 16 --max-new-tokens 64 \
    --repeat 2 --simulate-accept 3.0 --concurrency 16 --cuda-graph-max-bs 16 --sampling temperature=0.7,top_p=0.95 \
    --env-variants '' SGLANG_EAGLE3_SAMPLER_RADIX=0 --repeat-variants 2 --out "$OUT/e2e_batch_top_p.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
