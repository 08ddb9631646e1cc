#!/usr/bin/env bash
# Device round for the next session (H200), prepared in the twenty-ninth and not yet run: the settings it measured
# at the noise's edge, again with bench_verify_graph.py --paired (every setting's graphs kept, replayed interleaved,
# the median of per-round ratios with a bootstrap 95% interval).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_paired_round.sh p1   (then p2)
# p1: rope_wuk against the defaults, 1k and 8k, T = 1 and 4, 300 rounds a shape.
# p2: the leave-one-out kernels (benchmarks/ablations/, timing only) against the step as it is, 1k, T = 1 and 4,
#     200 rounds a shape.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: p1 or p2}
NF=SGLANG_EAGLE3_NO_FUSE
RWK="$NF=input_norm,router_topk,q_rope_attn,route_shared_down"  # rope_wuk on, the other defaults as they are
A=benchmarks/ablations
case $part in
p1)
  TAIL=40 stage paired_rope_wuk 560 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --env-variants '' "$RWK" --paired 300 \
    --out "$OUT/paired_rope_wuk.json"
  ;;
p2)
  TAIL=40 stage paired_ablations 560 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 5 --paired 200 \
    --kernels-from $A/rotary_noop.py $A/rms_norm_zero.py $A/mla_merge_zero.py $A/moe_topk_const.py \
    --out "$OUT/paired_ablations.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
