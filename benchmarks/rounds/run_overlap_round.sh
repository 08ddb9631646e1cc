#!/usr/bin/env bash
# One device call (~5 min): the side-stream overlaps (layers/overlap.py). Their GPU test (every variant gives
# bit-identical logits, eager and replayed), then the 61-layer Kimi rank slice at context 1k, decode and
# verify T=4, for each overlap setting one after another in one process ("none" first and last: the noise).
# Usage on the GPU machine, from the repo root: OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_overlap_round.sh
source "$(dirname "$0")/gpu_stages.sh"
PYTEST=(python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu)
TAIL=10 stage overlap_tests "${T_TESTS:-120}" "${PYTEST[@]}" tests/test_overlap.py
TAIL=24 stage overlap_step "${T_STEP:-330}" python benchmarks/bench_verify_graph.py --backends triton \
  --contexts 1024 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 \
  --overlap-variants none shared_down prefetch_attn prefetch_late prefetch_next shared_down,prefetch_attn none \
  --out "$OUT/overlap_step.json"
