"""A split reduction inside one launch: the last of a group's programs to finish reduces the group.

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
