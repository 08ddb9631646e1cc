"""MLA's q_a + kv_a pair launch on the CUDA cores at 64 lanes over 2 warps (a config of
bench_gemv_launches.py's q_a+kv_a case, thirty-seventh session); the gated router + shared pair unchanged.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_fma_l64.py --paired N``."""

from benchmarks.variants._gemv import gemv

_form = gemv.fma_pair_form  # the package's, taken before kernels_from swaps these in
_config = gemv.fma_pair_config


def fma_pair_form(K: int, gated: bool, epilogue: bool) -> bool:
    return _form(K, True, epilogue)


def fma_pair_config(N1: int, N2: int, K: int, gated: bool = True) -> dict:
    cfg = _config(N1, N2, K, gated)
    return cfg if gated else dict(cfg, LANES=64, num_warps=2)
