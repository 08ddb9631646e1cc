"""The INT4 GEMV gate_up with its nibble decode and dots made cheap, every load, sum, store and the grid kept
(_moe_cheap_dots.py; timing only): ``bench_verify_graph.py --paired N --kernels-from`` this file prices gate_up's
decode arithmetic in the step."""

from benchmarks.ablations._moe_cheap_dots import kernels

moe_int4_gemv_gate_up_kernel = kernels(__name__)["moe_int4_gemv_gate_up_kernel"]
