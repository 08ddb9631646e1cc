"""Launcher for the one-launch noaux_tc routing kernel (see ref_moe_topk for the semantics), and Routing: the
routing's parameters, checked once, as this launcher and the router GEMV's routing tail (kernels/gemv.py) take them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.triton.moe_topk import moe_topk_kernel


@dataclass(frozen=True, eq=False)
class Routing:
    """DeepSeek-V3 noaux_tc routing of router logits [T, E], as the moe_topk op takes it: sigmoid scores;
    ``bias`` [E] (e_score_correction_bias, or None) shifts them for the choice only; the ``topk_group`` of
    ``n_group`` expert groups with the best top-2 sums are kept, and their ``top_k`` best experts chosen;
    their unbiased scores, divided by their sum with ``renormalize``, times ``routed_scaling_factor``, are the
    weights (float32 [T, top_k]) beside the ids (int32 [T, top_k])."""

    bias: torch.Tensor | None
    top_k: int
    n_group: int = 1
    topk_group: int = 1
    renormalize: bool = True
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        assert self.n_group >= 1, f"{self.n_group=} must be >= 1"
        assert 1 <= self.topk_group <= self.n_group, f"{self.topk_group=} must lie in [1, {self.n_group=}]"
        assert self.top_k >= 1, f"{self.top_k=} must be >= 1"

    def check(self, E: int, device: torch.device) -> None:
        """Asserts the routing fits E experts whose logits live on ``device``."""
        assert E % self.n_group == 0, f"{E=} experts must be divisible by {self.n_group=}"
        per_group = E // self.n_group
        # One expert a group leaves every group's top-2 sum -inf: the group step could not tell them apart.
        assert self.n_group == 1 or per_group >= 2, f"grouped routing needs >= 2 experts a group, got {E=} over "\
            f"{self.n_group=}"
        assert self.top_k <= self.topk_group * per_group, (
            f"{self.top_k=} exceeds the {self.topk_group * per_group} experts of {self.topk_group=} groups of "
            f"{per_group}")
        b = self.bias
        if b is not None:
            assert b.shape == (E,) and b.is_contiguous() and b.is_floating_point() and b.device == device, (
                f"bias must be a contiguous float [{E}] on {device}, got {tuple(b.shape)} {b.dtype} {b.device} "
                f"strides {b.stride()}")

    def constexprs(self, E: int) -> dict:
        """The routing's compile-time arguments of route_row (triton/moe_topk.py) for E experts."""
        per_group = E // self.n_group
        return dict(PER_GROUP=per_group, N_GROUP=self.n_group, TOPK_GROUP=self.topk_group, TOP_K=self.top_k,
                    G_PAD=triton.next_power_of_2(self.n_group), PG_PAD=triton.next_power_of_2(per_group),
                    K_PAD=triton.next_power_of_2(self.top_k), HAS_BIAS=self.bias is not None,
                    RENORMALIZE=bool(self.renormalize))

    def topk_kwargs(self) -> dict:
        """Keyword arguments of moe_topk / ref_moe_topk after (logits, bias)."""
        return dict(top_k=self.top_k, n_group=self.n_group, topk_group=self.topk_group,
                    renormalize=self.renormalize, routed_scaling_factor=self.routed_scaling_factor)


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
    route = Routing(correction_bias, top_k, n_group, topk_group, renormalize, routed_scaling_factor)
    route.check(E, router_logits.device)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int32, device=router_logits.device)
    if T == 0:
        return weights, ids
    cfg = tuning.get_config("moe_topk", router_logits.device, "tokens", T)
    pdl = tuning.pdl(router_logits.device, "topk")
    moe_topk_kernel[(T,)](
        router_logits, correction_bias if correction_bias is not None else router_logits, weights, ids,
        router_logits.stride(0), weights.stride(0), ids.stride(0),
        float(routed_scaling_factor),
        E=E, **route.constexprs(E), num_warps=cfg["num_warps"], PDL=pdl, **tuning.pdl_launch(pdl),
    )
    return weights, ids
