"""Bulk L2 prefetch of byte ranges (weights a later kernel of the step will read).

Each program takes one range of the table and issues ``cp.async.bulk.prefetch.L2`` (sm_90+) for LANES pieces
of BULK bytes at a time: one instruction per piece, nothing comes back to the SM, so a handful of programs
can put tens of MB in flight while the kernels of the main stream, bound by their launch latency, leave the
memory system idle. The kernel is done once the instructions are issued; the lines land in L2 behind it.
"""

import triton
import triton.language as tl


@triton.jit
def _bulk_prefetch(addr, nbytes):
    # Predicated on a nonzero size: masked lanes pass 0 and issue nothing.
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def l2_prefetch_kernel(table_ptr, RANGES: tl.constexpr, BULK: tl.constexpr, LANES: tl.constexpr,
                       PROGRAMS_PER_RANGE: tl.constexpr):
    """table int64 [RANGES, 2]: (address, bytes) with 16-byte aligned addresses and sizes (the launcher checks).
    Grid (RANGES, PROGRAMS_PER_RANGE): program p of a range prefetches pieces p, p + P, p + 2P, ..."""
    r = tl.program_id(0)
    p = tl.program_id(1)
    base = tl.load(table_ptr + 2 * r)
    size = tl.load(table_ptr + 2 * r + 1)
    lane = tl.arange(0, LANES).to(tl.int64)
    step = LANES * PROGRAMS_PER_RANGE * BULK
    for off0 in range(p * LANES * BULK, size, step):
        off = off0 + lane * BULK
        n = tl.minimum(tl.maximum(size - off, 0), BULK).to(tl.int32)
        _bulk_prefetch(base + off, n)
