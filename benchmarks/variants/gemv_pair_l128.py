"""The CUDA-core router + shared gate/up pair at 128 lanes over 4 warps (fma_pair_config's gated pair: 256 over 8).
Why: MLA's q_a + kv_a pair, lanes first, made the 61-layer step faster at 128 lanes than at 256 although 256 was the
faster launch alone at T = 1 (thirty-seventh session); the gated pair's 256 was chosen rows first, alone.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_pair_l128.py --paired N``."""

from benchmarks.variants._gemv import gemv

_real = gemv.fma_pair_config  # the package's, taken before kernels_from swaps this one in


def fma_pair_config(N1: int, N2: int, K: int, gated: bool = True) -> dict:
    cfg = _real(N1, N2, K, gated)
    return dict(cfg, LANES=128, num_warps=4) if gated else cfg
