"""One function run in N processes, one a GPU, joined by an NCCL group: the multi-GPU benchmarks' launcher
(on CPU the same with gloo, which is how its tests run).

The engine's own TP workers (distributed/workers.py) serve a command stream; a benchmark only needs each rank
to run the same function once and rank 0's answer back, with every rank's failure reported by rank.

    results = run_ranks(2, my_fn, args)   # my_fn(rank, world, args) at module level (spawned by pickle)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import socket
import time
import traceback
from datetime import timedelta

# NVLink multicast off: the lending machines require it (a program using it can take a shared host's GPUs out
# of service), and the users' PCIe-only servers have no NVSwitch for it anyway.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, device: str, env: dict, fn, args, results) -> None:
    os.environ.update(env)  # before torch creates the NCCL communicator, which reads it once
    try:
        import torch
        import torch.distributed as dist

        if device == "cuda":
            torch.cuda.set_device(rank)
        else:
            torch.set_num_threads(1)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world, timeout=timedelta(seconds=300))
        dist.all_reduce(torch.zeros(1, device=device))  # the communicator is built here, never inside a capture
        out = fn(rank, world, args)
        # As bytes (a plain pickle copies tensors' data): put() of a tensor itself would share its storage through a
        # file descriptor that the launcher fetches from this process when it unpickles, and this process may have
        # exited by then (EOFError in the launcher, seen in CI).
        results.put((rank, pickle.dumps(out), None))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure reaches the launcher with its rank
        results.put((rank, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None


def run_ranks(world: int, fn, args, *, env: dict | None = None, device: str = "cuda",
              timeout: float = 900.0) -> dict:
    """fn(rank, world, args) on ranks 0..world-1 (cuda:rank each and an NCCL group, or gloo with
    device="cpu"; SAFE_ENV plus `env` in every rank's environment); returns {rank: fn's return value}. A rank
    that raises, dies or outlives `timeout` raises RuntimeError naming it, and no process is left behind."""
    import torch

    if world < 2:
        raise ValueError(f"run_ranks needs world >= 2, got {world}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and torch.cuda.device_count() < world:
        raise RuntimeError(f"{world} ranks need {world} GPUs; this machine has {torch.cuda.device_count()}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    # (At exit, ranks other than 0 may print "TCPStore ... Broken pipe" from NCCL's heartbeat thread when rank 0,
    # which holds the store, exits first: noise. TORCH_NCCL_ENABLE_MONITORING=0 did not silence it on the H200s.)
    procs = [ctx.Process(target=_entry, args=(r, world, port, device, {**SAFE_ENV, **(env or {})}, fn, args, results))
             for r in range(world)]
    for p in procs:
        p.start()
    out, errors = {}, {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) + len(errors) < world and time.monotonic() < deadline:
            try:
                rank, value, err = results.get(timeout=5)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
                for r in dead:
                    errors[r] = f"exited with code {procs[r].exitcode} without a result"
                if errors:
                    break
                continue
            if err:
                errors[rank] = err
                break  # the other ranks now wait in a collective for the failed one: stop at once
            out[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(30 if not errors and len(out) == world else 1)
            if p.is_alive():
                p.kill()
                p.join(5)
    if errors:  # a rank that died silently is usually the cause of the others' errors: name it too
        for r, p in enumerate(procs):
            if r not in errors and r not in out and p.exitcode not in (None, 0, -9):
                errors[r] = f"exited with code {p.exitcode} without a result"
        raise RuntimeError("; ".join(f"rank {r}: {msg}" for r, msg in sorted(errors.items())))
    if len(out) < world:
        raise RuntimeError(f"ranks {sorted(set(range(world)) - set(out))} gave no result within {timeout:.0f} s")
    return out


def graph_all_reduce_us(tokens: int, hidden: int, *, n: int = 20, iters: int = 20) -> tuple[float, float]:
    """(eager us, in-graph us) of one all-reduce of [tokens, hidden] bf16 over the default group: eager is a
    median of single calls between barriers; in-graph is the median replay of n captured back to back, / n.
    Every rank must call it with the same arguments."""
    import torch
    import torch.distributed as dist

    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    for _ in range(5):
        dist.all_reduce(x.clone())
    eager = []
    for _ in range(iters):
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dist.all_reduce(x)
        e.record()
        e.synchronize()
        eager.append(s.elapsed_time(e) * 1e3)
    bufs = [x.clone() for _ in range(n)]
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for b in bufs:
            dist.all_reduce(b)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=stream):
        for b in bufs:
            dist.all_reduce(b)
    graph = []
    for _ in range(max(5, iters // 2)):
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        graph.append(s.elapsed_time(e) * 1e3 / n)
    del g
    return sorted(eager)[len(eager) // 2], sorted(graph)[len(graph) // 2]
