"""Rotary position embedding of q and k in one launch: one program per token, all heads of both (or of k only)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_sh, stride_dh, n_heads, cos, sin, i_idx, i_ok,
                  INTERLEAVED: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rotates n_heads rows of one token: pairs (2i, 2i+1) when INTERLEAVED (DeepSeek), else (i, i + HALF)
    (neox/Llama). cos/sin [HALF_PAD] fp32. Loads of a head block happen before its stores: src may be dst."""
    if INTERLEAVED:
        off1 = 2 * i_idx
        off2 = 2 * i_idx + 1
    else:
        off1 = i_idx
        off2 = i_idx + HALF
    for h0 in range(0, n_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        m = (h < n_heads)[:, None] & i_ok[None, :]
        src = src_ptr + h[:, None] * stride_sh
        x1 = tl.load(src + off1[None, :], mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(src + off2[None, :], mask=m, other=0.0).to(tl.float32)
        # NOTE: the launcher turns off fp fusion, so these are the reference's roundings exactly
        # (two products, then the difference), never an fma.
        o1 = x1 * cos[None, :] - x2 * sin[None, :]
        o2 = x1 * sin[None, :] + x2 * cos[None, :]
        dst = dst_ptr + h[:, None] * stride_dh
        tl.store(dst + off1[None, :], o1.to(dst_ptr.dtype.element_ty), mask=m)
        tl.store(dst + off2[None, :], o2.to(dst_ptr.dtype.element_ty), mask=m)


@triton.jit
def rotary_kernel(
    pos_ptr, cos_ptr, sin_ptr,
    q_ptr, q_out_ptr, k_ptr, k_out_ptr, k_out_rows_ptr,
    stride_qt, stride_qh, stride_qot, stride_qoh,
    stride_kt, stride_kh, stride_kot, stride_koh,
    stride_table, HQ, HK,
    HAS_K: tl.constexpr, K_OUT_ROWS: tl.constexpr, INTERLEAVED: tl.constexpr, HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False,
    NORM_C: tl.constexpr = False, c_ptr=None, nw_ptr=None, c_out_ptr=None, stride_ct=0, stride_cot=0, C=0,
    eps=0.0, BLOCK_C: tl.constexpr = 16, HAS_Q: tl.constexpr = True,
):
    """Token t's q heads -> q_out row t (unless not HAS_Q); its k heads -> k_out row t, or row k_out_rows[t]
    (cache slots).
    NORM_C (with K_OUT_ROWS): also RMSNorm of the token's latent c [C] (fp32 math, the RMSNorm kernel's
    formula) into row k_out_rows[t] of c_out: MLA's kv_a norm and k rope in one launch."""
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i_idx = tl.arange(0, HALF_PAD)
    i_ok = i_idx < HALF
    cos = tl.load(cos_ptr + pos * stride_table + i_idx, mask=i_ok, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_table + i_idx, mask=i_ok, other=0.0)
    if HAS_Q:
        _rotate_heads(q_ptr + t * stride_qt, q_out_ptr + t * stride_qot, stride_qh, stride_qoh, HQ, cos, sin,
                      i_idx, i_ok, INTERLEAVED, HALF, BLOCK_H)
    if NORM_C:
        c_row = tl.load(k_out_rows_ptr + t).to(tl.int64)
        offs = tl.arange(0, BLOCK_C)
        ok = offs < C
        xf = tl.load(c_ptr + t * stride_ct + offs, mask=ok, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / C + eps)
        w = tl.load(nw_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(c_out_ptr + c_row * stride_cot + offs, (xf * rstd * w).to(c_out_ptr.dtype.element_ty), mask=ok)
    if HAS_K:
        k_row = tl.load(k_out_rows_ptr + t).to(tl.int64) if K_OUT_ROWS else t
        _rotate_heads(k_ptr + t * stride_kt, k_out_ptr + k_row * stride_kot, stride_kh, stride_koh, HK, cos, sin,
                      i_idx, i_ok, INTERLEAVED, HALF, BLOCK_H)
