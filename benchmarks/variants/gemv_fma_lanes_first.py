"""The CUDA-core forms (q_b with its norm, W_UV per head, the router + shared pair) with the weight tile lanes first
(kernels/gemv.py LANES_FIRST: [LANES, BLOCK_N, VEC], x used as loaded and widened once for all weight rows; offline
10-26% fewer SASS instructions a program at 4 rows of x). Other bits than the default tile (the sums across the lanes
go in another order), the same at every T.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_fma_lanes_first.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real_single = gemv.fma_config  # the package's, taken before kernels_from swaps these in
_real_pair = gemv.fma_pair_config


def fma_config(N: int, K: int) -> dict:
    return dict(_real_single(N, K), LANES_FIRST=True)


def fma_pair_config(N1: int, N2: int, K: int) -> dict:
    return dict(_real_pair(N1, N2, K), LANES_FIRST=True)
