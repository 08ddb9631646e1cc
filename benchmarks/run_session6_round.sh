#!/usr/bin/env bash
# The sixth session's device calls (each <= 10 min).
# Part "x2" (nvidia-h200-x2): TP=2 with PDL on (greedy tokens of TP=2 equal TP=1, graphs on, NCCL beside our
# PDL kernels in one graph), then the quarantined q_rope_attn model test alone and the step with q_rope_attn +
# mla_k_path against the defaults (run_session5_round.sh q_rope, prepared last session).
# Usage on the GPU machine, from the repo root:
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/run_session6_round.sh x2
source "$(dirname "$0")/gpu_stages.sh"
case "${1:?x2}" in
  x2)
    nvidia-smi -L
    TAIL=10 stage tp2_pdl "${T_TP:-200}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/gpu/test_tp_cuda.py
    bash "$(dirname "$0")/run_session5_round.sh" q_rope
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
esac
