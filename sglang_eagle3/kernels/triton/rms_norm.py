"""RMSNorm in one launch, optionally fused with the residual add: one program per row.

The norm weight is loaded before the PDL wait (no kernel writes weights) and the output row index before the
residual's store: the compiler keeps a load below a store it might alias, and each load left there is one more
memory round trip after the previous kernel ends (rotary.py's module doc)."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, out_rows_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    D, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_OUT_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    """out = x * rsqrt(mean(x^2) + eps) * w in fp32, cast to out's dtype. With HAS_RESIDUAL, x is first
    replaced by (x + residual) rounded to the residual dtype, which is also stored to res_out: the same
    numbers as adding in torch and then normalising the sum. With HAS_OUT_ROWS, row i is stored to out row
    out_rows[i] (a scatter, e.g. into paged-cache slots)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    ok = offs < D
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    out_row = tl.load(out_rows_ptr + row).to(tl.int64) if HAS_OUT_ROWS else row
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    tl.store(out_ptr + out_row * stride_o + offs, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=ok)
