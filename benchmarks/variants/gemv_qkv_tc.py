"""MLA's q_a + kv_a pair launch on the tensor cores (as before the thirty-seventh session; the package's
SGLANG_EAGLE3_GEMV_FMA_PLAIN_PAIR=0): fma_pair_form takes gated pairs only.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_tc.py --paired N``."""

from benchmarks.variants._gemv import plain_pair_variant

fma_pair_form, fma_pair_config = plain_pair_variant(__name__, None)
