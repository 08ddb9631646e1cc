"""The INT4 MoE at verify sizes: the GEMV path (gate_up one pair a program) against the dot path (gate_up as
tensor-core dots over each expert's pairs, kernels/fused_moe.py path="dot"; the down kernel is the same), on
routings whose tokens share experts as a verify batch's draft tokens do (each token's top-8 drawn from the
first ``pool`` experts of 384) and on uniform ones. Kimi-K2.5 TP=8 rank shapes (H 7168, I 256 a rank), 16
routings rotated in one graph, us a call (median of replays), every variant timed twice, alternating. Imports
the package of its own tree.

    python benchmarks/bench_moe_dot.py --out benchmarks/results/h200/moe_dot.json

GEMV gate_up configs (F16=1: the packed fp16 dots) and a table of the best per T, e.g. for a GPU whose table is
unmeasured (then try it with SGLANG_EAGLE3_CONFIG_TABLE; keep F16 and BLOCK_W the same in every bucket):

    python benchmarks/bench_moe_dot.py --out OUT.json --variants "gemv (table)" --table-path gemv --table-pool 0 \
        --table-out table.json --gemv-config BLOCK_N=16,BLOCK_W=128,num_warps=8,F16=1 ...

The same for the GEMV down kernel (the table's gate_up; F16=1: act in packed fp16, PRELOAD=1: every slot's
weights as one tile): --down-config BLOCK_N=32,BLOCK_W=32,num_warps=4,F16=1 ... --table-path gemv_down.

Old code against new in one process: --kernels-from FILE ... (copies of kernels/triton/fused_moe.py from other
commits, e.g. `git show REV:sglang_eagle3/kernels/triton/fused_moe.py > FILE`) times every variant again with each
file's GEMV kernels in the launcher (name suffix " [FILE's stem]"), alternating with this tree's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sglang_eagle3  # noqa: E402
from benchmarks.bench_kernels import (  # noqa: E402
    ab_tag,
    add_kernels_from_arg,
    copy_bandwidth,
    kernels_from,
    make_moe_weights,
    moe_case,
    time_graph,
)
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.kernels import tuning  # noqa: E402

# name -> (path, gate_up config, down config; None: the table's)
VARIANTS = {"gemv (table)": ("gemv", None, None), "dot (table)": ("dot", None, None)}
for _bn, _bw, _w, _exact, _split in ((32, 16, 4, False, 1), (32, 16, 4, False, 2), (32, 16, 4, False, 4),
                                     (32, 16, 4, False, 8), (32, 16, 4, True, 4), (16, 32, 4, False, 4)):
    VARIANTS[f"dot {_bn}x{_bw} w{_w} {'exact' if _exact else 'bf16'} split {_split}"] = (
        "dot", {"BLOCK_N": _bn, "BLOCK_W": _bw, "num_warps": _w, "EXACT": _exact, "SPLIT": _split}, None)


def parse_config(text: str) -> dict:
    """'BLOCK_N=32,BLOCK_W=16,num_warps=4,EXACT=1' -> a gate_up config (dot or GEMV; flags 0/1)."""
    cfg = {}
    for item in text.split(","):
        key, value = item.split("=")
        cfg[key] = bool(int(value)) if key in ("EXACT", "F16", "PER_PAIR", "PRELOAD") else int(value)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_kernels_from_arg(ap, "every variant is timed with each too, alternating with this tree's")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--pools", type=int, nargs="+", default=[12, 384])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--table-out", default=None,
                    help="write a config table (SGLANG_EAGLE3_CONFIG_TABLE format) whose --table-path gate_up buckets "
                         "are that path's fastest variant at each T (the dot path from T=2) on --table-pool's "
                         "routing (summed over every pool measured if --table-pool is 0)")
    ap.add_argument("--table-pool", type=int, default=12)
    ap.add_argument("--table-path", choices=["dot", "gemv", "gemv_down"], default="dot",
                    help="the op the table holds: the dot or GEMV path's gate_up, or the GEMV down kernel")
    ap.add_argument("--config", action="append", default=[],
                    help="an extra dot variant, e.g. BLOCK_N=32,BLOCK_W=16,num_warps=4,EXACT=1 (repeatable)")
    ap.add_argument("--gemv-config", action="append", default=[],
                    help="an extra GEMV variant's gate_up config, e.g. BLOCK_N=16,BLOCK_W=64,num_warps=8,SPLIT=2 "
                         "(repeatable)")
    ap.add_argument("--down-config", action="append", default=[],
                    help="an extra GEMV variant's down config (the table's gate_up), e.g. "
                         "BLOCK_N=32,BLOCK_W=32,num_warps=4,PRELOAD=0,F16=1 (repeatable)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    variants = {name: VARIANTS[name] for name in args.variants}
    for text in args.config:
        variants[f"dot {text}"] = ("dot", parse_config(text), None)
    for text in args.gemv_config:
        variants[f"gemv {text}"] = ("gemv", parse_config(text), None)
    for text in args.down_config:
        variants[f"gemv down {text}"] = ("gemv", None, parse_config(text))
    swaps = {ab_tag(paths): kernels_from(paths) for paths in args.kernels_from}
    variants.update({name + tag: v for tag in swaps for name, v in list(variants.items())})
    dev = torch.device("cuda")
    bw = max(copy_bandwidth().values())
    weights = make_moe_weights(True)
    rows = []
    for T in args.tokens:
        for pool in args.pools:
            table_down = tuning.get_config("fused_moe_int4_gemv_down", dev, "tokens", T)
            cases = {p: moe_case(T, True, weights, path=p, pool=pool) for p in ("gemv", "dot")}
            _, nbytes, distinct = cases["gemv"]
            times: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(2):
                for name, (path, gate_up, down) in variants.items():
                    if gate_up is None and down is None:
                        config = None
                    else:
                        config = {"gate_up": gate_up or tuning.get_config(f"fused_moe_int4_{path}_gate_up", dev,
                                                                          "tokens", T),
                                  "down": down or table_down}
                    try:
                        tag = next((t for t in swaps if name.endswith(t)), None)
                        with swaps[tag]() if tag else contextlib.nullcontext():
                            times[name].append(round(time_graph(cases[path][0](config=config)), 2))
                    except Exception as exc:  # a config that does not compile or fit is reported, not fatal
                        print(f"T={T} pool={pool} {name}: {type(exc).__name__}: {exc}"[:300], flush=True)
                        times[name].append(float("nan"))
            for name, us in times.items():
                best = min(us)
                rows.append({"T": T, "pool": pool, "distinct_experts": round(distinct, 1), "variant": name,
                             "config": variants[name][1], "down": variants[name][2], "us": us,
                             "frac_of_copy_bw": round(nbytes / (best * 1e-6) / (bw * 1e9), 3)})
                print(f"T={T:2d} pool={pool:3d} ({distinct:5.1f} experts) {name:40s} "
                      + " / ".join(f"{u:7.2f}" for u in us) + f" us  {rows[-1]['frac_of_copy_bw']:.1%}", flush=True)
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
              "package": str(Path(sglang_eagle3.__file__).parent), "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__, "copy_bw_gbps": round(bw, 1), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    if args.table_out:
        write_table(Path(args.table_out), rows, variants, args.table_pool, dev, args.table_path)


def write_table(path: Path, rows: list[dict], variants: dict, pool: int, dev: torch.device, kind: str) -> None:
    """A config table with only ``kind``'s op (a path's gate_up, or the GEMV down kernel): per measured T (ascending;
    the dot path from T=2) the variant of that path with the lowest best time at ``pool`` (0: the lowest sum over
    the pools measured, a variant that failed at any of them left out), the largest T's bucket unbounded. A down
    table compares the variants that keep the table's gate_up."""
    down = kind == "gemv_down"
    op = "fused_moe_int4_gemv_down" if down else f"fused_moe_int4_{kind}_gate_up"
    totals: dict[tuple[int, str], float] = {}
    for row in rows:
        row_path, gate_up, _ = variants[row["variant"]]
        if (row_path != kind.removesuffix("_down") or (down and gate_up is not None) or (kind == "dot" and row["T"] < 2)
                or pool not in (0, row["pool"])):
            continue
        key = (row["T"], row["variant"])
        totals[key] = totals.get(key, 0.0) + min(row["us"])  # NaN (a failed variant) stays NaN
    best: dict[int, tuple[float, dict]] = {}
    for (T, name), us in totals.items():
        cfg = variants[name][2 if down else 1] or tuning.get_config(op, dev, "tokens", T)
        if us == us and (T not in best or us < best[T][0]):
            best[T] = (us, cfg)
    Ts = sorted(best)
    buckets = [({"max_tokens": T} if T != Ts[-1] else {}) | best[T][1] for T in Ts]
    arch, sms, _ = tuning.device_key(dev.index or 0)
    table = {"arch": arch, "sm_counts": [sms], "measured": True,
             "source": f"bench_moe_dot.py --table-out (pool {pool or 'sum'})", "ops": {op: buckets}}
    path.write_text(json.dumps(table, indent=1))
    print(f"wrote {path}: {json.dumps(buckets)}", flush=True)


if __name__ == "__main__":
    main()
