#!/usr/bin/env bash
# The twelfth session's single-GPU calls (nvidia-h200, each <= 10 min); multi-GPU ones: run_multi_gpu_round.sh.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_session12_round.sh s1
# Part "s1": the speculative round on the device (drafts stay device tensors from the draft steps into the verify
# and the draft extend; one host wait a round instead of one a draft step plus a pageable copy per batch input)
# and batches built in one pinned non-blocking copy. The CUDA engine / graph runner / overlap GPU tests, then end
# to end, the previous checkout (.old: `git archive 3d28beb sglang_eagle3 benchmarks`) against this one,
# alternating twice: the embedded pair (baseline and EAGLE-3 k=3) and the Kimi rank slice (baseline and EAGLE-3
# k=3 at accept length 3.0).
# (s1 at 902ea9a: the 25 GPU engine / graph / overlap tests passed; end to end no change beyond the noise: the
# embedded pair's EAGLE-3 1157 / 1684 tok/s (this) vs 1359 / 1378 (before), baseline 1750 / 1754 vs 1826 / 1261;
# the Kimi slice at accept 3.0 256.5 / 256.3 vs 261.9 / 237.5, baseline 165.0 / 155.6 vs 165.1 / 166.0. The Kimi
# round is GPU-bound (32 rounds of ~7.9 ms plus a 115-135 ms prefill); the embedded one is host-bound, four graph
# calls a round against decode's one.)
# Part "s2": the greedy round as ONE graph (draft steps, verify, acceptance on the device, draft extend): the GPU
# tests of the graph runner (a new one: the round's replay equals its eager form, padded batches, acceptance
# computed or pinned), the CUDA engine and overlap; end to end as in s1 against the same previous checkout, with
# longer outputs for the Kimi slice (256 tokens) and five passes for the embedded pair.
# (s2 at 118896c: 27 GPU tests passed; the embedded pair's EAGLE-3 1948 / 1981 tok/s against 1393 / 1443 before,
# 1.00-1.08x its baseline (0.74-0.80x before); the Kimi slice unchanged within the spread.)
# Part "s3": where the embedded pair's decode step and speculative round spend their time, host or GPU
# (benchmarks/profile_round.py: the scheduler's wall time a step, the GPU kernel time in it, the Python
# functions by own time).
# (s3 at 9386285: decode 0.380 ms a step, 0.289 of kernels; the k=3 round 1.188 ms, 0.687 of kernels, 3.15 tokens;
# ~0.5 ms of the round is host work the GPU does not overlap.)
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: s1, s2 or s3}
EMB=(--model-path sglang_eagle3/assets/embedded/target --draft-path sglang_eagle3/assets/embedded/draft --ks 3
     --num-prompts 8 --repeat 3)
KIMI=(--kimi-slice --num-prompts 3 --max-new-tokens 96 --repeat 2 --simulate-accept 3.0)
if [ "$part" = s2 ]; then
  EMB=(--model-path sglang_eagle3/assets/embedded/target --draft-path sglang_eagle3/assets/embedded/draft --ks 3
       --num-prompts 8 --repeat 5)
  KIMI=(--kimi-slice --num-prompts 3 --max-new-tokens 256 --repeat 2 --simulate-accept 3.0)
fi

case $part in
s1|s2)
  TAIL=6 stage engine_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py tests/test_overlap.py
  for w in emb kimi; do  # the embedded pair's four runs, then the Kimi slice's: old, new, old, new
    if [ $w = emb ]; then args=("${EMB[@]}") limit=60; else args=("${KIMI[@]}") limit=100; fi
    for i in 1 2; do
      for tree in old new; do
        dir=$([ $tree = old ] && echo .old/ || echo "")
        TAIL=4 stage "${w}_${tree}_$i" $limit python ${dir}benchmarks/bench_e2e.py "${args[@]}" --out "$OUT/${w}_${tree}_$i.json"
      done
    done
  done
  # One file for the eight runs (the device tool brings back at most 8 files).
  python - "$OUT" <<'PY'
import glob, json, os, sys
runs = {os.path.basename(f)[:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")))}
json.dump(runs, open(os.path.join(sys.argv[1], "e2e_ab.json"), "w"), indent=1)
for f in runs:
    os.remove(os.path.join(sys.argv[1], f + ".json"))
PY
  ;;
s3)
  TAIL=40 stage profile_round 200 python benchmarks/profile_round.py --out "$OUT/profile_round.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
