"""Rotary position embedding of q and k in one launch: one program per token, all heads of both (or of k only).

Every load of a token's first head block (q's, k's, MLA's latent and the cache row) is issued before any store:
the compiler keeps loads below a store they might alias, so a kernel that loads, stores and loads again pays
one memory round trip per step of that chain. The first version did (position -> cos/sin -> q -> store ->
latent -> norm weight -> store -> cache row -> k -> store: seven round trips, read off its sm_90 SASS); now it is
two (position -> cos/sin) before the stores. With the RMSNorm's and the routing's loads moved the same way, the
61-layer Kimi step on the H200 got ~3.3 us a layer faster (docs/BENCHMARKS.md, twenty-seventh session)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _pair_offsets(i_idx, INTERLEAVED: tl.constexpr, HALF: tl.constexpr):
    """Offsets of the two members of pair i: (2i, 2i+1) when INTERLEAVED (DeepSeek), else (i, i + HALF)
    (neox/Llama)."""
    if INTERLEAVED:
        return 2 * i_idx, 2 * i_idx + 1
    else:
        return i_idx, i_idx + HALF


@triton.jit
def _load_heads(src_ptr, stride_sh, h, n_heads, i_idx, i_ok, INTERLEAVED: tl.constexpr, HALF: tl.constexpr):
    """Heads h [BLOCK_H] of one token: both members of each pair, fp32 [BLOCK_H, HALF_PAD] each."""
    off1, off2 = _pair_offsets(i_idx, INTERLEAVED, HALF)
    m = (h < n_heads)[:, None] & i_ok[None, :]
    src = src_ptr + h[:, None] * stride_sh
    x1 = tl.load(src + off1[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + off2[None, :], mask=m, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _store_rotated(dst_ptr, stride_dh, h, n_heads, x1, x2, cos, sin, i_idx, i_ok,
                   INTERLEAVED: tl.constexpr, HALF: tl.constexpr):
    """Rotates the pairs (x1, x2) of heads h by cos/sin [HALF_PAD] (fp32) and stores them to dst."""
    off1, off2 = _pair_offsets(i_idx, INTERLEAVED, HALF)
    m = (h < n_heads)[:, None] & i_ok[None, :]
    # NOTE: the launcher turns off fp fusion, so these are the reference's roundings exactly
    # (two products, then the difference), never an fma.
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x1 * sin[None, :] + x2 * cos[None, :]
    dst = dst_ptr + h[:, None] * stride_dh
    tl.store(dst + off1[None, :], o1.to(dst_ptr.dtype.element_ty), mask=m)
    tl.store(dst + off2[None, :], o2.to(dst_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rotate_rest(src_ptr, dst_ptr, stride_sh, stride_dh, n_heads, cos, sin, i_idx, i_ok,
                 INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    """Heads BLOCK_H .. n_heads - 1 (past the first block, which the kernel rotates itself), a block at a time;
    a block's loads happen before its stores, so src may be dst. No iteration when one block holds every head
    (MLA's 8 q heads and 1 k head; BLOCK_H is the heads rounded up to a power of two up to 2048 elements)."""
    for h0 in range(BLOCK_H, n_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        x1, x2 = _load_heads(src_ptr, stride_sh, h, n_heads, i_idx, i_ok, INTERLEAVED, HALF)
        _store_rotated(dst_ptr, stride_dh, h, n_heads, x1, x2, cos, sin, i_idx, i_ok, INTERLEAVED, HALF)


@triton.jit
def rotary_token(
    t, pos_ptr, cos_ptr, sin_ptr,
    q_ptr, q_out_ptr, k_ptr, k_out_ptr, k_out_rows_ptr,
    stride_qt, stride_qh, stride_qot, stride_qoh,
    stride_kt, stride_kh, stride_kot, stride_koh,
    stride_table, HQ, HK,
    HAS_K: tl.constexpr, K_OUT_ROWS: tl.constexpr, INTERLEAVED: tl.constexpr, HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
    NORM_C: tl.constexpr, c_ptr, nw_ptr, c_out_ptr, stride_ct, stride_cot, C,
    eps, BLOCK_C: tl.constexpr, HAS_Q: tl.constexpr, ONE_BLOCK: tl.constexpr,
):
    """Token t (int64) of rotary_kernel: its q heads -> q_out row t (unless not HAS_Q); its k heads -> k_out
    row t, or row k_out_rows[t] (cache slots). A function of its own so that another launch can run it in
    programs beside its own work (gemv_kernel's ROPE_SIDE: MLA's rotary beside W_UK) with the same code, hence
    the same bits, as the rotary launch.
    NORM_C (with K_OUT_ROWS): also RMSNorm of the token's latent c [C] (fp32 math, the RMSNorm kernel's
    formula) into row k_out_rows[t] of c_out: MLA's kv_a norm and k rope in one launch.
    The outputs must not overlap another operand (q_out may be q itself, k_out k itself): the first head
    blocks of q and k and the latent are all loaded before anything is stored (module doc). ONE_BLOCK: BLOCK_H
    covers HQ and HK, so no head loop follows (and no load follows a store: compile_checks.py asserts it)."""
    i_idx = tl.arange(0, HALF_PAD)
    i_ok = i_idx < HALF
    h = tl.arange(0, BLOCK_H)
    if NORM_C:  # the norm weight before the wait: no kernel writes weights
        offs = tl.arange(0, BLOCK_C)
        c_ok = offs < C
        nw = tl.load(nw_ptr + offs, mask=c_ok, other=0.0).to(tl.float32)
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    pos = tl.load(pos_ptr + t).to(tl.int64)
    k_row = tl.load(k_out_rows_ptr + t).to(tl.int64) if K_OUT_ROWS else t
    if HAS_Q:
        q1, q2 = _load_heads(q_ptr + t * stride_qt, stride_qh, h, HQ, i_idx, i_ok, INTERLEAVED, HALF)
    if NORM_C:
        xf = tl.load(c_ptr + t * stride_ct + offs, mask=c_ok, other=0.0).to(tl.float32)
    if HAS_K:
        k1, k2 = _load_heads(k_ptr + t * stride_kt, stride_kh, h, HK, i_idx, i_ok, INTERLEAVED, HALF)
    cos = tl.load(cos_ptr + pos * stride_table + i_idx, mask=i_ok, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_table + i_idx, mask=i_ok, other=0.0)
    if HAS_Q:
        _store_rotated(q_out_ptr + t * stride_qot, stride_qoh, h, HQ, q1, q2, cos, sin, i_idx, i_ok,
                       INTERLEAVED, HALF)
        if not ONE_BLOCK:
            _rotate_rest(q_ptr + t * stride_qt, q_out_ptr + t * stride_qot, stride_qh, stride_qoh, HQ, cos, sin,
                         i_idx, i_ok, INTERLEAVED, BLOCK_H, HALF)
    if NORM_C:
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / C + eps)
        tl.store(c_out_ptr + k_row * stride_cot + offs, (xf * rstd * nw).to(c_out_ptr.dtype.element_ty), mask=c_ok)
    if HAS_K:
        _store_rotated(k_out_ptr + k_row * stride_kot, stride_koh, h, HK, k1, k2, cos, sin, i_idx, i_ok,
                       INTERLEAVED, HALF)
        if not ONE_BLOCK:
            _rotate_rest(k_ptr + t * stride_kt, k_out_ptr + k_row * stride_kot, stride_kh, stride_koh, HK, cos,
                         sin, i_idx, i_ok, INTERLEAVED, BLOCK_H, HALF)


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
    eps=0.0, BLOCK_C: tl.constexpr = 16, HAS_Q: tl.constexpr = True, ONE_BLOCK: tl.constexpr = False,
):
    """One program per token: rotary_token(program_id(0), ...)."""
    rotary_token(tl.program_id(0).to(tl.int64), pos_ptr, cos_ptr, sin_ptr, q_ptr, q_out_ptr, k_ptr, k_out_ptr,
                 k_out_rows_ptr, stride_qt, stride_qh, stride_qot, stride_qoh, stride_kt, stride_kh, stride_kot,
                 stride_koh, stride_table, HQ, HK, HAS_K, K_OUT_ROWS, INTERLEAVED, HALF, HALF_PAD, BLOCK_H, PDL,
                 NORM_C, c_ptr, nw_ptr, c_out_ptr, stride_ct, stride_cot, C, eps, BLOCK_C, HAS_Q, ONE_BLOCK)
