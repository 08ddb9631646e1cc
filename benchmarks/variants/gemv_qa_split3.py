"""The skinny GEMM with the q_a + kv_a pair at split 3 (198 programs);
every other launch as shipped (timing only; another split sums in another order, the same for every T).
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qa_split3.py --paired N``."""

from benchmarks.variants._gemv import config_variant

gemv_config = config_variant(__name__, {"N": 1536 + 576, "K": 7168, "mats": 1}, {"SPLIT": 3})
