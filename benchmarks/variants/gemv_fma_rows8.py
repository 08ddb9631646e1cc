"""The single CUDA-core launches (MLA's q_b with its norm, W_UV per head) with up to 8 rows of x a program
(fma_config's 4 otherwise). At a verify of 5..8 two row groups of 4 double q_b's 384 programs to 768, which at ~4
blocks a SM no longer start in one wave (q_b 3.2 -> 6.6 us from T = 4 to 5 with PDL off, forty-eighth session);
with 8 rows one program a weight block, more accumulators a thread. Only T > 4 launches change (rows = min(MAX_ROWS,
next power of two of T)); a row's sums are the same code at any rows a program, so the bits do not change.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_fma_rows8.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_config  # the package's, taken before kernels_from swaps this one in


def fma_config(N: int, K: int) -> dict:
    return dict(_real(N, K), MAX_ROWS=8)
