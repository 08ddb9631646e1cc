"""kernels.apply_rotary without its launch (timing only: the model's numbers are wrong with it): q keeps its
un-rotated rope columns and no new latent reaches the cache (the keys the attention reads are last step's), so
the step loses the rotary's work and its launch. Against ``rotary_noop.py`` (the launch kept, its work gone) it
prices what the launch alone costs in the step. ``bench_verify_graph.py --kernels-from
benchmarks/ablations/rotary_skip.py``."""


def apply_rotary(q, k, positions, cos, sin, *, interleaved: bool, inplace: bool = False, k_out=None,
                 k_out_rows=None, c_norm=None, use_triton: bool | None = None):
    return q, (k if k_out is None else None)
