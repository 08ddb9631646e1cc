"""Kernel ops for decode/verify shapes. Each op has a torch reference (``ref_*`` in ref.py) and, where
written, a Triton kernel (``triton/``) behind a launcher. Public entry points dispatch on device.
"""

from __future__ import annotations

from sglang_eagle3.kernels.quant import pack_int4, quantize_int4, unpack_int4
from sglang_eagle3.kernels.ref import ref_fused_moe, ref_fused_moe_int4, ref_mla_attention, ref_moe_topk


def moe_topk(router_logits, correction_bias, *, top_k, n_group, topk_group, renormalize=True,
             routed_scaling_factor=1.0):
    """noaux_tc routing: (weights float32 [T, top_k], ids int32 [T, top_k]); see ref_moe_topk."""
    return ref_moe_topk(router_logits, correction_bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                        renormalize=renormalize, routed_scaling_factor=routed_scaling_factor)


__all__ = [
    "moe_topk",
    "ref_moe_topk",
    "ref_mla_attention",
    "ref_fused_moe",
    "ref_fused_moe_int4",
    "pack_int4",
    "unpack_int4",
    "quantize_int4",
]
