"""The shared expert's down projection (7168 x 256 on a Kimi TP=8 rank, on the side stream by default) on the CUDA
cores: fma_form takes 2-D products from K = 256 (fma_config: one warp of 32 lanes, one K step, 1792 programs).
Why: its tensor-core launch pads x's rows to 16 and streams 3.7 MB through shared memory for a K of 256.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_fma_short_k.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_form  # the package's, taken before kernels_from swaps this one in


def fma_form(N: int, K: int, x, w, epilogue: bool) -> bool:
    if x.dim() == 2 and not epilogue and w.stride(-1) == 1 and 256 <= K < gemv.FMA_MIN_K:
        return N * K <= gemv.FMA_MAX_WEIGHTS and gemv.env.GEMV_FMA.switch(default=True)
    return _real(N, K, x, w, epilogue)
