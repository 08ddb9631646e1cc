"""Where the sampler's time goes at Kimi's vocabulary (a one-off breakdown for runtime/sampling.py's filters):
each step of filtered_scores graph-timed alone, R rows of float32 logits.

    python benchmarks/bench_sampler_parts.py --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_kernels import time_graph  # noqa: E402
from sglang_eagle3 import kernels  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    V, rows = 163840, []
    for R in (1, 4, 16):
        z = torch.randn(R, V, device="cuda") * 3
        p = torch.softmax(z, -1)
        keys = torch.arange(R, device="cuda") + 7
        for name, fn in _steps(z, p, keys).items():
            us = round(time_graph([fn]), 2)
            rows.append({"step": name, "rows": R, "us": us})
            print(f"{name:22s} R={R:3d} {us:8.2f} us", flush=True)
    Path(a.out).write_text(json.dumps({"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
                                       "gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))


def _steps(z: torch.Tensor, p: torch.Tensor, keys: torch.Tensor) -> dict:
    return {
        "softmax": lambda: torch.softmax(z, -1),
        "sort values+indices": lambda: p.sort(-1, descending=True),
        "sort of bf16": lambda: p.to(torch.bfloat16).sort(-1, descending=True),
        "topk 1024": lambda: p.topk(1024, -1),
        "cumsum": lambda: p.cumsum(-1),
        "where + compare": lambda: torch.where(p >= 1e-6, z, float("-inf")),
        "logsumexp": lambda: torch.logsumexp(z, -1),
        "gumbel kernel": lambda: kernels.gumbel_argmax(z, keys, keys),
    }


if __name__ == "__main__":
    main()
