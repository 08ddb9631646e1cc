"""Builds launch-config variants of the skinny GEMM for bench_kernels.kernels_from (not a variant itself: its name
starts with "_"): a module defining ``gemv_config`` replaces kernels/gemv.py's heuristic while it is swapped in,
so the 61-layer step can be timed (bench_verify_graph.py --kernels-from ... --paired) at another config for one
launch shape without a knob in the package."""

import importlib

# (the package's attribute `gemv` is its dispatcher function, not this module)
gemv = importlib.import_module("sglang_eagle3.kernels.gemv")


def config_variant(module: str, match: dict, overrides: dict):
    """A gemv_config with the package's signature that returns the package's config with ``overrides`` for the
    launches whose (N, K, mats) as gemv_config is called equal ``match`` (a pair launch passes N = N1 + mats*N2),
    defined as if in ``module``."""
    real = gemv.gemv_config  # the package's, taken before kernels_from swaps this one in

    def gemv_config(N: int, K: int, B: int, k_major: bool, sms: int, mats: int = 1, smem_bytes: int = 96 << 10,
                    acts: int = 1, max_block_k: int = 256, max_stages: int = 4, lean: bool | None = None) -> dict:
        cfg = real(N, K, B, k_major, sms, mats, smem_bytes, acts, max_block_k, max_stages, lean)
        if (N, K, mats) == (match["N"], match["K"], match["mats"]):
            cfg = dict(cfg, **overrides)
        return cfg

    gemv_config.__module__ = module
    return gemv_config


def plain_pair_variant(module: str, overrides: dict | None):
    """(fma_pair_form, fma_pair_config) with the package's signatures, defined as if in ``module``, for the q_a + kv_a
    pair's variants: the plain pair on the CUDA cores (whatever SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR says) at the
    package's config with ``overrides``, or on the tensor cores with ``overrides`` None; the gated pair unchanged."""
    real_form, real_config = gemv.fma_pair_form, gemv.fma_pair_config  # the package's, before kernels_from swaps

    def fma_pair_form(K: int, gated: bool, epilogue: bool) -> bool:
        if not gated and overrides is None:
            return False
        return real_form(K, True, epilogue)

    def fma_pair_config(N1: int, N2: int, K: int, gated: bool = True) -> dict:
        cfg = real_config(N1, N2, K, gated)
        return cfg if gated or overrides is None else dict(cfg, **overrides)

    fma_pair_form.__module__ = fma_pair_config.__module__ = module
    return fma_pair_form, fma_pair_config
