"""Fused MoE for decode/verify/prefill batch sizes, bf16 or INT4 W4A16 (pack-quantized, group 32) weights.

A pair is one (token, slot) of topk_ids flattened to [T*k]. Two paths (launchers in kernels/fused_moe.py):

Tile path (bf16 at any T; INT4 above the GEMV path's T): moe_align_kernel sorts the pairs by expert into
blocks of BLOCK_M rows (one program, no host sync, a grid fixed by shapes: graph-safe), then every (block,
N block) program multiplies its block's rows by one weight tile with tl.dot: an expert's weights are read
once per step by its blocks, however many tokens chose it. INT4 tiles are decoded in registers and
interleaved back into K order (_weight_tile).

GEMV path (INT4, decode/verify): no tl.dot. INT4 words are never interleaved back into K order there: nibble j
of word w holds input k = 8w + j, and a dot product does not care about the order of k, so the kernels take
the activations nibble-major (see the section's comment below).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from sglang_eagle3.kernels.triton.exact import pairwise_sum
from sglang_eagle3.kernels.triton.sync import last_arrival


@triton.jit
def _expert_group(ids_ptr, pair, TK, TK_PAD: tl.constexpr):
    """(is `pair` its expert's first pair, number of pairs routed to that expert, the expert id)."""
    offs = tl.arange(0, TK_PAD)
    ids = tl.load(ids_ptr + offs, mask=offs < TK, other=-1)
    expert = tl.load(ids_ptr + pair)
    member = (ids == expert) & (offs < TK)
    leader = tl.min(tl.where(member, offs, TK_PAD), axis=0) == pair
    return leader, tl.sum(member.to(tl.int32), axis=0), expert


# --------------------------------------------------------------------------------------------------
# Tile path: pairs sorted by expert into blocks of BLOCK_M rows, one tl.dot tile per (block, N block)
# --------------------------------------------------------------------------------------------------
@triton.jit
def moe_align_kernel(ids_ptr, counts_ptr, ranks_ptr, starts_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr,
                     TK, E, NUM_BLOCKS,
                     E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    """One program sorts the TK pairs of topk_ids (flattened [T*k]) by expert into blocks of BLOCK_M rows, every
    block of one expert: row r of block b is pair sorted[b * BLOCK_M + r] for r < block_rows[b], of expert
    block_expert[b]; an expert's last block is part-filled and block_rows is 0 past the last block.
    counts/ranks/starts are scratch (counts is zeroed here). Within an expert, pairs are ranked by atomics, so
    their order varies from call to call; no output depends on it (each row of a tile's dot is computed the
    same way whichever row it is). Pairs whose id is outside [0, E) are left out.

    NOTE: one CTA, so tl.debug_barrier (bar.sync) orders its phases; values other threads wrote are read
    through L2 (.cg), never a stale L1 line."""
    e_offs = tl.arange(0, E_PAD)
    offs = tl.arange(0, CHUNK)
    tl.store(counts_ptr + e_offs, tl.zeros([E_PAD], dtype=tl.int32))
    for b0 in range(0, NUM_BLOCKS, CHUNK):
        tl.store(block_rows_ptr + b0 + offs, tl.zeros([CHUNK], dtype=tl.int32), mask=b0 + offs < NUM_BLOCKS)
    tl.debug_barrier()
    for p0 in range(0, TK, CHUNK):  # rank of each pair among its expert's pairs
        p = p0 + offs
        e = tl.load(ids_ptr + p, mask=p < TK, other=-1)
        ok = (e >= 0) & (e < E)
        rank = tl.atomic_add(counts_ptr + e, 1, mask=ok)
        tl.store(ranks_ptr + p, rank, mask=ok)
    tl.debug_barrier()
    count = tl.load(counts_ptr + e_offs, cache_modifier=".cg")  # [E_PAD], 0 past E
    blocks = (count + BLOCK_M - 1) // BLOCK_M
    first = tl.cumsum(blocks, axis=0) - blocks  # each expert's first block
    tl.store(starts_ptr + e_offs, first * BLOCK_M)
    for j in range(0, tl.max(blocks, axis=0)):
        has = j < blocks
        tl.store(block_expert_ptr + first + j, e_offs, mask=has)
        tl.store(block_rows_ptr + first + j, tl.minimum(count - j * BLOCK_M, BLOCK_M), mask=has)
    tl.debug_barrier()
    for p0 in range(0, TK, CHUNK):  # each pair to its slot
        p = p0 + offs
        e = tl.load(ids_ptr + p, mask=p < TK, other=-1)
        ok = (e >= 0) & (e < E)
        rank = tl.load(ranks_ptr + p, mask=ok, other=0, cache_modifier=".cg")
        start = tl.load(starts_ptr + e, mask=ok, other=0, cache_modifier=".cg")
        tl.store(sorted_ptr + start + rank, p, mask=ok)


@triton.jit
def _nibble_plane(packed, hi, magic, J: tl.constexpr, TRICK: tl.constexpr):
    """(nibble J - 8) of each word as fp32, exactly: times 16^p(J) with TRICK (_dequant_nibble: one LOP3
    and one FADD a weight; the activations then carry 16^-p(J), see _nibble_scale), plain otherwise (a shift
    more; for fp16, whose range 16^4 * 8 exceeds and whose activations would underflow when scaled)."""
    if TRICK:
        return _dequant_nibble(packed, hi, magic, J, False)
    bits = ((packed >> (4 * J)) & 0xF) | magic
    return bits.to(tl.float32, bitcast=True) - (8388608.0 + 8.0)


@triton.jit
def _int4_group(packed, magic, DTYPE: tl.constexpr, TRICK: tl.constexpr):
    """The [BLOCK_N, 8 * GW] tile of (q - 8) (times 16^p(k % 8) with TRICK) of one scale group's packed words
    [BLOCK_N, GW], in K order and in DTYPE, exactly (small integers times powers of two). The 8 nibble planes
    are interleaved back into K order by joins, in registers: a thread's 8 nibbles of a word become its 8
    consecutive k. The tile path applies the group's scale to the dot's result (one multiply per output, not per
    weight), so no weight is rounded; the dot path's _scaled_int4_tile takes several groups and scales them."""
    BN: tl.constexpr = packed.shape[0]
    GW: tl.constexpr = packed.shape[1]
    hi = _high_word_bits(packed, False)
    w0 = _nibble_plane(packed, hi, magic, 0, TRICK)
    w1 = _nibble_plane(packed, hi, magic, 1, TRICK)
    w2 = _nibble_plane(packed, hi, magic, 2, TRICK)
    w3 = _nibble_plane(packed, hi, magic, 3, TRICK)
    w4 = _nibble_plane(packed, hi, magic, 4, TRICK)
    w5 = _nibble_plane(packed, hi, magic, 5, TRICK)
    w6 = _nibble_plane(packed, hi, magic, 6, TRICK)
    w7 = _nibble_plane(packed, hi, magic, 7, TRICK)
    # [BN, GW, 2, 2, 2] with nibble j = 4a + 2b + c at [.., a, b, c]: join appends the innermost axis
    w = tl.join(tl.join(tl.join(w0, w4), tl.join(w2, w6)), tl.join(tl.join(w1, w5), tl.join(w3, w7)))
    return tl.reshape(w, [BN, 8 * GW]).to(DTYPE)


@triton.jit
def _dot_nt(a, w, INTERPRET: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a [M, K] @ w [N, K]^T in fp32. The interpreter computes half-precision dots wrongly: fp32 there (the
    operands are exact either way). DOT_PRECISION (tuning.dot_precision): float32 operands sum in IEEE
    float32 unless torch allows TF32."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision=DOT_PRECISION)
    return tl.dot(a, tl.trans(w), input_precision=DOT_PRECISION)


@triton.jit
def _int4_rows_times_weights(a_rows, row_ok, w_rows, s_rows, w2_rows, s2_rows, n_ok, K, magic,
                             BLOCK_M: tl.constexpr, GROUP: tl.constexpr, TWO: tl.constexpr,
                             INTERPRET: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """(a[rows, :K] @ W^T, a[rows, :K] @ W2^T if TWO else zeros), [BLOCK_M, BLOCK_N] fp32 each, over packed
    INT4 rows (w_rows, w2_rows [BLOCK_N, 1] pointers to K/8 words) and their group scales (s_rows, s2_rows),
    one scale group a step (K a multiple of GROUP). The next group's words, scales and activations are loaded
    before this group's arithmetic (Triton's pipeliner leaves loads that do not feed a tl.dot directly alone),
    so every program keeps two groups in flight. With TRICK (not for fp16: see _nibble_plane) the
    activations are scaled by 16^-p(k % 8) (exact, _nibble_scale) to meet the weights' nibble planes."""
    TRICK: tl.constexpr = a_rows.dtype.element_ty != tl.float16
    GW: tl.constexpr = GROUP // 8
    BN: tl.constexpr = w_rows.shape[0]
    kk = tl.arange(0, GROUP)
    if TRICK:
        f = _nibble_scale(kk % 8, False)[None, :]
    a_ptrs = a_rows + kk[None, :]
    words = tl.arange(0, GW)[None, :]
    w_ptrs = w_rows + words
    w_mask = n_ok[:, None]
    a_mask = row_ok[:, None]
    a = tl.load(a_ptrs, mask=a_mask, other=0.0)
    pk = tl.load(w_ptrs, mask=w_mask, other=0)
    sc = tl.load(s_rows, mask=w_mask, other=0.0)
    if TWO:
        w2_ptrs = w2_rows + words
        pk2 = tl.load(w2_ptrs, mask=w_mask, other=0)
        sc2 = tl.load(s2_rows, mask=w_mask, other=0.0)
    acc = tl.zeros([BLOCK_M, BN], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BN], dtype=tl.float32)
    for k0 in range(0, K, GROUP):
        g_next = tl.minimum(k0 // GROUP + 1, K // GROUP - 1)  # past the end: the last group again (no effect)
        a_next = tl.load(a_ptrs + g_next * GROUP, mask=a_mask, other=0.0)
        pk_next = tl.load(w_ptrs + g_next * GW, mask=w_mask, other=0)
        sc_next = tl.load(s_rows + g_next, mask=w_mask, other=0.0)
        if TRICK:
            a = (a.to(tl.float32) * f).to(a.dtype)
        acc += _dot_nt(a, _int4_group(pk, magic, a.dtype, TRICK), INTERPRET, DOT_PRECISION) * tl.trans(
            sc.to(tl.float32))
        if TWO:
            pk2_next = tl.load(w2_ptrs + g_next * GW, mask=w_mask, other=0)
            sc2_next = tl.load(s2_rows + g_next, mask=w_mask, other=0.0)
            acc2 += _dot_nt(a, _int4_group(pk2, magic, a.dtype, TRICK), INTERPRET, DOT_PRECISION) * tl.trans(
                sc2.to(tl.float32))
            pk2, sc2 = pk2_next, sc2_next
        a, pk, sc = a_next, pk_next, sc_next
    return acc, acc2


@triton.jit
def _bf16_rows_times_weights(a_rows, row_ok, w_rows, n_ok, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                             INTERPRET: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a[rows, :K] @ W^T [BLOCK_M, BLOCK_N] fp32 over bf16 (or x.dtype) weight rows; Triton pipelines these
    loads (they feed the dot)."""
    acc = tl.zeros([BLOCK_M, w_rows.shape[0]], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows + k[None, :], mask=row_ok[:, None] & (k < K)[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
        acc += _dot_nt(a, w, INTERPRET, DOT_PRECISION)
    return acc


@triton.jit
def _block_rows(sorted_ptr, block_rows_ptr, BLOCK_M: tl.constexpr):
    """(pairs [BLOCK_M] of this program's block, row mask, number of rows): rows past the block's count are
    masked (their pair reads as 0 and is never stored)."""
    b = tl.program_id(0)
    count = tl.load(block_rows_ptr + b)
    m = tl.arange(0, BLOCK_M)
    ok = m < count
    return tl.load(sorted_ptr + b * BLOCK_M + m, mask=ok, other=0), ok, count


@triton.jit
def moe_gate_up_kernel(
    x_ptr, w13_ptr, s13_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, act_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    H, I, magic,
    TOP_K: tl.constexpr, INT4: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr = "tf32",
):
    """act[pair, n] = silu(x W_gate^T) * (x W_up^T) for the pairs of one block (one expert) and an N block of
    I, stored in act's dtype. The blocks of one expert are neighbours in the grid's fastest axis, so they read
    its weight tiles at about the same time and the L2 serves the repeats."""
    pairs, row_ok, count = _block_rows(sorted_ptr, block_rows_ptr, BLOCK_M)
    if count > 0:
        e = tl.load(block_expert_ptr + tl.program_id(0)).to(tl.int64)
        n_offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n_offs < I
        x_rows = x_ptr + (pairs // TOP_K).to(tl.int64)[:, None] * stride_xt
        gate_rows = w13_ptr + e * stride_we + n_offs.to(tl.int64)[:, None] * stride_wn
        gate_scales = s13_ptr + e * stride_se + n_offs.to(tl.int64)[:, None] * stride_sn
        up_rows = gate_rows + I * stride_wn
        if INT4:
            g, u = _int4_rows_times_weights(x_rows, row_ok, gate_rows, gate_scales, up_rows, gate_scales + I * stride_sn,
                                            n_ok, H, magic, BLOCK_M, GROUP, True, INTERPRET, DOT_PRECISION)
        else:
            g = _bf16_rows_times_weights(x_rows, row_ok, gate_rows, n_ok, H, BLOCK_M, BLOCK_K, INTERPRET,
                                         DOT_PRECISION)
            u = _bf16_rows_times_weights(x_rows, row_ok, up_rows, n_ok, H, BLOCK_M, BLOCK_K, INTERPRET,
                                         DOT_PRECISION)
        tl.store(act_ptr + pairs.to(tl.int64)[:, None] * stride_at + n_offs[None, :],
                 (g * tl.sigmoid(g) * u).to(act_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_down_kernel(
    act_ptr, w2_ptr, s2_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, topk_w_ptr, out_ptr,
    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_ot,
    H, I, magic,
    INT4: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr = "tf32",
):
    """out[pair, n] = topk_w[pair] * act[pair, :] W_down[n, :]^T (float32) for the pairs of one block."""
    pairs, row_ok, count = _block_rows(sorted_ptr, block_rows_ptr, BLOCK_M)
    if count > 0:
        e = tl.load(block_expert_ptr + tl.program_id(0)).to(tl.int64)
        n_offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n_offs < H
        a_rows = act_ptr + pairs.to(tl.int64)[:, None] * stride_at
        w_rows = w2_ptr + e * stride_we + n_offs.to(tl.int64)[:, None] * stride_wn
        if INT4:
            s_rows = s2_ptr + e * stride_se + n_offs.to(tl.int64)[:, None] * stride_sn
            acc, _ = _int4_rows_times_weights(a_rows, row_ok, w_rows, s_rows, w_rows, s_rows, n_ok, I, magic,
                                              BLOCK_M, GROUP, False, INTERPRET, DOT_PRECISION)
        else:
            acc = _bf16_rows_times_weights(a_rows, row_ok, w_rows, n_ok, I, BLOCK_M, BLOCK_K, INTERPRET,
                                           DOT_PRECISION)
        route_w = tl.load(topk_w_ptr + pairs, mask=row_ok, other=0.0)
        tl.store(out_ptr + pairs.to(tl.int64)[:, None] * stride_ot + n_offs[None, :],
                 acc * route_w[:, None], mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_sum_slots_kernel(per_pair_ptr, add_ptr, out_ptr, stride_pt, stride_at, stride_ot, H,
                         TOP_K: tl.constexpr, HAS_ADD: tl.constexpr, BLOCK: tl.constexpr):
    """out[t, :] = sum over the k slots of token t (fp32), cast to the output dtype (+ add[t, :])."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(TOP_K):
        acc += tl.load(per_pair_ptr + (t * TOP_K + i).to(tl.int64) * stride_pt + offs, mask=ok, other=0.0)
    if HAS_ADD:  # rounded first, then added and rounded again: the numbers of `moe(x) + add` in torch
        add = tl.load(add_ptr + t.to(tl.int64) * stride_at + offs, mask=ok, other=0.0).to(tl.float32)
        acc = acc.to(out_ptr.dtype.element_ty).to(tl.float32) + add
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


# --------------------------------------------------------------------------------------------------
# INT4 GEMV path for decode/verify (few tokens): no tl.dot, no int->float converts
# --------------------------------------------------------------------------------------------------
# A nibble becomes a float without a convert: OR-ed into the mantissa of 2^23 (bits 0x4B000000) at the bit
# position 4p where it already sits, the word reads as the float 2^23 + n * 16^p, and subtracting the
# constant 2^23 + 8 * 16^p leaves (n - 8) * 16^p exactly. Nibbles 0..4 are used in place (p = j), nibbles
# 5..7 after one shift of the word: by 20 (p = j - 5), or with SHIFT16 a logical shift by 16 (p = j - 4). By 20
# puts nibble 5 at bit 0 and ptxas extracts it as a bit field: two shifts and a sign extension more a word
# (GEMV gate_up loop 562 -> 531 SASS with SHIFT16). The GEMV launcher takes SHIFT16 from 2 tokens up: measured
# on the H200 it made the MoE ~5% faster at T = 2..8 and ~30% slower at T = 1 back to back (its gate_up then
# compiles to 128 registers instead of 179, and is scheduled differently). The 16^-p is folded into the
# activations, taken
# "nibble-major" and pre-scaled: column j of word w is x[8w + j] * 16^-p (exact: a power of two). gate_up
# builds these columns from x itself, chunk by chunk (_load_x_chunk, _x_columns); the down kernel loads act
# as gate_up stored it, as tiles of the weights' shape with row stride 0. Either way they meet the weights
# in the weights' register layout. The OR constant comes in as a run-time argument: with both constants
# immediates, ptxas would need two LOP3s instead of one.
# Per weight: one LOP3, one FADD, one FFMA (~4 SASS instructions per weight in the loop at sm_90).
# Group scales multiply per-group partial sums (the [N, W] partials reshaped to [N, W/GW, GW]).


@triton.jit
def _nibble_scale(j, SHIFT16: tl.constexpr):
    """16^-p(j) for nibble indices j (0..7), p(j) = j below 5 and j - 5 above (j - 4 with SHIFT16), in fp32: the
    power of two that meets _dequant_nibble's plane j (exact), by which the activations of nibble j are
    pre-scaled. Every kernel that meets a plane j must use the one SHIFT16 its producer used."""
    if SHIFT16:
        p = tl.where(j < 5, j, j - 4)
    else:
        p = j % 5
    return tl.where(p == 0, 1.0, tl.where(p == 1, 1.0 / 16, tl.where(p == 2, 1.0 / 256, tl.where(
        p == 3, 1.0 / 4096, 1.0 / 65536))))


@triton.jit
def _high_word_bits(packed, SHIFT16: tl.constexpr):
    """The word shifted for nibbles 5..7: by 20 (at bits 0..11: p = 0..2), or with SHIFT16 its high half as a
    logical shift (at bits 4..15: p = 1..3)."""
    if SHIFT16:
        return (packed.to(tl.uint32, bitcast=True) >> 16).to(tl.int32, bitcast=True)
    return packed >> 20


@triton.jit
def _dequant_nibble(packed, hi, magic, J: tl.constexpr, SHIFT16: tl.constexpr):
    """(nibble J - 8) * 16^p of each int32 word, as fp32 (exact); p as _nibble_scale's, `hi` =
    _high_word_bits(packed, SHIFT16)."""
    P: tl.constexpr = J if J < 5 else J - 4 if SHIFT16 else J - 5
    if J < 5:
        bits = (packed & (0xF << (4 * P))) | magic
    else:
        bits = (hi & (0xF << (4 * P))) | magic
    return bits.to(tl.float32, bitcast=True) - (8388608.0 + 8.0 * (1 << (4 * P)))


@triton.jit
def _load_xs(ptrs, mask, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _group_dots(packed, xs_ptrs, xs_mask, stride_j, magic, GROUP_WORDS: tl.constexpr, EVEN: tl.constexpr,
                SHIFT16: tl.constexpr):
    """packed [N, W] words and xs_ptrs [N, W] (row stride 0) into nibble-major activations in memory (column
    j at xs_ptrs + j * stride_j) -> [N, W/GW] per-group sums of (q - 8) * x, before the group scales."""
    hi = _high_word_bits(packed, SHIFT16)
    t = _dequant_nibble(packed, hi, magic, 0, SHIFT16) * _load_xs(xs_ptrs, xs_mask, EVEN)
    for j in tl.static_range(1, 8):
        t += _dequant_nibble(packed, hi, magic, j, SHIFT16) * _load_xs(xs_ptrs + j * stride_j, xs_mask, EVEN)
    W: tl.constexpr = packed.shape[1]
    return pairwise_sum(t, 1, W // GROUP_WORDS)


@triton.jit
def _group_dots_cols(packed, x_cols, magic, GROUP_WORDS: tl.constexpr, SHIFT16: tl.constexpr):
    """_group_dots with the 8 activation columns already in registers (x_cols[j] [1, W], see _x_columns)."""
    hi = _high_word_bits(packed, SHIFT16)
    t = _dequant_nibble(packed, hi, magic, 0, SHIFT16) * x_cols[0]
    for j in tl.static_range(1, 8):
        t += _dequant_nibble(packed, hi, magic, j, SHIFT16) * x_cols[j]
    W: tl.constexpr = packed.shape[1]
    return pairwise_sum(t, 1, W // GROUP_WORDS)


@triton.jit
def _load_int4_chunk(rows, scales, n_ok, w0, w_idx, g_idx, N_WORDS, GROUP_WORDS: tl.constexpr,
                     EVEN: tl.constexpr):
    """Words w0 + w_idx of BLOCK_N packed rows [N, W] and their group scales [N, W/GW] (fp32), streamed
    through L2 only (.cg) so that the weights do not push the activations out of L1. EVEN: every row and
    word of the chunk exists (no masks; a prefetch past the end re-reads the last chunk, an L2 hit)."""
    if EVEN:
        W: tl.constexpr = w_idx.shape[0]
        start = tl.minimum(w0, N_WORDS - W)
        packed = tl.load(rows + (start + w_idx)[None, :], cache_modifier=".cg")
        scale = tl.load(scales + (start // GROUP_WORDS + g_idx)[None, :], cache_modifier=".cg")
    else:
        words = w0 + w_idx
        packed = tl.load(rows + words[None, :], mask=n_ok[:, None] & (words < N_WORDS)[None, :], other=0,
                         cache_modifier=".cg")
        groups = w0 // GROUP_WORDS + g_idx
        scale = tl.load(scales + groups[None, :], mask=n_ok[:, None] & (groups < N_WORDS // GROUP_WORDS)[None, :],
                        other=0.0, cache_modifier=".cg")
    return packed, scale.to(tl.float32)


@triton.jit
def _load_x_chunk(x_row, w0, w_idx, N_WORDS, EVEN: tl.constexpr, SHIFT16: tl.constexpr, F16: tl.constexpr = False):
    """x of words w0 + w_idx as a [W, 8] fp32 tile pre-scaled for the nibble trick: [w, j] = x[8w + j] *
    16^-p(j) (_nibble_scale); with F16, for the packed fp16 form: x[8w + j] * F16_X_SCALE. One row is the 8
    contiguous values of a packed word (16 bytes of bf16: one vector load).
    EVEN: no mask; past the end, re-reads the last chunk (as _load_int4_chunk does)."""
    j = tl.arange(0, 8)
    if EVEN:
        W: tl.constexpr = w_idx.shape[0]
        words = tl.minimum(w0, N_WORDS - W) + w_idx
        x = tl.load(x_row + 8 * words[:, None] + j[None, :])
    else:
        words = w0 + w_idx
        x = tl.load(x_row + 8 * words[:, None] + j[None, :], mask=(words < N_WORDS)[:, None], other=0.0)
    if F16:
        return x.to(tl.float32) * F16_X_SCALE
    return x.to(tl.float32) * _nibble_scale(j, SHIFT16)[None, :]


@triton.jit
def _x_columns(xs):
    """The 8 columns of a [W, 8] tile as [1, W] rows (j = 0..7), to broadcast over the weight rows.
    NOTE: a column loaded strided (x[8w + j] over w) gets a register layout of its own from Triton's
    coalescing (its addresses are contiguous along neither axis), and the compiler then moves every product
    through shared memory. Split off the tile, each column costs one small conversion instead (a [W] vector
    through shared memory, two barriers; the compile checks count them)."""
    W: tl.constexpr = xs.shape[0]
    even, odd = tl.split(tl.reshape(xs, [W, 2, 2, 2]))  # j = 4a + 2b + c: split on c, then b, then a
    j0_4, j2_6 = tl.split(even)
    j1_5, j3_7 = tl.split(odd)
    x0, x4 = tl.split(j0_4)
    x2, x6 = tl.split(j2_6)
    x1, x5 = tl.split(j1_5)
    x3, x7 = tl.split(j3_7)
    return (x0[None, :], x1[None, :], x2[None, :], x3[None, :], x4[None, :], x5[None, :], x6[None, :],
            x7[None, :])


# gate_up's packed half-precision form (F16, a config key): two nibbles a 32-bit op. A word's nibbles j and j + 4
# sit at bits 4j and 16 + 4j, i.e. at the same place in its two 16-bit halves, so one LOP3 with the mask
# 0x000F000F (j = 0) or 0x00F000F0 (j = 1) OR-ed into 0x64006400 (1024.0 twice in fp16) makes two fp16 values
# 1024 + q (j = 0) or 1024 + 16 q (j = 1); one HSUB2 of 1032 (j = 0), or one HFMA2 by 1/16 and -72 (j = 1),
# leaves q - 8 exactly. Nibbles 2, 3 (6, 7) the same after one shift of the word by 8. One HFMA2 then
# multiplies two weights by their x, so a word of 8 weights costs a shift, 4 LOP3, 4 HSUB2/HFMA2, 4 HFMA2, two
# conversions of the two lanes' sums to fp32 and their FADD: ~2.1 SASS instructions a weight against the fp32
# form's ~4.2 (compile checks).
# Numerics: x is rounded to fp16 after scaling by 2^-6, which keeps a bf16 x exact (8 significant bits) from
# |x| = 2^-8 up to ~2^17 (a 4-product sum stays under fp16's 65504), far above what an RMSNorm output reaches
# (|x_i| <= sqrt(H) * |w_i|, 84.7 |w_i| at H = 7168); below 2^-8 x becomes subnormal, ~1e-5 absolute. Products
# (q - 8) x are then exact in fp16 (<= 11 significant bits), and only the 4-term sum of each lane rounds, to fp16
# (2^-11 relative), before the fp32 sums take over: ~5x below the bf16 rounding of the output. The same code for
# every pair whatever T is, so decode and verify run one arithmetic (the tables keep F16 and BLOCK_W the same in
# every bucket). Under the interpreter, _word_dots_f16_emulated computes the same roundings with plain ops.
F16_X_SCALE = tl.constexpr(1.0 / 64)  # 2^-6 (undone on the fp32 sums: exact)


@triton.jit
def _x_pairs_f16(xs):
    """x chunk [W, 8] (from _load_x_chunk with F16: pre-scaled by F16_X_SCALE) -> the fp16x2 pairs (x0, x4),
    (x1, x5), (x2, x6), (x3, x7) as [1, W] int32 (x_j in the low half), as _word_dots_f16 takes them. Rounded
    and packed in the tile's own layout, where each value is held once; only the 4 packed vectors then move to
    the weights' layout (see _x_columns)."""
    W: tl.constexpr = xs.shape[0]
    bits = xs.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    lo, hi = tl.split(tl.permute(tl.reshape(bits, [W, 2, 4]), (0, 2, 1)))  # j = 4a + i: [W, 4] for a = 0, 1
    pairs = tl.reshape(lo | (hi << 16), [W, 2, 2])  # i = 2b + c
    p02, p13 = tl.split(pairs)  # c = 0, 1: [W, 2] over b
    p0, p2 = tl.split(p02)
    p1, p3 = tl.split(p13)
    return p0[None, :], p1[None, :], p2[None, :], p3[None, :]


def _dequant_f16_ptx(word: str, a: str, b: str, c: str, d: str) -> str:
    """PTX turning the int32 `word` into the fp16x2 weights (q - 8) of nibbles (0, 4), (1, 5), (2, 6), (3, 7) in
    registers a..d, exactly (the comment above F16_X_SCALE). Needs .b32 s, m0, k16, m72 declared. Constants:
    1032 = 0x6408, 1/16 = 0x2C00, -72 = 0xD480 in fp16 ((1024 + 16 q) / 16 - 72 = q - 8)."""
    return f"""
        mov.b32 m0, 0x64086408;
        mov.b32 k16, 0x2C002C00;
        mov.b32 m72, 0xD480D480;
        shr.u32 s, {word}, 8;
        lop3.b32 {a}, {word}, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 {b}, {word}, 0x00F000F0, 0x64006400, 0xEA;
        lop3.b32 {c}, s, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 {d}, s, 0x00F000F0, 0x64006400, 0xEA;
        sub.rn.f16x2 {a}, {a}, m0;
        fma.rn.f16x2 {b}, {b}, k16, m72;
        sub.rn.f16x2 {c}, {c}, m0;
        fma.rn.f16x2 {d}, {d}, k16, m72;
        """


def _dot_f16_ptx(a: str, b: str, c: str, d: str, p: tuple[str, str, str, str], out: str) -> str:
    """PTX of one word's dot: the fp16x2 weights a..d times the x pairs p, a 4-term sum per half in fp16, the two
    halves added in fp32 into `out` (into `sum` first if `out` is "sum"). Needs .b32 acc, .f16 lo, hi and .f32 flo,
    fhi declared."""
    return f"""
        mul.rn.f16x2 acc, {a}, {p[0]};
        fma.rn.f16x2 acc, {b}, {p[1]}, acc;
        fma.rn.f16x2 acc, {c}, {p[2]}, acc;
        fma.rn.f16x2 acc, {d}, {p[3]}, acc;
        mov.b32 {{lo, hi}}, acc;
        cvt.f32.f16 flo, lo;
        cvt.f32.f16 fhi, hi;
        add.rn.f32 {out}, flo, fhi;
        """


def _word_dots_f16_ptx(scaled: bool) -> str:
    """PTX for _word_dots_f16: $1 the word, $2..$5 the x pairs, $6 (scaled) a per-word fp32 factor for the sum."""
    return ("""
        {
        .reg .b32 s, a, b, c, d, acc, m0, k16, m72;
        .reg .f16 lo, hi;
        .reg .f32 flo, fhi, sum;"""
            + _dequant_f16_ptx("$1", "a", "b", "c", "d")
            + _dot_f16_ptx("a", "b", "c", "d", ("$2", "$3", "$4", "$5"), "sum" if scaled else "$0")
            + ("mul.rn.f32 $0, sum, $6;" if scaled else "") + "\n}")


# The two halves of _word_dots_f16 apart, for programs that apply one weight tile to several rows of x (gate_up's
# ROWS): the decoded weights are kept in registers and each row costs only the dot.
_DEQUANT_F16 = tl.constexpr("{\n.reg .b32 s, m0, k16, m72;" + _dequant_f16_ptx("$4", "$0", "$1", "$2", "$3") + "}")
_DOT_F16 = tl.constexpr("{\n.reg .b32 acc;\n.reg .f16 lo, hi;\n.reg .f32 flo, fhi;"
                        + _dot_f16_ptx("$1", "$2", "$3", "$4", ("$5", "$6", "$7", "$8"), "$0") + "}")
_WORD_DOTS_F16 = tl.constexpr(_word_dots_f16_ptx(False))
_WORD_DOTS_F16_SCALED = tl.constexpr(_word_dots_f16_ptx(True))


@triton.jit
def _word_dots_f16(packed, p0, p1, p2, p3, inv=None):
    """Per int32 word: the sum over its 8 nibbles of (q - 8) * x, in packed fp16 (see the section's comment),
    as fp32 (times inv, a per-word fp32 factor, when given). p0..p3 are _x_pairs_f16's pairs (broadcast over
    the rows of packed)."""
    if inv is None:  # (if/else: code after a return in a constexpr branch would still be compiled)
        t = tl.inline_asm_elementwise(asm=_WORD_DOTS_F16, constraints="=r,r,r,r,r,r",
                                      args=[packed, p0, p1, p2, p3], dtype=tl.float32, is_pure=True, pack=1)
    else:
        t = tl.inline_asm_elementwise(asm=_WORD_DOTS_F16_SCALED, constraints="=r,r,r,r,r,r,r",
                                      args=[packed, p0, p1, p2, p3, inv], dtype=tl.float32, is_pure=True, pack=1)
    return t


@triton.jit
def _lane_f16(packed, p0, p1, p2, p3, HI: tl.constexpr):
    """One lane of _word_dots_f16 (nibbles 0..3, or 4..7 with HI) with the same roundings, in plain ops: each
    q * x + acc is exact in float64 (fp16 operands and a 4-bit q) and rounds once to fp16, as the fused op."""
    B: tl.constexpr = 16 if HI else 0
    ps = (p0, p1, p2, p3)
    acc = tl.zeros(packed.shape, dtype=tl.float64)
    for i in tl.static_range(4):
        bits = (ps[i] >> 16) if HI else ps[i]
        x = (bits & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float64)
        q = (((packed >> (B + 4 * i)) & 0xF) - 8).to(tl.float64)
        acc = (q * x + acc).to(tl.float16).to(tl.float64)
    return acc.to(tl.float32)


@triton.jit
def _word_dots_f16_emulated(packed, p0, p1, p2, p3, inv=None):
    """_word_dots_f16 for the interpreter (which cannot run PTX)."""
    t = _lane_f16(packed, p0, p1, p2, p3, False) + _lane_f16(packed, p0, p1, p2, p3, True)
    if inv is not None:  # (the down kernel, its only user with inv, is compiled without fp fusion: no contraction)
        t = t * inv
    return t


@triton.jit
def _group_dots_f16(packed, pairs, GROUP_WORDS: tl.constexpr, INTERPRET: tl.constexpr, inv=None):
    """_group_dots_cols in the packed fp16 form: [N, W] words, _x_pairs_f16's pairs -> [N, W/GW] group sums
    (in units of F16_X_SCALE; or each word's sum times its factor in inv, [N, W] or [1, W], when given)."""
    if INTERPRET:
        t = _word_dots_f16_emulated(packed, pairs[0], pairs[1], pairs[2], pairs[3], inv)
    else:
        t = _word_dots_f16(packed, pairs[0], pairs[1], pairs[2], pairs[3], inv)
    W: tl.constexpr = packed.shape[1]
    return pairwise_sum(t, 1, W // GROUP_WORDS)


@triton.jit
def _dequant_f16(packed, INTERPRET: tl.constexpr):
    """The fp16x2 weights (a, b, c, d) of _word_dots_f16 from [N, W] words, for _dots_dequantized_f16 to apply to
    several rows of x. Under the interpreter (no PTX) the words themselves, four times: its dot decodes them."""
    if INTERPRET:
        return packed, packed, packed, packed
    return tl.inline_asm_elementwise(asm=_DEQUANT_F16, constraints="=r,=r,=r,=r,r", args=[packed],
                                     dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _dots_dequantized_f16(dq, pairs, GROUP_WORDS: tl.constexpr, INTERPRET: tl.constexpr):
    """_group_dots_f16 on weights already decoded by _dequant_f16: the same operations in the same order, so the
    same bits."""
    if INTERPRET:
        t = _word_dots_f16_emulated(dq[0], pairs[0], pairs[1], pairs[2], pairs[3])
    else:
        t = tl.inline_asm_elementwise(asm=_DOT_F16, constraints="=r,r,r,r,r,r,r,r,r",
                                      args=[dq[0], dq[1], dq[2], dq[3], pairs[0], pairs[1], pairs[2], pairs[3]],
                                      dtype=tl.float32, is_pure=True, pack=1)
    W: tl.constexpr = t.shape[1]
    return pairwise_sum(t, 1, W // GROUP_WORDS)


@triton.jit
def _gate_up_row(acc_g, acc_u, dg, sg, du, su, xs, GROUP_WORDS: tl.constexpr, INTERPRET: tl.constexpr):
    """One row's share of a chunk in gate_up's ROWS form: _gate_up_chunk (F16) with the weights decoded once."""
    pairs = _x_pairs_f16(xs)
    acc_g += _dots_dequantized_f16(dg, pairs, GROUP_WORDS, INTERPRET) * sg
    acc_u += _dots_dequantized_f16(du, pairs, GROUP_WORDS, INTERPRET) * su
    return acc_g, acc_u


@triton.jit
def _member(offs, member, rank, r, pair):
    """(pair id of the expert's r-th pair, whether it exists), from _gate_up_rows' member mask and ranks over the pair
    ids `offs`: the program's own pair stands in for a missing one, so every load stays in bounds."""
    sel = member & (rank == r)
    found = tl.sum(sel.to(tl.int32), axis=0) > 0
    return tl.where(found, tl.sum(tl.where(sel, offs, 0), axis=0), pair), found


@triton.jit
def _store_gate_up(act_ptr, member, stride_at, nb, n_offs, n_ok, acc_g, acc_u, I, BLOCK_N: tl.constexpr,
                   SHIFT16: tl.constexpr, F16: tl.constexpr, ACT_F16: tl.constexpr):
    """act[member] of rows n_offs = silu(g) * u from the per-group accumulators, in the down kernel's form."""
    g = tl.reshape(pairwise_sum(acc_g, 1, 1), [BLOCK_N])
    u = tl.reshape(pairwise_sum(acc_u, 1, 1), [BLOCK_N])
    if F16:  # undo F16_X_SCALE (a power of two: exact)
        g = g * (1.0 / F16_X_SCALE)
        u = u * (1.0 / F16_X_SCALE)
    if ACT_F16:
        _store_act_f16(act_ptr + member.to(tl.int64) * stride_at, nb, g * tl.sigmoid(g) * u, I, BLOCK_N)
    else:
        j = n_offs % 8
        tl.store(act_ptr + member.to(tl.int64) * stride_at + j * (I // 8) + n_offs // 8,
                 g * tl.sigmoid(g) * u * _nibble_scale(j, SHIFT16), mask=n_ok)


@triton.jit
def _gate_up_rows(x_ptr, ids_ptr, act_ptr, gate_rows, gate_scales, up_rows, up_scales, stride_xt, stride_at,
                  pair, nb, n_offs, n_ok, w_idx, g_idx, TK, I, H_WORDS,
                  TOP_K: tl.constexpr, TK_PAD: tl.constexpr, GROUP_WORDS: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_W: tl.constexpr, EVEN: tl.constexpr, SHIFT16: tl.constexpr, INTERPRET: tl.constexpr,
                  ACT_F16: tl.constexpr, ROWS: tl.constexpr):
    """gate_up's ROWS form (F16 only): the program of the expert's pair of rank r (in pair order) with r % ROWS == 0
    computes that pair and the next ROWS - 1 of the same expert, decoding each weight word once for all of them
    (a row then costs the dot alone: about half of a word's ~21 SASS instructions, the decode the other half); the
    other pairs' programs exit. Each row runs _gate_up_chunk's F16 operations in the same order, so a pair's act is
    the same bits as in the one-pair form at the same tiles (BLOCK_N, warps), whatever the batch holds. ROWS <= 4."""
    offs = tl.arange(0, TK_PAD)
    ids = tl.load(ids_ptr + offs, mask=offs < TK, other=-1)
    expert = tl.load(ids_ptr + pair)
    member = (ids == expert) & (offs < TK)
    rank = tl.cumsum(member.to(tl.int32), axis=0) - 1
    r0 = tl.sum(tl.where(offs == pair, rank, 0), axis=0)
    if r0 % ROWS == 0:
        m1, ok1 = _member(offs, member, rank, r0 + 1, pair)
        x0 = x_ptr + (pair // TOP_K).to(tl.int64) * stride_xt
        x1 = x_ptr + (m1 // TOP_K).to(tl.int64) * stride_xt
        if ROWS > 2:
            m2, ok2 = _member(offs, member, rank, r0 + 2, pair)
            m3, ok3 = _member(offs, member, rank, r0 + 3, pair)
            x2 = x_ptr + (m2 // TOP_K).to(tl.int64) * stride_xt
            x3 = x_ptr + (m3 // TOP_K).to(tl.int64) * stride_xt
        zero = tl.zeros([BLOCK_N, BLOCK_W // GROUP_WORDS], dtype=tl.float32)
        acc_g0, acc_u0, acc_g1, acc_u1 = zero, zero, zero, zero
        acc_g2, acc_u2, acc_g3, acc_u3 = zero, zero, zero, zero
        pg, sg = _load_int4_chunk(gate_rows, gate_scales, n_ok, 0, w_idx, g_idx, H_WORDS, GROUP_WORDS, EVEN)
        pu, su = _load_int4_chunk(up_rows, up_scales, n_ok, 0, w_idx, g_idx, H_WORDS, GROUP_WORDS, EVEN)
        xs0 = _load_x_chunk(x0, 0, w_idx, H_WORDS, EVEN, SHIFT16, True)
        xs1 = _load_x_chunk(x1, 0, w_idx, H_WORDS, EVEN, SHIFT16, True)
        if ROWS > 2:
            xs2 = _load_x_chunk(x2, 0, w_idx, H_WORDS, EVEN, SHIFT16, True)
            xs3 = _load_x_chunk(x3, 0, w_idx, H_WORDS, EVEN, SHIFT16, True)
        for w0 in range(0, H_WORDS, BLOCK_W):  # the next chunk's loads first, as the one-pair form
            pg_next, sg_next = _load_int4_chunk(gate_rows, gate_scales, n_ok, w0 + BLOCK_W, w_idx, g_idx,
                                                H_WORDS, GROUP_WORDS, EVEN)
            pu_next, su_next = _load_int4_chunk(up_rows, up_scales, n_ok, w0 + BLOCK_W, w_idx, g_idx,
                                                H_WORDS, GROUP_WORDS, EVEN)
            xs0_next = _load_x_chunk(x0, w0 + BLOCK_W, w_idx, H_WORDS, EVEN, SHIFT16, True)
            xs1_next = _load_x_chunk(x1, w0 + BLOCK_W, w_idx, H_WORDS, EVEN, SHIFT16, True)
            if ROWS > 2:
                xs2_next = _load_x_chunk(x2, w0 + BLOCK_W, w_idx, H_WORDS, EVEN, SHIFT16, True)
                xs3_next = _load_x_chunk(x3, w0 + BLOCK_W, w_idx, H_WORDS, EVEN, SHIFT16, True)
            dg = _dequant_f16(pg, INTERPRET)
            du = _dequant_f16(pu, INTERPRET)
            acc_g0, acc_u0 = _gate_up_row(acc_g0, acc_u0, dg, sg, du, su, xs0, GROUP_WORDS, INTERPRET)
            if ok1:
                acc_g1, acc_u1 = _gate_up_row(acc_g1, acc_u1, dg, sg, du, su, xs1, GROUP_WORDS, INTERPRET)
            if ROWS > 2:
                if ok2:
                    acc_g2, acc_u2 = _gate_up_row(acc_g2, acc_u2, dg, sg, du, su, xs2, GROUP_WORDS, INTERPRET)
                if ok3:
                    acc_g3, acc_u3 = _gate_up_row(acc_g3, acc_u3, dg, sg, du, su, xs3, GROUP_WORDS, INTERPRET)
                xs2, xs3 = xs2_next, xs3_next
            pg, sg, pu, su, xs0, xs1 = pg_next, sg_next, pu_next, su_next, xs0_next, xs1_next
        _store_gate_up(act_ptr, pair, stride_at, nb, n_offs, n_ok, acc_g0, acc_u0, I, BLOCK_N, SHIFT16, True,
                       ACT_F16)
        if ok1:
            _store_gate_up(act_ptr, m1, stride_at, nb, n_offs, n_ok, acc_g1, acc_u1, I, BLOCK_N, SHIFT16, True,
                           ACT_F16)
        if ROWS > 2:
            if ok2:
                _store_gate_up(act_ptr, m2, stride_at, nb, n_offs, n_ok, acc_g2, acc_u2, I, BLOCK_N, SHIFT16, True,
                               ACT_F16)
            if ok3:
                _store_gate_up(act_ptr, m3, stride_at, nb, n_offs, n_ok, acc_g3, acc_u3, I, BLOCK_N, SHIFT16, True,
                               ACT_F16)


@triton.jit
def _gate_up_chunk(acc_g, acc_u, pg, sg, pu, su, xs, magic, GROUP_WORDS: tl.constexpr, SHIFT16: tl.constexpr,
                   F16: tl.constexpr, INTERPRET: tl.constexpr):
    """One chunk of gate_up: the gate and up rows' per-group sums of (q - 8) * x, times the group scales, added
    to the accumulators (xs [BLOCK_W, 8] from _load_x_chunk with the same SHIFT16 and F16)."""
    if F16:
        pairs = _x_pairs_f16(xs)
        acc_g += _group_dots_f16(pg, pairs, GROUP_WORDS, INTERPRET) * sg
        acc_u += _group_dots_f16(pu, pairs, GROUP_WORDS, INTERPRET) * su
    else:
        x_cols = _x_columns(xs)
        acc_g += _group_dots_cols(pg, x_cols, magic, GROUP_WORDS, SHIFT16) * sg
        acc_u += _group_dots_cols(pu, x_cols, magic, GROUP_WORDS, SHIFT16) * su
    return acc_g, acc_u


@triton.jit
def _group_member(ids_ptr, expert, TK, r, TK_PAD: tl.constexpr):
    """Pair id of the r-th (in pair order) pair routed to `expert`."""
    pairs, _ = _expert_rows(ids_ptr, expert, TK, r, 1, TK_PAD)
    return tl.sum(pairs, axis=0)


@triton.jit
def moe_int4_gemv_gate_up_kernel(
    x_ptr, w13_ptr, s13_ptr, ids_ptr, act_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    TK, I, H_WORDS, magic,
    TOP_K: tl.constexpr, TK_PAD: tl.constexpr, GROUP_WORDS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr = False,
    PER_PAIR: tl.constexpr = True, SHIFT16: tl.constexpr = False, F16: tl.constexpr = False,
    INTERPRET: tl.constexpr = False, ACT_F16: tl.constexpr = False, ROWS: tl.constexpr = 1,
):
    """act[pair, n] = silu(x W_gate[n]^T) * (x W_up[n]^T) in fp32 for BLOCK_N gate rows and the matching up
    rows of one expert, from x [T, H] as it is (each chunk of x is loaded, pre-scaled and split into nibble
    columns here, see _load_x_chunk). act is stored nibble-major and pre-scaled for the down kernel:
    act[pair, j, w] holds the value of row 8w + j times 16^-p(j) (_nibble_scale).
    PER_PAIR: every (pair, N block) program computes its own pair; pairs of a verify batch that share an
    expert run side by side and read the same weight lines, which the L2 serves once while they are in
    flight. Else the expert's first pair computes all of the expert's pairs one after another (re-reading
    the weights from L2) and the others exit: fewer programs, but the shared experts' work is serial.
    Either way a pair's arithmetic is the same code whatever the batch holds.
    F16: the dots in packed half precision, two weights an op (see the comment above F16_X_SCALE).
    ACT_F16: act is stored for the down kernel's packed fp16 form instead (_store_act_f16).
    ROWS (2 or 4, with F16): each weight word decoded once for up to ROWS pairs of its expert (_gate_up_rows).

    NOTE: Triton's pipeliner only pipelines loads that feed a tl.dot (or loops carrying num_stages), so the
    next chunk is prefetched by hand: its loads (weights, scales and x) are issued before the current
    chunk's arithmetic, two chunks in flight per program."""
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    pair = tl.program_id(0)
    nb = tl.program_id(1)
    if ROWS > 1:
        n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        e = tl.load(ids_ptr + pair).to(tl.int64)
        gate_rows = w13_ptr + e * stride_we + n_offs.to(tl.int64)[:, None] * stride_wn
        gate_scales = s13_ptr + e * stride_se + n_offs.to(tl.int64)[:, None] * stride_sn
        _gate_up_rows(x_ptr, ids_ptr, act_ptr, gate_rows, gate_scales, gate_rows + I * stride_wn,
                      gate_scales + I * stride_sn, stride_xt, stride_at, pair, nb, n_offs, n_offs < I,
                      tl.arange(0, BLOCK_W), tl.arange(0, BLOCK_W // GROUP_WORDS), TK, I, H_WORDS, TOP_K, TK_PAD,
                      GROUP_WORDS, BLOCK_N, BLOCK_W, EVEN, SHIFT16, INTERPRET, ACT_F16, ROWS)
        return
    if PER_PAIR:
        work, count, expert = True, 1, tl.load(ids_ptr + pair)
    else:
        work, count, expert = _expert_group(ids_ptr, pair, TK, TK_PAD)
    if work:
        n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n_offs < I
        w_idx = tl.arange(0, BLOCK_W)
        g_idx = tl.arange(0, BLOCK_W // GROUP_WORDS)
        e = expert.to(tl.int64)
        gate_rows = w13_ptr + e * stride_we + n_offs.to(tl.int64)[:, None] * stride_wn
        up_rows = gate_rows + I * stride_wn
        gate_scales = s13_ptr + e * stride_se + n_offs.to(tl.int64)[:, None] * stride_sn
        up_scales = gate_scales + I * stride_sn
        for r in range(0, count):
            if PER_PAIR:
                member = pair
            else:
                member = _group_member(ids_ptr, expert, TK, r, TK_PAD)
            x_row = x_ptr + (member // TOP_K).to(tl.int64) * stride_xt
            acc_g = tl.zeros([BLOCK_N, BLOCK_W // GROUP_WORDS], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_N, BLOCK_W // GROUP_WORDS], dtype=tl.float32)
            pg, sg = _load_int4_chunk(gate_rows, gate_scales, n_ok, 0, w_idx, g_idx, H_WORDS, GROUP_WORDS, EVEN)
            pu, su = _load_int4_chunk(up_rows, up_scales, n_ok, 0, w_idx, g_idx, H_WORDS, GROUP_WORDS, EVEN)
            xs = _load_x_chunk(x_row, 0, w_idx, H_WORDS, EVEN, SHIFT16, F16)  # [BLOCK_W, 8]
            for w0 in range(0, H_WORDS, BLOCK_W):
                pg_next, sg_next = _load_int4_chunk(gate_rows, gate_scales, n_ok, w0 + BLOCK_W, w_idx, g_idx,
                                                    H_WORDS, GROUP_WORDS, EVEN)
                pu_next, su_next = _load_int4_chunk(up_rows, up_scales, n_ok, w0 + BLOCK_W, w_idx, g_idx,
                                                    H_WORDS, GROUP_WORDS, EVEN)
                xs_next = _load_x_chunk(x_row, w0 + BLOCK_W, w_idx, H_WORDS, EVEN, SHIFT16, F16)
                acc_g, acc_u = _gate_up_chunk(acc_g, acc_u, pg, sg, pu, su, xs, magic, GROUP_WORDS, SHIFT16, F16,
                                              INTERPRET)
                pg, sg, pu, su, xs = pg_next, sg_next, pu_next, su_next, xs_next
            _store_gate_up(act_ptr, member, stride_at, nb, n_offs, n_ok, acc_g, acc_u, I, BLOCK_N, SHIFT16, F16,
                           ACT_F16)


# act in the down kernel's packed fp16 form (ACT_F16, when the down config says F16): per pair an int32 row
# [5, I/8] whose rows 0..3 hold the fp16x2 pairs (act[8w + i], act[8w + i + 4]) of word w (what _word_dots_f16
# takes as x pairs) and whose row 4 holds each word's fp32 factor (bits) that undoes its scaling. act is not
# bounded as x is (no RMSNorm before it), so each word of 8 values gets its own power of two, which puts its
# largest |value| in [2^9, 2^10): a lane's 4-product sum then stays under 8 * 4 * 2^10 = 2^15 (fp16 tops out at
# 65504), and a value 2^24 times smaller than its word's largest still keeps fp16's 11 bits. The value is
# rounded to fp16 (2^-12 relative, below the bf16 act SGLang rounds to); its products with q - 8 are no longer
# exact (up to 14 bits), so every HFMA2 rounds once. gate_up's programs cover BLOCK_N rows = BLOCK_N / 8 whole
# words (the launcher asks BLOCK_N % 8 == 0), so a word's scale is known where it is computed.
@triton.jit
def _store_act_f16(row, nb, v, I, BLOCK_N: tl.constexpr):
    """Store rows nb * BLOCK_N .. + BLOCK_N of one pair's act (v [BLOCK_N] fp32) at `row` in the packed form."""
    WB: tl.constexpr = BLOCK_N // 8
    v8 = tl.reshape(v, [WB, 8])
    e = (tl.max(tl.abs(v8), axis=1).to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased exponent of the max
    e = tl.maximum(e, 10)  # (an all-zero or tiny word: a factor still normal in fp32)
    scale = ((263 - e) << 23).to(tl.float32, bitcast=True)  # 2^(136 - e): the max to [2^9, 2^10)
    inv = ((e - 9) << 23).to(tl.float32, bitcast=True)  # 2^(e - 136): exact
    bits = (v8 * scale[:, None]).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    lo, hi = tl.split(tl.permute(tl.reshape(bits, [WB, 2, 4]), (0, 2, 1)))  # j = 4a + i: [WB, 4] for a = 0, 1
    w = nb * WB + tl.arange(0, WB)
    ok = w < I // 8
    tl.store(row + tl.arange(0, 4)[None, :] * (I // 8) + w[:, None], lo | (hi << 16), mask=ok[:, None])
    tl.store(row + 4 * (I // 8) + w, inv.to(tl.int32, bitcast=True), mask=ok)


@triton.jit
def _load_act_f16(a, mask, I_WORDS, EVEN: tl.constexpr):
    """((p0, p1, p2, p3), factors): the x pairs and per-word factors of _store_act_f16's form at pointers `a`
    (word w of row 0, any shape), as _group_dots_f16 takes them."""
    if EVEN:
        p0, p1, p2, p3 = tl.load(a), tl.load(a + I_WORDS), tl.load(a + 2 * I_WORDS), tl.load(a + 3 * I_WORDS)
        f = tl.load(a + 4 * I_WORDS)
    else:
        p0 = tl.load(a, mask=mask, other=0)
        p1 = tl.load(a + I_WORDS, mask=mask, other=0)
        p2 = tl.load(a + 2 * I_WORDS, mask=mask, other=0)
        p3 = tl.load(a + 3 * I_WORDS, mask=mask, other=0)
        f = tl.load(a + 4 * I_WORDS, mask=mask, other=0)
    return (p0, p1, p2, p3), f.to(tl.float32, bitcast=True)


@triton.jit
def moe_int4_gemv_down_kernel(
    act_ptr, w2_ptr, s2_ptr, ids_ptr, topk_w_ptr, add_ptr, out_ptr,
    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_addt, stride_ot,
    H, magic,
    I_WORDS: tl.constexpr, TOP_K: tl.constexpr, GROUP_WORDS: tl.constexpr, HAS_ADD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr = False,
    PRELOAD: tl.constexpr = False, SHIFT16: tl.constexpr = False, F16: tl.constexpr = False,
    INTERPRET: tl.constexpr = False,
):
    """out[t, n] = sum over the k slots of token t of topk_w * (act[slot] W_down[n]^T), fp32 accumulation,
    stored in out's dtype (+ add[t, n], the shared experts' output, as a separate add would): the weighted
    sum over the experts is done here, no third launch, no atomics. act is nibble-major (gate_up's store).
    An expert chosen by several tokens is read by each of them (from L2 after the first). The slot and
    word loops are unrolled (I and top_k are compile-time), so every slot's weight loads are independent
    straight-line code that the compiler can issue together.

    PRELOAD (TOP_K a power of two, I in one chunk of BLOCK_W words; it pays with PDL): the k slots' rows are one
    [TOP_K * BLOCK_N, BLOCK_W] tile whose routing, route weights, packed words and scales are all loaded
    BEFORE the wait for gate_up. Under PDL this kernel's programs start while gate_up still streams (at
    decode sizes gate_up leaves the SMs room for them), so the down weights come in alongside gate_up's and
    only act, the arithmetic and the store are left after it. The routing was written by the kernel two
    launches back (top-k, or the router's launch with router_topk), which has finished when this kernel
    starts (tuning.pdl); it is read through L2 (.cg), never a stale L1 line.

    Both bodies sum in one order (exact.py): a slot's group dots times their scales, summed pairwise over the
    groups, times the route weight; then the slots pairwise (((s0 + s1) + (s2 + s3)) + ..., zeros padding TOP_K to
    a power of two). The launcher compiles this kernel without fp fusion, so each product is rounded alone (no
    compiler contracts it into the add after it, which could differ between the two bodies, or between lanes). So
    a token's output is the same bits with or without PRELOAD and at any tiles (BLOCK_N, warps) of one BLOCK_W:
    decode and verify agree whatever the table gives each T.

    F16: act is in _store_act_f16's packed form (int32) and the dots run in packed fp16 as gate_up's F16 does,
    each word's sum times its factor."""
    t = tl.program_id(0)
    nb = tl.program_id(1)
    if PRELOAD:
        _down_preloaded(act_ptr, w2_ptr, s2_ptr, ids_ptr, topk_w_ptr, add_ptr, out_ptr, t, nb,
                        stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_addt, stride_ot, H, magic,
                        I_WORDS, TOP_K, GROUP_WORDS, HAS_ADD, BLOCK_N, BLOCK_W, EVEN, PDL, SHIFT16, F16, INTERPRET)
        return
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n_offs < H
    w_idx = tl.arange(0, BLOCK_W)
    g_idx = tl.arange(0, BLOCK_W // GROUP_WORDS)
    zero_rows = (n_offs * 0)[:, None]
    level0, level1, level2, level3 = [tl.zeros([BLOCK_N], dtype=tl.float32)] * 4
    for s in tl.static_range(TOP_K):
        pair = t * TOP_K + s
        e = tl.load(ids_ptr + pair).to(tl.int64)
        route_w = tl.load(topk_w_ptr + pair)
        rows = w2_ptr + e * stride_we + n_offs.to(tl.int64)[:, None] * stride_wn
        scales = s2_ptr + e * stride_se + n_offs.to(tl.int64)[:, None] * stride_sn
        a_row = act_ptr + pair.to(tl.int64) * stride_at
        for w0 in tl.static_range(0, I_WORDS, BLOCK_W):
            p, sc = _load_int4_chunk(rows, scales, n_ok, w0, w_idx, g_idx, I_WORDS, GROUP_WORDS, EVEN)
            words = (w0 + w_idx)[None, :]
            xs_mask = (zero_rows == 0) & (words < I_WORDS)
            if F16:
                pairs, inv = _load_act_f16(a_row + zero_rows + words, xs_mask, I_WORDS, EVEN)
                dots = _group_dots_f16(p, pairs, GROUP_WORDS, INTERPRET, inv)
            else:
                dots = _group_dots(p, a_row + zero_rows + words, xs_mask, I_WORDS, magic, GROUP_WORDS, EVEN, SHIFT16)
            if w0 == 0:
                acc = dots * sc
            else:  # (several chunks: PRELOAD never has them, so this order need not match its)
                acc += dots * sc
        slot = tl.reshape(pairwise_sum(acc, 1, 1), [BLOCK_N]) * route_w
        level0, level1, level2, level3, y = _slot_tree(level0, level1, level2, level3, slot, s)
    for s in tl.static_range(TOP_K, _next_power_of_2(TOP_K)):  # zeros up to a power of two: no sum changes
        level0, level1, level2, level3, y = _slot_tree(level0, level1, level2, level3, level0 * 0.0, s)
    _store_down(y, add_ptr, out_ptr, t, n_offs, n_ok, stride_addt, stride_ot, HAS_ADD)


@triton.constexpr_function
def _next_power_of_2(n):
    return 1 << (int(n) - 1).bit_length()


@triton.jit
def _slot_tree(level0, level1, level2, level3, v, S: tl.constexpr):
    """Slot S's tile v (S = 0, 1, ... in turn) into the down kernel's sum over the slots, in pairwise_sum's order
    over them (((v0 + v1) + (v2 + v3)) + ..., as PRELOAD's tile sums them): level i holds the sum of the 2^i slots
    waiting for their partner (a binary counter). -> (levels, the last sum formed: the whole sum once S + 1 is a
    power of two). At most 16 slots."""
    tl.static_assert(S < 16, "the down kernel sums at most 16 slots")
    if S % 2 == 0:
        level0 = v
    else:
        v = level0 + v
        if S // 2 % 2 == 0:
            level1 = v
        else:
            v = level1 + v
            if S // 4 % 2 == 0:
                level2 = v
            else:
                v = level2 + v
                if S // 8 % 2 == 0:
                    level3 = v
                else:
                    v = level3 + v
    return level0, level1, level2, level3, v


@triton.jit
def _store_down(y, add_ptr, out_ptr, t, n_offs, n_ok, stride_addt, stride_ot, HAS_ADD: tl.constexpr):
    """out[t, n_offs] = y in out's dtype (+ add[t, n_offs])."""
    if HAS_ADD:  # rounded first, then added and rounded again: the numbers of `moe(x) + add` in torch
        add = tl.load(add_ptr + t.to(tl.int64) * stride_addt + n_offs, mask=n_ok, other=0.0).to(tl.float32)
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32) + add
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + n_offs, y.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _down_preloaded(act_ptr, w2_ptr, s2_ptr, ids_ptr, topk_w_ptr, add_ptr, out_ptr, t, nb,
                    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_addt, stride_ot, H, magic,
                    I_WORDS: tl.constexpr, TOP_K: tl.constexpr, GROUP_WORDS: tl.constexpr, HAS_ADD: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr,
                    SHIFT16: tl.constexpr, F16: tl.constexpr, INTERPRET: tl.constexpr):
    """moe_int4_gemv_down_kernel's PRELOAD body: row r of the [TOP_K * BLOCK_N] tile is output row
    nb * BLOCK_N + r % BLOCK_N of slot r // BLOCK_N."""
    R: tl.constexpr = TOP_K * BLOCK_N
    r = tl.arange(0, R)
    n_r = nb * BLOCK_N + r % BLOCK_N
    n_ok_r = n_r < H
    pair_r = t * TOP_K + r // BLOCK_N
    e_r = tl.load(ids_ptr + pair_r, cache_modifier=".cg").to(tl.int64)
    route_w = tl.load(topk_w_ptr + pair_r, cache_modifier=".cg")
    rows = w2_ptr + e_r[:, None] * stride_we + n_r.to(tl.int64)[:, None] * stride_wn
    scales = s2_ptr + e_r[:, None] * stride_se + n_r.to(tl.int64)[:, None] * stride_sn
    w_idx = tl.arange(0, BLOCK_W)
    p, sc = _load_int4_chunk(rows, scales, n_ok_r, 0, w_idx, tl.arange(0, BLOCK_W // GROUP_WORDS), I_WORDS,
                             GROUP_WORDS, EVEN)
    if PDL:  # everything above is weights or finished routing; act (gate_up's output) only after the wait
        gdc_wait()
        gdc_launch_dependents()
    words = w_idx[None, :]
    a_rows = act_ptr + pair_r.to(tl.int64)[:, None] * stride_at
    xs_mask = (n_r >= 0)[:, None] & (words < I_WORDS)
    if F16:
        pairs, inv = _load_act_f16(a_rows + words, xs_mask, I_WORDS, EVEN)
        dots = _group_dots_f16(p, pairs, GROUP_WORDS, INTERPRET, inv)
    else:
        dots = _group_dots(p, a_rows + words, xs_mask, I_WORDS, magic, GROUP_WORDS, EVEN, SHIFT16)
    part = tl.reshape(pairwise_sum(dots * sc, 1, 1), [R]) * route_w
    y = tl.reshape(pairwise_sum(tl.reshape(part, [TOP_K, BLOCK_N]), 0, 1), [BLOCK_N])
    n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    _store_down(y, add_ptr, out_ptr, t, n_offs, n_offs < H, stride_addt, stride_ot, HAS_ADD)


# --------------------------------------------------------------------------------------------------
# INT4 dot path for verify (a few tokens sharing experts): gate_up as tensor-core dots over an expert's pairs
# --------------------------------------------------------------------------------------------------
# The GEMV gate_up decodes an expert's nibbles once per (token, expert) pair: ~4 instructions a weight and pair,
# which a verify batch pays once for every token that chose the expert. Here the expert's first pair gathers all
# of its pairs (up to BLOCK_M at a time) as the columns of a tl.dot whose rows are the weights (2 * BLOCK_N of
# them: BLOCK_N = 32 makes the M = 64 of one Hopper warpgroup MMA), so a weight is decoded once per expert and
# the tensor cores do the per-pair work. EXACT: the decoded weights are (q - 8) * scale exactly in float32 (a
# bf16 scale has 8 significant bits and |q - 8| <= 8 three, so the product has at most 11: exact in TF32 as
# well) and the dot runs in TF32, so every product is the one the float32 reference forms and only the order of
# the float32 sums differs; else the weights are rounded to bf16 (SGLang's dequantised numbers) and the dot runs
# in bf16. The loop streams BLOCK_W words of the rows a step, the next step's words, scales and x prefetched by
# hand as in the GEMV gate_up; SPLIT programs share H (sync.py's last arrival adds their partials). act is
# stored as the GEMV gate_up stores it, so the GEMV down kernel reads it unchanged.
# On the H200 (docs/BENCHMARKS.md, tenth session) it pays only where many pairs share each expert: a program
# decodes to shared memory and waits on the MMA every step, and per expert it runs about half as fast as the
# GEMV runs per pair; so it is off by default (SGLANG_EAGLE3_MOE_DOT_MAX turns it on).


@triton.jit
def _expert_rows(ids_ptr, expert, TK, r0, BLOCK_M: tl.constexpr, TK_PAD: tl.constexpr):
    """(pair ids [BLOCK_M], row mask) of the r0-th .. (r0 + BLOCK_M - 1)-th pairs (in pair order) routed to
    `expert`; rows past the expert's count are masked (their pair reads as 0)."""
    offs = tl.arange(0, TK_PAD)
    ids = tl.load(ids_ptr + offs, mask=offs < TK, other=-1)
    member = (ids == expert) & (offs < TK)
    rank = tl.cumsum(member.to(tl.int32), axis=0) - 1
    m = r0 + tl.arange(0, BLOCK_M)
    sel = member[None, :] & (rank[None, :] == m[:, None])  # [BLOCK_M, TK_PAD]
    return tl.sum(tl.where(sel, offs[None, :], 0), axis=1), tl.max(sel.to(tl.int32), axis=1) > 0


@triton.jit
def _load_x_rows(x_rows, row_ok, w0, k_idx, N_WORDS, EVEN: tl.constexpr):
    """x of words w0 .. w0 + BLOCK_W of the gathered rows, [BLOCK_M, 8 * BLOCK_W] in K order (masked rows read
    0). EVEN: past the end re-reads the last chunk, as _load_int4_chunk does."""
    W8: tl.constexpr = k_idx.shape[0]
    if EVEN:
        k = tl.minimum(w0, N_WORDS - W8 // 8) * 8 + k_idx
        return tl.load(x_rows + k[None, :], mask=row_ok[:, None], other=0.0)
    k = w0 * 8 + k_idx
    return tl.load(x_rows + k[None, :], mask=row_ok[:, None] & (k < N_WORDS * 8)[None, :], other=0.0)


@triton.jit
def _scaled_int4_tile(packed, scale, magic, GROUP_WORDS: tl.constexpr, EXACT: tl.constexpr):
    """[R, 8 * W] weights (q - 8) * scale * 16^p(k % 8) in K order from packed [R, W] words and their group
    scales [R, W / GROUP_WORDS] (fp32): _int4_group's planes (the shift by 20) times the scales; the
    16^-p(k % 8) is the activations' (exact powers of two). fp32 with EXACT (exact, see above), else rounded
    to bf16."""
    R: tl.constexpr = packed.shape[0]
    W: tl.constexpr = packed.shape[1]
    s = tl.reshape(tl.broadcast_to(scale[:, :, None], [R, W // GROUP_WORDS, 8 * GROUP_WORDS]), [R, 8 * W])
    w = _int4_group(packed, magic, tl.float32, True) * s
    return w if EXACT else w.to(tl.bfloat16)


@triton.jit
def _store_act(acc, act_ptr, pairs, row_ok, n_offs, stride_at, I, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """act[pair, n] = silu(gate) * up from acc [2 * BLOCK_N, BLOCK_M] (gate rows, then up rows; a column a pair),
    nibble-major and pre-scaled as moe_int4_gemv_gate_up_kernel stores it without SHIFT16."""
    g, u = tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N, BLOCK_M]), [2, 1, 0]))  # [BLOCK_M, BLOCK_N] each
    j = n_offs % 8
    tl.store(act_ptr + pairs.to(tl.int64)[:, None] * stride_at + (j * (I // 8) + n_offs // 8)[None, :],
             g * tl.sigmoid(g) * u * _nibble_scale(j, False)[None, :], mask=row_ok[:, None] & (n_offs < I)[None, :])


@triton.jit
def moe_int4_dot_gate_up_kernel(
    x_ptr, w13_ptr, s13_ptr, ids_ptr, act_ptr, part_ptr, count_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    TK, I, H_WORDS, SPLIT_WORDS, magic,
    TOP_K: tl.constexpr, TK_PAD: tl.constexpr, GROUP_WORDS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, SPLIT: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr,
    INTERPRET: tl.constexpr, PDL: tl.constexpr = False,
):
    """act[pair, n] = silu(x W_gate[n]^T) * (x W_up[n]^T) in fp32 for BLOCK_N gate rows (and the matching up rows)
    of one expert and every pair routed to it, computed by the programs of the expert's first pair (the others
    exit), BLOCK_M pairs a dot. act layout as moe_int4_gemv_gate_up_kernel stores it (nibble-major, pre-scaled).
    Grid (pairs, I blocks, SPLIT): with SPLIT > 1 each program takes SPLIT_WORDS words of H (a multiple of
    BLOCK_W) and stores its fp32 partial dots to part [SPLIT, TK, 2I]; the last to arrive at the (pair, I block)
    counter (count_ptr, zero between calls, see sync.py) adds them in split order and stores act. A pair's
    numbers depend on which rows share its dot only through the tensor cores' fp32 sums."""
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    pair = tl.program_id(0)
    nb = tl.program_id(1)
    split = tl.program_id(2)
    leader, count, expert = _expert_group(ids_ptr, pair, TK, TK_PAD)
    if leader:
        r = tl.arange(0, 2 * BLOCK_N)  # tile row r: gate row n (r < BLOCK_N) or up row n, n = nb * BLOCK_N + r % BLOCK_N
        n_r = nb * BLOCK_N + r % BLOCK_N
        n_ok_r = n_r < I
        w_row = n_r + (r // BLOCK_N) * I  # the row of w13, and the column of part
        e = expert.to(tl.int64)
        rows = w13_ptr + e * stride_we + w_row.to(tl.int64)[:, None] * stride_wn
        scales = s13_ptr + e * stride_se + w_row.to(tl.int64)[:, None] * stride_sn
        w_idx = tl.arange(0, BLOCK_W)
        g_idx = tl.arange(0, BLOCK_W // GROUP_WORDS)
        k_idx = tl.arange(0, 8 * BLOCK_W)
        x_scale = _nibble_scale(k_idx % 8, False)[None, :]  # meets _int4_group's 16^p (exact)
        n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        lo = split * SPLIT_WORDS
        hi = tl.minimum(lo + SPLIT_WORDS, H_WORDS)  # loads clamp (EVEN) or mask (else) at the split's end
        for r0 in range(0, count, BLOCK_M):
            pairs, row_ok = _expert_rows(ids_ptr, expert, TK, r0, BLOCK_M, TK_PAD)
            x_rows = x_ptr + (pairs // TOP_K).to(tl.int64)[:, None] * stride_xt
            acc = tl.zeros([2 * BLOCK_N, BLOCK_M], dtype=tl.float32)  # weights as the dot's M
            pk, sc = _load_int4_chunk(rows, scales, n_ok_r, lo, w_idx, g_idx, hi, GROUP_WORDS, EVEN)
            xs = _load_x_rows(x_rows, row_ok, lo, k_idx, hi, EVEN)
            for w0 in range(lo, hi, BLOCK_W):  # (two or three chunks in flight measured no faster on the H200)
                pk_next, sc_next = _load_int4_chunk(rows, scales, n_ok_r, w0 + BLOCK_W, w_idx, g_idx, hi,
                                                    GROUP_WORDS, EVEN)
                xs_next = _load_x_rows(x_rows, row_ok, w0 + BLOCK_W, k_idx, hi, EVEN)
                wt = _scaled_int4_tile(pk, sc, magic, GROUP_WORDS, EXACT)
                a = xs.to(tl.float32) * x_scale
                if not EXACT:
                    a = a.to(tl.bfloat16)
                acc += _dot_nt(wt, a, INTERPRET, "tf32")
                pk, sc, xs = pk_next, sc_next, xs_next
            if SPLIT == 1:
                _store_act(acc, act_ptr, pairs, row_ok, n_offs, stride_at, I, BLOCK_N, BLOCK_M)
            else:
                tl.store(part_ptr + (split * TK + pairs).to(tl.int64)[None, :] * (2 * I) + w_row[:, None], acc,
                         mask=n_ok_r[:, None] & row_ok[None, :])
        if SPLIT > 1:
            if last_arrival(count_ptr + pair * tl.num_programs(1) + nb, SPLIT, INTERPRET):
                for r0 in range(0, count, BLOCK_M):
                    pairs, row_ok = _expert_rows(ids_ptr, expert, TK, r0, BLOCK_M, TK_PAD)
                    offs = pairs.to(tl.int64)[None, :] * (2 * I) + w_row[:, None]
                    ok = n_ok_r[:, None] & row_ok[None, :]
                    acc = tl.load(part_ptr + offs, mask=ok, other=0.0, cache_modifier=".cg")
                    for s in range(1, SPLIT):  # in split order: the same sums whichever program arrives last
                        acc += tl.load(part_ptr + s * TK * 2 * I + offs, mask=ok, other=0.0, cache_modifier=".cg")
                    _store_act(acc, act_ptr, pairs, row_ok, n_offs, stride_at, I, BLOCK_N, BLOCK_M)


# --------------------------------------------------------------------------------------------------
# INT4 tile path, weights as the dot's M ("swap"): prefill-sized batches in bf16
# --------------------------------------------------------------------------------------------------
# The plan is the tile path's (moe_align: blocks of one expert's pairs). Each program multiplies 2 x BLOCK_N
# gate/up rows (or BLOCK_N down rows) of its block's expert by the block's BLOCK_M pairs, BLOCK_W words of K a
# step: the weights are the dot's M operand and the pairs its N (a block is often part-filled at prefill
# sizes: N pads to 16, M is always full), several scale groups feed one tl.dot (K = 8 * BLOCK_W), and the group
# scales are applied to the decoded weights, which are then rounded to bf16 (_scaled_int4_tile), as SGLang's
# and vLLM's W4A16 kernels do. The group path above applies each scale to an exact per-group dot instead (no
# weight rounded) and pays a K = 32 dot and a result rescale per group for it.
# On the GPU the swap kernels decode with bf16x2 arithmetic, two weights an instruction: nibbles j and j + 4 of
# a word sit 16 bits apart, so (word >> 4j) & 0x000F000F | 0x43004300 (one LOP3 after the shift) is the bf16 pair
# (128 + q_j, 128 + q_j+4); an FMA subtracts 136 (exact: small integers) and a second multiplies by the group
# scale, rounding once: the same bf16 as rounding the exact float32 (q - 8) * scale (_scaled_int4_tile's).
def _dequant_bf16x8_ptx() -> str:
    """PTX for one int32 word and its scale (bf16, $9) -> the 8 weights as bf16 ($0..$7 = nibbles 0..7)."""
    steps = []
    for j in range(4):  # the pair (j, j + 4): its nibbles shifted to bits 0 and 16
        src = "$8" if j == 0 else "u"
        steps.append(("" if j == 0 else f"shr.u32 u, $8, {4 * j};\n")
                     + f"lop3.b32 t, {src}, 0x000F000F, 0x43004300, 0xea;\n"  # (src & mask) | magic
                     + "fma.rn.bf16x2 t, t, one, c;\n"  # - 136
                     + "fma.rn.bf16x2 t, t, s, z;\n"  # * scale (+ -0)
                     + f"mov.b32 {{${j}, ${j + 4}}}, t;\n")
    return ("{\n.reg .b32 s, t, u, one, c, z;\nmov.b32 s, {$9, $9};\nmov.b32 one, 0x3F803F80;\n"
            "mov.b32 c, 0xC308C308;\nmov.b32 z, 0x80008000;\n" + "".join(steps) + "}")


_DEQUANT_BF16X8 = tl.constexpr(_dequant_bf16x8_ptx())


@triton.jit
def _scaled_int4_tile_bf16x2(packed, scale, GROUP_WORDS: tl.constexpr):
    """_scaled_int4_tile's bf16 weights (q - 8) * scale in K order, without the 16^p factors (the activations
    are used as they are), decoded by _DEQUANT_BF16X8 (GPU only: inline PTX)."""
    R: tl.constexpr = packed.shape[0]
    W: tl.constexpr = packed.shape[1]
    s = tl.reshape(tl.broadcast_to(scale.to(tl.bfloat16)[:, :, None], [R, W // GROUP_WORDS, GROUP_WORDS]), [R, W])
    w0, w1, w2, w3, w4, w5, w6, w7 = tl.inline_asm_elementwise(
        _DEQUANT_BF16X8, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [packed, s], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    # [R, W, 2, 2, 2] with nibble j = 4a + 2b + c at [.., a, b, c], as _int4_group
    w = tl.join(tl.join(tl.join(w0, w4), tl.join(w2, w6)), tl.join(tl.join(w1, w5), tl.join(w3, w7)))
    return tl.reshape(w, [R, 8 * W])


@triton.jit
def _swap_rows_times_pairs(rows, scales, n_ok, a_rows, row_ok, K_WORDS, magic, GROUP_WORDS: tl.constexpr,
                           BLOCK_W: tl.constexpr, EVEN: tl.constexpr, INTERPRET: tl.constexpr):
    """[R, BLOCK_M] fp32: packed INT4 weight rows (rows [R, 1] pointers to K_WORDS words, scales [R, 1] to
    their group scales) times the pairs' activation rows (a_rows [BLOCK_M, 1], K order), transposed. The
    next chunk's words, scales and activations load before this chunk's arithmetic (Triton's pipeliner leaves
    loads that do not feed a tl.dot directly alone)."""
    R: tl.constexpr = rows.shape[0]
    BM: tl.constexpr = a_rows.shape[0]
    w_idx = tl.arange(0, BLOCK_W)
    g_idx = tl.arange(0, BLOCK_W // GROUP_WORDS)
    k_idx = tl.arange(0, 8 * BLOCK_W)
    x_scale = _nibble_scale(k_idx % 8, False)[None, :]  # meets _int4_group's 16^p (exact)
    acc = tl.zeros([R, BM], dtype=tl.float32)
    pk, sc = _load_int4_chunk(rows, scales, n_ok, 0, w_idx, g_idx, K_WORDS, GROUP_WORDS, EVEN)
    xs = _load_x_rows(a_rows, row_ok, 0, k_idx, K_WORDS, EVEN)
    for w0 in range(0, K_WORDS, BLOCK_W):
        pk_next, sc_next = _load_int4_chunk(rows, scales, n_ok, w0 + BLOCK_W, w_idx, g_idx, K_WORDS, GROUP_WORDS,
                                            EVEN)
        xs_next = _load_x_rows(a_rows, row_ok, w0 + BLOCK_W, k_idx, K_WORDS, EVEN)
        if INTERPRET:  # the same bf16 weights by float32 arithmetic (the interpreter runs no PTX)
            wt = _scaled_int4_tile(pk, sc, magic, GROUP_WORDS, False)
            a = (xs.to(tl.float32) * x_scale).to(tl.bfloat16)
        else:
            wt = _scaled_int4_tile_bf16x2(pk, sc, GROUP_WORDS)
            a = xs
        acc += _dot_nt(wt, a, INTERPRET, "tf32")
        pk, sc, xs = pk_next, sc_next, xs_next
    return acc


@triton.jit
def moe_int4_swap_gate_up_kernel(
    x_ptr, w13_ptr, s13_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, act_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    I, H_WORDS, magic,
    TOP_K: tl.constexpr, GROUP_WORDS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr, EVEN: tl.constexpr, INTERPRET: tl.constexpr,
):
    """act[pair, n] = silu(x W_gate[n]^T) * (x W_up[n]^T) (x's dtype, K order, as moe_gate_up_kernel stores it)
    for the pairs of one block and BLOCK_N gate rows with the matching up rows (one dot of 2 * BLOCK_N rows)."""
    pairs, row_ok, count = _block_rows(sorted_ptr, block_rows_ptr, BLOCK_M)
    if count > 0:
        e = tl.load(block_expert_ptr + tl.program_id(0)).to(tl.int64)
        r = tl.arange(0, 2 * BLOCK_N)  # tile row r: gate row n (r < BLOCK_N) or up row n
        n_r = tl.program_id(1) * BLOCK_N + r % BLOCK_N
        w_row = (n_r + (r // BLOCK_N) * I).to(tl.int64)
        acc = _swap_rows_times_pairs(w13_ptr + e * stride_we + w_row[:, None] * stride_wn,
                                     s13_ptr + e * stride_se + w_row[:, None] * stride_sn, n_r < I,
                                     x_ptr + (pairs // TOP_K).to(tl.int64)[:, None] * stride_xt, row_ok, H_WORDS,
                                     magic, GROUP_WORDS, BLOCK_W, EVEN, INTERPRET)
        g, u = tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N, BLOCK_M]), [2, 1, 0]))  # [BLOCK_M, BLOCK_N] each
        n_offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(act_ptr + pairs.to(tl.int64)[:, None] * stride_at + n_offs[None, :],
                 (g * tl.sigmoid(g) * u).to(act_ptr.dtype.element_ty), mask=row_ok[:, None] & (n_offs < I)[None, :])


@triton.jit
def moe_int4_swap_down_kernel(
    act_ptr, w2_ptr, s2_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, topk_w_ptr, out_ptr,
    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_ot,
    H, I_WORDS, magic,
    GROUP_WORDS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
    EVEN: tl.constexpr, INTERPRET: tl.constexpr,
):
    """out[pair, n] = topk_w[pair] * act[pair, :] W_down[n, :]^T (float32) for the pairs of one block and
    BLOCK_N rows of W_down, as moe_down_kernel stores it."""
    pairs, row_ok, count = _block_rows(sorted_ptr, block_rows_ptr, BLOCK_M)
    if count > 0:
        e = tl.load(block_expert_ptr + tl.program_id(0)).to(tl.int64)
        n_offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n_offs < H
        acc = _swap_rows_times_pairs(w2_ptr + e * stride_we + n_offs.to(tl.int64)[:, None] * stride_wn,
                                     s2_ptr + e * stride_se + n_offs.to(tl.int64)[:, None] * stride_sn, n_ok,
                                     act_ptr + pairs.to(tl.int64)[:, None] * stride_at, row_ok, I_WORDS, magic,
                                     GROUP_WORDS, BLOCK_W, EVEN, INTERPRET)
        route_w = tl.load(topk_w_ptr + pairs, mask=row_ok, other=0.0)
        tl.store(out_ptr + pairs.to(tl.int64)[None, :] * stride_ot + n_offs[:, None],
                 acc * route_w[None, :], mask=n_ok[:, None] & row_ok[None, :])
