"""The CUDA-core router + shared pair at 2 weight rows a program (fma_pair_config's BLOCK_N 4 otherwise: twice the
programs, half the registers of weights each). ``bench_verify_graph.py --kernels-from
benchmarks/variants/gemv_pair_bn2.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_pair_config  # the package's, taken before kernels_from swaps this one in


def fma_pair_config(N1: int, N2: int, K: int) -> dict:
    return dict(_real(N1, N2, K), BLOCK_N=2)
