"""A moe_topk_kernel that routes every token to experts 0 .. top_k - 1 with equal weights (timing only: the
model's numbers are wrong with it): after the PDL wait each program stores its row of ids and weights, loading
nothing, so the routing's dependent chain (the logits, the sigmoid and the top-k picks) is gone but its launch
and stores stay. ``bench_verify_graph.py --kernels-from benchmarks/ablations/moe_topk_const.py`` prices that
chain in the step. NOTE: at T = 1 the MoE then reads as many experts as with the real routing; at T > 1 fewer
(every token shares the same top_k)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def moe_topk_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr,
    stride_lt, stride_wt, stride_it,
    routed_scaling_factor,
    E: tl.constexpr, PER_GROUP: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr, G_PAD: tl.constexpr, PG_PAD: tl.constexpr, K_PAD: tl.constexpr,
    HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    kk = tl.arange(0, K_PAD)
    kmask = kk < TOP_K
    tl.store(weights_ptr + t * stride_wt + kk, tl.zeros([K_PAD], tl.float32) + routed_scaling_factor / TOP_K,
             mask=kmask)
    tl.store(ids_ptr + t * stride_it + kk, kk, mask=kmask)
