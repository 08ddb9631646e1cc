"""The CUDA-core router + shared pair with 2 rows of x a program (fma_pair_config's 4 otherwise: at T = 4 two
programs a weight block, the second reading it through the L2; fewer registers).
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_pair_rows2.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_pair_config  # the package's, taken before kernels_from swaps this one in


def fma_pair_config(N1: int, N2: int, K: int, gated: bool = True) -> dict:
    return dict(_real(N1, N2, K, gated), MAX_ROWS=2)
