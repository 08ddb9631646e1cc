"""The CUDA-core router + shared pair with up to 8 rows of x a program (fma_pair_config's 4 otherwise: at T = 8 one
program a weight block instead of two, the second reading it through the L2; 149 registers instead of 110, one
block a SM). Only T > 4 launches change (rows = min(MAX_ROWS, next power of two of T)); a row's sums are the same
code at any rows a program, so the bits do not change. ``bench_verify_graph.py --kernels-from
benchmarks/variants/gemv_pair_rows8.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_pair_config  # the package's, taken before kernels_from swaps this one in


def fma_pair_config(N1: int, N2: int, K: int, gated: bool = True) -> dict:
    return dict(_real(N1, N2, K, gated), MAX_ROWS=8)
