"""The skinny GEMM with the router + shared gate/up pair at split 7 (140 programs);
every other launch as shipped (timing only; another split sums in another order, the same for every T).
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_rs_split7.py --paired N``."""

from benchmarks.variants._gemv import config_variant

gemv_config = config_variant(__name__, {"N": 384 + 2 * 256, "K": 7168, "mats": 2}, {"SPLIT": 7})
