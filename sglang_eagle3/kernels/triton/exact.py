"""Arithmetic whose rounding does not depend on how a kernel is launched.

A row of a decode step (T=1) and the same row inside a verify batch (T=k+1) must come out as the same bits, or
greedy speculation is lossless only away from near-ties. Two things in a Triton kernel can make them differ
although the code is the same:
- tl.sum adds in an order that follows the tensor's register layout (the elements a thread holds first, in
  register order, then a butterfly over the lanes that hold the rest), and Triton picks the layout from the tile
  shape and the warp count, so two configs of one kernel may round the same row's fp32 sum differently.
  ``pairwise_sum`` fixes the tree by the indices alone: a sum of two values is the same bits in either order, so
  halving an axis by adding its adjacent pairs gives ((v0 + v1) + (v2 + v3)) + ... in any layout, and costs the
  same adds (and shuffles) as tl.sum.
- With fp fusion on (Triton's default) the compiler may contract a product into the add that follows it, and
  where that add's other operand comes from another lane, lanes holding the same sum contract different
  products. ``mul_rn`` rounds a product on its own; a kernel whose products all feed such sums can instead be
  launched with ``enable_fp_fusion=False`` (the INT4 GEMV down kernel: inline-asm products there changed how
  ptxas scheduled its loads, docs/KERNELS.md).
"""

import triton
import triton.language as tl


@triton.jit
def mul_rn(a, b, INTERPRET: tl.constexpr):
    """a * b rounded on its own (fp32): PTX mul.rn is never contracted into an fma with the add that follows,
    whatever the kernel's fp-fusion setting. Without PTX (INTERPRET: the interpreter, or its emulation compiled for
    a GPU by a test) the product is formed in float64, where it is exact, and rounded to fp32 once: the same bits,
    and a rounding no compiler folds into the next fp32 add."""
    if INTERPRET:
        return (a.to(tl.float64) * b.to(tl.float64)).to(tl.float32)
    return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def pairwise_sum(t, AXIS: tl.constexpr, TO: tl.constexpr):
    """t [A, B] with its AXIS halved by adding adjacent pairs until it is TO long: [A, TO] (AXIS 1) or [TO, B]
    (AXIS 0). The axis's length must be TO times a power of two (at most 2^16)."""
    for _ in tl.static_range(16):
        if AXIS == 1:
            if t.shape[1] > TO:
                t = tl.sum(tl.reshape(t, [t.shape[0], t.shape[1] // 2, 2]), axis=2)
        else:
            if t.shape[0] > TO:
                t = tl.sum(tl.reshape(t, [t.shape[0] // 2, 2, t.shape[1]]), axis=1)
    return t
