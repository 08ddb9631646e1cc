#!/usr/bin/env bash
# Thirty-eighth session's device round: the device tool now lends an H100 by default (an H200 only at times), so
# this round first takes the H100's own baselines, then runs the thirty-seventh session's prepared comparisons.
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session38_round.sh m1   (then m2, m3; one device call each, < 10 min)
# m1: the CUDA engine tests in full (speculative == plain with graphs; the thirty-seventh session's k4 ran out at 14
#     of 17 after its scheduler and TP-worker changes; the thirty-ninth session's structured-output case runs in
#     m5), then the step table of section 0 at the q_a + kv_a default
#     (61-layer Kimi slice, 1k and 8k, T = 1..8; ~71 GiB of weights, which fits the H100's 79 GiB).
# m2: the step paired against the defaults at 1k / 8k, T = 1 / 4 / 8, five candidates in one run (each its own
#     --kernels-from group, so the ones replacing the same name do not meet): the router + shared pair at 128 lanes
#     (gemv_pair_l128.py), q_a + kv_a at 8 rows of x a program (gemv_qkv_rows8.py), q_a + kv_a back on the tensor
#     cores (gemv_qkv_tc.py: the last session's change, measured again here), o_proj on the CUDA cores
#     (gemv_fma_oproj.py), the shared expert's down at K = 256 on them (gemv_fma_short_k.py).
# m3: the kernel table on this GPU, the invariance probe at 8k (every verify row == its token's decode) and with the
#     candidates at 1k, and end to end against SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 alternating.
# m4: what penalties cost end to end (new this session: a batch with a penalized request runs its rounds as their parts,
#     each replaying its graph, acceptance eager between them; sampling.penalized_logits): the Kimi slice, greedy
#     against greedy with repetition_penalty 1.05 and sampled with frequency_penalty 0.3, alternating; then the CUDA
#     engine tests' penalized case alone (speculative == plain with graphs).
# m5 (thirty-ninth session): the structured-output GPU test and what a grammar costs end to end (json_schema /
#     regex on the embedded pair); needs xgrammar: benchmarks/rounds/fetch_device_wheels.sh here, carry .carry.
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: m1 | m2 | m3 | m4 | m5}
shift
V=benchmarks/variants
CANDIDATES=($V/gemv_pair_l128.py $V/gemv_qkv_rows8.py $V/gemv_qkv_tc.py $V/gemv_fma_oproj.py $V/gemv_fma_short_k.py)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
m1)
  TAIL=12 stage engine_tests 230 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 220 \
    tests/gpu/test_cuda_engine.py -k "not grammar"
  TAIL=20 stage verify_graph 320 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 3 4 5 6 7 8 --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  ;;
m2)
  TAIL=60 stage paired 540 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 150 --kernels-from "${CANDIDATES[@]}" \
    --out "$OUT/paired.json"
  TAIL=30 stage verdicts 30 python benchmarks/report.py "$OUT/paired.json"
  ;;
m3)
  TAIL=45 stage kernels 200 python benchmarks/bench_kernels.py --out "$OUT"
  TAIL=12 stage probe 90 python benchmarks/probe_invariance.py --layers 3 --contexts 8192 --widths 2 4 8 \
    --out "$OUT/probe.json"
  TAIL=20 stage probe_candidates 110 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 --widths 2 4 8 \
    --kernels-from "${CANDIDATES[@]}" --out "$OUT/probe_candidates.json"
  TAIL=14 stage e2e 160 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 --repeat-variants 2 \
    --out "$OUT/e2e.json"
  ;;
m4)
  TAIL=20 stage e2e_penalized 330 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --sampling greedy temperature=0,repetition_penalty=1.05 \
    temperature=0.7,top_p=0.95,seed=1,frequency_penalty=0.3 --repeat-variants 2 --out "$OUT/e2e_penalized.json"
  TAIL=8 stage penalized_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/gpu/test_cuda_engine.py -k penalized
  ;;
m5)
  # (thirty-ninth session) structured output: the GPU test, then what a grammar costs end to end, on the embedded
  # pair (the Kimi slice has no tokenizer): a round of a batch with a grammar runs as its parts, the host filling
  # its masks and its draft's (xgrammar).
  install_carried_wheels  # (carry: [".carry"], after fetch_device_wheels.sh here)
  TAIL=8 stage grammar_tests 120 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 110 \
    tests/gpu/test_cuda_engine.py -k grammar
  TAIL=12 stage e2e_grammar 100 python benchmarks/bench_e2e.py --num-prompts 4 --max-new-tokens 96 --ks 3 \
    --repeat 3 --sampling greedy 'temperature=0,json_schema=$$ANY$$' 'temperature=0,regex=[A-Z][a-z]+( [a-z]+)*\.' \
    --out "$OUT/e2e_grammar.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
