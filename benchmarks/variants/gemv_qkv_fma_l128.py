"""MLA's q_a + kv_a pair launch on the CUDA cores at 128 lanes over 4 warps (fma_config's choice for one matrix of K =
7168; bench_gemv_fma.py at the thirty-sixth session, as one 2112-row matrix lanes first: 10.3 / 11.5 / 10.6 / 19.5 us
at T = 1 / 2 / 4 / 8 against 8.5 / 11.7 / 13.0 / 22.8 at 256 lanes and the tensor cores' 11.7 / 11.5 / 11.6 / 11.6);
the gated router + shared pair unchanged.
``bench_verify_graph.py --kernels-from benchmarks/variants/gemv_qkv_fma_l128.py --paired N``."""

from benchmarks.variants._gemv import plain_pair_variant

fma_pair_form, fma_pair_config = plain_pair_variant(__name__, {"LANES": 128, "num_warps": 4})
