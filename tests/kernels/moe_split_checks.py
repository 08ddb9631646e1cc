"""Cases for the INT4 GEMV MoE's gate_up split over H (its config's SPLIT, with CHUNK_SUMS: programs of whole chunks,
the last to finish adding every chunk's sum in chunk order; kernels/triton/fused_moe.py). Merged into
kernel_checks.CASES: the interpreter runs them on CPU (PTX emulated in plain ops); at Kimi TP=8 shapes the GPU suite
has its own test (tests/kernels/test_kernels_gpu.py test_fused_moe_int4_gemv_split).
"""

from __future__ import annotations

import torch

from sglang_eagle3 import kernels


def moe_int4_inputs(T: int, E: int, H: int, I: int, top_k: int, seed: int, pool: int | None = None,
                    device: str = "cpu") -> list[torch.Tensor]:
    """bf16 x, quantized random weights and normalised routing whose tokens draw their experts from the first
    ``pool`` (so experts hold one to T pairs): the arguments of triton_fused_moe_int4 before the group size."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    p13, s13 = kernels.quantize_int4(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5)
    p2, s2 = kernels.quantize_int4(torch.randn(E, H, I, generator=g) / I ** 0.5)
    ids = torch.stack([torch.randperm(pool or E, generator=g)[:top_k] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, top_k, generator=g)
    return [t.to(device) for t in (x, p13, s13, p2, s2, w / w.sum(-1, keepdim=True), ids)]


def check_moe_gemv_split(T: int, E: int, H: int, I: int, top_k: int, splits: tuple[int, ...], f16: bool,
                         block_w: int, device: str = "cpu", seed: int = 0, pool: int | None = None,
                         block_n: int = 16) -> dict:
    """gate_up split 2..n ways over H (n past the chunk count too) against one program over H (CHUNK_SUMS both, the
    same tiles), on bf16 inputs with tokens sharing experts: act (gate_up's fp32 output, where the sums' order
    shows; the MoE's bf16 output would mostly round it away) bit-identical, and a token alone (decode) split
    against the same token unsplit in the batch (verify: buckets may differ in SPLIT) too. The group sums' form
    (CHUNK_SUMS off) must differ from it in act somewhere (else the comparisons could not see an order), and the
    MoE's output near the float64 reference in every form."""
    from kernel_checks import GEMV_SMALL, rel_err

    from sglang_eagle3.kernels.fused_moe import _int4_outputs, _launch_gemv_gate_up, triton_fused_moe_int4

    args = moe_int4_inputs(T, E, H, I, top_k, seed, pool, device)

    def config(split, chunk_sums=True):
        return {"BLOCK_N": block_n, "BLOCK_W": block_w, "num_warps": 1, "F16": f16, "CHUNK_SUMS": chunk_sums,
                "SPLIT": split}

    def act_of(a, split, chunk_sums=True):
        x, p13, s13, ids = a[0], a[1], a[2], a[6]
        _, act = _int4_outputs(x, ids, I)
        _launch_gemv_gate_up(x, p13, s13, ids, act, group=32, gate_up_cfg=config(split, chunk_sums), pdl=False,
                             shift16=True)
        return act

    x, p13, s13, p2, s2, w, ids = args
    ref = kernels.ref_fused_moe_int4(x.double(), p13, s13, p2, s2, w.double(), ids, 32, None)
    errs = {}
    for split, chunk_sums in ((1, True), (1, False), (max(splits), True)):
        out = triton_fused_moe_int4(*args, 32, None, path="gemv",
                                    config={"gate_up": config(split, chunk_sums), "down": GEMV_SMALL["down"]})
        errs[f"split{split}_chunk_sums{int(chunk_sums)}"] = err = rel_err(out, ref)
        assert err < 1e-2, f"SPLIT={split} CHUNK_SUMS={chunk_sums}: rel err {err}"
    one = act_of(args, 1)
    assert not torch.equal(act_of(args, 1, chunk_sums=False), one), "CHUNK_SUMS off and on: the same act bits"
    t = T // 2
    for split in splits:
        act = act_of(args, split)
        assert torch.equal(act, one), (f"SPLIT={split} differs from one program over H ({T=} {H=} {block_w=} "
                                       f"{f16=}): {(act - one).abs().max().item()}")
        alone = act_of([a[t:t + 1] if i in (0, 5, 6) else a for i, a in enumerate(args)], split)
        assert torch.equal(alone, one[t * top_k:(t + 1) * top_k]), (
            f"SPLIT={split}: token {t} alone differs from the unsplit batch")
    return errs


CASES = {
    # H = 224: 28 words in chunks of 8 (2 groups a chunk): 3 full chunks and a partial one; splits of 1, 2 and 1
    # chunks (2, 3), 4 and past the count (6, 9); 5 tokens of top-3 on 4 of 8 experts, the packed fp16 dots
    "moe_int4_gemv_split_f16_partial_chunk": lambda: check_moe_gemv_split(5, 8, 224, 32, 3, (2, 3, 4, 6, 9), True, 8,
                                                                          seed=63, pool=4),
    # the fp32 dots, four 8-word chunks over 256 (even: no masks; at two chunks the order could not show: a + b is
    # b + a), splits of 2, 2 (3 asked) and 1 chunk; decode alone (T=1) inside a verify-sized batch of 4
    "moe_int4_gemv_split_fp32_even": lambda: check_moe_gemv_split(4, 6, 256, 32, 2, (2, 3, 4), False, 8, seed=64),
}
