"""MLA's q_a + kv_a pair launch on the CUDA cores at 64 lanes over 2 warps (a config of
bench_gemv_launches.py's q_a+kv_a case, thirty-seventh session); the gated router + shared pair unchanged.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_fma_l64.py --paired N``."""

from benchmarks.variants._gemv import plain_pair_variant

fma_pair_form, fma_pair_config = plain_pair_variant(__name__, {"LANES": 64, "num_warps": 2})
