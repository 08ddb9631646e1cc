#!/usr/bin/env bash
# The fifth session's device calls (each <= 10 min). Part "pdl": does programmatic dependent launch start a
# kernel early inside our CUDA graphs, and does loading a GEMV's first weight tiles into registers before its
# wait pay (bench_pdl.py: a spin/probe pair, then a 12-layer chain of the rank's dense GEMVs); the GPU tests of
# that path; the 61-layer step with PDL off / L2 prefetch / 1 and 2 tiles in registers / off again (one
# process, bench_verify_graph.py --env-variants); the FlashInfer MLA peer if its wheels were carried (.whl).
# Part "final": with PDL on by default, the whole GPU suite and the 61-layer verify table. Part "peer": FlashInfer's
# MLA against ours (its wheels carried in .whl: benchmarks/peer/fetch_wheels.sh), the kernel benchmark, the
# side-stream overlap under PDL, and the Kimi-slice end-to-end run.
# Usage on the GPU machine, from the repo root:
# Part "q_rope" (run in the sixth session, via run_session6_round.sh x2): the then quarantined q_rope_attn model
# test alone, then the step with q_rope_attn + mla_k_path against the defaults, PDL on.
#   OUT=/some/dir GIT_COMMIT=<sha> bash benchmarks/rounds/run_session5_round.sh pdl|pdl2|skip|final|peer|q_rope
source "$(dirname "$0")/gpu_stages.sh"
case "${1:?pdl, pdl2, skip, final, peer or q_rope}" in
  pdl)  # (knobs of aae7240: the preload ones are gone since)
    TAIL=30 stage pdl "${T_PDL:-120}" python benchmarks/bench_pdl.py --out "$OUT/pdl.json"
    TAIL=8 stage pdl_tests "${T_PDL_TESTS:-90}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_pdl_gpu.py
    TAIL=16 stage step_pdl "${T_STEP:-240}" python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
      --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants "SGLANG_EAGLE3_PDL=0" \
      "SGLANG_EAGLE3_PDL=1" "SGLANG_EAGLE3_PDL=1 SGLANG_EAGLE3_PDL_PRELOAD=1" \
      "SGLANG_EAGLE3_PDL=1 SGLANG_EAGLE3_PDL_PRELOAD=2" "SGLANG_EAGLE3_PDL=0" --out "$OUT/step_pdl.json"
    ;;
  pdl2)  # the PDL variants after the first round (knobs of 3fa1d10: the preload and trigger ones are gone since)
    TAIL=30 stage pdl "${T_PDL:-120}" python benchmarks/bench_pdl.py --out "$OUT/pdl.json"
    TAIL=20 stage step_pdl "${T_STEP:-300}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 8192 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants \
      "SGLANG_EAGLE3_PDL=0" "SGLANG_EAGLE3_PDL=1" "SGLANG_EAGLE3_PDL=1 SGLANG_EAGLE3_PDL_NO_PRELOAD=mla" \
      "SGLANG_EAGLE3_PDL=1 SGLANG_EAGLE3_PDL_PRELOAD=0" "SGLANG_EAGLE3_PDL=1 SGLANG_EAGLE3_PDL_TRIGGER=late" \
      "SGLANG_EAGLE3_PDL=1 SGLANG_EAGLE3_PDL_PRELOAD=2 SGLANG_EAGLE3_PDL_TRIGGER=late" "SGLANG_EAGLE3_PDL=0" \
      "SGLANG_EAGLE3_PDL=1" --out "$OUT/step_pdl.json"
    # the GPU tests that run whole models (graphs vs eager, speculative vs plain, overlaps) with PDL on
    SGLANG_EAGLE3_PDL=1 TAIL=12 stage pdl_tests "${T_PDL_TESTS:-150}" python -m pytest -q -p no:cacheprovider \
      -o addopts="" -m gpu tests/kernels/test_pdl_gpu.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
    ;;
  skip)  # PDL per kernel family: the step with each family launched without it
    TAIL=8 stage pdl_tests "${T_PDL_TESTS:-90}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
      tests/kernels/test_pdl_gpu.py tests/test_overlap.py
    TAIL=20 stage step_skip "${T_STEP:-240}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants "" \
      "SGLANG_EAGLE3_PDL=0" "SGLANG_EAGLE3_PDL_SKIP=moe" "SGLANG_EAGLE3_PDL_SKIP=gemv" \
      "SGLANG_EAGLE3_PDL_SKIP=moe,gemv" "SGLANG_EAGLE3_PDL_SKIP=mla,norm,rotary,topk" "" \
      --out "$OUT/step_skip.json"
    ;;
  q_rope)
    SGLANG_EAGLE3_TEST_Q_ROPE_MODEL=1 TAIL=15 stage q_rope_test "${T_QROPE:-240}" python -m pytest -q \
      -p no:cacheprovider -o addopts="" -m gpu tests/kernels/test_mla_rope_gpu.py -k q_rope_attn
    TAIL=12 stage step_q_rope "${T_STEP:-200}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 8192 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants "" \
      "SGLANG_EAGLE3_NO_FUSE=input_norm,router_topk SGLANG_EAGLE3_OVERLAP=shared_down,mla_k_path" "" \
      --out "$OUT/step_q_rope.json"
    ;;
  final)
    TAIL=25 stage gpu_tests "${T_TESTS:-330}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu \
      tests/kernels/test_*gpu.py tests/test_graph_runner.py tests/test_overlap.py
    TAIL=20 stage verify_graph "${T_VERIFY:-220}" python benchmarks/bench_verify_graph.py --backends triton \
      --eager-iters 1 --graph-iters 20 --out "$OUT/verify_graph.json"
    ;;
  peer)
    if ls .whl/*.whl > /dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
    fi
    FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer_ws TAIL=20 stage peer_mla "${T_PEER:-200}" \
      python3 benchmarks/bench_peer_mla.py --out "$OUT" --tokens 1 4
    TAIL=40 stage kernels "${T_KERNELS:-150}" python benchmarks/bench_kernels.py --out "$OUT"
    TAIL=8 stage overlap "${T_OVERLAP:-80}" python benchmarks/bench_verify_graph.py --backends triton \
      --contexts 1024 --max-tokens 4 --tokens 1 4 --eager-iters 1 --graph-iters 30 \
      --overlap-variants none shared_down none shared_down --out "$OUT/overlap_step.json"
    stage e2e_kimi "${T_KIMI:-120}" python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 48 \
      --out "$OUT/e2e_kimi_slice.json"
    # one log file (the device brings back at most 8 files)
    for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log
    ;;
esac
