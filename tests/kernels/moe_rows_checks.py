"""Cases for the INT4 GEMV MoE's gate_up in its ROWS form (a program decodes each weight word once for up to ROWS
pairs of its expert; kernels/triton/fused_moe.py _gate_up_rows). Merged into kernel_checks.CASES: the interpreter
runs them on CPU (PTX emulated in plain ops); at Kimi TP=8 shapes the GPU suite has its own test
(tests/kernels/test_kernels_gpu.py test_fused_moe_int4_gemv_rows, which also checks the PTX against its emulation).
"""

from __future__ import annotations

import torch

from sglang_eagle3 import kernels


def _rows_config(base: dict, rows: int) -> dict:
    return {"gate_up": {**base["gate_up"], "F16": True, "ROWS": rows}, "down": base["down"]}


def check_moe_gemv_rows(T: int, E: int, H: int, I: int, top_k: int, rows: int, device: str = "cpu", seed: int = 0,
                        pool: int | None = None, base: dict | None = None) -> dict:
    """ROWS = 2 / 4 against the one-pair form (ROWS 1, same tiles, F16 both): every output bit-identical (each row
    runs the same operations in the same order; only the decoding of the weights is shared), on bf16 inputs whose
    tokens draw their experts from the first ``pool`` (so experts hold 1 to T pairs: programs with one, some and
    ROWS pairs, and experts needing several programs), near the float64 reference; and a token computed alone equal
    to the same token in the batch (decode vs verify)."""
    from kernel_checks import GEMV_MID, rel_err

    from sglang_eagle3.kernels.fused_moe import triton_fused_moe_int4

    base = base or GEMV_MID
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    p13, s13 = kernels.quantize_int4(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5)
    p2, s2 = kernels.quantize_int4(torch.randn(E, H, I, generator=g) / I ** 0.5)
    pool = pool or E
    ids = torch.stack([torch.randperm(pool, generator=g)[:top_k] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, top_k, generator=g)
    args = [t.to(device) for t in (x, p13, s13, p2, s2, w / w.sum(-1, keepdim=True), ids)]

    def run(a, r):
        return triton_fused_moe_int4(*a, 32, None, path="gemv", config=_rows_config(base, r))

    one_pair, out = run(args, 1), run(args, rows)
    counts = torch.bincount(ids.flatten().long(), minlength=E)
    assert torch.equal(out, one_pair), (
        f"ROWS={rows} differs from the one-pair form ({T=} {pool=}, pairs an expert {counts[counts > 0].tolist()}): "
        f"{(out.float() - one_pair.float()).abs().max().item()}")
    x_, p13_, s13_, p2_, s2_, w_, ids_ = args
    err = rel_err(out, kernels.ref_fused_moe_int4(x_.double(), p13_, s13_, p2_, s2_, w_.double(), ids_, 32, None))
    assert err < 1e-2, f"ROWS={rows} rel err {err}"
    t = T // 2
    alone = run([a[t:t + 1] if i in (0, 5, 6) else a for i, a in enumerate(args)], rows)
    assert torch.equal(alone[0], out[t]), f"ROWS={rows}: token {t} alone differs from the batch"
    return {"rel_err": err, "max_pairs_an_expert": int(counts.max())}


CASES = {
    # 7 tokens on 4 experts of 8 (top-3: experts with 4-7 pairs, full and partial 4-row programs), H = 160: a full
    # chunk of 16 words then a partial one.
    "moe_int4_gemv_rows4_shared_experts": lambda: check_moe_gemv_rows(7, 8, 160, 32, 3, 4, seed=61, pool=4),
    "moe_int4_gemv_rows2_shared_experts": lambda: check_moe_gemv_rows(5, 8, 128, 32, 2, 2, seed=62, pool=3),
    # uniform routing over 16 experts: mostly one or two pairs an expert (the batched-decode shape).
    "moe_int4_gemv_rows4_uniform": lambda: check_moe_gemv_rows(6, 16, 128, 32, 3, 4, seed=63),
}
