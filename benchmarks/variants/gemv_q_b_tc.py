"""MLA's q_b on the tensor cores (as before the twenty-third session) on a Kimi-K2.5 TP=8 rank (N = 8 heads x 192 =
1536, K = q_lora_rank 1536): the fifty-first session's launch gaps had the CUDA-core q_b at 6.37 us alone at a verify
of 4 against 3.95 at decode (a read-only kernel of its bytes 3.24). ``bench_verify_graph.py --kernels-from
benchmarks/variants/gemv_q_b_tc.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_form  # the package's, taken before kernels_from swaps this one in


def fma_form(N, K, x, w, epilogue):
    return (N, K) != (1536, 1536) and _real(N, K, x, w, epilogue)
