"""What an L2 prefetch buys the launch that reads its bytes, alone: the mechanism under the step's prefetch plans
(layers/overlap.py prefetch_mid / prefetch_mid_o / prefetch_next_moe), at a Kimi-K2.5 TP=8 rank's shapes.

Each case is a launch of the step as an engine of one request a step makes it (kernels.gemv / gemv_pair at decode
and verify sizes, each matrix in the form kernels/gemv.py picks: the router + shared pair on the CUDA cores,
o_proj and q_a + kv_a on the tensor cores), after a window of other work, with
and without a bulk L2 prefetch of its weights (kernels.prefetch.l2_prefetch) issued before the window:

    without: window ; launch          with: l2_prefetch(weights) ; window ; launch

The window stands for what runs between a plan's fork and the read: an idle one (a one-program kernel spinning
on the global timer: the lines land while nothing else reads) or one that streams other bytes (a read-only kernel
of N MB of buffers of its own: the other reads the L2 must hold the prefetched lines against; the step reads
~8-16 MB between prefetch_mid's fork and o_proj). Both sequences are timed in CUDA graph replays with the weights
(and the window's buffers) rotated past the L2, so each launch starts cold. ``gain_us`` = without - with: what
the launch saves net of the prefetch kernel's own launch. The step decides (bench_verify_graph.py --paired with
SGLANG_EAGLE3_OVERLAP settings); this says whether, and how fast, the lines help where nothing else competes.
Each window is also timed without the launch, with and without the prefetch, so the launch's own time comes out
cold (``launch_cold_us``) and after the prefetch (``launch_after_prefetch_us``), apart from the prefetch kernel's.

    python benchmarks/bench_l2_prefetch.py --out OUT.json [--tokens 1 4] [--windows spin:8 read:8 read:16]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

H = 7168  # Kimi-K2.5 hidden size
L2_ROTATE_BYTES = 400 << 20  # each timed graph cycles through copies of the weights covering this much (~8x L2)


@dataclass(frozen=True)
class Case:
    """One launch of a decoder layer: ``kind`` "single" (kernels.gemv), "pair" (kernels.gemv_pair) or "route" (the
    router in float32 + the shared expert's gated gate/up, on the CUDA cores); ``mats`` its matrices' [N, K]."""

    name: str
    kind: str
    mats: tuple[tuple[int, int], ...]

    @property
    def nbytes(self) -> int:
        return sum(n * k * 2 for n, k in self.mats)  # bf16 weights


# The launches the prefetch plans fetch for (a TP=8 rank: 8 of 64 heads x 128 = 1024 o_proj columns; the router's
# 384 experts; the shared expert's 2048 / 8 = 256 rows of gate and up; q_a 1536 and kv_a 512 + 64 rows).
CASES = (Case("o_proj", "single", ((H, 1024),)),
         Case("router+shared gate/up", "route", ((384, H), (256, H), (256, H))),
         Case("q_a+kv_a", "pair", ((1536, H), (576, H))))


def parse_window(text: str) -> tuple[str, float]:
    """'spin:8' (an idle window of 8 us) / 'read:16' (a window that streams 16 MB of other bytes) / 'none'."""
    if text == "none":
        return "none", 0.0
    kind, _, amount = text.partition(":")
    try:
        value = float(amount)
    except ValueError:
        value = -1.0
    if kind not in ("spin", "read") or value <= 0:
        raise SystemExit(f"--windows: {text!r} is not none, spin:US or read:MB (a positive number)")
    return kind, value


def copies_for(nbytes: int, rotate_bytes: int = L2_ROTATE_BYTES) -> int:
    """How many copies of a case's weights one timed graph cycles through: enough to cover rotate_bytes (so no
    launch finds its lines left in the L2 by the previous replay), at least 2, at most 32."""
    return max(2, min(32, -(-rotate_bytes // nbytes)))


def main() -> None:
    import functools
    import statistics

    from benchmarks.bench_kernels import time_graph
    from benchmarks.bench_launch_floor import launch as read_launch
    from benchmarks.bench_pdl import spin_kernel
    from sglang_eagle3 import kernels
    from sglang_eagle3.bench.harness import git_commit
    from sglang_eagle3.kernels import tuning
    from sglang_eagle3.kernels.prefetch import l2_prefetch, prefetch_table

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--windows", nargs="+", default=["none", "spin:8", "spin:16", "read:8", "read:16"])
    ap.add_argument("--repeat", type=int, default=2, help="alternations of without / with (the spread is the noise)")
    ap.add_argument("--only", nargs="+", default=[], help="only these cases (names as printed)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    windows = [(w, *parse_window(w)) for w in args.windows]
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("bench_l2_prefetch needs a CUDA GPU of compute capability 9 or more (the bulk L2 prefetch)")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    sms = tuning.sm_count(dev)
    result = {"command": " ".join(["python", *sys.argv]), "git_commit": git_commit(),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "sm_count": sms, "l2_bytes": torch.cuda.get_device_properties(dev).L2_cache_size,
              "pdl": tuning.pdl(dev, "gemv"), "cases": []}
    stamp = torch.zeros(1, dtype=torch.int64, device=dev)
    read_out = torch.empty(sms * 4, device=dev, dtype=torch.float32)
    # the read windows' buffers, rotated as the weights are: one per copy, the most any window asks for
    read_mb = max([mb for _, kind, mb in windows if kind == "read"], default=0)
    read_bufs = [torch.randn(int(read_mb * (1 << 20)) // 2, device=dev, dtype=torch.bfloat16)
                 for _ in range(copies_for(max(1, int(read_mb * (1 << 20)))))] if read_mb else []

    def window(kind: str, amount: float, k: int) -> None:
        if kind == "spin":  # one program on the global timer, nothing read
            spin_kernel[(1,)](stamp, int(amount * 1000), TRIGGER=False, num_warps=1)
        elif kind == "read":  # a read-only kernel of the window's bytes, without PDL (the launch after waits)
            read_launch(read_bufs[k % len(read_bufs)][: int(amount * (1 << 20)) // 2], read_out, (sms * 4, 1024),
                        False)

    def launch(kind: str, x: torch.Tensor, ws: tuple):
        if kind == "single":
            return kernels.gemv(x, ws[0], use_triton=True)
        if kind == "pair":
            return kernels.gemv_pair(x, ws[0], ws[1], use_triton=True)
        return kernels.gemv_pair(x, ws[0], ws[1], w2_up=ws[2], out1_dtype=torch.float32, use_triton=True)

    def seq(case: Case, x: torch.Tensor, ws: tuple, table: torch.Tensor, prefetch: bool, kind: str, amount: float,
            k: int, read: bool = True) -> None:
        if prefetch:
            l2_prefetch(table)
        window(kind, amount, k)
        if read:
            launch(case.kind, x, ws)

    def measure(case: Case) -> list[dict]:
        copies = copies_for(case.nbytes)
        wss = [tuple(torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for n, k in case.mats)
               for _ in range(copies)]
        tables = [prefetch_table(list(ws)) for ws in wss]
        x_all = torch.randn(max(args.tokens), case.mats[0][1], device=dev, dtype=torch.bfloat16)
        rows = []
        for T in args.tokens:
            x = x_all[:T]
            row = {"case": case.name, "T": T, "bytes": case.nbytes, "copies": copies}
            for label, kind, amount in windows:
                # (prefetch, read): the sequence with and without the prefetch, and each without the launch (what
                # the window and the prefetch kernel take by themselves)
                modes = {"without": (False, True), "with": (True, True),
                         "window alone": (False, False), "prefetch + window": (True, False)}
                times = {mode: [] for mode in modes}
                for _ in range(args.repeat):
                    for mode, (prefetch, read) in modes.items():
                        calls = [functools.partial(seq, case, x, wss[k], tables[k], prefetch, kind, amount, k, read)
                                 for k in range(copies)]
                        times[mode].append(round(time_graph(calls), 2))
                med = {mode: statistics.median(v) for mode, v in times.items()}
                cold, hot = med["without"] - med["window alone"], med["with"] - med["prefetch + window"]
                row[label] = {**times, "gain_us": round(med["without"] - med["with"], 2),
                              "launch_cold_us": round(cold, 2), "launch_after_prefetch_us": round(hot, 2)}
                print(f"{case.name:22s} T={T} window {label:8s}: the launch {cold:6.2f} us cold, {hot:6.2f} us after "
                      f"the prefetch; the sequence {med['without']:.2f} -> {med['with']:.2f} us (net "
                      f"{med['without'] - med['with']:+.2f})", flush=True)
            rows.append(row)
        return rows

    with torch.inference_mode():
        for case in CASES:
            if not args.only or any(case.name.startswith(o) for o in args.only):
                result["cases"] += measure(case)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
