"""The CUDA-core router + shared pair at 2 weight rows a program with all four K steps' weight tiles loaded before
the PDL wait (BLOCK_N 2, PRELOAD 4: ~78 registers at one row of x, the whole 12.8 MB in flight while the RMSNorm
before it runs). ``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_pair_bn2_preload4.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_pair_config  # the package's, taken before kernels_from swaps this one in


def fma_pair_config(N1: int, N2: int, K: int) -> dict:
    return dict(_real(N1, N2, K), BLOCK_N=2, PRELOAD=4)
