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


def mla_attention(q_nope_latent, q_rope, kv_cache, page_table, seq_lens, *, tokens_per_req, page_size,
                  kv_lora_rank, sm_scale):
    """Absorbed MLA attention over the paged latent cache; see ref_mla_attention."""
    return ref_mla_attention(q_nope_latent, q_rope, kv_cache, page_table, seq_lens, tokens_per_req=tokens_per_req,
                             page_size=page_size, kv_lora_rank=kv_lora_rank, sm_scale=sm_scale)


def fused_moe(x, w13, w2, topk_weights, topk_ids):
    """Routed experts in bf16/fp32; see ref_fused_moe."""
    return ref_fused_moe(x, w13, w2, topk_weights, topk_ids)


def fused_moe_int4(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, group_size=32):
    """Routed experts in W4A16 (compressed-tensors pack-quantized); see ref_fused_moe_int4."""
    return ref_fused_moe_int4(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, group_size)


__all__ = [
    "mla_attention",
    "fused_moe",
    "fused_moe_int4",
    "moe_topk",
    "ref_moe_topk",
    "ref_mla_attention",
    "ref_fused_moe",
    "ref_fused_moe_int4",
    "pack_int4",
    "unpack_int4",
    "quantize_int4",
]
