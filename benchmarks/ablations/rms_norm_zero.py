"""An rms_norm_kernel that stores zeros (timing only: the model's numbers are wrong with it): after the PDL wait
each program stores a zero row to out (and to res_out with a residual), loading nothing after the wait, so the
norm's dependent chain (x and the residual, the sum, the store) is gone but its launch and stores stay.
``bench_verify_graph.py --kernels-from benchmarks/ablations/rms_norm_zero.py`` prices that chain in the step.
NOTE: the zero hidden state makes every token's router logits equal, so the routing picks the same experts for
every token: fewer distinct experts at T > 1 than the real routing reads (at T = 1 the count is the same)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from benchmarks.ablations._fill import zeros as fill  # rms_norm_noise.py compiles this kernel with another fill


@triton.jit
def rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, out_rows_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    D, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_OUT_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    ok = offs < D
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    out_row = tl.load(out_rows_ptr + row).to(tl.int64) if HAS_OUT_ROWS else row
    if HAS_RESIDUAL:
        tl.store(res_out_ptr + row * stride_ro + offs, fill(row * BLOCK_D + offs + 1).to(res_out_ptr.dtype.element_ty),
                 mask=ok)
    tl.store(out_ptr + out_row * stride_o + offs, fill(row * BLOCK_D + offs).to(out_ptr.dtype.element_ty), mask=ok)
