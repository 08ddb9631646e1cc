"""MLA's q_a + kv_a pair launch on the CUDA cores (triton_gemv_fma_pair without w2_up) at fma_pair_config's 256 lanes
over 8 warps, as SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=1 runs it; the gated router + shared pair unchanged.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_fma.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_pair_form  # the package's, taken before kernels_from swaps this one in


def fma_pair_form(K: int, gated: bool, epilogue: bool) -> bool:
    return _real(K, True, epilogue)
