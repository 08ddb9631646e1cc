"""MLA's q_a + kv_a pair on the CUDA cores with up to 8 rows of x a program (fma_pair_config's 4): at a verify of 8
one program a weight block reads each weight once (two programs at 4 rows read it twice, the second through the L2),
for more accumulators a thread. Why: the plain pair costs 4.1-4.7% of the step at T = 8 (thirty-seventh session).
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_rows8.py --paired N``."""

from benchmarks.variants._gemv import plain_pair_variant

fma_pair_form, fma_pair_config = plain_pair_variant(__name__, {"MAX_ROWS": 8})
