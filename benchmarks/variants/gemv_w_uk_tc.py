"""MLA's W_UK on the tensor cores (as before the thirty-third session's N-contiguous CUDA-core form): fma_form takes
no N-contiguous product. ``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_w_uk_tc.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_form  # the package's, taken before kernels_from swaps this one in


def fma_form(N, K, x, w, epilogue):
    return w.stride(-1) == 1 and _real(N, K, x, w, epilogue)
