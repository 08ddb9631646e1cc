"""Launcher for rotary embedding of q and k in one launch; semantics in ref_apply_rotary.

One program per token rotates every head of q and of k, or of k alone (MLA with q's rope in the attention
kernel), grid fixed by shapes (graph-safe), reading cos/sin
from a float32 [max_positions, rot_dim/2] table at the token's position. In place (into strided views such
as MLA's q_rope inside q and k_rope inside kv_a) or out of place. Floating-point contraction is turned off
so each output is rounded exactly as the torch reference rounds it (products, then sum/difference).
"""

from __future__ import annotations

import torch
import triton

from sglang_eagle3.kernels import tuning
from sglang_eagle3.kernels.triton.rotary import rotary_kernel

TILE = 2048  # elements of one head block: BLOCK_H * HALF_PAD


def _as_heads(t: torch.Tensor, N: int) -> torch.Tensor:
    """[N, D] or [N, H, D] -> a [N, H, D] view."""
    assert t.dim() in (2, 3) and t.shape[0] == N, f"expected [{N}, D] or [{N}, H, D], got {tuple(t.shape)}"
    assert t.stride(-1) == 1, f"rotary operands need unit inner stride, got strides {t.stride()}"
    return t[:, None, :] if t.dim() == 2 else t


def rotary_args(q: torch.Tensor | None, k: torch.Tensor | None, positions: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, *, interleaved: bool, inplace: bool = False, k_out: torch.Tensor | None = None,
                k_out_rows: torch.Tensor | None = None, c_norm: tuple | None = None) -> tuple:
    """(q', k', rotary_kernel's arguments but PDL) for triton_apply_rotary with these arguments, which it checks
    first; q' and k' are the tensors the launch writes (new ones unless in place or k_out). One program a token
    (positions.shape[0]) runs them. Shared by the rotary launch and by gemv_kernel's ROPE_SIDE programs
    (triton_gemv's ``rotary``: MLA's rotary beside W_UK), which run the same code."""
    N = positions.shape[0]
    assert positions.dim() == 1 and positions.is_contiguous(), f"positions must be contiguous [N], {positions.shape}"
    assert positions.dtype in (torch.int32, torch.int64), f"{positions.dtype=}"
    assert cos.dtype == torch.float32 and sin.dtype == torch.float32, f"{cos.dtype=} {sin.dtype=} must be float32"
    assert cos.shape == sin.shape and cos.dim() == 2 and cos.stride() == sin.stride() and cos.stride(1) == 1, (
        f"cos/sin must be [P, D/2] with unit inner stride, got {tuple(cos.shape)} {cos.stride()} {sin.stride()}")
    half = cos.shape[1]
    assert q is not None or k is not None, "nothing to rotate: q and k are both None"
    q3 = _as_heads(q, N) if q is not None else None
    k3 = _as_heads(k, N) if k is not None else None
    for name, t in (("q", q3), ("k", k3)):
        if t is None:
            continue
        assert t.shape[-1] == 2 * half, f"{name} last dim {t.shape[-1]} != 2 * table width {half}"
        assert t.dtype in (torch.bfloat16, torch.float16, torch.float32), f"unsupported {name}.dtype={t.dtype}"
        assert t.device == positions.device == cos.device, f"{name} on {t.device}, tables on {cos.device}"
    q_out = None if q is None else (q if inplace else torch.empty(q.shape, dtype=q.dtype, device=q.device))
    any3 = q3 if q3 is not None else k3  # stands in for the operand not given (the kernel never touches it)
    if k_out_rows is not None:
        assert k is not None and k_out is not None, "k_out_rows needs k and k_out"
        assert k_out_rows.shape == (N,) and k_out_rows.is_contiguous() and not k_out_rows.dtype.is_floating_point, (
            f"k_out_rows must be contiguous int [{N}], got {k_out_rows.dtype} {tuple(k_out_rows.shape)}")
        ko3 = _as_heads(k_out, k_out.shape[0])
        assert ko3.shape[1:] == k3.shape[1:], f"k_out rows {tuple(ko3.shape[1:])} != k rows {tuple(k3.shape[1:])}"
        assert ko3.dtype in (torch.bfloat16, torch.float16, torch.float32), f"unsupported {k_out.dtype=}"
    else:
        assert k_out is None, "k_out is only for k_out_rows (otherwise use inplace or the returned tensor)"
        k_out = None if k is None else (k if inplace else torch.empty(k.shape, dtype=k.dtype, device=k.device))
        ko3 = _as_heads(k_out, N) if k_out is not None else any3
    qo3 = _as_heads(q_out, N) if q_out is not None else any3
    if c_norm is not None:
        c, nw, eps, c_out = c_norm
        assert k_out_rows is not None, "c_norm writes cache rows: it needs k_out_rows"
        C = c.shape[-1]
        assert c.dim() == 2 and c.shape[0] == N and c.stride(1) == 1, f"c must be [{N}, C], got {tuple(c.shape)}"
        assert c_out.dim() == 2 and c_out.shape[1] == C and c_out.stride(1) == 1, (
            f"c_out must be [S, {C}] with unit inner stride, got {tuple(c_out.shape)} {c_out.stride()}")
        assert nw.shape == (C,) and nw.is_contiguous(), f"c_norm weight must be contiguous [{C}], got {nw.shape}"
        c_kw = dict(NORM_C=True, c_ptr=c, nw_ptr=nw, c_out_ptr=c_out, stride_ct=c.stride(0),
                    stride_cot=c_out.stride(0), C=C, eps=float(eps), BLOCK_C=triton.next_power_of_2(C))
    else:
        c_kw = {}
    half_pad = triton.next_power_of_2(half)
    hq, hk = (0 if t is None else t.shape[1] for t in (q3, k3))
    q3, k3 = (any3 if t is None else t for t in (q3, k3))
    block_h = max(1, min(triton.next_power_of_2(max(hq, hk)), TILE // half_pad))
    args = dict(
        pos_ptr=positions, cos_ptr=cos, sin_ptr=sin, q_ptr=q3, q_out_ptr=qo3, k_ptr=k3, k_out_ptr=ko3,
        k_out_rows_ptr=k_out_rows if k_out_rows is not None else positions,
        stride_qt=q3.stride(0), stride_qh=q3.stride(1), stride_qot=qo3.stride(0), stride_qoh=qo3.stride(1),
        stride_kt=k3.stride(0), stride_kh=k3.stride(1), stride_kot=ko3.stride(0), stride_koh=ko3.stride(1),
        stride_table=cos.stride(0), HQ=hq, HK=hk, HAS_Q=q is not None, HAS_K=k is not None,
        K_OUT_ROWS=k_out_rows is not None, INTERLEAVED=bool(interleaved), HALF=half, HALF_PAD=half_pad,
        BLOCK_H=block_h, ONE_BLOCK=max(hq, hk) <= block_h, **c_kw)
    return q_out, k_out, args


def triton_apply_rotary(q: torch.Tensor | None, k: torch.Tensor | None, positions: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, *, interleaved: bool, inplace: bool = False,
                        k_out: torch.Tensor | None = None, k_out_rows: torch.Tensor | None = None,
                        c_norm: tuple | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """q [N, Hq, D] or [N, D] (or None), k likewise (or None), positions [N] int, cos/sin float32 [P, D/2] ->
    (q', k') in q's/k's dtype, None for an operand not given; in place returns q and k themselves. A launch of
    k alone does not read q at all (nor wait for it). With k_out [S, Hk, D] or [S, D] and k_out_rows [N],
    token i's rotated k goes to k_out[k_out_rows[i]] (any float dtype: MLA's cache slots) and k_out is
    returned for k. Positions must lie in [0, P). ``c_norm`` = (c [N, C], weight [C], eps, c_out [S, C]) with
    k_out_rows: the RMSNorm of c goes to rows k_out_rows of c_out in the same launch (MLA's latent)."""
    q_out, k_out, args = rotary_args(q, k, positions, cos, sin, interleaved=interleaved, inplace=inplace,
                                     k_out=k_out, k_out_rows=k_out_rows, c_norm=c_norm)
    if positions.shape[0] == 0:
        return q_out, k_out
    pdl = tuning.pdl(positions.device, "rotary")
    rotary_kernel[(positions.shape[0],)](**args, num_warps=1 if tuning.interpreting() else 4,
                                         enable_fp_fusion=False, PDL=pdl, **tuning.pdl_launch(pdl))
    return q_out, k_out
