"""All-reduce latency for decode/verify message sizes (tokens x hidden 7168, bf16), eager and inside a CUDA
graph, under a few NCCL settings. One process per GPU, spawned fresh for each setting (NCCL reads its
environment at communicator creation). Every worker reports the NCCL environment it actually ran with.

    python benchmarks/bench_allreduce.py --gpus 2 --out benchmarks/results/2xh200/allreduce.json

NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the lending machines require. The p2p=off settings send
the data through host memory (NCCL_P2P_DISABLE=1): nearer to PCIe GPUs without peer access than NVLink is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.bench.ranks import SAFE_ENV, graph_all_reduce_us, run_ranks  # noqa: E402

HIDDEN = 7168
SETTINGS = {
    "default": {},
    "proto=LL": {"NCCL_PROTO": "LL"},
    "proto=LL128": {"NCCL_PROTO": "LL128"},
    "proto=Simple": {"NCCL_PROTO": "Simple"},
    "algo=Ring": {"NCCL_ALGO": "Ring"},
    # No GPU-to-GPU copies: data goes through host memory, as between PCIe GPUs without peer access. Closer
    # to the users' PCIe servers than NVLink is, but not the same path (PCIe P2P, where it exists, is faster).
    "p2p=off": {"NCCL_P2P_DISABLE": "1"},
    "p2p=off,proto=LL": {"NCCL_P2P_DISABLE": "1", "NCCL_PROTO": "LL"},
}


def _worker(rank, world, a):
    import torch.distributed as dist

    from sglang_eagle3.env_report import collect_env_report

    out = {"env_report": collect_env_report(), "cases": []}
    torch.manual_seed(1234)  # every rank draws the same x, so the sum is world * x
    for tokens in a.tokens:
        x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device="cuda")
        y = x.clone()
        dist.all_reduce(y)
        ok = torch.allclose(y.float(), x.float() * world, rtol=2e-2, atol=1e-2)
        eager, graph = graph_all_reduce_us(tokens, HIDDEN, iters=a.iters)
        out["cases"].append({"tokens": tokens, "bytes": tokens * HIDDEN * 2, "correct": bool(ok),
                             "eager_us": round(eager, 2), "graph_us": round(graph, 2)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--out")
    a = ap.parse_args()
    assert a.gpus >= 2, f"needs >= 2 GPUs, found {a.gpus}"
    report = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "gpu": torch.cuda.get_device_name(0), "gpus": a.gpus, "torch": torch.__version__,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "hidden": HIDDEN, "dtype": "bfloat16",
              "settings": {}}
    for name in a.settings:
        env = SETTINGS[name]
        try:  # fresh processes for each setting: NCCL reads its environment once, at communicator creation
            res = run_ranks(a.gpus, _worker, a, env=env)
        except RuntimeError as e:
            report["settings"][name] = {"env": env, "error": str(e)}
            print(f"{name}: FAILED {e}", flush=True)
            continue
        r0 = res[0]
        wanted = {**SAFE_ENV, **env}  # what each rank should have run with, read back from every rank
        reached = all(res[r]["env_report"]["env"].get(k) == v for r in res for k, v in wanted.items())
        report["settings"][name] = {"env": env, "env_reached_every_rank": reached, "cases": r0["cases"],
                                    "per_rank_env": {r: res[r]["env_report"] for r in sorted(res)}}
        print(f"{name}: {wanted} read back from every rank: {reached}", flush=True)
        for c in r0["cases"]:
            print(f"{name:13s} tokens {c['tokens']:3d} ({c['bytes'] / 1024:7.1f} KiB): eager {c['eager_us']:7.2f} us"
                  f"  graph {c['graph_us']:7.2f} us  correct={c['correct']}", flush=True)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
