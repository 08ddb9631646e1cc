"""Config tables that change the INT4 GEMV MoE's tiles at some token counts and keep the checked-in sm_90 table's
everywhere else, for SGLANG_EAGLE3_CONFIG_TABLE in a paired step run (bench_verify_graph.py --env-variants ...
--paired N): the kernel benchmark times the MoE on its own with calls back to back and uniform routing, the step
has other launches around it under PDL and, on the random slice, a verify's tokens routed to ~10 experts, so a
tile that wins alone is checked where it has to pay. Tiles only: F16 and BLOCK_W stay the table's (one arithmetic
at every T, tests/kernels/test_tuning.py), so no variant changes a token's bits.

    python benchmarks/variants/moe_tables.py OUT_DIR     # writes OUT_DIR/<variant>.json and prints the names
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.bench_kernels import buckets_of  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.fused_moe import GEMV_MAX_TOKENS  # noqa: E402

OPS = ("gate_up", "down")
# variant -> {(op, first T, last T): tile changes}
VARIANTS: dict[str, dict[tuple[str, int, int], dict]] = {
    # bench_kernels --sweep gemv's T=1 winner on an H100 (session 48 x1: 13.79 against the table's 14.29 us)
    "t1_gate_up_bn8": {("gate_up", 1, 1): {"BLOCK_N": 8, "num_warps": 8, "ROWS": 2}},
    # the verify buckets' down kernel without PRELOAD's tile (the T = 5..16 bucket's tiles), and at 16 rows x 4 warps
    "t2_4_down_slots": {("down", 2, 4): {"BLOCK_N": 32, "num_warps": 4, "PRELOAD": False}},
    "t2_4_down_bn16": {("down", 2, 4): {"BLOCK_N": 16, "num_warps": 4, "PRELOAD": True}},
}


def variant_table(name: str, base: dict) -> dict:
    """The two GEMV MoE ops of ``base`` (a config table) with VARIANTS[name]'s changes, bucketed again."""
    per_t = {op: {T: tuning.table_config(base, f"fused_moe_int4_gemv_{op}", "tokens", T)
                  for T in range(1, GEMV_MAX_TOKENS + 1)} for op in OPS}
    for (op, lo, hi), change in VARIANTS[name].items():
        for T in range(lo, hi + 1):
            per_t[op][T] = {**per_t[op][T], **change}
    return {"arch": base["arch"], "sm_counts": base["sm_counts"], "measured": False,
            "source": f"benchmarks/variants/moe_tables.py {name}: {base['arch']}.json with "
                      f"{ {f'{op} T={lo}..{hi}': c for (op, lo, hi), c in VARIANTS[name].items()} }",
            "ops": {f"fused_moe_int4_gemv_{op}": buckets_of(per_t[op], "tokens") for op in OPS}}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    base = json.loads((tuning.CONFIG_DIR / "sm_90.json").read_text())
    for name in VARIANTS:
        (out / f"{name}.json").write_text(json.dumps(variant_table(name, base), indent=1))
        print(name)


if __name__ == "__main__":
    main()
