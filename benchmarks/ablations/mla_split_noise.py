"""mla_split_zero.py's stand-in storing pseudo-random partials instead of zeros (_fill.noise; timing only; the
log-sum-exps stay 0): against mla_split_zero.py in one paired run it separates the split pass's work from what
zero attention outputs change downstream (W_UV and o_proj computing on zeros)."""

from benchmarks.ablations import mla_split_zero
from benchmarks.ablations._fill import noise, with_fill

mla_split_kv_kernel = with_fill(mla_split_zero.mla_split_kv_kernel, noise, __name__)
