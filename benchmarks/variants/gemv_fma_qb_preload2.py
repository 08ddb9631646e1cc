"""MLA's q_b on the CUDA cores with both of its K steps' weight tiles loaded before the PDL wait (fma_config's
PRELOAD 2; 1 loads only the first there). ``bench_verify_graph.py --kernels-from
benchmarks/variants/gemv_fma_qb_preload2.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_config  # the package's, taken before kernels_from swaps this one in


def fma_config(N: int, K: int) -> dict:
    return dict(_real(N, K), PRELOAD=2)
