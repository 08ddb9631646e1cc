"""Merge the ops of a ``sweep_table.json`` (bench_kernels.py --sweep) into a checked-in config table.

    python benchmarks/merge_sweep.py OUT/sweep_table.json sglang_eagle3/kernels/configs/sm_90.json

Each swept op replaces that op's buckets and leaves the table's ``unmeasured_ops`` list; the table's
``source`` gains the sweep's own source line. Run on the GPU machine before the benchmarks that should use the
winners, and here on the returned file so the committed table is the one that was measured.
"""

from __future__ import annotations

import json
import sys


def main(sweep_path: str, table_path: str) -> None:
    sweep = json.load(open(sweep_path))
    table = json.load(open(table_path))
    if sweep["arch"] != table["arch"]:
        sys.exit(f"sweep is for {sweep['arch']}, table for {table['arch']}: not merging")
    for op, buckets in sweep["ops"].items():
        table["ops"][op] = buckets
        unmeasured = table.get("unmeasured_ops")
        if isinstance(unmeasured, dict):
            unmeasured.pop(op, None)
        elif isinstance(unmeasured, list) and op in unmeasured:
            unmeasured.remove(op)
    if sweep["source"] not in table["source"]:
        table["source"] = f"{table['source']}; {sweep['source']}"
    with open(table_path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    print(f"merged {sorted(sweep['ops'])} into {table_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
