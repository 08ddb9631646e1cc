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
