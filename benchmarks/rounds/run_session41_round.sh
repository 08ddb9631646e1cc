#!/usr/bin/env bash
# The next device round after the fortieth session (which ran run_session38_round.sh m1, m2, m5 and m3's kernel
# table and probe on an H100, then priced the grammar rounds' graphs: docs/BENCHMARKS.md sections 0b and 7).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session41_round.sh n1   (then n2; one device call each, < 10 min)
# n1: the CUDA engine tests in full, the structured-output case too (a request with a grammar and a penalty since
#     the fortieth session's last change: that batch now takes the grammar round's graphs, its verify logits
#     penalized between them, which no GPU has run yet); then the grammar's price end to end and its profile.
#     Needs xgrammar: benchmarks/rounds/fetch_device_wheels.sh here first, carry: [".carry"].
# n2: end to end on the Kimi slice (never measured on an H100): the defaults against
#     SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0 alternating (m3's e2e), then what penalties cost (m4's: greedy against
#     repetition_penalty 1.05 and sampled with frequency_penalty 0.3; bench_e2e's --mem-fraction-static 0.96
#     leaves the slice its KV cache on the 80 GB card, where 0.85 and 0.93 left none).
# Results land in $OUT; copy them to benchmarks/results/<gpu>/ with the commit in their names.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: n1 | n2}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
case $part in
n1)
  install_carried_wheels
  TAIL=14 stage engine_tests 240 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 230 \
    tests/gpu/test_cuda_engine.py
  TAIL=12 stage e2e_grammar 120 python benchmarks/bench_e2e.py --num-prompts 4 --max-new-tokens 96 --ks 3 \
    --repeat 3 --sampling greedy 'temperature=0,json_schema=$$ANY$$' 'temperature=0,regex=[A-Z][a-z]+( [a-z]+)*\.' \
    'temperature=0,regex=[a-z]+( [a-z]+)+\.' --out "$OUT/e2e_grammar.json"
  TAIL=16 stage prof_json 60 python benchmarks/profile_round.py --max-new-tokens 96 --top 12 \
    --sampling 'temperature=0,json_schema=$$ANY$$' --out "$OUT/profile_json.json"
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
