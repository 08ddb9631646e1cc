#!/usr/bin/env bash
# The next device round after the fortieth session (which ran run_session38_round.sh m1, m2, m5 and m3's kernel
# table and probe on an H100, then priced the grammar rounds' graphs: docs/BENCHMARKS.md sections 0b and 7).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session41_round.sh n1   (then n2; one device call each, < 10 min)
# The forty-first session ran n1 (an H200), n3 and n4 (H100s): results/h200/session41_n1_c48d496.txt,
# results/h100/session41_n3_59eccaa.txt, session41_n4_dd100f0.txt. n2 and n5 have not run.
# n1: the CUDA engine tests in full, the structured-output case too (a request with a grammar and a penalty since
#     the fortieth session's last change, which no GPU has run yet); then the grammar rounds end to end, this tree
#     against the previous one. Needs xgrammar: benchmarks/rounds/fetch_device_wheels.sh here first, and the old
#     tree in .carry/old; carry: [".carry"].
# n2: end to end on the Kimi slice (never measured on an H100): the defaults against
#     SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 alternating (m3's e2e), then what penalties cost (m4's: greedy against
#     repetition_penalty 1.05 and sampled with frequency_penalty 0.3; bench_e2e's --mem-fraction-static 0.96
#     leaves the slice its KV cache on the 80 GB card, where 0.85 and 0.93 left none).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: n1 | n3 | n4 | n5 | n2}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
n1)
  # The forty-first session's candidates (19b404c): the CUDA engine tests (the structured-output case with the rows
  # filled after the draft's steps, before them, and as the default chooses), then the grammar rounds end to end
  # against the previous tree (.carry/old = git archive 1db9de4 sglang_eagle3 benchmarks/bench_e2e.py
  # benchmarks/data benchmarks/__init__.py), alternating twice; the new tree with its default threshold and with
  # every row after the steps (SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=0).
  install_carried_wheels
  TAIL=14 stage engine_tests 280 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 270 \
    tests/gpu/test_cuda_engine.py
  G=(--num-prompts 4 --max-new-tokens 96 --ks 3 --repeat 2 --sampling 'temperature=0,json_schema=$$ANY$$'
     'temperature=0,regex=[A-Z][a-z]+( [a-z]+)*\.')
  for i in 1 2; do
    TAIL=10 stage "e2e_new_$i" 110 python benchmarks/bench_e2e.py "${G[@]}" \
      --env-variants '' SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=0 --out "$OUT/e2e_grammar_new_$i.json"
    TAIL=6 stage "e2e_old_$i" 70 python .carry/old/benchmarks/bench_e2e.py "${G[@]}" \
      --out "$OUT/e2e_grammar_old_$i.json"
  done
  ;;
n3)
  # After n1 (H200, c48d496) found the candidates' rounds slower on the embedded pair: the candidates without the
  # torch Gumbel noise (the exact choice first, then the best logits). The structured-output engine test, then the
  # grammar rounds end to end against 1db9de4 alternating twice (.carry/old as for n1).
  install_carried_wheels
  TAIL=6 stage engine_grammar 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/gpu/test_cuda_engine.py -k grammar
  G=(--num-prompts 4 --max-new-tokens 96 --ks 3 --repeat 3 --sampling 'temperature=0,json_schema=$$ANY$$'
     'temperature=0,regex=[A-Z][a-z]+( [a-z]+)*\.' 'temperature=0.8,seed=3,regex=[A-Z][a-z]+( [a-z]+)*\.')
  for i in 1 2; do
    TAIL=8 stage "e2e_new_$i" 80 python benchmarks/bench_e2e.py "${G[@]}" --out "$OUT/e2e_grammar_new_$i.json"
    TAIL=8 stage "e2e_old_$i" 80 python .carry/old/benchmarks/bench_e2e.py "${G[@]}" \
      --out "$OUT/e2e_grammar_old_$i.json"
  done
  ;;
n4)
  # The grammar round's host time, this tree against 1db9de4 (.carry/old with its benchmarks/profile_round.py):
  # profile_round's median wall a round and its GPU kernels, new then old, JSON then the greedy regex.
  install_carried_wheels
  for g in 'temperature=0,json_schema=$$ANY$$' 'temperature=0,regex=[A-Z][a-z]+( [a-z]+)*\.'; do
    n=$([ "${g#*json}" != "$g" ] && echo json || echo regex)
    for t in new old; do
      P=benchmarks/profile_round.py; [ $t = old ] && P=.carry/old/benchmarks/profile_round.py
      TAIL=3 stage "prof_${n}_$t" 50 python $P --max-new-tokens 96 --top 14 --sampling "$g" \
        --out "$OUT/prof_${n}_$t.json"
    done
  done
  ;;
n5)
  # Not run yet: the grammar rounds' threshold on the embedded pair (bench_e2e.py applies --env-variants to the
  # embedded workload since the forty-first session), by default (rows ahead there: all cheap), after every step
  # (0), always ahead (inf), alternating twice in one process.
  install_carried_wheels
  TAIL=30 stage e2e_threshold 300 python benchmarks/bench_e2e.py --num-prompts 4 --max-new-tokens 96 --ks 3 \
    --repeat 3 --repeat-variants 2 --sampling 'temperature=0,json_schema=$$ANY$$' \
    'temperature=0,regex=[A-Z][a-z]+( [a-z]+)*\.' --env-variants '' SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=0 \
    SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=inf --out "$OUT/e2e_threshold.json"
  ;;
n2)
  TAIL=14 stage e2e 250 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 --repeat-variants 2 \
    --out "$OUT/e2e.json"
  TAIL=20 stage e2e_penalized 300 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --sampling greedy temperature=0,repetition_penalty=1.05 \
    temperature=0.7,top_p=0.95,seed=1,frequency_penalty=0.3 --out "$OUT/e2e_penalized.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
