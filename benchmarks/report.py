"""Renders benchmark result JSONs as the markdown tables in docs/BENCHMARKS.md.

    python benchmarks/report.py benchmarks/results/h200/verify_graph.json
"""

from __future__ import annotations

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


def main(paths: list[str]) -> None:
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        if "cases" in d and d["cases"] and "eager_ms" in d["cases"][0]:
            print(f"`{p}`\n\n{verify_graph_table(d)}\n")
        else:
            print(f"`{p}`: no renderer for this file")


if __name__ == "__main__":
    main(sys.argv[1:])
