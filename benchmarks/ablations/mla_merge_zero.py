"""An mla_merge_splits_kernel that stores zeros (timing only: the model's numbers are wrong with it): after the
PDL wait each program stores its zero output block, loading nothing, so the merge's dependent chain (the
splits' partials, the weighting, the store) is gone but its launch and stores stay.
``bench_verify_graph.py --kernels-from benchmarks/ablations/mla_merge_zero.py`` prices that chain in the step."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from benchmarks.ablations._fill import zeros as fill  # mla_merge_noise.py compiles this kernel with another fill


@triton.jit
def mla_merge_splits_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr, seq_lens_ptr, stride_o_tok, stride_o_head, NUM_SPLITS,
    T: tl.constexpr, H: tl.constexpr, DC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLITS_PAD: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False, GROUPS: tl.constexpr = 1,
):
    q_tok = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    cell = q_tok * stride_o_tok + head * stride_o_head + d
    tl.store(out_ptr + cell, fill(cell).to(out_ptr.dtype.element_ty))
