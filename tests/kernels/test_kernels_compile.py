"""The Triton kernels compile for sm_90 and sm_120 on this (CPU) machine, with the properties their design
relies on (see compile_checks.py). Runs in a fresh subprocess without TRITON_INTERPRET (under the
interpreter, triton.jit builds interpreted functions that cannot be compiled)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from compile_checks import CASES  # noqa: E402


@pytest.fixture(scope="module")
def compile_results(request) -> dict[str, dict]:
    import triton

    if not shutil.which(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("this Triton wheel ships no ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    # Only the cases this session selected (e.g. -k moe): every case compiles several kernels for two GPUs.
    selected = sorted({item.callspec.params["case"] for item in request.session.items
                       if item.module is request.module and hasattr(item, "callspec")})
    proc = subprocess.run([sys.executable, str(HERE / "compile_checks.py"), *selected], env=env,
                          capture_output=True, text=True, timeout=540)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row["case"]] = row
    assert results, f"compile checks produced no results (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    return results


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_compiles_for_gpu(compile_results, case):
    row = compile_results.get(case)
    assert row is not None, f"case {case} did not report (subprocess crashed?)"
    assert row["ok"], row["detail"]
