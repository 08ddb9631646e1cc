"""MLA's q_a + kv_a pair launch on the CUDA cores at 8 weight rows a program, 256 lanes over 8 warps (a config of
bench_gemv_launches.py's q_a+kv_a case, thirty-seventh session); the gated router + shared pair unchanged.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_fma_bn8.py --paired N``."""

from benchmarks.variants._gemv import plain_pair_variant

fma_pair_form, fma_pair_config = plain_pair_variant(__name__, {"BLOCK_N": 8})
