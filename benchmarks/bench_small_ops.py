"""The latency-bound launches of a decode layer, timed alone: the routing kernel (moe_topk, Kimi's 384 experts,
top-8), the RMSNorm with its residual add, the rotary launch. Each reads a few KB; what they cost is their
latency in a graph, against a read-only kernel of the same size (~1.2 us on the H200,
bench_launch_floor.py). Quick to run, so a change can be timed against the previous checkout in one call:
the script imports the package of the tree it lives in (``package`` in the output says which ran).

    python benchmarks/bench_small_ops.py --out benchmarks/results/h200/small_ops.json [--label new]
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
from benchmarks.bench_kernels import rms_norm_case, rotary_case, time_graph, topk_case  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--repeat", type=int, default=3, help="times each case is timed (median of replays each)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    cases = {}
    for T in (1, 4, 8, 64):
        cases[f"moe_topk T={T}"] = topk_case(T)[0]
    cases["rms_norm T=1 D=7168 +res"] = rms_norm_case(1, 7168, False, True)[0]
    cases["rotary T=1"] = rotary_case(1)[0]
    rows = []
    for name, calls in cases.items():
        us = [round(time_graph(calls()), 3) for _ in range(args.repeat)]
        rows.append({"case": name, "us": us})
        print(f"{args.label:>6s} {name:28s} " + " / ".join(f"{u:.2f}" for u in us) + " us", flush=True)
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent), "label": args.label,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
