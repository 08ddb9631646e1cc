"""Gumbel-max sampling over noise hashed from (request key, position, token id): programs over (row, chunk)."""

import triton
import triton.language as tl

# The reference's constants (kernels/ref.py), as 32-bit unsigned values.
MIX32_MUL1 = tl.constexpr(0x7FEB352D)
MIX32_MUL2 = tl.constexpr(0x846CA68B)
TOKEN_MUL = tl.constexpr(0x9E3779B9)


@triton.jit
def _mix32(x):
    """lowbias32 in uint32 arithmetic (products wrap mod 2^32, as the reference's masked int64 ones)."""
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, MIX32_MUL1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full(x.shape, MIX32_MUL2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def gumbel_argmax_kernel(scores_ptr, keys_ptr, pos_ptr, part_ptr, V, stride_s, map_ptr, CHUNK: tl.constexpr,
                         BLOCK_V: tl.constexpr, HAS_MAP: tl.constexpr):
    """Over grid (R, splits): program (r, s) takes tokens [s * CHUNK, (s + 1) * CHUNK) of row r and stores to
    part[r, s] (int64) its best token as one key, (order-preserving bits of scores + g) * 2^32 + (2^31 - 1 -
    token): the largest key of a row is its maximum with the first index among equal maxima (as torch.argmax).
    HAS_MAP: column v's noise is the noise of token map[v] (a draft vocabulary's target ids)."""
    r = tl.program_id(0)
    sp = tl.program_id(1)
    key = tl.load(keys_ptr + r).to(tl.uint32)
    pos = tl.load(pos_ptr + r).to(tl.uint32)
    rk = _mix32(key ^ _mix32(tl.full([1], 0, tl.uint32) + pos))  # [1]
    best = tl.full([1], -(2**63), tl.int64)
    row = scores_ptr + r.to(tl.int64) * stride_s
    for v0 in range(sp * CHUNK, sp * CHUNK + CHUNK, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        ok = v < V
        s = tl.load(row + v, mask=ok, other=float("-inf")).to(tl.float32)
        t = tl.load(map_ptr + v, mask=ok, other=0) if HAS_MAP else v
        h = t.to(tl.uint32) * tl.full([BLOCK_V], TOKEN_MUL, tl.uint32)
        h = _mix32(_mix32(rk ^ h) ^ rk)
        u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        y = s - tl.log(-tl.log(u))
        b = y.to(tl.int32, bitcast=True).to(tl.int64)
        ordered = tl.where(b < 0, -1 - b, b + 2**31)  # float order as [0, 2^32)
        k = (ordered - 2**31) * 2**32 + (2**31 - 1 - v.to(tl.int64))
        k = tl.where(ok, k, -(2**63))
        best = tl.maximum(best, tl.max(k, axis=0))
    tl.store(part_ptr + r * tl.num_programs(1) + sp + tl.arange(0, 1), best)


FIXED = tl.constexpr(4294967296.0)  # 2^32: weights summed across programs as integers in units of 2^-32
HIST_STRIDE = tl.constexpr(16)  # int64 slots between two bins' counters: one 128-byte line each


@triton.jit
def top_select_kernel(z_ptr, stride_z, V, C, PASS, lo_ptr, zmax_ptr, target_ptr, hist_ptr, state_ptr, thr_ptr,
                      cand_ptr, count_ptr, MASS: tl.constexpr, PASSES: tl.constexpr, FROM_CANDS: tl.constexpr,
                      KEEP: tl.constexpr, FINISH: tl.constexpr, CHUNK: tl.constexpr, GROUP: tl.constexpr,
                      BLOCK_C: tl.constexpr):
    """One pass of a radix select over the 32-bit ordered keys of z's rows, 4 bits (16 bins) a pass: pass j
    first picks digit j-1 from the row's 16 bin totals of pass j-1 (every program of the row does the same pick),
    then program (r, c) sums the weights of its CHUNK tokens' candidates per value of digit j under the picked
    prefix and adds them to the row's totals hist[j, r, :]. The pass after the last (FINISH, PASS == PASSES) only
    picks, and stores the threshold. State a row, after j digits (slot j of state, float64: exact for all three):
    the prefix, A = the weight of the candidates above the prefix's range, P = the target weight.

    Candidates: z >= lo[r] (and, with MASS, a weight exp(z - zmax[r]) > 0); weight 1 without MASS. Keys: uint32 in
    the floats' order (_select_bins; -inf lowest, -0.0 just below +0.0). The threshold is the least candidate
    value v whose candidates strictly above weigh less than P (P = target * their total with MASS: top_p; P =
    target without: top_k). Digit d of a pass holds it iff its bin is not empty and A + (the bins above d) < P;
    the lowest such digit is taken, since every value in a lower bin has at least that much above it.

    Sums: each program's in float32 (its chunk's elements in one order), rounded to integers of 2^-32 and added
    atomically: integer sums do not depend on the order the programs arrive in, so a row's threshold is the same on
    every run and in any batch. (A bin whose weight rounds to 0 counts as empty: tokens below ~1e-10 of the most
    likely one's probability, which no top_p short of 1 reaches.)

    KEEP (the third pass): program (r, c) stores its chunk's candidates (in their order) in cand[r, c * CHUNK:],
    count[r, c] of them: after 8 bits of the key they are the tokens within a factor of 4 of the threshold's
    magnitude. FROM_CANDS (the passes after it): program (r, g) reads those of GROUP chunks (blocks of GROUP x
    BLOCK_C slots, a chunk's list a row of it) instead of z. Over z, one block of CHUNK tokens a program, loaded
    before the pick (which it does not depend on): on the H200 a pass cost its programs' chain of dependent loads
    more than the tokens it read."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    R = tl.num_programs(0)
    dd = tl.arange(0, 16)
    v = tl.arange(0, CHUNK)[None, :]  # [1, CHUNK], the one-hot's layout: [16, CHUNK] needs no conversion
    cands = cand_ptr + (r.to(tl.int64) * C + c) * CHUNK
    if not FINISH and not FROM_CANDS:
        n = tl.minimum(V - c * CHUNK, CHUNK)
        s = tl.load(z_ptr + r.to(tl.int64) * stride_z + c * CHUNK + v, mask=v < n, other=float("-inf"))
    lo = tl.load(lo_ptr + r)
    st = state_ptr + r * (PASSES + 1) * 4
    prefix = tl.zeros([], tl.int64)
    a = tl.zeros([], tl.float64)
    p = tl.zeros([], tl.float64)
    if PASS > 0:
        bins = tl.load(hist_ptr + (((PASS - 1) * R + r) * 16 + dd) * HIST_STRIDE).to(tl.float64)  # (< 2^50: exact)
        if PASS == 1:
            target = tl.load(target_ptr + r).to(tl.float64)
            if MASS:
                p = target * tl.sum(bins, axis=0)
            else:
                p = target * FIXED
        else:
            prefix = tl.load(st + (PASS - 1) * 4).to(tl.int64)
            a = tl.load(st + (PASS - 1) * 4 + 1)
            p = tl.load(st + (PASS - 1) * 4 + 2)
        above = tl.sum(tl.where(dd[None, :] > dd[:, None], bins[None, :], 0.0), axis=1)  # [16]: the bins above d
        holds = (bins > 0) & (a + above < p)
        top = tl.max(tl.where(bins > 0, dd, 0), axis=0)  # (the highest non-empty bin always holds it: A < P)
        d = tl.min(tl.where(holds, dd, 16), axis=0)
        d = tl.where(d < 16, d, top)
        a = a + tl.sum(tl.where(dd == d, above, 0.0), axis=0)
        prefix = prefix * 16 + d
        if c == 0:
            tl.store(st + PASS * 4, prefix.to(tl.float64))
            tl.store(st + PASS * 4 + 1, a)
            tl.store(st + PASS * 4 + 2, p)
    if FINISH:  # the prefix is the whole key: back to the float it orders (the key's map inverted, in int64)
        b = tl.where(prefix >= 2**31, prefix - 2**31, -1 - prefix).to(tl.int32).to(tl.float32, bitcast=True)
        target = tl.load(target_ptr + r)
        if MASS:
            active = target < 1.0
        else:
            active = (target >= 1.0) & (target < V)
        # A row without candidates (lo above all of it; with MASS every weight NaN or 0: a row of -inf, or of +inf
        # tokens) left every pass's bins empty: prefix 0, whose float is a NaN, not a threshold. The reference
        # returns lo then; tl.maximum(lo, NaN) gave lo or NaN depending on the backend's NaN rule (the interpreter
        # propagates it, and z >= NaN then dropped every token).
        active = active & (prefix != 0)
        tl.store(thr_ptr + r, tl.where(active, tl.maximum(lo, b), lo))
    elif FROM_CANDS:
        gc = c * GROUP + tl.arange(0, GROUP)
        longest = tl.max(tl.load(count_ptr + r * C + gc, mask=gc < C, other=0), axis=0)
        e = tl.arange(0, GROUP * BLOCK_C)[None, :]  # [1, GROUP * BLOCK_C]: row e // BLOCK_C of the group's lists
        ec = c * GROUP + e // BLOCK_C
        n = tl.load(count_ptr + r * C + ec, mask=ec < C, other=0)
        acc = tl.zeros([16], tl.float32)
        for j0 in range(0, longest, BLOCK_C):
            col = j0 + e % BLOCK_C
            inside = col < n
            s = tl.load(cand_ptr + (r.to(tl.int64) * C + ec) * CHUNK + col, mask=inside, other=float("-inf"))
            acc += _select_bins(s, inside, lo, prefix, zmax_ptr + r, 28 - 4 * PASS, dd, MASS)[0]
        _add_bins(hist_ptr, PASS, R, r, dd, acc)
    else:
        acc, cand = _select_bins(s, v < n, lo, prefix, zmax_ptr + r, 28 - 4 * PASS, dd, MASS)
        if KEEP:  # this pass's candidates for the ones after, in their order
            tl.store(cands + tl.cumsum(cand.to(tl.int32), axis=1) - 1, s, mask=cand)
            tl.store(count_ptr + r * C + c, tl.sum(tl.sum(cand.to(tl.int32), axis=1), axis=0))
        _add_bins(hist_ptr, PASS, R, r, dd, acc)


@triton.jit
def _select_bins(s, inside, lo, prefix, zmax_ptr, shift, dd, MASS: tl.constexpr):
    """(float32 [16] the candidates' weights per value of the key's digit at ``shift``, the candidates [1, N]) for
    scores s [1, N] (the one-hot [16, N] in s's layout: no conversion)."""
    b = s.to(tl.int32, bitcast=True)
    u = b.to(tl.uint32, bitcast=True)
    ones = tl.full(s.shape, 0xFFFFFFFF, tl.uint32)  # (~u: the interpreter takes it as u ^ -1, refused)
    # The floats' order: a negative float's bits all flipped, a positive one's with the sign bit set.
    key = tl.where(b < 0, u ^ ones, u | tl.full(s.shape, 0x80000000, tl.uint32))
    cand = inside & (s >= lo) & (((key >> (shift + 3)) >> 1) == prefix.to(tl.uint32))  # (no shift by 32)
    if MASS:
        w = tl.where(cand, tl.exp(s - tl.load(zmax_ptr)), 0.0)  # (an underflowed weight adds nothing)
        cand = cand & (w > 0)
    else:
        w = tl.where(cand, 1.0, 0.0)
    dig = ((key >> shift) & 15).to(tl.int32)
    return tl.sum(tl.where(dig == dd[:, None], w, 0.0), axis=1), cand


@triton.jit
def _add_bins(hist_ptr, PASS, R, r, dd, acc):
    """A program's bin sums, rounded to integers of 2^-32, added to the row's totals of the pass: relaxed atomics
    (the next launch reads them), each bin on a 128-byte line of its own (the row's programs add to the same 16
    counters: one line would take every row's adds in series)."""
    q = (acc.to(tl.float64) * FIXED + 0.5).to(tl.int64)
    tl.atomic_add(hist_ptr + ((PASS * R + r) * 16 + dd) * HIST_STRIDE, q, sem="relaxed")
