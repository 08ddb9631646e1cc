"""Launcher for the one-launch noaux_tc routing kernel (see ref_moe_topk for the semantics)."""

from __future__ import annotations

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.triton.moe_topk import moe_topk_kernel


def triton_moe_topk(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    *,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] (any float dtype) -> (weights float32 [T, top_k], ids int32 [T, top_k])."""
    assert router_logits.dim() == 2, f"router_logits must be [T, E], got {tuple(router_logits.shape)}"
    T, E = router_logits.shape
    assert router_logits.stride(1) == 1, f"router_logits must be contiguous in E, {router_logits.stride()=}"
    assert n_group >= 1 and E % n_group == 0, f"{E=} must be divisible by {n_group=}"
    assert 1 <= topk_group <= n_group, f"{topk_group=} must lie in [1, {n_group=}]"
    per_group = E // n_group
    assert 1 <= top_k <= topk_group * per_group, f"{top_k=} exceeds the {topk_group * per_group} selectable experts"
    if correction_bias is not None:
        assert correction_bias.shape == (E,) and correction_bias.is_contiguous(), (
            f"correction_bias must be contiguous [{E}], got {tuple(correction_bias.shape)}")
    weights = torch.empty(T, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int32, device=router_logits.device)
    if T == 0:
        return weights, ids
    cfg = tuning.get_config("moe_topk", router_logits.device, "tokens", T)
    pdl = tuning.pdl(router_logits.device)
    moe_topk_kernel[(T,)](
        router_logits, correction_bias if correction_bias is not None else router_logits, weights, ids,
        router_logits.stride(0), weights.stride(0), ids.stride(0),
        float(routed_scaling_factor),
        E=E, PER_GROUP=per_group, N_GROUP=n_group, TOPK_GROUP=topk_group, TOP_K=top_k,
        G_PAD=triton.next_power_of_2(n_group), PG_PAD=triton.next_power_of_2(per_group),
        K_PAD=triton.next_power_of_2(top_k), HAS_BIAS=correction_bias is not None,
        RENORMALIZE=bool(renormalize), num_warps=cfg["num_warps"], PDL=pdl, **tuning.pdl_launch(pdl),
    )
    return weights, ids
