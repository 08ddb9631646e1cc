#!/usr/bin/env bash
# The twelfth session's single-GPU calls (nvidia-h200, each <= 10 min); multi-GPU ones: run_multi_gpu_round.sh.
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/run_session12_round.sh s1
# Part "s1": the speculative round on the device (drafts stay device tensors from the draft steps into the verify
# and the draft extend; one host wait a round instead of one a draft step plus a pageable copy per batch input)
# and batches built in one pinned non-blocking copy. The CUDA engine / graph runner / overlap GPU tests, then end
# to end, the previous checkout (.old: `git archive 3d28beb sglang_eagle3 benchmarks`) against this one,
# alternating twice: the embedded pair (baseline and EAGLE-3 k=3) and the Kimi rank slice (baseline and EAGLE-3
# k=3 at accept length 3.0).
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: s1}
EMB=(--model-path sglang_eagle3/assets/embedded/target --draft-path sglang_eagle3/assets/embedded/draft --ks 3
     --num-prompts 8 --repeat 3)
KIMI=(--kimi-slice --num-prompts 3 --max-new-tokens 96 --repeat 2 --simulate-accept 3.0)

case $part in
s1)
  TAIL=6 stage engine_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py tests/test_overlap.py
  for i in 1 2; do
    for tree in old new; do
      dir=$([ $tree = old ] && echo .old/ || echo "")
      TAIL=4 stage "emb_${tree}_$i" 60 python ${dir}benchmarks/bench_e2e.py "${EMB[@]}" --out "$OUT/emb_${tree}_$i.json"
    done
  done
  for i in 1 2; do
    for tree in old new; do
      dir=$([ $tree = old ] && echo .old/ || echo "")
      TAIL=4 stage "kimi_${tree}_$i" 100 python ${dir}benchmarks/bench_e2e.py "${KIMI[@]}" --out "$OUT/kimi_${tree}_$i.json"
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
*) echo "unknown part $part"; exit 2 ;;
esac
collect
