"""o_proj (7168 x 1024 on a Kimi TP=8 rank, 7.3M weights) on the CUDA cores: fma_form's weight cap raised from 5M to
8M (the lm_head slice and the dense layer's down stay on the tensor cores). Why: alone the CUDA-core form was level
with the tensor cores at T = 1 (6.0 against 5.9 us, thirty-sixth session's bench_gemv_fma.py), but MLA's q_a + kv_a,
0.6 us faster alone, made the 61-layer step 3.7 us a layer faster (thirty-seventh session): the step may price the
form differently from the launch alone.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_fma_oproj.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_form  # the package's, taken before kernels_from swaps this one in


def fma_form(N: int, K: int, x, w, epilogue: bool) -> bool:
    if x.dim() == 2 and not epilogue and w.stride(-1) == 1 and gemv.FMA_MIN_K <= K <= gemv.FMA_MAX_K:
        return N * K <= 8 << 20 and gemv.env.GEMV_FMA.switch(default=True)
    return _real(N, K, x, w, epilogue)
