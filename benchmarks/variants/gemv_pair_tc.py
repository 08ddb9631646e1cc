"""The router + shared gate/up pair on the tensor cores (as before the thirty-first session): fma_pair_form never
takes a pair. ``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_pair_tc.py --paired N``."""


def fma_pair_form(K: int, gated: bool, epilogue: bool) -> bool:
    return False
