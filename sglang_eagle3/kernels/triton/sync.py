"""A split reduction inside one launch (the last of a group's programs to finish reduces the group), or left
to the kernel that reads the result (load_split_sum).

Each of the SPLITS programs of a group stores its partial result, then arrives on the group's int32 counter
(``last_arrival``). The program that arrives last has seen every other program's stores; it sets the counter
back to 0, so the counters are zero between calls (no memset launch; a CUDA graph replays as captured), and
reduces the partials in split order (deterministic whichever program it is). It must read them with
``cache_modifier=".cg"``: another SM's stores are in L2, not in this SM's L1. The SPLITS programs of a group
must all run: a program that returns early never arrives.
"""

import triton
import triton.language as tl


@triton.jit
def fence_acq_rel(x):
    # All threads fence before the barrier + counter atomic (release) and after it (acquire): the
    # threadfence-reduction pattern. The interpreter runs programs one after another and needs none.
    return tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def last_arrival(count_ptr, SPLITS, INTERPRET: tl.constexpr):
    """True in the one program of SPLITS that arrives last at int32 ``*count_ptr`` (which it resets to 0)."""
    if not INTERPRET:
        fence_acq_rel(tl.program_id(0))
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLITS - 1
    if last:
        if not INTERPRET:
            fence_acq_rel(arrived)
        tl.store(count_ptr, 0)
    return last


@triton.jit
def load_split_sum(ptrs, mask, SPLITS: tl.constexpr, split_stride, GATED: tl.constexpr, up_stride,
                   DT: tl.constexpr):
    """What a split GEMV's reduction would have stored at ``ptrs`` (pointers into split 0's plane), read from
    its unreduced partials instead (kernels/split_sum.py SplitSum): fp32 planes ``split_stride`` apart added in
    split order (s = 0, 1, ...), then rounded to DT as the GEMV's epilogue rounds; GATED: SiLU of the gate sum
    times the up sum (planes ``up_stride`` further), rounded as that epilogue does. So the reader computes the
    very numbers it would have loaded, one launch tail (the last split's handshake, ~1.6 us on the H200)
    earlier. Read through L2 (another launch wrote them). Masked-off elements are 0."""
    acc = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(ptrs + s * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
    y = acc.to(DT)
    if GATED:
        up = tl.load(ptrs + up_stride, mask=mask, other=0.0, cache_modifier=".cg")
        for s in tl.static_range(1, SPLITS):
            up += tl.load(ptrs + s * split_stride + up_stride, mask=mask, other=0.0, cache_modifier=".cg")
        g = y.to(tl.float32)
        sg = (g / (1.0 + tl.exp(-g))).to(DT).to(tl.float32)
        y = (sg * up.to(DT).to(tl.float32)).to(DT)
    return y
