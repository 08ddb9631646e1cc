"""GPU run of the merge_uv checks (tests/kernels/mla_uv_checks.py) at Kimi TP=8 rank shapes with the GPU's table
config: folded W_UV against float64 and the unfolded op, and decode vs verify bit for bit (session 26, part z3)."""
import sys

import torch

sys.path.insert(0, "tests/kernels")
import kernel_checks  # noqa: E402,F401  (the helpers mla_uv_checks imports)
from mla_uv_checks import check_mla_merge_uv, check_mla_merge_uv_decode_verify_alike  # noqa: E402

from sglang_eagle3.kernels import tuning  # noqa: E402

dev = torch.device("cuda")
for T in (1, 4, 8):
    cfg = tuning.get_config("mla_attention", dev, "rows", T * 8)
    for ctx in (1024, 8192):
        print("uv", T, ctx, check_mla_merge_uv(1, T, 8, 512, 64, 128, 64, [ctx], device="cuda", config=cfg, calls=2))
        if T > 1:
            print("alike", T, ctx, check_mla_merge_uv_decode_verify_alike(T, 8, 512, 64, 128, 64, ctx, device="cuda",
                                                                        dtype=torch.bfloat16, config=cfg))
print("uv B=3", check_mla_merge_uv(3, 4, 8, 512, 64, 128, 64, [700, 3000, 20], device="cuda", calls=2,
                                  config=tuning.get_config("mla_attention", dev, "rows", 32)))
