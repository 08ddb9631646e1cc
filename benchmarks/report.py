"""Renders benchmark result JSONs as the markdown tables in docs/BENCHMARKS.md.

    python benchmarks/report.py benchmarks/results/h200/verify_graph.json

A bench_verify_graph.py --paired file also gets its paired table (every setting against the first, at each context
and T: the median of the per-round ratios and its 95% interval) and a verdict per setting by the rule the docs
hold settings to: on by default only where the step is faster at verify of 4 (the interval below 1 at every
context) and not slower at decode (the interval not above 1 at any context).
"""

from __future__ import annotations

import argparse
import json
import sys


def verify_graph_table(d: dict) -> str:
    lines = [f"GPU {d['gpu']}, torch {d['torch']}, triton {d['triton']}, commit `{d['git_commit'][:10]}`, "
             f"copy bandwidth {d['copy_bw_gbps']} GB/s, {d['layers']} layers, {d['experts']} experts "
             f"({d['experts_dtype']}); {d['note']}.", "",
             "| kernels | context | T | eager ms | graph ms | floor ms | eager/graph | graph/floor | expert loads |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in d["cases"]:
        lines.append(f"| {c['backend']} | {c['context']} | {c['T']} | {c['eager_ms']:.1f} | {c['graph_ms']:.2f} | "
                     f"{c['floor_ms']:.2f} | {c['eager_over_graph']:.1f} | {c['graph_over_floor']:.1f} | "
                     f"{c['distinct_experts']} |")
    for backend, err in (d.get("errors") or {}).items():
        lines.append(f"\n{backend} failed: {err}")
    return "\n".join(lines)


def paired_verdict(rows: dict[tuple[int, int], dict]) -> str:
    """A setting's verdict from its paired rows {(context, T): {"vs_first", "ci95"}} (see the module doc)."""
    at = lambda T: [r for (_, t), r in rows.items() if t == T]  # noqa: E731
    if not at(4) or not at(1):
        return "undecided: needs T = 1 and T = 4"
    if any(r["ci95"][0] > 1.0 for r in at(1)):
        return "off: slower at decode"
    if all(r["ci95"][1] < 1.0 for r in at(4)):
        return "on: faster at verify of 4, not slower at decode"
    return "off: not faster at verify of 4"


def paired_table(d: dict) -> str:
    """The paired part of a bench_verify_graph.py --paired file: a row a setting, a column a (context, T)."""
    shapes = [(p["context"], p["T"]) for p in d["paired"]]
    labels = list(d["paired"][0]["settings"])
    lines = [f"Paired ({d['paired'][0]['rounds']} rounds a shape; commit `{d['git_commit'][:10]}`, {d['gpu']}): "
             "each setting / the first, median of per-round ratios [95% interval].", "",
             "| setting | " + " | ".join(f"{c} T={t}" for c, t in shapes) + " | verdict |",
             "|---|" + "---:|" * len(shapes) + "---|"]
    for i, label in enumerate(labels):
        rows = {(p["context"], p["T"]): p["settings"][label] for p in d["paired"]}
        cells = [f"x{r['vs_first']:.4f} [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}]" for r in rows.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {'(the base)' if i == 0 else paired_verdict(rows)} |")
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    status = 0
    for p in paths:
        try:
            with open(p) as f:
                d = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"report.py: {p}: {e}", file=sys.stderr)
            status = 1
            continue
        if isinstance(d, dict) and d.get("cases") and "eager_ms" in d["cases"][0]:
            print(f"`{p}`\n\n{verify_graph_table(d)}\n")
            if d.get("paired"):
                print(f"{paired_table(d)}\n")
        else:
            print(f"`{p}`: no renderer for this file")
    return status


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", metavar="JSON", help="bench_verify_graph.py result files")
    raise SystemExit(main(ap.parse_args().paths))
