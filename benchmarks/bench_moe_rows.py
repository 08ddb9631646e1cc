"""The INT4 GEMV MoE at verify sizes: gate_up computing one pair a program, or an expert's pairs ROWS at a time
with each weight decoded once for them (kernels/fused_moe.py gemv_rows), on routings whose tokens share
experts as a verify batch's draft tokens do (each token's top-8 drawn from the first ``pool`` experts of 384)
and on uniform ones. Kimi-K2.5 TP=8 rank shapes (H 7168, I 256 a rank), 16 routings rotated in one graph, us a
call (median of replays), every variant timed twice, alternating. Imports the package of its own tree.

    python benchmarks/bench_moe_rows.py --out benchmarks/results/h200/moe_rows.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import copy_bandwidth, make_moe_weights, moe_case, time_graph  # noqa: E402
from sglang_eagle3 import env  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402

# gate_up variants: None = the table's config (ROWS as the package ships it; "off": SGLANG_EAGLE3_MOE_ROWS=0)
VARIANTS = {
    "table, one pair a program": ("off", None),
    "table": ("on", None),
    "ROWS 4, 8 x 64, 4 warps": ("on", {"BLOCK_N": 8, "BLOCK_W": 64, "num_warps": 4, "ROWS": 4}),
    "ROWS 4, 8 x 64, 8 warps": ("on", {"BLOCK_N": 8, "BLOCK_W": 64, "num_warps": 8, "ROWS": 4}),
    "ROWS 4, 4 x 64, 2 warps": ("on", {"BLOCK_N": 4, "BLOCK_W": 64, "num_warps": 2, "ROWS": 4}),
    "ROWS 2, 8 x 128, 4 warps": ("on", {"BLOCK_N": 8, "BLOCK_W": 128, "num_warps": 4, "ROWS": 2}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 4, 8])
    ap.add_argument("--pools", type=int, nargs="+", default=[12, 24, 384])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    dev = torch.device("cuda")
    bw = max(copy_bandwidth().values())
    weights = make_moe_weights(True)
    rows = []
    for T in args.tokens:
        for pool in args.pools:
            calls, nbytes, distinct = moe_case(T, True, weights, path="gemv", pool=pool)
            down = tuning.get_config("fused_moe_int4_gemv_down", dev, "tokens", T)
            times: dict[str, list[float]] = {v: [] for v in args.variants}
            for _ in range(2):
                for name in args.variants:
                    rows_env, gate_up = VARIANTS[name]
                    config = None if gate_up is None else {"gate_up": gate_up, "down": down}
                    with env.overrides({env.MOE_ROWS.name: "0" if rows_env == "off" else None}):
                        times[name].append(round(time_graph(calls(config=config)), 2))
            for name, us in times.items():
                best = min(us)
                rows.append({"T": T, "pool": pool, "distinct_experts": round(distinct, 1), "variant": name,
                             "us": us, "frac_of_copy_bw": round(nbytes / (best * 1e-6) / (bw * 1e9), 3)})
                print(f"T={T} pool={pool:3d} ({distinct:5.1f} experts) {name:28s} "
                      + " / ".join(f"{u:7.2f}" for u in us) + f" us  {rows[-1]['frac_of_copy_bw']:.1%}", flush=True)
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "copy_bw_gbps": round(bw, 1), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
