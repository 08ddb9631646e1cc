"""MLA's W_UV on the tensor cores (as before the thirty-third session): fma_form takes 2-D products only, so no
per-head product takes the CUDA-core form. ``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_w_uv_tc.py
--paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_form  # the package's, taken before kernels_from swaps this one in


def fma_form(N, K, x, w, epilogue):
    return x.dim() == 2 and _real(N, K, x, w, epilogue)
