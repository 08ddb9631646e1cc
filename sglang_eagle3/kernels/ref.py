"""Torch reference implementations of every kernel op.

These are the semantics the Triton kernels must match, and the path the engine takes where Triton is not
available (CPU). They are written to be CUDA-graph safe: no data-dependent shapes, no host syncs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang_eagle3.kernels.quant import unpack_int4

if TYPE_CHECKING:
    from sglang_eagle3.kernels.moe_topk import Routing


def _acc(x: torch.Tensor) -> torch.Tensor:
    """Accumulation precision: float32 for half types, the input's own for float32/float64."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


# --------------------------------------------------------------------------------------------------
# Skinny GEMM (decode/verify projections)
# --------------------------------------------------------------------------------------------------
def ref_gemv(x: torch.Tensor, w: torch.Tensor, *, w_up: torch.Tensor | None = None,
             add: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
             out: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
             eps: float = 0.0) -> torch.Tensor:
    """x [T, K] @ w [N, K]^T -> [T, N], or per head x [T, B, K] with w [B, N, K] -> [T, B, N] (w any view).
    The product is rounded to the output dtype (x.dtype, or ``out_dtype``: then computed from upcast operands),
    then ``add`` is added (a residual, rounded again), or with ``w_up`` the output is SiLU(x w^T) * (x w_up^T)
    with each of the three rounded as separate torch ops round them. ``out`` receives the result; without
    ``out_dtype`` its dtype is the output dtype (the skinny GEMM rounds its float32 sums once, into out). With
    ``norm_weight``, x is first ref_rms_norm(x, norm_weight, eps)."""
    if out is not None and out_dtype is None:
        out_dtype = out.dtype
    if norm_weight is not None:
        x = ref_rms_norm(x, norm_weight, eps)
    def mm(wt: torch.Tensor) -> torch.Tensor:
        if out_dtype is not None and out_dtype != x.dtype:
            xa, wt = x.to(out_dtype), wt.to(out_dtype)
        else:
            xa = x
        if wt.dim() == 2:
            return torch.nn.functional.linear(xa, wt)
        return torch.matmul(xa.transpose(0, 1), wt.transpose(1, 2)).transpose(0, 1)

    y = mm(w)
    if w_up is not None:
        y = torch.nn.functional.silu(y) * mm(w_up)
    elif add is not None:
        y = y + add
    return out.copy_(y) if out is not None else y


def ref_gemv_pair(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, *, w2_up: torch.Tensor | None = None,
                  out1_dtype: torch.dtype | None = None, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                  residual: torch.Tensor | None = None, route: Routing | None = None) -> tuple[torch.Tensor, ...]:
    """Two products of one x [T, K]: (x w1^T in ``out1_dtype``, x w2^T or with ``w2_up`` SiLU(x w2^T) *
    (x w2_up^T)), each as ref_gemv. With ``norm_weight`` x is first ref_rms_norm(x, norm_weight, eps,
    residual) and the stream it normalised (x + residual, or x itself) is returned third: the unfused
    numbers of a decoder layer's input norm followed by MLA's q_a and kv_a. With ``route`` the first product
    are router logits, and ref_moe_topk of them (weights, ids) follows last: a MoE layer's router and
    routing beside its shared expert."""
    stream = x
    if norm_weight is not None:
        if residual is None:
            x = ref_rms_norm(x, norm_weight, eps)
        else:
            x, stream = ref_rms_norm(x, norm_weight, eps, residual)
    else:
        assert residual is None, "residual is added before the norm: it needs norm_weight"
    ys = ref_gemv(x, w1, out_dtype=out1_dtype), ref_gemv(x, w2, w_up=w2_up)
    outs = ys if norm_weight is None else (*ys, stream)
    if route is not None:
        outs = (*outs, *ref_moe_topk(ys[0], route.bias, **route.topk_kwargs()))
    return outs


# --------------------------------------------------------------------------------------------------
# RMSNorm and rotary embedding
# --------------------------------------------------------------------------------------------------
def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, *,
                 out: torch.Tensor | None = None,
                 out_rows: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> x * rsqrt(mean(x^2) + eps) * weight, computed in float32 (float64 stays float64), in
    x.dtype. With residual: x is first replaced by x + residual (in x.dtype) and (out, that sum) returned.
    ``out`` receives the result (it may be x itself or a view); with ``out_rows`` [rows of x], row i goes to
    out[out_rows[i]] (cast to out's dtype) and ``out`` is returned.
    Traffic: reads x (and residual) and weight once, writes out (and the new residual)."""
    if residual is not None:
        x = x + residual
    xf = x.float() if x.element_size() < 4 else x
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = (xf * weight.to(xf.dtype)).to(x.dtype)
    if out_rows is not None:
        out[out_rows] = y.reshape(-1, y.shape[-1]).to(out.dtype)
        return out
    if out is not None:
        y = out.copy_(y)
    return y if residual is None else (y, x)


def ref_rotate(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               interleaved: bool) -> torch.Tensor:
    """x [..., N, heads, dim] or [..., N, dim], positions [..., N], cos/sin [P, dim/2] (any float dtype, cast
    to the compute dtype: float32 for half types, else x's own). ``interleaved`` rotates the pairs
    (x[2i], x[2i+1]) as DeepSeek does, otherwise (x[i], x[i + dim/2]) as Llama/neox does."""
    xf = x.float() if x.element_size() < 4 else x
    c, s = cos[positions].to(xf.dtype), sin[positions].to(xf.dtype)  # [..., N, dim/2]
    if x.dim() == positions.dim() + 2:
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xf.chunk(2, dim=-1)
        out = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return out.to(x.dtype)


def ref_apply_rotary(q: torch.Tensor | None, k: torch.Tensor | None, positions: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, *, interleaved: bool, inplace: bool = False, k_out: torch.Tensor | None = None,
                     k_out_rows: torch.Tensor | None = None,
                     c_norm: tuple | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Rotates q and k (either may be None, and is returned as None) at `positions`; see ref_rotate. In place
    writes into q and k. With k_out and k_out_rows [N], token i's rotated k goes to k_out[k_out_rows[i]] (cast
    to k_out's dtype; k is left as it was) and k_out is returned in k's place. ``c_norm`` = (c [N, C],
    weight [C], eps, c_out [S, C]) with k_out_rows: also ref_rms_norm(c) into rows k_out_rows of c_out (MLA's
    latent, same launch on GPU)."""
    if c_norm is not None:
        c, weight, eps, c_out = c_norm
        assert k_out_rows is not None, "c_norm writes cache rows: it needs k_out_rows"
        ref_rms_norm(c, weight, eps, out=c_out, out_rows=k_out_rows)
    q2 = None if q is None else ref_rotate(q, positions, cos, sin, interleaved)
    k2 = None if k is None else ref_rotate(k, positions, cos, sin, interleaved)
    if inplace and q is not None:
        q2 = q.copy_(q2)
    if k_out_rows is not None:
        k_out[k_out_rows] = k2.to(k_out.dtype)
        k2 = k_out
    elif inplace and k is not None:
        k2 = k.copy_(k2)
    return q2, k2


# --------------------------------------------------------------------------------------------------
# MoE routing (noaux_tc)
# --------------------------------------------------------------------------------------------------
def _top_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest of each row, largest first, the lowest index first among equals."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]


def ref_moe_topk(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    *,
    top_k: int,
    n_group: int,
    topk_group: int,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 noaux_tc routing. Returns (weights float32 [T, top_k], ids int32 [T, top_k]).

    Bias steers selection only; the returned weights are the unbiased sigmoid scores, renormalised and
    multiplied by routed_scaling_factor.
    """
    T, E = router_logits.shape
    scores = router_logits.float().sigmoid()  # [T, E]
    choice = scores if correction_bias is None else scores + correction_bias.float()[None, :]
    if n_group > 1:
        per_group = E // n_group
        group_scores = choice.view(T, n_group, per_group).topk(2, dim=-1).values.sum(-1)  # [T, G]
        # Stable sorts, not topk (whose tie order is unspecified on CPU): among equal scores the lowest group and
        # expert id first, as the kernel breaks ties.
        group_idx = _top_indices(group_scores, topk_group)  # [T, topk_group]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
        expert_mask = group_mask[:, :, None].expand(T, n_group, per_group).reshape(T, E)
        choice = choice.masked_fill(expert_mask == 0, float("-inf"))
    ids = _top_indices(choice, top_k)  # [T, k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids.to(torch.int32)


# --------------------------------------------------------------------------------------------------
# MLA attention (absorbed) over the paged latent cache
# --------------------------------------------------------------------------------------------------
def gather_paged(cache: torch.Tensor, page_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """[num_slots, D] cache + [B, P] page table -> [B, P * page_size, D] (positions in order)."""
    B, P = page_table.shape
    offs = torch.arange(page_size, device=page_table.device)
    slots = page_table.long()[:, :, None] * page_size + offs[None, None, :]  # [B, P, page]
    return cache[slots.view(B, P * page_size)]


def causal_visible(seq_lens: torch.Tensor, T: int, K: int) -> torch.Tensor:
    """[B, T, K] bool: key k is visible to new token t of request b, which sits at position seq_lens[b] - T + t
    (the paged references' position rule: a request's T new tokens are its last ones)."""
    q_pos = seq_lens.long()[:, None] - T + torch.arange(T, device=seq_lens.device)[None, :]  # [B, T]
    return torch.arange(K, device=seq_lens.device)[None, None, :] <= q_pos[:, :, None]


def ref_mla_attention(
    q_nope_latent: torch.Tensor,
    q_rope: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    tokens_per_req: int,
    page_size: int,
    kv_lora_rank: int,
    sm_scale: float,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Absorbed MLA attention for decode (T=1) and verify (T=k+1) requests.

    q_nope_latent: [B*T, H, Dc]  queries already multiplied by W_UK (Dc = kv_lora_rank)
    q_rope:        [B*T, H, Dr]  rotated; or un-rotated with rope = (cos, sin) [P, Dr/2] and positions [B*T]:
                   then rotated here first (ref_rotate, DeepSeek's interleaved pairs), as the kernel does
    kv_cache:      [num_slots, Dc + Dr]  latent kv followed by the shared rope key
    page_table:    [B, P] int32 page ids; seq_lens: [B] total tokens including the T new ones
    Query i of request b sits at position seq_lens[b] - T + i and sees keys 0..that position.
    Returns [B*T, H, Dc] (attention over the latent values; the caller applies W_UV).
    """
    B = page_table.shape[0]
    T = tokens_per_req
    H = q_rope.shape[1]
    if rope is not None:
        q_rope = ref_rotate(q_rope, positions, *rope, interleaved=True)
    kv = _acc(gather_paged(kv_cache, page_table, page_size))  # [B, K, Dc+Dr]
    K = kv.shape[1]
    c, k_rope = kv[..., :kv_lora_rank], kv[..., kv_lora_rank:]
    qn = _acc(q_nope_latent).reshape(B, T * H, kv_lora_rank).to(kv.dtype)
    qr = _acc(q_rope).reshape(B, T * H, q_rope.shape[-1]).to(kv.dtype)  # no -1: B may be 0
    scores = (torch.bmm(qn, c.transpose(1, 2)) + torch.bmm(qr, k_rope.transpose(1, 2))) * sm_scale
    scores = scores.view(B, T, H, K)
    scores = scores.masked_fill(~causal_visible(seq_lens, T, K)[:, :, None, :], float("-inf"))
    probs = scores.softmax(-1).view(B, T * H, K)
    out = torch.bmm(probs, c)  # [B, T*H, Dc]
    return out.view(B * T, H, kv_lora_rank).to(q_rope.dtype)


def ref_mla_mha_prefill(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_b_weight: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    tokens_per_req: int,
    page_size: int,
    kv_lora_rank: int,
    sm_scale: float,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """MLA in the non-absorbed (MHA) form, as prefill computes it: every cached latent c is decompressed through
    kv_b_proj into per-head keys k_nope = W_UK[h] c and values v = W_UV[h] c (rounded to the cache's dtype, as a
    kernel storing them would), and each head attends over [k_nope | k_rope] with its own values.

    q_nope:      [B*T, H, D]   the heads' nope queries (not multiplied by W_UK)
    q_rope:      [B*T, H, Dr]  rotated, or un-rotated with rope / positions (see ref_mla_attention)
    kv_b_weight: [H * (D + Dv), Dc]  kv_b_proj's weight on this rank: per head D key rows, then Dv value rows
    Causality and positions as ref_mla_attention's. Returns [B*T, H, Dv]. Mathematically the absorbed form's
    output times W_UV[h]^T; the two differ by the rounding of k_nope and v (and the order of the sums)."""
    B = page_table.shape[0]
    T = tokens_per_req
    H, D = q_nope.shape[1], q_nope.shape[2]
    if rope is not None:
        q_rope = ref_rotate(q_rope, positions, *rope, interleaved=True)
    kv = gather_paged(kv_cache, page_table, page_size)  # [B, K, Dc+Dr]
    K = kv.shape[1]
    c, k_rope = _acc(kv[..., :kv_lora_rank]), _acc(kv[..., kv_lora_rank:])
    w = _acc(kv_b_weight).view(H, -1, kv_lora_rank)
    k_nope = torch.einsum("bkc,hdc->bhkd", c, w[:, :D]).to(kv.dtype).to(c.dtype)  # [B, H, K, D]
    v = torch.einsum("bkc,hdc->bhkd", c, w[:, D:]).to(kv.dtype).to(c.dtype)  # [B, H, K, Dv]
    qn = _acc(q_nope).reshape(B, T, H, D).transpose(1, 2).to(c.dtype)  # [B, H, T, D]
    qr = _acc(q_rope).reshape(B, T, H, q_rope.shape[-1]).transpose(1, 2).to(c.dtype)
    scores = (qn @ k_nope.transpose(-1, -2) + qr @ k_rope[:, None].transpose(-1, -2)) * sm_scale  # [B, H, T, K]
    scores = scores.masked_fill(~causal_visible(seq_lens, T, K)[:, None], float("-inf"))
    out = scores.softmax(-1) @ v  # [B, H, T, Dv]
    return out.transpose(1, 2).reshape(B * T, H, v.shape[-1]).to(q_rope.dtype)


# --------------------------------------------------------------------------------------------------
# Fused MoE (routed experts) for small batches
# --------------------------------------------------------------------------------------------------
def _expert_mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """x [N, H], w13 [N, 2I, H], w2 [N, H, I] (one expert per row) -> [N, H] in float32."""
    gate_up = torch.bmm(_acc(w13), _acc(x)[:, :, None].to(_acc(w13).dtype)).squeeze(-1)  # [N, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    act = torch.nn.functional.silu(gate) * up  # [N, I]
    return torch.bmm(_acc(w2).to(act.dtype), act[:, :, None]).squeeze(-1)  # [N, H]


def ref_fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I]; topk_* [T, k] -> [T, H], plus
    ``add`` [T, H] (x.dtype: the shared experts' output) when given, added after the cast to x.dtype.

    Gathers each chosen expert's weights per (token, slot): fine for tests and tiny models; the Triton
    kernel reads each distinct expert once (and adds ``add`` in its final store, rounded the same way).
    """
    T, k = topk_ids.shape
    ids = topk_ids.long().reshape(-1)  # [T*k]
    xs = x.repeat_interleave(k, dim=0)  # [T*k, H]
    out = _expert_mlp(xs, w13[ids], w2[ids]).view(T, k, w2.shape[1])  # no -1: T may be 0
    out = (out * topk_weights.to(out.dtype)[:, :, None]).sum(1).to(x.dtype)
    return out if add is None else out + add


def ref_fused_moe_int4(
    x: torch.Tensor,
    w13_packed: torch.Tensor,
    w13_scale: torch.Tensor,
    w2_packed: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    group_size: int = 32,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """W4A16 fused MoE over compressed-tensors pack-quantized weights.

    w13_packed int32 [E, 2I, H/8], w13_scale [E, 2I, H/group]; w2_packed int32 [E, H, I/8],
    w2_scale [E, H, I/group]. Only the chosen experts are dequantised. ``add`` as in ref_fused_moe.
    """
    T, k = topk_ids.shape
    ids = topk_ids.long().reshape(-1)
    w13 = unpack_int4(w13_packed[ids], w13_scale[ids], group_size)  # [T*k, 2I, H]
    w2 = unpack_int4(w2_packed[ids], w2_scale[ids], group_size)  # [T*k, H, I]
    xs = x.repeat_interleave(k, dim=0)
    out = _expert_mlp(xs, w13, w2).view(T, k, w2.shape[1])
    out = (out * topk_weights.float()[:, :, None]).sum(1).to(x.dtype)
    return out if add is None else out + add


# --------------------------------------------------------------------------------------------------
# Standard (GQA) attention over a paged K/V cache: the EAGLE-3 draft's Llama layer
# --------------------------------------------------------------------------------------------------
def ref_gqa_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    tokens_per_req: int,
    page_size: int,
    sm_scale: float,
) -> torch.Tensor:
    """q [B*T, Hq, D]; kv_cache [num_slots, 2, Hkv, D] (k then v) -> [B*T, Hq, D].

    Same position rule as ref_mla_attention: query i of request b sits at seq_lens[b] - T + i.
    """
    B, T = page_table.shape[0], tokens_per_req
    Hq, D = q.shape[1], q.shape[2]
    kv = _acc(gather_paged(kv_cache.flatten(1), page_table, page_size))  # [B, K, 2*Hkv*D]
    K = kv.shape[1]
    kv = kv.view(B, K, 2, kv_cache.shape[2], D)  # no -1: B may be 0
    Hkv = kv.shape[3]
    k = kv[:, :, 0].repeat_interleave(Hq // Hkv, dim=2)  # [B, K, Hq, D]
    v = kv[:, :, 1].repeat_interleave(Hq // Hkv, dim=2)
    qf = _acc(q).reshape(B, T, Hq, D).to(kv.dtype)
    scores = torch.einsum("bthd,bkhd->bthk", qf, k) * sm_scale  # [B, T, Hq, K]
    scores = scores.masked_fill(~causal_visible(seq_lens, T, K)[:, :, None, :], float("-inf"))
    out = torch.einsum("bthk,bkhd->bthd", scores.softmax(-1), v)
    return out.reshape(B * T, Hq, D).to(q.dtype)


# --------------------------------------------------------------------------------------------------
# Sampling: Gumbel-max over noise that is a hash of (request key, position, token id)
# --------------------------------------------------------------------------------------------------
_M32 = 0xFFFFFFFF
# lowbias32 (C. Wellons' hash prospector): an invertible 32-bit mix with low avalanche bias.
MIX32_MUL1, MIX32_MUL2 = 0x7FEB352D, 0x846CA68B
TOKEN_MUL = 0x9E3779B9  # token ids spread over the 32 bits before the mix (odd: a bijection mod 2^32)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) and a constant c < 2^32, with no int64 product past 2^48."""
    hi, lo = c >> 16, c & 0xFFFF
    return (x * lo + ((x * hi) & 0xFFFF) * 65536) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int64 x in [0, 2^32) -> int64 in [0, 2^32) (the kernel computes it in uint32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, MIX32_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX32_MUL2)
    return x ^ (x >> 16)


def row_keys(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A row's noise key from its request key (int64 in [0, 2^32)) and the position of the token it samples."""
    return mix32(keys ^ mix32(positions.to(torch.int64) & _M32))


def ref_gumbel_noise(keys: torch.Tensor, positions: torch.Tensor, V: int,
                     token_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Standard Gumbel noise float32 [R, V]: g[r, v] = -log(-log(u)), u = (h >> 9 + 1/2) / 2^23 in (0, 1) from
    h = mix32(mix32(row key ^ v * TOKEN_MUL) ^ row key) (two rounds, so neighbouring tokens and rows share no
    structure). A function of (key, position, token) alone: the same whatever the batch or the step. With
    ``token_ids`` [V] column v takes token token_ids[v]'s noise (a draft vocabulary's columns, its target ids)."""
    rk = row_keys(keys, positions)[:, None]
    tok = torch.arange(V, dtype=torch.int64, device=keys.device) if token_ids is None else token_ids.to(torch.int64)
    v = _mul32(tok & _M32, TOKEN_MUL)[None, :]
    h = mix32(mix32(rk ^ v) ^ rk)
    u = ((h >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)
    return -torch.log(-torch.log(u))


def ref_gumbel_argmax(scores: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                      token_ids: torch.Tensor | None = None) -> torch.Tensor:
    """argmax_v (scores[r, v] + g[r, v]) -> int64 [R]: a sample of softmax(scores[r]) (Gumbel-max; -inf scores
    are never chosen unless the whole row is -inf, then 0). scores float32 [R, V]; keys, positions int64 [R];
    token_ids [V] as ref_gumbel_noise takes them."""
    return (scores.float() + ref_gumbel_noise(keys, positions, scores.shape[-1], token_ids)).argmax(-1)


def ref_top_threshold(z: torch.Tensor, lo: torch.Tensor, target: torch.Tensor,
                      zmax: torch.Tensor | None = None) -> torch.Tensor:
    """The threshold a top_k or top_p filter puts on a row of scores: float32 [R] for z float32 [R, V].

    Candidates of row r: z >= lo[r] (the thresholds of the filters before), with ``zmax`` also a weight exp(z -
    zmax[r]) > 0 in float32 (a token whose weight underflows is dropped), else weight 1. The threshold is the
    least candidate value v such that the candidates strictly above v weigh less than P: P = target[r] times the
    candidates' total weight with ``zmax`` (top_p: the most likely tokens up to the first whose cumulative mass
    reaches top_p; tokens tied with it kept too), P = target[r] = k without (top_k: the k-th largest value).
    max(lo, v) for rows whose target turns the filter on (top_p < 1; 1 <= k < V), lo for the others. Sums in
    float64, one row at a time (a reference, not fast)."""
    R, V = z.shape
    out = lo.float().clone()
    for r in range(R):
        zr = z[r].float()
        cand = zr >= lo[r]
        if zmax is not None:
            active = bool(target[r] < 1)
            w32 = torch.exp(zr - zmax[r].float())
            cand &= w32 > 0
            w = torch.exp(zr.double() - float(zmax[r]))
        else:
            active = bool(1 <= target[r] < V)
            w = torch.ones(V, dtype=torch.float64, device=z.device)
        if not active or not bool(cand.any()):
            continue
        vals, inv = torch.unique(zr[cand], return_inverse=True)  # ascending distinct candidate values
        weight = torch.zeros(len(vals), dtype=torch.float64, device=z.device).index_add_(0, inv, w[cand])
        above = weight.sum() - weight.cumsum(0)  # weight strictly above each value
        total = float(weight.sum())
        p = float(target[r]) * total if zmax is not None else float(target[r])
        i = int((above < p).nonzero()[0])
        out[r] = torch.maximum(vals[i], lo[r].float())
    return out
