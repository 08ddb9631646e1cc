"""MLA's q_a + kv_a pair launch on the CUDA cores (triton_gemv_fma_pair without w2_up) at 256 lanes over 8 warps (the
gated pair's config; the package's plain pair takes 128 lanes since the thirty-seventh session, which paired both);
the gated router + shared pair unchanged.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_fma.py --paired N``."""

from benchmarks.variants._gemv import gemv

_form = gemv.fma_pair_form  # the package's, taken before kernels_from swaps these in
_config = gemv.fma_pair_config


def fma_pair_form(K: int, gated: bool, epilogue: bool) -> bool:
    return _form(K, True, epilogue)


def fma_pair_config(N1: int, N2: int, K: int, gated: bool = True) -> dict:
    cfg = _config(N1, N2, K, gated)
    return cfg if gated else dict(cfg, LANES=256, num_warps=8)
