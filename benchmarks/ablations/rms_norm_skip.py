"""kernels.rms_norm without its launch (timing only: the model's numbers are wrong with it): the norm returns its
input as the normed value and the residual unchanged, so the step loses both the norm's work and its launch.
Against ``rms_norm_zero.py`` (the launch kept, its work gone) it prices what the launch alone costs in the step,
which is what folding a norm into its neighbours could save at most.
``bench_verify_graph.py --kernels-from benchmarks/ablations/rms_norm_skip.py``. Calls writing into ``out`` (the
latent's norm into cache rows, where that is not fused into the rotary launch) keep the real kernel.
NOTE: the un-normed stream grows or shrinks from layer to layer and may reach inf; the routing then may pick the
same experts for every token: read T = 1 (the same expert count as real routing), not T > 1."""

from sglang_eagle3.kernels.rms_norm import triton_rms_norm


def rms_norm(x, weight, eps, residual=None, *, out=None, out_rows=None, use_triton: bool | None = None):
    if out is not None:
        return triton_rms_norm(x, weight, eps, residual, out=out, out_rows=out_rows)
    return x if residual is None else (x, residual)
