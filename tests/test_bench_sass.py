"""CPU check of benchmarks/sass_gemv_fma.py (the CUDA-core GEMV forms' SASS, compiled without a GPU): it reports
every form at both weight-tile orders, and compared with HEAD's kernels (while the working tree's match HEAD's)
finds the default's code identical. Runs the script in a subprocess without TRITON_INTERPRET, as the compile
checks do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KERNELS = "sglang_eagle3/kernels/triton/gemv.py"


def test_sass_gemv_fma_reports_both_orders(tmp_path):
    unchanged = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", KERNELS], cwd=REPO).returncode == 0
    out = tmp_path / "sass.json"
    cmd = [sys.executable, "benchmarks/sass_gemv_fma.py", "--arch", "90", "--rows", "1", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(cmd + (["--base", "HEAD"] if unchanged else []), cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["form"] for r in rows) == ["one_matrix_at_pair_config", "q_b_norm", "qkv_a_plain",
                                               "qkv_a_plain_norm", "router_shared", "w_uv_heads"]
    for r in rows:
        for order in ("rows_first", "lanes_first"):
            assert r[order]["instructions"] > 100 and 0 < r[order]["registers"] <= 255, r
            assert r[order]["FFMA"] > 0, r  # the products are there (a parse that found none would be 0)
        if unchanged:
            assert r["identical_to_base"] is True, r
