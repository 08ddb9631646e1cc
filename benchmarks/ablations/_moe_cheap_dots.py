"""The INT4 GEMV MoE's kernels with their nibble decode and dots made cheap (not an ablation itself: its name starts
with "_"; moe_int4_gemv_gate_up_cheap.py and moe_int4_gemv_down_cheap.py each take one kernel from here).

Everything else stays the package's: the grid, the routing reads, every weight, scale, x and act load with its
prefetch and PDL placement, the group sums over each chunk, the scales and route weights, silu and act's packed
store, the output store. Only the packed fp16 form's per-word work (~18 SASS instructions a word: 4 LOP3, 4 packed
fp16 ops to decode, 4 HFMA2 and a conversion to fp32 for the dot, BENCHMARKS.md nineteenth session) becomes an xor
of the word with its x (or act) pairs turned into a value in [-1, 1), so the loads stay live and what the later
kernels compute on stays bounded noise (an all-zero stream runs faster: _fill.py). Timing only: the model's numbers
are wrong with it. Paired against the package in the step (``bench_verify_graph.py --paired N --kernels-from``) it
prices the decode arithmetic under PDL: what an INT4 GEMV that decoded for free could win there at most."""

import triton
import triton.language as tl

from benchmarks.ablations._fill import with_helpers
from sglang_eagle3.kernels.triton import fused_moe
from sglang_eagle3.kernels.triton.exact import pairwise_sum


@triton.jit
def _word_noise(packed, p0, p1, p2, p3):
    """Each word xor its four x pairs, its low 16 bits as a value in [-1, 1): one use of every operand."""
    h = packed ^ p0 ^ p1 ^ p2 ^ p3
    return (h & 0xFFFF).to(tl.float32) * (1.0 / 32768.0) - 1.0


@triton.jit
def _group_dots_f16(packed, pairs, GROUP_WORDS: tl.constexpr, INTERPRET: tl.constexpr, inv=None):
    t = _word_noise(packed, pairs[0], pairs[1], pairs[2], pairs[3])
    if inv is not None:
        t = t * inv
    W: tl.constexpr = packed.shape[1]
    return pairwise_sum(t, 1, W // GROUP_WORDS)


@triton.jit
def _dequant_f16(packed, INTERPRET: tl.constexpr):
    return packed, packed, packed, packed


@triton.jit
def _dots_dequantized_f16(dq, pairs, GROUP_WORDS: tl.constexpr, INTERPRET: tl.constexpr):
    return _group_dots_f16(dq[0], pairs, GROUP_WORDS, INTERPRET)


CHEAP = {"_group_dots_f16": _group_dots_f16, "_dequant_f16": _dequant_f16,
         "_dots_dequantized_f16": _dots_dequantized_f16}


def kernels(module: str, cheap: bool = True) -> dict:
    """fused_moe's kernels compiled against the cheap helpers (or, cheap=False, against its own: the same code
    through with_helpers, which the CPU test holds bit for bit to the package's), defined as if in ``module``."""
    return with_helpers(fused_moe, CHEAP if cheap else {}, module)
