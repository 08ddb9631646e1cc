#!/usr/bin/env bash
# Twenty-first session's device round (H200): bash benchmarks/rounds/run_session21_round.sh PART, results under $OUT.
# Sampled requests on the device: the sampler (runtime/sampling.py: Gumbel-max with noise fixed by each request's
# key and the positions; kernels.gumbel_argmax) inside the speculative round's graph and the overlap schedule,
# where before a sampled round ran in two halves with rejection sampling on the host between them.
source "$(dirname "$0")/gpu_stages.sh"
# Part "z1": the GPU tests (tests/gpu, with the new sampled test: sampled spec == plain with graphs, the Gumbel
# kernel and the overlap; the Gumbel kernel against its reference at Kimi's vocabulary), the sampler's cost in a
# graph (bench_small_ops.py --sampler), then the Kimi slice end to end greedy against sampled (temperature 0.7,
# top_p 0.95) at a pinned accept length of 3.0, alternating twice in one process.
# Part "z2": the previous checkout (.carry/old: git archive of 367a9d6's sglang_eagle3 and benchmarks, with this
# checkout's bench_e2e.py) against this one, sampled at temperature 0.7, in separate processes alternating (new,
# old, new, old): the embedded pair (real acceptance), then the Kimi slice with the draft's real acceptance (random
# weights: ~1 token a round; a pinned accept length would send the old code's sampled rounds through its greedy
# graph).
# (z1 at 43a9d79: 19 GPU tests passed; the sampler 274 / 550 / 738 / 1580 us for 1 / 4 / 16 / 64 rows, its Gumbel
# kernel alone 106 us at one program a row; end to end sampled against greedy alternating twice: baseline 195.8 /
# 195.9 against 202.1 / 202.8 tok/s, EAGLE-3 at 3.0 389.9 / 389.2 against 397.8 / 399.3.)
# Part "z3": the Gumbel kernel over chunks of 4096 tokens a program (40 programs a row) with its GPU test, and where
# the sampler's filters spend their time (bench_sampler_parts.py: each step alone, graph-timed).
# (z3 at a3f5118: the Gumbel kernel 106 -> 13 us at one row, 15 at 4, 47 at 64; the filters' steps at 4 rows:
# sort 108 us, cumsum 209, softmax 44; the sampler at 4 rows 450 us. z2, same call: the embedded pair sampled at
# temperature 0.7, previous checkout against this one, alternating: EAGLE-3 k=3 1373 / 1370 tok/s old against 2946
# new (identical to plain decoding: new only), but the baseline 1775 / 1656 old against 964 new (the sampler's ~15
# eager launches a decode step on a host-bound model); the Kimi slice with real acceptance (1.01), one process each:
# baseline 163.3 old against 195.9 new, EAGLE-3 115.5 against 145.0.)
# Part "z4": filters only where a batch uses them, top_p's prefix sums in chunks, two sets of sampled round graphs:
# the GPU tests again, the sampler per filter set, the Kimi slice greedy / temperature 0.7 / with top_p 0.95 at a
# pinned 3.0 alternating twice, and the embedded pair sampled at 0.7, old against new again.
# (z4 at c0546db: 20 GPU tests passed; the sampler at 4 rows: temperature only 33 us, with min_p 53, top_p 247, all
# 262; the Kimi slice alternating twice, tok/s: baseline greedy 202.7 / 202.2, temperature 0.7 201.1 / 201.2, with
# top_p 0.95 195.9 / 195.3; EAGLE-3 at 3.0 399.0 / 399.4, 398.5 / 399.2, 392.0 / 391.1; the embedded pair sampled,
# new / old / new: baseline 1653 / 1727 / 1847, EAGLE-3 3364 / 1360 / 3376.)
# Part "z5": the GPU tests of the graph runner and the side-stream overlaps, and tests/gpu whole; then the Kimi slice
# sampled (temperature 0.7, top_p 0.95) with real acceptance, new and old alternating twice (separate processes).
# (z5 at bbd94bf: 33 GPU tests passed, 2 failed: the prefill test's fixed list of graph runners missed the sampled
# rounds' graphs in the pool's sum; fixed at bc281d8, where the graph runner's GPU tests, 13, passed (inline:
# python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 250 tests/test_graph_runner.py). The Kimi
# slice sampled with real acceptance, new / old alternating twice: baseline 195.7 / 164.9 / 195.8 / 168.3 tok/s,
# EAGLE-3 146.1 / 119.8 / 146.2 / 119.6.)
# Part "z6": the draft's proposals for sampled requests drawn with the target's noise (its own sample, not its
# argmax; ModelRunner._draft_propose): the sampled GPU tests (engine, round graphs), then the embedded pair sampled
# at 0.7 (real acceptance: 1.82 with the argmax draft, 2.29 on CPU with the shared noise), and the Kimi slice
# sampled at temperature 0.7 against greedy at a pinned 3.0 (what the draft's sampler costs in the round graph).
# (z6 at 4c4e2dd: 5 GPU tests passed; the embedded pair sampled at 0.7: EAGLE-3 k=3 3725.4 tok/s, accept length
# 2.32, 1.94x its baseline, output identical to plain decoding; the Kimi slice at a pinned 3.0, greedy / sampled
# alternating twice: baseline 202.7 / 201.0 / 202.8 / 201.3, EAGLE-3 398.0 / 390.6 / 388.6 / 390.0.)
# Part "z7": requests that return logprobs in the overlap schedule (gathered on the device after each round): the
# graphed-against-eager end-to-end GPU test (greedy with logprobs, the overlap on) and the CUDA engine tests.
# (z7 at 87f2043: 23 passed: the graphed-against-eager end-to-end test with logprobs, 6 cases, and the CUDA engine
# tests, 17.)
part=${1:?part: z1, z2, z3, z4, z5, z6, z7}
E2E_KIMI=(--kimi-slice --num-prompts 3 --max-new-tokens 96 --repeat 2)
case $part in
z1)
  TAIL=15 stage gpu_tests 280 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/kernels/test_kernels_gpu.py -k "gumbel or cuda_engine"
  TAIL=14 stage sampler 90 python benchmarks/bench_small_ops.py --sampler --out "$OUT/sampler.json"
  TAIL=10 stage e2e_sampled 300 python benchmarks/bench_e2e.py "${E2E_KIMI[@]}" --simulate-accept 3.0 \
    --sampling greedy temperature=0.7,top_p=0.95 --repeat-variants 2 --out "$OUT/e2e_sampled.json"
  ;;
z2)
  EMB=(--ks 3 --num-prompts 8 --max-new-tokens 64 --repeat 3 --sampling temperature=0.7,seed=1)
  for i in 1 2; do
    TAIL=4 stage "emb_new_$i" 120 python benchmarks/bench_e2e.py "${EMB[@]}" --out "$OUT/emb_new_$i.json"
    TAIL=4 stage "emb_old_$i" 120 python .carry/old/benchmarks/bench_e2e.py "${EMB[@]}" --out "$OUT/emb_old_$i.json"
  done
  KIMI=("${E2E_KIMI[@]}" --simulate-accept 0 --sampling temperature=0.7,top_p=0.95,seed=1)
  TAIL=4 stage kimi_new 170 python benchmarks/bench_e2e.py "${KIMI[@]}" --out "$OUT/kimi_new.json"
  TAIL=4 stage kimi_old 170 python .carry/old/benchmarks/bench_e2e.py "${KIMI[@]}" --out "$OUT/kimi_old.json"
  ;;
z3)
  TAIL=6 stage gumbel_tests 120 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 100 \
    tests/kernels/test_kernels_gpu.py -k gumbel
  TAIL=30 stage sampler_parts 120 python benchmarks/bench_sampler_parts.py --out "$OUT/sampler_parts.json"
  TAIL=14 stage sampler 90 python benchmarks/bench_small_ops.py --sampler --out "$OUT/sampler.json"
  ;;
z4)
  TAIL=15 stage gpu_tests 280 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/kernels/test_kernels_gpu.py -k "gumbel or cuda_engine"
  TAIL=20 stage sampler 120 python benchmarks/bench_small_ops.py --sampler --repeat 2 --out "$OUT/sampler.json"
  TAIL=14 stage e2e_sampled 330 python benchmarks/bench_e2e.py "${E2E_KIMI[@]}" --simulate-accept 3.0 \
    --sampling greedy temperature=0.7 temperature=0.7,top_p=0.95 --repeat-variants 2 --out "$OUT/e2e_sampled.json"
  EMB=(--ks 3 --num-prompts 8 --max-new-tokens 64 --repeat 3 --sampling temperature=0.7,seed=1)
  TAIL=4 stage emb_new_1 120 python benchmarks/bench_e2e.py "${EMB[@]}" --out "$OUT/emb_new_1.json"
  TAIL=4 stage emb_old_1 120 python .carry/old/benchmarks/bench_e2e.py "${EMB[@]}" --out "$OUT/emb_old_1.json"
  TAIL=4 stage emb_new_2 120 python benchmarks/bench_e2e.py "${EMB[@]}" --out "$OUT/emb_new_2.json"
  ;;
z5)
  TAIL=8 stage gpu_tests 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/test_graph_runner.py tests/test_overlap.py tests/gpu
  KIMI=("${E2E_KIMI[@]}" --simulate-accept 0 --sampling temperature=0.7,top_p=0.95,seed=1)
  for i in 1 2; do
    TAIL=4 stage "kimi_new_$i" 120 python benchmarks/bench_e2e.py "${KIMI[@]}" --out "$OUT/kimi_new_$i.json"
    TAIL=4 stage "kimi_old_$i" 120 python .carry/old/benchmarks/bench_e2e.py "${KIMI[@]}" --out "$OUT/kimi_old_$i.json"
  done
  ;;
z6)
  TAIL=8 stage gpu_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py -k "sampled or round_replay"
  TAIL=4 stage emb_new 100 python benchmarks/bench_e2e.py --ks 3 --num-prompts 8 --max-new-tokens 64 --repeat 3 \
    --sampling temperature=0.7,seed=1 --out "$OUT/emb_new.json"
  TAIL=8 stage e2e_sampled 200 python benchmarks/bench_e2e.py "${E2E_KIMI[@]}" --simulate-accept 3.0 \
    --sampling greedy temperature=0.7 --repeat-variants 2 --out "$OUT/e2e_sampled.json"
  ;;
z7)
  TAIL=8 stage gpu_tests 330 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/test_graph_runner.py tests/gpu/test_cuda_engine.py -k "end_to_end or cuda_engine"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
