"""Absorbed MLA attention over a paged latent cache, split over the KV axis.

Stage 1: program (request b, query-row block m, split s) runs online softmax over its slice of the keys and
writes a normalised partial output and its log-sum-exp (base 2). Stage 2 merges the splits.
A query row is one (new token t, head h) pair of request b: row r -> t = r // H, h = r % H.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def mla_split_kv_kernel(
    qn_ptr, qr_ptr, kv_ptr, page_table_ptr, seq_lens_ptr, mid_o_ptr, mid_lse_ptr,
    stride_qn_tok, stride_qn_head, stride_qr_tok, stride_qr_head, stride_kv_slot, stride_pt_req,
    stride_mo_tok, stride_mo_head, stride_mo_split, stride_ml_tok, stride_ml_head,
    sm_scale_log2, NUM_SPLITS,
    T: tl.constexpr, H: tl.constexpr, DC: tl.constexpr, DR: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    mb = tl.program_id(1)
    split = tl.program_id(2)

    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # [M] query rows
    row_ok = rows < T * H
    tok = rows // H
    head = rows % H
    dc = tl.arange(0, DC)
    dr = tl.arange(0, DR)

    seq_len = tl.load(seq_lens_ptr + b)
    q_pos = seq_len - T + tok  # [M] last visible key of each row
    # Split the keys this request actually has (not the page table's capacity): a graph captured at a
    # large page table stays balanced for short contexts.
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    q_tok = b * T + tok
    qn = tl.load(qn_ptr + q_tok[:, None] * stride_qn_tok + head[:, None] * stride_qn_head + dc[None, :],
                 mask=row_ok[:, None], other=0.0)  # [M, DC]
    qr = tl.load(qr_ptr + q_tok[:, None] * stride_qr_tok + head[:, None] * stride_qr_head + dr[None, :],
                 mask=row_ok[:, None], other=0.0)  # [M, DR]
    if INTERPRET:
        qn = qn.to(tl.float32)
        qr = qr.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)  # [N] key positions
        key_ok = pos < end
        page = tl.load(page_table_ptr + b * stride_pt_req + pos // PAGE_SIZE, mask=key_ok, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        c = tl.load(kv_ptr + slot[:, None] * stride_kv_slot + dc[None, :], mask=key_ok[:, None], other=0.0)
        kr = tl.load(kv_ptr + slot[:, None] * stride_kv_slot + DC + dr[None, :], mask=key_ok[:, None],
                     other=0.0)
        if INTERPRET:
            c = c.to(tl.float32)
            kr = kr.to(tl.float32)
        s = tl.dot(qn, tl.trans(c)) + tl.dot(qr, tl.trans(kr))  # [M, N]
        s = s * sm_scale_log2
        visible = key_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # NOTE: a row with no visible key yet keeps m = -inf; shift by 0 there to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
        m_i = m_new

    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    tl.store(mid_o_ptr + q_tok[:, None] * stride_mo_tok + head[:, None] * stride_mo_head
             + split * stride_mo_split + dc[None, :], out, mask=row_ok[:, None])
    tl.store(mid_lse_ptr + q_tok * stride_ml_tok + head * stride_ml_head + split, lse, mask=row_ok)


@triton.jit
def mla_merge_splits_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr,
    stride_mo_tok, stride_mo_head, stride_mo_split, stride_ml_tok, stride_ml_head,
    stride_o_tok, stride_o_head, NUM_SPLITS,
    SPLITS_PAD: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (token, head, D-block): all splits' partials loaded at once, weighted by exp2(lse - max).
    Empty splits have lse = -inf (weight 0) and zero partials, so no branch is needed."""
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    tok = tl.program_id(0)
    head = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    sp_ok = sp < NUM_SPLITS
    lse = tl.load(mid_lse_ptr + tok * stride_ml_tok + head * stride_ml_head + sp, mask=sp_ok, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # [SPLITS_PAD]
    total = tl.sum(w, axis=0)
    o = tl.load(mid_o_ptr + tok * stride_mo_tok + head * stride_mo_head + sp[:, None] * stride_mo_split
                + d[None, :], mask=sp_ok[:, None], other=0.0)  # [SPLITS_PAD, BLOCK_D]
    out = tl.sum(o * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + tok * stride_o_tok + head * stride_o_head + d, out.to(out_ptr.dtype.element_ty))
