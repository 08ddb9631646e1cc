"""Gumbel-max sampling over noise hashed from (request key, position, token id): one program a row."""

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
def gumbel_argmax_kernel(scores_ptr, keys_ptr, pos_ptr, out_ptr, V, stride_s, BLOCK_V: tl.constexpr):
    """out[r] = argmax_v (scores[r, v] + g[r, v]) with ref_gumbel_noise's g, the first index among equal
    maxima (as torch.argmax). Blocks of BLOCK_V tokens, a running best value and index."""
    r = tl.program_id(0)
    key = tl.load(keys_ptr + r).to(tl.uint32)
    pos = tl.load(pos_ptr + r).to(tl.uint32)
    rk = _mix32(key ^ _mix32(tl.full([1], 0, tl.uint32) + pos))  # [1]
    best = tl.full([1], float("-inf"), tl.float32)
    best_i = tl.zeros([1], dtype=tl.int32)
    row = scores_ptr + r.to(tl.int64) * stride_s
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        ok = v < V
        s = tl.load(row + v, mask=ok, other=float("-inf")).to(tl.float32)
        h = v.to(tl.uint32) * tl.full([BLOCK_V], TOKEN_MUL, tl.uint32)
        h = _mix32(_mix32(rk ^ h) ^ rk)
        u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        y = s - tl.log(-tl.log(u))
        y = tl.where(ok, y, float("-inf"))
        m = tl.max(y, axis=0)
        # the first index of the block's maximum (a NaN-free row: -inf scores stay -inf)
        i = tl.min(tl.where(y == m, v, V), axis=0)
        better = m > best
        best_i = tl.where(better, i, best_i)
        best = tl.where(better, m, best)
    tl.store(out_ptr + r + tl.arange(0, 1), best_i.to(tl.int64))
