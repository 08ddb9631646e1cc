"""MLA's W_UV (per head, 128 x 512) on the CUDA cores at another config than fma_config's 4 rows / 64 lanes / 2 warps:
BLOCK_N=2. Another config sums in another order, at every T alike. ``bench_verify_graph.py --kernels-from
benchmarks/variants/gemv_w_uv_bn2.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_config  # the package's, taken before kernels_from swaps this one in


def fma_config(N: int, K: int) -> dict:
    cfg = _real(N, K)
    return dict(cfg, BLOCK_N=2) if (N, K) == (128, 512) else cfg
