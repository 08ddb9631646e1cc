"""A rotary_kernel that does no work (timing only: the model's numbers are wrong with it): each program waits for
the previous kernel and lets the next one start, as the real kernel does under PDL, and stores nothing. Swapped
in with ``bench_verify_graph.py --kernels-from benchmarks/ablations/rotary_noop.py``, the step keeps the rotary
launch but loses its work, so the difference to the step as it is prices that work on the launch chain
(H200.md: "time variants that leave one stage out")."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def rotary_kernel(
    pos_ptr, cos_ptr, sin_ptr,
    q_ptr, q_out_ptr, k_ptr, k_out_ptr, k_out_rows_ptr,
    stride_qt, stride_qh, stride_qot, stride_qoh,
    stride_kt, stride_kh, stride_kot, stride_koh,
    stride_table, HQ, HK,
    HAS_K: tl.constexpr, K_OUT_ROWS: tl.constexpr, INTERLEAVED: tl.constexpr, HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False,
    NORM_C: tl.constexpr = False, c_ptr=None, nw_ptr=None, c_out_ptr=None, stride_ct=0, stride_cot=0, C=0,
    eps=0.0, BLOCK_C: tl.constexpr = 16, HAS_Q: tl.constexpr = True, ONE_BLOCK: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
