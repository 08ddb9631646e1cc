#!/usr/bin/env bash
# Thirty-fifth session's device round (H200), prepared without a device (none was lent this session either). It
# supersedes run_session34_round.sh h1 / h2 (the same stages, with two more settings in the paired runs):
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session35_round.sh j1   (then j2; one device call each, < 10 minutes each)
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session35_round.sh j3 NAME=VALUE ...   (end to end of what won, if any)
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session35_round.sh j4   (if LF won: the probe with it on)
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session33_round.sh g9   (what the thirty-third session left unrun)
# Results land in $OUT; copy them to benchmarks/results/h200/ with the commit in their names, as before.
# Settings paired against the defaults (bench_verify_graph.py --paired 200, the median of per-round ratios):
#   LF   the lanes-first tile of the CUDA-core GEMV forms (thirty-fourth session; kernels/gemv.py lanes_first;
#        offline 9-29% fewer SASS instructions a program at 1-4 rows of x).
#   MID  the L2 prefetch of o_proj + the router + shared gate/up (27.5 MB a MoE layer) forked after each layer's
#        q_a + kv_a launch, with no join of its own (layers/overlap.py prefetch_mid; thirty-fifth session): the
#        lines stream in while q_b, the rotary, W_UK, MLA and W_UV run on their latency. MID_O: o_proj alone
#        (14.7 MB), to tell the L2's capacity from the prefetch's cost if MID loses. NEXT: the next layer's q_a +
#        kv_a (30.3 MB) forked after the MoE router launch, streaming in while the routed experts (~25 MB at T=1)
#        run (prefetch_next_moe); MID_NEXT both; and LF with MID_NEXT (do the two kinds add up?). The fourth
#        session's plans (forked at the layer's start, before PDL) cost 0.1-0.4 ms; these fork later, on a stream
#        of their own joined only at the forward's end.
# j1: the GPU tests of both (the CUDA-core forms both tile orders; every overlap variant bit-identical, eager and
#     replayed, and the mid plans' prefetch launched once a layer with its bytes), then the step paired at 1k and
#     8k, T = 1 / 4 / 8 (one process: one model build and first capture for both contexts).
# j2: the prefetch's mechanism alone (bench_l2_prefetch.py: o_proj, the router + shared pair and q_a + kv_a after
#     an idle window or one streaming 8-16 MB of other bytes, with and without the prefetch of their weights:
#     how much a launch gains from lines the L2 holds, and whether they survive that traffic); the launch
#     structure's own ceiling (bench_launch_floor.py: every kernel a read-only one of its bytes) without and with
#     the plans; the router + shared pair alone at T = 1..8 both tile orders.
# j3: end to end (the single-stream e2e rows of section 0), the defaults against the settings given, alternating.
# j4: the invariance probe with LF on (before LF goes on by default), every decode projection alone on the CUDA
#     cores both ways (bench_gemv_fma: may q_a + kv_a or o_proj take the CUDA cores at T = 4 now?).
# A setting goes on by default only if the paired step says so at T = 4 and it does not lose at T = 1 (j1 prints
# report.py's verdict by that rule for each setting, from the paired intervals).
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: j1 ..}
shift
LF=SGLANG_EAGLE3_GEMV_LANES_FIRST=1
MID=SGLANG_EAGLE3_OVERLAP=shared_down,prefetch_mid
MID_O=SGLANG_EAGLE3_OVERLAP=shared_down,prefetch_mid_o
NEXT=SGLANG_EAGLE3_OVERLAP=shared_down,prefetch_next_moe
MID_NEXT=SGLANG_EAGLE3_OVERLAP=shared_down,prefetch_mid,prefetch_next_moe
case $part in
j1)
  TAIL=8 stage gpu_tests 220 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 210 \
    tests/kernels/test_kernels_gpu.py tests/test_overlap.py -k "gemv_fma or overlap or prefetch"
  TAIL=80 stage paired 350 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 \
    --env-variants '' $LF $MID $MID_O $NEXT $MID_NEXT "$LF $MID_NEXT" \
    --out "$OUT/paired.json"
  TAIL=14 stage verdicts 30 python benchmarks/report.py "$OUT/paired.json"
  ;;
j2)
  TAIL=70 stage l2_prefetch 150 python benchmarks/bench_l2_prefetch.py --tokens 1 4 --out "$OUT/l2_prefetch.json"
  TAIL=12 stage launch_floor 150 python benchmarks/bench_launch_floor.py --context 1024 \
    --prefetch-variants none mid next_moe mid,next_moe --out "$OUT/launch_floor_prefetch.json"
  TAIL=40 stage launches 110 python benchmarks/bench_gemv_launches.py --only router+shared --tokens 1 2 4 8 \
    --out "$OUT/gemv_launches_lf.json"
  ;;
j3)  # the setting that won in j1 / j2, e.g. j3 SGLANG_EAGLE3_GEMV_LANES_FIRST=1 (one argument a setting; the
     # thirty-third session's two settings x two passes took most of the 540 s: pass one)
  [ $# -gt 0 ] || { echo "j3: name the settings (NAME=VALUE ..., one argument a setting)"; exit 2; }
  TAIL=14 stage e2e 540 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' "$@" --repeat-variants 2 --out "$OUT/e2e.json"
  ;;
j4)  # before lanes first goes on by default: every verify row of the Kimi slice == its token's decode with it on;
     # every decode projection alone on the CUDA cores both tile orders
  TAIL=30 SGLANG_EAGLE3_GEMV_LANES_FIRST=1 stage probe_lf 170 python benchmarks/probe_invariance.py --layers 3 \
    --contexts 1024 8192 --widths 2 4 8 --out "$OUT/probe_lf.json"
  TAIL=40 stage gemv_fma 130 python benchmarks/bench_gemv_fma.py --tokens 1 2 4 8 --out "$OUT/gemv_fma_lf.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
