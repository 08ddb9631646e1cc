"""Config tables that change one op's launch config over a range of its key (the INT4 GEMV MoE's tiles by token
count, MLA's by query rows) and keep the checked-in sm_90 table's everywhere else, for SGLANG_EAGLE3_CONFIG_TABLE in
a paired step run (bench_verify_graph.py --env-variants ... --paired N): the kernel benchmark times an op on its own
with calls back to back (and the MoE with uniform routing, MLA at batch 4 for its verify sweep), the step has other
launches around it under PDL and, on the random slice, a verify's tokens routed to ~10 experts, so a config that
wins alone is checked where it has to pay. Only what leaves a token's bits alone changes: the MoE's F16 and BLOCK_W
and MLA's merge tile and split size stay the table's (tuning.check_table, which tests/test_bench_sweep.py runs
on each variant), and no variant changes them.

    python benchmarks/variant_tables.py OUT_DIR     # writes OUT_DIR/<variant>.json and prints the names
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import buckets_of  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.fused_moe import GEMV_MAX_TOKENS  # noqa: E402

# op -> (the key its buckets go by, the keys to rebuild the buckets over: the last bucket stays unbounded)
KEYS = {"fused_moe_int4_gemv_gate_up": ("tokens", GEMV_MAX_TOKENS),
        "fused_moe_int4_gemv_down": ("tokens", GEMV_MAX_TOKENS),
        "mla_attention": ("rows", 16 * 64)}  # decode and verify rows: up to 16 tokens x 64 heads
# variant -> {(op, first key, last key or None: every key from the first on): config changes}
VARIANTS: dict[str, dict[tuple[str, int, int | None], dict]] = {
    # bench_kernels --sweep gemv's T=1 winner on an H100 (session 48 x1: 13.79 against the table's 14.29 us)
    "t1_gate_up_bn8": {("fused_moe_int4_gemv_gate_up", 1, 1): {"BLOCK_N": 8, "num_warps": 8, "ROWS": 2}},
    # the verify buckets' down kernel without PRELOAD's tile (the T = 5..16 bucket's tiles), and at 16 rows x 4 warps
    "t2_4_down_slots": {("fused_moe_int4_gemv_down", 2, 4): {"BLOCK_N": 32, "num_warps": 4, "PRELOAD": False}},
    "t2_4_down_bn16": {("fused_moe_int4_gemv_down", 2, 4): {"BLOCK_N": 16, "num_warps": 4, "PRELOAD": True}},
    # ... with a trained router's spread (--routing uniform: a verify's pairs on as many experts, read from DRAM, where
    # the random router's share them through L2) the T = 2..4 down kernel reads 32 MB at T=4 at 55% of copy bandwidth
    # alone (fiftieth session): smaller and larger PRELOAD tiles, and PRELOAD's tile at T = 5..8
    "t2_4_down_bn16_w2": {("fused_moe_int4_gemv_down", 2, 4): {"BLOCK_N": 16, "num_warps": 2, "PRELOAD": True}},
    "t2_4_down_bn4_w1": {("fused_moe_int4_gemv_down", 2, 4): {"BLOCK_N": 4, "num_warps": 1, "PRELOAD": True}},
    "t5_8_down_preload": {("fused_moe_int4_gemv_down", 5, 8): {"BLOCK_N": 8, "num_warps": 2, "PRELOAD": True}},
    # gate_up at T = 3..4 in the 16-row blocks of the T = 5..16 bucket (twice the programs)
    "t3_4_gate_up_bn16": {("fused_moe_int4_gemv_gate_up", 3, 4): {"BLOCK_N": 16, "num_warps": 4}},
    # the same at T=3 only (a3: ~5% faster at T=3 with either routing, slower at T=4, where 256 programs of 32 rows
    # give every SM two and T=3's 192 give 60 SMs two and the rest one); the table's T = 5..16 blocks at T = 5..8
    # (640-1024 programs: past one wave of ~4 a SM) in 32 rows (320-512), T=2's in 8 rows; the down kernel's at
    # T = 5..8 in 16 and 64 rows
    "t3_gate_up_bn16": {("fused_moe_int4_gemv_gate_up", 3, 3): {"BLOCK_N": 16, "num_warps": 4}},
    "t5_8_gate_up_bn32": {("fused_moe_int4_gemv_gate_up", 5, 8): {"BLOCK_N": 32, "num_warps": 4}},
    "t2_gate_up_bn8": {("fused_moe_int4_gemv_gate_up", 2, 2): {"BLOCK_N": 8, "num_warps": 8}},
    "t5_8_down_bn16": {("fused_moe_int4_gemv_down", 5, 8): {"BLOCK_N": 16, "num_warps": 4}},
    "t5_8_down_bn64": {("fused_moe_int4_gemv_down", 5, 8): {"BLOCK_N": 64, "num_warps": 4}},
    # PRELOAD's tile at T=5 (a3: x0.982 there with uniform routing, x0.999 with the router's; x1.011 / x1.020 at T=8)
    # and at T = 5..6
    "t5_down_preload": {("fused_moe_int4_gemv_down", 5, 5): {"BLOCK_N": 8, "num_warps": 2, "PRELOAD": True}},
    "t5_6_down_preload": {("fused_moe_int4_gemv_down", 5, 6): {"BLOCK_N": 8, "num_warps": 2, "PRELOAD": True}},
    # gate_up's T=3 as it was before the fiftieth session took 16-row blocks there (the T = 3..4 bucket's 32 rows)
    "t3_gate_up_bn32": {("fused_moe_int4_gemv_gate_up", 3, 3): {"BLOCK_N": 32, "num_warps": 4}},
    # the T = 5..6 down kernel as it was before the fiftieth session took PRELOAD's tile there (the slot loop)
    "t5_6_down_slots": {("fused_moe_int4_gemv_down", 5, 6): {"BLOCK_N": 32, "num_warps": 4, "PRELOAD": False}},
    # MLA's verify rows (8 heads x T = 3..16 on a Kimi TP=8 rank) in row blocks of 16 as decode's: the table's
    # 32-row blocks were swept at 4 requests (bench_kernels run_sweep), where a request's splits already fill the SMs
    "mla_verify_bm16": {("mla_attention", 17, None): {"BLOCK_M": 16}},
    # ... and with one key-tile buffer (2 stages: ~100 KB of shared memory, two programs a SM), so that twice the
    # programs (two row blocks a split) still run in one wave where every split holds keys (8k)
    "mla_verify_bm16_s2": {("mla_attention", 17, None): {"BLOCK_M": 16, "num_stages": 2}},
    # the table before the short_split rule those two led to (its 32-row blocks at 3 stages wherever verify rows run)
    "mla_no_short": {("mla_attention", 17, None): {"short_split": None}},
    # decode rows at one key-tile buffer too: in the benchmarks' 8448-slot tables a split holds one tile (the
    # forty-ninth session: x1.004 / x1.026 at 1k / 8k, slower)
    "mla_decode_s2": {("mla_attention", 1, 16): {"num_stages": 2}},
    # gate_up at T = 4..8 in 16-row blocks at 4 warps capped at 128 registers (167 without: 3 programs a SM, 396 of
    # T=4's 512 in the first wave; 4 a SM at 128, one 8-byte spill on sm_90): one wave at T=4, 16 warps a SM where
    # the table's 32-row blocks hold 8 (fifty-second session's ncu)
    "t4_8_gate_up_bn16_r128": {("fused_moe_int4_gemv_gate_up", 4, 8): {"BLOCK_N": 16, "num_warps": 4, "maxnreg": 128}},
    # PRELOAD's tile at 8 rows in one warp (fifty-second session, the MoE alone with uniform routing on an H100: the
    # fastest down config at T = 4 and 8, 38.98 / 71.88 us against the table's 40.11 / 72.93), at T = 1..6 in place
    # of 2 warps and at T = 7..8 in place of the slot loop
    "t1_6_down_w1": {("fused_moe_int4_gemv_down", 1, 6): {"BLOCK_N": 8, "num_warps": 1, "PRELOAD": True}},
    "t7_8_down_bn8_w1": {("fused_moe_int4_gemv_down", 7, 8): {"BLOCK_N": 8, "num_warps": 1, "PRELOAD": True}},
    # gate_up decoding a weight word once for 2 (or 4) pairs of its expert at verify sizes (ROWS; the table has it at
    # T=1 and above 16 only): the random slice routes a verify's pairs to few experts (32 pairs over ~10 at T=4),
    # where the kernel benchmark's uniform routing shares none
    "t2_16_gate_up_rows2": {("fused_moe_int4_gemv_gate_up", 2, 16): {"ROWS": 2}},
    "t5_16_gate_up_rows4": {("fused_moe_int4_gemv_gate_up", 5, 16): {"ROWS": 4}},
    # fifty-third session's d1 (H100, paired, uniform routing): down's one-warp tile x0.981 at T=4 and x1.009 at T=1,
    # gate_up capped x0.986 at T=4 and x1.003 at T=8: each where it won, and both (d4-d6; the table took down's
    # one-warp tile at T = 2..6, so t2_6_down_w1 is the table since, and d6's T = 2..8 is t7_8_down_bn8_w1 now)
    "t2_6_down_w1": {("fused_moe_int4_gemv_down", 2, 6): {"BLOCK_N": 8, "num_warps": 1, "PRELOAD": True}},
    "t4_6_gate_up_bn16_r128": {("fused_moe_int4_gemv_gate_up", 4, 6): {"BLOCK_N": 16, "num_warps": 4, "maxnreg": 128}},
    "t4_6_gate_up_r128_t2_6_down_w1": {
        ("fused_moe_int4_gemv_gate_up", 4, 6): {"BLOCK_N": 16, "num_warps": 4, "maxnreg": 128},
        ("fused_moe_int4_gemv_down", 2, 6): {"BLOCK_N": 8, "num_warps": 1, "PRELOAD": True}},
}


def variant_table(name: str, base: dict) -> dict:
    """The ops VARIANTS[name] changes, from ``base`` (a config table) with its changes, bucketed again."""
    changes = VARIANTS[name]
    ops = sorted({op for op, _, _ in changes})
    table_ops = {}
    for op in ops:
        key_name, last = KEYS[op]
        per_key = {k: tuning.table_config(base, op, key_name, k) for k in range(1, last + 1)}
        for (c_op, lo, hi), change in changes.items():
            if c_op == op:
                for k in range(lo, (last if hi is None else hi) + 1):
                    per_key[k] = {**per_key[k], **change}
        table_ops[op] = buckets_of(per_key, key_name)
    described = {f"{op} {KEYS[op][0]} {lo}..{'' if hi is None else hi}": c for (op, lo, hi), c in changes.items()}
    return {"arch": base["arch"], "sm_counts": base["sm_counts"], "measured": False,
            "source": f"benchmarks/variant_tables.py {name}: {base['arch']}.json with {described}",
            "ops": table_ops}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    base = json.loads((tuning.CONFIG_DIR / "sm_90.json").read_text())
    for name in VARIANTS:
        (out / f"{name}.json").write_text(json.dumps(variant_table(name, base), indent=1))
        print(name)


if __name__ == "__main__":
    main()
