"""The CUDA-core router + shared pair with its first two K steps' weight tiles (of four) loaded before the PDL
wait (fma_pair_config's PRELOAD 2). ``bench_verify_graph.py --kernels-from
benchmarks/variants/gemv_pair_preload2.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_pair_config  # the package's, taken before kernels_from swaps this one in


def fma_pair_config(N1: int, N2: int, K: int) -> dict:
    return dict(_real(N1, N2, K), PRELOAD=2)
