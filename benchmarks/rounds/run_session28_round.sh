#!/usr/bin/env bash
# Twenty-eighth session's device round (H200).
#   GIT_COMMIT=<HEAD> bash benchmarks/rounds/run_session28_round.sh b1
# b1: the launch fusions that are off by default, re-measured against the current kernels (each was last timed
#     sessions ago, before PDL and the twenty-seventh session's small-launch fixes): the routing beside the shared
#     expert's down projection in one launch (route_shared_down, instead of the down on the side stream), the
#     layer's input norm folded into the q_a + kv_a launch (input_norm), q's rope applied by the MLA kernel
#     (q_rope_attn). The 61-layer step at 1k and 8k, T = 1 and 4, one process alternating the four settings twice.
#     Ran at 82ef67a (step_fusions_82ef67a.json): none pays (route_shared_down -1% at decode, +4% at verify T=4;
#     input_norm +50-67%; q_rope_attn +2-4%); the defaults stand. docs/BENCHMARKS.md, twenty-eighth session.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: b1}
NF=SGLANG_EAGLE3_NO_FUSE
RSD="$NF=input_norm,router_topk,q_rope_attn"      # route_shared_down on
INN="$NF=router_topk,q_rope_attn,route_shared_down"  # input_norm on
QRA="$NF=input_norm,router_topk,route_shared_down"   # q_rope_attn on
case $part in
b1)
  TAIL=70 stage step_fusions 560 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants '' "$RSD" "$INN" "$QRA" '' "$RSD" "$INN" "$QRA" \
    --out "$OUT/step_fusions.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
