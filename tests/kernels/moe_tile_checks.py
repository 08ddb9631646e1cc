"""Checks of the MoE tile path (pairs sorted by expert into blocks, tl.dot per block): its routing plan
(moe_align), its INT4 decode, and that a token's output does not depend on the batch around it, under the
interpreter (CASES, run by kernel_checks.py) and on the GPU (test_kernels_gpu.py).

kernel_checks imports this module at its end, to merge CASES: its helpers are imported inside the functions.
"""

from __future__ import annotations

import torch

TILE_SMALL = {"gate_up": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
              "down": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}}
TILE_M32 = {"gate_up": {**TILE_SMALL["gate_up"], "BLOCK_M": 32, "BLOCK_N": 32},
            "down": {**TILE_SMALL["down"], "BLOCK_M": 32, "BLOCK_N": 16}}
# The swap kernels (weights as the dot's M, bf16 activations only): several scale groups a K step, and a
# step that does not divide K (masked loads) in the second.
SWAP_SMALL = {"gate_up": {"SWAP": True, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_W": 8, "num_warps": 4, "num_stages": 1},
              "down": {"BLOCK_N": 32, "BLOCK_W": 4, "num_warps": 4, "num_stages": 1}}
SWAP_M32 = {"gate_up": {**SWAP_SMALL["gate_up"], "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_W": 16},
            "down": {"BLOCK_N": 16, "BLOCK_W": 8, "num_warps": 4, "num_stages": 1}}
# The swap kernels round each scaled weight to bf16 (as SGLang's and vLLM's W4A16 kernels do); the interpreter
# truncates instead of rounding to nearest (kernel_checks.py), about twice that error again.
SWAP_TOL_CPU = 2.5e-2


def check_moe_align(T: int, E: int, top_k: int, block_m: int, device: str = "cpu", seed: int = 0,
                    pool: int | None = None, invalid: int = 0) -> int:
    """moe_align's plan against the routing: every pair with an id in [0, E) is in exactly one row of one block
    of its expert, blocks hold 1..block_m rows, an expert's blocks are consecutive and all full but its last,
    blocks past the last have no rows, and the block count stays within the grid. ``pool``: tokens draw their
    experts from the first ``pool`` (many pairs per expert); ``invalid``: that many ids set to -1 or E (left
    out). Returns the number of blocks used."""
    from sglang_eagle3.kernels.fused_moe import moe_align

    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.stack([torch.randperm(pool or E, generator=g)[:top_k] for _ in range(T)]).to(torch.int32)
    flat = ids.view(-1)
    if invalid:
        bad = torch.randperm(flat.numel(), generator=g)[:invalid]
        flat[bad] = torch.where(torch.arange(invalid) % 2 == 0, -1, E).to(torch.int32)
    sorted_pairs, block_expert, block_rows = (t.cpu() for t in moe_align(ids.to(device), E, block_m))
    num_blocks = block_rows.numel()
    assert num_blocks == flat.numel() // block_m + min(flat.numel(), E), num_blocks
    rows = block_rows.tolist()
    used = sum(1 for r in rows if r > 0)
    assert all(r > 0 for r in rows[:used]) and all(r == 0 for r in rows[used:]), f"blocks not packed: {rows}"
    seen = []
    last_expert, last_rows = -1, block_m
    for b in range(used):
        e, r = int(block_expert[b]), rows[b]
        assert 1 <= r <= block_m, (b, r)
        if e == last_expert:
            assert last_rows == block_m, f"block {b}: expert {e}'s earlier block was not full"
        else:
            assert e > last_expert, f"block {b}: expert {e} after {last_expert} (experts in order, blocks together)"
        pairs = sorted_pairs[b * block_m: b * block_m + r]
        assert (flat[pairs.long()] == e).all(), f"block {b} of expert {e} holds pairs of {flat[pairs.long()]}"
        seen += pairs.tolist()
        last_expert, last_rows = e, r
    valid = ((flat >= 0) & (flat < E)).nonzero().view(-1).tolist()
    assert sorted(seen) == valid, f"{len(seen)} rows for {len(valid)} valid pairs (a pair lost or repeated)"
    return used


def check_moe_tile_token_independent(T: int, E: int, H: int, I: int, top_k: int, int4: bool, device="cpu",
                                     dtype=torch.bfloat16, seed=0, config=None, tol=1e-2) -> float:
    """The tile path gives a token the same output, bit for bit, in a batch of T (experts shared, blocks of
    several rows, pairs ranked in a varying order by atomics) as alone, and is near the reference."""
    from kernel_checks import make_moe_inputs, rel_err

    from sglang_eagle3 import kernels
    from sglang_eagle3.kernels.fused_moe import triton_fused_moe, triton_fused_moe_int4

    args = make_moe_inputs(T, E, H, I, top_k, device, int4, dtype, seed, True)
    x, tw, ids = args[0], args[-2], args[-1]

    def moe(x, tw, ids):
        if int4:
            return triton_fused_moe_int4(x, *args[1:5], tw, ids, 32, path="tile", config=config)
        return triton_fused_moe(x, *args[1:3], tw, ids, config=config)

    batch = moe(x, tw, ids)
    for t in range(T):
        one = moe(x[t:t + 1], tw[t:t + 1], ids[t:t + 1])
        assert torch.equal(one[0], batch[t]), (t, (one[0].float() - batch[t].float()).abs().max().item())
    ref = kernels.ref_fused_moe_int4(*args, 32) if int4 else kernels.ref_fused_moe(*args)
    err = rel_err(batch, ref)
    assert err < tol, f"tile path rel err {err} ({T=} {E=} {int4=} {dtype=})"
    return err


def _exact(*a, **kw):
    from kernel_checks import check_fused_moe_int4_gemv_exact

    return check_fused_moe_int4_gemv_exact(*a, **kw)


def _moe(*a, **kw):
    from kernel_checks import check_fused_moe

    return check_fused_moe(*a, **kw)


CASES = {
    "moe_align_uniform_e_not_pow2": lambda: check_moe_align(13, 37, 4, 16, seed=60),
    "moe_align_many_pairs_per_expert": lambda: check_moe_align(40, 12, 3, 8, seed=61, pool=5),
    "moe_align_invalid_ids_left_out": lambda: check_moe_align(9, 20, 4, 4, seed=62, invalid=5),
    "moe_align_more_pairs_than_a_chunk": lambda: check_moe_align(300, 64, 8, 16, seed=63, pool=40),
    # INT4 decode in K order, group scale after the dot: exact integer sums, bf16-trick and fp16 (shift) planes.
    "moe_int4_tile_exact_shared_experts": lambda: _exact(12, 9, 160, 64, 3, seed=64, skew=True, path="tile",
                                                         config=TILE_SMALL),
    "moe_int4_tile_exact_block_m32": lambda: _exact(20, 6, 96, 32, 2, seed=65, skew=True, path="tile",
                                                    config=TILE_M32),
    "moe_int4_tile_fp16_shift_planes": lambda: _moe(11, 7, 128, 64, 3, int4=True, seed=66, dtype=torch.float16,
                                                    path="tile", config=TILE_SMALL),
    "moe_int4_tile_token_independent": lambda: check_moe_tile_token_independent(10, 6, 96, 64, 3, True, seed=67,
                                                                                config=TILE_SMALL),
    "moe_bf16_tile_token_independent": lambda: check_moe_tile_token_independent(9, 5, 64, 48, 2, False, seed=68,
                                                                                config=TILE_M32),
    "moe_int4_swap_vs_reference": lambda: _moe(12, 9, 160, 64, 3, int4=True, seed=69, skew=True, path="tile",
                                               config=SWAP_SMALL, with_add=True, tol=SWAP_TOL_CPU),
    "moe_int4_swap_masked_steps_m32": lambda: _moe(37, 7, 192, 96, 2, int4=True, seed=70, path="tile",
                                                   config=SWAP_M32, tol=SWAP_TOL_CPU),
    "moe_int4_swap_token_independent": lambda: check_moe_tile_token_independent(10, 6, 96, 64, 3, True, seed=71,
                                                                                config=SWAP_SMALL, tol=SWAP_TOL_CPU),
    "moe_int4_swap_k_below_a_step": lambda: _moe(9, 5, 96, 32, 2, int4=True, seed=73, path="tile",
                                                 config={"gate_up": {**SWAP_SMALL["gate_up"], "BLOCK_W": 16},
                                                         "down": {**SWAP_SMALL["down"], "BLOCK_W": 16}},
                                                 tol=SWAP_TOL_CPU),
    # float16 activations take the group path whatever the config says (the swap kernels are bf16-only)
    "moe_int4_swap_config_fp16": lambda: _moe(11, 7, 128, 64, 3, int4=True, seed=72, dtype=torch.float16,
                                              path="tile", config={**SWAP_SMALL, "gate_up": {
                                                  **SWAP_SMALL["gate_up"], "BLOCK_K": 32}}),
}
