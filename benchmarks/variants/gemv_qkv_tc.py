"""MLA's q_a + kv_a pair launch on the tensor cores (as before the thirty-seventh session; the package's
SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0): fma_pair_form takes gated pairs only.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_tc.py --paired N``."""

from benchmarks.variants._gemv import gemv

_form = gemv.fma_pair_form  # the package's, taken before kernels_from swaps this one in


def fma_pair_form(K: int, gated: bool, epilogue: bool) -> bool:
    return gated and _form(K, gated, epilogue)
