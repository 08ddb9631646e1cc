"""MLA's q_a + kv_a pair launch on the CUDA cores (triton_gemv_fma_pair without w2_up) at 256 lanes over 8 warps (the
gated pair's config; the package's plain pair takes 128 lanes since the thirty-seventh session, which paired both);
the gated router + shared pair unchanged.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_fma.py --paired N``."""

from benchmarks.variants._gemv import plain_pair_variant

fma_pair_form, fma_pair_config = plain_pair_variant(__name__, {"LANES": 256, "num_warps": 8})
