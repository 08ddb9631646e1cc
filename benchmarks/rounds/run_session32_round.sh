#!/usr/bin/env bash
# Thirty-second session's device round (H200).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session32_round.sh f1   (then f2 ...; one device call each)
# What each part found (results benchmarks/results/h200/*_<commit>*, logs session32_f<N>_<commit>.txt):
# f1: (prepared)
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: f1 ..}
case $part in
f1)  # what the thirty-first session left unrun (its e8): decode == verify bit for bit on the Kimi slice with the
     # CUDA-core router + shared pair, and the pair's cost at a verify of 8 in the step, paired against the
     # tensor-core pair; then each launch of a layer in order (profile_step --sequence: the GEMV launches told
     # apart) and ncu on the CUDA-core forms at T = 1, 2, 4 (why their time grows with T)
  TAIL=30 stage probe 170 python benchmarks/probe_invariance.py --layers 3 --contexts 1024 8192 --widths 2 4 8 \
    --out "$OUT/probe.json"
  TAIL=20 stage paired_pair_t8 200 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 8 --eager-iters 1 --graph-iters 5 --paired 200 --kernels-from benchmarks/variants/gemv_pair_tc.py \
    --out "$OUT/paired_pair_t8.json"
  TAIL=120 stage profile_seq 90 python benchmarks/profile_step.py --layers 3 --tokens 1 4 --no-gemm --sequence \
    --out "$OUT/profile_seq.json"
  TAIL=4 stage ncu_fma 100 "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
    -k regex:gemv_fma --section Occupancy --section LaunchStats --section SchedulerStats --metrics "$STALLS" \
    python benchmarks/ncu_decode.py fma_rows
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
