"""Absorbed MLA attention over a paged latent cache, split over the KV axis; a second launch merges the splits.
The same kernels serve grouped-query attention (the EAGLE-3 draft's Llama layer): there a kv head's keys and
values are separate rows (SEPARATE_V), the score is one dot (DR = 0) and each of GROUPS kv heads has H query
heads (the row-block axis runs over kv heads, then row blocks); MLA is the case of one kv head whose value is
the key's first DC columns.

Program (request b, query-row block mb, split s) of mla_split_kv_kernel runs online softmax over its slice
of the keys. With one split it writes the output. With more it stores a normalised fp32 partial output and
its log-sum-exp (base 2), and mla_merge_splits_kernel, launched after it, merges the splits.
A query row is one (new token t, head h) pair of request b: row r -> t = r // H, h = r % H.
With ROPE the queries' rope columns arrive un-rotated and each program rotates its rows as it loads them
(_rope_rows), bit for bit as the rotary kernel would have: the rotary launch then needs only k, and no
longer waits for q. The rotated tile has the plain load's shape and layout, so the key loop is the same code
with or without ROPE and the outputs are bit-identical to rotating first. (Splitting the rope score into
even and odd half-width dots instead would sum in another order than the one DR-wide dot: not bit-identical.)
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sglang_eagle3.kernels.triton.exact import mul_rn, pairwise_sum


@triton.jit
def _rope_rows(qr_ptr, q_offs, row_ok, pos_ptr, q_tok, cos_ptr, sin_ptr, stride_table, dr,
               INTERPRET: tl.constexpr):
    """The [M, DR] rope tile of q rotated at each row's position, in q's dtype, equal to what rotary_kernel
    stores (DeepSeek's interleaved pairs (2i, 2i+1): o_2i = x_2i cos_i - x_2i+1 sin_i, o_2i+1 = x_2i sin_i +
    x_2i+1 cos_i, each product rounded to fp32, then the sum). Column d reads its pair partner d ^ 1: no
    reshapes, and the tile comes out in the layout the plain load has."""
    pos = tl.load(pos_ptr + q_tok, mask=row_ok, other=0).to(tl.int64)  # [M]
    table = pos[:, None] * stride_table + (dr // 2)[None, :]  # [M, DR]: column d uses pair d // 2
    cos = tl.load(cos_ptr + table, mask=row_ok[:, None], other=0.0)
    sin = tl.load(sin_ptr + table, mask=row_ok[:, None], other=0.0)
    x = tl.load(qr_ptr + q_offs + dr[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    partner = tl.load(qr_ptr + q_offs + (dr ^ 1)[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    # Even d: x cos - partner sin; odd d: partner sin + x cos (= x cos + partner sin: the same rounding).
    xc = mul_rn(x, cos, INTERPRET)
    ps = mul_rn(partner, sin, INTERPRET)
    rot = tl.where((dr % 2 == 0)[None, :], xc - ps, xc + ps)
    return rot.to(qr_ptr.dtype.element_ty)


@triton.jit
def _split_keys(seq_len, NUM_SPLITS, BLOCK_N: tl.constexpr):
    """(keys a split, splits holding any key) for a request of seq_len keys over NUM_SPLITS programs.

    The keys the request actually has are divided, not the page table's capacity: a graph captured at a large
    page table stays balanced for short contexts. The splits past the last key (most of them when the
    capacity is far above the context, as a server's graphs have it) store no partials, and the merge
    counts only the active ones."""
    per_split = tl.maximum(tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N), 1) * BLOCK_N
    return per_split, tl.cdiv(seq_len, per_split)


@triton.jit
def mla_split_kv_kernel(
    qn_ptr, qr_ptr, kv_ptr, page_table_ptr, seq_lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
    stride_qn_tok, stride_qn_head, stride_qr_tok, stride_qr_head, stride_kv_slot, stride_pt_req,
    stride_o_tok, stride_o_head, sm_scale_log2, NUM_SPLITS,
    T: tl.constexpr, H: tl.constexpr, DC: tl.constexpr, DR: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_KV: tl.constexpr, DOT_PRECISION: tl.constexpr,
    INTERPRET: tl.constexpr, PDL: tl.constexpr = False,
    ROPE: tl.constexpr = False, pos_ptr=None, cos_ptr=None, sin_ptr=None, stride_table=0,
    GROUPS: tl.constexpr = 1, stride_kv_group=0, SEPARATE_V: tl.constexpr = False, v_ptr=None, stride_v_slot=0,
    stride_v_group=0,
):
    """out [B*T, GROUPS*H, DC] over grid (B, GROUPS x row blocks, NUM_SPLITS). SPLIT_KV (NUM_SPLITS > 1): mid_o
    fp32 [B, GROUPS x row blocks, NUM_SPLITS, BLOCK_M, DC] and mid_lse fp32 [B, GROUPS x row blocks, NUM_SPLITS,
    BLOCK_M] scratch (rows past T*H are never written); out is left to mla_merge_splits_kernel.
    GROUPS kv heads (grouped-query attention): kv head g's keys at kv_ptr + g * stride_kv_group serve query heads
    g*H .. g*H + H-1. SEPARATE_V: values are rows of v_ptr (slot and group strides of their own), DC wide; else
    the value is the key's first DC columns (MLA's latent). DR = 0: no rope part in the score (q_rope unused).
    DOT_PRECISION: tl.dot's input_precision (tuning.dot_precision).
    ROPE: q's rope columns are un-rotated; rotate them at positions pos [B*T] with fp32 tables cos/sin
    [P, DR/2] (row stride stride_table) as they load. The cached k rope is already rotated.
    NOTE: reading the graph's seq_lens and page table before the PDL wait (the first key tile's entries),
    and with them an L2 prefetch of that tile's cache rows, was measured on the H200 (eleventh session,
    benchmarks/results/h200/session11_e2_round_dd341d4.txt): no faster, and 5-6 us slower with the prefetch.
    Removed; the split kernel does nothing before its wait. Nor does a split past the request's keys return
    early (after the active count): measured slower, +0.6 us at 1k and +1.5 us at 8k where every split is
    active, since q's loads then wait for seq_len (session11_e7_round_e355194.txt); such a split runs an
    empty key loop and stores nothing."""
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    mb_all = tl.program_id(1)  # (kv head, row block of its query rows)
    split = tl.program_id(2)
    if GROUPS > 1:
        group = mb_all // tl.cdiv(T * H, BLOCK_M)
        mb = mb_all % tl.cdiv(T * H, BLOCK_M)
        kv_ptr += group * stride_kv_group
        if SEPARATE_V:
            v_ptr += group * stride_v_group
    else:  # MLA's one latent head: the code it was measured with
        group = 0
        mb = mb_all

    m_idx = tl.arange(0, BLOCK_M)
    rows = mb * BLOCK_M + m_idx  # [M] query rows
    row_ok = rows < T * H
    tok = rows // H
    head = group * H + rows % H  # the query head
    dc = tl.arange(0, DC)
    if DR > 0:
        dr = tl.arange(0, DR)

    seq_len = tl.load(seq_lens_ptr + b)
    q_pos = seq_len - T + tok  # [M] last visible key of each row
    per_split, active = _split_keys(seq_len, NUM_SPLITS, BLOCK_N)
    start = split * per_split
    # Causal: no row of this block sees past its last row's position, so the loop stops there (a prefill
    # chunk's first rows need half the keys its last rows do; decode and verify blocks lose at most T - 1).
    # A tile no row sees would add exactly nothing (p = 0, alpha = 1).
    end = tl.minimum(tl.minimum(start + per_split, seq_len), tl.max(tl.where(row_ok, q_pos, -1), axis=0) + 1)

    q_tok = b * T + tok
    qn = tl.load(qn_ptr + q_tok[:, None] * stride_qn_tok + head[:, None] * stride_qn_head + dc[None, :],
                 mask=row_ok[:, None], other=0.0)  # [M, DC]
    if DR > 0:
        qr_offs = q_tok[:, None] * stride_qr_tok + head[:, None] * stride_qr_head
        if ROPE:
            qr = _rope_rows(qr_ptr, qr_offs, row_ok, pos_ptr, q_tok, cos_ptr, sin_ptr, stride_table, dr,
                            INTERPRET)  # [M, DR]
        else:
            qr = tl.load(qr_ptr + qr_offs + dr[None, :], mask=row_ok[:, None], other=0.0)  # [M, DR]
    if INTERPRET:
        qn = qn.to(tl.float32)
        if DR > 0:
            qr = qr.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_cols = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DC], dtype=tl.float32)
    # The page table entries of each key tile are loaded one iteration ahead and carried. Loaded in the
    # iteration that uses them, they make the cache load depend on a load of the same iteration, and Triton's
    # pipeliner spends a stage on that chain: at num_stages 2-4 it then keeps ONE buffer of key tiles and
    # waits for each tile's load before the dots (the split loop ran at the load's latency a tile: 4.4 us a
    # 64-key tile at 128k context on the H200). Carried, num_stages = s gives s - 1 buffers (checked offline
    # by tests/kernels/compile_checks.py).
    pt_row = page_table_ptr + b * stride_pt_req
    # A key tile starts at a multiple of BLOCK_N (splits hold whole tiles), so where BLOCK_N divides the page size
    # it lies in one page: one page id a tile (a scalar), its rows contiguous from the page's first slot, and
    # the tile's addresses are one scalar base plus offsets computed once, instead of a page id and a 64-bit
    # address per row (IN_PAGE; the same rows, so the same bits).
    IN_PAGE: tl.constexpr = PAGE_SIZE % BLOCK_N == 0
    n_idx = tl.arange(0, BLOCK_N)
    if IN_PAGE:
        next_page = tl.load(pt_row + start // PAGE_SIZE, mask=start < end, other=0)
        c_offs = n_idx[:, None] * stride_kv_slot + dc[None, :]  # [N, DC] from the tile's first slot
        if DR > 0:
            kr_offs = n_idx[:, None] * stride_kv_slot + DC + dr[None, :]
        if SEPARATE_V:
            v_offs = n_idx[:, None] * stride_v_slot + dc[None, :]
    else:
        pos = start + n_idx
        next_page = tl.load(pt_row + pos // PAGE_SIZE, mask=pos < end, other=0)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + n_idx  # [N] key positions
        key_ok = pos < end
        page = next_page
        if IN_PAGE:
            next_page = tl.load(pt_row + (n0 + BLOCK_N) // PAGE_SIZE, mask=n0 + BLOCK_N < end, other=0)
            first_slot = page.to(tl.int64) * PAGE_SIZE + n0 % PAGE_SIZE
            c = tl.load(kv_ptr + first_slot * stride_kv_slot + c_offs, mask=key_ok[:, None], other=0.0)
            if DR > 0:
                kr = tl.load(kv_ptr + first_slot * stride_kv_slot + kr_offs, mask=key_ok[:, None], other=0.0)
        else:
            next_page = tl.load(pt_row + (pos + BLOCK_N) // PAGE_SIZE, mask=pos + BLOCK_N < end, other=0)
            slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
            c = tl.load(kv_ptr + slot[:, None] * stride_kv_slot + dc[None, :], mask=key_ok[:, None], other=0.0)
            if DR > 0:
                kr = tl.load(kv_ptr + slot[:, None] * stride_kv_slot + DC + dr[None, :], mask=key_ok[:, None],
                             other=0.0)
        if INTERPRET:
            c = c.to(tl.float32)
            if DR > 0:
                kr = kr.to(tl.float32)
        if DR > 0:
            s = (tl.dot(qn, tl.trans(c), input_precision=DOT_PRECISION)
                 + tl.dot(qr, tl.trans(kr), input_precision=DOT_PRECISION))  # [M, N]
        else:
            s = tl.dot(qn, tl.trans(c), input_precision=DOT_PRECISION)
        s = s * sm_scale_log2
        visible = key_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # NOTE: a row with no visible key yet keeps m = -inf; shift by 0 there to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        # The row sums of p kept per key column, rescaled as acc is, and added up once after the loop: tl.sum's
        # order follows the register layout, which BLOCK_M and warps change (exact.py); this order does not.
        l_cols = l_cols * alpha[:, None] + p
        if SEPARATE_V:
            if IN_PAGE:
                v = tl.load(v_ptr + first_slot * stride_v_slot + v_offs, mask=key_ok[:, None], other=0.0)
            else:
                v = tl.load(v_ptr + slot[:, None] * stride_v_slot + dc[None, :], mask=key_ok[:, None], other=0.0)
            if INTERPRET:
                v = v.to(tl.float32)
        else:
            v = c
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_i = tl.reshape(pairwise_sum(l_cols, 1, 1), [BLOCK_M])
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]  # [M, DC]; 0 for a row with no visible key
    if SPLIT_KV:
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        part = (b * tl.num_programs(1) + mb_all) * NUM_SPLITS + split
        # A split past the request's keys stores nothing: the merge counts only the `active` splits.
        live = row_ok & (split < active)
        tl.store(mid_o_ptr + part * BLOCK_M * DC + m_idx[:, None] * DC + dc[None, :], out, mask=live[:, None])
        tl.store(mid_lse_ptr + part * BLOCK_M + m_idx, lse, mask=live)
    else:
        tl.store(out_ptr + q_tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + dc[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def mla_merge_splits_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr, seq_lens_ptr, stride_o_tok, stride_o_head, NUM_SPLITS,
    T: tl.constexpr, H: tl.constexpr, DC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLITS_PAD: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False, GROUPS: tl.constexpr = 1,
):
    """The split merge over grid (B*T, GROUPS*H, DC / BLOCK_D): program (query token, head, column block) loads the
    BLOCK_D columns of all NUM_SPLITS partials of its row at once ([SPLITS_PAD, BLOCK_D] fp32, in
    mla_split_kv_kernel's mid_o / mid_lse layout), keeps the active splits' (BLOCK_N is the split kernel's,
    which sets the active count) and weights them by exp2(lse - max). A split whose keys are all invisible
    to the row has lse = -inf (weight 0) and zero partials, so no branch is needed; a row with no visible key
    in any split gets total weight 0 and output 0.
    The active count comes from seq_lens, a graph input (no kernel of the step writes it), read before the PDL
    wait: only the active splits' partials are loaded after it. On the H200 against loading every slot beside
    seq_len after the wait (bench_small_ops.py, session11_e2_round_dd341d4.txt): T=4 at 1k of an 8448-slot
    table 13.3-13.5 -> 11.8 us, T=1 7.8-7.9 -> 7.4, the same at 8k (every split active)."""
    q_tok = tl.program_id(0)
    head = tl.program_id(1)  # the query head: kv head head // H
    b = q_tok // T
    if GROUPS > 1:
        row = (q_tok % T) * H + head % H  # the query row among its kv head's
        group = (b * GROUPS + head // H) * tl.cdiv(T * H, BLOCK_M) + row // BLOCK_M  # (request, kv head, row block)
    else:
        row = (q_tok % T) * H + head  # the request's query row
        group = b * tl.cdiv(T * H, BLOCK_M) + row // BLOCK_M  # its (request, row block)
    m = row % BLOCK_M
    sp = tl.arange(0, SPLITS_PAD)
    part = group * NUM_SPLITS + sp  # [SP]
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    seq_len = tl.load(seq_lens_ptr + b)
    _, active = _split_keys(seq_len, NUM_SPLITS, BLOCK_N)
    live = sp < active  # (<= NUM_SPLITS); the other slots were not written this call
    if PDL:  # see tuning.pdl: wait for the split kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    lse = tl.load(mid_lse_ptr + part * BLOCK_M + m, mask=live, other=float("-inf"))  # [SP]
    o = tl.load(mid_o_ptr + (part[:, None] * BLOCK_M + m) * DC + d[None, :], mask=live[:, None], other=0.0)
    mx = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(mx == float("-inf"), 0.0, mx))  # [SP]
    total = tl.sum(w, axis=0)
    out = tl.sum(o * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + q_tok * stride_o_tok + head * stride_o_head + d, out.to(out_ptr.dtype.element_ty))
