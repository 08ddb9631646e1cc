"""All-reduce latency for decode/verify message sizes (tokens x hidden 7168, bf16), eager and inside a CUDA
graph, under a few NCCL settings. One process per GPU, spawned fresh for each setting (NCCL reads its
environment at communicator creation). Every worker reports the NCCL environment it actually ran with.

    python benchmarks/bench_allreduce.py --gpus 2 --out benchmarks/results/2xh200/allreduce.json

NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the lending machines require.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_eagle3.bench.harness import git_commit

HIDDEN = 7168
SETTINGS = {
    "default": {},
    "proto=LL": {"NCCL_PROTO": "LL"},
    "proto=LL128": {"NCCL_PROTO": "LL128"},
    "proto=Simple": {"NCCL_PROTO": "Simple"},
    "algo=Ring": {"NCCL_ALGO": "Ring"},
}
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _worker(rank, world, port, env, tokens_list, iters, queue):
    os.environ.update(env)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    from sglang_eagle3.env_report import collect_env_report

    out = {"env_report": collect_env_report(), "cases": []}
    torch.manual_seed(1234)  # every rank draws the same x, so the sum is world * x
    for tokens in tokens_list:
        x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device="cuda")
        ref = x.float() * world
        for _ in range(5):
            y = x.clone()
            dist.all_reduce(y)
        torch.cuda.synchronize()
        ok = torch.allclose(y.float(), ref, rtol=2e-2, atol=1e-2)
        eager = []
        for _ in range(iters):
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dist.all_reduce(y)
            e.record()
            e.synchronize()
            eager.append(s.elapsed_time(e) * 1e3)
        # In a graph: N all-reduces captured back to back, replay time / N.
        n = 20
        bufs = [x.clone() for _ in range(n)]
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for b in bufs:
                dist.all_reduce(b)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            for b in bufs:
                dist.all_reduce(b)
        graph = []
        for _ in range(max(5, iters // 4)):
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            graph.append(s.elapsed_time(e) * 1e3 / n)
        out["cases"].append({"tokens": tokens, "bytes": tokens * HIDDEN * 2, "correct": bool(ok),
                             "eager_us": round(_median(eager), 2), "graph_us": round(_median(graph), 2)})
        del g, bufs
    queue.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


def run_setting(world, env, tokens_list, iters):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_worker, args=(r, world, port, {**SAFE_ENV, **env}, tokens_list, iters, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + 300
    while len(results) < world and time.monotonic() < deadline:
        try:
            rank, out = queue.get(timeout=5)
            results[rank] = out
        except Exception:  # queue.Empty: check liveness
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    if len(results) < world:
        raise RuntimeError(f"all-reduce workers failed (exit codes {[p.exitcode for p in procs]})")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out")
    a = ap.parse_args()
    assert a.gpus >= 2, f"needs >= 2 GPUs, found {a.gpus}"
    report = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "gpu": torch.cuda.get_device_name(0), "gpus": a.gpus, "torch": torch.__version__,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "hidden": HIDDEN, "dtype": "bfloat16",
              "settings": {}}
    for name in a.settings:
        env = SETTINGS[name]
        try:
            res = run_setting(a.gpus, env, a.tokens, a.iters)
        except RuntimeError as e:
            report["settings"][name] = {"env": env, "error": str(e)}
            print(f"{name}: FAILED {e}", flush=True)
            continue
        r0 = res[0]
        report["settings"][name] = {"env": env, "cases": r0["cases"],
                                    "per_rank_env": {r: res[r]["env_report"] for r in sorted(res)}}
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
