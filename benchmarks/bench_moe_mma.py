"""INT4 MoE at verify sizes: the GEMV path against the mma path (tensor-core gate_up, same down kernel).

One Kimi-K2.5 TP=8 rank (384 experts, H=7168, I=256, top-8), T = 1, 2, 4, 8 tokens routed over all 384
experts ("uniform") or each set's tokens drawing from its own pool of 12 ("pool12", as a verify step's draft
tokens share experts: ~10-12 distinct experts a layer at T=4 on the Kimi slice). Timed per case: the whole
MoE (gate_up + down) by both paths, the mma path under a few gate_up configs, and gate_up alone by both.
Timing as in bench_kernels.py: 16 input sets (routing, x) captured back to back in one CUDA graph, each set
on other experts, so the working set (~400 MB at T=1 uniform, ~600 MB over the pools) is far past the 50 MB
L2; median replay / calls. GB/s counts the distinct experts' weights and scales once, plus x and the output.

Writes ``<out>/moe_mma.json`` (command, git commit, GPU, per case us and GB/s, and per T and routing the
relative difference between the two paths' outputs and fp32 activations on set 0). Under 90 s on an H200
(most of it compiling; cases stop at --budget-s).

    python benchmarks/bench_moe_mma.py --out benchmarks/results/h200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.bench_kernels import EXPERTS, HIDDEN, INTER, TOP_K, make_moe_weights, time_graph  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402
from sglang_eagle3.kernels.fused_moe import launch_int4_gate_up, triton_fused_moe_int4  # noqa: E402
from sglang_eagle3.kernels.quant import PACK_FACTOR  # noqa: E402

N_SETS = 16
POOL = 12
GATE_UP_BYTES = 2 * INTER * HIDDEN // 2 + 2 * INTER * HIDDEN // 32 * 2  # w13 nibbles + bf16 scales, one expert
DOWN_BYTES = HIDDEN * INTER // 2 + HIDDEN * INTER // 32 * 2
MMA_OP = "fused_moe_int4_mma_gate_up"
# mma gate_up configs timed besides the default: wider row blocks, fewer K slices, fewer pipeline stages, a
# program per distinct expert (more programs, more of them idle) or fewer, busier ones.
MMA_VARIANTS = {
    "bn64_w4": {"BLOCK_N": 64, "num_warps": 4},
    "split4": {"SPLIT": 4},
    "stages2": {"num_stages": 2},
    "slots64": {"SLOTS": 64},
    "slots8": {"SLOTS": 8},
}


def log(msg: str) -> None:
    print(msg, flush=True)


def routing_sets(T: int, pool: int | None, seed: int):
    """ids [sets, T, k] int32 and weights [sets, T, k]: over all experts (pool None), or set s over experts
    pool * s .. pool * s + pool - 1 (mod the pool count that fits), so sets do not share experts."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    sets = []
    for s in range(N_SETS):
        if pool is None:
            sets.append(torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(T)]))
        else:
            base = pool * (s % (EXPERTS // pool))
            sets.append(torch.stack([torch.randperm(pool, generator=g)[:TOP_K] + base for _ in range(T)]))
    ids = torch.stack(sets).int().cuda()
    w = torch.rand(N_SETS, T, TOP_K, generator=g)
    return ids, (w / w.sum(-1, keepdim=True)).cuda()


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def moe_calls(sets, path: str, cfg: dict | None = None) -> list:
    """One thunk per input set: the whole INT4 MoE by ``path`` (config: the launcher's table when None)."""
    x, weights, tw, ids, _ = sets
    return [lambda i=i: triton_fused_moe_int4(x[i], *weights, tw[i], ids[i], 32, path=path, config=cfg)
            for i in range(N_SETS)]


def gate_up_calls(sets, mma: bool, cfg: dict) -> list:
    """One thunk per input set: gate_up alone (the GEMV one, or with ``mma`` the tensor-core one) into act."""
    x, (p13, s13, _, _), _, ids, act = sets
    return [lambda i=i: launch_int4_gate_up(x[i], p13, s13, ids[i], act, I=INTER, group=32, cfg=cfg, mma=mma)
            for i in range(N_SETS)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for moe_mma.json")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=80.0, help="skip the cases left after this many seconds")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    arch, sms, name = tuning.device_key(torch.cuda.current_device())
    weights = make_moe_weights(True)  # p13, s13, p2, s2 over all 384 experts (~1.2 GB)
    mma_default = dict(tuning.DEFAULTS[MMA_OP])
    cases, skipped, checks = [], [], []

    def write() -> None:
        result = {
            "command": "python " + " ".join(sys.argv), "git_commit": git_commit(), "gpu": name, "arch": arch,
            "sm_count": sms, "torch": torch.__version__, "triton": __import__("triton").__version__,
            "method": f"CUDA graph of {N_SETS} calls on rotated input sets (other experts each), median of "
                      f"{args.replays} replays / calls; bytes = distinct experts' weights + scales once, x, out",
            "mma_default_config": mma_default, "mma_variants": MMA_VARIANTS, "checks": checks, "cases": cases,
            "skipped": skipped,
            "elapsed_s": round(time.time() - t0, 1),
        }
        (args.out / "moe_mma.json").write_text(json.dumps(result, indent=1))

    def record(label: str, shape: dict, calls: list, nbytes: int, **extra) -> None:
        if time.time() - t0 > args.budget_s:
            skipped.append(label)
            return
        try:
            us = time_graph(calls, replays=args.replays)
        except Exception:
            log(f"{label} failed:\n{traceback.format_exc()}")
            skipped.append(label)
            return
        gbps = nbytes / us / 1e3
        cases.append({"name": label, **shape, "us": round(us, 3), "bytes": nbytes, "gbps": round(gbps, 1), **extra})
        log(f"{label:<48} {us:8.2f} us {gbps:7.0f} GB/s")
        write()

    log(f"{name} ({arch}, {sms} SMs); mma default {mma_default}")
    for T in args.tokens:
        gemv_gate_up = tuning.get_config("fused_moe_int4_gemv_gate_up", dev, "tokens", T)
        down = tuning.get_config("fused_moe_int4_gemv_down", dev, "tokens", T)
        for label, pool in (("uniform", None), (f"pool{POOL}", POOL)):
            ids, tw = routing_sets(T, pool, seed=T * 100 + (pool or 0))
            x = torch.randn(N_SETS, T, HIDDEN, device="cuda", dtype=torch.bfloat16)
            act = torch.empty(T * TOP_K, PACK_FACTOR, INTER // PACK_FACTOR, dtype=torch.float32, device="cuda")
            distinct = statistics.mean(len(set(ids[s].flatten().tolist())) for s in range(N_SETS))
            full_bytes = int(distinct * (GATE_UP_BYTES + DOWN_BYTES)) + 2 * T * HIDDEN * 2
            gate_up_bytes = int(distinct * GATE_UP_BYTES) + T * HIDDEN * 2
            shape = {"T": T, "routing": label, "distinct_experts": round(distinct, 2)}
            sets = (x, weights, tw, ids, act)
            # the numbers being timed agree (set 0): outputs and fp32 activations of the two paths
            mma_cfg = {"gate_up": mma_default, "down": down}
            diffs = {"out": rel_diff(moe_calls(sets, "mma", mma_cfg)[0](), moe_calls(sets, "gemv")[0]())}
            acts = []
            for mma, cfg in ((True, mma_default), (False, gemv_gate_up)):
                gate_up_calls(sets, mma, cfg)[0]()
                acts.append(act.clone())
            diffs["act"] = rel_diff(*acts)
            checks.append({**shape, "rel_diff_mma_vs_gemv": diffs})
            log(f"T={T} {label}: {distinct:.1f} distinct experts, mma vs gemv rel diff {diffs}")
            record(f"gemv T={T} {label}", {**shape, "path": "gemv", "stage": "moe"}, moe_calls(sets, "gemv"),
                   full_bytes)
            record(f"mma T={T} {label}", {**shape, "path": "mma", "stage": "moe"}, moe_calls(sets, "mma", mma_cfg),
                   full_bytes, config=mma_default)
            record(f"gemv gate_up T={T} {label}", {**shape, "path": "gemv", "stage": "gate_up"},
                   gate_up_calls(sets, False, gemv_gate_up), gate_up_bytes, config=gemv_gate_up)
            record(f"mma gate_up T={T} {label}", {**shape, "path": "mma", "stage": "gate_up"},
                   gate_up_calls(sets, True, mma_default), gate_up_bytes, config=mma_default)
            for variant, change in MMA_VARIANTS.items():
                cfg = {**mma_default, **change}
                record(f"mma gate_up {variant} T={T} {label}",
                       {**shape, "path": "mma", "stage": "gate_up", "variant": variant},
                       gate_up_calls(sets, True, cfg), gate_up_bytes, config=cfg)
    write()
    log(f"wrote {args.out / 'moe_mma.json'} in {time.time() - t0:.0f} s ({len(skipped)} cases skipped)")


if __name__ == "__main__":
    main()
