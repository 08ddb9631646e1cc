"""The INT4 GEMV down kernel with its nibble decode and dots made cheap, every load, sum, store and the grid kept
(_moe_cheap_dots.py; timing only): ``bench_verify_graph.py --paired N --kernels-from`` this file prices the down
kernel's decode arithmetic in the step (with moe_int4_gemv_gate_up_cheap.py after a '+', both kernels')."""

from benchmarks.ablations._moe_cheap_dots import kernels

moe_int4_gemv_down_kernel = kernels(__name__)["moe_int4_gemv_down_kernel"]
