#!/usr/bin/env bash
# Thirty-fourth session's device round (H200), prepared without a device (none was lent this session).
# Superseded by run_session35_round.sh j1 / j2 / j3 (the same stages with the thirty-fifth session's prefetch plans
# paired too); kept as the thirty-fourth session left it:
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session34_round.sh h1   (then h2, h3; one device call each), and
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session33_round.sh g9   (what the thirty-third session left unrun)
# Results land in $OUT; copy them to benchmarks/results/h200/ with the commit in their names, as before.
# h1: the lanes-first tile of the CUDA-core GEMV forms (kernels/gemv.py lanes_first, SGLANG_EAGLE3_GEMV_LANES_FIRST;
#     offline 9-29% fewer SASS instructions a program at 1-4 rows of x): its GPU tests with the default tile's, the
#     router + shared pair alone at T = 1..8 (both tile orders, bench_gemv_launches "lanes first"), then the step
#     paired against the defaults at 1k, T = 1 / 4 / 8.
# h2: the same at 8k, the invariance probe with it on (every verify row of the Kimi slice == its token's decode),
#     and every decode projection alone on the CUDA cores both ways (bench_gemv_fma: may q_a + kv_a or o_proj now
#     take the CUDA cores at T = 4?).
# h3: if it wins, end to end (the single-stream e2e rows of section 0), both settings alternating twice.
# g9 of run_session33_round.sh: the CUDA engine tests, the probe at 8k, the kernel table at this commit.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: h1 ..}
LF=SGLANG_EAGLE3_GEMV_LANES_FIRST=1
case $part in
h1)
  TAIL=8 stage fma_tests 170 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 160 \
    tests/kernels/test_kernels_gpu.py -k "gemv_fma"
  TAIL=40 stage launches 110 python benchmarks/bench_gemv_launches.py --only router+shared --tokens 1 2 4 8 \
    --out "$OUT/gemv_launches_lf.json"
  TAIL=40 stage paired_lf_1k 230 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 --env-variants '' $LF \
    --out "$OUT/paired_lf_1k.json"
  ;;
h2)
  TAIL=40 stage paired_lf_8k 240 python benchmarks/bench_verify_graph.py --backends triton --contexts 8192 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 --env-variants '' $LF \
    --out "$OUT/paired_lf_8k.json"
  TAIL=30 SGLANG_EAGLE3_GEMV_LANES_FIRST=1 stage probe_lf 170 python benchmarks/probe_invariance.py --layers 3 \
    --contexts 1024 8192 --widths 2 4 8 --out "$OUT/probe_lf.json"
  TAIL=40 stage gemv_fma 130 python benchmarks/bench_gemv_fma.py --tokens 1 2 4 8 --out "$OUT/gemv_fma_lf.json"
  ;;
h3)  # only if h1 / h2 say lanes first wins: the Kimi slice end to end, single stream, both settings alternating twice
  TAIL=12 stage e2e_lf 540 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' $LF --repeat-variants 2 --out "$OUT/e2e_lf.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
