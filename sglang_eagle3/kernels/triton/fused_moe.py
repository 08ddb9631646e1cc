"""Fused MoE for decode/verify batch sizes, bf16 or INT4 W4A16 (pack-quantized, group 32) weights.

Three families of kernels, all with grids fixed by shapes (no sort, no host sync: CUDA-graph safe):

Tile path (bf16 and INT4, many tokens). Work is indexed by (pair, N-block), a pair being one (token, slot)
of topk_ids flattened to [T*k]. Only the first pair of each distinct expert (its "leader") works: it gathers
every pair routed to that expert and applies the weight tile to all of them, so an expert is read once per
step however many tokens chose it. The other programs exit after one small load. INT4 tiles are never
interleaved back into K order: nibble j of word w holds input k = 8w + j, and a dot product does not care
about the order of k, so the kernel does 8 dots of K/8 each against x sampled with stride 8 (x[:, j::8]),
sharing one scale tile (group 32 = 4 words).

INT4 GEMV path (decode/verify, no tl.dot): gate_up per (pair, N-block), down per (token, H-block); section
below.

INT4 mma gate_up (verify batches): per (N-block, K-slice, distinct expert), each weight decoded once for all
the expert's tokens, one tl.dot per scale group; writes the GEMV path's act for its down kernel. Last section.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

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


@triton.jit
def _group_chunk(ids_ptr, expert, TK, chunk, count, TK_PAD: tl.constexpr, BLOCK_T: tl.constexpr):
    """Pair ids [BLOCK_T] of members chunk*BLOCK_T.. of `expert`'s group (in pair order), and a row mask."""
    offs = tl.arange(0, TK_PAD)
    ids = tl.load(ids_ptr + offs, mask=offs < TK, other=-1)
    member = (ids == expert) & (offs < TK)
    rank = tl.cumsum(member.to(tl.int32), axis=0) - 1  # [TK_PAD] rank among members
    rows = chunk * BLOCK_T + tl.arange(0, BLOCK_T)
    sel = member[None, :] & (rank[None, :] == rows[:, None])  # [BLOCK_T, TK_PAD]
    return tl.sum(tl.where(sel, offs[None, :], 0), axis=1), rows < count


@triton.jit
def _expert_tile_dot(acc, x_ptr, x_row_off, row_ok, w_ptr, s_ptr, n_offs, n_ok, stride_wn, stride_sn, K,
                     INT4: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
                     INTERPRET: tl.constexpr, DOT_PRECISION: tl.constexpr = "tf32"):
    """acc[BLOCK_T, BLOCK_N] += x[rows, :K] @ W[n_offs, :K]^T, W bf16 or packed INT4 rows of K/8 words.
    DOT_PRECISION (tuning.dot_precision): float32 operands sum in IEEE float32 unless torch allows TF32."""
    if INT4:
        WORDS: tl.constexpr = BLOCK_K // 8
        w_idx = tl.arange(0, WORDS)
        for k0 in range(0, K, BLOCK_K):
            word = k0 // 8 + w_idx  # [WORDS]
            word_ok = word < K // 8
            wmask = n_ok[:, None] & word_ok[None, :]
            packed = tl.load(w_ptr + n_offs[:, None] * stride_wn + word[None, :], mask=wmask, other=0)
            scale = tl.load(s_ptr + n_offs[:, None] * stride_sn + word[None, :] // (GROUP // 8), mask=wmask,
                            other=0.0).to(tl.float32)  # [BLOCK_N, WORDS]
            bias = scale * 8.0
            for j in tl.static_range(8):
                q = ((packed >> (4 * j)) & 0xF).to(tl.float32)
                w = q * scale - bias  # (q - 8) * scale
                xj = tl.load(x_ptr + x_row_off[:, None] + (k0 + 8 * w_idx[None, :] + j),
                             mask=row_ok[:, None] & word_ok[None, :], other=0.0)  # [BLOCK_T, WORDS]
                if INTERPRET:
                    acc += tl.dot(xj.to(tl.float32), tl.trans(w), input_precision=DOT_PRECISION)
                else:
                    acc += tl.dot(xj, tl.trans(w.to(xj.dtype)), input_precision=DOT_PRECISION)
    else:
        k_idx = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + k_idx
            k_ok = k < K
            w = tl.load(w_ptr + n_offs[:, None] * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0)  # [BLOCK_N, BLOCK_K]
            xk = tl.load(x_ptr + x_row_off[:, None] + k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                         other=0.0)  # [BLOCK_T, BLOCK_K]
            if INTERPRET:
                acc += tl.dot(xk.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision=DOT_PRECISION)
            else:
                acc += tl.dot(xk, tl.trans(w), input_precision=DOT_PRECISION)
    return acc


@triton.jit
def moe_gate_up_kernel(
    x_ptr, w13_ptr, s13_ptr, ids_ptr, act_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    TK, H, I,
    TOP_K: tl.constexpr, TK_PAD: tl.constexpr, INT4: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr = "tf32",
):
    """act[pair, n] = silu(x W_gate^T) * (x W_up^T) for the pairs of one expert, N-block of I."""
    pair = tl.program_id(0)
    nb = tl.program_id(1)
    leader, count, expert = _expert_group(ids_ptr, pair, TK, TK_PAD)
    if leader:
        n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n_offs < I
        w_e = w13_ptr + expert.to(tl.int64) * stride_we
        s_e = s13_ptr + expert.to(tl.int64) * stride_se
        for chunk in range(0, tl.cdiv(count, BLOCK_T)):
            pairs, row_ok = _group_chunk(ids_ptr, expert, TK, chunk, count, TK_PAD, BLOCK_T)
            x_row_off = (pairs // TOP_K).to(tl.int64) * stride_xt
            gate = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
            up = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
            gate = _expert_tile_dot(gate, x_ptr, x_row_off, row_ok, w_e, s_e, n_offs, n_ok, stride_wn,
                                    stride_sn, H, INT4, BLOCK_K, GROUP, INTERPRET, DOT_PRECISION)
            up = _expert_tile_dot(up, x_ptr, x_row_off, row_ok, w_e + I * stride_wn, s_e + I * stride_sn,
                                  n_offs, n_ok, stride_wn, stride_sn, H, INT4, BLOCK_K, GROUP, INTERPRET,
                                  DOT_PRECISION)
            act = gate * tl.sigmoid(gate) * up
            tl.store(act_ptr + pairs.to(tl.int64)[:, None] * stride_at + n_offs[None, :],
                     act.to(act_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_down_kernel(
    act_ptr, w2_ptr, s2_ptr, ids_ptr, topk_w_ptr, out_ptr,
    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_ot,
    TK, H, I,
    TK_PAD: tl.constexpr, INT4: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
    DOT_PRECISION: tl.constexpr = "tf32",
):
    """out[pair, n] = topk_w[pair] * act[pair, :] W_down[n, :]^T for the pairs of one expert."""
    pair = tl.program_id(0)
    nb = tl.program_id(1)
    leader, count, expert = _expert_group(ids_ptr, pair, TK, TK_PAD)
    if leader:
        n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n_offs < H
        w_e = w2_ptr + expert.to(tl.int64) * stride_we
        s_e = s2_ptr + expert.to(tl.int64) * stride_se
        for chunk in range(0, tl.cdiv(count, BLOCK_T)):
            pairs, row_ok = _group_chunk(ids_ptr, expert, TK, chunk, count, TK_PAD, BLOCK_T)
            acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
            acc = _expert_tile_dot(acc, act_ptr, pairs.to(tl.int64) * stride_at, row_ok, w_e, s_e, n_offs,
                                   n_ok, stride_wn, stride_sn, I, INT4, BLOCK_K, GROUP, INTERPRET, DOT_PRECISION)
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
# 5..7 after one shift of the word by 20 (p = j - 5). The 16^-p is folded into the activations, taken
# "nibble-major" and pre-scaled: column j of word w is x[8w + j] * 16^-p (exact: a power of two). gate_up
# builds these columns from x itself, chunk by chunk (_load_x_chunk, _x_columns); the down kernel loads act
# as gate_up stored it, as tiles of the weights' shape with row stride 0. Either way they meet the weights
# in the weights' register layout. The OR constant comes in as a run-time argument: with both constants
# immediates, ptxas would need two LOP3s instead of one.
# Per weight: one LOP3, one FADD, one FFMA (~4 SASS instructions per weight in the loop at sm_90).
# Group scales multiply per-group partial sums (the [N, W] partials reshaped to [N, W/GW, GW]).


@triton.jit
def _nibble_bits(src, magic, P: tl.constexpr):
    """The float 2^23 + n * 16^P, n = the nibble of each int32 word at bits [4P, 4P + 4) (P <= 4)."""
    return ((src & (0xF << (4 * P))) | magic).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_nibble(packed, hi, magic, J: tl.constexpr):
    """(nibble J - 8) * 16^p of each int32 word, as fp32 (exact); p = J % 5, `hi` = packed >> 20."""
    P: tl.constexpr = J % 5
    if J < 5:
        bits = _nibble_bits(packed, magic, P)
    else:
        bits = _nibble_bits(hi, magic, P)
    return bits - (8388608.0 + 8.0 * (1 << (4 * P)))


@triton.jit
def _int_nibble(packed, hi12, magic, J: tl.constexpr):
    """nibble J - 8 of each int32 word, as fp32 (exact); `hi12` = packed >> 12. One LOP3 and one FFMA: the
    16^-P rides in the FFMA's multiplier (2^23 16^-P + n exactly, minus 2^23 16^-P + 8: exact, fused or not).
    Nibbles 4..7 come from hi12 at P = 1..4, so that no nibble is taken at bit 0 of a shifted word (which the
    compiler turns into a bit-field extract, SHF + SGXT, before the LOP3)."""
    P: tl.constexpr = J if J < 4 else J - 3
    if J < 4:
        bits = _nibble_bits(packed, magic, P)
    else:
        bits = _nibble_bits(hi12, magic, P)
    return bits * (1.0 / (1 << (4 * P))) - (8388608.0 / (1 << (4 * P)) + 8.0)


@triton.jit
def _pow16_neg(p):
    """16^-p for an int tensor p in [0, 5): the pre-scaling of nibble-major activations (exact)."""
    return tl.where(p == 0, 1.0, tl.where(p == 1, 1.0 / 16, tl.where(p == 2, 1.0 / 256, tl.where(
        p == 3, 1.0 / 4096, 1.0 / 65536))))


@triton.jit
def _load_xs(ptrs, mask, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _group_dots(packed, xs_ptrs, xs_mask, stride_j, magic, GROUP_WORDS: tl.constexpr, EVEN: tl.constexpr):
    """packed [N, W] words and xs_ptrs [N, W] (row stride 0) into nibble-major activations in memory (column
    j at xs_ptrs + j * stride_j) -> [N, W/GW] per-group sums of (q - 8) * x, before the group scales."""
    hi = packed >> 20
    t = _dequant_nibble(packed, hi, magic, 0) * _load_xs(xs_ptrs, xs_mask, EVEN)
    for j in tl.static_range(1, 8):
        t += _dequant_nibble(packed, hi, magic, j) * _load_xs(xs_ptrs + j * stride_j, xs_mask, EVEN)
    N: tl.constexpr = packed.shape[0]
    W: tl.constexpr = packed.shape[1]
    return tl.sum(tl.reshape(t, [N, W // GROUP_WORDS, GROUP_WORDS]), axis=2)


@triton.jit
def _group_dots_cols(packed, x_cols, magic, GROUP_WORDS: tl.constexpr):
    """_group_dots with the 8 activation columns already in registers (x_cols[j] [1, W], see _x_columns)."""
    hi = packed >> 20
    t = _dequant_nibble(packed, hi, magic, 0) * x_cols[0]
    for j in tl.static_range(1, 8):
        t += _dequant_nibble(packed, hi, magic, j) * x_cols[j]
    N: tl.constexpr = packed.shape[0]
    W: tl.constexpr = packed.shape[1]
    return tl.sum(tl.reshape(t, [N, W // GROUP_WORDS, GROUP_WORDS]), axis=2)


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
def _load_x_chunk(x_row, w0, w_idx, N_WORDS, EVEN: tl.constexpr):
    """x of words w0 + w_idx as a [W, 8] fp32 tile pre-scaled for the nibble trick: [w, j] = x[8w + j] *
    16^-(j % 5). One row is the 8 contiguous values of a packed word (16 bytes of bf16: one vector load).
    EVEN: no mask; past the end, re-reads the last chunk (as _load_int4_chunk does)."""
    j = tl.arange(0, 8)
    if EVEN:
        W: tl.constexpr = w_idx.shape[0]
        words = tl.minimum(w0, N_WORDS - W) + w_idx
        x = tl.load(x_row + 8 * words[:, None] + j[None, :])
    else:
        words = w0 + w_idx
        x = tl.load(x_row + 8 * words[:, None] + j[None, :], mask=(words < N_WORDS)[:, None], other=0.0)
    return x.to(tl.float32) * _pow16_neg(j % 5)[None, :]


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


@triton.jit
def _group_member(ids_ptr, expert, TK, r, TK_PAD: tl.constexpr):
    """Pair id of the r-th (in pair order) pair routed to `expert`."""
    offs = tl.arange(0, TK_PAD)
    ids = tl.load(ids_ptr + offs, mask=offs < TK, other=-1)
    member = (ids == expert) & (offs < TK)
    rank = tl.cumsum(member.to(tl.int32), axis=0) - 1
    return tl.sum(tl.where(member & (rank == r), offs, 0), axis=0)


@triton.jit
def moe_int4_gemv_gate_up_kernel(
    x_ptr, w13_ptr, s13_ptr, ids_ptr, act_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    TK, I, H_WORDS, magic,
    TOP_K: tl.constexpr, TK_PAD: tl.constexpr, GROUP_WORDS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr = False,
    PER_PAIR: tl.constexpr = True,
):
    """act[pair, n] = silu(x W_gate[n]^T) * (x W_up[n]^T) in fp32 for BLOCK_N gate rows and the matching up
    rows of one expert, from x [T, H] as it is (each chunk of x is loaded, pre-scaled and split into nibble
    columns here, see _load_x_chunk). act is stored nibble-major and pre-scaled for the down kernel:
    act[pair, j, w] holds the value of row 8w + j times 16^-(j % 5).
    PER_PAIR: every (pair, N block) program computes its own pair; pairs of a verify batch that share an
    expert run side by side and read the same weight lines, which the L2 serves once while they are in
    flight. Else the expert's first pair computes all of the expert's pairs one after another (re-reading
    the weights from L2) and the others exit: fewer programs, but the shared experts' work is serial.
    Either way a pair's arithmetic is the same code whatever the batch holds.

    NOTE: Triton's pipeliner only pipelines loads that feed a tl.dot (or loops carrying num_stages), so the
    next chunk is prefetched by hand: its loads (weights, scales and x) are issued before the current
    chunk's arithmetic, two chunks in flight per program."""
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    pair = tl.program_id(0)
    nb = tl.program_id(1)
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
            xs = _load_x_chunk(x_row, 0, w_idx, H_WORDS, EVEN)  # [BLOCK_W, 8]
            for w0 in range(0, H_WORDS, BLOCK_W):
                pg_next, sg_next = _load_int4_chunk(gate_rows, gate_scales, n_ok, w0 + BLOCK_W, w_idx, g_idx,
                                                    H_WORDS, GROUP_WORDS, EVEN)
                pu_next, su_next = _load_int4_chunk(up_rows, up_scales, n_ok, w0 + BLOCK_W, w_idx, g_idx,
                                                    H_WORDS, GROUP_WORDS, EVEN)
                xs_next = _load_x_chunk(x_row, w0 + BLOCK_W, w_idx, H_WORDS, EVEN)
                x_cols = _x_columns(xs)
                acc_g += _group_dots_cols(pg, x_cols, magic, GROUP_WORDS) * sg
                acc_u += _group_dots_cols(pu, x_cols, magic, GROUP_WORDS) * su
                pg, sg, pu, su, xs = pg_next, sg_next, pu_next, su_next, xs_next
            g = tl.sum(acc_g, axis=1)
            u = tl.sum(acc_u, axis=1)
            j = n_offs % 8
            tl.store(act_ptr + member.to(tl.int64) * stride_at + j * (I // 8) + n_offs // 8,
                     g * tl.sigmoid(g) * u * _pow16_neg(j % 5), mask=n_ok)


@triton.jit
def moe_int4_gemv_down_kernel(
    act_ptr, w2_ptr, s2_ptr, ids_ptr, topk_w_ptr, add_ptr, out_ptr,
    stride_at, stride_we, stride_wn, stride_se, stride_sn, stride_addt, stride_ot,
    H, magic,
    I_WORDS: tl.constexpr, TOP_K: tl.constexpr, GROUP_WORDS: tl.constexpr, HAS_ADD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[t, n] = sum over the k slots of token t of topk_w * (act[slot] W_down[n]^T), fp32 accumulation,
    stored in out's dtype (+ add[t, n], the shared experts' output, as a separate add would): the weighted
    sum over the experts is done here, no third launch, no atomics. act is nibble-major (gate_up's store).
    An expert chosen by several tokens is read by each of them (from L2 after the first). The slot and
    word loops are unrolled (I and top_k are compile-time), so every slot's weight loads are independent
    straight-line code that the compiler can issue together."""
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    nb = tl.program_id(1)
    n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n_offs < H
    w_idx = tl.arange(0, BLOCK_W)
    g_idx = tl.arange(0, BLOCK_W // GROUP_WORDS)
    zero_rows = (n_offs * 0)[:, None]
    acc = tl.zeros([BLOCK_N, BLOCK_W // GROUP_WORDS], dtype=tl.float32)
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
            acc += _group_dots(p, a_row + zero_rows + words, xs_mask, I_WORDS, magic, GROUP_WORDS,
                               EVEN) * (sc * route_w)
    y = tl.sum(acc, axis=1)
    if HAS_ADD:  # rounded first, then added and rounded again: the numbers of `moe(x) + add` in torch
        add = tl.load(add_ptr + t.to(tl.int64) * stride_addt + n_offs, mask=n_ok, other=0.0).to(tl.float32)
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32) + add
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + n_offs, y.to(out_ptr.dtype.element_ty), mask=n_ok)


# --------------------------------------------------------------------------------------------------
# INT4 tensor-core gate_up for verify batches: each weight decoded once for all of its expert's tokens
# --------------------------------------------------------------------------------------------------
# The GEMV gate_up above decodes an expert's nibbles again for every (token, slot) pair routed to it: at T=4
# a verify step's 32 pairs share ~11 experts, and that path is ALU-bound on the decoding. Here a program per
# (N block, K slice, distinct expert) decodes a [BLOCK_N, 32] tile of gate rows and one of up rows per scale
# group and multiplies each with the expert's gathered tokens (up to BLOCK_T columns) on the tensor cores.
# Exactness: (nibble - 8) is an integer in [-8, 7], exact in bf16/fp16/fp32 (decoded by one LOP3 + one FFMA,
# _int_nibble); x is used as it is; each dot spans exactly one scale group (K = 32 inputs), so its products
# are exact in fp32 and the group scale multiplies the fp32 dot result, as the GEMV path multiplies its fp32
# per-group partial sums. The two paths differ only in the order of the fp32 sums (and in how the tensor
# cores round their internal additions).
# K slices (SPLIT > 1): a verify step has too few distinct experts to fill the GPU with programs that each
# stream a whole [BLOCK_N, H] slab, so the H axis is split; each slice stores fp32 partials and the last to
# finish adds them in slice order (deterministic; sync.last_arrival) and runs the SiLU * up epilogue.
# Distinct experts are found in the kernel (no sort, no host sync): the grid has a fixed number of slots
# (the launcher's min(T*k, SLOTS)), each looping over every slots-th (expert, chunk of tokens) item, so that
# few programs find nothing to do whatever the routing.
# Its output is act in the GEMV path's layout (nibble-major, pre-scaled), read by moe_int4_gemv_down_kernel.
# Measured by compiling for sm_90 (tests/kernels/compile_checks.py): ~5.3 SASS instructions per weight in the
# main loop, against ~4.4 per weight and per pair in the GEMV gate_up; 26 KB of shared memory at 3 stages.


@triton.jit
def _expert_chunks(ids_ptr, TK, TK_PAD: tl.constexpr, BLOCK_T: tl.constexpr):
    """The mma gate_up's work items: (distinct expert, chunk of BLOCK_T of its pairs), numbered expert by expert
    in order of first appearance in topk_ids. Returns (ids [TK_PAD] (-1 past TK), count [TK_PAD]: pairs
    routed to pair i's expert, items [TK_PAD]: its chunks where pair i is its first pair (else 0), end
    [TK_PAD]: one past its last item there, the number of items)."""
    offs = tl.arange(0, TK_PAD)
    ids = tl.load(ids_ptr + offs, mask=offs < TK, other=-1)
    same = (ids[:, None] == ids[None, :]) & (offs < TK)[None, :]  # [TK_PAD, TK_PAD]
    count = tl.sum(same.to(tl.int32), axis=1)
    first = (tl.sum((same & (offs[None, :] < offs[:, None])).to(tl.int32), axis=1) == 0) & (offs < TK)
    items = tl.where(first, (count + BLOCK_T - 1) // BLOCK_T, 0)
    end = tl.cumsum(items, axis=0)
    return ids, count, items, end, tl.sum(items, axis=0)


@triton.jit
def _work_item(ids, count, items, end, j):
    """(expert, number of pairs routed to it, chunk) of work item j (see _expert_chunks)."""
    mine = (items > 0) & (end - items <= j) & (j < end)  # one pair: the expert's first
    return (tl.sum(tl.where(mine, ids, 0), axis=0), tl.sum(tl.where(mine, count, 0), axis=0),
            j - tl.sum(tl.where(mine, end - items, 0), axis=0))


@triton.jit
def _decode_k_order(packed, magic, dtype: tl.constexpr):
    """Packed words [N, W] -> weights (q - 8) [N, 8W] in dtype (exact), in K order (column 8w + j = nibble j
    of word w). The joins stack the 8 nibble planes inside each thread (j = 4a + 2b + c, joined on a, then b,
    then c), so the reshape moves no data."""
    hi12 = packed >> 12
    q0 = _int_nibble(packed, hi12, magic, 0).to(dtype)
    q1 = _int_nibble(packed, hi12, magic, 1).to(dtype)
    q2 = _int_nibble(packed, hi12, magic, 2).to(dtype)
    q3 = _int_nibble(packed, hi12, magic, 3).to(dtype)
    q4 = _int_nibble(packed, hi12, magic, 4).to(dtype)
    q5 = _int_nibble(packed, hi12, magic, 5).to(dtype)
    q6 = _int_nibble(packed, hi12, magic, 6).to(dtype)
    q7 = _int_nibble(packed, hi12, magic, 7).to(dtype)
    q = tl.join(tl.join(tl.join(q0, q4), tl.join(q2, q6)), tl.join(tl.join(q1, q5), tl.join(q3, q7)))
    N: tl.constexpr = packed.shape[0]
    W: tl.constexpr = packed.shape[1]
    return tl.reshape(q, [N, 8 * W])


@triton.jit
def _int4_group_dot(rows, scales, mask, xk, magic, INTERPRET: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """scale[n] * sum over one scale group of (q[n, k] - 8) * xk[k, t]: fp32 [N, T]. rows: [N, GW] pointers to
    the group's words, scales: [N] pointers to its scales, xk: [8 GW, T] activations (x.dtype), mask: [N, 1]
    (or None: every row and word exists)."""
    if mask is None:
        packed = tl.load(rows)
        scale = tl.load(scales).to(tl.float32)
    else:
        packed = tl.load(rows, mask=mask, other=0)
        scale = tl.load(scales, mask=tl.reshape(mask, [mask.shape[0]]), other=0.0).to(tl.float32)
    if INTERPRET:  # the interpreter's bf16 dot is not a bf16 dot; integer-valued fp32 operands are exact
        w = _decode_k_order(packed, magic, tl.float32)
        d = tl.dot(w, xk.to(tl.float32), input_precision="ieee")
    else:
        w = _decode_k_order(packed, magic, xk.dtype)
        d = tl.dot(w, xk, input_precision=DOT_PRECISION)
    return d * scale[:, None]


@triton.jit
def _store_act_tile(act_ptr, pairs, row_ok, n_offs, n_ok, g, u, stride_at, I):
    """act[pair, j, w] = silu(g) * u * 16^-(j % 5) for rows n = 8w + j (g, u: fp32 [N, T] of pairs [T]): the
    GEMV gate_up's store, so that moe_int4_gemv_down_kernel reads it as it reads that one."""
    j = n_offs % 8
    tl.store(act_ptr + pairs.to(tl.int64)[None, :] * stride_at + (j * (I // 8) + n_offs // 8)[:, None],
             g * tl.sigmoid(g) * u * _pow16_neg(j % 5)[:, None], mask=n_ok[:, None] & row_ok[None, :])


@triton.jit
def moe_int4_mma_gate_up_kernel(
    x_ptr, w13_ptr, s13_ptr, ids_ptr, act_ptr, part_ptr, count_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_at,
    TK, I, H_WORDS, words_per_split, magic,
    TOP_K: tl.constexpr, TK_PAD: tl.constexpr, GROUP_WORDS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr, EVEN: tl.constexpr,
    INTERPRET: tl.constexpr, DOT_PRECISION: tl.constexpr = "tf32", PDL: tl.constexpr = False,
):
    """act[pair, n] = silu(x W_gate[n]^T) * (x W_up[n]^T) (fp32, nibble-major and pre-scaled as the GEMV
    gate_up stores it), over grid (N blocks, SPLIT, slots). Program (nb, s, slot) takes BLOCK_N gate rows and
    the matching up rows, words [s * words_per_split, +words_per_split) of H, and the work items slot, slot +
    slots, ... (_expert_chunks: a distinct expert and BLOCK_T of its pairs; one item per expert when each token
    picks an expert once and T <= BLOCK_T; a slot with none only arrives, with SPLIT > 1). Per scale group the
    gate and the up tile are each one load, one decode and one dot of K = 32.
    part_ptr: fp32 [T*k, SPLIT, 2, I] partials (gate, up) by pair; count_ptr: int32 [slots, N blocks] arrival
    counters, zero before and after. Unused with SPLIT = 1.
    EVEN: every row block and K slice is full (no masks), as at Kimi's shapes.
    The loop over a slice's chunks of BLOCK_W words feeds tl.dot, so Triton's pipeliner streams the weights
    and x into shared memory num_stages - 1 chunks ahead (cp.async); the groups of a chunk are unrolled."""
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    nb = tl.program_id(0)
    s = tl.program_id(1)
    ids, count, items, end, n_items = _expert_chunks(ids_ptr, TK, TK_PAD, BLOCK_T)
    n_offs = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n_offs < I
    k_in = tl.arange(0, 8 * GROUP_WORDS)
    # the slice's scale groups (loop variables count groups: no division by GROUP_WORDS in the loop)
    g_lo = s * (words_per_split // GROUP_WORDS)
    g_hi = tl.minimum(g_lo + words_per_split // GROUP_WORDS, H_WORDS // GROUP_WORDS)
    row_stride = SPLIT * 2 * I  # of the partials
    # NOTE: one flat loop over (expert, chunk) items, their table computed once (4 registers a thread at T*k
    # <= 64): a loop over experts around one over chunks around the pipelined one over K, or recomputing the
    # table per item, made ptxas spill at sm_90.
    for j in range(tl.program_id(2), n_items, tl.num_programs(2)):
        expert, pairs_n, chunk = _work_item(ids, count, items, end, j)
        pairs, row_ok = _group_chunk(ids_ptr, expert, TK, chunk, pairs_n, TK_PAD, BLOCK_T)
        e = expert.to(tl.int64)
        gate_rows = (w13_ptr + e * stride_we + n_offs.to(tl.int64)[:, None] * stride_wn
                     + tl.arange(0, GROUP_WORDS)[None, :])
        up_rows = gate_rows + I * stride_wn
        gate_scales = s13_ptr + e * stride_se + n_offs.to(tl.int64) * stride_sn
        up_scales = gate_scales + I * stride_sn
        x_cols = x_ptr + (pairs // TOP_K).to(tl.int64)[None, :] * stride_xt + k_in[:, None]  # [8 GW, T]
        acc_g = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for g0 in range(g_lo, g_hi, BLOCK_W // GROUP_WORDS):
            for grp in tl.static_range(BLOCK_W // GROUP_WORDS):
                group = g0 + grp
                word = group * GROUP_WORDS
                if EVEN:
                    xk = tl.load(x_cols + 8 * word, mask=row_ok[None, :], other=0.0)
                    mask = None
                else:  # a group past the slice: x is 0 there (and the scale), so it adds 0
                    ok = group < g_hi
                    xk = tl.load(x_cols + 8 * word, mask=row_ok[None, :] & ok, other=0.0)
                    mask = n_ok[:, None] & ok
                acc_g += _int4_group_dot(gate_rows + word, gate_scales + group, mask, xk, magic, INTERPRET,
                                         DOT_PRECISION)
                acc_u += _int4_group_dot(up_rows + word, up_scales + group, mask, xk, magic, INTERPRET,
                                         DOT_PRECISION)
        if SPLIT == 1:
            _store_act_tile(act_ptr, pairs, row_ok, n_offs, n_ok, acc_g, acc_u, stride_at, I)
        else:
            part = part_ptr + pairs.to(tl.int64)[None, :] * row_stride + s * 2 * I + n_offs[:, None]
            tl.store(part, acc_g, mask=n_ok[:, None] & row_ok[None, :])
            tl.store(part + I, acc_u, mask=n_ok[:, None] & row_ok[None, :])
    # The SPLIT programs of (nb, slot) have the same items: the last to finish adds up all their partials.
    if SPLIT > 1:
        if last_arrival(count_ptr + tl.program_id(2) * tl.num_programs(0) + nb, SPLIT, INTERPRET):
            for j in range(tl.program_id(2), n_items, tl.num_programs(2)):
                expert, pairs_n, chunk = _work_item(ids, count, items, end, j)
                pairs, row_ok = _group_chunk(ids_ptr, expert, TK, chunk, pairs_n, TK_PAD, BLOCK_T)
                first = part_ptr + pairs.to(tl.int64)[None, :] * row_stride + n_offs[:, None]
                mask = n_ok[:, None] & row_ok[None, :]
                g = tl.load(first, mask=mask, other=0.0, cache_modifier=".cg")
                u = tl.load(first + I, mask=mask, other=0.0, cache_modifier=".cg")
                for sl in tl.range(1, SPLIT, loop_unroll_factor=1):  # in slice order: deterministic
                    g += tl.load(first + sl * 2 * I, mask=mask, other=0.0, cache_modifier=".cg")
                    u += tl.load(first + sl * 2 * I + I, mask=mask, other=0.0, cache_modifier=".cg")
                _store_act_tile(act_ptr, pairs, row_ok, n_offs, n_ok, g, u, stride_at, I)
