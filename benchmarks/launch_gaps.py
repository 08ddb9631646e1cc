"""Where a step's kernels lose to its launch structure, launch by launch: each launch of the last MoE layer in a
``profile_step.py --sequence`` run (PDL off, so no launch's time includes a wait for the one before) beside the
read-only kernel of its bytes timed alone (``bench_launch_floor.py``'s per-size table, the same T's: its
``--tokens`` sets the experts' bytes).

bench_launch_floor.py says how far the whole structure sits from the bandwidth floor and the real step from the
structure; this says which launches make the second gap. A launch's own time here is its time alone in the graph;
under PDL (the default) part of it hides behind its neighbours, so the gaps add up to more than the step loses.

    python benchmarks/launch_gaps.py --profile profile_seq_nopdl.json --floor launch_floor_t1.json launch_floor_t4.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# The kernel each of bench_launch_floor.layer_launches' MoE-layer launches runs as (the default fusions and forms of
# a one-request engine: CUDA-core pairs, q_b and W_UV; tensor-core W_UK, o_proj and shared down).
KERNEL_OF = {
    "input norm": "rms_norm_kernel", "q_a + kv_a": "gemv_fma_pair_kernel", "q_b (q_a norm)": "gemv_fma_kernel",
    "rotary + kv_a norm": "rotary_kernel", "W_UK": "gemv_kernel", "MLA split": "mla_split_kv_kernel",
    "MLA merge": "mla_merge_splits_kernel", "W_UV": "gemv_fma_kernel", "o_proj": "gemv_kernel",
    "post-attention norm": "rms_norm_kernel", "router + shared gate/up": "gemv_fma_pair_kernel",
    "shared down": "gemv_kernel", "routing": "moe_topk_kernel", "experts gate/up": "moe_int4_gemv_gate_up_kernel",
    "experts down": "moe_int4_gemv_down_kernel",
}


def last_moe_layer(sequence: list[dict], plan: list[dict]) -> list[tuple[str, int, float]]:
    """(launch, bytes, own us) for each launch of plan (bench_launch_floor's plan_of_a_moe_layer), matched in the
    last MoE layer of sequence (profile_step's launches in order): the window of len(plan) launches that ends at
    the last experts' down kernel, each launch taking the first unmatched one of its kernel there (the shared down
    runs on a side stream, so its place in the order may move)."""
    names = [k["kernel"] for k in sequence]
    end_kernel = KERNEL_OF[plan[-1]["launch"]]
    if end_kernel not in names:
        raise SystemExit(f"the profile has no {end_kernel}: not a MoE model's step, or not profile_step --sequence")
    end = len(names) - names[::-1].index(end_kernel)
    window = list(range(end - len(plan), end))
    if window[0] < 0:
        raise SystemExit(f"the profile has {end} launches up to its last {end_kernel}, fewer than a layer's "
                         f"{len(plan)}")
    used: set[int] = set()
    out = []
    for item in plan:
        want = KERNEL_OF.get(item["launch"])
        if want is None:
            raise SystemExit(f"launch {item['launch']!r} of the floor's plan has no kernel in KERNEL_OF")
        at = next((i for i in window if i not in used and names[i] == want), None)
        if at is None:
            raise SystemExit(f"no {want} for {item['launch']!r} in the last MoE layer's launches: "
                             f"{[names[i] for i in window]}")
        used.add(at)
        k = sequence[at]
        out.append((item["launch"], item["bytes"], k.get("us_median", k["us"])))
    return out


def gaps(profile: dict, floors: list[dict]) -> list[dict]:
    """One table a T the profile and a floor share: rows (launch, MB, own us, read-only us, own - read-only)."""
    by_t = {f.get("tokens", 1): f for f in floors}
    tables = []
    for step in profile["steps"]:
        floor = by_t.get(step["T"])
        if floor is None or "sequence" not in step:
            continue
        alone = {round(s["mb"], 3): s["alone_us"] for s in floor["sizes"]}
        rows = []
        for launch, size, own in last_moe_layer(step["sequence"], floor["plan_of_a_moe_layer"]):
            read = alone[round(size / 1e6, 3)]
            rows.append({"launch": launch, "mb": round(size / 1e6, 3), "own_us": own, "read_only_us": read,
                         "gap_us": round(own - read, 2)})
        tables.append({"T": step["T"], "rows": rows, "own_us": round(sum(r["own_us"] for r in rows), 2),
                       "read_only_us": round(sum(r["read_only_us"] for r in rows), 2)})
    return tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, help="profile_step.py --sequence JSON (PDL off)")
    ap.add_argument("--floor", nargs="+", required=True, help="bench_launch_floor.py JSONs (one a --tokens)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    profile = json.loads(Path(args.profile).read_text())
    floors = [json.loads(Path(p).read_text()) for p in args.floor]
    tables = gaps(profile, floors)
    if not tables:
        raise SystemExit("no T in both the profile (with --sequence) and a floor (its --tokens)")
    for t in tables:
        print(f"\nT={t['T']}: the last MoE layer's launches, own time (PDL off) against a read-only kernel of their "
              f"bytes alone")
        print(f"{'launch':<26}{'MB':>9}{'own us':>9}{'read us':>9}{'gap us':>9}")
        for r in t["rows"]:
            print(f"{r['launch']:<26}{r['mb']:9.3f}{r['own_us']:9.2f}{r['read_only_us']:9.2f}{r['gap_us']:9.2f}")
        print(f"{'a layer':<26}{'':>9}{t['own_us']:9.2f}{t['read_only_us']:9.2f}{t['own_us'] - t['read_only_us']:9.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"profile": args.profile, "floors": args.floor, "tables": tables},
                                             indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
