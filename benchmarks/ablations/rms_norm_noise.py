"""rms_norm_zero.py's stand-in storing a pseudo-random pattern instead of zeros (_fill.noise; timing only): the
norm's launch and stores stay, its loads and arithmetic go, and the kernels after it compute on non-zero data.
Against rms_norm_zero.py in one paired run it separates the norm's work from what an all-zero stream changes."""

from benchmarks.ablations import rms_norm_zero
from benchmarks.ablations._fill import noise, with_fill

rms_norm_kernel = with_fill(rms_norm_zero.rms_norm_kernel, noise, __name__)
