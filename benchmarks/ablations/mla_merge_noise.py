"""mla_merge_zero.py's stand-in storing a pseudo-random output instead of zeros (_fill.noise; timing only): against
mla_merge_zero.py in one paired run it separates the merge's work from what zero attention outputs change
downstream (W_UV and o_proj computing on zeros)."""

from benchmarks.ablations import mla_merge_zero
from benchmarks.ablations._fill import noise, with_fill

mla_merge_splits_kernel = with_fill(mla_merge_zero.mla_merge_splits_kernel, noise, __name__)
